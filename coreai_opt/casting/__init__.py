"""16-bit casting of `torch.export` programs: FP32 -> FP16 and INT32/INT64 -> INT16.

`CastTarget` loads with the package; everything else imports torch, so it loads on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from ._target import CastTarget

_LAZY = {
    "op_matcher": "_graph",
    "MalformedGraphError": "_api",
    "cast_fp32_to_fp16": "_api",
    "cast_int32_to_int16": "_api",
    "cast_program": "_api",
    "cast_to_16_bit_precision": "_api",
    "new_input_dtypes": "_api",
    "CheckResult": "_check",
    "OutputAgreement": "_check",
    "check_inputs": "_check",
    "compare_programs": "_check",
    "random_inputs": "_check",
    "resolve_op": "_graph",
    "Overflow": "_overflow",
    "first_overflows": "_overflow",
    "CastReport": "_report",
    "IOChange": "_report",
    "OpChange": "_report",
    "OpOutcome": "_report",
    "StateChange": "_report",
    "StateOutcome": "_report",
}

__all__ = ["CastTarget", *sorted(_LAZY)]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    globals()[name] = value
    return value
