"""sparsify_weights on real Core AI programs: which weights are kept, and the runtime's decoding of
the bitmask forms against an independent numpy decoding."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from _decode import assert_runtime_matches_decoding, decode_value
from _hostile import tree_digest
from conftest import SAMPLES, copy_sample, run_aimodel

from coreai_opt import _coreai
from coreai_opt._coreai._rewrite import CoreAIWeights
from coreai_opt._elements import element
from coreai_opt.compression import SkipKind, WeightSite
from coreai_opt.compression._sites import select_sites
from coreai_opt.compression.algorithms._magnitude import sparsity_mask
from coreai_opt.coreai_utils import DType, SparsifyConfig, compress_, sparsify_weights
from coreai_opt.inspection import inspect_model
from coreai_opt.io import load_aimodel, save_aimodel

THRESHOLD = 256


def _weights(program: object) -> tuple[CoreAIWeights, list[WeightSite]]:
    """The program's weight container and its eligible weights."""
    container = CoreAIWeights(program)
    chosen, _ = select_sites(container.candidates(), THRESHOLD, lambda name: None)
    return container, [site for site, _ in chosen]


PLANS = {
    "magnitude50": SparsifyConfig(target_sparsity=0.5),
    "magnitude75-block4": SparsifyConfig(target_sparsity=0.75, block_size=4),
    "2of4": SparsifyConfig(target_sparsity=None, n_m_ratio=(2, 4)),
    "1of4-int8": SparsifyConfig(target_sparsity=None, n_m_ratio=(1, 4), quantize_dtype=DType.INT8),
    "magnitude50-uint8": SparsifyConfig(target_sparsity=0.5, quantize_dtype=DType.UINT8),
    "block2-uint8": SparsifyConfig(target_sparsity=0.5, block_size=2, quantize_dtype=DType.UINT8),
    "magnitude30-fp8e4m3": SparsifyConfig(target_sparsity=0.3, quantize_dtype=DType.FP8_E4M3FN),
    "2of4-fp8e5m2": SparsifyConfig(target_sparsity=None, n_m_ratio=(2, 4), quantize_dtype=DType.FP8_E5M2),
    "magnitude60-lut4": SparsifyConfig(target_sparsity=0.6, palettize_nbits=4),
    "3of8-lut3": SparsifyConfig(target_sparsity=None, n_m_ratio=(3, 8), palettize_nbits=3),
    "block4-lut2": SparsifyConfig(target_sparsity=0.5, block_size=4, palettize_nbits=2),
}


def _dense_weights(program) -> list[np.ndarray]:  # type: ignore[no-untyped-def]
    """Every decompressed weight of a program, decoded with numpy, in program order."""
    module = _coreai.mlir_module(program)
    return [
        decode_value(op.result)
        for op in _coreai.walk_ops(module)
        if op.name in ("coreai.sparse_with_bitmask_to_dense", "coreai.blockwise_shift_scale")
        and all(u.owner.name not in _coreai.DECOMPRESSION_OPS for u in op.result.uses)
    ]


@pytest.mark.parametrize("sample", ["mlp", "cnn", "transformer"])
@pytest.mark.parametrize("plan_id", sorted(PLANS))
def test_runtime_equals_numpy_decoding(plan_id: str, sample: str, tmp_path: Path) -> None:
    plan = PLANS[plan_id]
    program = load_aimodel(SAMPLES / f"{sample}.aimodel")
    report = compress_(program, replace(plan, weight_num_threshold=THRESHOLD))
    assert report.weights
    path = save_aimodel(program, tmp_path / "s.aimodel")
    inspected = inspect_model(path)
    sparse = sorted((w.shape, w.encoding, w.nbytes) for w in inspected.weights if "sparse" in w.encoding)
    assert sparse == sorted((w.shape, w.encoding, w.bytes_after) for w in report.weights)
    for w in report.weights:
        count = math.prod(w.shape)
        mask_bytes = math.ceil(count / 8)
        kept = round(count * (1 - w.sparsity))
        assert w.encoding.startswith(f"sparse bitmask {kept / count:.0%} kept")
        value_bits = (
            {None: 32}.get(plan.quantize_dtype, 8) if plan.palettize_nbits is None else plan.palettize_nbits
        )
        assert w.bytes_after >= mask_bytes + math.ceil(kept * value_bits / 8)
        if plan.quantize_dtype is None and plan.palettize_nbits is None:
            assert w.bytes_after == mask_bytes + kept * 4
        if plan.n_m_ratio is not None:
            n, m = plan.n_m_ratio
            assert w.sparsity == pytest.approx(1 - n / m)
        else:
            assert abs(w.sparsity - plan.target_sparsity) <= 32 * (plan.block_size or 1) / count + 1e-9
    # the runtime decompresses exactly what the numpy decoding of the stored bytes gives
    assert_runtime_matches_decoding(path, len(report.weights), tmp_path)


