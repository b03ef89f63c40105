"""Run coreai-torch's converter and save its program atomically."""

from __future__ import annotations

import contextlib
import io
import logging
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from coreai_opt.io import ConversionError, ModelFormat, check_output, load_pt2, model_format, save_aimodel

if TYPE_CHECKING:
    from coreai.authoring import AIProgram
    from torch.export import ExportedProgram


@dataclass(frozen=True)
class ConversionResult:
    source: Path
    output: Path
    seconds: float
    converter_log: str


def convert_exported_program(program: ExportedProgram) -> AIProgram:
    """Convert with coreai-torch; its console chatter is kept out of our output."""
    program, _ = _convert(program)
    return program


class _ConverterFailure(RuntimeError):
    """coreai-torch raised; the message adds the MLIR diagnostic it printed, if any."""


def _convert(program: ExportedProgram) -> tuple[AIProgram, str]:
    from coreai_opt._coreai._native import first_error, native_stderr

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import coreai_torch

        log = io.StringIO()
        failure = None
        # the converter replaces compressed weights' codes in the state_dict by packed sub-byte
        # tensors: the caller's program must stay as it was (and runnable)
        state = dict(program.state_dict)
        quiet = logging.getLogger("coreai_torch")
        level = quiet.level
        quiet.setLevel(logging.ERROR)  # "cannot infer nbits" for FP8 data: expected, not a problem
        with contextlib.redirect_stdout(log), native_stderr() as diagnostics:
            try:
                converter = coreai_torch.TorchConverter()
                converter.add_exported_program(program)
                result = converter.to_coreai()
            except Exception as exc:
                failure = exc
            finally:
                program.state_dict.clear()
                program.state_dict.update(state)
                quiet.setLevel(level)
    if failure is not None:
        message = " ".join(str(failure).split()) or type(failure).__name__
        detail = first_error(diagnostics)
        raise _ConverterFailure(f"{message} ({detail})" if detail else message) from failure
    return result, "\n".join([log.getvalue().strip(), *diagnostics]).strip()


def convert_file(
    source: Path | str, output: Path | str | None = None, *, force: bool = False, trust_pickle: bool = False
) -> ConversionResult:
    """Convert a `.pt2` file to an `.aimodel` asset beside it (or at `output`)."""
    source = Path(source)
    output = Path(output) if output is not None else source.with_suffix(ModelFormat.AIMODEL.value)
    model_format(output, (ModelFormat.AIMODEL,))
    check_output(output, force=force, inputs=(source,))
    exported = load_pt2(source, trust_pickle=trust_pickle)
    start = time.perf_counter()
    try:
        program, log = _convert(exported)
    except _ConverterFailure as exc:
        raise ConversionError(source, f"coreai-torch could not convert the program: {exc}") from None
    save_aimodel(program, output, force=force, inputs=(source,))
    return ConversionResult(source, output, time.perf_counter() - start, log)
