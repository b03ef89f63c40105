"""Running a program read from a file: its first run in a forked child, its failures in one line.

Every op a program from a file may call is checked by the loader and fuzzed in the tests, but a
kernel's native code is not ours: should some value still crash it, or make it allocate without
end, that must not take the user's process with it. So the first time a process runs a program
it read (`FileRun`, set on it by `load_pt2`), the program runs once in a forked child on zero
inputs of its declared shapes - one thread, an address space of what its own values need plus a
margin, a CPU-time limit from the arithmetic it declares, most likely to be chosen by the
out-of-memory killer - and only when that run ends well does the process run it itself. A passed
run is remembered by the file's identity (`_checked`), so the next command on the unchanged file
does not pay for it again.

Later runs on real data can still fail in an op that refuses its values (an index out of range):
`running` turns such a failure - one raised by a node of the program, not by coreopt's own code -
into a `ProgramRunError` naming the file, the node and the reason.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import resource
import signal
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._checked import file_identity, remember, was_checked
from ._errors import ModelFileError, ProgramRunError, one_line

if TYPE_CHECKING:
    from torch.export import ExportedProgram

META = "coreopt.file_run"
MARGIN = 1 << 30  # address space a first run may take beyond its program's own values
_CHECK = "pt2-first-run/1"  # raised whenever what the first run covers changes
_GFLOPS = 2.0  # a pessimistic single-thread rate: the CPU-time limit is generous to real programs
_BASE_SECONDS = 60.0


@dataclass
class FileRun:
    """A program read from a file: where from, what running it needs, and whether this process
    has seen it run."""

    path: Path
    value_bytes: int  # every value its nodes compute, as `_shapes` found them
    flops: float  # the multiply-adds of its products, twice
    key: tuple[Any, ...] = field(default=())
    ran: bool = False


def _key(path: Path) -> tuple[Any, ...]:
    import torch

    return (file_identity(path), _CHECK, torch.__version__)


def mark(program: ExportedProgram, path: Path, value_bytes: int, flops: float) -> None:
    """Record on `program` (read from `path`) what its first run needs."""
    key = _key(path)
    program.graph_module.meta[META] = FileRun(path, value_bytes, flops, key, ran=was_checked(key))


def remember_saved(program: ExportedProgram, path: Path) -> None:
    """`program`, just saved to `path` by coreopt, needs no first run of its own when it was made
    in this process or from a program that ran here already; a program read from a file and never
    run (a data-free compression) leaves its output to be run first, like the file it came from."""
    run = file_run(program)
    if run is None or run.ran:
        remember(_key(path))


def file_run(program: ExportedProgram) -> FileRun | None:
    """What `load_pt2` recorded on a program read from a file, or None (made in this process)."""
    found = program.graph_module.meta.get(META)
    return found if isinstance(found, FileRun) else None


def zero_inputs(program: ExportedProgram) -> list[Any]:
    """Zeros of each user input's declared shape (a symbolic size at its hint) and dtype: an index
    every table holds, and a value every op takes."""
    import torch

    from ._shapes import declared_shape

    names = set(program.graph_signature.user_inputs)
    placeholders = [n for n in program.graph.nodes if n.op == "placeholder" and n.name in names]
    values = [node.meta.get("val") for node in placeholders]
    return [
        torch.zeros(declared_shape(value), dtype=value.dtype) if isinstance(value, torch.Tensor) else value
        for value in values
    ]


def first_run(run: FileRun, call: Callable[[], Any]) -> None:
    """Run `call` (the program on zero inputs) in a forked child under limits, unless this
    program ran already; `ProgramRunError` when the child fails or dies."""
    if run.ran:
        return
    if not sys.platform.startswith("linux"):
        run.ran = True  # no fork that keeps the loaded program: the checks before it stand alone
        return
    seconds = _BASE_SECONDS + run.flops / (_GFLOPS * 1e9)
    outcome = _in_child(call, run.value_bytes + MARGIN, seconds)
    if outcome is not None:
        raise ProgramRunError(run.path, f"the program failed its first run, in a worker ({outcome})")
    run.ran = True
    remember(run.key)


def _in_child(call: Callable[[], Any], extra_bytes: int, cpu_seconds: float) -> str | None:
    """Fork, run `call` in the child under the limits; None when it ended well, else why not."""
    import tempfile

    from coreai_opt._fork import enter_child, fork

    reader, writer = os.pipe()
    with tempfile.TemporaryFile() as log:
        pid, mask = fork()
        if pid == 0:  # pragma: no cover (the child; the crash tests run it)
            try:
                os.close(reader)
                enter_child(mask, log.fileno(), writer)
                _child(call, writer, extra_bytes, cpu_seconds)
            finally:
                os._exit(1)
        os.close(writer)
        with os.fdopen(reader, "rb") as replies:
            reply = replies.read(1 << 16)
        _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
        if -code in (signal.SIGXCPU, signal.SIGKILL):
            return f"killed by {name}: past {cpu_seconds:.0f} CPU seconds, or out of memory"
        return f"the process running it crashed ({name})"
    try:
        found = json.loads(reply or b"{}")
    except ValueError:
        found = {}
    if code == 0 and found.get("ok"):
        return None
    return str(found.get("error") or f"the process running it ended with exit code {code}")


def _child(call: Callable[[], Any], writer: int, extra_bytes: int, cpu_seconds: float) -> None:
    """The child's whole life: limits, one thread, the run, one JSON line, `os._exit`."""
    sys.stdout = sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115 (never the parent's objects)
    with contextlib.suppress(OSError):
        with open("/proc/self/oom_score_adj", "w") as adjust:
            adjust.write("1000")  # the out-of-memory killer takes this process first
        held = int(Path("/proc/self/statm").read_text().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (held + extra_bytes, held + extra_bytes))
    limit = int(cpu_seconds) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (limit, limit + 5))
    import torch

    torch.set_num_threads(1)  # a forked child's OpenMP pool would wait on threads it does not have
    try:
        with torch.no_grad():
            call()
        reply: dict[str, Any] = {"ok": True}
    except BaseException as exc:  # every failure is the program's here: say which node, and why
        reply = {"ok": False, "error": describe(exc)}
    os.write(writer, json.dumps(reply).encode())
    os._exit(0)


