"""quantize_weights on real Core AI programs: runtime output against plain numpy references.

The probe is a bias-free linear layer fed the identity matrix, so the runtime's output is the
dequantized weight itself (transposed): every entry is checked against an independent reference.
"""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch
from conftest import SAMPLES, run_aimodel

from coreai_opt.conversion import convert_exported_program
from coreai_opt.coreai_utils import (
    CompressionGranularity,
    DType,
    QScheme,
    QuantizeConfig,
    compress_,
    quantize_weights,
)
from coreai_opt.inspection import inspect_model
from coreai_opt.io import load_aimodel, save_aimodel

IN, OUT = 64, 48
G = CompressionGranularity


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    """The probe layer's asset, built once a module (every test only reads it), and its weight."""
    return _probe(tmp_path_factory.mktemp("probe"))


def _probe(tmp_path: Path) -> tuple[Path, np.ndarray]:
    import coreai_torch

    torch.manual_seed(0)
    layer = torch.nn.Linear(IN, OUT, bias=False).eval()
    with torch.no_grad():
        layer.weight[3] *= 40  # one loud channel: per-channel scales must matter
        program = torch.export.export(layer, (torch.eye(IN),)).run_decompositions(
            coreai_torch.get_decomp_table()
        )
    path = save_aimodel(convert_exported_program(program), tmp_path / "probe.aimodel")
    return path, layer.weight.detach().numpy().astype(np.float32)


def _int_reference(w: np.ndarray, bits: int, signed: bool, scheme: QScheme, block: int | None) -> np.ndarray:
    rows = w.reshape(OUT, -1, block) if block else w.reshape(OUT, 1, IN)
    out = np.empty_like(rows, dtype=np.float64)
    for i in range(rows.shape[0]):
        for j in range(rows.shape[1]):
            v = rows[i, j].astype(np.float64)
            if scheme is QScheme.SYMMETRIC:
                qmax = 2 ** (bits - 1) - 1
                scale = float(np.float32(np.abs(v).max() / qmax))
                out[i, j] = np.clip(np.rint(v / scale), -qmax, qmax) * scale
            else:
                levels = 2**bits - 1
                lo, hi = min(v.min(), 0.0), max(v.max(), 0.0)
                scale = float(np.float32((hi - lo) / levels))
                zero = np.clip(np.rint(-lo / scale), 0, levels)
                out[i, j] = (np.clip(np.rint(v / scale) + zero, 0, levels) - zero) * scale
    return out.reshape(w.shape).astype(np.float32)


def _fp_reference(w: np.ndarray, dtype: DType, block: int | None, e8m0: bool) -> np.ndarray:
    np_type, fmax, emax = {
        DType.FP8_E4M3FN: (ml_dtypes.float8_e4m3fn, 448.0, 8),
        DType.FP8_E5M2: (ml_dtypes.float8_e5m2, 57344.0, 15),
        DType.FP4_E2M1FN: (ml_dtypes.float4_e2m1fn, 6.0, 2),
    }[dtype]
    rows = w.reshape(OUT, -1, block) if block else w.reshape(OUT, 1, IN)
    out = np.empty_like(rows, dtype=np.float64)
    for i in range(rows.shape[0]):
        for j in range(rows.shape[1]):
            v = rows[i, j].astype(np.float64)
            amax = np.abs(v).max()
            if e8m0:
                scale = 2.0 ** (np.floor(np.log2(amax)) - emax)
            else:  # float32, rounded up
                scale = np.float32(amax / fmax)
                scale = float(np.nextafter(scale, np.float32(np.inf)) if scale < amax / fmax else scale)
            x = np.clip(v / scale, -fmax, fmax).astype(np.float32)
            out[i, j] = x.astype(np_type).astype(np.float64) * scale
    return out.reshape(w.shape).astype(np.float32)


