"""ScaleSpec: how a tensor is scaled (tensor, channel, 1D or 2D tiles) and with what number formats."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from ._number import NumberSpec

_TILE = re.compile(r"^t(\d+)(?:s(\d+))?(?:d(-?\d+))?$")
MAX_TILE = 1 << 20
_TENSOR_SCALES = ("e8m23", "e5m10", "e8m7")  # float32, float16, bfloat16


@dataclass(frozen=True)
class Tile:
    """A tile along one dim; size 0 means the whole dim (a channel scale). `subtile`: runs of that
    many values within the tile that choose their codebook table on their own (0: the tile)."""

    size: int
    dim: int = -1
    subtile: int = 0

    @property
    def code(self) -> str:
        return (
            f"t{self.size}"
            + (f"s{self.subtile}" if self.subtile else "")
            + ("" if self.dim == -1 else f"d{self.dim}")
        )


@dataclass(frozen=True)
class ScaleSpec:
    """`scale[_zero][_tXdY[_tXdY]][+tensor]`: e.g. `e8m0_t32`, `float16_t0`, `bfloat16_int8`,
    `e8m0_t16d0_t16d1`, `e4m3fn_t16+float32`.

    No tile segment: one scale for the whole tensor. `t0`: one scale per channel along the dim.
    `tN`: tiles of N values along the dim (default -1), any size (the OCP MX types use 32; the
    Triton engine takes powers of two from 8 to 256). Two tile segments make 2D tiles. A length
    that the tile does not divide is padded internally. `+tensor` adds a second level (NVFP4's):
    one scale for the whole tensor in that float format, over float tile or channel scales
    that are then relative to it.
    """

    code: str

    def __init__(self, code: str) -> None:
        if not isinstance(code, str) or not code.strip():
            raise ValueError(f"scale spec code must be a non-empty string, got {code!r}")
        object.__setattr__(self, "code", code.strip().lower())
        self._parsed  # noqa: B018  validate now

    @cached_property
    def _parsed(self) -> tuple[NumberSpec, NumberSpec | None, tuple[Tile, ...], NumberSpec | None]:
        code, plus, outer = self.code.partition("+")
        tensor = NumberSpec(outer) if plus else None
        parts = code.split("_")
        tiles: list[Tile] = []
        while parts and _TILE.match(parts[-1]):
            m = _TILE.match(parts.pop())
            assert m is not None
            size, dim = int(m.group(1)), int(m.group(3)) if m.group(3) is not None else -1
            subtile = int(m.group(2)) if m.group(2) is not None else 0
            if size > MAX_TILE:
                raise ValueError(f"tile size must be 0 (channel) or 1..{MAX_TILE}, got {size}")
            if m.group(2) is not None and not (0 < subtile < size and size % subtile == 0):
                raise ValueError(f"a subtile must divide its tile into parts, got t{size}s{subtile}")
            tiles.insert(0, Tile(size, dim, subtile))
        if len(tiles) > 2:
            raise ValueError(f"at most two tile segments (a 2D tile), got {len(tiles)} in {self.code!r}")
        if len(tiles) == 2 and tiles[0].dim == tiles[1].dim:
            raise ValueError(f"the two tile segments of {self.code!r} must name different dims")
        if len(tiles) == 2 and any(t.subtile for t in tiles):
            raise ValueError(f"subtiles go in one-dimensional tiles, not {self.code!r}")
        if len(tiles) == 2 and 0 in (tiles[0].size, tiles[1].size):
            raise ValueError(f"2D tiles need two non-zero sizes, got {self.code!r}")
        rejoined = _rejoin_names(parts)
        if not 1 <= len(rejoined) <= 2:
            raise ValueError(
                f"scale spec {self.code!r} needs a scale format and at most one zero-point format"
            )
        scale = NumberSpec(rejoined[0])
        zero = NumberSpec(rejoined[1]) if len(rejoined) == 2 else None
        if scale.is_uint or scale.is_int:
            raise ValueError(f"a scale must be a float or exponent format, got {scale.code}")
        if zero is not None and zero.is_exponent:
            raise ValueError(f"a zero point cannot be an exponent format, got {zero.code}")
        if tensor is not None:
            if tensor.code not in _TENSOR_SCALES:
                raise ValueError(f"a tensor scale is float32, float16 or bfloat16, got {tensor.code}")
            if not tiles or scale.is_exponent or zero is not None:
                raise ValueError(
                    f"a tensor scale goes over float tile or channel scales without a zero point, not {code!r}"
                )
        return scale, zero, tuple(tiles), tensor

    @property
    def scale(self) -> NumberSpec:
        return self._parsed[0]

    @property
    def zero(self) -> NumberSpec | None:
        return self._parsed[1]

    @property
    def tiles(self) -> tuple[Tile, ...]:
        return self._parsed[2]

    @property
    def tensor_scale(self) -> NumberSpec | None:
        """The format of the per-tensor scale over the tile scales (two-level scaling), or None."""
        return self._parsed[3]

    @property
    def is_tensor(self) -> bool:
        return not self.tiles

    @property
    def is_channel(self) -> bool:
        return len(self.tiles) == 1 and self.tiles[0].size == 0

    @property
    def is_tile(self) -> bool:
        return bool(self.tiles) and not self.is_channel

    @property
    def is_2d(self) -> bool:
        return len(self.tiles) == 2

    @property
    def is_exponent(self) -> bool:
        return self.scale.is_exponent

    @property
    def subtile(self) -> int:
        """Values per codebook table choice within a tile (0: one choice per tile)."""
        return self.tiles[-1].subtile if self.tiles else 0

    def elements_per_scale(self) -> int | None:
        """Values sharing one scale, or None where it depends on the tensor (tensor and channel scales)."""
        if not self.is_tile:
            return None
        count = 1
        for tile in self.tiles:
            count *= tile.size
        return count

    def describe(self) -> str:
        what = f"{self.scale.code} scale"
        if self.zero is not None:
            what += f" + {self.zero.code} zero point"
        if self.is_tensor:
            return what + " per tensor"
        if self.is_channel:
            what += f" per channel (dim {self.tiles[0].dim})"
        else:
            what += " per tile " + " x ".join(f"{t.size} (dim {t.dim})" for t in self.tiles)
            if self.subtile:
                what += f", table choice per {self.subtile}"
        if self.tensor_scale is not None:
            what += f", under a {self.tensor_scale.code} scale per tensor"
        return what

    def __repr__(self) -> str:
        return f"ScaleSpec({self.code!r})"


def _rejoin_names(parts: list[str]) -> list[str]:
    """Codes like `float8_e4m3fn` contain an underscore: glue such pieces back together."""
    names: list[str] = []
    i = 0
    while i < len(parts):
        if i + 1 < len(parts) and parts[i] in ("float8", "float6", "float4", "torch.float8"):
            names.append(parts[i] + "_" + parts[i + 1])
            i += 2
        else:
            names.append(parts[i])
            i += 1
    return [n for n in names if n]


def scale(code: Any) -> ScaleSpec:
    return code if isinstance(code, ScaleSpec) else ScaleSpec(code)
