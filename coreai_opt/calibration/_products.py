"""16-bit matrix products on the CPU, taken in float32 and rounded back, forward and backward.

PyTorch's CPU kernels for float16 products fall back to a generic loop for most layouts: a
weight's gradient (`mat1` of `mm` untransposed) runs at under 1 GFLOP/s where float32 runs at ~90,
so one backward pass of a 1.1B-parameter fp16 decoder would take hours. A product of 16-bit
operands is exact in float32 up to its accumulation, which the 16-bit kernels also carry out in
float32: widening the operands, multiplying and rounding the result to 16 bits gives the same
values up to the order of the sums. Only the 16-bit operands are kept for the backward pass, and
a matrix product's weight is widened a piece of its columns at a time, forward and backward, so no
float32 copy of a weight (0.26 GB at a 1B model's head) ever exists.

The Fisher pass may instead hold a weight as a bfloat16 copy (`_fisher`, fast gradients): a
product of it and a wider matrix is then taken in bfloat16 (`_Narrowed`), which CPUs with
bfloat16 instructions run at 3-5x float32's speed.
"""

from __future__ import annotations

from typing import Any

import torch

from coreai_opt import _pieces
from coreai_opt._cpu import native_bfloat16

_MM, _ADDMM, _BMM = torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default
_NARROW = (torch.float16, torch.bfloat16)


