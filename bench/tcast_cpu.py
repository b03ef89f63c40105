"""Throughput and memory of tcast's casts on the CPU, beside torch's native fp8 round trip and torchao.

    python bench/tcast_cpu.py [--elements 16777216] [--repeat 5]

Two tables on one seeded fp32 tensor [N / 4096, 4096]:
1. virtual casts: median seconds, M elements/s, and the ratio to `x.to(torch.float8_e4m3fn).float()`
   measured in the same run (goal of issue 3: within 4x);
2. actual casts (codes + scales) and upcasts: M elements/s and the peak extra memory of one call
   (resident set above the set before the call, in a fresh child process (Linux: /proc's VmHWM
   reset through clear_refs), as a multiple of the input's bytes); goal of
   issue 20: >= 100 M elements/s and <= 2x for mxfp8e4 and mxfp4e2. torchao's `to_mx` / `to_dtype`
   run beside them when torchao is importable (never a dependency of ours: e.g.
   `pip install --target /tmp/tao torchao --no-deps` and PYTHONPATH=/tmp/tao).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

import tcast

_ACTUAL = ("mxfp8e4", "mxfp4e2", "nvfp4", "fp8_1x128")
_TORCHAO = {"mxfp8e4": "float8_e4m3fn", "mxfp4e2": "float4_e2m1fn_x2"}


def median_seconds(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warm up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def seeded(elements: int) -> torch.Tensor:
    return torch.randn(elements // 4096, 4096, generator=torch.Generator().manual_seed(0))


def torchao_available() -> bool:
    try:
        import torchao.prototype.mx_formats.mx_tensor  # noqa: F401
    except Exception:
        return False
    return True


def operation(kind: str, name: str, x: torch.Tensor) -> Callable[[], object]:
    """One call to time: tcast's or torchao's cast or upcast of `x` to `name`."""
    if kind == "tcast cast":
        return lambda: tcast.cast(x, name, castmode="actual")
    if kind == "tcast upcast":
        packed = tcast.cast(x, name, castmode="actual")
        return lambda: tcast.upcast(packed)
    from torchao.prototype.mx_formats.mx_tensor import to_dtype, to_mx

    elem = getattr(torch, _TORCHAO[name])
    if kind == "torchao to_mx":
        return lambda: to_mx(x, elem, 32)
    scale, data = to_mx(x, elem, 32)
    return lambda: to_dtype(data, scale, elem, 32, torch.float32)


def child(kind: str, name: str, elements: int) -> None:
    """Peak extra resident memory of one call, printed as JSON (run in a fresh process)."""
    x = seeded(elements)
    call = operation(kind, name, x)  # an upcast's packed input is made here, before the baseline
    before = _status_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) starts again from here
    call()
    print(json.dumps({"extra_bytes": (_status_kib("VmHWM") - before) * 1024}))


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def peak_extra(kind: str, name: str, elements: int) -> float:
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    out = subprocess.run(
        [sys.executable, __file__, "--child", kind, name, "--elements", str(elements)],
        capture_output=True, text=True, check=True, env=env,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])["extra_bytes"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--elements", type=int, default=16 * 1024 * 1024)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], args.elements)
        return
    x = seeded(args.elements)
    native = median_seconds(lambda: x.to(torch.float8_e4m3fn).float(), args.repeat)
    rows = [("native x.to(float8_e4m3fn).float()", native)]
    for name in ("mxfp8e4", "mxfp4e2", "mxint8", "bfp16"):
        rows.append((f"tcast.cast(x, {name})", median_seconds(lambda n=name: tcast.cast(x, n), args.repeat)))
    machine = platform.processor() or platform.machine()
    print(
        f"# {args.elements:,} fp32 elements, torch {torch.__version__}, {torch.get_num_threads()} threads, {machine}"
    )
    print(f"{'virtual cast':40s} {'median s':>10s} {'M elem/s':>10s} {'x native':>9s}")
    for label, seconds in rows:
        print(f"{label:40s} {seconds:10.4f} {args.elements / seconds / 1e6:10.1f} {seconds / native:9.2f}")

    kinds = ["tcast cast", "tcast upcast"]
    if torchao_available():
        kinds += ["torchao to_mx", "torchao to_dtype"]
    print()
    print(
        f"{'actual cast / upcast':20s} {'format':10s} {'median s':>10s} {'M elem/s':>10s} {'peak extra':>11s}"
    )
    for name in _ACTUAL:
        for kind in kinds:
            if kind.startswith("torchao") and name not in _TORCHAO:
                continue
            seconds = median_seconds(operation(kind, name, x), args.repeat)
            extra = peak_extra(kind, name, args.elements) / (x.numel() * x.element_size())
            print(
                f"{kind:20s} {name:10s} {seconds:10.4f} {args.elements / seconds / 1e6:10.1f} {extra:10.2f}x"
            )


if __name__ == "__main__":
    main()
