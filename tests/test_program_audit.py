"""A `.pt2`'s graph is code: names, operators and sizes from a file are checked before torch sees them."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import _hostile as h
import _hostile_programs as hp
import pytest
import torch

from coreai_opt.io import ModelFileError, load_pt2
from coreai_opt.io._allowlist import (
    ATEN_OPS,
    COREAI_OPS,
    GRADIENT_SUFFIX,
    SYMBOLIC_TARGETS,
    WITHHELD,
    schema_problem,
)
from coreai_opt.io._expressions import guard_problem, sympy_problem
from coreai_opt.io._program_audit import FLOOR_ELEMENTS, name_problem, path_problem, program_problem

SECRET = b"SECRET-BYTES-0123"


def _make(name: str, folder: Path) -> tuple[Path, Path]:
    """The vector's file and the path its payload would touch (a secret to read, or a marker)."""
    make, _ = hp.VECTORS[name]
    target = folder / f"{name}.secret" if name == "from-file-reads" else folder / f"{name}.fired"
    if name == "from-file-reads":
        target.write_bytes(SECRET)
        _age_atime(target)
    return make(folder / f"{name}.pt2", target), target


def _age_atime(path: Path) -> None:
    """Set the access time before the modification time: with relatime (or strictatime) the next
    read of the file moves it, so a read leaves a trace."""
    stat = path.stat()
    os.utime(path, (stat.st_mtime - 1000, stat.st_mtime))


def _touched(path: Path) -> bool:
    """Whether a payload touched `path`: created a marker, or read a secret."""
    if path.name.endswith(".secret"):
        stat = path.stat()
        return stat.st_atime >= stat.st_mtime
    return path.exists()


def test_the_read_trace_works(tmp_path: Path) -> None:
    """The access-time trace `_touched` relies on shows a read on this file system."""
    secret = tmp_path / "x.secret"
    secret.write_bytes(SECRET)
    _age_atime(secret)
    assert not _touched(secret)
    secret.read_bytes()
    assert _touched(secret)


def test_the_live_vectors_run_their_payload_under_plain_torch(tmp_path: Path) -> None:
    """The hostile programs are real attacks: torch.export.load and a run of the program fire them."""
    files = {name: _make(name, tmp_path) for name in hp.LIVE}
    script = textwrap.dedent(
        """
        import logging, sys, warnings, torch
        warnings.simplefilter("ignore")
        logging.disable(logging.CRITICAL)
        for path in sys.argv[1:]:
            try:
                outputs = torch.export.load(path).module()(torch.randn(4, 64))
                leaked = b"".join(o.detach().contiguous().numpy().tobytes() for o in outputs)
                open(path + ".outputs", "wb").write(leaked)
            except Exception:
                pass
        """
    )
    paths = [str(path) for path, _ in files.values()]
    subprocess.run([sys.executable, "-c", script, *paths], check=True, timeout=300)
    assert _touched(files["name-runs-code"][1])  # ran while loading
    assert _touched(files["from-file-reads"][1])
    assert SECRET[:4] in Path(str(files["from-file-reads"][0]) + ".outputs").read_bytes()


@pytest.mark.parametrize("vector", hp.NATIVE_CRASHES)
def test_the_memory_vectors_kill_a_process_that_runs_them_under_plain_torch(
    vector: str, tmp_path: Path
) -> None:
    """What the allowlist and the shape check keep out is real: plain torch dies of a signal."""
    source, _ = _make(vector, tmp_path)
    script = "import sys, torch; torch.export.load(sys.argv[1]).module()(torch.randn(4, 64))"
    run = subprocess.run([sys.executable, "-c", script, str(source)], capture_output=True, timeout=300)
    assert run.returncode < 0, run.stderr[-400:]  # killed by a signal (SIGSEGV, SIGABRT), no exception


COMMANDS = h.PT2_COMMANDS