@pytest.mark.parametrize("sample", ["mlp", "transformer"])
def test_magnitude_keeps_the_largest_and_plain_values_exactly(sample: str) -> None:
    program = load_aimodel(SAMPLES / f"{sample}.aimodel")
    container, sites = _weights(program)
    originals = [container.read(site).double().numpy() for site in sites]
    compress_(program, SparsifyConfig(target_sparsity=0.5, weight_num_threshold=THRESHOLD))
    decoded = _dense_weights(program)
    assert len(decoded) == len(originals)
    for dense, original in zip(decoded, originals, strict=True):
        kept = dense != 0
        assert kept.sum() == original.size - round(original.size * 0.5)
        np.testing.assert_array_equal(dense[kept], original[kept])  # values stored bit-exactly
        assert np.abs(original[~kept]).max() <= np.abs(original[kept]).min()


def test_n_m_keeps_n_of_every_m_along_the_input_axis() -> None:
    program = load_aimodel(SAMPLES / "transformer.aimodel")
    container, sites = _weights(program)
    w = container.read(sites[0])
    for n, m in ((2, 4), (1, 4), (3, 8)):
        mask = sparsity_mask(w, sites[0], SparsifyConfig(target_sparsity=None, n_m_ratio=(n, m)))
        assert isinstance(mask, torch.Tensor)
        runs = mask.movedim(sites[0].input_axis, -1).reshape(-1, m)
        assert (runs.sum(1) == n).all()
        magnitude = w.abs().movedim(sites[0].input_axis, -1).reshape(-1, m).double()
        smallest_kept = torch.where(runs, magnitude, torch.inf).amin(1)
        largest_pruned = torch.where(runs, -torch.inf, magnitude).amax(1)
        assert (largest_pruned <= smallest_kept).all()


