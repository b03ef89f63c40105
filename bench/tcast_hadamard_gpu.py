"""tcast.hadamard on a CUDA GPU: bit-exactness of the Triton kernel against the torch path, then
its bandwidth beside a device-to-device copy.

    python bench/tcast_hadamard_gpu.py                 # 256M elements, block sizes 16..4096
    python bench/tcast_hadamard_gpu.py --elements 16M --json out.json

Times are medians of `triton.testing.do_bench` through `tcast.hadamard(..., computemode=...)`;
GB/s counts bytes read plus bytes written (the copy: the same bytes).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tcast

SIZES = (16, 32, 128, 1024, 4096)
ELEMENTS = {"16M": 1 << 24, "256M": 1 << 28}


def _bench(fn) -> float:  # type: ignore[no-untyped-def]
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=25, rep=200, return_mode="median"))


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    as_int = {4: torch.int32, 2: torch.int16}[a.element_size()]
    nan = torch.isnan(a.float())
    return torch.equal(nan, torch.isnan(b.float())) and torch.equal(
        a.view(as_int)[~nan], b.view(as_int)[~nan]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", default="256M", choices=sorted(ELEMENTS))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    n = ELEMENTS[args.elements]
    rows = []
    print(
        f"{'dtype':9} {'size':>5} {'exact':>5} {'ms':>8} {'GB/s':>7} {'copy GB/s':>9} {'of copy':>7} {'torch ms':>9}"
    )
    for dtype in (torch.bfloat16, torch.float32):
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(n // 4096, 4096, device="cuda", generator=g).to(dtype)
        out = torch.empty_like(x)
        copy_ms = _bench(lambda: out.copy_(x))  # noqa: B023
        moved = 2 * x.numel() * x.element_size()
        for size in SIZES:
            check = x[: 1 << 20]
            exact = _same(
                tcast.hadamard(check, -1, size, 1, computemode="triton"),
                tcast.hadamard(check, -1, size, 1, computemode="torch"),
            ) and _same(
                tcast.hadamard_inverse(check, -1, size, 1, computemode="triton"),
                tcast.hadamard_inverse(check, -1, size, 1, computemode="torch"),
            )
            ms = _bench(lambda: tcast.hadamard(x, -1, size, 1, computemode="triton"))  # noqa: B023
            torch_ms = _bench(lambda: tcast.hadamard(x[: 1 << 24], -1, size, 1, computemode="torch"))  # noqa: B023
            torch_ms *= n / (1 << 24)  # timed on 16M elements (its temporaries), scaled
            row = {
                "dtype": str(dtype).removeprefix("torch."), "size": size, "exact": exact, "ms": ms,
                "gbps": moved / ms / 1e6, "copy_gbps": moved / copy_ms / 1e6, "of_copy": copy_ms / ms,
                "torch_ms": torch_ms,
            }  # fmt: skip
            rows.append(row)
            print(
                f"{row['dtype']:9} {size:>5} {exact!s:>5} {ms:8.3f} {row['gbps']:7.0f} {row['copy_gbps']:9.0f} "
                f"{row['of_copy']:7.0%} {torch_ms:9.2f}"
            )
    if args.json:
        args.json.write_text(
            json.dumps({"device": torch.cuda.get_device_name(), "elements": n, "rows": rows})
        )


if __name__ == "__main__":
    main()
