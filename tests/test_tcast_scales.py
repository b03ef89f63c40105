"""Scale rules, float-scaled elements, OCP FP6/FP4 elements, any tile size, and codes in the
tensor's own layout - each against an independent reference (torch's own conversions, ml_dtypes,
exact float64 arithmetic)."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch

import tcast
from tcast._codes import decode

GENERATOR_SEED = 11


def _data(shape: tuple[int, ...], seed: int = GENERATOR_SEED) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=generator)
    rows = torch.exp2(
        torch.randint(-12, 12, (shape[0],) + (1,) * (len(shape) - 1), generator=generator).float()
    )
    return x * rows


def _float_scale_reference(amax: torch.Tensor, fmax: float, storage: torch.dtype, ceil: bool) -> torch.Tensor:
    """amax / fmax in the storage dtype: to nearest, or the smallest storage value >= it."""
    raw = (amax.double() / fmax).clamp(
        min=torch.finfo(storage).smallest_normal * 2.0**-10, max=torch.finfo(storage).max
    )
    stored = raw.to(storage)
    if ceil:
        low = stored.double() < raw
        stored = torch.where(low, torch.nextafter(stored, torch.tensor(math.inf, dtype=storage)), stored)
    return torch.where(amax > 0, stored.double(), torch.ones_like(raw))


@pytest.mark.parametrize("mode", ["max", "ceil"])
@pytest.mark.parametrize(
    ("element", "torch_fp8"), [("e4m3fn", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)]
)
@pytest.mark.parametrize("scale", ["float16", "bfloat16", "float32"])
def test_fp8_with_float_channel_scales_is_x_over_scale_rounded_by_torch(
    element: str, torch_fp8: torch.dtype, scale: str, mode: str
) -> None:
    x = _data((48, 96))
    t = tcast.cast(x, tcast.datatype(element, f"{scale}_t0"), castmode="actual", scalemode=mode)
    storage = getattr(torch, scale)
    fmax = float(torch.finfo(torch_fp8).max)
    expected_scale = _float_scale_reference(x.abs().amax(1, keepdim=True), fmax, storage, mode == "ceil")
    scales = t.scale_grid()
    assert scales.shape == (48, 1) and scales.dtype == storage
    assert torch.equal(scales.double(), expected_scale)
    # the element: x / scale (exact in float64), saturated, rounded by torch's own fp8 conversion
    quotient = (x.double() / expected_scale).clamp(-fmax, fmax)
    expected_codes = quotient.to(torch_fp8).view(torch.uint8).to(torch.int64)
    assert torch.equal(t.unpacked_codes(), expected_codes)
    if mode == "ceil":  # nothing saturates: every quotient already lies within the format
        assert float((x.double() / expected_scale).abs().max()) <= fmax
    assert torch.equal(tcast.upcast(t), tcast.cast(x, tcast.datatype(element, f"{scale}_t0"), scalemode=mode))


def test_float_scales_are_never_zero_or_infinite_and_nan_for_nan_blocks() -> None:
    amax = torch.tensor([0.0, 1e-30, 1e30, 3.0, math.nan, math.inf], dtype=torch.float64)
    element, fp16 = tcast.number("e4m3fn"), tcast.number("float16")
    scales = tcast.float_scales(amax, element, fp16)
    assert scales[0] == 1.0  # an all-zero block: any scale works
    assert scales[1] == 2.0**-24  # fp16's smallest subnormal, not zero (which would make the block NaN)
    assert scales[2] == 65504.0  # fp16's max, not inf
    assert scales[3] == np.float16(3.0 / 448)
    assert torch.isnan(scales[4]) and torch.isnan(scales[5])
    up = tcast.float_scales(amax, element, fp16, tcast.ScaleMode.CEIL)
    assert up[3] == np.nextafter(np.float16(3.0 / 448), np.float16(1)) and up[3] * 448 >= 3.0


def test_exponent_scales_follow_ocp_mx() -> None:
    amax = torch.tensor([0.0, 1.0, 6.0, 6.5, 1e-40, 2.0**130, math.nan], dtype=torch.float64)
    e2m1, e8m0 = tcast.number("e2m1ocp"), tcast.number("e8m0")
    exponents = tcast.exponent_scales(amax, e2m1, e8m0)
    # floor(log2(amax)) - emax (2 for e2m1), clamped to E8M0's range; zero blocks as microxcaling
    assert exponents[:6].tolist() == [-128.0 + 1, -2.0, 0.0, 0.0, -127.0, 127.0]
    assert torch.isnan(exponents[6])
    ceil = tcast.exponent_scales(amax, e2m1, e8m0, tcast.ScaleMode.CEIL)
    assert ceil[3].item() == 1.0  # 6.5 / 2**0 saturates at 6: one power of two up
    assert (
        tcast.exponent_codes(exponents, e8m0).tolist()[:3] == [0, 125, 127]
        and tcast.exponent_codes(exponents, e8m0)[6] == 255
    )


@pytest.mark.parametrize(("code", "reference"), [
    ("e2m1ocp", ml_dtypes.float4_e2m1fn), ("e2m3ocp", ml_dtypes.float6_e2m3fn), ("e3m2ocp", ml_dtypes.float6_e3m2fn),
])  # fmt: skip
def test_ocp_elements_are_ml_dtypes_bit_for_bit(code: str, reference: type) -> None:
    generator = torch.Generator().manual_seed(3)
    x = torch.cat([
        torch.linspace(-40, 40, 40001), torch.randn(4096, generator=generator) * 1e-3,
        torch.tensor([math.nan, math.inf, -math.inf, -0.0, 0.0, 1e-40, -1e-40]),
    ])  # fmt: skip
    expected = torch.from_numpy(x.numpy().astype(reference).view(np.uint8).astype(np.int64))
    for source in (torch.float32, torch.float64):  # the fast path and the general one
        t = tcast.cast(x.to(source), code, castmode="actual")
        assert torch.equal(t.unpacked_codes(), expected)
        values = tcast.cast(x.to(source), code).float()
        assert torch.equal(
            values.view(torch.int32),
            torch.from_numpy(x.numpy().astype(reference).astype(np.float32)).view(torch.int32),
        )


def test_mx_with_ocp_elements_keeps_negative_zero_and_nan_blocks() -> None:
    x = torch.tensor([[-0.01, 0.3, -4.0, 6.0] * 8, [math.nan] + [1.0] * 31])
    t = tcast.cast(x, tcast.datatype("e2m1ocp", "e8m0_t32"), castmode="actual")
    codes = t.unpacked_codes()
    assert codes[0, 0] == 8  # -0.01 rounds to -0 at this scale: OCP keeps the sign
    assert t.scale_grid()[1, 0] == 255  # a block holding NaN gets the NaN scale
    assert torch.isnan(tcast.upcast(t)[1]).all()


@pytest.mark.parametrize("scale", ["float32", "float16"])
def test_int8_with_float_scales_rounds_the_exact_quotient(scale: str) -> None:
    x = _data((32, 200))
    t = tcast.cast(x, tcast.datatype("int8", f"{scale}_t0"), castmode="actual")
    s = t.scale_grid().double()
    assert torch.equal(
        s, _float_scale_reference(x.abs().amax(1, keepdim=True), 127 / 64, getattr(torch, scale), False)
    )
    # int8 is fixed point (step 2**-6 at unit scale): the integer is round(x / s * 64), ties to even
    expected = torch.round(x.double() / s * 64).clamp(-127, 127).to(torch.int64) & 0xFF
    assert torch.equal(t.unpacked_codes(), expected)


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor:UserWarning")
def test_uint8_with_an_integer_zero_point_rounds_like_torch_quantize() -> None:
    """round(x / scale) + zero point, then clamp: PyTorch's convention (not round(x / scale + zero))."""
    x = _data((16, 64)) + 0.5
    t = tcast.cast(x, tcast.datatype("uint8", "float32_int8_t0"), castmode="actual")
    scales, zeros = t.scale_grid().double(), t.zero_grid().double()
    expected = (torch.round(x.double() / scales) + zeros).clamp(0, 255).to(torch.int64)
    assert torch.equal(t.unpacked_codes(), expected)
    # torch.quantize_per_channel multiplies by a float32 reciprocal; away from its rounding ties
    # it gives the same integers
    q = torch.quantize_per_channel(x, scales.reshape(-1).float(), zeros.reshape(-1).long(), 0, torch.quint8)
    close_to_tie = ((x.double() / scales).frac().abs() - 0.5).abs() < 1e-4
    assert torch.equal(q.int_repr().to(torch.int64)[~close_to_tie], expected[~close_to_tie])


