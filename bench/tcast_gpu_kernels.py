"""Where a TritonCast call's time goes on a CUDA GPU: the kernels' own time (CUPTI, through
torch.profiler) beside the public API's time per call (`triton.testing.do_bench`, as
bench/tcast_gpu.py reports it), both as a share of a device-to-device copy's bandwidth.

    python bench/tcast_gpu_kernels.py                       # every format, 256M elements
    python bench/tcast_gpu_kernels.py --formats float --json out.json
    python bench/tcast_gpu_kernels.py --sweep nvf4:bf16:actual,mxfp6e3:bf16:upcast

A call's `kernels` share counts the time its kernels ran; `span` the time from its first
kernel's start to its last one's end (gaps between its kernels included: a tensor scale's fill
or an amax pass before the cast); `api` is do_bench's median, which also holds whatever of the
host's work the GPU waited for. Each call follows a flush of the L2 cache, as in do_bench.
`--sweep FORMAT:DTYPE:OP,...` times the kernels of those cases under launch configurations.
`torch` rows: PyTorch's own elementwise conversions of the same byte ratios (bf16 <-> fp8).
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tcast_gpu import FORMATS, GIVEN, _bench, _cast_args, _input

import tcast
import tcast._primitives
from tcast import _triton

N = 1 << 28
REPS = 20
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
SWEEP = (
    (512, 1),
    (1024, 1),
    (1024, 2),
    (1024, 4),
    (2048, 2),
    (2048, 4),
    (4096, 4),
    (4096, 8),
    (8192, 4),
    (8192, 8),
    (16384, 8),
    (16384, 16),
)


def _flush_buffer() -> torch.Tensor:
    return torch.empty(256 << 20, dtype=torch.int8, device="cuda")


def _kernel_times(fn, flush: torch.Tensor) -> tuple[float, float, int]:  # type: ignore[no-untyped-def]
    """(median summed kernel ms a call, median span ms a call, kernels a call) over REPS calls."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(REPS):
            flush.fill_(7)  # an int8 fill of 256 MiB: the marker between calls
            fn()
        torch.cuda.synchronize()
    events = sorted(
        (e for e in prof.events() if e.device_type == DeviceType.CUDA), key=lambda e: e.time_range.start
    )
    calls: list[list] = []
    for e in events:
        if "FillFunctor<signed char>" in e.name or "FillFunctor<char>" in e.name:
            calls.append([])
        elif calls:
            calls[-1].append(e)
    sums = sorted(sum(e.time_range.elapsed_us() for e in c) for c in calls if c)
    spans = sorted(c[-1].time_range.end - c[0].time_range.start for c in calls if c)
    count = len(calls[-1]) if calls else 0
    return sums[len(sums) // 2] / 1e3, spans[len(spans) // 2] / 1e3, count


def _syncs(fn) -> int:  # type: ignore[no-untyped-def]
    """How many synchronizing CUDA calls one call makes (torch's sync debug mode)."""
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def _case_fns(x: torch.Tensor, label: str, t: tcast.Tensor | None = None) -> dict[str, tuple]:
    """op -> (call, bytes moved) of one format on x (`t`: its actual cast, when made already)."""
    name, given = _cast_args(x, label)
    n, es = x.numel(), x.element_size()
    t = t if t is not None else tcast.cast(x, name, castmode="actual", computemode="triton", **given)
    packed = t.codes.numel() + t.scales.numel() * t.scales.element_size()
    return {
        "virtual": (lambda: tcast.cast(x, name, computemode="triton", **given), 2 * n * es),
        "actual": (
            lambda: tcast.cast(x, name, castmode="actual", computemode="triton", **given),
            n * es + packed,
        ),
        "upcast": (lambda: tcast.upcast(t, computemode="triton"), packed + n * es),
    }


def _copy_gbps(x: torch.Tensor, flush: torch.Tensor) -> float:
    y = torch.empty_like(x)
    ms, _, _ = _kernel_times(lambda: y.copy_(x), flush)
    return 2 * x.numel() * x.element_size() / ms / 1e6


def kernels(formats: tuple[str, ...]) -> list[dict]:
    flush = _flush_buffer()
    rows = []
    for dname, dtype in DTYPES.items():
        x = _input(N, dtype)
        copy = _copy_gbps(x, flush)
        print(f"# {dname}: copy {copy:.0f} GB/s (kernel time); shares of it: api kernels span", flush=True)
        for label in formats:
            for op, (fn, nbytes) in _case_fns(x, label).items():
                api = _bench(fn)
                summed, span, count = _kernel_times(fn, flush)
                row = {
                    "dtype": dname, "format": label, "op": op, "api_ms": api, "kernel_ms": summed, "span_ms": span,
                    "kernels": count, "syncs": _syncs(fn), "copy_GBps": copy,
                }  # fmt: skip
                row |= {k: nbytes / row[f"{k}_ms"] / 1e6 / copy for k in ("api", "kernel", "span")}
                rows.append(row)
                print(f"{dname:5} {label:12} {op:8} {row['api']:6.1%} {row['kernel']:6.1%} {row['span']:6.1%}"
                      f"  {count} kernel(s), {row['syncs']} sync(s)", flush=True)  # fmt: skip
        if dtype is torch.bfloat16:
            rows += _torch_rows(x, flush, copy)
        del x
        torch.cuda.empty_cache()
    return rows


def _torch_rows(x: torch.Tensor, flush: torch.Tensor, copy: float) -> list[dict]:
    """PyTorch's own bf16 -> fp8 and fp8 -> bf16 conversions: a plain elementwise kernel's share."""
    f8 = x.to(torch.float8_e4m3fn)
    rows = []
    for op, fn in (
        ("to_fp8", lambda: x.to(torch.float8_e4m3fn)),
        ("from_fp8", lambda: f8.to(torch.bfloat16)),
    ):
        summed, _, _ = _kernel_times(fn, flush)
        share = 3 * x.numel() / summed / 1e6 / copy
        rows.append({"dtype": "bf16", "format": "torch", "op": op, "kernel_ms": summed, "kernel": share})
        print(f"bf16  torch        {op:8}        {share:6.1%}", flush=True)
    return rows


def sweep(cases: list[str], launches: tuple[tuple[int, int], ...] = SWEEP) -> list[dict]:
    """Each case FORMAT:DTYPE:OP's kernel share under the (elements, warps) launches."""
    flush = _flush_buffer()
    rows = []
    for case in cases:
        rows += _sweep_case(case, flush, launches)
        torch.cuda.empty_cache()
    return rows


def _sweep_case(case: str, flush: torch.Tensor, launches: tuple[tuple[int, int], ...]) -> list[dict]:
    label, dname, op = case.split(":")
    x = _input(N, DTYPES[dname])
    copy = _copy_gbps(x, flush)
    name, given = _cast_args(x, label)
    dt = tcast.lookup(name)
    value = (
        tcast._primitives.rounded_tensor_scale(dt, given["tensor_scale"]) if label.endswith(GIVEN) else None
    )
    base = tcast.cast(x, name, castmode="actual", computemode="triton", **given)
    nbytes = _case_fns(x, label, base)[op][1]
    rows = []
    for elements, warps in launches:
        cfg = _triton.LaunchConfig(elements, warps)

        def fn(cfg: _triton.LaunchConfig = cfg) -> object:
            if op == "upcast":
                return _triton.upcast(base, config=cfg)
            mode = tcast.ScaleMode.MAX
            return _triton.cast(
                x, dt, tcast.RoundMode.EVEN, mode, 0, op == "virtual", given=value, config=cfg
            )

        try:
            summed, _, _ = _kernel_times(fn, flush)
        except Exception as exc:  # a launch the kernel cannot take (registers, shared memory)
            print(f"{case:28} {elements:6} x{warps:<3} failed: {type(exc).__name__}", flush=True)
            continue
        share = nbytes / summed / 1e6 / copy
        rows.append(
            {"case": case, "elements": elements, "warps": warps, "kernel_ms": summed, "kernel": share}
        )
        print(f"{case:28} {elements:6} x{warps:<3} {share:6.1%}", flush=True)
    return rows


def _launches(text: str, parser: argparse.ArgumentParser) -> tuple[tuple[int, int], ...]:
    """--launches' (elements, warps) pairs; a malformed item is the parser's error."""
    found = []
    for item in (i for i in text.split(",") if i):
        parts = item.split("x")
        if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
            parser.error(f"--launches: {item!r} is not ELEMENTSxWARPS (e.g. 2048x1)")
        found.append((int(parts[0]), int(parts[1])))
    return tuple(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--formats", choices=sorted(FORMATS), default="all")
    parser.add_argument("--sweep", default="", help="FORMAT:DTYPE:OP,... (launch sweep of those cases)")
    parser.add_argument(
        "--launches", default="", help="ELEMENTSxWARPS,... for --sweep (default: a fixed set)"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.launches and not args.sweep:
        parser.error("--launches needs --sweep")
    launches = _launches(args.launches, parser) or SWEEP
    if not torch.cuda.is_available():
        raise SystemExit("bench/tcast_gpu_kernels.py needs a CUDA GPU")
    import triton

    print(
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}", flush=True
    )
    result: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    if args.sweep:
        result["sweep"] = sweep([c for c in args.sweep.split(",") if c], launches)
    else:
        result["kernels"] = kernels(FORMATS[args.formats])
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
