"""One sweep against n single compares (issue 22): the reference runs once, so a sweep of n
candidates should cost about (1 + n) model runs, not 2n.

    python bench/compare_sweep.py                    # sample transformer .aimodel, 8 samples
    python bench/compare_sweep.py --model build/bench/decoder_0.1b.aimodel --samples 4

Builds int8, 4-bit per-channel and 2-bit candidates of the model in a temporary folder, then times
`compare_sweep(ref, [a, b, c])` and `compare_files(ref, x)` for each, in this process.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from coreai_opt.comparison import compare_files, compare_sweep  # noqa: E402
from coreai_opt.compression import PalettizeConfig, QuantizeConfig  # noqa: E402
from coreai_opt.recipes import compress_file  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=ROOT / "sample_models" / "transformer.aimodel")
    parser.add_argument("--samples", type=int, default=8)
    args = parser.parse_args()
    print(f"# {platform.machine()}, {os.cpu_count()} CPUs; {args.model.name}, {args.samples} samples")
    with tempfile.TemporaryDirectory() as folder:
        configs = [
            QuantizeConfig(dtype="int8"),
            PalettizeConfig(n_bits=4, granularity="channel"),
            PalettizeConfig(n_bits=2),
        ]
        candidates = [
            compress_file(args.model, Path(folder) / f"c{i}{args.model.suffix}", c).output
            for i, c in enumerate(configs)
        ]
        compare_files(args.model, candidates[0], samples=1)  # warm: imports, first lowering
        start = time.perf_counter()
        compare_sweep(args.model, candidates, samples=args.samples)
        sweep = time.perf_counter() - start
        start = time.perf_counter()
        for candidate in candidates:
            compare_files(args.model, candidate, samples=args.samples)
        singles = time.perf_counter() - start
    n = len(candidates)
    print(f"{'run':<34} {'seconds':>8}")
    print(f"{'sweep of ' + str(n) + ' candidates':<34} {sweep:>8.2f}")
    print(f"{str(n) + ' single compares':<34} {singles:>8.2f}")
    print(f"{'sweep / singles':<34} {sweep / singles:>8.2f}   (model runs: {1 + n} vs {2 * n})")


if __name__ == "__main__":
    main()
