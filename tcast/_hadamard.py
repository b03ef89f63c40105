"""Randomised Hadamard (incoherence) rotation: spread outliers over a block before quantizing.

`hadamard(x, dim, size, seed)` splits `dim` into blocks of `size` values (a power of two, 16 to
4096) and maps each block v to H (d * v) / sqrt(size): d holds `size` signs drawn from `seed`
(the same for every block), H is Sylvester's Hadamard matrix. The map is orthonormal, so the
inverse, `hadamard_inverse`, is d * (H y) / sqrt(size), and squared errors made on the rotated
values are the errors of the values rotated back. A block with one large value becomes a block
of `size` values of equal magnitude: a power-of-two block scale (MX) then fits the bulk instead of
the outlier. NVFP4's fine e4m3 scale per 16 values already follows outliers, and its e2m1
elements represent the near-Gaussian rotated blocks worse: there the rotation costs SNR (tested).

H is applied as log2(size) butterfly passes (a + b, a - b) in float32 (float64 for float64
inputs): O(size log size) per block, no matrix. On CUDA one Triton kernel does the same
arithmetic in the same order (tcast/_triton/_hadamard.py), so both give the same bits.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch

from ._primitives import signs_for

MIN_SIZE, MAX_SIZE = 16, 4096


@functools.lru_cache(maxsize=32)
def _check(x: torch.Tensor, dim: int, size: int) -> int:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError("hadamard takes a floating-point torch tensor")
    if size < MIN_SIZE or size > MAX_SIZE or size & (size - 1):
        raise ValueError(f"size must be a power of two from {MIN_SIZE} to {MAX_SIZE}, got {size}")
    if x.dim() == 0:
        raise ValueError("hadamard needs a tensor of rank >= 1")
    dim = dim % x.dim()
    if x.shape[dim] % size:
        raise ValueError(f"dim {dim} has {x.shape[dim]} values, not a multiple of the block size {size}")
    return dim


def _butterflies(blocks: torch.Tensor) -> torch.Tensor:
    """H @ each row of `blocks` [n, size] (unnormalised), by the fast Walsh-Hadamard transform."""
    n, size = blocks.shape
    half = 1
    while half < size:
        pairs = blocks.view(n, size // (2 * half), 2, half)
        a, b = pairs[:, :, 0, :], pairs[:, :, 1, :]
        blocks = torch.stack((a + b, a - b), dim=2).reshape(n, size)
        half *= 2
    return blocks


def _use_triton(x: torch.Tensor, computemode: Any) -> bool:
    """The engine rule of casts for a rotation (any float32/16/bf16 tensor: the kernel has no
    format limits)."""
    from ._engine import choose, tensor_support
    from ._modes import resolve_compute

    return choose(resolve_compute(computemode), tensor_support(x.dtype, x.is_cuda), x.is_cuda, "rotate")


def _rotate(x: torch.Tensor, dim: int, size: int, seed: int, inverse: bool, computemode: Any) -> torch.Tensor:
    dim = _check(x, dim, size)
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    moved = x.movedim(dim, -1)
    shape = moved.shape
    if _use_triton(x, computemode):
        from ._triton import rotate

        out = rotate(moved.reshape(-1, size).contiguous(), size, seed, inverse)
        return out.reshape(shape).movedim(-1, dim).contiguous()
    blocks = moved.reshape(-1, size).to(work)  # may be the caller's memory: only read, never written
    signs = signs_for(size, seed).to(device=x.device, dtype=work)
    norm = 1.0 / math.sqrt(size)
    out = _butterflies(blocks).mul_(norm).mul_(signs) if inverse else _butterflies(blocks * signs).mul_(norm)
    return out.reshape(shape).movedim(-1, dim).to(x.dtype).contiguous()


def hadamard(
    x: torch.Tensor, dim: int = -1, size: int = 32, seed: int = 0, computemode: Any = None
) -> torch.Tensor:
    """Blocks of `size` along `dim` rotated by the seeded randomised Hadamard transform (on CUDA
    by one Triton pass that gives TorchCast's bits; `computemode` as for `tcast.cast`)."""
    return _rotate(x, dim, size, seed, False, computemode)


def hadamard_inverse(
    y: torch.Tensor, dim: int = -1, size: int = 32, seed: int = 0, computemode: Any = None
) -> torch.Tensor:
    """Undo `hadamard` with the same `dim`, `size` and `seed`."""
    return _rotate(y, dim, size, seed, True, computemode)
