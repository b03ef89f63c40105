"""TritonCast on a CUDA GPU: bit-exactness against TorchCast, then bandwidth of every MX format
and of the float-scaled and 2-D tiled ones (NVFP4, FP8 recipes, square MX tiles).

    python bench/tcast_gpu.py                 # check + tables for 16M, 256M and 1G elements
    python bench/tcast_gpu.py --formats float --sizes 256M
    python bench/tcast_gpu.py --sweep         # launch-configuration sweep at 256M elements
    python bench/tcast_gpu.py --sizes 16M --json out.json

Formats that need the tensor's amax first (one scale per tensor: fp8_F; two levels: nvfp4) read
the input twice; GB/s still counts the input once, so their share of copy bandwidth is the
end-to-end figure a caller sees. Their `+ts` rows give the cast that tensor scale
(`tcast.cast(..., tensor_scale=)`, as a calibrated model would), so it reads the input once.
Times are medians of `triton.testing.do_bench` through the public API (`tcast.cast` /
`tcast.upcast` with computemode triton). GB/s counts bytes read plus bytes written, beside a
device-to-device copy of the input measured in the same run. When torchao is importable its
`triton_to_mxfp8_dim0` (floor scaling, as OCP MX; bf16 input only) and
`triton_mxfp8_dequant_dim0` run on the same input (see _torchao for Hopper).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tcast
from tcast import _triton

MX = ("mxfp8e4", "mxfp8e5", "mxfp6e3", "mxfp6e2", "mxfp4e2", "mxint8", "mxint4", "bfp16")
FLOAT = (
    "nvfp4",
    "nvfp4+ts",
    "nvf4",
    "fp8_F",
    "fp8_F+ts",
    "fp8_Fc",
    "fp8_1x128",
    "fp8_128x128",
    "mxfp8s",
    "mxfp4s",
)
GIVEN = "+ts"  # a format name's suffix: the cast is given its tensor scale
GRID = "+grid"  # a format name's suffix: the cast is given its per-tile scales (as GPTQ rounds)
# the last: int4 codes under float16 steps per 32 (coreai_opt's int4 block 32 through tcast)
# (beside each, the cast that computes its scales; Triton computes no float16 tile scales)
GRIDS = ("mxfp4e2", "mxfp4e2+grid", "mxfp8e4", "mxfp8e4+grid", "nvf4", "nvf4+grid", "fp8_1x128",
         "fp8_1x128+grid", "int4_f16_t32+grid")  # fmt: skip
CUSTOM = {"int4_f16_t32": ("int4", "e5m10b13_t32")}
FORMATS = {"mx": MX, "float": FLOAT, "grid": GRIDS, "all": MX + FLOAT}
SIZES = {"16M": 1 << 24, "256M": 1 << 28, "1G": 1 << 30}
COLS = 4096


def _bench(fn) -> float:  # type: ignore[no-untyped-def]
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=25, rep=200, return_mode="median"))


def _input(n: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(n // COLS, COLS, device="cuda", dtype=torch.float32, generator=g)
    return x.mul_(torch.logspace(-4, 4, COLS, device="cuda")).to(dtype)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    na, nb = torch.isnan(a.float()), torch.isnan(b.float())
    if not torch.equal(na, nb):
        return False
    as_int = {4: torch.int32, 2: torch.int16}[a.element_size()]
    return torch.equal(a.view(as_int)[~na], b.view(as_int)[~nb])


def _same_tensor_scale(a: tcast.Tensor, b: tcast.Tensor) -> bool:
    if a.tensor_scale is None or b.tensor_scale is None:
        return a.tensor_scale is None and b.tensor_scale is None
    return _same(a.tensor_scale.reshape(1).cuda(), b.tensor_scale.reshape(1).cuda())


def _cast_args(x: torch.Tensor, name: str) -> tuple[object, dict]:
    """(tcast type, keyword arguments) of a bench format: `+ts` passes the tensor scale the
    cast itself derives, so the output is the same and only the amax pass is saved; `+grid` its
    per-tile scales (the kernel for a grid fixed in advance)."""
    if name.endswith(GRID):
        base = name.removesuffix(GRID)
        dtype = tcast.datatype(*CUSTOM[base]) if base in CUSTOM else base
        finite = torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)
        return dtype, {
            "scales": tcast.cast(finite, dtype, castmode="actual", computemode="torch").scale_grid()
        }
    if not name.endswith(GIVEN):
        return name, {}
    base = name.removesuffix(GIVEN)
    finite = torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)  # the check's NaN/Inf: per element
    t = tcast.cast(finite, base, castmode="actual", computemode="triton")
    given = t.tensor_scale if t.tensor_scale is not None else t.scales
    return base, {"tensor_scale": float(given.float().reshape(()))}  # a float: no read-back per call


def check(formats: tuple[str, ...], n: int = 1 << 22) -> list[dict]:
    """Bit-exact TritonCast vs TorchCast on the GPU at 4M elements: every format, each round and
    scale mode once (tests/test_tritoncast.py crosses them all on small tensors)."""
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        x = _input(n, dtype, seed=1)
        x.view(-1)[::100_003] = float("nan")
        x.view(-1)[7::200_003] = float("inf")
        x[5, :64] = 0
        for label in formats:
            name, given = _cast_args(x, label)
            for rm, sm in (("even", "max"), ("nearest", "midmax"), ("zero", "ceil")):
                modes = {"roundmode": rm, "scalemode": sm} | given
                vt = tcast.cast(x, name, computemode="torch", **modes)
                vg = tcast.cast(x, name, computemode="triton", **modes)
                at = tcast.cast(x, name, castmode="actual", computemode="torch", **modes)
                ag = tcast.cast(x, name, castmode="actual", computemode="triton", **modes)
                up = tcast.upcast(ag, computemode="auto" if label.endswith(GRID) else "triton")
                ok = (
                    _same(vt, vg)
                    and torch.equal(at.codes, ag.codes)
                    and _same(at.scales.float(), ag.scales.float())
                    and _same_tensor_scale(at, ag)
                    and _same(up, vt)
                )
                rows.append({"dtype": str(dtype)[6:], "format": label, "round": rm, "scale": sm, "exact": ok})
    return rows


def sweep(n: int = SIZES["256M"]) -> list[dict]:
    """Time launch configurations of the cast and upcast kernels."""
    rows = []
    x = _input(n, torch.bfloat16)
    for name in ("mxfp8e4", "mxfp4e2", "mxfp6e2"):
        dt = tcast.lookup(name)
        for elements in (2048, 4096, 8192, 16384):
            for warps in (2, 4, 8):
                cfg = _triton.LaunchConfig(elements, warps)

                def act(cfg=cfg, dt=dt):  # type: ignore[no-untyped-def]
                    return _triton.cast(
                        x, dt, tcast.RoundMode.EVEN, tcast.ScaleMode.MAX, 0, False, config=cfg
                    )

                t = act()
                out_bytes = t.codes.numel() + t.scales.numel()
                ms_a = _bench(act)
                ms_u = _bench(lambda cfg=cfg, t=t: _triton.upcast(t, config=cfg))
                rows.append(
                    {
                        "format": name, "elements": elements, "warps": warps,
                        "actual_ms": ms_a, "actual_GBps": (2 * n + out_bytes) / ms_a / 1e6,
                        "upcast_ms": ms_u, "upcast_GBps": (2 * n + out_bytes) / ms_u / 1e6,
                    }
                )  # fmt: skip
                print(f"{name:8} {elements:6} x{warps:<3} actual {rows[-1]['actual_GBps']:7.0f} GB/s  "
                      f"upcast {rows[-1]['upcast_GBps']:7.0f} GB/s", flush=True)  # fmt: skip
    return rows


def _torchao() -> tuple | None:
    """torchao's Triton mxfp8 kernels (cast along dim0, dequant along dim0), or None.

    torchao 0.18 defines them only on sm_100+ and leaves stubs elsewhere; its gate is the
    architecture, while these two kernels need only the fp8 conversion of sm_89+. On such an
    older GPU the gate is lifted for the import, so both engines run on the same input here."""
    try:
        import importlib

        import torchao.utils as tao_utils

        gate = tao_utils.is_sm_at_least_100
        lift = not gate() and torch.cuda.get_device_capability() >= (8, 9)
        if lift:
            tao_utils.is_sm_at_least_100 = lambda: True
        try:
            from torchao.prototype.mx_formats import kernels

            if lift and not kernels._triton_kernels_available:  # imported earlier with the gate
                kernels = importlib.reload(kernels)
        finally:
            tao_utils.is_sm_at_least_100 = gate
        import torchao

        note = " (sm_100 gate lifted for this sm_89+ GPU)" if lift else ""
        print(f"torchao {torchao.__version__}{note}", flush=True)
        return kernels.triton_to_mxfp8_dim0, kernels.triton_mxfp8_dequant_dim0
    except Exception as exc:  # not installed, or built for another torch
        print(f"torchao unavailable: {type(exc).__name__}: {exc}", flush=True)
        return None


def _vs_torchao(torchao_mx: tuple, x: torch.Tensor, row) -> None:  # type: ignore[no-untyped-def]
    """torchao's mxfp8 cast (floor scaling: OCP MX, our max mode) and dequant on x, beside ours."""
    quantize, dequantize = torchao_mx
    n = x.numel()
    try:
        out, scale = quantize(x, 32, "floor")
        ms = _bench(lambda: quantize(x, 32, "floor"))
        row("torchao", "actual", ms, n * x.element_size() + out.numel() + scale.numel())
        ours = tcast.cast(x, "mxfp8e4", castmode="actual", computemode="triton")
        same = torch.equal(out.view(torch.uint8).reshape(-1), ours.codes) and torch.equal(
            scale.view(torch.uint8).reshape(-1), ours.scales
        )
        print(f"torchao floor mxfp8 codes and scales equal ours: {same}", flush=True)
        # scale bits, as torchao's own callers pass them (its .to(uint8) of e8m0 converts values)
        scale_bits = scale.view(torch.uint8)
        back = dequantize(out, scale_bits, x.dtype, 32)
        ms = _bench(lambda: dequantize(out, scale_bits, x.dtype, 32))
        row("torchao", "upcast", ms, out.numel() + scale.numel() + n * x.element_size())
        print(f"torchao mxfp8 dequant equals our upcast: {_same(back, tcast.upcast(ours))}", flush=True)
    except Exception as exc:
        print(f"torchao failed: {type(exc).__name__}: {exc}", flush=True)


