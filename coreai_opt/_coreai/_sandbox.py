"""The parent's side of `_worker`: one child process per asset, its death reported as one line."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from coreai_opt._fork import enter_child, fork

# Lines the runtime's native code logs on every function load; everything else is passed on.
_CHATTER = (b"ODIE [default]: Loading function",)


@dataclass(frozen=True)
class TensorSpec:
    """A function input or output as the runtime describes it."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "dtype": self.dtype.name, "shape": list(self.shape)}


class WorkerFailure(Exception):
    """The child refused the asset (kind: bytecode, metadata, run) or died (kind: crash) while
    at `stage` (reading, lowering, running)."""

    def __init__(self, kind: str, message: str, stage: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.stage = stage


def _signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


# Fork a worker that only verifies where that is safe (Linux: macOS's system frameworks abort forked
# children of threaded processes); elsewhere, and for a worker that runs the program, start a
# fresh interpreter, which pays coreai-core's import again (~0.3 CPU s). A fork copies only the
# forking thread: should another thread of the parent hold a lock the check needs at that moment,
# the child would wait for ever, as a spawned worker would on a native hang (neither is timed).
FORK = sys.platform.startswith("linux")


class _Forked:
    """A forked worker, with the part of `subprocess.Popen`'s interface `AssetWorker` uses."""

    def __init__(self, path: Path, log: int) -> None:
        from . import _worker

        _worker.preload()
        to_child, requests = os.pipe()
        replies, from_child = os.pipe()
        try:
            self.pid, mask = _fork()
        except OSError:
            for fd in (to_child, requests, replies, from_child):
                os.close(fd)
            raise
        if self.pid == 0:  # pragma: no cover (the child; the crash tests run it)
            try:
                _run_child(path, to_child, from_child, log, mask)
            finally:
                os._exit(1)  # never back into the parent's code, whatever happened
        os.close(to_child)
        os.close(from_child)
        self.stdin: IO[bytes] = os.fdopen(requests, "wb")
        self.stdout: IO[bytes] = os.fdopen(replies, "rb")
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped by someone else (SIGCHLD ignored): as Popen says
                pid, status = self.pid, 0
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0.0)
            time.sleep(0.005)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)


_fork = fork  # a name of this module, so that tests can count the workers forked


def _run_child(path: Path, requests: int, replies: int, log: int, mask: set[signal.Signals]) -> None:
    """The forked worker's whole life; it leaves through `os._exit` only."""
    parents = (sys.stdin, sys.stdout, sys.stderr)  # kept alive, so never closed or flushed here
    code = 1
    try:
        enter_child(mask, log, requests, replies)
        sys.stdout = sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115 (lives until _exit)
        sys.stdin = open(os.devnull)  # noqa: SIM115
        import faulthandler

        if faulthandler.is_enabled():  # its dump of a crash goes to the log too
            faulthandler.enable(sys.stderr)
        from . import _worker

        _worker.serve(path, open(requests), open(replies, "w"), runs=False)  # noqa: SIM115
        code = 0
    except BaseException:
        with contextlib.suppress(BaseException):
            import traceback

            traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            sys.stderr.flush()
        del parents
        os._exit(code)


def _spawned(path: Path, stderr: IO[bytes]) -> subprocess.Popen[bytes]:
    package_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    return subprocess.Popen(
        [sys.executable, "-m", "coreai_opt._coreai._worker", str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=stderr,
        env=env,
    )


class AssetWorker:
    """A child process that verifies and, unless `runs` is false, lowers and runs one asset; use
    it as a context manager."""

    def __init__(self, path: Path, *, runs: bool = True) -> None:
        self.path = Path(path)
        self._stderr: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 (closed in close())
        forked = None
        if FORK and not runs:
            with contextlib.suppress(OSError, ImportError):  # no fork (memory, processes): spawn
                forked = _Forked(self.path, self._stderr.fileno())
        self._process: _Forked | subprocess.Popen[bytes] = forked or _spawned(self.path, self._stderr)
        self._stage = "starting"

    def __enter__(self) -> AssetWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _ask(self, request: dict[str, Any], stage: str) -> dict[str, Any]:
        self._stage = stage
        process = self._process
        assert process.stdin is not None and process.stdout is not None
        try:
            process.stdin.write((json.dumps(request) + "\n").encode())
            process.stdin.flush()
            line = process.stdout.readline()
        except (BrokenPipeError, OSError):
            line = b""
        if not line:
            process.wait()
            raise WorkerFailure("crash", self._death(), stage)
        reply = json.loads(line)
        if not reply.get("ok"):
            raise WorkerFailure(reply.get("kind", "run"), reply.get("error", "unknown failure"), stage)
        return reply

    def _death(self) -> str:
        code = self._process.returncode
        how = _signal_name(code) if code is not None and code < 0 else f"exit code {code}"
        return f"the Core AI library crashed while {self._stage} it ({how})"

    def verify(self, sha256: str) -> None:
        """Hash the bytecode (a "hash" failure unless its SHA-256 is `sha256`, hex), then parse,
        verify, convert, walk and print the program."""
        self._ask({"op": "verify", "sha256": sha256}, "reading")

    def signature(self, function: str = "main") -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
        inputs, outputs, _ = self.signatures(function)
        return inputs, outputs

    def signatures(
        self, function: str = "main"
    ) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
        """A function's inputs, outputs and the state it keeps (a stateful decoder's cache)."""
        reply = self._ask({"op": "signature", "function": function}, "lowering")

        def specs(items: list[dict[str, Any]]) -> tuple[TensorSpec, ...]:
            return tuple(TensorSpec(i["name"], np.dtype(i["dtype"]), tuple(i["shape"])) for i in items)

        return specs(reply["inputs"]), specs(reply["outputs"]), specs(reply.get("states", []))

    def reset(self, function: str = "main") -> None:
        """Zero the state `function` keeps (every function of the asset shares it)."""
        self._ask({"op": "reset", "function": function}, "running")

    def run(self, inputs: dict[str, np.ndarray], function: str = "main") -> dict[str, np.ndarray]:
        with tempfile.TemporaryDirectory(prefix="coreopt-run-") as folder:
            given, taken = Path(folder) / "inputs.npz", Path(folder) / "outputs.npz"
            np.savez(given, **inputs)
            self._ask(
                {"op": "run", "function": function, "inputs": str(given), "outputs": str(taken)}, "running"
            )
            with np.load(taken, allow_pickle=False) as outputs:
                return {name: outputs[name] for name in outputs.files}

    def close(self) -> None:
        process = self._process
        if process.poll() is None:
            with contextlib.suppress(WorkerFailure):
                self._ask({"op": "close"}, "closing")
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):  # a request a dead worker never read
                    stream.close()
        self._stderr.seek(0)
        logged = self._stderr.read()
        self._stderr.close()
        if process.returncode == 0:
            _pass_on(logged)


def _pass_on(logged: bytes) -> None:
    """What a healthy child logged, less the runtime's chatter, onto our stderr."""
    kept = [line for line in logged.splitlines(keepends=True) if not line.startswith(_CHATTER)]
    if kept:
        sys.stderr.write(b"".join(kept).decode("utf-8", "replace"))
        sys.stderr.flush()
