"""Compression that learns from data: GPTQ onto every grid, SparseGPT, k-means weighted by Fisher
information or input moments - each checked against an independent reference implementation or
a brute-force optimum, and by the layer output error it leaves on the calibration data."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import tcast
from coreai_opt._elements import element
from coreai_opt.compression import PalettizeConfig, QuantizeConfig, SparsifyConfig, algorithm_for
from coreai_opt.compression.algorithms._gptq import solve
from coreai_opt.compression.algorithms._kmeans import _weighted_clusters
from coreai_opt.compression.algorithms._layerwise import DAMPING, MatrixView, gram_of
from coreai_opt.compression.algorithms._sparsegpt import prune
from coreai_opt.compression.grids import _SHRINKS, weighted_grid
from coreai_opt.weights import Encoding, Statistics, WeightSite, decode

ROWS, COLUMNS, SAMPLES = 48, 64, 2048


@pytest.fixture(scope="module")
def layer() -> dict[str, torch.Tensor]:
    """A linear weight and correlated inputs with a few loud channels and one that never fires."""
    generator = torch.Generator().manual_seed(7)
    w = torch.randn(ROWS, COLUMNS, generator=generator)
    mix = torch.randn(COLUMNS, COLUMNS, generator=generator) / math.sqrt(COLUMNS)
    x = torch.randn(SAMPLES, COLUMNS, generator=generator) @ mix + 0.1 * torch.randn(
        SAMPLES, COLUMNS, generator=generator
    )
    x[:, :4] *= 8
    x[:, 9] = 0.0
    gram = x.double().T @ x.double() / SAMPLES
    return {"w": w, "x": x, "gram": gram}


def _site(shape: tuple[int, ...] = (ROWS, COLUMNS), output_axis: int = 0, input_axis: int = 1) -> WeightSite:
    return WeightSite(None, "w", shape, element("f32"), output_axis, input_axis)


def _statistics(layer: dict[str, torch.Tensor]) -> Statistics:
    return Statistics(SAMPLES, moments=torch.diagonal(layer["gram"]).clone(), gram=layer["gram"])


def _output_error(layer: dict[str, torch.Tensor], approximation: torch.Tensor) -> float:
    x, w = layer["x"].double(), layer["w"].double()
    return float(((x @ (approximation.double() - w).T) ** 2).sum() / ((x @ w.T) ** 2).sum())


def _damped(gram: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    h = gram.clone()
    dead = torch.diagonal(h) == 0
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    return h + DAMPING * float(torch.diagonal(h).mean()) * torch.eye(len(h), dtype=h.dtype)


def test_inverse_cholesky_factors_one_fresh_copy_in_place_to_the_out_of_place_bits() -> None:
    """H^-1's upper factor, computed in place on one copy of H (a Gram matrix's size is 0.25 GB
    at a 5,632-input projection), is bit for bit the out-of-place chain: damped H, its Cholesky
    factor, the inverse, its upper factor; in a column order, with an input that never fires
    and an indefinite H that needs the damping raised; the caller's H is untouched."""
    from coreai_opt.compression.algorithms._layerwise import inverse_cholesky

    def out_of_place(h: torch.Tensor) -> torch.Tensor:
        diagonal = torch.diagonal(h)
        diagonal[diagonal == 0] = 1.0
        undamped = diagonal.clone()
        for attempt in range(6):
            diagonal.copy_(undamped + (DAMPING * 10**attempt) * float(undamped.mean()))
            factor, info = torch.linalg.cholesky_ex(h)
            if int(info) == 0:
                upper, info = torch.linalg.cholesky_ex(torch.cholesky_inverse(factor), upper=True)
                if int(info) == 0:
                    return upper
        raise AssertionError("no damping made H positive definite")

    generator = torch.Generator().manual_seed(9)
    x = torch.randn(400, 150, generator=generator, dtype=torch.float64)
    x[:, 11] = 0.0
    gram = x.T @ x / 400
    order = torch.randperm(150, generator=generator)
    indefinite = torch.tensor([[1.0, 2.0], [2.0, 1.0]], dtype=torch.float64)  # eigenvalues -1 and 3
    for h, columns in ((gram, None), (gram, order), (indefinite, None)):
        given = h.clone()
        expected = out_of_place(h.clone() if columns is None else h[columns[:, None], columns[None, :]])
        assert torch.equal(inverse_cholesky(h, columns), expected)
        assert torch.equal(h, given)
    with pytest.raises(ValueError, match="singular"):
        inverse_cholesky(torch.tensor([[0.0, 0.0], [0.0, -1.0]], dtype=torch.float64))


