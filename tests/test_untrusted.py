"""Model files from strangers: nothing they hold runs, nothing crashes us, every refusal is one line."""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import _hostile as h
import pytest
import torch
from conftest import SAMPLES, copy_sample

from coreai_opt._coreai import _sandbox as sandbox
from coreai_opt._export._ops import coreai_decompositions
from coreai_opt.io import (
    BadBytecodeError,
    BadMetadataError,
    CorruptArchiveError,
    HashMismatchError,
    UnsafeArchiveError,
    load_pt2,
    verify_aimodel,
)
from coreai_opt.io import _aimodel as aimodel_io


def test_every_live_vector_runs_its_payload_under_torch_export_load(tmp_path: Path) -> None:
    """The hostile files are real attacks: plain torch.export.load runs each payload."""
    vectors = {name: h.PICKLE_VECTORS[name] for name in h.LIVE_AGAINST_TORCH}
    files = {
        name: make(tmp_path / f"{name}.pt2", tmp_path / f"{name}.fired") for name, make in vectors.items()
    }
    script = textwrap.dedent(
        """
        import logging, sys, torch
        logging.disable(logging.CRITICAL)
        for path in sys.argv[1:]:
            try:
                torch.export.load(path)
            except Exception:
                pass
        """
    )
    subprocess.run([sys.executable, "-c", script, *map(str, files.values())], check=True, timeout=300)
    fired = sorted(name for name in vectors if (tmp_path / f"{name}.fired").exists())
    assert fired == sorted(vectors)


REFUSALS = {
    "pickled-weight": "data/weights/weight_0 (weight fc1.weight) is a pickle that imports posix.system",
    "pickled-sample-inputs": "data/sample_inputs/model.pt (sample inputs) is a pickle that imports posix.system",
    "opaque-constant": "data/constants/opaque_obj_0 (constant evil) is a pickled object",
    "legacy-weights": "data/weights/model.pt (legacy pickled state) is a pickle that imports posix.system",
    "sympy-injection": "symbolic shape",
    "compiled-code": "data/aotinductor/model/model.so is compiled code",
}


@pytest.mark.parametrize("command", ["inspect", "cast", "convert"])
@pytest.mark.parametrize("vector", sorted(h.PICKLE_VECTORS))
def test_pickle_vector_is_refused_by_every_pt2_command(
    vector: str, command: str, tmp_path: Path, coreopt
) -> None:  # type: ignore[no-untyped-def]
    marker = tmp_path / "fired"
    source = h.PICKLE_VECTORS[vector](tmp_path / "model.pt2", marker)
    before = h.tree_digest(source)
    out = {"inspect": [], "cast": ["-o", tmp_path / "out.pt2"], "convert": ["-o", tmp_path / "out.aimodel"]}
    result = coreopt(command, source, *out[command])
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(source) in lines[0], result.stderr
    assert REFUSALS[vector] in lines[0]
    assert "--trust-pickle" in lines[0]
    assert not marker.exists()
    assert h.tree_digest(source) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt2"]


def test_the_library_raises_a_typed_error_and_runs_nothing(tmp_path: Path) -> None:
    for name, make in h.PICKLE_VECTORS.items():
        marker = tmp_path / f"{name}.fired"
        with pytest.raises(UnsafeArchiveError):
            load_pt2(make(tmp_path / f"{name}.pt2", marker))
        assert not marker.exists(), name


def test_a_pickled_tensor_weight_is_refused_not_unpickled(tmp_path: Path) -> None:
    """A `use_pickle` weight is refused even when it is just a tensor: no pickle from a model file
    is ever loaded. Trusted, torch reads it as it wrote it."""
    original = load_pt2(SAMPLES / "mlp.pt2")
    weight = original.state_dict["fc1.weight"].detach().clone()

    def change(members: dict[str, bytes]) -> None:
        config = json.loads(members[h.WEIGHTS_CONFIG])
        entry = config["config"]["fc1.weight"]
        entry["use_pickle"] = True
        buffer = io.BytesIO()
        torch.save(torch.nn.Parameter(weight), buffer)  # as torch writes a parameter
        members["data/weights/" + entry["path_name"]] = buffer.getvalue()
        members[h.WEIGHTS_CONFIG] = json.dumps(config).encode()

    path = h.rewrite_pt2(SAMPLES / "mlp.pt2", tmp_path / "pickled.pt2", change)
    with pytest.raises(UnsafeArchiveError, match=r"\(weight fc1.weight\) is a pickled tensor"):
        load_pt2(path)
    program = load_pt2(path, trust_pickle=True)
    assert torch.equal(program.state_dict["fc1.weight"], weight)
    x = torch.randn(4, weight.shape[1])
    assert torch.equal(program.module()(x), original.module()(x))