def _run_command(command: str, source: Path, scratch: Path, coreopt):  # type: ignore[no-untyped-def]
    """Run one of `every_pt2_command` on `source`; (result, what it may write, the listing before)."""
    argv, output = next((a, o) for name, a, o in h.every_pt2_command(source, scratch) if name == command)
    listing = sorted(p.name for p in scratch.iterdir())
    return coreopt(*argv), output, listing


def _one_line(result, source: Path) -> str:  # type: ignore[no-untyped-def]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(source) in lines[0], result.stderr
    assert "Traceback" not in result.stderr and "unexpected" not in result.stderr
    assert re.search(r"[\x00-\x08\x0b-\x1f\x7f\ud800-\udfff]", result.stderr + result.stdout) is None
    return lines[0]


# Every vector goes through the commands below; those of each kind of check (names, operators,
# arguments, shapes, expressions, stored layouts) through every other command too (bench/bad_inputs.py
# runs every vector through every command, each in a process of its own).
FIRST_COMMANDS = ("inspect", "cast", "convert")
EACH_CHECK = ("name-runs-code", "from-file-writes", "gradient-op-writes-heap", "dtype-as-integer", "doubling-cats",
              "short-bias", "size-divides-by-zero", "expanded-weight")  # fmt: skip
VECTOR_RUNS = [(v, c) for v in sorted(hp.VECTORS) for c in COMMANDS if c in FIRST_COMMANDS or v in EACH_CHECK]
VALUED_RUNS = [(v, c) for v in sorted(hp.VALUED_OPS) for c in COMMANDS if c != "quantize-on-ray"
               and (c in ("cast", "compare") or v in ("gather-far", "masked-scatter-short"))]  # fmt: skip


@pytest.mark.parametrize(("vector", "command"), VECTOR_RUNS)
def test_every_hostile_program_is_refused_by_every_pt2_command(
    vector: str, command: str, tmp_path: Path, coreopt
) -> None:  # type: ignore[no-untyped-def]
    """Each vector, through every command that reads a `.pt2`: exit 1, one line naming the file and
    the problem, its payload never fired, the input unchanged, nothing written."""
    source, target = _make(vector, tmp_path)
    before = h.tree_digest(source)
    h.every_pt2_command(source, tmp_path)  # the recipe and token files the commands read
    result, _, listing = _run_command(command, source, tmp_path, coreopt)
    assert result.exit_code == 1, result.stdout
    assert hp.VECTORS[vector][1] in _one_line(result, source)
    assert not _touched(target)
    assert h.tree_digest(source) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == listing


@pytest.mark.parametrize(("vector", "command"), VALUED_RUNS)
def test_an_admitted_op_fed_hostile_values_ends_in_one_line_in_every_command(
    vector: str, command: str, tmp_path: Path, coreopt
) -> None:  # type: ignore[no-untyped-def]
    """A well-formed program whose op gets indices far out of range: a command that never runs it
    may succeed; one that runs it ends in one line naming the node - never in a signal."""
    source = hp.VALUED_OPS[vector](tmp_path / f"{vector}.pt2", tmp_path / "unused")
    h.every_pt2_command(source, tmp_path)
    result, output, listing = _run_command(command, source, tmp_path, coreopt)
    if result.exit_code == 0:
        assert command not in ("cast", "compare"), result.stdout  # these run it: it cannot pass
        assert output is None or output.exists()
        return
    assert result.exit_code == 1, result.stdout
    line = _one_line(result, source)
    if command in ("cast", "compare") and vector != "grid-sampler-nan":  # NaN coordinates read as 0s
        assert "the program failed its first run, in a worker (node hostile" in line, line
        assert any(word in line for word in hp.VALUED_REFUSALS), line
    assert sorted(p.name for p in tmp_path.iterdir()) == listing


def test_the_library_refuses_each_program_before_anything_runs(tmp_path: Path) -> None:
    for name in hp.VECTORS:
        source, target = _make(name, tmp_path)
        with pytest.raises(ModelFileError) as refused:
            load_pt2(source)
        assert hp.VECTORS[name][1] in str(refused.value), name
        assert "\n" not in str(refused.value)
        assert not _touched(target), name