def bandwidth(sizes: list[str], formats: tuple[str, ...]) -> list[dict]:
    rows = []
    torchao_mx = _torchao() if "mxfp8e4" in formats else None
    for size in sizes:
        n = SIZES[size]
        for dtype in (torch.bfloat16, torch.float32):
            x = _input(n, dtype)
            es = x.element_size()
            y = torch.empty_like(x)
            copy_ms = _bench(lambda x=x, y=y: y.copy_(x))
            copy_gbps = 2 * n * es / copy_ms / 1e6
            del y

            context = {"size": size, "dtype": str(dtype)[6:], "copy_GBps": copy_gbps}

            def row(fmt: str, op: str, ms: float, nbytes: int, context: dict = context) -> None:
                gbps = nbytes / ms / 1e6
                share = gbps / context["copy_GBps"]
                rows.append(context | {"format": fmt, "op": op, "ms": ms, "GBps": gbps, "of_copy": share})
                print(f"{context['size']:5} {context['dtype']:9} {fmt:9} {op:8} {ms:9.4f} ms "
                      f"{gbps:7.0f} GB/s {share:6.1%} of copy", flush=True)  # fmt: skip

            row("copy", "copy", copy_ms, 2 * n * es)
            for label in formats:
                name, given = _cast_args(x, label)
                ms = _bench(
                    lambda x=x, name=name, given=given: tcast.cast(x, name, computemode="triton", **given)
                )
                row(label, "virtual", ms, 2 * n * es)
                t = tcast.cast(x, name, castmode="actual", computemode="triton", **given)
                packed = t.codes.numel() + t.scales.numel() * t.scales.element_size()
                ms = _bench(
                    lambda x=x, name=name, given=given: tcast.cast(
                        x, name, castmode="actual", computemode="triton", **given
                    )
                )
                row(label, "actual", ms, n * es + packed)
                if label.endswith(GRID):  # the upcast is the computed-scale format's row
                    continue
                ms = _bench(lambda t=t: tcast.upcast(t, computemode="triton"))
                row(label, "upcast", ms, packed + n * es)
                del t
            if torchao_mx is not None and dtype is torch.bfloat16 and "mxfp8e4" in formats:
                _vs_torchao(torchao_mx, x, row)
            del x
            torch.cuda.empty_cache()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="16M,256M,1G")
    parser.add_argument("--formats", choices=sorted(FORMATS), default="all")
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--no-check", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/tcast_gpu.py needs a CUDA GPU")
    props = torch.cuda.get_device_properties(0)
    import triton

    print(
        f"{props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}, triton {triton.__version__}"
    )
    result: dict = {"device": props.name, "torch": torch.__version__, "triton": triton.__version__}
    if not args.no_check:
        rows = check(FORMATS[args.formats])
        bad = [r for r in rows if not r["exact"]]
        print(f"bit-exact vs TorchCast on the GPU: {len(rows) - len(bad)}/{len(rows)} cases", flush=True)
        for r in bad:
            print("  MISMATCH", r)
        result["check"] = rows
    if args.sweep:
        result["sweep"] = sweep()
    else:
        result["bandwidth"] = bandwidth([s for s in args.sizes.split(",") if s], FORMATS[args.formats])
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
