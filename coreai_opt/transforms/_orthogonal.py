"""Orthogonal matrices for rotating a program's residual stream: Hadamard matrices of any order
the classical constructions reach (Sylvester's doubling, Paley's two constructions and their
Kronecker products - 576 = 72 x 8, 896 = 28 x 32, 960 = 60 x 16), and seeded random ones.

A Hadamard matrix H of order n has entries +-1 and H H^T = n I, so H / sqrt(n) spreads every
channel over all n with equal weight: an outlier channel of the stream becomes n channels of
its size / sqrt(n). Random signs on its rows (QuaRot) keep that and draw a different rotation
per seed. Where no construction reaches n, the rotation is the Kronecker product of the largest
Hadamard factor with a seeded random orthogonal matrix of the rest.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def rotation_matrix(width: int, kind: str, seed: int) -> torch.Tensor:
    """An orthogonal `width` x `width` float64 matrix: "hadamard" (random signs times a
    normalised Hadamard matrix, or a Kronecker product with a random orthogonal factor where no
    Hadamard matrix of that order is built) or "random" (seeded, Haar-distributed)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    if kind == "random":
        return _haar(width, generator)
    order = largest_hadamard_factor(width)
    signs = torch.randint(0, 2, (width,), generator=generator, dtype=torch.float64) * 2 - 1
    matrix = hadamard_matrix(order) / order**0.5
    if order != width:
        matrix = torch.kron(_haar(width // order, generator), matrix)
    return (signs[:, None] * matrix).contiguous()


def largest_hadamard_factor(width: int) -> int:
    """The largest divisor of `width` that is the order of a Hadamard matrix built here."""
    return max(d for d in range(1, width + 1) if width % d == 0 and _construction(d) is not None)


def hadamard_matrix(order: int) -> torch.Tensor:
    """A Hadamard matrix of `order` (entries +-1, H H^T = order I) as float64; ValueError where
    none of the constructions reaches that order."""

    recipe = _construction(order)
    if recipe is None:
        raise ValueError(f"no Hadamard matrix of order {order} is built here")
    return _build(recipe)


@functools.cache
def _construction(order: int) -> tuple[str, int, int] | None:
    """How to build a Hadamard matrix of `order`: ("base", n, 0), ("paley1", q, 0),
    ("paley2", q, 0) or ("kron", a, b); None where none of them reaches it."""
    if order in (1, 2):
        return ("base", order, 0)
    if order % 4:
        return None
    if _is_prime(order - 1) and (order - 1) % 4 == 3:
        return ("paley1", order - 1, 0)
    if _is_prime(order // 2 - 1) and (order // 2 - 1) % 4 == 1:
        return ("paley2", order // 2 - 1, 0)
    for a in range(2, int(order**0.5) + 1):
        if order % a == 0 and _construction(a) and _construction(order // a):
            return ("kron", a, order // a)
    return None


def _build(recipe: tuple[str, int, int]) -> torch.Tensor:
    import torch

    kind, a, b = recipe
    if kind == "kron":
        return torch.kron(_build(_construction(a)), _build(_construction(b)))  # type: ignore[arg-type]
    small = {"base": lambda n: [[1]] if n == 1 else [[1, 1], [1, -1]], "paley1": _paley1, "paley2": _paley2}
    return torch.tensor(small[kind](a), dtype=torch.float64)


def _jacobsthal(q: int) -> list[list[int]]:
    """Q[i][j] = the quadratic character of j - i modulo the prime q."""
    squares = {(x * x) % q for x in range(1, q)}
    return [[0 if i == j else (1 if (j - i) % q in squares else -1) for j in range(q)] for i in range(q)]


def _paley1(q: int) -> list[list[int]]:
    """Order q + 1 for a prime q = 3 mod 4: I + S, S the skew core [[0, 1], [-1, Q]]."""
    jac = _jacobsthal(q)
    core = [[0] + [1] * q] + [[-1, *row] for row in jac]
    return [[core[i][j] + (1 if i == j else 0) for j in range(q + 1)] for i in range(q + 1)]


def _paley2(q: int) -> list[list[int]]:
    """Order 2(q + 1) for a prime q = 1 mod 4, from the symmetric conference matrix C:
    0 -> [[1, -1], [-1, -1]], +-1 -> +-[[1, 1], [1, -1]]."""
    jac = _jacobsthal(q)
    conference = [[0] + [1] * q] + [[1, *row] for row in jac]
    zero, one = ((1, -1), (-1, -1)), ((1, 1), (1, -1))
    out = []
    for row in conference:
        for r in range(2):
            out.append([(zero[r][c] if x == 0 else x * one[r][c]) for x in row for c in range(2)])
    return out


def _is_prime(n: int) -> bool:
    return n > 1 and all(n % p for p in range(2, int(n**0.5) + 1))


def _haar(width: int, generator: torch.Generator) -> torch.Tensor:
    """A Haar-random orthogonal matrix: Q of a Gaussian matrix's QR, its columns' signs fixed."""
    import torch

    q, r = torch.linalg.qr(torch.randn(width, width, generator=generator, dtype=torch.float64))
    return (q * torch.sign(torch.diagonal(r))[None, :]).contiguous()