def test_trust_pickle_is_the_only_way_around_the_check(tmp_path: Path) -> None:
    """A training-dialect export is refused, and loads as it is when the caller trusts the file."""
    source, _ = _make("training-dialect", tmp_path)
    with pytest.raises(ModelFileError, match="--trust-pickle"):
        load_pt2(source)
    assert load_pt2(source, trust_pickle=True).verifiers[0].dialect == "TRAINING"


# ----- the allowlist -----------------------------------------------------------------------------


def _derived_allowlist() -> set[str]:
    """The list `_allowlist.ATEN_OPS` states, derived again: core-tagged ops, those coreai-torch
    lowers or keeps whole, the shape assertions; less any a file must not call (mutating, files,
    uninitialised memory, gradients, values become sizes, complex numbers)."""
    from coreai_torch._aten_to_core import _aten_to_core_resolver
    from coreai_torch._decomp import _COMPOSITE_OPS

    names = {key for key in _aten_to_core_resolver if "." in key}
    names |= {str(op).removeprefix("aten.") for op in _COMPOSITE_OPS}
    names |= {"_assert_async.msg", "_assert_scalar.default", "_assert_tensor_metadata.default"}
    names |= {"sym_constrain_range.default", "sym_constrain_range_for_size.default", "sym_size.int"}
    names |= {"sym_stride.int", "sym_numel.default", "sym_storage_offset.default"}
    for qualified in torch._C._dispatch_get_all_op_names():  # every registered op, loaded or not
        namespace, _, rest = qualified.partition("::")
        if namespace == "aten":
            packet_name, _, overload = rest.partition(".")
            op = getattr(getattr(torch.ops.aten, packet_name, None), overload or "default", None)
            if op is not None and torch.Tag.core in op.tags:
                names.add(f"{packet_name}.{overload or 'default'}")
    allowed = set()
    for name in names:
        packet_name, overload = name.split(".")
        op = getattr(getattr(torch.ops.aten, packet_name, None), overload, None)
        withheld = (
            packet_name.startswith("empty")
            or packet_name.endswith(GRADIENT_SUFFIX)
            or packet_name in WITHHELD
        )
        if op is not None and schema_problem(op._schema) is None and not withheld:
            allowed.add(name)
    return allowed


def test_the_allowlist_is_what_torch_and_coreai_torch_say() -> None:
    assert set(ATEN_OPS) == _derived_allowlist()
    assert "from_file.default" not in ATEN_OPS and "copy_.default" not in ATEN_OPS
    assert "max_pool2d_with_indices_backward.default" not in ATEN_OPS
    assert "_local_scalar_dense.default" not in ATEN_OPS
    from coreai_opt._export import register_coreai_ops

    ops = register_coreai_ops()
    for qualified in COREAI_OPS:
        name, overload = qualified.split(".")
        assert schema_problem(getattr(getattr(ops, name), overload)._schema) is None


def test_the_symbolic_targets_are_the_ones_torch_serializes() -> None:
    from torch._export.serde.serialize import _SYM_OPS

    assert {f"{op.__module__}.{op.__name__}" for op in _SYM_OPS} == SYMBOLIC_TARGETS


# ----- names and expressions ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, ok",
    [("x", True), ("p_fc1_weight", True), ("input", True), ("x=1", False), ("self", False), ("for", False),
     ("__class__", False), ("a b", False), ("\x1b[2J", False), ("x\ud800", False), ("", False), ("é", False)],
)  # fmt: skip
def test_names_that_reach_generated_python_are_identifiers(name: str, ok: bool) -> None:
    assert (name_problem(name) is None) == ok


@pytest.mark.parametrize(
    "path, ok",
    [("layers.0.weight", True), ("fc1", True), ("a..b", False), ("a.__dict__", False), ("a.b'", False),
     ("layers[0]", False)],
)  # fmt: skip
def test_parameter_paths_are_dotted_identifiers_and_indices(path: str, ok: bool) -> None:
    assert (path_problem(path) is None) == ok


