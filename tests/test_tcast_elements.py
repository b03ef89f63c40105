"""Unscaled element casts, bit-exact with torch and ml_dtypes on every code, tie, subnormal and edge.

The references do round-to-nearest-even; the other round modes are checked on every tie and near
tie against the two neighbours. Policy differences from the references are stated where tested:
tcast saturates finite overflow (torch's e5m2 and fnuz types overflow to inf/NaN), and NaN stays
NaN (ml_dtypes' fp6/fp4 turn NaN into -0).
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch

import tcast

TORCH_REFS = {
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
    "float8_e4m3fnuz": torch.float8_e4m3fnuz,
    "float8_e5m2fnuz": torch.float8_e5m2fnuz,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
NUMPY_REFS = {
    "float6_e2m3fn": ml_dtypes.float6_e2m3fn,
    "float6_e3m2fn": ml_dtypes.float6_e3m2fn,
    "float4_e2m1fn": ml_dtypes.float4_e2m1fn,
    "float8_e8m0fnu": ml_dtypes.float8_e8m0fnu,
}
ALL = sorted(TORCH_REFS) + sorted(NUMPY_REFS)


def reference(name: str, x: torch.Tensor) -> torch.Tensor:
    """The reference library's conversion (round to nearest even) back to float32."""
    if name in TORCH_REFS:
        return x.to(TORCH_REFS[name]).to(torch.float32)
    return torch.from_numpy(x.numpy().astype(NUMPY_REFS[name]).astype(np.float32))


