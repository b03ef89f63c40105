"""Predefined names: the reference project's spellings resolve to the formats they name, the
square-tile family casts as MX over regrouped blocks, and `tcast list` groups every name."""

from __future__ import annotations

import json

import pytest
import torch

import tcast

# A sample of the reference project's names (both of its branches) and the formats they name.
REFERENCE = {
    "binary8p4": ("e4m3b8inuz", None),
    "bf8n": ("e5m2b16fnuz", None),
    "e8m7": ("e8m7", None),
    "mxbf6": ("e3m2fnuz", "e8m0_t32"),
    "mxfp5e2": ("e2m2fnuz", "e8m0_t32"),
    "e4m3z_e": ("e4m3fnuz", "e8m0"),
    "uint4_fi32": ("uint4", "float16_int8_t32"),
    "uint4_f12i432": ("uint4", "e5m6_int4_t32"),
    "e2m1_f32": ("e2m1fnuz", "e5m3_t32"),
    "fp8n_Fc": ("e4m3fnuz", "float32_t0"),
    "int4_nc": ("int4", "e4m3fn_t0"),
    "uint8_bic": ("uint8", "bfloat16_int8_t0"),
    "mxfp6t16": ("e2m3fnuz", "e8m0_t16"),
    "mxint8t16s": ("int8", "e8m0_t16d-2_t16d-1"),
    "mxfp8s": ("e4m3fn", "e8m0_t32d-2_t32d-1"),
    "nvf4s": ("e2m1fnuz", "e4m3fn_t16d-2_t16d-1"),
    "bf8bt32s": ("e5m2", "bfloat16_t32d-2_t32d-1"),  # the reference defines 16x16; the name says 32
    "mx9": ("cb81ie_int9", "e8m0_t16s2"),
    "icb44fi3_e32s8": ("icb44fi_e3m2fnuz", "e8m0_t32s8"),
    "e2m1_e32s4o2": ("cb42fe0123_e3m2fnuz", "e8m0_t32s4"),
}


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_reference_names_resolve_to_the_formats_they_name(name: str) -> None:
    dtype = tcast.lookup(name)
    ncode, scode = REFERENCE[name]
    assert dtype.nspec == tcast.number(ncode)
    assert (dtype.sspec.code if dtype.sspec else None) == scode


@pytest.mark.parametrize(("name", "tile"), [("mxfp8s16", 16), ("mxfp4s", 32), ("mxint8t16s", 16)])
def test_square_tiles_are_mx_over_regrouped_blocks(name: str, tile: int) -> None:
    """A square tile shares one scale over tile x tile values: the same cast as a 1-D tile of
    tile**2 over the blocks laid out as rows (lengths that are not multiples are padded)."""
    generator = torch.Generator().manual_seed(tile)
    x = torch.randn(3, 2 * tile + 5, 3 * tile, generator=generator)
    x *= torch.exp2(torch.randint(-8, 8, x.shape[:2], generator=generator).float())[..., None]
    dtype = tcast.lookup(name)
    flat = tcast.datatype(dtype.nspec, f"e8m0_t{tile * tile}")
    rows = -(-x.shape[1] // tile) * tile
    padded = torch.nn.functional.pad(x, (0, 0, 0, rows - x.shape[1]))
    blocks = padded.reshape(3, rows // tile, tile, 3, tile).permute(0, 1, 3, 2, 4).reshape(-1, tile * tile)
    expected = tcast.cast(blocks, flat).reshape(3, rows // tile, 3, tile, tile).permute(0, 1, 3, 2, 4)
    expected = expected.reshape(3, rows, 3 * tile)[:, : x.shape[1]]
    assert torch.equal(tcast.cast(x, dtype), expected)
    t = tcast.cast(x, dtype, castmode="actual")
    assert torch.equal(tcast.upcast(t), expected)


def test_list_groups_every_name(tcast_cli) -> None:  # type: ignore[no-untyped-def]
    rows = json.loads(tcast_cli("list", "--json").stdout)
    assert len(rows) == len(tcast.PREDEFINED)
    groups = {r["name"]: r["group"] for r in rows}
    assert groups["nvfp4"] == "two-level (tile + tensor)"
    assert groups["mxfp8e4"] == "power-of-two scale per tile"
    assert groups["mxfp8s"] == "power-of-two scale per 2-D tile"
    assert groups["fp8_1x128"] == "float scale per tile"
    assert groups["binary8p3"] == "unscaled (P3109)"
    assert groups["mx6"] == "codebook"
    assert groups["uint8_ffc"] == "asymmetric (scale + zero point)"
    upper = json.loads(tcast_cli("list", "--filter", "FP8_F", "--json").stdout)
    assert {"fp8_F", "fp8_f", "fp8_Fc", "fp8_fc"} <= {r["name"] for r in upper}


def test_inspect_describes_codebooks_and_p3109(tcast_cli) -> None:  # type: ignore[no-untyped-def]
    mx9 = json.loads(tcast_cli("inspect", "mx9", "--json").stdout)
    assert mx9["element"]["kind"] == "codebook" and mx9["element"]["meta_bits"] == 1
    assert mx9["bits_per_value"] == 9.0 and mx9["codes"] == []
    fi = json.loads(tcast_cli("inspect", "mxfi4", "--json").stdout)["element"]["entries"]
    assert fi[0] == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
    p3 = json.loads(tcast_cli("inspect", "binary8p3", "--json").stdout)
    kinds = {c["code"]: c["kind"] for c in p3["codes"]}
    assert kinds[0x80] == "nan" and kinds[0x7F] == kinds[0xFF] == "inf" and kinds[0] == "zero"
    assert p3["element"]["max"] == 49152.0
