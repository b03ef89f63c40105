"""16-bit casting of `torch.export` programs: FP32 -> FP16 and INT32/INT64 -> INT16."""

from ._api import (
    CastTarget,
    MalformedGraphError,
    cast_fp32_to_fp16,
    cast_int32_to_int16,
    cast_program,
    cast_to_16_bit_precision,
    new_input_dtypes,
)
from ._check import CheckResult, OutputAgreement, check_inputs, compare_programs, random_inputs
from ._file import CastFileResult, cast_file, default_output
from ._graph import resolve_op
from ._overflow import Overflow, first_overflows
from ._report import CastReport, IOChange, OpChange, OpOutcome, StateChange, StateOutcome

__all__ = [
    "CastFileResult",
    "CastReport",
    "CastTarget",
    "CheckResult",
    "IOChange",
    "MalformedGraphError",
    "OpChange",
    "OpOutcome",
    "OutputAgreement",
    "Overflow",
    "StateChange",
    "StateOutcome",
    "cast_file",
    "cast_fp32_to_fp16",
    "cast_int32_to_int16",
    "cast_program",
    "cast_to_16_bit_precision",
    "check_inputs",
    "compare_programs",
    "default_output",
    "first_overflows",
    "new_input_dtypes",
    "random_inputs",
    "resolve_op",
]
