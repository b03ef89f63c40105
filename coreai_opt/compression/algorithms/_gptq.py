"""GPTQ (Frantar et al., 2022) onto any grid: the weight is rounded one input column at a time,
and each column's rounding error is pushed onto the columns not yet rounded through the inverse
of the consumer's input Gram matrix H = E[x x^T] - so what stays close is the layer's output on
the calibration data, not the weight itself.

The grid is the format's: for `quantize`, the codes under the scales (and zero points) round to
nearest would choose - symmetric integers' scales shrunk tile by tile where that lowers the
importance-weighted error (`grids.weighted_grid`) - fixed from the weight before any column moves (so a
block keeps its scale whatever order columns go in; tcast rounds each column onto them, the same
cast as the final one); for `palettize`, the look-up tables of importance-weighted k-means (diag H), each
element snapped to the nearest entry of its channel's table (vector tables, GPTVQ: each run of
`cluster_dim` channels of a column snapped to its table's nearest vector). Columns go in order of decreasing
H_ii (act order), updated lazily in blocks of `_BLOCK`, in float64 on the weight's device (a block's
columns in one kernel: numba's on the CPU, `_gptq_numba`; Triton's on CUDA, `_gptq_kernel`), a piece of rows at a time;
H is damped by 1% of its mean diagonal and inputs that never fire are zeroed. A weight the data gives
no Gram matrix for (an embedding lookup, a grouped convolution) takes the data-free encoding -
for symmetric integers with the scales that least change the weight itself (`grids.weighted_grid`).
"""

from __future__ import annotations

import importlib.util
from dataclasses import replace

import torch

import tcast
from coreai_opt._pieces import SOLVE_PIECE, spans
from coreai_opt.weights import (
    Encoding,
    Palettized,
    Quantized,
    Statistics,
    Stored,
    WeightSite,
    decode,
)

from ..configs import PalettizeConfig, QScheme, QuantizeConfig
from ..grids import Grid, column_datatype, element_grid, grid_of, quantize_onto, spread_tiles, weighted_grid
from ._columns import ColumnGrid, Rounding, in_pieces, nearest_entries
from ._kmeans import palettize, weighted_palettize
from ._layerwise import MatrixView, dead_inputs, gram_of, inverse_cholesky, with_output_error
from ._sensitive import input_importance

_BLOCK = 128
# float64 elements of a weight's rows solved at once: an MLP weight of a 1B model in one piece
# (each piece is a pass of its own: more launches), an output head in a few
_SOLVE_PIECE = SOLVE_PIECE


def solve(
    matrix: torch.Tensor, gram: torch.Tensor, round_column: Rounding, fused: bool | None = None
) -> torch.Tensor:
    """GPTQ's pass over `matrix` [rows, columns] (see the module): the value each column held
    when it was rounded (float32), in the matrix's column order; `round_column` of those values
    is the result. `gram` is H in the same column order. Rows never mix in GPTQ, so a ColumnGrid's
    weight is solved `_SOLVE_PIECE` elements of rows at a time (a 32,000-row output head in
    pieces, not whole float64 copies). `fused`: a block of columns in one kernel (a ColumnGrid
    only; by default on the CPU, numba's, and on CUDA devices where Triton is installed, Triton's)
    - the same values as the torch loop, without its per-column calls."""
    order = torch.sort(torch.diagonal(gram), descending=True, stable=True).indices
    rows, columns = matrix.shape
    upper = inverse_cholesky(gram, order).contiguous()
    dead = dead_inputs(gram)[order]
    grid = isinstance(round_column, ColumnGrid)
    kernel = (_fused_by_default(matrix.device) if fused is None else fused) and grid
    pieces = spans(rows, columns, _SOLVE_PIECE) if grid else [(0, rows)]
    columns_of = order.tolist()  # read on the host once: an index per column would wait on the device
    result = torch.empty((rows, columns), dtype=torch.float32, device=matrix.device)
    for top, bottom in pieces:
        rounding = round_column.rows(top, bottom) if len(pieces) > 1 else round_column  # type: ignore[union-attr]
        w = matrix[top:bottom].double()[:, order]  # a copy, in solve order
        w[:, dead] = 0.0
        if kernel:
            held = _solve_fused(w, upper, order, rounding)  # type: ignore[arg-type]
        else:
            held = torch.empty(w.shape, dtype=torch.float32, device=w.device)
            for a in range(0, columns, _BLOCK):
                b = min(a + _BLOCK, columns)
                w[:, b:] -= _solve_columns(w, a, b, upper, columns_of, rounding, held) @ upper[a:b, b:]
        result[top:bottom, order] = held
    return result


