"""DataType (a number format plus an optional scale) and the predefined types."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from ._formats import number
from ._number import InfNaN, NumberSpec
from ._scale import ScaleSpec, scale


@dataclass(frozen=True)
class DataType:
    nspec: NumberSpec
    sspec: ScaleSpec | None = None
    name: str = ""

    def __init__(self, nspec: Any, sspec: Any = None, name: str | None = None) -> None:
        n = number(nspec)
        s = scale(sspec) if sspec is not None else None
        if s is not None and s.subtile and not n.is_codebook:
            raise ValueError(f"subtiles choose codebook tables; {n.code} is not a codebook")
        if n.is_codebook:
            if s is not None and (s.zero is not None or s.tensor_scale is not None):
                raise ValueError(f"codebook {n.code} takes one exponent or float scale, not {s.code}")
        elif s is not None:
            if n.is_exponent:
                raise ValueError(f"exponent format {n.code} cannot be scaled")
            if n.is_uint and s.is_exponent:
                raise ValueError(f"unsigned {n.code} needs a float scale, not {s.scale.code}")
            if n.is_uint and s.zero is None:
                raise ValueError(f"unsigned {n.code} needs a zero point in its scale spec")
            if not n.is_uint and s.zero is not None:
                raise ValueError(f"only unsigned formats take a zero point, not {n.code}")
        elif n.is_uint or (n.is_int and n.bits < 16):
            raise ValueError(f"{n.code} needs a scale spec (unscaled integers are not supported)")
        object.__setattr__(self, "nspec", n)
        object.__setattr__(self, "sspec", s)
        object.__setattr__(self, "name", name or (n.code + (f"_{s.code}" if s else "")))

    @property
    def is_tile(self) -> bool:
        return self.sspec is not None and self.sspec.is_tile

    @property
    def family(self) -> str:
        """The group `tcast list` shows this type in, read off its number and scale specs."""
        nspec, sspec = self.nspec, self.sspec
        if nspec.is_codebook:
            return "codebook"
        if sspec is None:
            return "unscaled (P3109)" if nspec.infnan is InfNaN.INUZ else "unscaled"
        if sspec.tensor_scale is not None:
            return "two-level (tile + tensor)"
        if nspec.is_uint:
            return "asymmetric (scale + zero point)"
        where = "tensor" if sspec.is_tensor else "channel" if sspec.is_channel else "tile"
        where = "2-D tile" if sspec.is_2d else where
        return f"{'power-of-two' if sspec.is_exponent else 'float'} scale per {where}"

    def bits_per_value(self) -> float | None:
        """Element bits plus the share of scale (and zero-point) bits; None where that depends on the tensor."""
        meta = self.nspec.meta_bits
        if self.sspec is None:
            return float(self.nspec.bits) if not meta else None
        per = self.sspec.elements_per_scale()
        if per is None:
            return None
        overhead = self.sspec.scale.bits + (self.sspec.zero.bits if self.sspec.zero else 0)
        return self.nspec.bits + overhead / per + meta / (self.sspec.subtile or per)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "element": self.nspec.describe(),
            "scale": self.sspec.describe() if self.sspec else "unscaled",
            "scale_code": self.sspec.code if self.sspec else None,
            "bits_per_value": self.bits_per_value(),
        }

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        scale_code = f", {self.sspec.code!r}" if self.sspec else ""
        return f"DataType({self.nspec.code!r}{scale_code}, name={self.name!r})"


def datatype(nspec: Any, sspec: Any = None, name: str | None = None) -> DataType:
    return DataType(nspec, sspec, name)


def _table() -> dict[str, tuple[str, str | None]]:
    """name -> (number code, scale code). Plain data: building it costs nothing."""
    table = _unscaled_names()
    table.update(_tile_names())
    table.update(_float_scaled_names())
    table.update(_reference_names())
    return table


def _unscaled_names() -> dict[str, tuple[str, str | None]]:
    """Unscaled types (torch's float dtypes, small fnuz floats, IEEE P3109): no scale spec."""
    return {
        "float32": ("float32", None),
        "float16": ("float16", None),
        "bfloat16": ("bfloat16", None),
        "float8_e5m2": ("e5m2", None),
        "float8_e4m3fn": ("e4m3fn", None),
        "float8_e5m2fnuz": ("e5m2b16fnuz", None),
        "float8_e4m3fnuz": ("e4m3b8fnuz", None),
        "e3m2fnuz": ("e3m2fnuz", None),
        "e2m3fnuz": ("e2m3fnuz", None),
        "e2m1fnuz": ("e2m1fnuz", None),
        # IEEE P3109 8-bit formats (one NaN, no -0, +-Inf at the all-ones magnitude)
        **{f"binary8p{p}": (f"binary8p{p}", None) for p in range(1, 8)},
    }


def _tile_names() -> dict[str, tuple[str, str | None]]:
    """Tile-scaled types: OCP MX, block floating point, MSFP, codebooks over subtiles, NVIDIA's FP4."""
    table: dict[str, tuple[str, str | None]] = {
        # tile scaled, OCP MX and block floating point
        "mxfp8e5": ("e5m2", "e8m0_t32"),
        "mxfp8e4": ("e4m3fn", "e8m0_t32"),
        "mxfp6e3": ("e3m2fnuz", "e8m0_t32"),
        "mxfp6e2": ("e2m3fnuz", "e8m0_t32"),
        "mxfp4e2": ("e2m1fnuz", "e8m0_t32"),
        "mxint8": ("int8", "e8m0_t32"),
        "mxint4": ("int4", "e8m0_t32"),
        "bfp16": ("int8", "e8m0_t8"),
    }
    # MSFP MX9 / MX6 / MX4 (BFP prime): a power-of-two scale per 16 values and one shared
    # micro-exponent bit per pair, as codebooks of the int8/int5/int3 grid and its half
    table["mx9"] = ("cb81ie_int9", "e8m0_t16s2")
    table["mx6"] = ("cb51ie_int7", "e8m0_t16s2")
    table["mx4"] = ("cb31ie_int5", "e8m0_t16s2")
    # implicit codebooks over tiles and subtiles (the reference project's examples)
    table["mxfi4"] = ("cb41fi_e2m2fnuz", "e8m0_t32s4")
    table["mxfp4m"] = ("cb41f01_e2m2fnuz", "e8m0_t32s4")
    table["mxfp4e"] = ("cb42fe0123_e3m2fnuz", "e8m0_t32s8")
    table["mxfp4f4"] = ("cb42f1346_e2m3fnuz", "e8m0_t32s8")
    # NVFP4: e2m1 values, an e4m3 scale per 16 of them, an fp32 scale per tensor over those
    table["nvfp4"] = ("e2m1fnuz", "e4m3fn_t16+float32")
    # one level only: e4m3 scales per 16 values (the reference project's nv* family)
    for name, code in (("nvf4", "e2m1fnuz"), ("nvf6", "e2m3fnuz"), ("nvb6", "e3m2fnuz"), ("nvf8", "e4m3fn"),
                       ("nvb8", "e5m2")):  # fmt: skip
        table[name] = (code, "e4m3fn_t16")
    return table


def _float_scaled_names() -> dict[str, tuple[str, str | None]]:
    """Types scaled per tensor, channel or block: FP8 recipes, integers (uint with zero points) and
    small floats per tensor, float-scaled integers on tiles of 32."""
    table: dict[str, tuple[str, str | None]] = {}
    # FP8 recipes with float32 scales: per tensor, per channel (row), 1x128 tiles, 128x128 blocks;
    # fp8 = e4m3fn, bf8 = e5m2; F/f/b = float32/float16/bfloat16 scales (the reference's names)
    for prefix, code in (("fp8", "e4m3fn"), ("bf8", "e5m2")):
        for letter, scode in (("F", "float32"), ("f", "float16"), ("b", "bfloat16")):
            table[f"{prefix}_{letter}"] = (code, scode)
            table[f"{prefix}_{letter}c"] = (code, f"{scode}_t0")
        table[f"{prefix}_1x128"] = (code, "float32_t128")
        table[f"{prefix}_128x128"] = (code, "float32_t128d-2_t128d-1")
    # tensor scaled: f = float16, b = bfloat16, e = exponent; uint zero points f/b float, i integer
    floats = {"f": "float16", "b": "bfloat16"}
    zeros = {"f": "float16", "b": "bfloat16"}
    for bits in (16, 8):
        for s, scode in floats.items():
            for z, zcode in (*zeros.items(), ("i", f"int{bits}")):
                table[f"uint{bits}_{s}{z}"] = (f"uint{bits}", f"{scode}_{zcode}")
        for s, scode in (*floats.items(), ("e", "e8m0")):
            table[f"int{bits}_{s}"] = (f"int{bits}", scode)
    for code in ("e5m2", "e4m3fn", "e3m2fnuz", "e2m3fnuz"):
        table[f"{code}_e"] = (code, "e8m0")
    # tile scaled integers with float scales, tile 32
    for bits in (8, 4):
        for s, scode in floats.items():
            for z, zcode in (*zeros.items(), ("i", f"int{bits}")):
                table[f"uint{bits}_{s}{z}_t32"] = (f"uint{bits}", f"{scode}_{zcode}_t32")
            table[f"int{bits}_{s}_t32"] = (f"int{bits}", f"{scode}_t32")
    return table


def _reference_names() -> dict[str, tuple[str, str | None]]:
    """The reference project's (ROCm TensorCast's) predefined names that ours did not spell yet.

    Letters of its scale families: F float32, f float16, b bfloat16, n e4m3fn, e e8m0 (a second
    letter, or `i` for int8, is the zero point's); `c` per channel; `s` square 2-D tiles (32x32,
    `s16` 16x16); fp8 e4m3fn, bf8 e5m2, fp8n/bf8n their fnuz forms. Its `bf8nbt32s` and `bf8bt32s`
    are defined with 16x16 tiles; ours follow the name (32x32). Its main branch's `_f32` names
    scale with e5m3 (a 9-bit float), `f12` with e5m6.
    """
    names: dict[str, tuple[str, str | None]] = {}
    # `e5m2fn` is its name for IEEE e5m2; ours is the fn format the name says (no Inf, all-ones NaN)
    for code in ("e5m2", "e5m2fn", "e5m2fnuz", "e5m2b16fnuz", "e4m3fn", "e4m3fnuz", "e4m3b8fnuz", "e3m3fnuz"):
        names[code] = (code, None)
    for name, code in (("e5m2z", "e5m2fnuz"), ("e4m3", "e4m3fn"), ("e4m3z", "e4m3fnuz"), ("e3m2", "e3m2fnuz"),
                       ("e2m3", "e2m3fnuz")):  # fmt: skip
        names[f"{name}_e"] = (code, "e8m0")
    names["mxfp5e2"] = ("e2m2fnuz", "e8m0_t32")
    for name, zero in (("ff", "float16_float16"), ("fi", "float16_int8"), ("bb", "bfloat16_bfloat16"),
                       ("bi", "bfloat16_int8"), ("f12i4", "e5m6_int4")):  # fmt: skip
        names[f"uint4_{name}32"] = ("uint4", f"{zero}_t32")
    names["int4_b32"] = ("int4", "bfloat16_t32")
    names["int4_f32"] = ("int4", "e5m3_t32")
    for name, code in (("e1m6b1", "e1m6b1fnuz"), ("e1m2b1", "e1m2b1fnuz")):
        names[f"{name}_e32"] = (code, "e8m0_t32")
    for name, code in (("e1m2b1", "e1m2b1fnuz"), ("e2m1", "e2m1fnuz"), ("e3m2", "e3m2fnuz"), ("e2m3", "e2m3fnuz"),
                       ("e4m3", "e4m3fn")):  # fmt: skip
        names[f"{name}_f32"] = (code, "e5m3_t32")
    scales = {"F": "float32", "f": "float16", "b": "bfloat16", "n": "e4m3fn", "e": "e8m0"}
    fp8 = {"fp8": "e4m3fn", "bf8": "e5m2", "fp8n": "e4m3fnuz", "bf8n": "e5m2fnuz"}
    for prefix, code in fp8.items():
        for letter, scode in scales.items():
            names[f"{prefix}_{letter}"] = (code, scode)
            names[f"{prefix}_{letter}c"] = (code, f"{scode}_t0")
    for bits in (8, 4):
        for letter, scode in scales.items():
            names[f"int{bits}_{letter}"] = (f"int{bits}", scode)
            names[f"int{bits}_{letter}c"] = (f"int{bits}", f"{scode}_t0")
        for pair, zcode in (("FF", "float32_float32"), ("ff", "float16_float16"), ("bb", "bfloat16_bfloat16"),
                            ("Fi", "float32_int8"), ("fi", "float16_int8"), ("bi", "bfloat16_int8"),
                            ("ni", "e4m3fn_int8")):  # fmt: skip
            names[f"uint{bits}_{pair}c"] = (f"uint{bits}", f"{zcode}_t0")
        names[f"uint{bits}_ni"] = (f"uint{bits}", "e4m3fn_int8")
    names.update(_tiled_reference_names())
    return names


def _tiled_reference_names() -> dict[str, tuple[str, str | None]]:
    """The reference's names of tiled types: square float-scaled tiles, MX elements on tiles of 16
    and square tiles, NVIDIA-style square tiles, and its codebooks over subtiles."""
    names: dict[str, tuple[str, str | None]] = {}
    # float-scaled square tiles
    for name, code, scode in (("fp8nF", "e4m3fnuz", "float32"), ("fp8nf", "e4m3fnuz", "float16"),
                              ("bf8nbt", "e5m2fnuz", "bfloat16"), ("fp8F", "e4m3fn", "float32"),
                              ("fp8f", "e4m3fn", "float16"), ("bf8bt", "e5m2", "bfloat16")):  # fmt: skip
        names[f"{name}32s"] = (code, f"{scode}_t32d-2_t32d-1")
    # MX elements on tiles of 16 and on square tiles: mx<e>t16, mx<e>t16s / mx<e>s16 (16x16), mx<e>s (32x32)
    mx = {"bf8": "e5m2", "fp8": "e4m3fn", "bf6": "e3m2fnuz", "fp6": "e2m3fnuz", "fp4": "e2m1fnuz",
          "int8": "int8", "int4": "int4"}  # fmt: skip
    for short, code in mx.items():
        names[f"mx{short}t16"] = (code, "e8m0_t16")
        names[f"mx{short}t16s"] = (code, "e8m0_t16d-2_t16d-1")
        names[f"mx{short}s16"] = (code, "e8m0_t16d-2_t16d-1")
        names[f"mx{short}s"] = (code, "e8m0_t32d-2_t32d-1")
    for short, code in (
        ("b8", "e5m2"),
        ("f8", "e4m3fn"),
        ("b6", "e3m2fnuz"),
        ("f6", "e2m3fnuz"),
        ("f4", "e2m1fnuz"),
    ):
        names[f"nv{short}s"] = (code, "e4m3fn_t16d-2_t16d-1")
    names["bfp16t16"] = ("int8", "e8m0_t16")
    # e2m1 with a 1- or 2-bit scale offset per subtile of 8 or 4 under an E8M0 scale per 32: the
    # codebook of e2m1's values and their halvings (the offset is chosen by least squared error)
    for offset_bits, halvings in ((1, "e01"), (2, "e0123")):
        for sub in (8, 4):
            names[f"e2m1_e32s{sub}o{offset_bits}"] = (
                f"cb4{offset_bits}f{halvings}_e3m2fnuz",
                f"e8m0_t32s{sub}",
            )
    # its older implicit codebooks: fp4 and int4 patterns moved down 0..7 values of e4m3fn (4),
    # e3m2fnuz (3) or e2m3fnuz (2), over E8M0 or e5m0 (`f32`: e5m3) scales per 32, subtiles of 16/8/4
    for digit, compute in (("4", "e4m3fn"), ("3", "e3m2fnuz"), ("2", "e2m3fnuz")):
        book = f"icb44fi_{compute}"
        names[f"icb44fi{digit}_e32"] = (book, "e8m0_t32")
        names[f"icb44fi{digit}_f32"] = (book, "e5m0_t32")
        for sub in (16, 8, 4):
            names[f"icb44fi{digit}_e32s{sub}"] = (book, f"e8m0_t32s{sub}")
            names[f"icb44fi{digit}_f32s{sub}"] = (book, f"e5m3_t32s{sub}")
    return names


PREDEFINED: dict[str, tuple[str, str | None]] = _table()

# OCP-style spellings of the MX types
ALIASES: dict[str, str] = {
    "mxfp8_e5m2": "mxfp8e5",
    "mxfp8_e4m3": "mxfp8e4",
    "mxfp6_e3m2": "mxfp6e3",
    "mxfp6_e2m3": "mxfp6e2",
    "mxfp4_e2m1": "mxfp4e2",
    "mxfp4": "mxfp4e2",
    "mxfp8": "mxfp8e4",
    "mxfp6": "mxfp6e2",
    "mx_int8": "mxint8",
    "mxint8_t32": "mxint8",
    # the reference project's other spellings
    "mxbf8": "mxfp8e5",
    "mxbf6": "mxfp6e3",
    "fp8": "float8_e4m3fn",
    "bf8": "float8_e5m2",
    "fp8n": "float8_e4m3fnuz",
    "bf8n": "float8_e5m2fnuz",
    "e8m23": "float32",
    "e5m10": "float16",
    "e8m7": "bfloat16",
}


def resolve_name(name: str) -> str | None:
    """The predefined key a name means, or None: the exact name first (the reference project's
    names are case-sensitive: `fp8_F` has a float32 scale, `fp8_f` a float16 one), then its
    lower case, then an alias."""
    key = name.strip()
    for candidate in (key, key.lower()):
        candidate = ALIASES.get(candidate, candidate)
        if candidate in PREDEFINED:
            return candidate
    return None


def lookup(name: str) -> DataType:
    """A predefined DataType by name or alias."""
    key = resolve_name(name)
    if key is None:
        raise ValueError(f"unknown datatype {name!r}; `tcast list` shows the predefined types")
    return _predefined(key)


@functools.cache
def _predefined(key: str) -> DataType:
    """Built once per name: DataTypes are immutable, and parsing their codes cost a cast by name
    tens of microseconds of every call."""
    ncode, scode = PREDEFINED[key]
    return DataType(ncode, scode, key)