def test_trust_pickle_hands_the_file_to_torch(tmp_path: Path) -> None:
    """Trusted loading is torch.export.load: the sample inputs come back; by default they never load."""
    trusted = load_pt2(SAMPLES / "transformer.pt2", trust_pickle=True)
    assert trusted.example_inputs is not None
    assert load_pt2(SAMPLES / "transformer.pt2").example_inputs is None
    marker = tmp_path / "fired"
    with pytest.raises(CorruptArchiveError):  # torch's own loader, which runs the payload first
        load_pt2(h.pt2_legacy_weights(tmp_path / "model.pt2", marker), trust_pickle=True)
    assert marker.exists()


def test_dynamic_shapes_and_guards_still_load(tmp_path: Path) -> None:
    """The expression check accepts what torch writes: srepr'd symbols, derived dims, guards."""

    class Halves(torch.nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return x[:, :2].sum(1) + y.repeat(2)

    b = torch.export.Dim("b", min=3, max=64)
    program = torch.export.export(
        Halves(), (torch.randn(8, 3), torch.randn(4)), dynamic_shapes={"x": {0: 2 * b}, "y": {0: b}}
    ).run_decompositions(coreai_decompositions())
    torch.export.save(program, tmp_path / "dynamic.pt2")
    loaded = load_pt2(tmp_path / "dynamic.pt2")
    assert len(loaded.range_constraints) == 2
    x, y = torch.randn(10, 3), torch.randn(5)
    assert torch.equal(loaded.module()(x, y), program.module()(x, y))


ZIP_REFUSALS = {
    "encrypted": "is encrypted",
    "method": "unsupported compression method 99",
    "bomb": "zip bomb",
    "traversal": "unsafe entry name '../../escape.txt'",
    "absolute": "unsafe entry name '/etc/escape.txt'",
    "duplicate": "appears twice",
    "directory": "lies past the end",
}


@pytest.mark.parametrize("kind", sorted(ZIP_REFUSALS))
def test_zip_level_attacks_get_their_own_message(kind: str, tmp_path: Path) -> None:
    path = h.pt2_zip_lies(tmp_path / "model.pt2", _rng_choosing(kind))
    with pytest.raises(CorruptArchiveError, match=re.escape(ZIP_REFUSALS[kind])):
        load_pt2(path)


def test_a_program_json_inflating_past_any_real_one_is_refused_unread(tmp_path: Path) -> None:
    """A 0.1 MB file whose model.json inflates to 65 MiB (whitespace): refused from the zip's
    directory, before a byte is inflated, in well under a second."""
    import time
    import zipfile

    root, members = h._pt2_members(h.SAMPLES / "mlp.pt2")
    members[h.MODEL_JSON] = members[h.MODEL_JSON] + b" " * (65 << 20)
    bomb = tmp_path / "bomb.pt2"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(root + name, data)
    assert bomb.stat().st_size < 1 << 20
    start = time.perf_counter()
    with pytest.raises(CorruptArchiveError, match=r"models/model.json inflates to 68,1\d\d,\d\d\d bytes"):
        load_pt2(bomb)
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize(
    "entry", ["extra2/x", "models/other.json", "data/weights/notes.txt", "xl_model_weights/a"]
)
def test_an_entry_torch_export_does_not_write_is_refused(entry: str, tmp_path: Path) -> None:
    root, members = h._pt2_members(h.SAMPLES / "mlp.pt2")
    path = h.write_pt2(tmp_path / "model.pt2", root, members | {entry: b"x" * 100})
    with pytest.raises(
        CorruptArchiveError, match=f"holds '{re.escape(entry)}', an entry torch.export does not write"
    ):
        load_pt2(path)


def _rng_choosing(kind: str) -> random.Random:
    """A generator whose second choice (after the sample) is the zip attack `kind`."""
    kinds = ["encrypted", "method", "bomb", "traversal", "duplicate", "absolute", "directory"]
    for seed in range(10_000):
        probe = random.Random(seed)
        probe.choice(h.SAMPLE_NAMES)
        if probe.choice(kinds) == kind:
            return random.Random(seed)
    raise AssertionError(kind)


@pytest.mark.parametrize(
    ("metadata", "problem"),
    [
        ({"producer": "x"}, "metadata.json has no assetVersion string"),
        ({"producer": "x", "assetVersion": "1.0"}, 'metadata.json: Asset version "1.0" is not supported'),
        ({"producer": "x", "assetVersion": 2}, "metadata.json has no assetVersion string"),
        (["a", "list"], "metadata.json is not a JSON object"),
    ],
)
def test_bad_metadata_is_a_typed_error(metadata: object, problem: str, tmp_path: Path) -> None:
    asset = copy_sample("mlp", "aimodel", tmp_path)
    (asset / "metadata.json").write_text(json.dumps(metadata))
    with pytest.raises(BadMetadataError) as caught:
        verify_aimodel(asset)
    assert str(caught.value) == f"{asset}: {problem}"


def test_an_asset_written_after_its_check_is_checked_again(tmp_path: Path) -> None:
    """The check is remembered by the bytecode file's identity (inode, size, times): bytes written
    into the same file later - hash recomputed - are read by a worker again, and a bytecode whose
    SHA-256 is not main.hash's is refused before anything parses it."""
    import hashlib

    asset = copy_sample("mlp", "aimodel", tmp_path)
    verify_aimodel(asset)
    verify_aimodel(asset)  # remembered
    bytecode = asset / "main.mlirb"
    damaged = b"NOTMLIR!" + bytecode.read_bytes()[8:]
    with open(bytecode, "r+b") as rewrite:  # the same file, the same size
        rewrite.write(damaged)
    with pytest.raises(HashMismatchError, match=r"main\.hash does not match the SHA-256 of main\.mlirb"):
        verify_aimodel(asset)
    (asset / "main.hash").write_bytes(hashlib.sha256(damaged).digest())
    with pytest.raises(BadBytecodeError, match="not MLIR bytecode"):
        verify_aimodel(asset)


class _NoWorker:
    """Stands in for the asset worker where a test says none may start."""

    def __init__(self, path: Path, **_: object) -> None:
        raise AssertionError(f"a worker was started for {path}")


def _forget_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """As a new process: nothing remembered in memory (the on-disk record stays)."""
    monkeypatch.setattr(aimodel_io, "_verified", set())


def test_a_passed_check_spares_later_processes_until_the_file_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One process checks the asset in a worker; a later one finds it in the record and starts no
    worker; once the bytecode is written again (the same bytes) a worker reads it once more."""
    record = tmp_path / "record"
    monkeypatch.setenv("COREOPT_CHECKED_ASSETS", str(record))
    asset = copy_sample("mlp", "aimodel", tmp_path)
    script = "import sys; from coreai_opt.io import verify_aimodel; verify_aimodel(sys.argv[1])"
    subprocess.run([sys.executable, "-c", script, str(asset)], check=True, timeout=120)
    assert len(list(record.iterdir())) == 1
    _forget_this_process(monkeypatch)
    monkeypatch.setattr("coreai_opt._coreai.AssetWorker", _NoWorker)
    assert verify_aimodel(asset)["assetVersion"]
    bytecode = asset / "main.mlirb"
    bytecode.write_bytes(bytecode.read_bytes())
    _forget_this_process(monkeypatch)
    with pytest.raises(AssertionError, match="a worker was started"):
        verify_aimodel(asset)


def test_an_asset_coreopt_wrote_is_read_without_a_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A saved asset is recorded: the next command on it starts no worker; its metadata edited by
    hand (another SHA-256) makes it a stranger again."""
    from coreai_opt.io import load_aimodel, save_aimodel

    monkeypatch.setenv("COREOPT_CHECKED_ASSETS", str(tmp_path / "record"))
    saved = save_aimodel(load_aimodel(SAMPLES / "mlp.aimodel"), tmp_path / "saved.aimodel")
    _forget_this_process(monkeypatch)
    monkeypatch.setattr("coreai_opt._coreai.AssetWorker", _NoWorker)
    assert verify_aimodel(saved)["assetVersion"]
    metadata = json.loads((saved / "metadata.json").read_text())
    (saved / "metadata.json").write_text(json.dumps({**metadata, "producer": "someone"}))
    with pytest.raises(AssertionError, match="a worker was started"):
        verify_aimodel(saved)


@pytest.mark.parametrize("record", ["off", "shared"])
def test_a_record_that_is_off_or_not_ours_alone_is_never_used(
    record: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`off` keeps no record; a folder others may write to is neither read nor written (an entry
    planted there would switch the check off)."""
    folder = tmp_path / "record"
    if record == "shared":
        folder.mkdir()
        folder.chmod(0o777)
    monkeypatch.setenv("COREOPT_CHECKED_ASSETS", "off" if record == "off" else str(folder))
    asset = copy_sample("mlp", "aimodel", tmp_path)
    verify_aimodel(asset)
    assert not folder.exists() or not list(folder.iterdir())
    _forget_this_process(monkeypatch)
    monkeypatch.setattr("coreai_opt._coreai.AssetWorker", _NoWorker)
    with pytest.raises(AssertionError, match="a worker was started"):
        verify_aimodel(asset)


# Bit flips (hash recomputed) that coreai-core aborts on while reading the program (a seed found by
# searching: which one crashes depends on the committed sample bytes, so rebuilding the samples
# may move it; test_the_crash_is_real says when).
CRASHING_SEED = 12


def _crashing_bit_flips(tmp_path: Path) -> Path:
    return h.aimodel_bit_flips(tmp_path / "crash.aimodel", random.Random(CRASHING_SEED))


@pytest.mark.parametrize("command", ["inspect", "quantize", "palettize", "sparsify", "compare"])
def test_a_bytecode_that_crashes_coreai_is_reported_not_fatal(command: str, tmp_path: Path, coreopt) -> None:  # type: ignore[no-untyped-def]
    bad = _crashing_bit_flips(tmp_path)
    argv = {
        "inspect": [bad], "compare": [SAMPLES / "mlp.aimodel", bad],
    }.get(command, [bad, "-o", tmp_path / "out.aimodel"])  # fmt: skip
    result = coreopt(command, *argv)
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [
        f"error: {bad}: main.mlirb is corrupt (the Core AI library crashed reading it)"
    ]
    assert not (tmp_path / "out.aimodel").exists()


def test_the_crash_is_real(tmp_path: Path) -> None:
    """coreai-core itself dies on that asset: loading it in a plain child process is fatal."""
    bad = _crashing_bit_flips(tmp_path)
    script = "import sys; from coreai.authoring import AIModelAsset; AIModelAsset.load(sys.argv[1]).program"
    done = subprocess.run([sys.executable, "-c", script, str(bad)], capture_output=True, timeout=120)
    assert done.returncode < 0  # killed by a signal, not an exception
    with pytest.raises(BadBytecodeError, match="crashed reading it"):
        verify_aimodel(bad)


needs_fork = pytest.mark.skipif(not sandbox.FORK, reason="workers are forked on Linux only")


@pytest.mark.parametrize("forked", [pytest.param(True, marks=needs_fork), False], ids=["forked", "spawned"])
def test_the_worker_dies_of_the_crash_in_our_place(
    forked: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker, forked (Linux) or a fresh interpreter (elsewhere, or one that runs programs),
    is killed by the signal; the next one starts afresh."""
    forks = _count_forks(monkeypatch)
    bad = _crashing_bit_flips(tmp_path)
    crash = pytest.raises(sandbox.WorkerFailure, match=r"crashed while reading it \(SIG[A-Z]+\)")
    with sandbox.AssetWorker(bad, runs=not forked) as worker, crash as failure:
        worker.verify(_recorded_hash(bad))
    assert failure.value.kind == "crash" and len(forks) == forked
    good = copy_sample("mlp", "aimodel", tmp_path)
    with sandbox.AssetWorker(good, runs=not forked) as worker:
        worker.verify(_recorded_hash(good))


@needs_fork
def test_a_forked_worker_holds_none_of_its_parents_files(tmp_path: Path) -> None:
    """Each worker sees its requests end when the parent dies, and holds no file of the parent's:
    no end of an earlier worker's pipes, nothing the parent has open."""

    def files(pid: int | str) -> set[str]:
        """What a process holds open, by names that tell two files apart (paths, pipe:[inode],
        socket:[inode]; not anon_inode:[eventpoll], which every event loop's epoll shares)."""
        found = set()
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(FileNotFoundError):  # the listing's own descriptor
                found.add(os.readlink(fd))
        return {name for name in found if not name.startswith("anon_inode:")}

    mlp = copy_sample("mlp", "aimodel", tmp_path)
    with (
        open(tmp_path / "held.txt", "w") as held,
        sandbox.AssetWorker(mlp, runs=False) as first,
        sandbox.AssetWorker(mlp, runs=False) as second,
    ):
        second.verify(_recorded_hash(mlp))  # answered: past its start, where it closes them
        first.verify(_recorded_hash(mlp))
        ends = (first._process.stdin.fileno(), first._process.stdout.fileno())
        firsts = {os.readlink(f"/proc/self/fd/{fd}") for fd in ends}
        assert len(firsts) == 2 and firsts <= files(first._process.pid)
        assert not firsts & files(second._process.pid)
        own = (second._process.stdin.fileno(), second._process.stdout.fileno(), second._stderr.fileno())
        shared = {os.readlink(f"/proc/self/fd/{fd}") for fd in own} | {"/dev/null"}
        assert os.readlink(f"/proc/self/fd/{held.fileno()}") in files("self") - shared
        leaked = (files("self") - shared) & files(second._process.pid)
        assert not leaked, leaked


@needs_fork
def test_a_worker_forked_inside_an_event_loop_serves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A notebook runs its cells inside an event loop; the forked worker runs its own."""
    import asyncio

    forks = _count_forks(monkeypatch)
    mlp = copy_sample("mlp", "aimodel", tmp_path)

    async def check() -> dict[str, object]:
        return verify_aimodel(mlp)

    assert asyncio.run(check())["assetVersion"] and len(forks) == 1


@needs_fork
def test_a_worker_forked_after_this_process_ran_the_runtime_verifies_and_runs_nothing(tmp_path: Path) -> None:
    """A fork inherits the Core AI runtime's state but not its dispatch threads: the forked worker
    verifies (no runtime in it) and refuses to lower, where waiting on those threads would hang
    (an alarm fails the test instead of hanging the suite)."""
    import asyncio
    import signal

    from coreai.authoring import AIModelAsset

    mlp = copy_sample("mlp", "aimodel", tmp_path)

    async def lower() -> None:
        async with AIModelAsset.load(mlp).executable() as model:
            model.load_function("main")

    def hung(*_: object) -> None:
        raise TimeoutError("the worker hung")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(120)
    try:
        asyncio.run(lower())  # this process's runtime has started its threads
        with sandbox.AssetWorker(mlp, runs=False) as worker:
            worker.verify(_recorded_hash(mlp))
            with pytest.raises(sandbox.WorkerFailure, match="this worker only verifies the asset"):
                worker.signature()
        with sandbox.AssetWorker(mlp) as worker:  # a worker that runs starts a fresh interpreter
            inputs, outputs = worker.signature()
            assert inputs and outputs
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _count_forks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The pids of the workers forked from now on (in this process)."""
    forked: list[int] = []
    fork = sandbox._fork

    def counted() -> tuple[int, object]:
        pid, mask = fork()
        if pid:
            forked.append(pid)
        return pid, mask

    monkeypatch.setattr(sandbox, "_fork", counted)
    return forked


def _recorded_hash(asset: Path) -> str:
    return aimodel_io._check_files(asset)[1]  # main.hash as the parent hands it to the worker


# ----- the generated corpus (a seeded sample in CI; bench/bad_inputs.py --full runs all) ---------

_CASE_NAMES = [f"{kind}-{i}" for kind, count in h.CI_COUNTS.items() for i in range(count)] + sorted(
    h.PICKLE_VECTORS
)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, h.Case]:
    folder = tmp_path_factory.mktemp("corpus")
    return {case.name: case for case in h.corpus(folder, h.CI_SEED, h.CI_COUNTS)}


def test_the_corpus_holds_300_files(tmp_path: Path) -> None:
    cases = h.corpus(tmp_path, h.CI_SEED)
    assert len(cases) >= 300
    assert sum(case.kind == "aimodel" for case in cases) >= 200


@pytest.mark.parametrize("name", _CASE_NAMES)
def test_hostile_file_keeps_the_contract_in_every_command(
    name: str, corpus: dict[str, h.Case], tmp_path: Path
) -> None:
    assert h.check_case(corpus[name], tmp_path) == []
