"""The one table of element types: how each is named by Core AI, tcast, torch and numpy.

Every conversion between those spellings asks this table. Core AI names are MLIR's (`f16`, `si8`,
`ui4`, `f8E4M3FN`, ...). `tcast` is the number code whose codes are the stored bits (signed
integers are tcast's fixed-point formats: the same two's-complement codes). `torch` and `numpy`
name the dtype an array of the element's values has, where one exists (ml_dtypes for bfloat16
and the small floats). Nothing is imported to read the table.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any


class Kind(enum.Enum):
    FLOAT = "float"
    INT = "int"
    UINT = "uint"
    BOOL = "bool"


@dataclass(frozen=True)
class Element:
    name: str  # Core AI (MLIR) spelling
    kind: Kind
    bits: int
    tcast: str | None  # tcast number code of the stored codes
    torch: str | None  # torch dtype name of the values
    numpy: str | None  # numpy (or ml_dtypes) dtype name of the values
    # How coreai-torch stores the codes in a .pt2 where no torch dtype holds them: this many to a
    # uint8 along the last axis (1: one per byte), recognised by scales of the element `packed_under`
    codes_per_byte: int = 1
    packed_under: str | None = None

    @property
    def is_float(self) -> bool:
        return self.kind is Kind.FLOAT

    def torch_dtype(self) -> Any:
        import torch

        if self.torch is None:
            raise ValueError(f"no torch dtype holds {self.name} values")
        return getattr(torch, self.torch)

    def numpy_dtype(self) -> Any:
        import numpy as np

        if self.numpy is None:
            raise ValueError(f"no numpy dtype holds {self.name} values")
        if hasattr(np, self.numpy):
            return np.dtype(self.numpy)
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, self.numpy))


def _integers() -> list[Element]:
    rows = []
    for bits in (1, 2, 3, 4, 6, 8, 16, 32, 64):
        wide = bits >= 8
        coded = 2 <= bits <= 32  # tcast integer widths
        rows.append(Element(f"si{bits}", Kind.INT, bits, f"int{bits}" if coded else None,
                            f"int{bits}" if wide else None, f"int{bits}" if wide else None))  # fmt: skip
        rows.append(Element(f"ui{bits}", Kind.UINT, bits, f"uint{bits}" if coded else None,
                            f"uint{bits}" if wide else None, f"uint{bits}" if wide else None))  # fmt: skip
    return rows


ELEMENTS: dict[str, Element] = {
    e.name: e
    for e in (
        Element("f64", Kind.FLOAT, 64, "float64", "float64", "float64"),
        Element("f32", Kind.FLOAT, 32, "float32", "float32", "float32"),
        Element("f16", Kind.FLOAT, 16, "float16", "float16", "float16"),
        Element("bf16", Kind.FLOAT, 16, "bfloat16", "bfloat16", "bfloat16"),
        Element("f8E4M3FN", Kind.FLOAT, 8, "e4m3fn", "float8_e4m3fn", "float8_e4m3fn"),
        Element("f8E5M2", Kind.FLOAT, 8, "e5m2", "float8_e5m2", "float8_e5m2"),
        Element("f8E8M0FNU", Kind.FLOAT, 8, "e8m0", "float8_e8m0fnu", "float8_e8m0fnu"),
        Element(
            "f4E2M1FN",
            Kind.FLOAT,
            4,
            "e2m1ocp",
            None,
            "float4_e2m1fn",
            codes_per_byte=2,
            packed_under="f8E8M0FNU",
        ),
        Element("f6E2M3FN", Kind.FLOAT, 6, "e2m3ocp", None, "float6_e2m3fn"),
        Element("f6E3M2FN", Kind.FLOAT, 6, "e3m2ocp", None, "float6_e3m2fn"),
        Element("i1", Kind.BOOL, 1, None, "bool", "bool"),
        *_integers(),
    )
}
_BY_TORCH = {e.torch: e for e in ELEMENTS.values() if e.torch is not None and e.kind is not Kind.BOOL}
_BY_TORCH["bool"] = ELEMENTS["i1"]


def element(name: str) -> Element:
    """The element a Core AI name spells; ValueError for one the table does not know."""
    try:
        return ELEMENTS[name]
    except KeyError:
        raise ValueError(f"unknown element type {name}") from None


def of_torch(dtype: Any) -> Element:
    """The element of a torch dtype (int64 is si64, bool i1, ...)."""
    name = str(dtype).removeprefix("torch.")
    try:
        return _BY_TORCH[name]
    except KeyError:
        raise ValueError(f"no element type for torch dtype {name}") from None


def packed_element(data_dtype: Any, scale_dtype: Any) -> Element | None:
    """The element whose codes a .pt2 packs into `data_dtype` bytes under scales of
    `scale_dtype` (OCP FP4: uint8 pairs under E8M0 scales), or None: plain codes."""
    if str(data_dtype).removeprefix("torch.") != "uint8":
        return None
    scale = _BY_TORCH.get(str(scale_dtype).removeprefix("torch."))
    packed = [
        e
        for e in ELEMENTS.values()
        if e.codes_per_byte > 1 and scale is not None and e.packed_under == scale.name
    ]
    return packed[0] if packed else None


def core_ai_name(dtype: Any) -> str:
    """A torch dtype's element name as Core AI (MLIR) prints it (`f16`, `si64`), so both program
    formats read alike; the torch name for a dtype Core AI has no element for."""
    try:
        return of_torch(dtype).name
    except ValueError:
        return str(dtype).removeprefix("torch.")
