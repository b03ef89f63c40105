"""Throughput of tcast's virtual MX casts on the CPU, beside torch's native fp8 round trip.

    python bench/tcast_cpu.py [--elements 16777216] [--repeat 5]

Prints a table: median seconds, M elements/s, and the ratio to `x.to(torch.float8_e4m3fn).float()`
measured on the same tensor in the same run. Goal (issue 3): each MX cast within 4x of that.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

import tcast


def median_seconds(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    fn()  # warm up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--elements", type=int, default=16 * 1024 * 1024)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    x = torch.randn(args.elements // 4096, 4096, generator=torch.Generator().manual_seed(0))
    native = median_seconds(lambda: x.to(torch.float8_e4m3fn).float(), args.repeat)
    rows = [("native x.to(float8_e4m3fn).float()", native)]
    for name in ("mxfp8e4", "mxfp4e2", "mxint8", "bfp16"):
        rows.append((f"tcast.cast(x, {name})", median_seconds(lambda n=name: tcast.cast(x, n), args.repeat)))
    print(
        f"# {args.elements:,} fp32 elements, torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.processor() or platform.machine()}"
    )
    print(f"{'operation':40s} {'median s':>10s} {'M elem/s':>10s} {'x native':>9s}")
    for label, seconds in rows:
        print(f"{label:40s} {seconds:10.4f} {args.elements / seconds / 1e6:10.1f} {seconds / native:9.2f}")


if __name__ == "__main__":
    main()
