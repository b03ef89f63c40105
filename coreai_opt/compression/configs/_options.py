"""The options of the compression passes, as seed 002 names them, and the values each takes."""

from __future__ import annotations

import enum

from coreai_opt._elements import Element, element


class DType(enum.Enum):
    """What a compressed weight (or its scale) is stored as; `element` is its Core AI element type."""

    INT2 = "int2"
    UINT2 = "uint2"
    INT4 = "int4"
    UINT4 = "uint4"
    INT8 = "int8"
    UINT8 = "uint8"
    FP8_E4M3FN = "fp8e4m3"
    FP8_E5M2 = "fp8e5m2"
    FP4_E2M1FN = "mxfp4"
    FP8_E8M0FNU = "e8m0"

    @property
    def element(self) -> Element:
        return element(_ELEMENT_NAMES[self])

    @property
    def is_int(self) -> bool:
        return not self.element.is_float

    @property
    def signed(self) -> bool:
        return self.element.name.startswith("si")

    @property
    def bits(self) -> int:
        return self.element.bits


_ELEMENT_NAMES = {
    DType.INT2: "si2",
    DType.UINT2: "ui2",
    DType.INT4: "si4",
    DType.UINT4: "ui4",
    DType.INT8: "si8",
    DType.UINT8: "ui8",
    DType.FP8_E4M3FN: "f8E4M3FN",
    DType.FP8_E5M2: "f8E5M2",
    DType.FP4_E2M1FN: "f4E2M1FN",
    DType.FP8_E8M0FNU: "f8E8M0FNU",
}


class QScheme(enum.Enum):
    SYMMETRIC = "sym"
    ASYMMETRIC = "asym"


class CompressionGranularity(enum.Enum):
    PER_TENSOR = "tensor"
    PER_CHANNEL = "channel"
    PER_BLOCK = "block"
    PER_GROUPED_CHANNEL = "grouped"


G = CompressionGranularity

# What each option takes (the CLI offers exactly these).
WEIGHT_DTYPES = tuple(d for d in DType if d is not DType.FP8_E8M0FNU)
N_BITS = (1, 2, 3, 4, 6, 8)
LUT_DTYPES = (DType.INT8, DType.UINT8, DType.FP8_E4M3FN, DType.FP8_E5M2)
JOINT_DTYPES = (DType.INT8, DType.UINT8, DType.FP8_E4M3FN, DType.FP8_E5M2)
QUANTIZE_GRANULARITIES = (G.PER_TENSOR, G.PER_CHANNEL, G.PER_BLOCK)
PALETTIZE_GRANULARITIES = (G.PER_TENSOR, G.PER_CHANNEL, G.PER_GROUPED_CHANNEL)
