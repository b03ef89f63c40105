"""What reading untrusted files safely costs: the `.aimodel` worker check and the `.pt2` safe loader.

    python bench/untrusted_cost.py [--repeat 3]

For each sample model and the BERT-base stand-in of bench/compress.py (108.9M parameters, fp16):
- `.aimodel`: coreai-core's own in-process load (`AIModelAsset.load(path).program`, what coreopt
  did before), the Python checks (layout, metadata, SHA-256), and the worker check (a child process
  that starts, imports coreai, parses, verifies, converts, walks, reads every constant and prints
  the program) - the time the check adds to every command that opens an asset;
- `.pt2`: `torch.export.load` (which would run the file's pickles) against `load_pt2` (audit of
  zip, pickles and expressions, then weights mapped from the file).
Median of --repeat runs after a warm-up.
"""

from __future__ import annotations

import argparse
import logging
import platform
import statistics
import time
import warnings
from collections.abc import Callable
from pathlib import Path

from compress import bert_base_asset, bert_base_program

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ("mlp", "cnn", "transformer", "wide_range", "int_arith")


def _median(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat + 1):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def main() -> None:
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    import torch
    from coreai.authoring import AIModelAsset

    from coreai_opt._coreai._sandbox import AssetWorker
    from coreai_opt.io import load_pt2
    from coreai_opt.io._aimodel import _check_files

    def worker_check(path: Path) -> None:
        with AssetWorker(path) as worker:
            worker.verify()

    models = {
        name: (ROOT / "sample_models" / f"{name}.aimodel", ROOT / "sample_models" / f"{name}.pt2")
        for name in SAMPLES
    }
    models["bert-base"] = (bert_base_asset(), bert_base_program())
    print(
        f"# {platform.machine()}, torch {torch.__version__}, median of {args.repeat} after a warm-up; seconds"
    )
    print(f"{'model':<12} {'coreai load':>11} {'py checks':>9} {'worker':>8} {'added':>7}   "
          f"{'torch.load':>10} {'load_pt2':>9}")  # fmt: skip
    for name, (asset, program) in models.items():
        native = _median(lambda a=asset: AIModelAsset.load(a).program, args.repeat)
        checks = _median(lambda a=asset: _check_files(a), args.repeat)
        worker = _median(lambda a=asset: worker_check(a), args.repeat)
        plain = _median(lambda p=program: torch.export.load(p), args.repeat)
        safe = _median(lambda p=program: load_pt2(p), args.repeat)
        print(f"{name:<12} {native:11.3f} {checks:9.3f} {worker:8.3f} {checks + worker:7.3f}   "
              f"{plain:10.3f} {safe:9.3f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
