"""NVFP4 (two-level float scales) and the FP8 float-scale recipes, against plain references.

The references below are written from the published rules, not from tcast's code: NVFP4 (NVIDIA's
two-level rule, as torchao states it) with ml_dtypes' e4m3 and e2m1 conversions, the FP8 recipes
as `x / scale` rounded by torch's float8 conversion. Both conversions take a float32: a quotient
rounded to float32 by nearest and then to 8 or 4 bits is rounded twice (`(x / s).to(fp8)` in float32
turns 42.0000016 into 42, then ties it to 40, where 44 is nearest), so the references hand them
the float64 quotient rounded to float32 *to odd*, which makes the second rounding the only one.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import tcast

E2M1_MAX, E4M3_MAX = 6.0, 448.0


def _to_odd_float32(q: np.ndarray) -> np.ndarray:
    """float64 -> float32 rounded to odd (toward zero, lowest bit set when inexact): a later
    rounding to a format of <= 22 bits then equals rounding `q` itself."""
    q = np.asarray(q, dtype=np.float64)
    f = q.astype(np.float32)
    beyond = np.abs(f.astype(np.float64)) > np.abs(q)
    f = np.where(beyond, np.nextafter(f, np.float32(0)), f).astype(np.float32)
    inexact = np.isfinite(q) & (f.astype(np.float64) != q)
    bits = f.view(np.uint32) | inexact.astype(np.uint32)
    return bits.view(np.float32)


def _nvfp4_reference(
    x: np.ndarray, given: np.float32 | None = None
) -> tuple[np.ndarray, np.ndarray, np.float32]:
    """NVFP4 of a [rows, 16k] float32 array: values, e4m3 block scales, the fp32 tensor scale.

    Tensor scale: `given`, else amax over the finite values / (6 * 448) in fp32 (1 for zeros). Block scale:
    block amax / tensor scale / 6, clamped to [2**-9, 448], to e4m3 by round-to-nearest-even (1 for
    a zero block, NaN for a block holding NaN or Inf). Elements: x / (e4m3 scale * tensor scale in
    fp32), clamped to +-6, to e2m1 by round-to-nearest-even; values: element * that product.
    """
    x64 = x.astype(np.float64)
    finite = np.isfinite(x64)
    amax = float(np.abs(np.where(finite, x64, 0.0)).max())
    tensor = np.float32(amax / (E2M1_MAX * E4M3_MAX)) if amax > 0 else np.float32(1.0)
    if given is not None:
        tensor = given
    blocks = x64.reshape(-1, 16)
    block_amax = np.abs(blocks).max(axis=1)
    raw = np.clip(block_amax / np.float64(tensor) / E2M1_MAX, 2.0**-9, E4M3_MAX)
    scales = _to_odd_float32(raw).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
    scales = np.where(block_amax > 0, scales, 1.0)
    scales = np.where(np.isfinite(block_amax), scales, np.nan)
    effective = (scales.astype(np.float32) * tensor).astype(np.float64)  # fp32 product
    quotient = np.clip(blocks / effective[:, None], -E2M1_MAX, E2M1_MAX)
    elements = _to_odd_float32(quotient).astype(ml_dtypes.float4_e2m1fn).astype(np.float64)
    values = (elements * effective[:, None]).astype(np.float32)
    return values.reshape(x.shape), scales.astype(np.float32), tensor


def _heavy_tailed(rows: int, cols: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g) * torch.exp(2 * torch.randn(rows, 1, generator=g))
    x[torch.rand(rows, cols, generator=g) < 0.002] *= 50.0  # outliers
    x[0, :16] = 0.0  # a zero block
    x[1, 16:32] *= 1e-6  # a block far below the tensor's amax (its scale goes subnormal)
    return x


def test_nvfp4_matches_the_published_two_level_rule_bit_for_bit() -> None:
    x = _heavy_tailed(96, 256, 0)
    values, scales, tensor = _nvfp4_reference(x.numpy())
    t = tcast.cast(x, "nvfp4", castmode="actual")
    assert t.tensor_scale is not None and t.tensor_scale.item() == tensor
    assert t.scales is not None and t.scales.dtype == torch.float8_e4m3fn
    assert np.array_equal(t.scales.float().numpy(), scales)
    assert (t.scales.float() < 2.0**-6).any()  # the subnormal e4m3 scales were exercised
    virtual = tcast.cast(x, "nvfp4")
    assert np.array_equal(virtual.numpy(), values)
    assert torch.equal(tcast.upcast(t), virtual)
    assert t.bits_per_value == 4.5 + 32 / x.numel()  # and 4 bytes of tensor scale
    # every finite e2m1 code is used
    assert len(torch.unique(t.unpacked_codes())) == 15  # all but 0b1000, fnuz's NaN


def test_nvfp4_corner_cases() -> None:
    # golden: amax 2688 = 6 * 448 gives a tensor scale of exactly 1, a block scale of 448
    x = torch.zeros(2, 32)
    x[0, 0], x[0, 1], x[0, 2] = (
        2688.0,
        1000.0,
        -448.0 * 1.25,
    )  # 1000 / 448 = 2.23 -> 2; -1.25 -> -1 (tie to even)
    x[1, :16] = torch.tensor([6.0, 0.25, 0.75, 5.0] + [0.0] * 12)  # block amax 6 -> scale 1/... in fp32
    t = tcast.cast(x, "nvfp4", castmode="actual")
    assert t.tensor_scale.item() == 1.0 and t.scales.float()[0].item() == 448.0
    y = tcast.upcast(t)
    assert y[0, :3].tolist() == [2688.0, 896.0, -448.0]
    # block of [6, 0.25, 0.75, 5] under tensor scale 1: block scale 1 -> 0.25 ties to 0, 0.75 to 1, 5 to 4
    assert t.scales.float()[2].item() == 1.0 and y[1, :4].tolist() == [6.0, 0.0, 1.0, 4.0]
    assert t.scales.float()[1].item() == 1.0 and t.scales.float()[3].item() == 1.0  # zero blocks
    # zeros only: tensor scale 1, zeros back
    z = tcast.cast(torch.zeros(4, 16), "nvfp4", castmode="actual")
    assert z.tensor_scale.item() == 1.0 and torch.equal(tcast.upcast(z), torch.zeros(4, 16))
    # NaN and Inf: their block is NaN, the tensor scale comes from the finite values
    w = torch.linspace(-3, 3, 64).reshape(2, 32)
    w[0, 3], w[1, 20] = math.nan, math.inf
    t = tcast.cast(w, "nvfp4", castmode="actual")
    values, _, tensor = _nvfp4_reference(w.numpy())
    assert t.tensor_scale.item() == tensor == np.float32(3.0 / 2688.0)
    y = tcast.upcast(t)
    assert torch.isnan(y[0, :16]).all() and torch.isnan(y[1, 16:]).all()
    assert torch.isfinite(y[0, 16:]).all() and torch.equal(y[0, 16:], torch.from_numpy(values[0, 16:]))
    # bf16 and fp16 inputs: upcast equals the virtual cast, and the rule is the same on their values
    for dtype in (torch.bfloat16, torch.float16):
        v = _heavy_tailed(16, 64, 1).to(dtype)
        t = tcast.cast(v, "nvfp4", castmode="actual")
        assert torch.equal(tcast.upcast(t), tcast.cast(v, "nvfp4"))
        ref, _, _ = _nvfp4_reference(v.float().numpy())
        assert np.array_equal(tcast.cast(v, "nvfp4", out_dtype=torch.float32).numpy(), ref)


def test_nvfp4_under_a_given_tensor_scale_follows_the_published_rule() -> None:
    """A calibrated tensor scale replaces the amax one: blocks far above it saturate at
    448 * 6 * scale, the rest follow the same rule; upcast gives the virtual cast back."""
    x = _heavy_tailed(64, 256, 5)
    own = tcast.cast(x, "nvfp4", castmode="actual").tensor_scale.item()
    for given in (np.float32(own), np.float32(own / 7.3), np.float32(own * 3.1)):
        values, scales, _ = _nvfp4_reference(x.numpy(), given)
        t = tcast.cast(x, "nvfp4", castmode="actual", tensor_scale=float(given))
        assert t.tensor_scale.item() == given
        assert np.array_equal(t.scales.float().numpy(), scales)
        virtual = tcast.cast(x, "nvfp4", tensor_scale=torch.tensor(given))
        assert np.array_equal(virtual.numpy(), values)
        assert torch.equal(tcast.upcast(t), virtual)
    small = np.float32(own / 7.3)
    assert (
        tcast.cast(x, "nvfp4", tensor_scale=float(small)).abs().max() == np.float32(448 * 6 * small)
    ).item()
    # the given scale is rounded into float32 the way torch rounds a float64
    t = tcast.cast(x, "nvfp4", castmode="actual", tensor_scale=0.1)
    assert t.tensor_scale.item() == np.float32(0.1)


def test_fp8_per_tensor_under_a_given_scale_is_x_over_scale_element_by_element() -> None:
    """fp8_F with a caller's scale: every element is x / scale by torch's float8 conversion
    (saturating at +-448, Inf too), a NaN stays a NaN without touching its neighbours."""
    x = _heavy_tailed(64, 96, 6)
    x[3, 4], x[5, 6], x[7, 8] = math.nan, math.inf, -math.inf
    scale = 0.0123
    s32 = float(np.float32(scale))
    quotient = torch.from_numpy(_to_odd_float32((x.double() / s32).clamp(-448, 448).numpy()))
    expected = (quotient.to(torch.float8_e4m3fn).double() * s32).float()
    got = tcast.cast(x, "fp8_F", tensor_scale=scale)
    assert torch.equal(torch.isnan(got), torch.isnan(x)) and torch.isnan(got).sum() == 1
    assert torch.equal(got.nan_to_num(), expected.nan_to_num())
    assert got[5, 6].item() == float(np.float32(448 * s32)) and got[7, 8].item() == -got[5, 6].item()
    t = tcast.cast(x, "fp8_F", castmode="actual", tensor_scale=scale)
    assert t.scales.tolist() == [s32] and torch.equal(tcast.upcast(t).nan_to_num(), expected.nan_to_num())


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("mxfp8e4", 1.0, "no float scale per tensor"),
        ("fp8_Fc", 1.0, "no float scale per tensor"),
        ("nvf4", 1.0, "no float scale per tensor"),
        ("e4m3fn", 1.0, "no float scale per tensor"),
        ("nvfp4", 0.0, "positive finite"),
        ("nvfp4", -2.0, "positive finite"),
        ("fp8_F", math.nan, "positive finite"),
        ("fp8_F", 1e39, "positive finite"),  # beyond float32: Inf once rounded
        ("nvfp4", [1.0, 2.0], "one value per tensor"),
    ],
)
def test_a_given_tensor_scale_is_refused_where_it_has_no_meaning(
    name: str, value: object, message: str
) -> None:
    x = torch.randn(4, 32)
    with pytest.raises(ValueError, match=message):
        tcast.cast(x, name, tensor_scale=value)


def test_nvfp4_beats_mxfp4_on_heavy_tailed_data() -> None:
    x = _heavy_tailed(256, 512, 2)
    nv = tcast.snr_db(*tcast.energies(x, tcast.cast(x, "nvfp4")))
    mx = tcast.snr_db(*tcast.energies(x, tcast.cast(x, "mxfp4e2")))
    assert nv > mx + 1.0, (nv, mx)


def _fp8_reference(x: torch.Tensor, name: str) -> torch.Tensor:
    """A float32 scale of amax / fp8 max (1 for zeros) per tensor, row, 1x128 tile or 128x128
    block, rounded to nearest; then x / scale by torch's float8 conversion, times the scale."""
    element = torch.float8_e4m3fn if name.startswith("fp8") else torch.float8_e5m2
    fmax = torch.finfo(element).max
    rows, cols = x.shape
    tile_rows, tile_cols = {"F": (rows, cols), "Fc": (1, cols), "1x128": (1, 128), "128x128": (128, 128)}[
        name.split("_", 1)[1]
    ]
    out = torch.empty_like(x)
    for r in range(0, rows, tile_rows):
        for c in range(0, cols, tile_cols):
            block = x[r : r + tile_rows, c : c + tile_cols].double()
            amax = float(block.abs().max())
            scale = torch.tensor(amax / fmax if amax > 0 else 1.0, dtype=torch.float64).float().double()
            quotient = torch.from_numpy(_to_odd_float32((block / scale).clamp(-fmax, fmax).numpy()))
            out[r : r + tile_rows, c : c + tile_cols] = (quotient.to(element).double() * scale).float()
    return out


