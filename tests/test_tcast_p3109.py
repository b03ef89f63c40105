"""IEEE P3109 binary8p1..p7: every code against a plain reading of the format, and casts against
a brute-force nearest-value search over that table (ties to the even code)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import tcast


def p3109_value(code: int, precision: int) -> float:
    """The value of a binary8pP code, from the format's rule: 8 - P exponent bits with bias
    2**(7 - P), P - 1 trailing significand bits, subnormals at exponent field 0; 0x80 is the one
    NaN (there is no -0), 0x7F and 0xFF are +Inf and -Inf."""
    if code == 0x80:
        return math.nan
    if code & 0x7F == 0x7F:
        return -math.inf if code & 0x80 else math.inf
    trailing = precision - 1
    bias = 2 ** (7 - precision)
    field, fraction = (code & 0x7F) >> trailing, code & ((1 << trailing) - 1)
    if field == 0:
        magnitude = fraction * 2.0 ** (1 - bias - trailing)
    else:
        magnitude = (1 + fraction / 2**trailing) * 2.0 ** (field - bias)
    return -magnitude if code & 0x80 else magnitude


def nearest_codes(x: np.ndarray, precision: int) -> np.ndarray:
    """Round to nearest, ties to the even code, saturating finite values at the largest finite
    value; NaN -> 0x80, +-Inf -> +-Inf."""
    table = np.array([p3109_value(c, precision) for c in range(256)])
    finite = np.isfinite(table)
    codes = np.arange(256)[finite]
    values = table[finite]
    top = values.max()
    out = np.empty(x.shape, dtype=np.int64)
    for i, v in enumerate(x):
        if math.isnan(v):
            out[i] = 0x80
        elif math.isinf(v):
            out[i] = 0xFF if v < 0 else 0x7F
        else:
            v = min(max(v, -top), top)
            distance = np.abs(values - v)
            best = codes[distance == distance.min()]
            out[i] = best[0] if len(best) == 1 else best[best % 2 == 0][0]
    return out


@pytest.mark.parametrize("precision", range(1, 8))
def test_every_code_decodes_to_the_formats_value(precision: int) -> None:
    spec = tcast.number(f"binary8p{precision}")
    assert spec.bits == 8 and spec.mbits == precision - 1 and spec.has_inf and not spec.signed_zero
    t = tcast.cast(torch.zeros(256), f"binary8p{precision}", castmode="actual")
    decoded = tcast.decode(torch.arange(256, dtype=torch.uint8), spec, torch.float64).numpy()
    expected = np.array([p3109_value(c, precision) for c in range(256)])
    np.testing.assert_array_equal(decoded, expected)  # NaN where NaN, +-Inf where Inf
    finite = expected[np.isfinite(expected)]
    assert spec.max == finite.max() and spec.min == finite.min()
    assert t.codes.eq(0).all()  # +0 and -0 both encode as 0x00


@pytest.mark.parametrize("precision", range(1, 8))
def test_cast_is_the_nearest_value_ties_to_even_code(precision: int) -> None:
    name = f"binary8p{precision}"
    table = np.array([p3109_value(c, precision) for c in range(256)])
    finite = np.sort(table[np.isfinite(table)])
    midpoints = (finite[1:] + finite[:-1]) / 2  # every tie, exact in float64 and float32
    generator = torch.Generator().manual_seed(precision)
    spread = torch.exp2(torch.randint(-70, 70, (4000,), generator=generator).double())
    samples = torch.randn(4000, generator=generator, dtype=torch.float64) * spread
    corners = [0.0, -0.0, math.nan, math.inf, -math.inf, 1e300, -1e300, finite.max() * 1.0001]
    x = np.concatenate([midpoints, finite, samples.numpy(), corners])
    x = x[np.abs(x) < 3e38].astype(np.float32).astype(np.float64)  # values float32 holds
    x = np.concatenate([x, [math.inf, -math.inf, math.nan]])
    t = tcast.cast(torch.from_numpy(x).float(), name, castmode="actual")
    codes = tcast.unpack_codes(t.codes, 8, x.size).long().numpy()
    np.testing.assert_array_equal(codes, nearest_codes(x, precision))
    virtual = tcast.cast(torch.from_numpy(x).float(), name).double().numpy()
    np.testing.assert_array_equal(virtual, table[codes])


def test_scaled_p3109_round_trips() -> None:
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(3))
    x[0, 5] = math.inf
    dtype = tcast.datatype("binary8p4", "e8m0_t32")
    t = tcast.cast(x, dtype, castmode="actual")
    up, virtual = tcast.upcast(t), tcast.cast(x, dtype)
    assert torch.equal(torch.isnan(up), torch.isnan(virtual))
    assert torch.equal(up.nan_to_num(), virtual.nan_to_num())
    assert not tcast.supports(dtype).ok  # Triton leaves P3109's Inf/NaN codes to TorchCast
