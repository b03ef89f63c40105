"""MX and other scaled types: golden corners, a plain per-block OCP MX v1.0 reference, properties."""

from __future__ import annotations

import math
import zlib

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tcast

# element format -> (ml_dtypes type or None for fixed-point ints, emax of the element)
MX = {
    "mxfp8e4": (ml_dtypes.float8_e4m3fn, 8),
    "mxfp8e5": (ml_dtypes.float8_e5m2, 15),
    "mxfp6e3": (ml_dtypes.float6_e3m2fn, 4),
    "mxfp6e2": (ml_dtypes.float6_e2m3fn, 2),
    "mxfp4e2": (ml_dtypes.float4_e2m1fn, 2),
    "mxint8": (None, 0),
    "mxint4": (None, 0),
    "bfp16": (None, 0),
}


def reference_mx(x: np.ndarray, name: str) -> np.ndarray:
    """OCP MX v1.0, block by block, written plainly: X = 2^(floor(log2 amax) - emax), clamp the
    scale to E8M0, round V/X to the element format (nearest even, saturating), multiply back."""
    element, emax = MX[name]
    tile = 8 if name == "bfp16" else 32
    spec = tcast.lookup(name).nspec
    rows = x.reshape(-1, x.shape[-1]).astype(np.float64)
    out = np.empty_like(rows)
    for r, row in enumerate(rows):
        for start in range(0, row.size, tile):
            block = row[start : start + tile]
            amax = np.max(np.abs(block))
            if not np.isfinite(amax):
                out[r, start : start + tile] = np.nan
                continue
            shared = (math.floor(math.log2(amax)) if amax > 0 else -126) - emax
            shared = min(max(shared, -127), 127)
            v = np.clip(block / 2.0**shared, -spec.max, spec.max)
            if element is None:  # fixed point with mbits fraction bits
                steps = 2.0**spec.mbits
                q = np.round(v * steps) / steps
            else:
                q = v.astype(np.float32).astype(element).astype(np.float64)
            out[r, start : start + tile] = q * 2.0**shared
    return out.reshape(x.shape).astype(np.float32)


def _values(seed: int, shape: tuple[int, ...]) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=generator)
    magnitudes = torch.exp2(torch.randint(-20, 20, (shape[0], 1), generator=generator).float())
    return x * magnitudes  # rows at very different scales


@pytest.mark.parametrize("name", sorted(MX))
def test_mx_matches_plain_reference_bit_for_bit(name: str) -> None:
    x = _values(zlib.crc32(name.encode()) % 1000, (96, 256))  # a seed per name, the same in every run
    got = tcast.cast(x, name)
    expected = torch.from_numpy(reference_mx(x.numpy(), name))
    # ml_dtypes' fp4/fp6 give -0 where tcast's fnuz element gives +0: compare values, not zero signs
    assert torch.equal(got, expected) or (
        torch.equal(got == 0, expected == 0) and torch.equal(got.abs(), expected.abs())
    )
    actual = tcast.cast(x, name, castmode="actual")
    assert torch.equal(tcast.upcast(actual).view(torch.int32), got.view(torch.int32))


def test_mx_golden_corners() -> None:
    zeros = torch.zeros(1, 32)
    assert torch.equal(tcast.cast(zeros, "mxfp8e4"), zeros)
    t = tcast.cast(zeros, "mxfp8e4", castmode="actual")
    assert t.scales.tolist() == [0]  # amax 0 -> exponent -126 - 8 clamps to E8M0's -127, code 0

    # amax exactly a power of two: scale 2^(2 - 8), and the block keeps its largest value
    block = torch.full((1, 32), 0.5)
    block[0, 0] = 4.0
    t = tcast.cast(block, "mxfp8e4", castmode="actual")
    assert t.scales.tolist() == [127 + 2 - 8]
    assert torch.equal(tcast.upcast(t), block)

    # e4m3: amax 1.99 -> scale 2^-8, 1.99 * 256 = 509.4 rounds past 448 and saturates
    block = torch.full((1, 32), 0.01)
    block[0, 3] = 1.99
    got = tcast.cast(block, "mxfp8e4")
    assert got[0, 3].item() == 448 * 2.0**-8 == 1.75

    # int4 at unit scale: 1.99 -> 1.75 (fixed point with two fraction bits)
    block = torch.zeros(1, 32)
    block[0, 0] = 1.99
    assert tcast.cast(block, "mxint4")[0, 0].item() == 1.75
    assert tcast.number("int8").max == 1.984375

    # one NaN, or an Inf, poisons its block only
    x = torch.randn(2, 32)
    for bad in (math.nan, math.inf, -math.inf):
        y = x.clone()
        y[0, 5] = bad
        got = tcast.cast(y, "mxfp4e2")
        assert torch.isnan(got[0]).all()
        assert torch.equal(got[1], tcast.cast(x[1:], "mxfp4e2")[0])
        t = tcast.cast(y, "mxfp4e2", castmode="actual")
        assert t.scales[0].item() == 255  # E8M0 NaN
        assert torch.isnan(tcast.upcast(t)[0]).all()


