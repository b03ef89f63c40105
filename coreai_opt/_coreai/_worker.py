"""The child process that touches an untrusted asset with coreai-core before the parent does.

coreai-core aborts or segfaults on some damaged bytecode (in the MLIR parser, in the conversion
out of the serialized form, in the printer), and no check can rule that out. This process does
every native step the commands take on an asset - parse, verify, convert, walk every op, read
every constant, print - and, for `compare`, lowers and runs it on the CPU runtime. If it dies,
only it dies: `_sandbox.AssetWorker` reports the death as a one-line error.

Protocol: one JSON request per line in, one JSON reply per line out. Arrays travel as `.npz` files
(no pickles) in a directory the parent owns. Requests: verify, signature, reset, run, close (each
names its function; reset zeroes the state the functions share). A worker
that only verifies is forked on Linux, with coreai-core already imported (`serve`); one that
lowers and runs starts as `python -m coreai_opt._coreai._worker` on stdin and stdout (a fork
would inherit the Core AI runtime's state without its dispatch threads, and wait on them for
ever). It never imports torch.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from ._ir import BYTECODE_FILE, bytecode_page_releases


class WorkerError(Exception):
    """A problem to report to the parent: kind (bytecode, metadata, run) and one line."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    detail = next((line for line in lines[1:] if line), lines[0] if lines else type(exc).__name__)
    return detail.removeprefix("error: ")


def verify(path: Path, sha256: str) -> None:
    """Every native step an asset meets in coreopt, on this process's life - after the bytecode's
    SHA-256 is found to be `sha256` (main.hash's), so a stale or forged hash stops it unparsed."""
    from coreai._compiler import ir

    from ._ir import BYTECODE_MAGIC, constant_array, mlir_module, new_context, walk_ops

    with open(path / BYTECODE_FILE, "rb") as bytecode:
        magic = bytecode.read(len(BYTECODE_MAGIC))
        bytecode.seek(0)
        digest = hashlib.file_digest(bytecode, "sha256").hexdigest()  # in chunks: gigabytes
    if digest != sha256:
        raise WorkerError("hash", f"{BYTECODE_FILE}: its SHA-256 is not the one main.hash records")
    if magic != BYTECODE_MAGIC:
        raise WorkerError("bytecode", f"{BYTECODE_FILE}: not MLIR bytecode (bad magic number)")
    try:
        with new_context():
            module = ir.Module.parseFile(str(path / BYTECODE_FILE))  # mapped, not read into memory
            names = [op.operation.name for op in module.body.operations]
    except Exception as exc:
        raise WorkerError("bytecode", f"{BYTECODE_FILE}: damaged bytecode ({_first_line(exc)})") from None
    if not names or not names[0].startswith("aicode.serialization"):
        raise WorkerError("bytecode", f"{BYTECODE_FILE}: bytecode does not hold a serialized Core AI program")
    from coreai.authoring import AIModelAsset

    try:
        asset = AIModelAsset.load(path)
    except RuntimeError as exc:
        raise WorkerError("metadata", _first_line(exc)) from None
    try:
        program = asset.program
    except Exception as exc:
        raise WorkerError(
            "bytecode", f"{BYTECODE_FILE}: cannot read the program ({_first_line(exc)})"
        ) from None
    module = mlir_module(program)
    if not module.operation.verify():
        raise WorkerError("bytecode", f"{BYTECODE_FILE}: the program does not verify")
    from ._describe import program_weights
    from ._ir import graph_signatures, op_histogram

    program_weights(program)  # what inspect walks: every op, every weight's storage decoded
    graph_signatures(module)
    op_histogram(module)
    releases = bytecode_page_releases()  # the peak stays a few weights
    for op in walk_ops(module):
        str(op.location)
        if op.name == "coreai.constant":
            releases.passed(constant_array(op).nbytes)
    sink = _Sink()
    module.operation.write_bytecode(sink)  # the printer, as a save will run it


class _Sink:
    """A file-like object that counts what it is given (the printer's output is not needed) and,
    as the printer walks the program's constants, hands their read pages back every so often."""

    def __init__(self) -> None:
        self.size = 0
        self._releases = bytecode_page_releases()

    def write(self, data: bytes) -> int:
        self.size += len(data)
        self._releases.passed(len(data))
        return len(data)


def _specs(names: list[str], describe: Any) -> list[dict[str, Any]]:
    import numpy as np

    specs = []
    for name in names:
        desc = describe(name)
        specs.append({"name": name, "dtype": np.dtype(desc.dtype).str, "shape": [int(s) for s in desc.shape]})
    return specs