CASES = [
    (DType.INT8, QScheme.SYMMETRIC, G.PER_CHANNEL, None),
    (DType.UINT8, QScheme.ASYMMETRIC, G.PER_CHANNEL, None),
    (DType.INT4, QScheme.SYMMETRIC, G.PER_BLOCK, None),
    (DType.UINT4, QScheme.ASYMMETRIC, G.PER_BLOCK, None),
    (DType.INT4, QScheme.ASYMMETRIC, G.PER_CHANNEL, None),
    (DType.UINT2, QScheme.SYMMETRIC, G.PER_CHANNEL, None),
    (DType.INT2, QScheme.ASYMMETRIC, G.PER_BLOCK, None),
    (DType.FP8_E4M3FN, QScheme.SYMMETRIC, G.PER_CHANNEL, None),
    (DType.FP8_E5M2, QScheme.SYMMETRIC, G.PER_BLOCK, None),
    (DType.FP8_E4M3FN, QScheme.SYMMETRIC, G.PER_BLOCK, DType.FP8_E8M0FNU),
    (DType.FP4_E2M1FN, QScheme.SYMMETRIC, G.PER_BLOCK, None),
]


@pytest.mark.parametrize(
    ("dtype", "scheme", "granularity", "scale_dtype"), CASES, ids=lambda v: getattr(v, "value", v)
)
def test_runtime_output_is_the_reference_dequantized_weight(
    dtype: DType,
    scheme: QScheme,
    granularity: CompressionGranularity,
    scale_dtype: DType | None,
    tmp_path: Path,
    probe: tuple[Path, np.ndarray],
) -> None:
    path, w = probe
    program = load_aimodel(path)
    report = compress_(
        program,
        QuantizeConfig(
            dtype=dtype, qscheme=scheme, granularity=granularity, block_size=32, scale_dtype=scale_dtype
        ),
    )
    assert len(report.weights) == 1 and report.skipped == []
    out = save_aimodel(program, tmp_path / "q.aimodel")
    name = inspect_model(out).inputs[0].name
    got = next(iter(run_aimodel(out, {name: np.eye(IN, dtype=np.float32)}).values()))
    block = 32 if granularity is G.PER_BLOCK else None
    if dtype.is_int:
        expected = _int_reference(w, dtype.bits, dtype.signed, scheme, block)
    else:
        expected = _fp_reference(w, dtype, block, scale_dtype is not None or dtype is DType.FP4_E2M1FN)
    # the runtime may evaluate scale * (data - offset) in another order: allow float32 rounding, no more
    np.testing.assert_allclose(got, expected.T, rtol=1e-5, atol=1e-7)
    inspected = inspect_model(out)
    (weight,) = [x for x in inspected.weights if x.kind == "weight"] or inspected.weights
    assert weight.bits_per_weight < 16
    assert report.weights[0].bytes_after < report.weights[0].bytes_before


def test_int8_per_channel_on_the_transformer_keeps_cosine(tmp_path: Path) -> None:
    original = load_aimodel(SAMPLES / "transformer.aimodel")
    quantized = quantize_weights(original, DType.INT8)
    path = save_aimodel(quantized, tmp_path / "t8.aimodel")
    rng = np.random.default_rng(0)
    feed = {
        "input_ids": rng.integers(0, 256, (1, 16)).astype(np.int32),
        "attention_mask": np.ones((1, 16), np.int32),
    }
    ref = next(iter(run_aimodel(SAMPLES / "transformer.aimodel", feed).values())).astype(np.float64).ravel()
    got = next(iter(run_aimodel(path, feed).values())).astype(np.float64).ravel()
    cosine = ref @ got / np.linalg.norm(ref) / np.linalg.norm(got)
    assert cosine >= 0.999


