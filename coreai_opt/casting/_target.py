"""What a cast converts (its own module: the CLI lists it without importing torch)."""

from __future__ import annotations

import enum


class CastTarget(enum.Enum):
    FP16 = "fp16"
    INT16 = "int16"
    BOTH = "16bit"

    @property
    def suffix(self) -> str:
        return f".{self.value}"