def describe(exc: BaseException) -> str:
    """`node <name> (<op>): <reason>` for a failure raised by a program's node, else the reason."""
    where = failed_node(exc)
    reason = _reason(exc)
    return f"node {where.name} ({where.target}): {reason}" if where is not None else reason


def _reason(exc: BaseException) -> str:
    text = one_line(str(exc).split("\n\nWhile executing")[0], 200) or type(exc).__name__
    if isinstance(exc, MemoryError) or "can't allocate memory" in text or "not enough memory" in text:
        return f"it ran out of memory ({text})"
    return text


@contextlib.contextmanager
def running(path: Path | str) -> Iterator[None]:
    """Around work that runs the program read from `path`: a failure raised by one of its nodes
    (an op refusing its values, memory) becomes one `ProgramRunError` line; coreopt's own
    failures pass unchanged."""
    try:
        yield
    except ModelFileError:
        raise
    except Exception as exc:
        if failed_node(exc) is None and not isinstance(exc, MemoryError):
            raise
        raise ProgramRunError(Path(path), f"the program failed when run: {describe(exc)}") from None


def failed_node(exc: BaseException) -> Any:
    """The node (`torch.fx.Node`) of a program whose op raised `exc`, or None when the innermost
    frame of the program (its generated `forward`, or an FX interpreter running a node) is not
    followed only by torch's and coreai-torch's own code - coreopt's code failed, not the program."""
    from torch.fx import Interpreter

    found = None
    for frame, line in traceback.walk_tb(exc.__traceback__):
        code = frame.f_code
        if code.co_filename.startswith("<eval_with_key"):
            found = _generated_node(frame.f_locals.get("self"), line)
        elif code is Interpreter.run_node.__code__:
            found = frame.f_locals.get("n")
        elif found is not None and not code.co_filename.startswith(_library_roots()):
            found = None
    return found


def _generated_node(module: Any, line: int) -> Any:
    """The node of a GraphModule's generated `forward` at `line` (FX's own line map)."""
    lines, start = getattr(module, "_lineno_map", None), getattr(module, "_prologue_start", None)
    if not isinstance(lines, dict) or not isinstance(start, int) or (line - start) not in lines:
        return None
    index = lines[line - start]
    return next((node for position, node in enumerate(module.graph.nodes) if position == index), None)


@functools.cache
def _library_roots() -> tuple[str, ...]:
    """Where the code a program's node calls lives: torch, coreai-torch, and the decoders that
    stand in for coreai-torch's ops once a program's compressed weights are folded (named by
    place: `weights` is a room above this one)."""
    import importlib.util

    import torch

    roots = [str(Path(torch.__file__).parent), str(Path(__file__).parents[1] / "weights" / "_decode.py")]
    spec = importlib.util.find_spec("coreai_torch")
    if spec is not None and spec.origin:
        roots.append(str(Path(spec.origin).parent))
    return tuple(roots)