def test_the_weighted_snr_summed_over_pieces_of_rows_is_the_whole_sum(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The importance-weighted SNR a palettized weight reports is widened and summed a piece of
    rows at a time (a 1B model's head in float64 is 0.5 GB a copy): the whole weight's float64
    sum to 1e-12, for fp16 values and a broadcast importance view, with pieces of 8 rows."""
    import coreai_opt.compression.algorithms._layerwise as layerwise
    from coreai_opt._pieces import spans

    generator = torch.Generator().manual_seed(10)
    w = torch.randn(50, 24, generator=generator).half()
    approximation = (w.float() + 0.05 * torch.randn(50, 24, generator=generator)).half()
    importance = torch.rand(1, 24, generator=generator, dtype=torch.float64).expand(50, 24)
    f, x = importance.double(), w.double()
    whole = 10 * math.log10(float((f * x**2).sum()) / float((f * (approximation.double() - x) ** 2).sum()))
    pieces: list[tuple[int, int]] = []
    monkeypatch.setattr(
        layerwise, "spans", lambda count, width: pieces.extend(spans(count, width, 8 * width)) or pieces
    )
    assert layerwise.weighted_snr_db(w, approximation, importance) == pytest.approx(whole, rel=1e-12)
    assert len(pieces) == 7  # 8 rows each, the last 2


def test_gptq_is_the_optimal_brain_quantizer_recurrence(layer: dict[str, torch.Tensor]) -> None:
    """The lazy, Cholesky form equals the textbook one: round a column, spread its error with the
    inverse Hessian's row, then eliminate that column from the inverse (act order, same damping)."""

    def to_quarter(column: torch.Tensor, _: int) -> torch.Tensor:
        return torch.round(column * 4).clamp(-6, 6) / 4

    held = solve(layer["w"].double(), layer["gram"], to_quarter)
    w = layer["w"].double().clone()
    h = _damped(layer["gram"], w)
    order = torch.sort(torch.diagonal(layer["gram"]), descending=True, stable=True).indices
    w, inverse = w[:, order], torch.linalg.inv(h[order][:, order])
    expected = torch.empty_like(w)
    for i in range(COLUMNS):
        column = w[:, i].float()
        expected[:, i] = column.double()
        error = (column.double() - to_quarter(column, 0).double()) / inverse[i, i]
        w[:, i + 1 :] -= error[:, None] * inverse[i, i + 1 :][None, :]
        inverse = inverse - inverse[:, i : i + 1] @ inverse[i : i + 1, :] / inverse[i, i]
    reference = torch.empty_like(expected)
    reference[:, order] = expected
    assert torch.equal(to_quarter(held, 0), to_quarter(reference.float(), 0))
    torch.testing.assert_close(held.double(), reference, rtol=0, atol=1e-5)
    assert torch.all(held[:, 9] == 0)  # the input that never fires: its column is zeroed


GRIDS = {
    "int4 per channel": QuantizeConfig(dtype="int4"),
    "int2 block 32": QuantizeConfig(dtype="int2", granularity="block", block_size=32),
    "uint4 asym block 32": QuantizeConfig(dtype="uint4", qscheme="asym", granularity="block", block_size=32),
    "mxfp4": QuantizeConfig(dtype="mxfp4"),
    "fp8 e4m3": QuantizeConfig(dtype="fp8e4m3"),
    "lut3 per channel": PalettizeConfig(n_bits=3, granularity="channel"),
    "lut4 grouped, int8 LUT, channel scales": PalettizeConfig(
        n_bits=4, granularity="grouped", group_size=16, lut_dtype="int8", enable_per_channel_scale=True
    ),
    "lut4 vectors of 2 grouped (GPTVQ)": PalettizeConfig(
        n_bits=4, cluster_dim=2, granularity="grouped", group_size=16
    ),
    "lut6 vectors of 4 per tensor, channel scales": PalettizeConfig(
        n_bits=6, cluster_dim=4, enable_per_channel_scale=True
    ),
}


@pytest.mark.parametrize("name", GRIDS)
def test_gptq_keeps_the_grid_and_lowers_the_layer_output_error(
    layer: dict[str, torch.Tensor], name: str
) -> None:
    import dataclasses

    config = dataclasses.replace(GRIDS[name], method="gptq")
    free_config = dataclasses.replace(GRIDS[name], method=algorithm_for(GRIDS[name]).method)
    site = _site()
    learned = algorithm_for(config).encode()(layer["w"], site, config, _statistics(layer))
    free = algorithm_for(free_config).encode()(layer["w"], site, free_config, None)
    assert learned.learned is not None and learned.learned.method == "gptq"
    after, before = _output_error(layer, decode(learned)), _output_error(layer, decode(free))
    assert after < 0.7 * before, (after, before)
    # the report's SNRs are the output errors measured here on the inputs themselves
    assert learned.learned.snr_db == pytest.approx(-10 * math.log10(after), abs=1e-6)
    assert learned.learned.data_free_snr_db == pytest.approx(-10 * math.log10(before), abs=1e-6)
    if isinstance(config, QuantizeConfig) and config.dtype.is_int and config.qscheme.value == "sym":
        # round to nearest's scales, each shrunk by one of _clipping's factors (or kept)
        chosen = learned.form.decode.scale.values.astype(np.float64)
        rtn = free.form.decode.scale.values
        options = np.stack([(rtn.astype(np.float64) * shrink).astype(rtn.dtype) for shrink in _SHRINKS])
        assert np.all((options == chosen[None]).any(axis=0)) and np.all(chosen <= rtn)
        assert np.any(chosen < rtn)
    elif isinstance(config, QuantizeConfig):  # the same scales as round to nearest: only codes moved
        assert np.array_equal(learned.form.decode.scale.values, free.form.decode.scale.values)
    else:  # the tables of importance-weighted k-means, snapped onto
        importance = algorithm_for(dataclasses.replace(config, method="importance")).encode()(
            layer["w"], site, dataclasses.replace(config, method="importance"), _statistics(layer)
        )
        assert np.array_equal(learned.form.lut.values, importance.form.lut.values)


@pytest.mark.parametrize("name", ["int4 per channel", "int2 block 32"])
def test_clipping_picks_each_tiles_least_weighted_error(layer: dict[str, torch.Tensor], name: str) -> None:
    """Brute force over the shrink factors, tile by tile, in plain loops: the chosen step is the
    first (largest) with the least importance-weighted squared error of round to nearest."""
    from coreai_opt.compression.algorithms._sensitive import input_importance
    from coreai_opt.compression.grids import grid_of, quantize_onto

    config, site, w = GRIDS[name], _site(), layer["w"]
    importance = input_importance(_statistics(layer), site)
    grid = grid_of(w, site, config)
    free = quantize_onto(w, site, config, grid)
    chosen = quantize_onto(w, site, config, weighted_grid(w, site, config, grid, free, importance))
    step = free.form.decode.scale.values.astype(np.float64)
    picked = chosen.form.decode.scale.values.astype(np.float64)
    largest = 2 ** (config.dtype.bits - 1) - 1
    width = COLUMNS // step.shape[1]
    x, weight = w.double().numpy(), importance.numpy()
    for row, tile in itertools.product(range(ROWS), range(step.shape[1])):
        cut = slice(tile * width, (tile + 1) * width)
        errors = []
        for shrink in _SHRINKS:
            s = float(np.float32(step[row, tile] * shrink))
            rounded = np.clip(np.round(x[row, cut] / s), -largest, largest) * s
            errors.append(float((weight[row, cut] * (x[row, cut] - rounded) ** 2).sum()))
        best = int(np.argmin(errors))  # the first of equal minima: the larger scale
        assert picked[row, tile] == float(np.float32(step[row, tile] * _SHRINKS[best])), (row, tile)
    # and the codes are round to nearest under the chosen steps
    steps = np.repeat(picked, width, axis=1)
    expected = np.clip(np.round(x / steps), -largest, largest) * steps
    assert np.array_equal(decode(chosen).numpy(), expected.astype(np.float32))  # as decode rounds


@pytest.mark.parametrize("name", ["int4 per channel", "int2 block 32"])
def test_gptq_onto_clipped_scales_beats_gptq_onto_the_maxima(
    layer: dict[str, torch.Tensor], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dataclasses

    from coreai_opt.compression.algorithms import _gptq

    config = dataclasses.replace(GRIDS[name], method="gptq")
    encode = algorithm_for(config).encode()
    clipped = _output_error(layer, decode(encode(layer["w"], _site(), config, _statistics(layer))))
    monkeypatch.setattr(_gptq, "weighted_grid", lambda w, site, config, grid, free, importance: grid)
    maxima = _output_error(layer, decode(encode(layer["w"], _site(), config, _statistics(layer))))
    assert clipped < 0.9 * maxima, (clipped, maxima)


def test_gptq_without_data_keeps_the_scales_of_least_squared_error(layer: dict[str, torch.Tensor]) -> None:
    """A weight no data reaches (an embedding lookup) is rounded to nearest, under the clipped
    scales of plain squared error: 2-bit codes under the maxima leave most of it at zero."""
    import dataclasses

    config, w = GRIDS["int2 block 32"], layer["w"]
    learned = algorithm_for(dataclasses.replace(config, method="gptq")).encode()(
        w, _site(), dataclasses.replace(config, method="gptq"), None
    )
    free = algorithm_for(config).encode()(w, _site(), config, None)
    error = {name: float(((decode(e).double() - w.double()) ** 2).sum()) for name, e in
             (("clipped", learned), ("maxima", free))}  # fmt: skip
    assert learned.learned is None
    assert error["clipped"] < 0.8 * error["maxima"], error


def test_a_linear_weight_reads_the_calibrations_own_gram_matrix_and_no_solve_writes_it(
    layer: dict[str, torch.Tensor],
) -> None:
    """A linear weight's columns are the Gram matrix's own order: the solves read the statistics'
    matrix itself (no 0.25 GB copy at a 5,632-input projection), so GPTQ (integer and LUT) and
    SparseGPT (unstructured and n:m) must leave it bit for bit as they found it."""
    statistics = _statistics(layer)
    assert statistics.gram is not None and statistics.gram.dtype == torch.float64
    given = statistics.gram.clone()
    assert gram_of(statistics, MatrixView.of(_site())) is statistics.gram
    for config in (QuantizeConfig(dtype="int4", method="gptq"), PalettizeConfig(n_bits=3, method="gptq"),
                   SparsifyConfig(method="sparsegpt"), SparsifyConfig(n_m_ratio=(2, 4), method="sparsegpt")):  # fmt: skip
        encoding = algorithm_for(config).encode()(layer["w"], _site(), config, statistics)
        assert isinstance(encoding, Encoding) and encoding.learned is not None
        assert torch.equal(statistics.gram, given), config.tag


def test_gptq_views_a_convolution_with_its_input_channels_innermost() -> None:
    """A conv weight [O, I, kh, kw] is the matrix [O, kh*kw*I]; the calibration's Gram matrix
    (over I, kh, kw as unfold orders it) is permuted to match, and the view inverts exactly."""
    w = torch.randn(6, 4, 3, 2)
    view = MatrixView.of(_site((6, 4, 3, 2)))
    matrix = view.matrix(w)
    assert matrix.shape == (6, 24)
    assert torch.equal(matrix[:, :4], w[:, :, 0, 0])
    assert torch.equal(view.weight(matrix), w)
    x = torch.randn(100, 24, dtype=torch.float64)  # rows as unfold gives them: I, kh, kw
    gram = gram_of(Statistics(100, gram=x.T @ x / 100), view)
    permuted = x[:, view.columns_in_gram_order()]
    torch.testing.assert_close(gram, permuted.T @ permuted / 100)
    transposed = MatrixView.of(_site((5, 7), output_axis=1, input_axis=0))  # [in, out] as addmm reads it
    t = torch.randn(5, 7)
    assert torch.equal(transposed.matrix(t), t.T) and torch.equal(transposed.weight(t.T), t)


def test_sparsegpt_with_a_fixed_mask_is_the_brain_surgeon_update(layer: dict[str, torch.Tensor]) -> None:
    generator = torch.Generator().manual_seed(3)
    pruned_mask = torch.rand(ROWS, COLUMNS, generator=generator) < 0.5
    repaired, pruned = prune(layer["w"].double(), layer["gram"], SparsifyConfig(), pruned_mask)
    assert torch.equal(pruned, pruned_mask)
    w = layer["w"].double().clone()
    inverse = torch.linalg.inv(_damped(layer["gram"], w))
    for i in range(COLUMNS):
        error = torch.where(pruned_mask[:, i], w[:, i], torch.zeros(ROWS, dtype=w.dtype)) / inverse[i, i]
        w[:, i:] -= error[:, None] * inverse[i, i:][None, :]
        inverse = inverse - inverse[:, i : i + 1] @ inverse[i : i + 1, :] / inverse[i, i]
    w[pruned_mask] = 0
    torch.testing.assert_close(repaired, w, rtol=0, atol=1e-9)


@pytest.mark.parametrize("config", [SparsifyConfig(target_sparsity=0.5), SparsifyConfig(n_m_ratio=(2, 4))],
                         ids=lambda c: c.tag)  # fmt: skip
def test_sparsegpt_updates_the_columns_ahead_in_pieces_of_rows_to_the_same_bits(
    config: SparsifyConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The update of the columns after each block is a product the size of the weight (0.5 GB at a
    1B model's output head): done a piece of rows at a time, as rows never mix in it, it gives the
    same weights and mask bit for bit; an fp16 matrix is widened exactly, as a float64 one."""
    import coreai_opt.compression.algorithms._sparsegpt as sparsegpt
    from coreai_opt._pieces import spans

    generator = torch.Generator().manual_seed(5)
    matrix = torch.randn(96, 300, generator=generator).half()
    x = torch.randn(900, 300, generator=generator, dtype=torch.float64)
    gram = x.T @ x / 900
    whole = prune(matrix.double(), gram, config)
    monkeypatch.setattr(sparsegpt, "spans", lambda count, width: spans(count, width, 32 * width))
    pieces = prune(matrix, gram, config)
    assert torch.equal(pieces[0], whole[0]) and torch.equal(pieces[1], whole[1])
    assert 0.45 < float(whole[1].float().mean()) < 0.55


@pytest.mark.parametrize(
    "config",
    [SparsifyConfig(n_m_ratio=(2, 4), method="sparsegpt"), SparsifyConfig(target_sparsity=0.5, block_size=4,
                                                                          method="sparsegpt"),
     SparsifyConfig(target_sparsity=0.3, method="sparsegpt")],
    ids=lambda c: c.tag,
)  # fmt: skip
def test_sparsegpt_prunes_rows_on_their_own_in_pieces_to_the_same_encoding(
    config: SparsifyConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unstructured, n:m and fixed block masks leave each row to itself: a weight is pruned a
    piece of rows at a time (never a float64 copy of a whole output head) and stores the whole
    matrix's values and mask, bit for bit; an input that never fires is zeroed in every piece."""
    import coreai_opt.compression.algorithms._sparsegpt as sparsegpt

    generator = torch.Generator().manual_seed(6)
    w = torch.randn(200, 96, generator=generator).half()
    x = torch.randn(800, 96, generator=generator, dtype=torch.float64)
    x[:, 7] = 0.0
    statistics = Statistics(800, moments=(x**2).mean(0), gram=x.T @ x / 800)
    site = WeightSite(None, "w", (200, 96), element("f16"), 0, 1)
    whole = sparsegpt.sparsify_sparsegpt(w, site, config, statistics)
    monkeypatch.setattr(sparsegpt, "_SOLVE_PIECE", 64 * 96)
    pieces = sparsegpt.sparsify_sparsegpt(w, site, config, statistics)
    assert isinstance(whole, Encoding) and isinstance(pieces, Encoding)
    assert torch.equal(decode(pieces), decode(whole)) and not decode(whole)[:, 7].any()
    assert np.array_equal(pieces.form.mask, whole.form.mask)  # type: ignore[union-attr]


def test_unstructured_sparsegpt_prunes_every_row_by_the_same_share() -> None:
    """Each row loses its share of the whole weight's zeros (the first rows one more where the
    count does not divide), placed block by block: 30% of 7 x 300 values is 630 zeros, 90 a row;
    of 7 x 301, 632 zeros: 91 in the first two rows, 90 in the rest."""
    generator = torch.Generator().manual_seed(8)
    for columns, expected in ((300, [90] * 7), (301, [91, 91, 90, 90, 90, 90, 90])):
        x = torch.randn(900, columns, generator=generator, dtype=torch.float64)
        matrix = torch.randn(7, columns, generator=generator) * torch.logspace(-2, 2, 7)[:, None]
        repaired, pruned = prune(matrix, x.T @ x / 900, SparsifyConfig(target_sparsity=0.3))
        assert pruned.sum(1).tolist() == expected  # the small rows are not pruned more than the large
        assert torch.all(repaired[pruned] == 0)


@pytest.mark.parametrize(
    "config",
    [
        SparsifyConfig(target_sparsity=0.6),
        SparsifyConfig(n_m_ratio=(2, 4)),
        SparsifyConfig(quantize_dtype="int8"),
        SparsifyConfig(quantize_dtype="uint8"),
        SparsifyConfig(palettize_nbits=4),
        SparsifyConfig(target_sparsity=0.5, block_size=4),
    ],
    ids=lambda c: c.tag,
)
def test_sparsegpt_keeps_the_pattern_and_beats_magnitude_pruning(
    layer: dict[str, torch.Tensor], config: SparsifyConfig
) -> None:
    import dataclasses

    site = _site()
    learned_config = dataclasses.replace(config, method="sparsegpt")
    learned = algorithm_for(learned_config).encode()(layer["w"], site, learned_config, _statistics(layer))
    free = algorithm_for(config).encode()(layer["w"], site, config, None)
    assert learned.form.mask.sum() == free.form.mask.sum()  # the same number kept
    if config.n_m_ratio is not None:
        assert np.all(learned.form.mask.reshape(ROWS, -1, 4).sum(-1) == 2)
    if config.block_size is not None:
        assert np.array_equal(learned.form.mask, free.form.mask)  # whole channel blocks: magnitude's choice
    dense = decode(learned)
    assert torch.all(dense[torch.from_numpy(~learned.form.mask)] == 0)
    after, before = _output_error(layer, dense), _output_error(layer, decode(free))
    assert after < (0.85 if config.block_size else 0.6) * before, (after, before)  # blocks: repair only
    assert learned.learned.snr_db == pytest.approx(-10 * math.log10(after), abs=1e-6)


@pytest.mark.parametrize("per_channel", [False, True])
def test_weighted_tables_read_a_broadcast_importance_a_piece_of_groups_at_a_time(
    per_channel: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Input importance is a broadcast view of one row (a float64 copy would be 0.5 GB at a 1B
    model's head): the tables are clustered reading it a piece of LUT groups at a time, and store
    the codes, tables and scales of the same importance made whole, in one piece."""
    import coreai_opt.compression.algorithms._kmeans as palettize
    from coreai_opt._pieces import spans

    generator = torch.Generator().manual_seed(12)
    w = torch.randn(64, 96, generator=generator).half()
    row = torch.rand(1, 96, generator=generator, dtype=torch.float64) + 0.01
    site = _site((64, 96))
    config = PalettizeConfig(
        n_bits=3, granularity="grouped", group_size=16, enable_per_channel_scale=per_channel
    )
    whole = palettize.weighted_palettize(w, site, config, row.expand(64, 96).contiguous())
    asked: list[tuple[int, int]] = []
    monkeypatch.setattr(
        palettize, "spans", lambda count, width: asked.extend(spans(count, width, width)) or asked
    )
    pieces = palettize.weighted_palettize(w, site, config, row.expand(64, 96))
    assert len(asked) == 4  # one LUT group a piece
    assert isinstance(whole, Encoding) and isinstance(pieces, Encoding)
    assert torch.equal(decode(pieces), decode(whole))
    assert np.array_equal(pieces.form.indices.values, whole.form.indices.values)  # type: ignore[union-attr]


def test_weighted_kmeans_is_the_optimum_over_every_partition() -> None:
    """Exact weighted k-means: no partition of the sorted values into k runs costs less (1-D optimal
    clusters are runs), checked by enumerating them all."""
    generator = torch.Generator().manual_seed(5)
    values = torch.randn(1, 11, generator=generator)
    weights = torch.rand(1, 11, generator=generator, dtype=torch.float64) * 10 + 0.01
    centroids, index = _weighted_clusters(values, lambda a, b: weights[a:b], False, PalettizeConfig(n_bits=2))
    chosen = torch.from_numpy(centroids[0])[index[0].long()]
    keyed = values[0].double()
    cost = float((weights[0] * (chosen - keyed) ** 2).sum())
    order = torch.argsort(keyed)
    x, f = keyed[order], weights[0][order]

    def run_cost(a: int, b: int) -> float:
        mean = float((f[a:b] * x[a:b]).sum() / f[a:b].sum())
        return float((f[a:b] * (x[a:b] - mean) ** 2).sum())

    best = min(
        run_cost(0, i) + run_cost(i, j) + run_cost(j, k) + run_cost(k, 11)
        for i, j, k in itertools.combinations(range(1, 11), 3)
    )
    assert cost == pytest.approx(best, rel=1e-9)


def test_an_estimates_trial_skips_the_measures_and_encodes_the_same(layer: dict[str, torch.Tensor]) -> None:
    """`compare=False` (an estimate's trial): the same encoding, bytes and decoded values, with
    neither SNR of the data measured (nobody reads them there)."""
    import dataclasses

    from coreai_opt.compression import BUILT_IN
    from coreai_opt.compression._driver import encode_weight

    generator = torch.Generator().manual_seed(3)
    fisher = torch.rand(ROWS, COLUMNS, generator=generator, dtype=torch.float64)
    statistics = dataclasses.replace(_statistics(layer), gradient_squares=fisher)
    configs = {
        "gptq": (QuantizeConfig(dtype="int4", method="gptq"), PalettizeConfig(n_bits=3, method="gptq")),
        "sensitive": (PalettizeConfig(n_bits=3, granularity="channel", method="sensitive"),),
        "importance": (PalettizeConfig(n_bits=2, granularity="grouped", group_size=8, method="importance"),),
        "sparsegpt": (SparsifyConfig(target_sparsity=0.5, method="sparsegpt"),),
    }
    assert {a.method for a in BUILT_IN if a.compares} == set(configs)  # every algorithm that compares
    for config in (c for group in configs.values() for c in group):
        full = encode_weight(layer["w"], _site(), config, statistics)
        trial = encode_weight(layer["w"], _site(), config, statistics, compare=False)
        assert full.learned.data_free_snr_db is not None and trial.learned.data_free_snr_db is None
        assert math.isfinite(full.learned.snr_db) and trial.learned.snr_db is None, config
        assert (
            full.learned.method == trial.learned.method and full.learned.weighting == trial.learned.weighting
        )
        assert torch.equal(decode(full), decode(trial)) and full.nbytes == trial.nbytes, config


def test_sensitive_palettization_spends_its_entries_where_the_fisher_information_is() -> None:
    generator = torch.Generator().manual_seed(1)
    w = torch.randn(32, 64, generator=generator)
    fisher = torch.full((32, 64), 1e-4, dtype=torch.float64)
    fisher[:, :3] = 100.0  # three input columns dominate the loss
    config = PalettizeConfig(n_bits=3, granularity="channel", method="sensitive")
    site = _site((32, 64))
    learned = algorithm_for(config).encode()(w, site, config, Statistics(8, gradient_squares=fisher))
    free = algorithm_for(PalettizeConfig(n_bits=3, granularity="channel")).encode()(
        w, site, PalettizeConfig(n_bits=3, granularity="channel"), None
    )
    important = (decode(learned) - w)[:, :3].abs().max()
    assert important < 1e-3 < 1e-2 < (decode(free) - w)[:, :3].abs().max()  # 3 of 8 entries: near exact
    record = learned.learned
    assert record.weighting == "fisher" and record.snr_db > record.data_free_snr_db + 10


def test_a_weight_without_statistics_takes_the_data_free_encoding(layer: dict[str, torch.Tensor]) -> None:
    """(Symmetric integers' GPTQ also clips its scales then: see the test of least squared error.)"""
    site = _site()
    for config in (QuantizeConfig(dtype="uint4", qscheme="asym", method="gptq"), SparsifyConfig(method="sparsegpt"),
                   PalettizeConfig(method="importance"), PalettizeConfig(method="sensitive")):  # fmt: skip
        encoding = algorithm_for(config).encode()(layer["w"], site, config, Statistics(0))
        assert encoding.learned is None
        import dataclasses

        free_config = dataclasses.replace(config, method={"QuantizeConfig": "rtn", "PalettizeConfig": "kmeans"}.get(
            type(config).__name__, "magnitude"))  # fmt: skip
        free = algorithm_for(free_config).encode()(layer["w"], site, free_config, None)
        assert torch.equal(decode(encoding), decode(free))


# ----- end to end: a tiny LLaMA calibrated on text ---------------------------------------------------


@pytest.fixture(scope="module")
def llama(tiny_llama: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {**tiny_llama, "root": tmp_path_factory.mktemp("learned")}


def test_gptq_from_the_cli_learns_layer_by_layer_and_says_what_the_data_did(
    llama, coreopt, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("COREOPT_CACHE", str(llama["root"] / "cache"))
    out = llama["root"] / "gptq.pt2"
    result = coreopt("quantize", str(llama["ref"]), "--dtype", "int2", "--granularity", "block", "--block-size", "16",
                     "--method", "gptq", "--calibration", str(llama["text"]), "--calibration-tokens", "128",
                     "--threshold", "0", "-o", str(out), "--json")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)["report"]
    learned = [w for w in report["weights"] if w["learned"]]
    assert len(learned) == 15  # 2 layers x 7 projections and lm_head (untied here)
    assert "lm_head.weight" in {w["name"] for w in learned}
    assert all(w["learned"]["snr_db"] > w["learned"]["data_free_snr_db"] for w in learned)
    assert report["data_free"] == ["model.embed_tokens.weight"]  # a lookup: no inputs to learn from
    from coreai_opt import load

    program = load(out)
    ids = torch.arange(16)[None] % 90
    assert torch.isfinite(program.module()(ids)[0]).all()


@pytest.mark.parametrize(
    "config",
    [
        QuantizeConfig(dtype="int4"),
        QuantizeConfig(dtype="uint4"),
        QuantizeConfig(dtype="uint4", qscheme="asym", granularity="block", block_size=16),
        QuantizeConfig(dtype="int4", qscheme="asym"),
        QuantizeConfig(dtype="int2", granularity="block", block_size=32),
        QuantizeConfig(dtype="int8", granularity="tensor"),
    ],
    ids=lambda c: f"{c.dtype.value}-{c.qscheme.value}-{c.granularity.value}",
)
def test_gptqs_integer_rounding_is_tcasts_given_scale_cast(config: QuantizeConfig) -> None:
    """The fast rounding GPTQ uses for integer codes gives tcast's values on every column, ties,
    clamps and zero points included (values from -3x to 3x the range, and exact half steps)."""
    from coreai_opt.compression.algorithms._gptq import integer_rounding
    from coreai_opt.compression.grids import column_datatype, element_grid, grid_of, quantize_onto

    generator = torch.Generator().manual_seed(11)
    site = _site((16, 64))
    w = torch.randn(16, 64, generator=generator)
    grid = grid_of(w, site, config)
    free = quantize_onto(w, site, config, grid)
    rounding = integer_rounding(free, MatrixView.of(site), config, torch.device("cpu"))
    spread = element_grid(grid, w, site, config)
    probe = torch.randn(16, 64, generator=generator) * 3 * w.abs().amax()
    steps = torch.from_numpy(np.asarray(free.form.decode.scale.values, np.float64)).float()
    first = steps.reshape(steps.shape[0], -1)[:, :1]  # each row's first tile's step (one for a tensor)
    probe[:, :8] = (torch.arange(-4, 4)[None].float() + 0.5) * first  # half steps
    datatype = column_datatype(site, config)
    for j in range(64):
        zero = None if spread.zero_points is None else spread.zero_points[:, j : j + 1].contiguous()
        expected = tcast.cast(probe[:, j : j + 1].contiguous(), datatype, castmode="virtual",
                              scales=spread.scales[:, j : j + 1].contiguous(), zero_points=zero)[:, 0]  # fmt: skip
        assert torch.equal(rounding(probe[:, j], j).float(), expected), j


@pytest.mark.parametrize(
    "config",
    [
        QuantizeConfig(dtype="mxfp4"),
        QuantizeConfig(dtype="fp8e4m3"),
        QuantizeConfig(dtype="fp8e5m2", granularity="block", block_size=16),
        QuantizeConfig(dtype="fp8e4m3", granularity="tensor"),
    ],
    ids=lambda c: f"{c.dtype.value}-{c.granularity.value}",
)
def test_gptqs_float_rounding_is_tcasts_given_scale_cast(config: QuantizeConfig) -> None:
    """The rounding GPTQ's torch loop uses for float elements gives tcast's values on every
    column, the sign of zero included: ties between neighbours in every binade and among
    subnormals (exact under MX's power-of-two scales), values beyond the largest (saturated),
    zeros of both signs, and random values over the whole range."""
    from coreai_opt.compression.algorithms._gptq import _float_rounding
    from coreai_opt.compression.grids import column_datatype, element_grid, grid_of

    generator = torch.Generator().manual_seed(5)
    rows, columns = 16, 96
    site = _site((rows, columns))
    w = torch.randn(rows, columns, generator=generator)
    grid = grid_of(w, site, config)
    spread = element_grid(grid, w, site, config)
    rounding = _float_rounding(spread, MatrixView.of(site), site, config, torch.device("cpu"))
    mbits, emin, largest = rounding.element
    scale = rounding.scale.double()
    exponents = torch.randint(emin - 1, math.frexp(largest)[1], (rows, columns), generator=generator)
    steps = torch.ldexp(
        torch.ones(rows, columns, dtype=torch.float64), torch.clamp_min(exponents, emin) - mbits
    )
    mantissas = torch.randint(0, 2 ** (mbits + 1), (rows, columns), generator=generator).double()
    probe = ((mantissas + 0.5) * steps * scale).float()  # halfway between two neighbours
    probe[:, 1::2] *= -1
    probe[:, :4] = torch.randn(rows, 4, generator=generator) * largest * 3 * scale[:, :4].float()
    probe[:, 4], probe[:, 5] = 0.0, -0.0
    probe[:, 6:10] = w[:, 6:10] * torch.rand(rows, 4, generator=generator) * 4
    datatype = column_datatype(site, config)
    ties = 0
    for j in range(columns):
        expected = tcast.cast(probe[:, j : j + 1].contiguous(), datatype, castmode="virtual",
                              scales=spread.scales[:, j : j + 1].contiguous())[:, 0]  # fmt: skip
        got = rounding(probe[:, j], j)
        assert got.dtype == torch.float32 and torch.equal(got, expected), (j, probe[:, j], got, expected)
        assert torch.equal(torch.signbit(got), torch.signbit(expected)), j
        ties += int(((probe[:, j].double() / scale[:, j]) * 2 / steps[:, j] % 2 == 1).sum())
    if bool((torch.frexp(scale).mantissa == 0.5).all()):  # power-of-two scales keep the ties exact
        assert ties > rows * columns // 2  # (float scales: near ties, rounded to float32 once scaled)


def test_an_aimodel_learns_from_the_pt2_it_was_converted_from(coreopt, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Statistics gathered on the .pt2 reach the converted .aimodel's weights by name: the same
    GPTQ encodings (their data-weighted errors equal) on both containers."""
    from tests.conftest import SAMPLES

    monkeypatch.setenv("COREOPT_CACHE", str(tmp_path / "cache"))
    common = ["--nbits", "4", "--granularity", "channel", "--method", "gptq", "--calibration", "random",
              "--calibration-samples", "4", "--json"]  # fmt: skip
    on_pt2 = coreopt("palettize", SAMPLES / "mlp.pt2", *common, "-o", tmp_path / "m.pt2")
    on_aimodel = coreopt("palettize", SAMPLES / "mlp.aimodel", *common, "--calibration-program",
                         SAMPLES / "mlp.pt2", "-o", tmp_path / "m.aimodel")  # fmt: skip
    assert on_pt2.exit_code == on_aimodel.exit_code == 0, on_aimodel.stderr
    learned = [
        {w["name"]: w["learned"] for w in json.loads(r.stdout)["report"]["weights"]}
        for r in (on_pt2, on_aimodel)
    ]
    assert learned[0] == learned[1] and all(v is not None for v in learned[0].values())
    refused = coreopt("palettize", SAMPLES / "mlp.aimodel", *common[:-1], "-o", tmp_path / "n.aimodel")
    assert refused.exit_code == 1 and "--calibration-program" in refused.stderr
    assert not (tmp_path / "n.aimodel").exists()
    no_gpu = coreopt(
        "palettize", SAMPLES / "mlp.pt2", *common[:-1], "--device", "cuda:7", "-o", tmp_path / "g.pt2"
    )
    if not torch.cuda.is_available():
        assert no_gpu.exit_code == 1 and "no CUDA device" in no_gpu.stderr
    assert coreopt("palettize", SAMPLES / "mlp.pt2", "--device", "cpu").exit_code == 2  # a data-free method


def test_exact_gradients_reach_the_fisher_pass_from_the_cli_and_recipes(
    coreopt, tmp_path: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """`--exact-gradients` (a recipe step's `exact_gradients`) turns the Fisher pass's bfloat16
    products off, and its statistics are cached apart; it serves methods that learn from data."""
    from coreai_opt.calibration import _device, _fisher
    from coreai_opt.recipes import Compress
    from tests.conftest import SAMPLES

    monkeypatch.setenv("COREOPT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(_device, "bfloat16_products", lambda device: True)  # as on a CPU that has them
    seen: list[bool] = []
    original = _fisher.SegmentedBackward.__init__

    def recording(self, gm, names, *, fast=False, progress=None):  # type: ignore[no-untyped-def]
        seen.append(fast)
        original(self, gm, names, fast=fast, progress=progress)

    monkeypatch.setattr(_fisher.SegmentedBackward, "__init__", recording)
    common = ["--nbits", "4", "--granularity", "channel", "--method", "sensitive", "--calibration", "random",
              "--calibration-samples", "2", "--json"]  # fmt: skip
    for flag in ([], ["--exact-gradients"], ["--exact-gradients"]):  # the last from the cache
        done = coreopt("palettize", SAMPLES / "mlp.pt2", *common, *flag, "-o", tmp_path / f"m{len(seen)}.pt2")
        assert done.exit_code == 0, done.stderr
    assert seen == [True, False]
    assert len(list((tmp_path / "cache").glob("*.fisher"))) == 2
    refused = coreopt("palettize", SAMPLES / "mlp.pt2", "--exact-gradients", "-o", tmp_path / "n.pt2")
    assert refused.exit_code == 2 and "--exact-gradients" in refused.stderr
    gptq = coreopt("quantize", SAMPLES / "mlp.pt2", "--dtype", "int4", "--method", "gptq", "--calibration", "random",
                   "--exact-gradients", "-o", tmp_path / "g.pt2")  # fmt: skip
    assert (
        gptq.exit_code == 2
        and "from gradients" in " ".join(gptq.stderr.split())
        and not (tmp_path / "g.pt2").exists()
    )
    from coreai_opt.calibration import CalibrationSpec
    from coreai_opt.recipes import Recipe

    recipe = Recipe(
        (Compress(config=PalettizeConfig(method="sensitive")),),
        CalibrationSpec(source="random", exact_gradients=True),
    )
    assert Recipe.from_dict(recipe.to_dict()) == recipe
    assert "exact_gradients" not in CalibrationSpec(source="random").to_dict()


def _column_grid(
    config: QuantizeConfig | PalettizeConfig,
    w: torch.Tensor,
    site: WeightSite,
    layer: dict[str, torch.Tensor],
):  # type: ignore[no-untyped-def]
    """The grid GPTQ rounds `w`'s columns onto under `config`, as the algorithm builds it."""
    from coreai_opt.compression.algorithms import _columns, _gptq
    from coreai_opt.compression.algorithms._kmeans import weighted_palettize
    from coreai_opt.compression.algorithms._sensitive import input_importance
    from coreai_opt.compression.grids import element_grid, grid_of, quantize_onto

    view, cpu = MatrixView.of(site), torch.device("cpu")
    if isinstance(config, PalettizeConfig):
        importance = input_importance(_statistics(layer), site)
        tables = _gptq._lut_rows(weighted_palettize(w, site, config, importance), site)
        return _columns.ColumnGrid("lut", table=tables.double())
    grid = grid_of(w, site, config)
    if config.dtype.is_int:
        return _gptq.integer_rounding(quantize_onto(w, site, config, grid), view, config, cpu)
    return _gptq._float_rounding(element_grid(grid, w, site, config), view, site, config, cpu)


@pytest.mark.parametrize("engine", ["triton", "numba"])
@pytest.mark.parametrize(
    "name",
    [
        "int4 per channel",
        "uint4 asym block 32",
        "mxfp4",
        "fp8 e4m3",
        "lut4 grouped, int8 LUT, channel scales",
    ],
)
def test_the_fused_block_kernel_holds_and_rounds_as_the_torch_loop(
    layer: dict[str, torch.Tensor], name: str, engine: str
) -> None:
    """GPTQ's one-kernel block (triton: on a GPU where there is one, else in Triton's interpreter;
    numba: the CPU's) gives the torch loop's float32 held values and float64 scaled errors, so the
    same rounded values, on every kind of grid: integers with constant and per-element bounds,
    float elements under power-of-two and float scales, look-up tables. The columns hold exact
    half steps, values beyond the grid (saturation) and zeros; the rows a partial tile, the block
    a partial one."""
    import importlib

    from coreai_opt.compression.algorithms._gptq import _solve_columns, inverse_cholesky

    module = {"triton": "_gptq_kernel", "numba": "_gptq_numba"}[engine]
    solve_block = importlib.import_module(f"coreai_opt.compression.algorithms.{module}").solve_block

    config, width = GRIDS[name], 32
    rows = ROWS if isinstance(config, PalettizeConfig) else 20  # groups of 16 rows; else a partial tile
    site = _site((rows, COLUMNS))
    w = layer["w"][:rows].clone()
    grid = _column_grid(config, w, site, layer)
    probe = w.double().clone()
    steps = (grid.scale if grid.scale is not None else torch.ones(rows, COLUMNS)).double()
    probe[:, 0:8] = (torch.arange(-4, 4).double() + 0.5) * steps[:, 0:8]  # exact half steps
    probe[:, 8:12] *= 40  # far beyond every grid
    probe[:3, 12:16] = 0.0
    probe[:3, 32] = -0.0  # a block's first column: rounded as read, its sign kept
    probe[5, 40] = torch.nan  # a NaN weight: its row NaN from there on, as the loop has it
    if grid.table is not None:  # halfway between a row's two first entries
        probe[:, 0] = (grid.table[:, 0] + grid.table[:, 1]) / 2
    gram = layer["gram"][:COLUMNS, :COLUMNS]
    order = torch.arange(COLUMNS)
    upper = inverse_cholesky(gram).contiguous()
    held = {kind: torch.zeros(rows, COLUMNS) for kind in ("loop", "kernel")}
    gpu = (
        torch.device("cuda") if torch.cuda.is_available() and engine == "triton" else None
    )  # the real kernel
    there = (lambda t: t.to(gpu)) if gpu else (lambda t: t)
    on_device = [there(t) for t in (probe, upper, order, held["kernel"])]
    for a, b in ((0, 32), (32, 56), (56, 64)):  # a full block, then two partial ones
        loop = _solve_columns(probe, a, b, upper, order.tolist(), grid, held["loop"])
        errors = there(torch.empty(rows, width, dtype=torch.float64))
        w, u, o, kept = on_device
        fused = solve_block(w, a, b, u, o, grid.contiguous()._each(there), kept, errors).cpu()
        assert _same_bits(fused, loop), (a, (fused - loop).abs().max())
        assert fused.nan_to_num().abs().amax() > 0
    held["kernel"] = on_device[3].cpu()
    assert _same_bits(held["kernel"], held["loop"]) and held["loop"][5].isnan().any()
    assert torch.signbit(held["kernel"][:3, 32]).all()


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit (the sign of zero included), NaN where the other is NaN."""
    nan = a.isnan()
    if not torch.equal(nan, b.isnan()):
        return False
    bits = torch.int64 if a.dtype == torch.float64 else torch.int32
    return torch.equal(a[~nan].view(bits), b[~nan].view(bits))


def test_gptq_with_the_fused_kernel_stores_the_same_codes(
    layer: dict[str, torch.Tensor], monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """End to end through the algorithm (more than one block of columns): the fused solve's
    codes and scales are the torch loop's, byte for byte. The solve runs where the statistics
    are: on a GPU (the real kernel) where there is one, else on the CPU under the interpreter."""
    import dataclasses

    from coreai_opt.compression.algorithms import _gptq

    monkeypatch.setattr(_gptq, "_BLOCK", 16)
    monkeypatch.setattr(_gptq, "_SOLVE_PIECE", 20 * COLUMNS)  # and in pieces of rows
    config = dataclasses.replace(GRIDS["uint4 asym block 32"], method="gptq")
    site, encode = _site(), algorithm_for(config).encode()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    plain = _statistics(layer)
    statistics = Statistics(plain.rows, moments=plain.moments.to(device), gram=plain.gram.to(device))  # type: ignore[union-attr]
    encodings = []
    for fused in (False, True):
        monkeypatch.setattr(_gptq, "_fused_by_default", lambda device, fused=fused: fused)
        encodings.append(encode(layer["w"], site, config, statistics))
    loop, kernel = (e.form for e in encodings)
    assert np.array_equal(kernel.data.values, loop.data.values)
    assert np.array_equal(kernel.decode.scale.values, loop.decode.scale.values)
    assert np.array_equal(kernel.decode.offset.values, loop.decode.offset.values)


@pytest.mark.parametrize("name", GRIDS)
def test_gptq_in_pieces_of_rows_stores_the_same_codes(
    layer: dict[str, torch.Tensor], name: str, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """Rows never mix in GPTQ: solved 20 rows at a time (as an output head is, in pieces of
    `_SOLVE_PIECE` elements) every grid's encoding decodes to the whole-matrix solve's, and
    measures the same."""
    import dataclasses

    from coreai_opt.compression.algorithms import _gptq

    config = dataclasses.replace(GRIDS[name], method="gptq")
    encode = algorithm_for(config).encode()
    whole = encode(layer["w"], _site(), config, _statistics(layer))
    monkeypatch.setattr(_gptq, "_SOLVE_PIECE", 20 * COLUMNS)
    pieces = encode(layer["w"], _site(), config, _statistics(layer))
    assert torch.equal(decode(whole), decode(pieces))
    assert whole.learned.snr_db == pieces.learned.snr_db


def test_statistics_taken_in_one_go_report_each_sample(tiny_llama, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The one-pass statistics (importance) and the Fisher pass (sensitive) report each sample, so
    a bar moves with an ETA before the first weight is done."""
    from coreai_opt.compression import PalettizeConfig
    from coreai_opt.recipes import compress_file

    monkeypatch.setenv("COREOPT_CACHE", str(tmp_path / "cache"))  # nothing from an earlier run
    for method, label in (("importance", "calibration samples"), ("sensitive", "gradients")):
        seen: list[tuple[int, int, str]] = []
        compress_file(tiny_llama["ref"], tmp_path / f"{method}.pt2",
                      PalettizeConfig(n_bits=4, method=method, weight_num_threshold=0),
                      calibration=tiny_llama["text"], calibration_tokens=128,
                      progress=lambda d, t, name, seen=seen: seen.append((d, t, name)))  # fmt: skip
        steps = [(d, t) for d, t, name in seen if name == label]
        assert steps and steps == [(k, steps[0][1]) for k in range(1, steps[0][1] + 1)], (method, seen[:5])
        assert any(name not in (label,) for _, _, name in seen)  # then the weights, one by one


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_cpu_block_kernel_takes_scales_in_a_16_bit_weights_dtype(dtype: torch.dtype) -> None:
    """A float grid's scales come in the weight's own dtype (FP8 under default scales of a bf16 or
    fp16 weight), as broadcast views: numba's block reads them as the torch loop does, to the bit."""
    from coreai_opt.compression.algorithms._columns import ColumnGrid
    from coreai_opt.compression.algorithms._gptq import _solve_columns, inverse_cholesky
    from coreai_opt.compression.algorithms._gptq_numba import solve_block

    rows, columns = 8, 24
    generator = torch.Generator().manual_seed(3)
    w = torch.randn(rows, columns, generator=generator, dtype=torch.float64)
    x = torch.randn(64, columns, generator=generator, dtype=torch.float64)
    upper = inverse_cholesky(x.T @ x / 64).contiguous()
    scale = (
        (w.abs().amax(1, keepdim=True) / 448).to(dtype).expand(rows, columns)
    )  # a view, as _float_rounding's
    grid = ColumnGrid("float", scale, element=(3, -6, 448.0))
    order = torch.arange(columns)
    held_loop, held_kernel = torch.zeros(rows, columns), torch.zeros(rows, columns)
    loop = _solve_columns(w, 0, columns, upper, order.tolist(), grid, held_loop)
    kernel = solve_block(
        w, 0, columns, upper, order, grid, held_kernel, torch.empty(rows, 32, dtype=torch.float64)
    )
    assert _same_bits(kernel, loop) and _same_bits(held_kernel, held_loop)
    assert loop.abs().amax() > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_mean_squared_gradient_is_summed_in_pieces_to_the_exact_mean(monkeypatch, dtype) -> None:  # type: ignore[no-untyped-def]
    """`Statistics.gradient_mean` sums a piece of the squares at a time in float64 (no float64 copy
    of the whole weight): the exact mean to float64's rounding, whatever the piece; one piece
    gives torch's own float64 sum; a sample's `squares_mean` is taken as given."""
    from coreai_opt import _pieces

    squares = (torch.rand(300, 77, generator=torch.Generator().manual_seed(3)) * 1e-3).to(dtype)
    exact = math.fsum(squares.double().reshape(-1).tolist()) / squares.numel()
    whole = float(squares.sum(dtype=torch.float64)) / squares.numel()
    for piece in (1000, 4096, 1 << 22):
        monkeypatch.setattr(_pieces, "PIECE", piece)
        mean = Statistics(8, gradient_squares=squares).gradient_mean()
        assert mean == pytest.approx(exact, rel=1e-13)
        if piece >= squares.numel():
            assert mean == whole
    assert Statistics(8, gradient_squares=squares[:10], squares_mean=0.25).gradient_mean() == 0.25
    assert Statistics(8).gradient_mean() == 0.0


def test_configs_that_cluster_alike_share_one_k_means_with_the_same_bytes(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Within `clusters_shared`, lut6 and lut6-q8 of one weight and importance run one k-means and
    encode the same bytes as each alone; other values under the same config, or a config that
    clusters otherwise, cluster anew; an entry is taken once per config left to take it."""
    import coreai_opt.compression.algorithms._kmeans as palettize
    from coreai_opt.compression import clusters_shared

    generator = torch.Generator().manual_seed(5)
    w = torch.randn(64, 96, generator=generator)
    other = w.clone()
    other[3, 7] += 0.5
    importance = torch.rand(64, 96, generator=generator) + 0.01
    site = _site((64, 96))
    floats, codes, lut4 = (
        PalettizeConfig(n_bits=n, granularity="grouped", group_size=16, lut_dtype=dtype)
        for n, dtype in ((6, None), (6, "int8"), (4, None))
    )
    pairs = ((w, floats), (other, floats), (w, codes), (other, codes), (w, codes), (w, lut4))
    alone = [palettize.weighted_palettize(x, site, c, importance, 0.1) for x, c in pairs]
    runs: list[int] = []
    clusters = palettize._clusters
    monkeypatch.setattr(palettize, "_clusters", lambda *a: runs.append(1) or clusters(*a))
    with clusters_shared([floats, codes, lut4]):
        shared = [palettize.weighted_palettize(x, site, c, importance, 0.1) for x, c in pairs]
    assert len(runs) == 4  # w and other under lut6 once each, w under lut6-q8 a second time, lut4
    for got, want in zip(shared, alone, strict=True):
        assert isinstance(got, Encoding) and isinstance(want, Encoding)
        assert np.array_equal(got.form.indices.values, want.form.indices.values)  # type: ignore[union-attr]
        assert np.array_equal(got.form.lut.values, want.form.lut.values)  # type: ignore[union-attr]
        assert torch.equal(decode(got), decode(want))
    assert not torch.equal(decode(shared[0]), decode(shared[1]))
    assert not np.array_equal(shared[0].form.lut.values, shared[2].form.lut.values)  # type: ignore[union-attr]


def test_clusters_are_shared_only_by_configs_that_read_a_weight_alike(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A broadcast importance (one row expanded, as `input_importance` gives) is shared without
    being made whole; configs that differ in threads share; a uint8-entry table, whose estimate
    samples no rows (`row_unit`), shares with no other and is kept by none."""
    import coreai_opt.compression.algorithms._kmeans as palettize
    from coreai_opt.compression import clusters_shared
    from coreai_opt.compression.algorithms import _shared_clusters

    generator = torch.Generator().manual_seed(6)
    w = torch.randn(64, 96, generator=generator)
    row = (torch.rand(1, 96, generator=generator, dtype=torch.float64) + 0.01).expand(64, 96)
    site = _site((64, 96))
    base = {"n_bits": 4, "granularity": "grouped", "group_size": 16}
    floats, codes = PalettizeConfig(**base), PalettizeConfig(**base, lut_dtype="int8", num_kmeans_workers=1)
    unsigned = PalettizeConfig(**base, lut_dtype="uint8")
    runs: list[int] = []
    clusters = palettize._clusters
    monkeypatch.setattr(palettize, "_clusters", lambda *a: runs.append(1) or clusters(*a))
    with clusters_shared([floats, codes, unsigned]):
        first = palettize.weighted_palettize(w, site, floats, row)
        second = palettize.weighted_palettize(w, site, codes, row)
        palettize.weighted_palettize(w, site, unsigned, row)
        assert not _shared_clusters._MEMO.get().held  # type: ignore[union-attr]
    assert len(runs) == 2  # floats and codes once, unsigned on its own
    assert torch.equal(decode(first), decode(palettize.weighted_palettize(w, site, floats, row)))
    assert torch.equal(decode(second), decode(palettize.weighted_palettize(w, site, codes, row)))
    assert _shared_clusters._digest(row)[2] == (0,)  # the broadcast axis named, its one row hashed
