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


class AssetWorker:
    """A child process that verifies, lowers and runs one asset; use it as a context manager."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._stderr: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 (closed in close())
        package_root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
        self._process = subprocess.Popen(
            [sys.executable, "-m", "coreai_opt._coreai._worker", str(self.path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=env,
        )
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

    def signature(self) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
        reply = self._ask({"op": "signature"}, "lowering")

        def specs(items: list[dict[str, Any]]) -> tuple[TensorSpec, ...]:
            return tuple(TensorSpec(i["name"], np.dtype(i["dtype"]), tuple(i["shape"])) for i in items)

        return specs(reply["inputs"]), specs(reply["outputs"])

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with tempfile.TemporaryDirectory(prefix="coreopt-run-") as folder:
            given, taken = Path(folder) / "inputs.npz", Path(folder) / "outputs.npz"
            np.savez(given, **inputs)
            self._ask({"op": "run", "inputs": str(given), "outputs": str(taken)}, "running")
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