def reference_codes(name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Every code of the reference format and its value (float32), NaN codes included."""
    bits = tcast.number(name).bits
    if name in TORCH_REFS:
        dtype = TORCH_REFS[name]
        raw = torch.arange(1 << bits, dtype=torch.int32)
        storage = raw.to(torch.int16) if bits == 16 else raw.to(torch.uint8)
        return raw, storage.view(dtype).to(torch.float32)
    codes = np.arange(1 << bits, dtype=np.uint8)
    values = codes.view(NUMPY_REFS[name]).astype(np.float32)
    return torch.from_numpy(codes.astype(np.int32)), torch.from_numpy(values)


OCP_SMALL = ("float6_e2m3fn", "float6_e3m2fn", "float4_e2m1fn")


def same_bits(a: torch.Tensor, b: torch.Tensor, name: str = "") -> bool:
    """Bitwise equality of float32 tensors, treating every NaN as equal.

    tcast models OCP fp6/fp4 as fnuz (same finite values, and a NaN code), so their -0 reads
    as +0: for those formats the sign of zero is not compared.
    """
    both_nan = torch.isnan(a) & torch.isnan(b)
    if name in OCP_SMALL:
        a, b = torch.where(a == 0, 0.0, a), torch.where(b == 0, 0.0, b)
    return bool(torch.all(both_nan | (a.view(torch.int32) == b.view(torch.int32))))


def finite_values(name: str) -> torch.Tensor:
    _, values = reference_codes(name)
    values = values[torch.isfinite(values)]
    return torch.unique(values)  # sorted; -0 and +0 collapse


@pytest.mark.parametrize("name", ALL)
def test_every_representable_value_is_kept_and_encoded_like_the_reference(name: str) -> None:
    codes, values = reference_codes(name)
    spec = tcast.number(name)
    finite = torch.isfinite(values)
    if spec.infnan is tcast.InfNaN.FNUZ:  # -0 is NaN there: the reference has no such value
        finite &= ~((values == 0) & torch.signbit(values))
    x = values[finite]
    assert same_bits(tcast.cast(x, name), x)
    if name in ("float6_e2m3fn", "float6_e3m2fn", "float4_e2m1fn"):
        keep = ~((x == 0) & torch.signbit(x))  # OCP fp6/fp4 -0 maps to tcast's NaN code (fnuz)
        x, expected = x[keep], codes[finite][keep]
    else:
        expected = codes[finite]
    actual = tcast.cast(x, name, castmode="actual")
    got = actual.codes.to(torch.int64) if spec.bits == 8 else None
    if spec.bits == 8:
        assert torch.equal(got, expected.to(torch.int64))
    else:
        unpacked = tcast._pack.unpack_codes(actual.codes, spec.bits, x.numel())
        assert torch.equal(unpacked, expected.to(torch.int64) & ((1 << spec.bits) - 1))
    assert same_bits(tcast.upcast(actual), tcast.cast(x, name))


def _ties(name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    values = finite_values(name).to(torch.float64)
    lo, hi = values[:-1], values[1:]
    same_sign = (lo >= 0) == (hi > 0)
    if name == "float8_e8m0fnu":  # powers of two: the tie is the midpoint in linear terms
        same_sign = torch.ones_like(lo, dtype=torch.bool)
    lo, hi = lo[same_sign], hi[same_sign]
    return lo, hi, ((lo + hi) / 2)


@pytest.mark.parametrize("name", ALL)
def test_ties_and_near_ties_round_to_nearest_even_like_the_reference(name: str) -> None:
    lo, hi, mid = _ties(name)
    for probe in (mid, torch.nextafter(mid, hi), torch.nextafter(mid, lo)):
        x = probe.to(torch.float32)
        assert same_bits(tcast.cast(x, name, roundmode="even"), reference(name, x), name), name


@pytest.mark.parametrize(
    "name", ["float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float6_e3m2fn", "float4_e2m1fn"]
)
def test_other_round_modes_on_ties(name: str) -> None:
    lo, hi, mid = _ties(name)
    x = mid.to(torch.float32)
    larger = torch.where(hi.abs() > lo.abs(), hi, lo).to(torch.float32)
    smaller = torch.where(hi.abs() > lo.abs(), lo, hi).to(torch.float32)
    nearest = tcast.cast(x, name, roundmode="nearest")
    zero = tcast.cast(x, name, roundmode="zero")
    assert torch.equal(nearest.abs(), larger.abs())
    assert torch.equal(zero.abs(), smaller.abs())
    # just below a tie, nearest and even agree; truncation always takes the smaller magnitude
    below = torch.nextafter(x, torch.zeros_like(x))
    assert torch.equal(
        tcast.cast(below, name, roundmode="nearest"), tcast.cast(below, name, roundmode="even")
    )
    above = torch.nextafter(x, x * 2)
    assert torch.equal(tcast.cast(above, name, roundmode="zero").abs(), smaller.abs())


@pytest.mark.parametrize("name", ALL)
def test_values_beyond_max_saturate(name: str) -> None:
    spec = tcast.number(name)
    factors = torch.tensor([1.0001, 1.5, 2.0, 17.0, 1e6], dtype=torch.float64)
    x = (factors * spec.max).clamp(max=torch.finfo(torch.float32).max).to(torch.float32)
    x = torch.cat([x, -x]) if spec.is_float else x
    expected = torch.clamp(x, spec.min, spec.max)
    assert same_bits(tcast.cast(x, name), reference(name, expected), name)


@pytest.mark.parametrize("name", [n for n in ALL if n != "float8_e8m0fnu"])
def test_subnormals_and_signed_zeros(name: str) -> None:
    spec = tcast.number(name)
    generator = torch.Generator().manual_seed(7)
    tiny = torch.rand(4096, generator=generator, dtype=torch.float64) * spec.smallest_normal * 1.5
    x = torch.cat([tiny, -tiny]).to(torch.float32)
    assert same_bits(tcast.cast(x, name), reference(name, x), name)
    zeros = torch.tensor([0.0, -0.0])
    got = tcast.cast(zeros, name)
    assert got[0].item() == 0 and not torch.signbit(got[0])
    # -0 stays -0 where the format has it; fnuz formats have no -0 (it is their NaN)
    assert bool(torch.signbit(got[1])) == (spec.infnan is not tcast.InfNaN.FNUZ)
    if name in TORCH_REFS:
        assert same_bits(got, reference(name, zeros))


@pytest.mark.parametrize("name", ALL)
def test_nan_and_inf_policy(name: str) -> None:
    spec = tcast.number(name)
    x = torch.tensor([math.nan, math.inf, -math.inf])
    got = tcast.cast(x, name)
    if spec.infnan is tcast.InfNaN.OCP:
        # OCP FP6/FP4 have no NaN: stored as -0, bit for bit as ml_dtypes does
        assert got[0].item() == 0 and torch.signbit(got[0])
        assert same_bits(got, reference(name, x), name)
    else:
        assert torch.isnan(got[0])  # NaN never becomes a number
    if spec.has_inf:
        assert got[1].item() == math.inf and got[2].item() == -math.inf
    elif spec.is_exponent:
        assert got[1].item() == spec.max and torch.isnan(got[2])  # no negative powers of two
    else:
        assert got[1].item() == spec.max and got[2].item() == -spec.max
    if name in ("float8_e4m3fn", "float8_e5m2"):  # torch agrees on these two
        assert same_bits(got, reference(name, x))
    actual = tcast.cast(x, name, castmode="actual")
    assert same_bits(tcast.upcast(actual), got)


def test_e8m0_has_no_zero_or_negatives_and_rounds_ties_up() -> None:
    x = torch.tensor([0.0, -1.0, 1.5, 3.0, 0.75, 2.0**-130])
    got = tcast.cast(x, "e8m0")
    assert torch.isnan(got[0]) and torch.isnan(got[1])
    assert got[2:].tolist() == [2.0, 4.0, 1.0, 2.0**-127]
    assert same_bits(got[2:], reference("float8_e8m0fnu", x[2:]))


def test_stochastic_rounding_is_reproducible_and_unbiased() -> None:
    x = torch.full((200_000,), 1.0 + 1.0 / 32)  # a quarter of the way from 1.0 to 1.125 in e4m3
    a = tcast.cast(x, "e4m3fn", roundmode="stochastic", seed=11)
    b = tcast.cast(x, "e4m3fn", roundmode="stochastic", seed=11)
    assert torch.equal(a, b)
    assert set(torch.unique(a).tolist()) == {1.0, 1.125}
    assert a.mean().item() == pytest.approx(x[0].item(), abs=2e-3)
    assert not torch.equal(a, tcast.cast(x, "e4m3fn", roundmode="stochastic", seed=12))


def test_input_dtypes_and_no_mutation() -> None:
    x = torch.randn(64, 64)
    keep = x.clone()
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        y = tcast.cast(x.to(dtype), "mxfp8e4")
        assert y.dtype == dtype
        ref = tcast.cast(x.to(dtype).float(), "mxfp8e4")
        assert torch.equal(y.float(), ref.to(dtype).float())
    assert torch.equal(x, keep)
    with pytest.raises(ValueError, match="float32, float16 or bfloat16"):
        tcast.cast(torch.arange(4), "mxfp8e4")


FAST_PATH_FORMATS = (
    "e4m3fn",
    "e5m2",
    "e4m3b8fnuz",
    "e3m2fnuz",
    "e2m3fnuz",
    "e2m1fnuz",
    "e5m10",
    "int8",
    "int4",
)


@pytest.mark.parametrize("code", FAST_PATH_FORMATS)
@pytest.mark.parametrize("mode", list(tcast.RoundMode))
def test_float32_fast_path_equals_the_general_path(code: str, mode: tcast.RoundMode) -> None:
    """The in-place float32 rounding gives the same bits as the general frexp/ldexp path in float64."""
    from tcast import _primitives

    spec = tcast.number(code)
    generator = torch.Generator().manual_seed(11)
    grid = torch.exp2(torch.arange(spec.emin - spec.mbits - 3, spec.emax + 3, dtype=torch.float32))
    random = (
        torch.randn(20000, generator=generator)
        * grid[torch.randint(0, len(grid), (20000,), generator=generator)]
    )
    ties = (grid[:-1] + grid[1:]) / 2
    corners = torch.tensor(
        [0.0, -0.0, math.inf, -math.inf, math.nan, 1e-45, -1e-45, 3e38, spec.max, -spec.max]
    )
    x = torch.cat([random, -random, grid, ties, -ties, corners])
    noise = torch.rand(x.shape, generator=generator)
    assert _primitives._fast_path(x, spec)
    fast = _primitives.quantize(x, spec, mode, noise)
    general = _primitives._quantize_general(x.double(), spec, mode, noise.double())
    assert same_bits(fast, general.float(), code)
    if spec.mbits > 0 or spec.is_int:  # a float-scaled cast's float64 quotients: the same path
        wide = x.double() * (1 + torch.rand(x.shape, generator=generator, dtype=torch.float64) * 2**-30)
        wide = torch.cat([wide, x.double()])
        if spec.bits <= 8:  # every value of the format, the midpoints between them and their neighbours
            table = tcast._codes.decode_table(code).double()
            values = table[torch.isfinite(table)].unique()
            middles = (values[:-1] + values[1:]) / 2
            wide = torch.cat(
                [wide, values, middles, middles.nextafter(values[1:]), middles.nextafter(values[:-1])]
            )
        noise64 = torch.rand(wide.shape, generator=generator, dtype=torch.float64)
        assert _primitives._fast_path(wide, spec)
        fast64 = _primitives.quantize(wide, spec, mode, noise64)
        general64 = _primitives._quantize_general(wide, spec, mode, noise64)
        both_nan = torch.isnan(fast64) & torch.isnan(general64)
        assert bool(torch.all(both_nan | (fast64.view(torch.int64) == general64.view(torch.int64))))


@pytest.mark.parametrize("code", ["e8m52", "e5m52", "e5m23", "e8m23"])
def test_formats_as_wide_as_the_working_float_take_the_general_path(code: str) -> None:
    """A mantissa as wide as float64's (float32's) leaves the magic addend no bit to round at:
    such formats are rounded by the general path, and every mode gives its bits."""
    from tcast import _primitives

    spec = tcast.number(code)
    x = torch.tensor(
        [1 + 2**-52, 1.5 + 2**-52, 3 - 2**-51, -(1 + 2**-23), 2**-30 + 2**-80], dtype=torch.float64
    )
    assert not _primitives._fast_path(x.float(), spec)
    assert _primitives._fast_path(x, spec) == (spec.mbits < 52)  # float64 has room for 23 bits
    for mode in (tcast.RoundMode.EVEN, tcast.RoundMode.ZERO):
        got = _primitives.quantize(x, spec, mode)
        assert torch.equal(got, _primitives._quantize_general(x, spec, mode, None))
    if spec.mbits == 52 and spec.emin <= -30:
        assert torch.equal(_primitives.quantize(x, spec, tcast.RoundMode.EVEN), x)  # already on the grid


EVERY_KIND = (
    "int8", "int4", "int2", "uint8", "uint4", "e5m2", "e4m3", "e4m3fn", "e5m10", "e8m7", "e5m10b9",
    "e4m3b8fnuz", "e5m2b16fnuz", "e3m2fnuz", "e2m1fnuz", "e2m1ocp", "e2m3ocp", "e3m2ocp", "e8m0",
    "e4m3fnuz",  # bias 7: e4m3fn's exponents but up to 480, beyond e4m3fn's 448 (no host format)
    "e5m2b16inuz", "e7m0b64inuz",  # P3109
)  # fmt: skip


@pytest.mark.parametrize("code", EVERY_KIND)
@pytest.mark.parametrize("work", [torch.float32, torch.float64])
def test_every_code_decodes_to_a_value_that_encodes_back_to_it(code: str, work: torch.dtype) -> None:
    """Integers, IEEE, FN, FNUZ, OCP, P3109 and exponent formats, biased or not: each code's value
    encodes to that code (NaN codes to the format's one NaN code) in both work dtypes."""
    spec = tcast.number(code)
    values = tcast._codes.decode_table(code).to(work)
    encoded = tcast._codes.encode(values, spec).to(torch.int64)
    every = torch.arange(1 << spec.bits)
    nan = torch.isnan(values)
    assert torch.equal(encoded[~nan], every[~nan])
    assert bool((encoded[nan] == tcast._codes.nan_code(spec)).all())


@pytest.mark.parametrize("code", ["e4m3fn", "e5m2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_float8_codes_decode_as_torch_converts_them(code: str, dtype: torch.dtype) -> None:
    """`decode` of FP8 codes on the CPU (through float16's bits, not torch's slow conversion) gives
    torch's values bit for bit: every code, NaN codes present or not, signed zeros, subnormals."""
    from tcast._codes import decode

    spec = tcast.number(code)
    every = torch.arange(256, dtype=torch.uint8)
    finite = every[torch.isfinite(every.view(spec.torch_dtype).float())]
    for codes in (every, finite, every.repeat(3).flip(0), torch.zeros(0, dtype=torch.uint8)):
        expected = codes.view(spec.torch_dtype).to(dtype)
        decoded = decode(codes, spec, dtype)
        nan = expected.isnan()
        assert torch.equal(decoded.isnan(), nan)
        assert _same_bits(decoded[~nan], expected[~nan])


DIRECT_CODES = [(f"int{bits}", work) for bits in range(2, 9) for work in (torch.float32, torch.float64)] + [
    ("e4m3fn", torch.float32)
]


@pytest.mark.parametrize(("code", "work"), DIRECT_CODES)
def test_codes_straight_from_scaled_values_equal_encoding_the_rounded_values(
    code: str, work: torch.dtype
) -> None:
    """`scaled_codes` (an actual cast's shortcut: round, clamp, code in a few passes; FP8 by torch's
    own conversion) gives the codes `encode` gives the general path's values: every grid value, the
    midpoints and their neighbours, the subnormals' and the overflow's edges, random values across
    the range and far beyond it, NaN, +-Inf, signed zeros. (For e4m3fn all 2**32 float32 patterns
    were compared once, off the suite: no difference.)"""
    from tcast import _primitives
    from tcast._codes import encode

    spec = tcast.number(code)
    generator = torch.Generator().manual_seed(5)
    table = tcast._codes.decode_table(code)
    values = table[torch.isfinite(table)].unique().to(work)
    middles = (values[:-1] + values[1:]) / 2  # exact: one bit more than the format's
    random = (torch.randn(20000, generator=generator, dtype=torch.float64) * spec.max).to(work)
    top = spec.max
    corners = torch.tensor(
        [
            0.0,
            -0.0,
            math.inf,
            -math.inf,
            math.nan,
            1e-300,
            -1e-300,
            1e30,
            -1e30,
            2 * top,
            1.03 * top,
            -1.03 * top,
        ]
    ).to(work)
    x = torch.cat(
        [
            values,
            middles,
            middles.nextafter(values[1:]),
            middles.nextafter(values[:-1]),
            random,
            random * 9,
            corners,
        ]
    )
    assert _primitives.direct_codes(spec, tcast.RoundMode.EVEN, work)
    direct = _primitives.scaled_codes(x.clone(), spec)
    reference = encode(_primitives._quantize_general(x.double(), spec, tcast.RoundMode.EVEN, None), spec)
    assert torch.equal(direct, reference)
    assert not _primitives.direct_codes(spec, tcast.RoundMode.NEAREST, work)


def test_the_float8_shortcut_is_taken_only_where_torch_rounds_as_tcast() -> None:
    """torch's float8 conversion rounds float64 through float32 (twice) and has no saturation
    that keeps Inf: those casts go through values."""
    from tcast import _primitives

    even = tcast.RoundMode.EVEN
    assert not _primitives.direct_codes(tcast.number("e4m3fn"), even, torch.float64)
    assert not _primitives.direct_codes(tcast.number("e5m2"), even, torch.float32)


@pytest.mark.parametrize("name", ["int8_e8m23b121_t0d1", "int4_e8m23b125_t0d1", "int4_e5m10b13_t32d1",
                                  "int8_e8m23b121_t32d1", "int3_e8m23b126_t0d1", "e4m3fn_e5m10_t0d1",
                                  "e4m3fn_float32_t32d1"])  # fmt: skip
@pytest.mark.parametrize("source", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_an_actual_cast_writes_the_codes_and_scales_of_the_value_path(
    name: str, source: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scaled integer and FP8 casts (per channel and per block, rows with NaN and Inf) store the
    same codes and scales with the shortcut as through values and `encode`, and never touch their
    input."""
    from tcast import _torchcast

    generator = torch.Generator().manual_seed(3)
    x = (torch.randn(24, 256, generator=generator, dtype=torch.float64) * torch.rand(24, 1, generator=generator,
         dtype=torch.float64) * 3).to(source)  # fmt: skip
    x[3, 7], x[5, 100], x[6, 0], x[7, 40] = math.nan, math.inf, -math.inf, -0.0
    kept = x.clone()
    element, _, scale = name.partition("_")
    datatype = tcast.datatype(element, scale)
    direct = tcast.cast(x, datatype, castmode="actual")
    monkeypatch.setattr(_torchcast, "direct_codes", lambda *_: False)
    through_values = tcast.cast(x, datatype, castmode="actual")
    assert torch.equal(direct.unpacked_codes(), through_values.unpacked_codes())
    assert _same_bits(direct.scale_grid(), through_values.scale_grid())
    assert _same_bits(x, kept)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    storage = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.dtype.itemsize]
    return a.dtype == b.dtype and torch.equal(a.view(storage), b.view(storage))