def _solve_fused(w: torch.Tensor, upper: torch.Tensor, order: torch.Tensor, grid: ColumnGrid) -> torch.Tensor:
    """The pass over `w` (solve order) a block at a time through the block kernel of its device."""
    if w.device.type == "cpu":  # numba reads strided arrays: broadcast scales stay views
        from ._gptq_numba import solve_block
    else:
        from ._gptq_kernel import solve_block

        grid = grid.contiguous()
    rows, columns = w.shape
    held = torch.empty((rows, columns), dtype=torch.float32, device=w.device)
    errors = torch.empty((rows, _BLOCK), dtype=torch.float64, device=w.device)
    for a in range(0, columns, _BLOCK):
        b = min(a + _BLOCK, columns)
        w[:, b:] -= solve_block(w, a, b, upper, order, grid, held, errors) @ upper[a:b, b:]
    return held


def _fused_by_default(device: torch.device) -> bool:
    return device.type == "cpu" or (device.type == "cuda" and importlib.util.find_spec("triton") is not None)


def _solve_columns(
    w: torch.Tensor, a: int, b: int, upper: torch.Tensor, columns_of: list[int], round_column: Rounding,
    held: torch.Tensor,
) -> torch.Tensor:  # fmt: skip
    """Columns a .. b of the pass one at a time (the torch loop): their scaled errors."""
    part = w[:, a:b].clone()
    errors = torch.empty_like(part)
    for i in range(b - a):
        column = part[:, i].float()
        held[:, a + i] = column
        error = (column.double() - round_column(column, columns_of[a + i]).double()) / upper[a + i, a + i]
        part[:, i:] -= error[:, None] * upper[a + i, a + i : b][None, :]
        errors[:, i] = error
    return errors


def quantize_gptq(
    w: torch.Tensor,
    site: WeightSite,
    config: QuantizeConfig,
    statistics: Statistics | None = None,
    compare: bool = True,
) -> Encoding | str:
    """Codes chosen by GPTQ under round-to-nearest's scales, clipped for symmetric integers (see
    the module)."""
    grid = grid_of(w, site, config)
    if isinstance(grid, str):
        return grid
    free = quantize_onto(w, site, config, grid)
    if isinstance(free, str):
        return free
    view = MatrixView.of(site)
    gram = gram_of(statistics, view)
    importance = input_importance(statistics, site)
    if importance is None:  # no data reaches it (an embedding lookup): the plain squared error
        importance = torch.ones((1,) * len(site.shape), dtype=torch.float64).expand(site.shape)
    clipped = weighted_grid(w, site, config, grid, free, importance)
    onto = free if clipped is grid else quantize_onto(w, site, config, clipped)  # other formats: as is
    grid = clipped
    if isinstance(onto, str):
        return free
    if gram is None:
        return onto
    device = gram.device  # the solve runs where the calibration left its statistics
    if config.dtype.is_int:
        round_column: Rounding = integer_rounding(onto, view, config, device)
    else:
        round_column = _float_rounding(element_grid(grid, w, site, config), view, site, config, device)
    matrix = view.matrix(w.to(device))  # in the weight's dtype: widened a piece of rows at a time
    held = view.weight(solve(matrix, gram, round_column)).to(w.device)
    encoding = quantize_onto(held, site, config, grid)
    del held, round_column  # the weight's size each: gone before the output error is measured
    if isinstance(encoding, str):
        return encoding
    return with_output_error(config.method, encoding, free, view, matrix, gram, measured=compare)