@pytest.mark.parametrize(
    "recipe", ["fp8_F", "fp8_Fc", "fp8_1x128", "fp8_128x128", "bf8_1x128", "bf8_128x128"]
)
def test_fp8_float_scale_recipes_match_x_over_scale(recipe: str) -> None:
    x = _heavy_tailed(256, 384, 3)
    expected = _fp8_reference(x, recipe)
    assert torch.equal(tcast.cast(x, recipe), expected)
    t = tcast.cast(x, recipe, castmode="actual")
    assert torch.equal(tcast.upcast(t), expected)
    assert t.scales is not None and t.scales.dtype == torch.float32
    if recipe.endswith("128x128"):
        assert t.scale_grid().shape == (2, 3)
    bf16 = x.bfloat16()
    assert torch.equal(
        tcast.cast(bf16, recipe, out_dtype=torch.float32), _fp8_reference(bf16.float(), recipe)
    )


def test_fp8_rounds_once_where_float32_division_rounds_twice() -> None:
    """The near-ties the float32 quotient gets wrong: values at a simple fraction of their tile's
    amax sit on an fp8 midpoint but for the scale's own rounding (here -0.4453125 / (4.75 / 448))."""
    x = _heavy_tailed(256, 384, 3).bfloat16().float()
    t = tcast.cast(x, "fp8_1x128", castmode="actual")
    scale = t.scale_grid().repeat_interleave(128, dim=1)
    twice = (x / scale).to(torch.float8_e4m3fn).float()  # elements, rounded twice
    ours = t.unpacked_codes().view(torch.float8_e4m3fn).float()  # elements, rounded once
    differ = ours != twice
    assert 0 < int(differ.sum()) < x.numel() // 500
    exact = x.double() / scale.double()
    assert ((ours.double() - exact).abs() < (twice.double() - exact).abs())[differ].all()


