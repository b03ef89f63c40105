"""`coreopt optimize --target-bits 4 --device cuda` of the benchmark decoders, timed phase by phase.

    python bench/optimize_device.py [--size 1.1b] [--sequence 512] [--device cuda] [--bits 4]
                                    [--samples 8] [--tokens 4096] [--rotate none] [--tune-epochs 0]
                                    [--candidates default] [--estimate-sample N] [--uniform 1]
                                    [--out PATH]

The decoder of bench/decoders.py (seeded random weights; TinyLlama's shape at 1.1B) exported at
`--sequence` tokens in fp16; calibration on `--samples` seeded random windows (the decoder has no
tokenizer, so no trials: those need text), confirmation on `--tokens` seeded random token ids.
Every note `optimize` says is printed with the seconds since the start and the host's resident
memory then (and its peak so far), and the run's seconds,
the plan's bits and the peaks are written to `--out` (JSON). The weights are random: the numbers
say how fast and how large, not how accurate.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]  # coreai_opt from this checkout, and decoders


def main() -> None:
    import decoders

    parser = decoders.device_parser(__doc__, "optimize_device")
    parser.add_argument("--bits", type=float, default=4.0)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--rotate", default="none")
    parser.add_argument("--tune-epochs", type=int, default=0)
    parser.add_argument("--candidates", default="default")
    parser.add_argument("--estimate-sample", type=int, default=None, help="default: optimize's own")
    parser.add_argument("--uniform", type=int, default=1, help="uniform settings made for comparison")
    args = parser.parse_args()

    from coreai_opt.optimization import Goal, OptimizeConfig, optimize

    began = time.perf_counter()
    program = decoders.program(args.size, sequence=args.sequence)
    exported = time.perf_counter() - began
    ids = decoders.token_file(program, args.size, args.tokens, seed=1)
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    sample = OptimizeConfig().estimate_sample if args.estimate_sample is None else args.estimate_sample
    start = time.perf_counter()

    def say(line: str) -> None:
        rss, peak = decoders.host_rss()
        print(
            f"[{time.perf_counter() - start:7.1f} s, rss {rss:5.2f} GiB, peak {peak:5.2f}] {line}", flush=True
        )

    result = optimize(
        program, Goal(target_bits=args.bits), "random", ids, output=program.with_name("optimized.pt2"),
        device=args.device, rotate=args.rotate, tune_epochs=args.tune_epochs, calibration_samples=args.samples,
        candidates=args.candidates, force=True, say=say, estimate_sample=sample, uniform=args.uniform,
    )  # fmt: skip
    row = {
        "size": args.size, "sequence": args.sequence, "bits": args.bits, "export_s": round(exported, 1),
        "optimize_s": round(time.perf_counter() - start, 1), "plan_bits": result.report.bits,
        "rotate": args.rotate, "tune_epochs": args.tune_epochs, "candidates": args.candidates,
        "estimate_sample": sample, "cost_table_s": round(result.report.cost_seconds, 1),
    }  # fmt: skip
    decoders.report(row, args.device, args.out)


if __name__ == "__main__":
    main()