TORCH_EXPRESSIONS = [
    "Symbol('s17', positive=True, integer=True)",
    "Mul(Integer(2), Symbol('s17', positive=True, integer=True))",
    "Max(Integer(1), Add(FloorDiv(Add(Symbol('s53', positive=True, integer=True), Integer(-3)), Integer(2)), "
    "Integer(1)))",
    "Float('1.5', precision=53)",
    "Pow(Symbol('s0', integer=True), Integer(2))",
    "s0*s1 + 2**62",
]
HOSTILE_EXPRESSIONS = {
    "9**9**9": "exponent is not a small integer",
    "s0**s0": "exponent is not a small integer",
    "((2**64)**16)**16": "can exceed 2**1024",
    "Float('1e999999999')": "beyond float64",
    "Symbol" + ".a" * 990 + "(1)": "nesting deeper",
    "Integer(" + "1" * 3000 + ")": "can exceed 2**1024",
    "Mul(" + ", ".join(["Symbol('s0')"] * 20) + ")": "can exceed 2**1024",
    "__import__('os').system('x')": "call of",
    "x" * 5000: "longer than any shape expression",
    "s0 // 0": "division by zero",
    "FloorDiv(Symbol('s0'), Integer(0))": "division by zero",
    "Mod(s0, 0.0)": "division by zero",
    "Piecewise((s0, Eq(s0, 1)), (2, True))": "call of 'Piecewise'",
    "s0 + zoo": "name 'zoo'",
    "s0*I": "name 'I'",
}


@pytest.mark.parametrize("text", TORCH_EXPRESSIONS)
def test_what_torch_writes_for_dynamic_shapes_passes(text: str) -> None:
    assert sympy_problem(text) is None


@pytest.mark.parametrize("text", sorted(HOSTILE_EXPRESSIONS))
def test_expressions_that_hang_or_recurse_are_refused(text: str) -> None:
    problem = sympy_problem(text)
    assert problem is not None and HOSTILE_EXPRESSIONS[text] in problem


def test_guards_are_bounded_too() -> None:
    assert guard_problem("L['x'].size()[0] == (2*L['y'].size()[0])") is None
    assert "exponent" in guard_problem("L['x'].size()[0] <= 9**9**9")  # type: ignore[operator]
    assert "nesting deeper" in guard_problem("L" + ".size" * 500)  # type: ignore[operator]