def test_scale_modes() -> None:
    block = torch.zeros(1, 32)
    block[0, 0] = 1.9  # e2m1: max 6, midmax 7; at the max-mode scale 2^-2, 1.9 -> 7.6 saturates to 6
    exps = {}
    for mode in ("max", "midmax", "ceil"):
        exps[mode] = tcast.cast(block, "mxfp4e2", scalemode=mode, castmode="actual").scales.item() - 127
    assert exps == {"max": -2, "midmax": -1, "ceil": -1}
    assert tcast.cast(block, "mxfp4e2", scalemode="max")[0, 0].item() == 1.5
    assert tcast.cast(block, "mxfp4e2", scalemode="ceil")[0, 0].item() == 2.0
    block[0, 0] = 1.6  # 6.4 at 2^-2: above max (6) but below midmax (7): midmax keeps the lower scale
    modes = {
        m: tcast.cast(block, "mxfp4e2", scalemode=m, castmode="actual").scales.item() - 127 for m in exps
    }
    assert modes == {"max": -2, "midmax": -2, "ceil": -1}
    # even: 1.6 * 4 = 6.4 rounds (e2m1: one mantissa bit, half up) to 6, in the same binade as max;
    # 1.75 * 4 = 7 rounds to 8, the next binade
    assert tcast.cast(block, "mxfp4e2", scalemode="even", castmode="actual").scales.item() - 127 == -2
    block[0, 0] = 1.75
    assert tcast.cast(block, "mxfp4e2", scalemode="even", castmode="actual").scales.item() - 127 == -1
    # torchao's and cuBLAS's spellings
    saved = tcast.defaults()
    try:
        assert tcast.initialize(scalemode="floor").scalemode is tcast.ScaleMode.MAX
        assert tcast.initialize(scalemode="rceil").scalemode is tcast.ScaleMode.CEIL
    finally:
        tcast.initialize(saved.roundmode, saved.scalemode, saved.computemode)


@pytest.mark.parametrize("name", ["mxfp8e4", "mxfp8e5", "mxfp6e3", "mxfp6e2", "mxfp4e2"])
def test_even_scale_mode_is_torchaos_bit_rule(name: str) -> None:
    """torchao's EVEN, written from its documented bit rule: add half an element-mantissa ulp to
    amax's float32 bits, clear the mantissa, take the exponent, less the element's emax."""
    dtype = tcast.lookup(name)
    mbits, emax = dtype.nspec.mbits, dtype.nspec.emax
    x = torch.randn(4096, 32, generator=torch.Generator().manual_seed(11)) * torch.exp2(
        torch.randint(-20, 20, (4096, 1), generator=torch.Generator().manual_seed(12)).float()
    )
    x[:64, 0] = torch.tensor([1.75, 1.875, 1.9375, 1.96875] * 16) * 2.0**8  # at the rounding edges
    amax_bits = x.abs().amax(dim=1).view(torch.int32)
    rounded = (amax_bits + (1 << (23 - mbits - 1))) & (0xFF << 23)
    expected = (rounded >> 23) - 127 - emax
    t = tcast.cast(x, name, scalemode="even", castmode="actual")
    assert torch.equal(t.scales.to(torch.int32) - 127, expected)
    assert torch.equal(tcast.upcast(t), tcast.cast(x, name, scalemode="even"))