def integer_rounding(
    encoding: Encoding, view: MatrixView, config: QuantizeConfig, device: torch.device
) -> Rounding:
    """Integer codes' rounding of a column onto the scales and zero points `encoding` stores, in
    float64: code = clamp(round(v / scale) + zero point) (ties to even, as tcast rounds the exact
    quotient: a float32 value over a 16- or 32-bit scale is never within float64's error of a
    tie it is not), value = (code - zero point) x scale. Symmetric codes stay within
    +-(2**(bits-1) - 1) of the zero point, asymmetric ones span the storage type. Thousands of
    columns make tcast's per-call cost count; the final codes are still tcast's (tested equal)."""
    from coreai_opt.weights import torch_values

    form = encoding.form
    assert isinstance(form, Quantized) and form.decode is not None
    scale = _per_element(torch_values(form.decode.scale), view, device)
    bits, signed = config.dtype.bits, config.dtype.signed
    # clamp(round(v / s) + z, first, last) - z is computed as clamp(round(v / s), first - z, last - z):
    # every term is an integer held exactly in float64, so the two agree, with fewer kernels per
    # column (the solve is bound by kernel launches)
    if config.qscheme is QScheme.SYMMETRIC:  # +-half around any zero point: the bounds are constants
        half = 2 ** (bits - 1) - 1
        return ColumnGrid("int", scale, float(-half), float(half))
    offset = form.decode.offset
    first = -(2 ** (bits - 1)) if signed else 0
    if offset is None:
        return ColumnGrid("int", scale, float(first), float(first + 2**bits - 1))
    zero = _per_element(torch_values(offset), view, device)
    return ColumnGrid("int", scale, first - zero, first + 2**bits - 1 - zero)


def _per_element(tiles: torch.Tensor, view: MatrixView, device: torch.device) -> torch.Tensor:
    """Per-tile values at every element of the matrix view, in float32 or wider (exact for what
    it holds: the weight's own scales, powers of two, integer zero points; the rounding widens
    them to float64 as it reads them): a broadcast view where one tile spans the input axis, so a
    per-channel grid of a 32,000-row head costs no weight-sized copy."""
    values = tiles.to(device, torch.promote_types(tiles.dtype, torch.float32))  # expanded on the device
    spans_input = all(have in (1, want) for have, want in zip(values.shape, view.shape, strict=True))
    spread = values.expand(view.shape) if spans_input else spread_tiles(values, view.shape)
    return view.matrix(spread)


def _float_rounding(
    spread: Grid, view: MatrixView, site: WeightSite, config: QuantizeConfig, device: torch.device
) -> Rounding:
    """A column's rounding onto its float element grid under the given scales: a ColumnGrid
    (tcast's cast, tested equal) where no zero point shifts it, tcast's cast itself where one does."""
    scales = view.matrix(spread.scales).to(device)
    zeros = None if spread.zero_points is None else view.matrix(spread.zero_points).to(device)
    datatype = column_datatype(site, config)

    if zeros is not None:

        def cast(column: torch.Tensor, j: int) -> torch.Tensor:
            return tcast.cast(column[:, None], datatype, castmode="virtual", computemode="auto",
                              scales=scales[:, j : j + 1].contiguous(),
                              zero_points=zeros[:, j : j + 1].contiguous())[:, 0]  # fmt: skip

        return cast
    nspec, sspec = datatype.nspec, datatype.sspec
    assert sspec is not None
    values = tcast.decode(scales, sspec.scale, torch.float32) if sspec.is_exponent else scales  # E8M0: codes
    element = (nspec.mbits, nspec.emin, nspec.max)
    return ColumnGrid("float", values, element=element)


def _lut_rows(encoding: Encoding, site: WeightSite) -> torch.Tensor:
    """Each output channel's look-up table as the device decodes it: [channels, entries] - for
    vector tables, each entry's component that lands on the channel."""
    form = encoding.form
    assert isinstance(form, Palettized)
    axis, rank = form.axis, len(site.shape)
    other = 1 if axis == 0 else 0
    entries, dim = form.lut.values.shape[-2], form.lut.values.shape[-1]
    shape = [1] * rank
    shape[axis], shape[other] = site.shape[axis] // dim, entries
    probe = torch.arange(entries, dtype=torch.uint8).reshape(
        [entries if a == other else 1 for a in range(rank)]
    )
    indices = Stored(probe.expand(shape).contiguous().numpy(), form.indices.element)
    dense = decode(replace(encoding, form=replace(form, indices=indices)))
    return (
        dense.movedim(axis, 0)
        .movedim(other if other > axis else other + 1, -1)
        .reshape(site.shape[axis], entries)
    )