def widened(target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any | None:
    """`target(*args, **kwargs)` taken in float32 where it is a matrix product of 16-bit CPU
    tensors of one dtype (but bfloat16 without gradients on a CPU that has bfloat16 products),
    and in bfloat16 where one matrix is bfloat16 (a weight the Fisher pass holds so) and the
    other of another float dtype (`_Narrowed`); None otherwise: the caller runs it as it is."""
    if target not in (_MM, _ADDMM, _BMM) or not all(isinstance(a, torch.Tensor) for a in args):
        return None
    if any(a.device.type != "cpu" for a in args):
        return None
    bias, (a, b) = (None, args) if target is not _ADDMM else (args[0], args[1:])
    beta, alpha = float(kwargs.get("beta", 1)), float(kwargs.get("alpha", 1))
    if target is not _BMM and a.dtype != b.dtype and torch.bfloat16 in (a.dtype, b.dtype):
        return _Narrowed.apply(a, b, bias, beta, alpha)
    dtypes = {t.dtype for t in args}
    if len(dtypes) != 1 or (dtype := dtypes.pop()) not in _NARROW:
        return None
    if dtype == torch.bfloat16 and not torch.is_grad_enabled() and native_bfloat16():
        return None  # a forward pass alone: the CPU's own bfloat16 products are the fast ones
    if target is _BMM:
        return _Batched.apply(*args)
    return _Product.apply(a, b, bias, beta, alpha)


def _columns(b: torch.Tensor) -> list[slice]:
    """Pieces of the columns of b [K, N] of about `_pieces.PIECE` elements each (read at the call)."""
    step = max(1, _pieces.PIECE // max(b.shape[0], 1))
    return [slice(j, min(j + step, b.shape[1])) for j in range(0, b.shape[1], step)]


class _Product(torch.autograd.Function):
    """beta * bias + alpha * (a @ b) (addmm; mm without bias), a [M, K], b [K, N]."""

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, beta: float, alpha: float) -> torch.Tensor:  # type: ignore[override]  # fmt: skip
        ctx.save_for_backward(a, b, bias)
        ctx.beta, ctx.alpha = beta, alpha
        out = torch.empty(a.shape[0], b.shape[1], dtype=a.dtype)
        wide = a.float()
        added = None if bias is None else bias.float()
        per_column = added is not None and added.dim() > 0 and added.shape[-1] != 1
        for piece in _columns(b):
            product = wide @ b[:, piece].float()
            if alpha != 1:
                product.mul_(alpha)
            if added is not None:
                product.add_(added[..., piece] if per_column else added, alpha=beta)
            out[:, piece] = product
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        a, b, bias = ctx.saved_tensors
        wants_a, wants_b, wants_bias = ctx.needs_input_grad[:3]
        grad_a = torch.zeros(a.shape, dtype=torch.float32) if wants_a else None
        grad_b = torch.empty(b.shape, dtype=b.dtype) if wants_b else None
        wide = a.float().T if wants_b else None
        for piece in _columns(b):
            g = grad[:, piece].float().mul_(ctx.alpha)
            if grad_a is not None:
                grad_a.addmm_(g, b[:, piece].float().T)
            if grad_b is not None:
                grad_b[:, piece] = wide @ g
        grad_bias = _bias_gradient(grad, ctx.beta, bias.shape, bias.dtype) if wants_bias else None
        return (None if grad_a is None else grad_a.to(a.dtype)), grad_b, grad_bias, None, None


def _bias_gradient(grad: torch.Tensor, beta: float, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """addmm's bias gradient: beta x the output's, summed over what the bias was broadcast along."""
    return (grad.float() * beta).sum_to_size(shape).to(dtype)


class _Batched(torch.autograd.Function):
    """a @ b batched (bmm): attention's products, small operands widened whole."""

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(a, b)
        return torch.bmm(a.float(), b.float()).to(a.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        a, b = ctx.saved_tensors
        g = grad.float()
        grad_a = torch.bmm(g, b.float().transpose(1, 2)).to(a.dtype) if ctx.needs_input_grad[0] else None
        grad_b = torch.bmm(a.float().transpose(1, 2), g).to(b.dtype) if ctx.needs_input_grad[1] else None
        return grad_a, grad_b


def _in_layout(left: torch.Tensor, right: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """left @ right, laid out as `like` (a weight's gradient in its weight's layout: the product
    of a transposed view taken as the transpose of the swapped product, so no copy follows)."""
    if like.dim() == 2 and like.stride(0) == 1 and like.stride(1) == like.shape[0] and like.shape[0] > 1:
        return (right.T @ left.T).T
    return left @ right


class _Narrowed(torch.autograd.Function):
    """beta * bias + alpha * (a @ b) where one of a, b is a bfloat16 weight (the Fisher pass's fast
    products, `_fisher`): the other matrix is rounded to bfloat16 and the product taken there,
    forward and backward (3-5x float32's speed on CPUs with bfloat16 instructions); results and
    the wide operand's gradient come back in its dtype, the weight's gradient in bfloat16 and in
    the weight's layout. Only bfloat16 copies are kept for the backward pass."""

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, beta: float, alpha: float) -> torch.Tensor:  # type: ignore[override]  # fmt: skip
        wide = a.dtype if b.dtype == torch.bfloat16 else b.dtype
        a16, b16 = a.to(torch.bfloat16), b.to(torch.bfloat16)
        ctx.save_for_backward(a16, b16)
        ctx.dtypes, ctx.alpha, ctx.beta = (a.dtype, b.dtype), alpha, beta
        ctx.bias = None if bias is None else (bias.shape, bias.dtype)
        out = (a16 @ b16).to(wide)
        if alpha != 1:
            out.mul_(alpha)
        if bias is not None and beta != 0:  # addmm ignores the bias at beta 0, its NaNs too
            out.add_(bias.to(wide), alpha=beta)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        a16, b16 = ctx.saved_tensors
        g16 = (grad * ctx.alpha if ctx.alpha != 1 else grad).to(torch.bfloat16)
        wants_a, wants_b, wants_bias = ctx.needs_input_grad[:3]
        grad_a = _in_layout(g16, b16.T, a16).to(ctx.dtypes[0]) if wants_a else None
        grad_b = _in_layout(a16.T, g16, b16).to(ctx.dtypes[1]) if wants_b else None
        grad_bias = _bias_gradient(grad, ctx.beta, *ctx.bias) if wants_bias else None
        return grad_a, grad_b, grad_bias, None, None
