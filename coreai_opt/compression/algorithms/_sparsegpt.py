"""SparseGPT (Frantar & Alistarh, 2023): pruning that repairs what it removes. Columns are pruned
one at a time in the matrix view (`_layerwise`), and each pruned weight's loss is pushed onto
the columns not yet visited through the inverse of the consumer's input Gram matrix, as GPTQ
does with rounding errors - so the layer's output on the calibration data stays close.

Which weights go is chosen as SparseGPT chooses, by the optimal-brain-surgeon score w^2 / U_ii^2
(U the upper Cholesky factor of H^-1): unstructured, within each block of `_BLOCK` columns,
each row's share of its zeros - every row prunes the same fraction (the whole weight's count is
exact), the per-output comparison group Wanda (Sun et al., 2023) found best for language models
- so rows never mix and a weight is pruned a piece of rows at a time; n:m, in each run of m
columns along the input axis, the n best of every row kept; block pruning keeps magnitude
pruning's mask of whole channel blocks and repairs the weights kept. The kept values are then
compressed as magnitude pruning compresses them (int8, FP8, uint8 or a LUT). A weight the data
gives no Gram matrix for is pruned by magnitude.
"""

from __future__ import annotations

import torch

from coreai_opt._pieces import SOLVE_PIECE, spans
from coreai_opt.weights import Encoding, Statistics, WeightSite

from ..configs import DType, SparsifyConfig
from ._layerwise import MatrixView, dead_inputs, gram_of, inverse_cholesky, with_output_error
from ._magnitude import kept_units, sparse_encoding, sparsify, sparsity_mask

_BLOCK = 128
_SOLVE_PIECE = SOLVE_PIECE


def _lowest(scores: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """A mask (scores' shape, [rows, width]) of each row's `counts[row]` lowest scores (ties: the
    lower index goes first)."""
    order = torch.sort(scores, dim=1, stable=True).indices
    ranks = torch.arange(scores.shape[1], device=scores.device)
    return torch.zeros_like(scores, dtype=torch.bool).scatter_(1, order, ranks[None, :] < counts[:, None])


def zeros_per_row(config: SparsifyConfig, rows: int, columns: int) -> torch.Tensor:
    """How many entries each row of an unstructured weight loses: the whole weight's count (as
    magnitude pruning keeps it) spread evenly, the first rows taking one more where it does not
    divide."""
    uint8 = config.quantize_dtype is DType.UINT8
    total = rows * columns - kept_units(rows * columns, float(config.target_sparsity or 0), 1, uint8)
    base, extra = divmod(total, rows)
    return torch.full((rows,), base, dtype=torch.int64) + (torch.arange(rows) < extra)


def prune(matrix: torch.Tensor, gram: torch.Tensor, config: SparsifyConfig,
          fixed: torch.Tensor | None = None, upper: torch.Tensor | None = None,
          zeros: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """SparseGPT over `matrix` [rows, columns] (any float dtype, in the view's column order): the
    repaired weight (pruned entries zero) and the pruned mask. `fixed` gives the pruned mask
    instead of choosing it; `upper`, H^-1's factor, where the caller has it already; `zeros`,
    each row's count of zeros when unstructured (default: `zeros_per_row` of the matrix)."""
    w = matrix.to(torch.float64, copy=True)  # one float64 copy, whatever the matrix's dtype
    w[:, dead_inputs(gram)] = 0.0
    if upper is None:
        upper = inverse_cholesky(gram)
    rows, columns = w.shape
    pruned = torch.zeros((rows, columns), dtype=torch.bool, device=w.device)
    diagonal = torch.diagonal(upper)
    width = _BLOCK
    zeros_left = torch.zeros(0)
    if config.n_m_ratio is not None:
        width = max(config.n_m_ratio[1], _BLOCK - _BLOCK % config.n_m_ratio[1])
    elif fixed is None:
        zeros_left = (zeros_per_row(config, rows, columns) if zeros is None else zeros).to(w.device)
    for a in range(0, columns, width):
        b = min(a + width, columns)
        part = w[:, a:b].clone()
        errors = torch.zeros_like(part)
        if fixed is not None:
            pruned[:, a:b] = fixed[:, a:b]
        elif config.n_m_ratio is None:  # each row's share of the zeros it still has to place
            share = (zeros_left.double() * (b - a) / (columns - a)).round().long()
            pruned[:, a:b] = _lowest(part**2 / diagonal[a:b] ** 2, share)
            zeros_left = zeros_left - share
        for i in range(b - a):
            if config.n_m_ratio is not None and i % config.n_m_ratio[1] == 0:
                n, m = config.n_m_ratio
                run = part[:, i : i + m] ** 2 / diagonal[a + i : a + i + m] ** 2
                worst = torch.sort(run, dim=1, descending=True, stable=True).indices[:, n:]
                pruned[:, a + i : a + i + m].scatter_(1, worst, True)
            column = part[:, i]
            error = torch.where(pruned[:, a + i], column, torch.zeros_like(column)) / upper[a + i, a + i]
            part[:, i:] -= error[:, None] * upper[a + i, a + i : b][None, :]
            errors[:, i] = error
        w[:, a:b] = torch.where(pruned[:, a:b], torch.zeros_like(part), part)
        for top, bottom in spans(rows, columns - b):  # rows never mix here: no weight-sized product
            w[top:bottom, b:] -= errors[top:bottom] @ upper[a:b, b:]
    return w, pruned


def sparsify_sparsegpt(
    w: torch.Tensor,
    site: WeightSite,
    config: SparsifyConfig,
    statistics: Statistics | None = None,
    compare: bool = True,
) -> Encoding | str:
    """The mask and kept values SparseGPT chooses and repairs (see the module)."""
    free = sparsify(w, site, config)
    view = MatrixView.of(site)
    gram = gram_of(statistics, view)
    if gram is None or isinstance(free, str):
        return free
    matrix = view.matrix(w.to(gram.device))  # the sweep runs where the statistics are
    fixed = None
    if config.block_size is not None:
        mask = sparsity_mask(w, site, config)
        assert not isinstance(mask, str)
        fixed = ~view.matrix(mask).to(gram.device)
    dense, kept = _pruned(matrix, gram, config, fixed, w.dtype)
    encoding = sparse_encoding(view.weight(dense), view.weight(kept), site, config)
    del dense, kept
    if isinstance(encoding, str):
        return encoding
    return with_output_error(config.method, encoding, free, view, matrix, gram, measured=compare)


def _pruned(
    matrix: torch.Tensor, gram: torch.Tensor, config: SparsifyConfig, fixed: torch.Tensor | None,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """`prune`'s repaired matrix in `dtype` and its kept mask, on the CPU. Rows never mix (each
    row places its own zeros): pieces of `_SOLVE_PIECE` elements of rows, so no float64 copy of
    an output head exists at once (the same bits: pieces are whole tiles)."""
    rows, columns = matrix.shape
    upper = inverse_cholesky(gram)
    zeros = zeros_per_row(config, rows, columns) if config.n_m_ratio is None and fixed is None else None
    dense = torch.empty((rows, columns), dtype=dtype)
    kept = torch.empty((rows, columns), dtype=torch.bool)
    for top, bottom in spans(rows, columns, _SOLVE_PIECE):
        piece = None if fixed is None else fixed[top:bottom]
        counts = None if zeros is None else zeros[top:bottom]
        repaired, pruned = prune(matrix[top:bottom], gram, config, piece, upper, counts)
        dense[top:bottom], kept[top:bottom] = repaired.to(dtype).cpu(), (~pruned).cpu()
    return dense, kept
