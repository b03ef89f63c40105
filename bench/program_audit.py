"""What checking a `.pt2`'s program costs: the program audit against the whole load.

    python bench/program_audit.py [--layers 30] [--repeat 5]

Exports a Llama-shaped decoder (tests/_architectures.py) with coreai-torch's decompositions -
30 layers give about 3,000 nodes - saves it, and times, best of `--repeat`:
- `program_problem` on the parsed `models/model.json` (names, operator allowlist, arguments,
  signature, declared sizes, shape expressions), and the guard check;
- the whole `Pt2Archive.audit()` (zip, pickles, stored layouts, the program);
- `load_pt2` as a whole, for scale.
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]


def _best(function, repeat: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    import _architectures as arch
    import torch

    from coreai_opt.io import load_pt2, save_pt2
    from coreai_opt.io._expressions import guards_problem
    from coreai_opt.io._program_audit import program_problem
    from coreai_opt.io._pt2_archive import MODEL_JSON, Pt2Archive

    model = arch.Llama(arch.LlamaShape(layers=args.layers)).eval()
    inputs = arch.token_inputs(256, seed=0)
    with torch.no_grad():
        program = torch.export.export(model, inputs)
    from coreai_opt._export._ops import coreai_decompositions

    program = program.run_decompositions(coreai_decompositions())
    nodes = sum(1 for _ in program.graph.nodes)
    with tempfile.TemporaryDirectory() as folder:
        path = save_pt2(program, Path(folder) / "llama.pt2")
        archive = Pt2Archive(path)
        document = archive.read_json(MODEL_JSON)
        assert program_problem(document) is None
        rows = [
            ("program_problem (model.json parsed)", _best(lambda: program_problem(document), args.repeat)),
            ("guards_problem", _best(lambda: guards_problem(document), args.repeat)),
            ("Pt2Archive.audit() (zip, pickles, layouts, program)", _best(archive.audit, args.repeat)),
            ("load_pt2 (all of it)", _best(lambda: load_pt2(path), max(1, args.repeat // 2))),
        ]
    print(f"# program audit, {nodes} nodes ({args.layers} layers); {platform.machine()}, "
          f"{platform.python_version()}, torch {torch.__version__}")  # fmt: skip
    print(f"| {'step':<52} | {'seconds':>8} |")
    print(f"|{'-' * 54}|{'-' * 10}|")
    for name, seconds in rows:
        print(f"| {name:<52} | {seconds:>8.3f} |")


if __name__ == "__main__":
    main()
