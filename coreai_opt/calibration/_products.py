"""16-bit matrix products on the CPU, taken in float32 and rounded back, forward and backward.

PyTorch's CPU kernels for float16 products fall back to a generic loop for most layouts: a
weight's gradient (`mat1` of `mm` untransposed) runs at under 1 GFLOP/s where float32 runs at ~90,
so one backward pass of a 1.1B-parameter fp16 decoder would take hours. A product of 16-bit
operands is exact in float32 up to its accumulation, which the 16-bit kernels also carry out in
float32: widening the operands, multiplying, and rounding the result to 16 bits gives the same
values up to the order of the sums. The wrapper keeps only the 16-bit operands for the backward
pass and widens them again there, so no float32 copy of a weight outlives its product.
"""

from __future__ import annotations

from typing import Any

import torch

_PRODUCTS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default)
_NARROW = (torch.float16, torch.bfloat16)


def widened(target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any | None:
    """`target(*args, **kwargs)` taken in float32 where it is a matrix product of 16-bit CPU
    tensors of one dtype (None otherwise: the caller runs it as it is)."""
    if target not in _PRODUCTS or not all(isinstance(a, torch.Tensor) for a in args):
        return None
    dtypes = {a.dtype for a in args}
    if len(dtypes) != 1 or dtypes.pop() not in _NARROW or any(a.device.type != "cpu" for a in args):
        return None
    return _InFloat32.apply(target, kwargs, *args)


class _InFloat32(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, target: Any, kwargs: dict[str, Any], *tensors: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.target, ctx.kwargs = target, kwargs
        ctx.save_for_backward(*tensors)
        return target(*(t.float() for t in tensors), **kwargs).to(tensors[0].dtype)  # type: ignore[no-any-return]

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        tensors = ctx.saved_tensors
        wanted = ctx.needs_input_grad[2:]
        with torch.enable_grad():
            wide = [t.detach().float().requires_grad_(w) for t, w in zip(tensors, wanted, strict=True)]
            result = ctx.target(*wide, **ctx.kwargs)
            asked = [w for w in wide if w.requires_grad]
            found = iter(torch.autograd.grad(result, asked, grad.float()) if asked else ())
        grads = [next(found).to(t.dtype) if w else None for t, w in zip(tensors, wanted, strict=True)]
        return (None, None, *grads)