def test_sizes_are_bounded_by_what_the_file_stores() -> None:
    """A declared tensor may be large for a model that stores a large weight, not for a tiny one."""
    _, members = h._pt2_members(h.SAMPLES / "mlp.pt2")
    document = json.loads(members[h.MODEL_JSON])
    big = 1 << 28
    document["graph_module"]["graph"]["tensor_values"]["relu"]["sizes"][0] = {"as_int": big // 128}
    assert "more than 67,108,864 elements" in program_problem(document, [8192])  # type: ignore[operator]
    assert program_problem(document, [big // 16]) is None
    assert FLOOR_ELEMENTS == 1 << 26


# ----- real programs still load and run ----------------------------------------------------------
# Every architecture the cast tests cover is saved, loaded through the check and run after each
# cast there (tests/test_cast_architectures.py); the sample models load in every CLI test.


# ----- seeded mutations of real programs ---------------------------------------------------------

MUTANTS = 300
MUTANT_SEED = 20261125
MUTANT_SHARDS = 6


class _Hang(Exception):
    pass


@contextlib.contextmanager
def _deadline(seconds: int) -> Iterator[None]:
    """Raise `_Hang` in this (main) thread when a command runs longer than `seconds`."""

    def alarm(signum: int, frame: object) -> None:
        raise _Hang

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("shard", range(MUTANT_SHARDS))
def test_mutated_programs_load_or_are_refused_in_one_line(shard: int, tmp_path: Path, coreopt) -> None:  # type: ignore[no-untyped-def]
    """300 seeded mutants of the sample programs (op names, argument values, sizes, dtypes, names):
    each is refused with one line (exit 1) or works (exit 0); never a traceback, a hang, a file
    outside the output, or a read of a file the program names."""
    folder, scratch = tmp_path / "files", tmp_path / "out"
    folder.mkdir()
    scratch.mkdir()
    secret = tmp_path / "watched.secret"
    secret.write_bytes(SECRET)
    _age_atime(secret)
    paths = hp.mutants(folder, MUTANTS, MUTANT_SEED, secret=secret, marker=tmp_path / "fired")
    problems: list[str] = []
    refused = 0
    for path in paths[shard::MUTANT_SHARDS]:
        case = h.Case(path.stem, path, "pt2")
        for argv in (["inspect", path], ["cast", path, "-o", scratch / f"{path.stem}.pt2"]):
            output = scratch / f"{path.stem}.pt2" if argv[0] == "cast" else None
            before = set(os.listdir(scratch))
            try:
                with _deadline(60):
                    result = coreopt(*argv)
            except _Hang:
                problems.append(f"{path.name} {argv[0]}: ran over 60 s")
                continue
            refused += result.exit_code == 1
            for problem in h.contract_violations(case, result.exit_code, result.stderr, output):
                problems.append(f"{path.name} {argv[0]}: {problem}: {result.stderr.strip()[:160]}")
            left = (
                set(os.listdir(scratch))
                - before
                - ({output.name} if output and result.exit_code == 0 else set())
            )
            if left:
                problems.append(f"{path.name} {argv[0]}: left {sorted(left)}")
            if argv[0] == "inspect" and result.exit_code != 0:
                break  # a file inspect refuses, cast refuses the same way
    assert problems == []
    assert not _touched(secret) and not (tmp_path / "fired").exists()
    assert refused > 0  # the mutations reach the checks


def test_dimension_arguments_lie_within_the_rank_they_index() -> None:
    """A permutation naming dimension 10**18 (a seeded mutant of the hostile corpus) crashed the
    process inside Core AI's compiler on `convert`: dimension arguments are checked against the
    declared rank of the tensor they index, a permute's must be a permutation."""
    _, members = h._pt2_members(h.SAMPLES / "transformer.pt2")
    document = json.loads(members[h.MODEL_JSON])
    assert program_problem(document, [1 << 20]) is None
    nodes = document["graph_module"]["graph"]["nodes"]
    permute = next(n for n in nodes if n["target"] == "torch.ops.aten.permute.default")
    dims = next(i for i in permute["inputs"] if i["name"] == "dims")
    good = list(dims["arg"]["as_ints"])
    for bad, said in (([1, 10**18], "names dimensions"), ([0] * len(good), "not a permutation")):
        dims["arg"]["as_ints"] = bad
        assert said in program_problem(document, [1 << 20])  # type: ignore[operator]
    dims["arg"]["as_ints"] = [d - len(good) for d in good]  # negative dimensions are fine
    assert program_problem(document, [1 << 20]) is None
    source = next(i for i in permute["inputs"] if i["name"] == "self")  # a diagonal's second dimension too
    permute["target"] = "torch.ops.aten.diagonal.default"
    permute["inputs"] = [source, *({"name": n, "arg": {"as_int": v}, "kind": 1} for n, v in
                                   (("offset", 0), ("dim1", 0), ("dim2", 10**18)))]  # fmt: skip
    assert "names dimensions '[1000000000000000000]'" in program_problem(document, [1 << 20])  # type: ignore[operator]


@pytest.mark.parametrize("shape", [[], "graph", {"graph": []}, {"graph": {"nodes": 7}}])
def test_a_malformed_document_is_refused_in_one_line(shape: object, tmp_path: Path) -> None:
    """The custom-op scan runs before the audit: a graph of the wrong JSON type is the audit's
    one line, never an AttributeError from the scan."""

    def edit(members: dict[str, bytes]) -> None:
        document = json.loads(members[h.MODEL_JSON])
        document["graph_module"] = shape
        members[h.MODEL_JSON] = json.dumps(document).encode()

    path = h.rewrite_pt2(h.SAMPLES / "mlp.pt2", tmp_path / "bad.pt2", edit)
    with pytest.raises(ModelFileError) as refused:
        load_pt2(path)
    assert "bad.pt2" in str(refused.value) and "\n" not in str(refused.value)


def test_a_graph_read_again_is_a_copy_from_what_decides_it_and_no_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that reads the same entries again deserializes and walks their graph once and
    hands out a copy around the file's own tensors, that nothing done to an earlier program
    reaches; a file whose program JSON is the same but whose weights config declares another
    layout is read and walked afresh, and refused."""
    import coreai_opt.io._known as known
    import coreai_opt.io._pt2_archive as archive

    walks: list[int] = []
    walk = archive.check_shapes

    def counted(program: torch.export.ExportedProgram, budget: int) -> object:
        walks.append(budget)
        return walk(program, budget)

    monkeypatch.setattr(known, "_KNOWN", type(known._KNOWN)())
    monkeypatch.setattr(archive, "check_shapes", counted)

    def other_weights(members: dict[str, bytes]) -> None:  # the same entries but fc1's values
        config = json.loads(members[h.WEIGHTS_CONFIG])
        record = "data/weights/" + config["config"]["fc1.weight"]["path_name"]
        members[record] = bytes(len(members[record]))

    same = [h.rewrite_pt2(h.SAMPLES / "mlp.pt2", tmp_path / f"{name}.pt2", lambda _: None) for name in "abc"]
    first = load_pt2(same[0])
    (kept,) = known._KNOWN.values()
    assert kept.template is not None and all(
        t.is_meta for t in [*kept.template.state_dict.values(), *kept.template.constants.values()]
    )
    code, x = first.graph_module.code, torch.randn(4, 64)
    expected = first.module()(x)
    for node in first.graph.nodes:  # what a pass might do to the first program
        if node.op == "call_function":
            node.target = torch.ops.aten.neg.default if len(node.args) == 1 else node.target
    first.graph_module.recompile()
    assert first.graph_module.code != code
    with torch.no_grad():
        first.state_dict["fc1.weight"].mul_(0)
    first.state_dict["fc2.weight"] = torch.zeros(1)
    second, third = (load_pt2(path) for path in same[1:])
    assert len(walks) == 1
    assert second.graph_module.code == third.graph_module.code == code
    assert second.state_dict["fc1.weight"] is not third.state_dict["fc1.weight"]
    assert torch.equal(second.module()(x), expected) and torch.equal(third.module()(x), expected)
    runs = [p.graph_module.meta["coreopt.file_run"] for p in (second, third)]
    assert [r.path for r in runs] == same[1:]
    assert (runs[0].value_bytes, runs[0].flops) == (runs[1].value_bytes, runs[1].flops) != (0, 0.0)
    zeroed = load_pt2(h.rewrite_pt2(h.SAMPLES / "mlp.pt2", tmp_path / "zeroed.pt2", other_weights))
    assert len(walks) == 1 and not zeroed.state_dict["fc1.weight"].any()
    assert not torch.equal(zeroed.module()(x), expected)
    monkeypatch.setattr(known, "_NODES_KEPT", 0)  # too large to keep: read afresh, walked once
    known._KNOWN.clear()
    assert all(torch.equal(load_pt2(path).module()(x), expected) for path in same[1:])
    assert len(walks) == 2 and [k.template for k in known._KNOWN.values()] == [None]

    def transposed(members: dict[str, bytes]) -> None:
        config = json.loads(members[h.WEIGHTS_CONFIG])
        meta = config["config"]["fc1.weight"]["tensor_meta"]
        rows, columns = (size["as_int"] for size in meta["sizes"])
        meta["sizes"] = [{"as_int": columns}, {"as_int": rows}]
        meta["strides"] = [{"as_int": rows}, {"as_int": 1}]
        members[h.WEIGHTS_CONFIG] = json.dumps(config).encode()

    lying = h.rewrite_pt2(h.SAMPLES / "mlp.pt2", tmp_path / "lying.pt2", transposed)
    said = r"p_fc1_weight is stored as float32\[64, 128\] but declared"
    for _ in range(2):
        with pytest.raises(ModelFileError, match=said):
            load_pt2(lying)
    assert len(walks) == 3