def test_names_are_case_sensitive_where_the_reference_is() -> None:
    assert tcast.lookup("fp8_F").sspec.code == "float32" and tcast.lookup("fp8_f").sspec.code == "float16"
    assert tcast.lookup("NVFP4").name == "nvfp4" and tcast.lookup("MXFP4").name == "mxfp4e2"
    assert tcast.lookup("nvf4").sspec.tensor_scale is None  # the reference's one-level type
    with pytest.raises(ValueError, match="tensor scale"):
        tcast.ScaleSpec("e8m0_t32+float32")


def test_nvfp4_file_round_trip(tmp_path: Path, tcast_cli) -> None:  # type: ignore[no-untyped-def]
    doc = json.loads(tcast_cli("inspect", "nvfp4", "--json").stdout)
    assert doc["bits_per_value"] == 4.5 and "per tensor" in doc["scale"] and len(doc["codes"]) == 16
    weights, packed, restored = (tmp_path / n for n in ("w.safetensors", "p.safetensors", "r.safetensors"))
    w = _heavy_tailed(64, 96, 4)
    save_file({"w": w}, str(weights))
    assert tcast_cli("cast", weights, "--dtype", "nvfp4", "--mode", "actual", "-o", packed).exit_code == 0
    stored = load_file(str(packed))
    assert stored["w.tensor_scale"].dtype == torch.float32 and stored["w.scales"].dtype == torch.float8_e4m3fn
    assert tcast_cli("upcast", packed, "-o", restored).exit_code == 0
    assert torch.equal(load_file(str(restored))["w"], tcast.cast(w, "nvfp4"))