@pytest.mark.parametrize(
    ("kwargs", "rule"),
    [
        (
            {"dtype": DType.FP4_E2M1FN, "granularity": G.PER_CHANNEL},
            "per-block granularity with block_size 32",
        ),
        ({"dtype": DType.INT8, "scale_dtype": DType.FP8_E8M0FNU}, "integer data takes float scales"),
        ({"dtype": DType.FP8_E4M3FN, "qscheme": QScheme.ASYMMETRIC}, "symmetric scheme only"),
        ({"dtype": DType.FP8_E8M0FNU}, "scale dtype"),
    ],
)
def test_invalid_combinations_name_the_rule(kwargs: dict, rule: str) -> None:
    program = load_aimodel(SAMPLES / "mlp.aimodel")
    with pytest.raises(ValueError, match=rule):
        quantize_weights(program, **kwargs)


def test_not_in_place_leaves_the_input_and_skips_are_reported() -> None:
    program = load_aimodel(SAMPLES / "mlp.aimodel")
    report = compress_(
        load_aimodel(SAMPLES / "mlp.aimodel"), QuantizeConfig(dtype=DType.INT8, weight_num_threshold=2048)
    )
    assert {w.shape for w in report.weights} == {(128, 64), (128, 128)}
    assert any("<= threshold 2048" in s.reason for s in report.skipped)  # the 10x128 head
    copy = quantize_weights(program, DType.INT8)
    from coreai_opt import _coreai

    ops = _coreai.op_histogram(_coreai.mlir_module(program))
    assert "coreai.blockwise_shift_scale" not in ops
    assert "coreai.blockwise_shift_scale" in _coreai.op_histogram(_coreai.mlir_module(copy))


def _half_probe(tmp_path: Path, weight: torch.Tensor) -> Path:
    """A bias-free linear layer whose weight (fp16 or bf16) is exactly `weight`."""
    import coreai_torch

    layer = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False).eval().to(weight.dtype)
    with torch.no_grad():
        layer.weight.copy_(weight)
        example = (torch.eye(weight.shape[1], dtype=weight.dtype),)
        program = torch.export.export(layer, example).run_decompositions(coreai_torch.get_decomp_table())
    return save_aimodel(convert_exported_program(program), tmp_path / "half.aimodel")


def _near_ties(dtype: torch.dtype, rows: int, cols: int) -> torch.Tensor:
    """int8 weights exactly on rounding ties of their row's grid, and one ulp either side of them.

    Each row's scale has few significant bits ((4 + j) / 4 * 2**e, j = 0 for bf16) so that its
    amax, 127 * scale, and every tie, (k + 1/2) * scale, are exact in the 16-bit format.
    """
    rng = np.random.default_rng(5)
    steps = 4 if dtype == torch.float16 else 1
    scale = (4 + rng.integers(0, steps, rows)) / 4 * np.ldexp(1.0, rng.integers(-9, -3, rows))
    k = rng.integers(-127, 127, (rows, cols)).astype(np.float64)
    ties = torch.tensor((k + 0.5) * scale[:, None]).to(dtype)
    assert torch.equal(ties.double(), torch.tensor((k + 0.5) * scale[:, None]))  # exact ties
    below, above = (torch.nextafter(ties, torch.full_like(ties, v)) for v in (-np.inf, np.inf))
    pick = torch.from_numpy(rng.integers(0, 3, (rows, cols)))
    w = torch.where(pick == 0, ties, torch.where(pick == 1, below, above))
    w[:, 0] = torch.tensor(127 * scale).to(dtype)  # pins each row's amax, hence its scale
    # and as many plain gaussian rows: quotients anywhere (16-bit division misrounds ~2% of them)
    return torch.cat([w, torch.tensor(rng.standard_normal((rows, cols))).to(dtype)])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_16_bit_weights_round_exactly_like_float64(dtype: torch.dtype, tmp_path: Path) -> None:
    """16-bit weights are quantized in float32; every stored code must equal the float64 one, ties included."""
    from _decode import decode_constant

    w = _near_ties(dtype, 24, 64)
    program = load_aimodel(_half_probe(tmp_path, w))
    compress_(program, QuantizeConfig(dtype=DType.INT8, qscheme=QScheme.SYMMETRIC, granularity=G.PER_CHANNEL))
    from coreai_opt import _coreai

    (op,) = [
        o for o in _coreai.walk_ops(_coreai.mlir_module(program)) if o.name == "coreai.blockwise_shift_scale"
    ]
    codes = decode_constant(op.operands[0].owner)
    scale = decode_constant(op.operands[1].owner)
    w64 = w.double().numpy()
    expected_scale = torch.tensor(np.abs(w64).max(axis=1, keepdims=True) / 127).to(dtype).double().numpy()
    np.testing.assert_array_equal(scale, expected_scale)
    expected = np.clip(np.rint(w64 / expected_scale), -127, 127)
    assert np.count_nonzero(w64 / expected_scale % 1 == 0.5) > 450  # a sixth of the weights are exact ties
    np.testing.assert_array_equal(codes, expected)