async def _serve(path: Path, requests: Any, reply: Any, runs: bool) -> None:
    """Answer requests until close; the lowered model lives across signature, reset and run
    (refused unless `runs`), and so does the state its functions share (`reset` makes it)."""
    import contextlib

    async with contextlib.AsyncExitStack() as stack:
        served = _Served(path, stack)
        for line in requests:
            request = json.loads(line)
            op = request["op"]
            try:
                if op == "close":
                    break
                if op == "verify":
                    verify(path, str(request.get("sha256", "")))
                    reply({"ok": True})
                elif op in ("signature", "run", "reset") and not runs:
                    reply({"ok": False, "kind": "protocol", "error": "this worker only verifies the asset"})
                elif op in ("signature", "run", "reset"):
                    reply(await getattr(served, op)(request))
                else:
                    reply({"ok": False, "kind": "protocol", "error": f"unknown request {op!r}"})
            except WorkerError as exc:
                reply({"ok": False, "kind": exc.kind, "error": str(exc)})
            except Exception as exc:
                reply({"ok": False, "kind": "run", "error": _first_line(exc)})
    reply({"ok": True})  # to close, after the lowered model is released


class _Served:
    """The lowered asset, its functions by name, and the state they read and write (a stateful
    decoder's key/value cache: one array per state name, the same for every function)."""

    def __init__(self, path: Path, stack: Any) -> None:
        self.path, self.stack = path, stack
        self.model: Any = None
        self.functions: dict[str, Any] = {}
        self.state: dict[str, Any] = {}

    async def function(self, request: dict[str, Any]) -> Any:
        name = str(request.get("function", "main"))
        if self.model is None:
            from coreai.authoring import AIModelAsset

            self.model = await self.stack.enter_async_context(AIModelAsset.load(self.path).executable())
        if name not in self.functions:
            self.functions[name] = self.model.load_function(name)
        return self.functions[name]

    async def signature(self, request: dict[str, Any]) -> dict[str, Any]:
        desc = (await self.function(request)).desc
        return {
            "ok": True,
            "inputs": _specs(list(desc.input_names), desc.input_descriptor),
            "outputs": _specs(list(desc.output_names), desc.output_descriptor),
            "states": _specs(list(desc.state_names), desc.state_descriptor),
        }  # fmt: skip

    async def reset(self, request: dict[str, Any]) -> dict[str, Any]:
        """Zeros for every state the function names (a new sequence)."""
        import numpy as np
        from coreai.runtime import NDArray

        desc = (await self.function(request)).desc
        self.state = {}
        for name in desc.state_names:
            spec = desc.state_descriptor(name)
            self.state[name] = NDArray(np.zeros([int(s) for s in spec.shape], np.dtype(spec.dtype)))
        return {"ok": True}

    async def run(self, request: dict[str, Any]) -> dict[str, Any]:
        import numpy as np
        from coreai.runtime import NDArray

        function = await self.function(request)
        desc = function.desc
        if list(desc.state_names) and set(desc.state_names) != set(self.state):
            raise WorkerError("run", "the function keeps state: reset it before the first run")
        with np.load(request["inputs"], allow_pickle=False) as given:
            arrays = {name: NDArray(np.ascontiguousarray(given[name])) for name in given.files}
        result = await function(arrays, state={n: self.state[n] for n in desc.state_names})
        names = [n for n in desc.output_names if n not in self.state]  # a state's token is no value
        np.savez(request["outputs"], **{n: result[n].numpy() for n in names})
        return {"ok": True}


def preload() -> None:
    """Import what `verify` runs, so that a forked worker starts with it (~0.3 CPU s a worker)."""
    import coreai.authoring  # noqa: F401
    from coreai._compiler import ir  # noqa: F401

    from . import _describe  # noqa: F401


def serve(path: Path, requests: Any, replies: Any, *, runs: bool = True) -> None:
    """Answer the requests read line by line from `requests` on `replies` (text streams); with
    `runs` false, only verify (a forked worker: see the module)."""

    def reply(message: dict[str, Any]) -> None:
        replies.write(json.dumps(message) + "\n")
        replies.flush()

    asyncio.run(_serve(path, requests, reply, runs))


def main() -> None:
    path = Path(sys.argv[1])
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # native code that prints to stdout lands on stderr, never in the replies
    sys.stdout = sys.stderr
    serve(path, sys.stdin, out)
    # nothing here needs an orderly shutdown, and tearing down coreai-core's state takes longer
    # than the work: leave at once
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