def test_padding_2d_tiles_and_channel_scales() -> None:
    x = _values(3, (5, 70))
    padded = torch.nn.functional.pad(x, (0, 26))
    assert torch.equal(tcast.cast(x, "mxfp8e4"), tcast.cast(padded, "mxfp8e4")[:, :70])
    # tiles along dim 0
    along0 = tcast.datatype("e4m3fn", "e8m0_t32d0")
    assert torch.equal(tcast.cast(x.T.contiguous(), along0), tcast.cast(x, "mxfp8e4").T)
    # 2D tiles 4 x 8: every 4x8 patch shares one scale
    tile2d = tcast.datatype("e4m3fn", "e8m0_t4d0_t8d1")
    got = tcast.cast(x, tile2d)
    t = tcast.cast(x, tile2d, castmode="actual")
    assert t.scales.numel() == math.ceil(5 / 4) * math.ceil(70 / 8)
    assert torch.equal(tcast.upcast(t), got)
    patch = x[0:4, 8:16].reshape(1, 32)
    assert torch.equal(got[0:4, 8:16].reshape(1, 32), tcast.cast(patch, "mxfp8e4"))
    # channel scale: one float16 scale per row for int8 rows
    per_row = tcast.datatype("int8", "float16_t0")
    t = tcast.cast(x, per_row, castmode="actual")
    assert t.scales.dtype == torch.float16 and t.scales.numel() == 5
    assert torch.equal(tcast.upcast(t), tcast.cast(x, per_row))


def test_unsigned_with_zero_points() -> None:
    x = torch.linspace(-1.0, 3.0, 64).reshape(2, 32)
    for name in ("uint8_fi", "uint8_ff", "uint4_bi_t32", "uint4_ff_t32"):
        t = tcast.cast(x, name, castmode="actual")
        got = tcast.upcast(t)
        assert torch.equal(got, tcast.cast(x, name))
        top = 255 if "uint8" in name else 15
        step = (x.max() - x.min()) / top
        assert (got - x).abs().max() <= step * 0.51 + 1e-3
    zero = tcast.cast(torch.tensor([[-1.0, 0.0, 3.0]]), "uint8_fi")
    assert zero[0, 1].item() == 0.0  # an integer zero point represents 0.0 exactly


def test_bits_per_value_and_packing() -> None:
    x = torch.randn(4, 64)
    t = tcast.cast(x, "mxfp4e2", castmode="actual")
    assert t.codes.numel() == 4 * 64 // 2 and t.scales.numel() == 8
    assert tcast.mxfp4e2.bits_per_value() == 4 + 8 / 32
    t6 = tcast.cast(x, "mxfp6e2", castmode="actual")
    assert t6.codes.numel() == 4 * 64 * 6 // 8  # four 6-bit codes in three bytes
    first = tcast._pack.unpack_codes(t6.codes, 6, 4)
    direct = tcast._codes.encode(
        tcast.cast(x[0:1, :32], "mxfp6e2").double().reshape(-1)[:4] / 2.0 ** (t6.scales[0].item() - 127),
        tcast.number("e2m3fnuz"),
    )
    assert torch.equal(first, direct)


finite = st.floats(-1e4, 1e4, allow_nan=False, width=32)


@settings(max_examples=60, deadline=None)
@given(st.lists(finite, min_size=1, max_size=100), st.sampled_from(sorted(MX)))
def test_cast_is_idempotent(values: list[float], name: str) -> None:
    x = torch.tensor(values).reshape(1, -1)
    once = tcast.cast(x, name)
    assert torch.equal(tcast.cast(once, name), once)


@settings(max_examples=60, deadline=None)
@given(st.lists(finite, min_size=1, max_size=64), st.sampled_from(sorted(MX)))
def test_error_is_at_most_half_a_step(values: list[float], name: str) -> None:
    x = torch.tensor(values, dtype=torch.float32).reshape(1, -1)
    t = tcast.cast(x, name, castmode="actual")
    got = tcast.upcast(t).double()
    spec = tcast.lookup(name).nspec
    tile = 8 if name == "bfp16" else 32
    exps = (t.scales.double() - 127).repeat_interleave(tile)[: x.numel()].reshape(1, -1)
    v = x.double() / torch.exp2(exps)
    unsaturated = v.abs() <= spec.max
    e = torch.clamp(torch.floor(torch.log2(v.abs().clamp(min=1e-300))), min=spec.emin)
    half_step = torch.exp2(e - spec.mbits + exps) / 2
    assert torch.all(((got - x.double()).abs() <= half_step) | ~unsaturated)


