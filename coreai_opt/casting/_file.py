"""`coreopt cast`: load a .pt2, cast it, check it against the original, save it atomically."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coreai_opt._errors import NothingDoneError
from coreai_opt.io import (
    ModelFileError,
    ModelFormat,
    check_output,
    load_pt2,
    model_format,
    one_line,
    require_existing,
    save_pt2,
)

from ._target import CastTarget

if TYPE_CHECKING:
    from ._check import CheckResult
    from ._report import CastReport


@dataclass
class CastFileResult:
    source: Path
    output: Path
    target: CastTarget
    report: CastReport
    check: CheckResult | None
    seconds: float
    written: bool = True  # False when the check failed and the output was not kept

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": str(self.source),
            "output": str(self.output),
            "to": self.target.value,
            "seconds": round(self.seconds, 4),
            "report": self.report.to_dict(),
            "check": self.check.to_dict() if self.check is not None else None,
            "written": self.written,
        }


def default_output(source: Path, target: CastTarget) -> Path:
    """`model.pt2` -> `model.fp16.pt2` (or `.int16`, `.16bit`) beside the input."""
    return source.with_name(f"{source.stem}{target.suffix}{ModelFormat.PT2.value}")


def cast_file(
    source: Path | str,
    target: CastTarget | str = CastTarget.BOTH,
    output: Path | str | None = None,
    *,
    ignored_ops: tuple[str, ...] = (),
    check: bool = True,
    inputs: Path | str | None = None,
    seed: int = 0,
    force: bool = False,
    trust_pickle: bool = False,
    allow_empty: bool = False,
    keep_failed: bool = False,
) -> CastFileResult:
    """Cast a `.pt2` to 16 bits into a new file, checked against the original unless `check` is
    off; a program that fails its check is not written unless `keep_failed`. An ignored op that
    the program never calls raises `NothingDoneError` (a typo, most likely) and writes nothing,
    unless `allow_empty`."""
    source = Path(source)
    target = CastTarget(target)
    model_format(source, (ModelFormat.PT2,))
    require_existing(source)
    out = Path(output) if output is not None else default_output(source, target)
    model_format(out, (ModelFormat.PT2,))
    check_output(out, force=force, inputs=(source,))
    # torch loads only now: a wrong path fails at once
    from ._api import cast_program
    from ._check import check_inputs, compare_programs
    from ._graph import op_matcher, resolve_op

    ops = tuple(resolve_op(name) for name in ignored_ops)
    program = load_pt2(source, trust_pickle=trust_pickle)
    calls = [n for n in program.graph.nodes if n.op == "call_function"]
    unmatched = [
        name for name, op in zip(ignored_ops, ops, strict=True) if not any(map(op_matcher(op), calls))
    ]
    if unmatched and not allow_empty:
        raise NothingDoneError(
            f"{source}: the program calls no {', no '.join(unmatched)} (--ignore-op matches nothing): no output "
            "written (--allow-empty writes it anyway)"
        )
    # a second load, not a deep copy: mapped weights cost no memory until they are read
    original = load_pt2(source, trust_pickle=trust_pickle) if check else None
    start = time.perf_counter()
    report = cast_program(program, target, ops or None)
    seconds = time.perf_counter() - start
    result = None
    if original is not None:
        tensors, label, rules = check_inputs(original, inputs, seed)
        try:
            result = compare_programs(original, program, tensors, label, rules)
        except (RuntimeError, IndexError, ValueError) as exc:
            message = one_line(exc)
            hint = "" if inputs is not None else "; pass --inputs with valid example inputs, or --no-check"
            raise ModelFileError(source, f"the check could not run the programs ({message}){hint}") from None
    written = result is None or result.ok or keep_failed
    if written:
        save_pt2(program, out, force=force, inputs=(source,))
    return CastFileResult(source, out, target, report, result, seconds, written)
