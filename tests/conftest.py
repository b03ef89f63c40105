"""Shared fixtures: the sample models, an in-process CLI runner, the Core AI runtime."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shutil
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

warnings.filterwarnings("ignore", message="coreai-torch has only been validated")


def pytest_configure(config: pytest.Config) -> None:
    """Without CUDA, Triton's kernels run in its interpreter (TRITON_INTERPRET=1, read when the
    kernels are first defined): set for the whole session, before any test imports them. Assets
    that passed their check are remembered in a folder of this session (never the user's
    ~/.cache, never an earlier run's record). The garbage collector runs rarely: exports and
    loads build large graphs of objects that a young-generation collection walks again and
    again (tests/test_generate.py with test_tritoncast.py: 168.7 -> 157.2 CPU-s in one process,
    peak RSS 0.84 -> 0.98 GB; 2026-12-03); what the session imported is frozen out of its walks.
    Triton's interpreter skips its repeated patching (`_patch_the_interpreter_once_a_launch`)."""
    import atexit
    import gc
    import tempfile

    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
    record = tempfile.mkdtemp(prefix="coreopt-checked-assets-")
    atexit.register(shutil.rmtree, record, ignore_errors=True)
    os.environ["COREOPT_CHECKED_ASSETS"] = record
    gc.collect()
    gc.freeze()
    gc.set_threshold(200_000, 50, 1000)
    if os.environ.get("TRITON_INTERPRET") == "1":  # after the freeze: frozen, nanobind's types would
        _patch_the_interpreter_once_a_launch()  # outlive libtriton and be reported leaked at exit


def _patch_the_interpreter_once_a_launch() -> None:
    """Triton's interpreter patches triton.language for a kernel's launch, and again at every
    call of a jit function inside it (`InterpretedFunction.__call__`), walking the modules with
    inspect.getmembers each time, only to find them patched already: about a quarter of the
    interpreter's time in tests/test_tritoncast.py. Inside a launch, a nested call whose globals
    reach the language through the same modules as a call before it (ours: `tl`; triton's own
    random: `tl.core`) skips the walk; the launch still patches and restores as before. Where the
    interpreter differs from the one this was written against, it is left alone."""
    if importlib.util.find_spec("triton") is None:
        return
    from triton.runtime import interpreter

    patch_lang = getattr(interpreter, "_patch_lang", None)
    scope_class = getattr(interpreter, "_LangPatchScope", None)
    if patch_lang is None or scope_class is None or not hasattr(scope_class, "restore"):
        return
    restore = scope_class.restore
    modules = (interpreter.tl, interpreter.tl.core)
    launches: list[tuple[Any, set[frozenset[int]]]] = []  # the launch's scope, the globals patched for in it
    langs: dict[int, frozenset[int]] = {}  # id(fn.__globals__) -> the ids of the language modules it reaches

    def reach(fn: Any) -> frozenset[int]:
        key = id(fn.__globals__)
        if key not in langs:
            langs[key] = frozenset(id(v) for v in fn.__globals__.values() if any(v is m for m in modules))
        return langs[key]

    def patch_once(fn: Any) -> Any:
        if launches:
            scope, patched = launches[-1]
            reached = reach(fn)
            if reached not in patched:
                patched.add(reached)
                patch_lang(fn)  # as the interpreter does: a nested call's patch is never restored
            return scope
        scope = patch_lang(fn)
        launches.append((scope, {reach(fn)}))
        return scope

    def restore_and_close(scope: Any) -> None:
        restore(scope)
        if launches and launches[-1][0] is scope:
            launches.pop()

    interpreter._patch_lang = patch_once
    scope_class.restore = restore_and_close


ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_models"
SAMPLE_NAMES = ("mlp", "cnn", "transformer", "wide_range", "int_arith")


@pytest.fixture(autouse=True)
def _deterministic_random() -> None:
    """Every test sees the same random numbers, so a failure always reproduces."""
    import torch

    torch.manual_seed(0)
    np.random.seed(0)


def load_sample_builder() -> Any:
    """sample_models/build.py as a module (it is a script, not an installed package)."""
    spec = importlib.util.spec_from_file_location("sample_models_build", SAMPLES / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@dataclass
class CliResult:
    exit_code: int
    stdout: str
    stderr: str


def _invoke(app: Any, args: list[str]) -> CliResult:
    result = CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)
    return CliResult(result.exit_code, result.stdout, result.stderr)


# Console scripts run in one child process, case after case (a process loads torch and the CLIs:
# ~4 CPU-s, ~0.5 without torch): each case is its app's `main` in its own folder, its exit code the
# one `sys.exit` gives, its own stdout and stderr. What importing the apps printed comes first.
_CLI_CHILD = """
import contextlib, io, json, os, sys
if {without_torch!r}:
    sys.modules["torch"] = None
out, err = io.StringIO(), io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    apps = {{app: __import__(app, fromlist=["main"]) for app in {apps!r}}}
answers = [out.getvalue() + err.getvalue()]
for app, args, folder in json.loads(sys.stdin.read()):
    os.chdir(folder)
    sys.argv = args
    out, err, code = io.StringIO(), io.StringIO(), None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            apps[app].main()
        except SystemExit as done:
            code = done.code
        except Exception as exc:  # one case's escape fails that case, not the others
            code, err = None, io.StringIO(repr(exc))
    answers.append([code, out.getvalue(), err.getvalue()])
sys.__stdout__.write(json.dumps(answers))
"""
CLI_APPS = {"coreopt": "cli.coreopt_app", "tcast": "cli.tcast_app"}


def cli_runs_in_one_child(
    cases: list[tuple[list[str], Path]], env: dict[str, str], *, without_torch: bool = False
) -> tuple[str, list[CliResult]]:
    """What importing the CLIs printed, and each case's (argv, folder) result, from one child;
    argv[0] names the console script. The child itself must end well, writing nothing else."""
    import json
    import subprocess

    apps = sorted({CLI_APPS[args[0]] for args, _ in cases})
    script = _CLI_CHILD.format(without_torch=without_torch, apps=apps)
    request = json.dumps([[CLI_APPS[args[0]], [str(a) for a in args], str(folder)] for args, folder in cases])
    done = subprocess.run([sys.executable, "-c", script], input=request, env=env, capture_output=True,
                          text=True, timeout=300, cwd=cases[0][1])  # fmt: skip
    assert done.returncode == 0 and done.stderr == "", done.stderr
    imported, *replies = json.loads(done.stdout)
    assert len(replies) == len(cases)
    return imported, [CliResult(*reply) for reply in replies]


def made_once(
    tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], dict[str, Path]]
) -> dict[str, Path]:
    """What `make` writes into a folder of its own, made once a test session: the first pytest
    worker to ask makes it (under a lock, in the folder all workers' temporary folders share), the
    others wait and read it. For files that tests only read: an export of a model costs 3-10 CPU-s,
    which each of two workers paid for the same bytes."""
    import json

    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    folder, record = base / f"made-once-{name}", base / f"made-once-{name}.json"
    with FileLock(str(base / f"made-once-{name}.lock")):
        if not record.exists():
            shutil.rmtree(folder, ignore_errors=True)  # what a worker that failed half way left
            folder.mkdir()
            made = make(folder)
            record.write_text(json.dumps({key: str(path) for key, path in made.items()}), encoding="utf-8")
    return {key: Path(path) for key, path in json.loads(record.read_text(encoding="utf-8")).items()}


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny LLaMA exported once a test session (`ref`, its sidecars, `text`): modules read it
    and write beside their own folders, never beside it."""
    pytest.importorskip("transformers")
    from tests._hf import exported_llama

    return made_once(tmp_path_factory, "tiny_llama", exported_llama)


@pytest.fixture
def coreopt():
    from cli.coreopt_app import app

    return lambda *args: _invoke(app, list(args))


@pytest.fixture
def tcast_cli():
    from cli.tcast_app import app

    return lambda *args: _invoke(app, list(args))


def copy_sample(name: str, fmt: str, dest: Path) -> Path:
    source = SAMPLES / f"{name}.{fmt}"
    target = dest / source.name
    if source.is_dir():
        shutil.copytree(source, target)
    else:
        shutil.copy2(source, target)
    return target


def constant_records(program) -> list[tuple[str, bytes]]:  # type: ignore[no-untyped-def]
    """(type, stored bytes) of every constant of a Core AI program, in program order."""
    from coreai_opt import _coreai

    module = _coreai.mlir_module(program)
    return [(str(op.result.type), _coreai.constant_bytes(op)) for op in _coreai.constant_ops(module)]


def sample_inputs(path: Path) -> dict[str, np.ndarray]:
    """Seeded inputs for an asset: integers in [1, 50) (valid ids for every sample), floats N(0, 1)."""
    from coreai_opt.inspection import inspect_model

    rng = np.random.default_rng(0)
    out = {}
    for spec in inspect_model(path).inputs:
        if spec.dtype.startswith("si"):
            out[spec.name] = rng.integers(1, 50, spec.shape).astype(np.int32)
        else:
            out[spec.name] = rng.standard_normal(spec.shape).astype(np.float32)
    return out


def run_aimodel(path: Path, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run the `main` function of an asset on the Core AI CPU runtime."""
    from coreai.authoring import AIModelAsset
    from coreai.runtime import NDArray

    async def go() -> dict[str, np.ndarray]:
        async with AIModelAsset.load(path).executable() as model:
            function = model.load_function("main")
            out = await function({k: NDArray(np.ascontiguousarray(v)) for k, v in inputs.items()})
            return {k: v.numpy() for k, v in out.items()}

    return asyncio.run(go())