def _vector_tables(rows: torch.Tensor, dim: int) -> torch.Tensor:
    """[channels, entries] tables (`_lut_rows`) as each vector's: [channels / dim, entries, dim]."""
    channels, entries = rows.shape
    return rows.reshape(channels // dim, dim, entries).transpose(1, 2).contiguous()


def nearest_vectors(
    values: torch.Tensor, tables: torch.Tensor, dtype: torch.dtype = torch.int64
) -> torch.Tensor:
    """The index of the entry of each vector's table [vectors, entries, dim] nearest (squared
    distance, ties: the lower index) each of its values [vectors, n, dim]: [vectors, n]."""
    vectors, n, _ = values.shape
    step = max(1, (1 << 22) // max(1, n * tables.shape[1] * tables.shape[2]))

    def piece(a: int, b: int) -> torch.Tensor:
        return (
            (values[a:b].double()[:, :, None, :] - tables[a:b].double()[:, None, :, :])
            .pow(2)
            .sum(-1)
            .argmin(-1)
        )

    return in_pieces(piece, (vectors, n), step, dtype, values.device)


def _vector_rounding(tables: torch.Tensor) -> Rounding:
    """A column's rounding onto vector tables: each run of `dim` channels to its table's nearest
    entry (one column's values share H's diagonal, so the plain squared distance is GPTQ's)."""
    count, _, dim = tables.shape
    rows = torch.arange(count, device=tables.device)

    def round_column(column: torch.Tensor, j: int) -> torch.Tensor:
        del j
        index = nearest_vectors(column.reshape(count, 1, dim), tables)[:, 0]
        return tables[rows, index].reshape(-1).to(column.dtype)

    return round_column


def palettize_gptq(
    w: torch.Tensor,
    site: WeightSite,
    config: PalettizeConfig,
    statistics: Statistics | None = None,
    compare: bool = True,
) -> Encoding | str:
    """Indices chosen by GPTQ onto the tables of importance-weighted k-means (see the module)."""
    view = MatrixView.of(site)
    gram = gram_of(statistics, view)
    if gram is None or len(site.shape) < 2:
        return palettize(w, site, config)
    free = palettize(w, site, config) if compare else None  # what the data is measured against
    if isinstance(free, str):
        return free
    tables_of = weighted_palettize(w, site, config, input_importance(statistics, site))
    if isinstance(tables_of, str):
        return tables_of
    device, dim = gram.device, config.cluster_dim
    tables = _lut_rows(tables_of, site).to(device)  # [channels, entries]
    matrix = view.matrix(w.to(device))  # in the weight's dtype: widened a piece of rows at a time
    if dim == 1:
        held = solve(
            matrix, gram, ColumnGrid("lut", table=tables.double().contiguous())
        )  # [channels, columns]
        index = nearest_entries(held, tables, torch.uint8)
    else:  # GPTVQ's rounding: a vector of `dim` channels at a time, its error pushed on as GPTQ's
        vectors = _vector_tables(tables, dim)
        held = solve(matrix, gram, _vector_rounding(vectors))
        chunks = held.reshape(held.shape[0] // dim, dim, -1).transpose(1, 2)  # [vectors, columns, dim]
        index = nearest_vectors(chunks, vectors, torch.uint8)
    del held
    form = tables_of.form
    assert isinstance(form, Palettized)
    shape = list(view.shape)
    shape[view.output_axis] //= dim
    coded = MatrixView(tuple(shape), view.output_axis, view.input_axis).weight(index)
    indices = Stored(coded.contiguous().cpu().numpy(), form.indices.element)
    encoding = replace(tables_of, form=replace(form, indices=indices))
    return with_output_error(config.method, encoding, free, view, matrix, gram, measured=compare)