@pytest.mark.parametrize("tile", [3, 33, 48, 100])
def test_any_tile_size_along_any_dim(tile: int) -> None:
    x = _data((4, 99, 7))
    dtype = tcast.datatype("e4m3fn", f"e8m0_t{tile}d1")
    t = tcast.cast(x, dtype, castmode="actual")
    blocks = -(-99 // tile)
    assert t.scale_grid().shape == (4, blocks, 7)
    # a reference by hand: each block of `tile` values along dim 1 shares floor(log2(amax)) - 8
    values = tcast.upcast(t)
    for b in range(blocks):
        part = x[:, b * tile : (b + 1) * tile, :]
        exponent = torch.floor(torch.log2(part.abs().amax(1, keepdim=True))) - 8
        scaled = (part / torch.exp2(exponent)).clamp(-448, 448).to(torch.float8_e4m3fn).float()
        assert torch.equal(values[:, b * tile : (b + 1) * tile, :], scaled * torch.exp2(exponent))
    assert torch.equal(values, tcast.cast(x, dtype))


def test_codes_and_scale_grid_decode_to_the_upcast() -> None:
    x = _data((6, 64, 3, 3))
    dtype = tcast.datatype("int4", "float16_t16d1")
    t = tcast.cast(x, dtype, castmode="actual")
    codes, scales = t.unpacked_codes(), t.scale_grid()
    assert codes.shape == x.shape and scales.shape == (6, 4, 3, 3)
    elements = decode(codes, dtype.nspec, torch.float64)
    dense = elements * scales.double().repeat_interleave(16, dim=1)
    assert torch.equal(dense.to(x.dtype), tcast.upcast(t))


def test_float64_inputs_cast_like_float32_ones_on_the_same_values() -> None:
    x = _data((8, 64))
    for name in ("mxfp8e4", "mxint8", "e4m3fn", "int8_f"):
        assert torch.equal(tcast.cast(x.double(), name).float(), tcast.cast(x, name))


def test_snr_db_is_one_definition() -> None:
    assert tcast.snr_db(100.0, 1.0) == 20.0
    assert tcast.snr_db(1.0, 0.0) == math.inf and tcast.snr_db(0.0, 1.0) == -math.inf
    x = torch.tensor([3.0, 4.0])
    assert tcast.sqnr_db(x, x + torch.tensor([0.3, 0.4])) == pytest.approx(20.0)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype.itemsize == 1 else t


GIVEN = ("mxfp4e2", "mxfp8e4", "mxint8", "fp8_1x128", "int8_fc", "uint4_ffc", "uint8_fic", "fp8_F")


@pytest.mark.parametrize("name", GIVEN)
def test_a_cast_under_its_own_scales_gives_its_own_codes(name: str) -> None:
    """Given the scales (and zero points) a cast chose, the cast reproduces itself bit for bit; given
    another tensor, it rounds that tensor to the same fixed grid."""
    x = torch.randn(8, 256, generator=torch.Generator().manual_seed(3)) * 3
    first = tcast.cast(x, name, castmode="actual", computemode="torch")
    again = tcast.cast(x, name, castmode="actual", computemode="torch", scales=first.scale_grid(),
                       zero_points=first.zero_grid())  # fmt: skip
    assert torch.equal(again.codes, first.codes) and torch.equal(
        again.scales.view(torch.uint8) if again.scales.dtype.itemsize == 1 else again.scales,
        first.scales.view(torch.uint8) if first.scales.dtype.itemsize == 1 else first.scales,
    )
    virtual = tcast.cast(
        x, name, computemode="torch", scales=first.scale_grid(), zero_points=first.zero_grid()
    )
    assert torch.equal(virtual, tcast.upcast(first, x.dtype))
    other = x.flip(1)  # other values on the same grid: every value is on it (or clipped to its range)
    moved = tcast.cast(
        other, name, computemode="torch", scales=first.scale_grid(), zero_points=first.zero_grid()
    )
    grid_values = tcast.cast(
        moved, name, computemode="torch", scales=first.scale_grid(), zero_points=first.zero_grid()
    )
    assert torch.equal(moved, grid_values)


def test_given_scales_are_checked() -> None:
    x = torch.randn(4, 64)
    t = tcast.cast(x, "int8_fc", castmode="actual", computemode="torch")
    with pytest.raises(ValueError, match="do not fit the tiles"):
        tcast.cast(x, "int8_fc", scales=torch.ones(3, 1))
    with pytest.raises(ValueError, match="positive and finite"):
        tcast.cast(x, "int8_fc", scales=torch.zeros_like(t.scale_grid()))
    with pytest.raises(ValueError, match="values of"):
        tcast.cast(x, "int8_fc", scales=t.scale_grid().double() * (1 + 2**-20))
    u = tcast.cast(x, "uint4_ffc", castmode="actual", computemode="torch")
    with pytest.raises(ValueError, match="computemode triton cannot cast to uint4_ffc under given scales"):
        tcast.cast(x, "uint4_ffc", scales=u.scale_grid(), zero_points=u.zero_grid(), computemode="triton")