@pytest.mark.parametrize("dtype", [DType.FP4_E2M1FN, DType.FP8_E4M3FN, DType.FP8_E5M2], ids=lambda d: d.value)
def test_fp_codes_of_every_value_match_ml_dtypes(dtype: DType) -> None:
    """Golden: the bit pattern written for every finite value of the Core AI element (signed zeros
    included): the element table's tcast code encodes as ml_dtypes does."""
    import tcast

    np_type = {
        DType.FP4_E2M1FN: ml_dtypes.float4_e2m1fn,
        DType.FP8_E4M3FN: ml_dtypes.float8_e4m3fn,
        DType.FP8_E5M2: ml_dtypes.float8_e5m2,
    }[dtype]
    bits = 4 if dtype is DType.FP4_E2M1FN else 8
    codes = np.arange(2**bits, dtype=np.uint8)
    values = codes.view(np_type).astype(np.float32)
    finite = np.isfinite(values)
    cast = tcast.cast(torch.from_numpy(values[finite]), dtype.element.tcast, castmode="actual")
    np.testing.assert_array_equal(cast.unpacked_codes().numpy(), codes[finite])


@pytest.mark.parametrize("dtype", [DType.FP8_E4M3FN, DType.FP8_E5M2], ids=lambda d: d.value)
@pytest.mark.parametrize("magnitude", [1.0, 1e-4], ids=["unit", "tiny"])
def test_fp8_on_fp16_weights_runs_finite_and_exact(dtype: DType, magnitude: float, tmp_path: Path) -> None:
    """fp16 weights take fp16 scales (f32 ones make the runtime return inf/NaN); tiny weights put
    the scale among fp16 subnormals, rounded up so that nothing saturates and nothing is zero."""
    from _decode import densify

    w = (torch.randn(48, 64, dtype=torch.float64) * magnitude).to(torch.float16)
    path = _half_probe(tmp_path, w)
    program = load_aimodel(path)
    report = compress_(
        program, QuantizeConfig(dtype=dtype, qscheme=QScheme.SYMMETRIC, granularity=G.PER_CHANNEL)
    )
    assert report.weights[0].encoding.endswith("f16 scale per channel")
    out = save_aimodel(program, tmp_path / "q.aimodel")
    dense = load_aimodel(out)
    densify(dense)
    dense_path = save_aimodel(dense, tmp_path / "d.aimodel")
    eye = {inspect_model(out).inputs[0].name: np.eye(64, dtype=np.float16)}
    got = next(iter(run_aimodel(out, eye).values())).astype(np.float64)
    want = next(iter(run_aimodel(dense_path, eye).values())).astype(np.float64)
    assert np.isfinite(got).all()
    np.testing.assert_array_equal(got, want)
    relative = np.abs(got.T - w.double().numpy()).max() / np.abs(w.double().numpy()).max()
    assert relative < (0.07 if dtype is DType.FP8_E4M3FN else 0.13)  # half a step of 3 / 2 mantissa bits