def test_block_sparsity_prunes_whole_blocks_by_l2_norm() -> None:
    program = load_aimodel(SAMPLES / "mlp.aimodel")
    container, (site, *_) = _weights(program)
    w = container.read(site)
    mask = sparsity_mask(w, site, SparsifyConfig(target_sparsity=0.5, block_size=4))
    assert isinstance(mask, torch.Tensor)
    moved = mask.movedim(site.output_axis, 0)
    blocks = moved.reshape(moved.shape[0] // 4, 4, -1)
    assert ((blocks.sum(1) == 0) | (blocks.sum(1) == 4)).all()  # whole blocks only
    norms = w.double().movedim(site.output_axis, 0).reshape(blocks.shape).square().sum(1)
    kept = blocks[:, 0, :]
    assert int(kept.sum()) == kept.numel() // 2
    assert norms[~kept].max() <= norms[kept].min()


def test_ties_are_deterministic_and_go_to_the_lower_index() -> None:
    site = WeightSite(None, "w", (2, 8), element("f32"), 0, 1)
    w = torch.ones(2, 8)
    mask = sparsity_mask(w, site, SparsifyConfig(target_sparsity=None, n_m_ratio=(2, 4)))
    assert mask.tolist() == [[True, True, False, False] * 2] * 2
    mask = sparsity_mask(w, site, SparsifyConfig(target_sparsity=0.75))
    assert mask.reshape(-1).nonzero().reshape(-1).tolist() == [0, 1, 2, 3]


def test_selection_equals_the_first_of_a_stable_descending_sort() -> None:
    """The linear-time selection keeps exactly what the first `keep` of a stable descending sort
    keep: ties to the lower index, infinities and NaNs (sorted first) included."""
    from coreai_opt.compression.algorithms._magnitude import _top

    g = torch.Generator().manual_seed(0)
    for trial in range(200):
        n = int(torch.randint(1, 120, (1,), generator=g))
        x = torch.randn(n, generator=g).abs() if trial % 2 else torch.randint(0, 5, (n,), generator=g).float()
        if trial % 7 == 0:
            x[torch.randint(0, n, (2,), generator=g)] = float("inf")
        if trial % 11 == 0:
            x[torch.randint(0, n, (1,), generator=g)] = float("nan")
        order = torch.sort(x, descending=True, stable=True).indices
        for keep in sorted({1, n // 2 or 1, max(1, n - 1), n}):
            expected = torch.zeros(n, dtype=torch.bool)
            expected[order[:keep]] = True
            assert torch.equal(_top(x, keep), expected), (trial, keep)


def test_histogram_selection_equals_kthvalue() -> None:
    """The k-th value found through a histogram of the top bits is torch.kthvalue's, for ties,
    zeros, infinities, sorted input and the extreme ranks."""
    g = torch.Generator().manual_seed(1)
    for n in (1, 70001, (1 << 20) + 12345):
        _each_case_equals_kthvalue(n, g)


def _each_case_equals_kthvalue(n: int, g: torch.Generator) -> None:
    from coreai_opt.compression.algorithms._magnitude import _kth_smallest

    cases = [
        torch.randn(n, generator=g).abs(),
        torch.randint(0, 7, (n,), generator=g).float(),
        torch.cat([torch.zeros(n // 2), torch.rand(n - n // 2, generator=g)]),
        torch.randn(n, generator=g).abs().sort().values,
        torch.cat([torch.full((n // 2,), math.inf), torch.rand(n - n // 2, generator=g)]),
    ]
    for x in cases + [case.double() for case in cases]:
        for k in sorted({1, min(2, n), n // 3 or 1, n // 2 or 1, max(1, n - 5), n}):
            assert torch.equal(_kth_smallest(x, k), torch.kthvalue(x, k).values)


def test_fp16_weights_near_7_and_300_never_nan(tmp_path: Path) -> None:
    from test_palettize import _fp16_probe

    path, weight = _fp16_probe(tmp_path)
    eye = {inspect_model(path).inputs[0].name: np.eye(64, dtype=np.float16)}  # output: the weight, transposed
    for plan in (
        SparsifyConfig(target_sparsity=0.5),
        SparsifyConfig(target_sparsity=0.5, palettize_nbits=4),
        SparsifyConfig(target_sparsity=None, n_m_ratio=(2, 4), quantize_dtype=DType.FP8_E4M3FN),
        SparsifyConfig(target_sparsity=0.5, quantize_dtype=DType.INT8),
        SparsifyConfig(target_sparsity=0.5, quantize_dtype=DType.UINT8),
    ):
        program = sparsify_weights(load_aimodel(path), weight_num_threshold=0, **_kwargs(plan))
        out = save_aimodel(program, tmp_path / "o.aimodel", force=True)
        got = next(iter(run_aimodel(out, eye).values())).astype(np.float64).T
        assert np.isfinite(got).all(), plan
        big = np.abs(weight) > 100  # the largest weights are always kept, close to their value
        np.testing.assert_allclose(got[big], weight[big], rtol=0.07)


def _kwargs(plan: SparsifyConfig) -> dict:
    return {
        "target_sparsity": plan.target_sparsity if plan.n_m_ratio is None else None,
        "block_size": plan.block_size,
        "n_m_ratio": plan.n_m_ratio,
        "quantize_dtype": plan.quantize_dtype,
        "palettize_nbits": plan.palettize_nbits,
    }


def test_seed_api_copies_unless_in_place() -> None:
    program = load_aimodel(SAMPLES / "mlp.aimodel")
    before = _coreai.op_histogram(_coreai.mlir_module(program))
    out = sparsify_weights(program, n_m_ratio=(2, 4))  # target_sparsity defaults to 0.5 only without n:m
    assert _coreai.op_histogram(_coreai.mlir_module(program)) == before
    assert _coreai.op_histogram(_coreai.mlir_module(out))["coreai.build_sparse_with_bitmask"] > 0
    assert sparsify_weights(program, in_place=True) is program


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"target_sparsity": 0.5, "n_m_ratio": (2, 4)}, "exactly one of target_sparsity and n_m_ratio"),
        ({"target_sparsity": 1.0}, "strictly between 0 and 1"),
        ({"target_sparsity": 0.0}, "strictly between 0 and 1"),
        ({"n_m_ratio": (4, 4)}, "0 < n < m"),
        ({"n_m_ratio": (2, 4), "block_size": 4}, "block_size applies to magnitude"),
        ({"block_size": 1}, "block_size must be 2 or more"),
        ({"quantize_dtype": DType.INT4}, "quantize_dtype is INT8, UINT8"),
        ({"palettize_nbits": 5}, "palettize_nbits must be one of"),
        ({"quantize_dtype": DType.INT8, "palettize_nbits": 4}, "at most one of"),
    ],
)
def test_invalid_options_raise(kwargs: dict, message: str) -> None:
    program = load_aimodel(SAMPLES / "mlp.aimodel")
    with pytest.raises(ValueError, match=message):
        sparsify_weights(program, **kwargs)


def test_layouts_that_do_not_fit_are_skipped_with_a_reason() -> None:
    program = load_aimodel(SAMPLES / "transformer.aimodel")
    report = compress_(
        program, SparsifyConfig(target_sparsity=None, n_m_ratio=(3, 7), weight_num_threshold=THRESHOLD)
    )
    layout = [s for s in report.skipped if s.kind is SkipKind.LAYOUT]
    assert layout and all("not a multiple of m=7" in s.reason for s in layout)


def test_cli_sparsify_json_and_errors(coreopt, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    model = copy_sample("transformer", "aimodel", tmp_path)
    digest = tree_digest(model)
    result = coreopt("sparsify", model, "--nm", "2:4", "--quantize", "int8", "--json")
    assert result.exit_code == 0, result.stdout + result.stderr
    doc = json.loads(result.stdout)
    assert doc["method"] == "sparsify" and doc["output"].endswith("transformer.sparse2of4-int8.aimodel")
    assert all(w["sparsity"] == 0.5 for w in doc["report"]["weights"])
    assert doc["report"]["bits_per_weight"] < 6
    assert tree_digest(model) == digest  # the input is never modified
    compare = coreopt("compare", model, doc["output"], "--json")
    assert compare.exit_code == 0 and json.loads(compare.stdout)["outputs"]

    table = coreopt("sparsify", model, "--sparsity", "0.6", "--block-size", "4", "-o", tmp_path / "b.aimodel")
    assert table.exit_code == 0 and "zeros" in table.stdout and "60.0%" in table.stdout

    both = coreopt("sparsify", model, "--sparsity", "0.5", "--nm", "2:4")
    assert both.exit_code == 2
    bad_nm = coreopt("sparsify", model, "--nm", "2-4")
    assert bad_nm.exit_code == 2
    bad_value = coreopt("sparsify", model, "--sparsity", "1.5", "-o", tmp_path / "x.aimodel")
    assert bad_value.exit_code == 2 and "strictly between 0 and 1" in bad_value.stderr
    assert not (tmp_path / "x.aimodel").exists()
    missing = coreopt("sparsify", tmp_path / "nope.aimodel")
    assert missing.exit_code == 1 and "nope.aimodel" in missing.stderr


def test_n_m_ties_go_to_the_lower_index_in_one_rule() -> None:
    """One n:m tie rule: tcast's mask, which the sparsify pass uses piece by piece."""
    import tcast

    equal = torch.tensor([[1.0, -1.0, 1.0, -1.0, 3.0, 2.0, 2.0, 2.0]])
    assert tcast.sparse_mask(equal, 4, 2).tolist() == [[True, True, False, False, True, True, False, False]]
    assert torch.equal(tcast.sparse(equal, 4, 2), torch.tensor([[1.0, -1.0, 0, 0, 3.0, 2.0, 0, 0]]))
