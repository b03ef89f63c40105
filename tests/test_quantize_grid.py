"""Every dtype x scheme x granularity (x scale dtype) on every sample model.

For each valid combination: the saved asset loads; inspect reports each compressed weight with
the expected encoding and exactly the expected bytes (counted here from the format, not read
from the IR); and the runtime's output equals that of the same program with every
blockwise_shift_scale replaced by the dense weight decoded independently in numpy.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from _decode import densify
from conftest import SAMPLE_NAMES, SAMPLES, run_aimodel, sample_inputs

from coreai_opt.coreai_utils import CompressionGranularity, DType, QScheme, QuantizeConfig, compress_
from coreai_opt.inspection import inspect_model
from coreai_opt.io import load_aimodel, save_aimodel

G = CompressionGranularity
THRESHOLD = 256  # low enough to take the CNN's first conv and int_arith's projection
BLOCK = 32


def _combos() -> list[tuple[DType, QScheme, CompressionGranularity, DType | None]]:
    grains = (G.PER_TENSOR, G.PER_CHANNEL, G.PER_BLOCK)
    ints = [d for d in DType if d.is_int]
    combos = [(d, s, g, None) for d, s, g in itertools.product(ints, QScheme, grains)]
    fp8 = (DType.FP8_E4M3FN, DType.FP8_E5M2)
    combos += [
        (d, QScheme.SYMMETRIC, g, sd)
        for d, g, sd in itertools.product(fp8, grains, (None, DType.FP8_E8M0FNU))
    ]
    combos.append((DType.FP4_E2M1FN, QScheme.SYMMETRIC, G.PER_BLOCK, None))
    return combos


COMBOS = _combos()

# Lowest weight SNR (dB) seen on the samples' weights, less about 2 dB: ~6 dB per integer bit;
# int2 sym per tensor is {-1, 0, 1} x amax, where most weights round to zero (~0.4 dB).
MIN_SNR = {
    DType.INT8: 38, DType.UINT8: 38, DType.INT4: 13, DType.UINT4: 13, DType.INT2: 0, DType.UINT2: 0,
    DType.FP8_E4M3FN: 24, DType.FP8_E5M2: 22, DType.FP4_E2M1FN: 15,
}  # fmt: skip


def _combo_id(combo: tuple[DType, QScheme, CompressionGranularity, DType | None]) -> str:
    dtype, scheme, grain, scale = combo
    return "-".join(x for x in (dtype.value, scheme.value, grain.value, scale.value if scale else "") if x)


def _element(dtype: DType) -> str:
    if dtype.is_int:
        return f"{'si' if dtype.signed else 'ui'}{dtype.bits}"
    return {DType.FP8_E4M3FN: "f8E4M3FN", DType.FP8_E5M2: "f8E5M2", DType.FP4_E2M1FN: "f4E2M1FN"}[dtype]


def _expected_bytes(
    shape: tuple[int, ...], dtype: DType, grain: CompressionGranularity, e8m0: bool, stored_offset: bool
) -> int:
    """Data packed + one scale per group + offset1 (a zero splat, or one code per group) + offset2 splat.

    Every weight of the samples has its output channels on axis 0 and its blocks along axis 1.
    """
    count = math.prod(shape)
    groups = {G.PER_TENSOR: 1, G.PER_CHANNEL: shape[0], G.PER_BLOCK: count // BLOCK}[grain]
    scale_bytes = 1 if e8m0 else 4  # E8M0, else the weight's own f32 (ints) or f32 (floats)
    offset1 = math.ceil(groups * dtype.bits / 8) if stored_offset else 1
    return math.ceil(count * dtype.bits / 8) + groups * scale_bytes + offset1 + 4


def _granularity_words(shape: tuple[int, ...], grain: CompressionGranularity) -> str:
    if grain is G.PER_TENSOR:
        return "per tensor"
    if grain is G.PER_CHANNEL or shape[1] == BLOCK:  # one block per row is a per-channel scale
        return "per channel"
    return f"per block {BLOCK} (axis 1)"


# Each combination on two of the five samples, taken in turn: every sample still meets every
# granularity with either scheme, and every dtype but MXFP4 (one combination, two samples); all
# 5 x 49 would cost ~35 CPU-s more of make test, over its 15-minute budget.
CASES = [
    pytest.param(combo, SAMPLE_NAMES[(i + shift) % len(SAMPLE_NAMES)],
                 id=f"{_combo_id(combo)}-{SAMPLE_NAMES[(i + shift) % len(SAMPLE_NAMES)]}")
    for i, combo in enumerate(COMBOS) for shift in (0, 2)
]  # fmt: skip


@pytest.mark.parametrize(("combo", "sample"), CASES)
def test_quantized_sample_matches_its_numpy_decoding(
    combo: tuple[DType, QScheme, CompressionGranularity, DType | None], sample: str, tmp_path: Path
) -> None:
    dtype, scheme, grain, scale_dtype = combo
    e8m0 = scale_dtype is not None or dtype is DType.FP4_E2M1FN
    program = load_aimodel(SAMPLES / f"{sample}.aimodel")
    report = compress_(
        program,
        QuantizeConfig(
            dtype=dtype,
            qscheme=scheme,
            granularity=grain,
            block_size=BLOCK,
            scale_dtype=scale_dtype,
            weight_num_threshold=THRESHOLD,
        ),
    )
    if grain is not G.PER_BLOCK:
        assert report.weights, "every sample has a weight above the threshold"
    for skipped in report.skipped:
        assert skipped.kind.value in ("small", "not-a-weight") or (
            grain is G.PER_BLOCK and skipped.shape[1] % BLOCK
        ), skipped
    path = save_aimodel(program, tmp_path / "q.aimodel")

    # inspect sees each compressed weight with the expected encoding and exactly the expected bytes
    inspected = inspect_model(path)
    compressed = [w for w in inspected.weights if "scale" in w.encoding]
    assert Counter((w.shape, w.encoding, w.nbytes) for w in compressed) == Counter(
        (w.shape, w.encoding, w.bytes_after) for w in report.weights
    )
    for w in report.weights:
        scale = "f8E8M0FNU" if e8m0 else "f32"
        expected = f"{_element(dtype)} + {scale} scale {_granularity_words(w.shape, grain)}"
        # unsigned codes always sit around a stored offset; signed asymmetric ones do unless every
        # zero point is exactly the midpoint (a symmetric-looking tensor), when offset1 is a zero splat
        has_zero_point = w.encoding.endswith(" + zero point")
        if dtype.is_int and not dtype.signed:
            assert has_zero_point
        elif scheme is QScheme.SYMMETRIC:
            assert not has_zero_point
        assert w.encoding == expected + (" + zero point" if has_zero_point else "")
        assert w.bytes_after == _expected_bytes(w.shape, dtype, grain, e8m0, has_zero_point)
        assert w.bytes_before == 4 * math.prod(w.shape)
        assert w.snr_db >= MIN_SNR[dtype], (w.name, w.snr_db)

    # the runtime decompresses exactly what the numpy decoding says is stored
    dense = load_aimodel(path)
    assert densify(dense) == len(report.weights)
    dense_path = save_aimodel(dense, tmp_path / "dense.aimodel")
    inputs = sample_inputs(path)
    got, want = run_aimodel(path, inputs), run_aimodel(dense_path, inputs)
    assert got.keys() == want.keys()
    for name in got:
        scale = max(1.0, float(np.abs(want[name]).max()))
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5 * scale)
