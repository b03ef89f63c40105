"""The options of the compression passes, as in seed 002."""

from __future__ import annotations

import enum


class DType(enum.Enum):
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
    def is_int(self) -> bool:
        return self.value.startswith(("int", "uint"))

    @property
    def signed(self) -> bool:
        return self.value.startswith("int")

    @property
    def bits(self) -> int:
        return {"int2": 2, "uint2": 2, "int4": 4, "uint4": 4, "mxfp4": 4}.get(self.value, 8)


class QScheme(enum.Enum):
    SYMMETRIC = "sym"
    ASYMMETRIC = "asym"


class CompressionGranularity(enum.Enum):
    PER_TENSOR = "tensor"
    PER_CHANNEL = "channel"
    PER_BLOCK = "block"
    PER_GROUPED_CHANNEL = "grouped-channel"
