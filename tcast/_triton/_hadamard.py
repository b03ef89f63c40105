"""The randomised Hadamard rotation as one Triton pass: each program loads whole blocks, applies
the signs and log2(size) butterfly stages in registers, and stores the rotated blocks.

The arithmetic is TorchCast's (tcast/_hadamard.py) in the same order - signs, the butterflies
(a + b, a - b) stage by stage from pairs of neighbours outwards, the 1/sqrt(size) scale, then
(inverse) the signs - in float32, with no contraction into FMAs, so both engines give the same
bits. A stage regroups a block as [size / 2h, 2, h] and splits the middle axis: the pair of
halves every butterfly combines.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .._primitives import signs_for
from ._launch import as_bits
from ._memory import narrow, widen

_PROGRAM_BYTES = 8192  # of input per program, in whole blocks (swept on an H100: docs/benchmarks.md)


@triton.jit
def _butterfly_stage(x, ROWS: tl.constexpr, SIZE: tl.constexpr, HALF: tl.constexpr):
    v = tl.reshape(x, (ROWS, SIZE // (2 * HALF), 2, HALF))
    a, b = tl.split(tl.permute(v, (0, 1, 3, 2)))
    v = tl.permute(tl.join(a + b, a - b), (0, 1, 3, 2))
    return tl.reshape(v, (ROWS, SIZE))


@triton.jit
def hadamard_kernel(
    x_ptr, signs_ptr, out_ptr, n_rows, norm,
    SIZE: tl.constexpr, ROWS: tl.constexpr, LOG: tl.constexpr, INVERSE: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, SIZE)
    offsets = rows.to(tl.int64)[:, None] * SIZE + cols[None, :]
    valid = (rows < n_rows)[:, None]
    x = widen(tl.load(x_ptr + offsets, mask=valid, other=0))
    signs = tl.load(signs_ptr + cols)[None, :]
    if not INVERSE:
        x = x * signs
    for stage in tl.static_range(LOG):
        x = _butterfly_stage(x, ROWS, SIZE, 1 << stage)
    x = x * norm
    if INVERSE:
        x = x * signs
    tl.store(out_ptr + offsets, narrow(x, out_ptr), mask=valid)


def rotate(blocks: torch.Tensor, size: int, seed: int, inverse: bool) -> torch.Tensor:
    """Rows of `blocks` [n, size] (float32, float16 or bfloat16, contiguous) rotated: a new
    tensor of the same dtype."""
    out = torch.empty_like(blocks)
    n = blocks.shape[0]
    rows = max(1, _PROGRAM_BYTES // blocks.element_size() // size)
    signs = signs_for(size, seed).to(device=blocks.device)
    if n:
        hadamard_kernel[(triton.cdiv(n, rows),)](
            as_bits(blocks, loading=True), signs, as_bits(out), n, 1.0 / math.sqrt(size),
            SIZE=size, ROWS=rows, LOG=size.bit_length() - 1, INVERSE=inverse,
            num_warps=2 if blocks.element_size() == 2 else 4, enable_fp_fusion=False,
        )  # fmt: skip
    return out