@settings(max_examples=60, deadline=None)
@given(st.lists(finite, min_size=1, max_size=90), st.sampled_from(sorted(tcast.PREDEFINED)))
def test_actual_round_trip_is_exact(values: list[float], name: str) -> None:
    dtype = tcast.lookup(name)
    if dtype.nspec.bits > 16:
        return
    x = torch.tensor(values).reshape(1, -1)
    t = tcast.cast(x, dtype, castmode="actual")
    assert torch.equal(tcast.upcast(t).view(torch.int32), tcast.cast(x, dtype).view(torch.int32))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 8).flatmap(lambda m: st.tuples(st.just(m), st.integers(1, m))), st.integers(1, 6))
def test_sparse_keeps_n_of_every_m_with_signs(mn: tuple[int, int], groups: int) -> None:
    m, n = mn
    generator = torch.Generator().manual_seed(m * 31 + n + groups)
    x = torch.randn(3, m * groups, generator=generator)
    y = tcast.sparse(x, m, n)
    kept = (y != 0).reshape(3, groups, m).sum(-1)
    assert torch.all(kept == n)
    nonzero = y != 0
    assert torch.equal(y[nonzero], x[nonzero])  # values and signs kept
    dropped_max = torch.where(nonzero, 0.0, x.abs()).reshape(3, groups, m).amax(-1)
    kept_min = torch.where(nonzero, x.abs(), math.inf).reshape(3, groups, m).amin(-1)
    assert torch.all(dropped_max <= kept_min)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32])
@pytest.mark.parametrize("mn", [(4, 2), (4, 1), (8, 3), (16, 4), (17, 5), (3, 3)])
def test_sparse_mask_is_the_stable_sort_rule(dtype: torch.dtype, mn: tuple[int, int]) -> None:
    """Ranking by comparisons keeps what the first n of a stable descending sort keep: ties to the
    lower index, NaN above Inf, a shorter last group."""
    m, n = mn
    g = torch.Generator().manual_seed(m * 7 + n)
    x = torch.randint(-4, 5, (6, 5 * m + 2), generator=g).to(dtype)  # many ties, zeros of both signs
    if dtype.is_floating_point:
        x[0] = torch.randn(5 * m + 2, generator=g).to(dtype)
        x[1, ::3], x[2, ::4], x[3, 1::5] = math.nan, -math.inf, math.inf
    magnitude = torch.nn.functional.pad(x.abs(), (0, (-x.shape[1]) % m), value=-1.0).reshape(6, -1, m)
    order = torch.sort(magnitude, dim=-1, descending=True, stable=True).indices
    expected = torch.zeros_like(magnitude, dtype=torch.bool).scatter_(-1, order[..., :n], True)
    expected = expected.reshape(6, -1)[:, : x.shape[1]]
    assert torch.equal(tcast.sparse_mask(x, m, n), expected)
    assert torch.equal(tcast.sparse_mask(x.T, m, n, dim=0), expected.T)


def test_initialize_sets_defaults_per_thread() -> None:
    import threading

    x = torch.full((1, 32), 1.0 + 3.0 / 32)  # between 1.0 and 1.125 in e4m3, nearer 1.125
    seen: dict[str, float] = {}

    def worker() -> None:
        tcast.initialize(roundmode="zero")
        seen["worker"] = tcast.cast(x, "mxfp8e4")[0, 0].item()

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen["worker"] == 1.0  # truncated in the thread that asked for it
    assert tcast.defaults().roundmode is tcast.RoundMode.EVEN  # this thread is unaffected
    assert tcast.cast(x, "mxfp8e4")[0, 0].item() == 1.125
    with pytest.raises(ValueError, match="unknown RoundMode"):
        tcast.initialize(roundmode="sideways")


def test_specs_reject_bad_codes() -> None:
    for bad in ("e4m3x", "int1", "uint33", "e8m0fn", ""):
        with pytest.raises(ValueError):
            tcast.number(bad)
    for bad in ("e8m0_t2000000", "int8_t32", "e8m0_t4d0_t4d0", "e8m0_t4_t4_t4"):
        with pytest.raises(ValueError):
            tcast.scale(bad)
    assert tcast.scale("e8m0_t33").tiles[0].size == 33  # any tile size
    assert tcast.datatype("e4m3fn", "float16_t32").sspec.scale.code == "e5m10"  # FP8 with float scales
    with pytest.raises(ValueError, match="only unsigned formats take a zero point"):
        tcast.datatype("e4m3fn", "float16_float16_t32")
    assert tcast.number(torch.float8_e5m2fnuz).code == "e5m2b16fnuz"
    assert tcast.number("torch.float8_e4m3fnuz").bias == 8
