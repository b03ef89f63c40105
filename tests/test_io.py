"""Model-file I/O: round trips keep graphs and weights; writes are atomic and never touch inputs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _hostile import tree_digest
from conftest import SAMPLES, constant_records, copy_sample

from coreai_opt import _coreai
from coreai_opt.io import (
    OutputExistsError,
    SameAsInputError,
    UnwritableOutputError,
    load_aimodel,
    load_pt2,
    save_aimodel,
    save_pt2,
)


def test_pt2_round_trip_keeps_graph_and_weights(tmp_path: Path) -> None:
    original = load_pt2(SAMPLES / "transformer.pt2")
    saved = save_pt2(original, tmp_path / "copy.pt2")
    again = load_pt2(saved)
    assert again.graph_module.code == original.graph_module.code
    assert original.state_dict.keys() == again.state_dict.keys()
    for name, tensor in original.state_dict.items():
        assert torch.equal(tensor, again.state_dict[name]), name


class _Held(torch.nn.Module):
    """A parameter, a buffer and a tensor constant: every kind of tensor a program's archive holds."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(8, 4, generator=torch.Generator().manual_seed(0)))
        self.register_buffer("shift", torch.arange(8.0))
        self.table = torch.linspace(-1.0, 1.0, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.T + self.shift * self.table


@pytest.mark.parametrize("sample", ["transformer.pt2", "held"])
def test_the_graph_serialized_without_weights_gives_the_same_archive(sample: str) -> None:
    """torch before 2.13 pickles every weight again to serialize the graph (`_weights_written_once`
    serializes it from meta stand-ins instead): the archive must come out byte for byte the same."""
    import io

    from coreai_opt.io._pt2 import _weights_written_once

    if sample == "held":
        program = torch.export.export(_Held(), (torch.ones(2, 4),))
    else:
        program = load_pt2(SAMPLES / sample)
    assert program.constants or sample != "held"
    plain, light = io.BytesIO(), io.BytesIO()
    torch.export.save(program, plain)
    with _weights_written_once(force=True):
        torch.export.save(program, light)
    assert light.getvalue() == plain.getvalue()
    assert all(t.device.type == "cpu" for t in program.state_dict.values())  # the caller's program as it was


def test_the_graph_is_serialized_without_weights_only_where_the_pickle_is_thrown_away() -> None:
    """torch 2.8's packager wrote `serialize`'s pickled state dict as the archive's weights: there
    meta stand-ins would lose them, so the pickle is left alone; 2.9-2.12 throw it away; 2.13's
    `serialize` skips it itself."""
    import types

    from coreai_opt.io._pt2 import _discards_pickled_weights

    def old_serialize(ep, opset_version=None, pickle_protocol=2):  # type: ignore[no-untyped-def]
        return ep

    def new_serialize(ep, opset_version=None, pickle_protocol=2, *, serialize_state_dict=True):  # type: ignore[no-untyped-def]
        return ep

    def writes_the_pickle(writer, programs):  # type: ignore[no-untyped-def]  # torch 2.8
        artifact = old_serialize(programs)
        writer.write_bytes("weights", artifact.state_dict)
        writer.write_bytes("constants", artifact.constants)

    def writes_a_tensor_at_a_time(writer, programs):  # type: ignore[no-untyped-def]  # torch 2.9-2.13
        artifact = old_serialize(programs)
        writer.write_bytes("model", artifact.exported_program)

    def package(writer: object, **helpers: object) -> types.SimpleNamespace:
        return types.SimpleNamespace(_package_exported_programs=writer, **helpers)

    helpers = {"_package_state_dict": len, "_package_constants": len}
    assert not _discards_pickled_weights(package(writes_the_pickle, **helpers), old_serialize)
    assert _discards_pickled_weights(package(writes_a_tensor_at_a_time, **helpers), old_serialize)
    assert not _discards_pickled_weights(package(writes_a_tensor_at_a_time, **helpers), new_serialize)
    assert not _discards_pickled_weights(package(writes_a_tensor_at_a_time), old_serialize)


def test_aimodel_round_trip_keeps_ops_and_constant_bytes(tmp_path: Path) -> None:
    original = load_aimodel(SAMPLES / "cnn.aimodel")
    saved = save_aimodel(original, tmp_path / "copy.aimodel")
    again = load_aimodel(saved)
    module_a, module_b = _coreai.mlir_module(original), _coreai.mlir_module(again)
    assert _coreai.op_histogram(module_a) == _coreai.op_histogram(module_b)
    assert constant_records(original) == constant_records(again)
    assert sorted(p.name for p in saved.iterdir()) == ["main.hash", "main.mlirb", "metadata.json"]


def test_refuses_existing_output_unless_forced(tmp_path: Path) -> None:
    program = load_pt2(SAMPLES / "mlp.pt2")
    target = tmp_path / "out.pt2"
    target.write_bytes(b"keep me")
    with pytest.raises(OutputExistsError):
        save_pt2(program, target)
    assert target.read_bytes() == b"keep me"
    save_pt2(program, target, force=True)
    assert load_pt2(target).graph_module.code == program.graph_module.code


def test_forced_directory_overwrite_replaces_whole_asset(tmp_path: Path) -> None:
    target = copy_sample("transformer", "aimodel", tmp_path)
    (target / "stray.txt").write_text("left over from before")
    save_aimodel(load_aimodel(SAMPLES / "mlp.aimodel"), target, force=True)
    assert not (target / "stray.txt").exists()
    assert constant_records(load_aimodel(target)) == constant_records(load_aimodel(SAMPLES / "mlp.aimodel"))
    assert [p.name for p in tmp_path.iterdir()] == [target.name]  # no temporary or old sibling left


@pytest.mark.parametrize("fmt", ["pt2", "aimodel"])
def test_refuses_to_write_onto_the_input(tmp_path: Path, fmt: str) -> None:
    source = copy_sample("mlp", fmt, tmp_path)
    digest = tree_digest(source)
    program = load_pt2(source) if fmt == "pt2" else load_aimodel(source)
    save = save_pt2 if fmt == "pt2" else save_aimodel
    with pytest.raises(SameAsInputError):
        save(program, source, force=True, inputs=(source,))  # type: ignore[operator]
    assert tree_digest(source) == digest


def test_failed_write_leaves_existing_output_and_no_partial_file(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    target = copy_sample("cnn", "aimodel", tmp_path)
    digest = tree_digest(target)
    program = load_aimodel(SAMPLES / "mlp.aimodel")

    def half_written(self, path, *args, **kwargs):  # type: ignore[no-untyped-def]
        path.mkdir()
        (path / "main.mlirb").write_bytes(b"partial")
        raise RuntimeError("disk full")

    monkeypatch.setattr(type(program), "save_asset", half_written)
    with pytest.raises(UnwritableOutputError, match="disk full"):
        save_aimodel(program, target, force=True)
    assert tree_digest(target) == digest
    assert [p.name for p in tmp_path.iterdir()] == [target.name]


def test_unwritable_parent_is_reported(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(UnwritableOutputError, match=r"not a directory|cannot create"):
        save_pt2(load_pt2(SAMPLES / "mlp.pt2"), blocker / "out.pt2")


def test_a_torch_whose_serializer_lacks_a_dtype_is_one_line_and_leaves_no_file(
    tmp_path: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """torch.export.save before torch 2.12 has no float8_e8m0fnu (the E8M0 scales of MX formats):
    saving such a program says so in one line and writes nothing (seen with torch 2.11 on a GPU
    machine, where it was a KeyError traceback after the whole compression had run)."""
    from torch._export.serde import serialize

    from coreai_opt.compression import QuantizeConfig, compress_

    program = load_pt2(SAMPLES / "mlp.pt2")
    compress_(program, QuantizeConfig(dtype="mxfp4", weight_num_threshold=0))
    assert any(t.dtype == torch.float8_e8m0fnu for t in program.state_dict.values())
    monkeypatch.delitem(serialize._TORCH_TO_SERIALIZE_DTYPE, torch.float8_e8m0fnu)  # as torch 2.11 has it
    with pytest.raises(UnwritableOutputError, match=r"cannot store torch.float8_e8m0fnu tensors in a \.pt2"):
        save_pt2(program, tmp_path / "mx.pt2")
    assert list(tmp_path.iterdir()) == []


def test_the_private_torch_apis_the_loader_relies_on_are_there() -> None:
    """The safe `.pt2` loader reads the archive itself and hands torch's own deserializer the parsed
    program: these private names and their behaviour are what it uses (a torch upgrade that moves
    them fails here, not in a user's hands)."""
    import torch
    from torch._export.serde import schema
    from torch._export.serde.serialize import (
        _SERIALIZE_TO_TORCH_DTYPE,
        _SYM_OPS,
        ExportedProgramDeserializer,
        _dict_to_dataclass,
    )
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch._weights_only_unpickler import _get_allowed_globals

    assert _SERIALIZE_TO_TORCH_DTYPE[schema.ScalarType.FLOAT] is torch.float32
    assert schema.ScalarType(10) is schema.ScalarType.COMPLEXFLOAT
    assert "torch._utils._rebuild_tensor_v2" in _get_allowed_globals()
    assert len(_SYM_OPS) > 10 and callable(FakeTensorMode)
    serialized = _dict_to_dataclass(schema.ExportedProgram, _model_json(SAMPLES / "mlp.pt2"))
    assert isinstance(serialized, schema.ExportedProgram)
    assert callable(ExportedProgramDeserializer(None).deserialize)


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer", "wide_range", "int_arith", "compressed"])
def test_the_schema_reader_builds_what_torchs_own_builds(name: str, tmp_path: Path) -> None:
    """`schema_object` reads each class's field types once: the dataclasses it builds from a
    program's model.json equal those of torch's `_dict_to_dataclass`, field for field (samples
    of every kind, and a program calling coreai-torch's decompression ops)."""

    from torch._export.serde import schema
    from torch._export.serde.serialize import _dict_to_dataclass

    from coreai_opt.compression import PalettizeConfig
    from coreai_opt.io._schema_reader import schema_object
    from coreai_opt.recipes import compress_file

    path = SAMPLES / f"{name}.pt2"
    if name == "compressed":
        path = compress_file(
            SAMPLES / "transformer.pt2", tmp_path / "p.pt2", PalettizeConfig(n_bits=2, weight_num_threshold=0)
        ).output
    document = _model_json(path)
    ours, torchs = (
        schema_object(schema.ExportedProgram, document),
        _dict_to_dataclass(schema.ExportedProgram, document),
    )
    assert ours == torchs and repr(ours) == repr(torchs) and len(ours.graph_module.graph.nodes) > 3


def _model_json(path: Path) -> object:
    """A `.pt2`'s parsed models/model.json."""
    import json
    import zipfile

    with zipfile.ZipFile(path) as archive:
        member = next(n for n in archive.namelist() if n.endswith("models/model.json"))
        return json.loads(archive.read(member))


def _corrupted(where: str) -> object:
    """The sample transformer's model.json with one thing wrong."""
    document = _model_json(SAMPLES / "transformer.pt2")
    node = next(n for n in document["graph_module"]["graph"]["nodes"] if n["inputs"])
    if where == "a list for an object":
        document["graph_module"] = []
    elif where == "a union of no kind":
        node["inputs"][0]["arg"] = {}
    else:  # a union of two kinds
        node["inputs"][0]["arg"] = {"as_int": 1, "as_float": 2.0}
    return document


@pytest.mark.parametrize(
    ("where", "said"),
    [("a list for an object", "GraphModule: expected an object"), ("a union of no kind", "expected an object of one key"),
     ("a union of two kinds", "expected an object of one key")],
)  # fmt: skip
def test_the_schema_reader_refuses_a_malformed_document_with_an_exception(where: str, said: str) -> None:
    """A list where an object belongs, a union of no kind or two, in an otherwise whole program:
    the reader's own exception, which the loader turns into its one-line refusal."""
    from torch._export.serde import schema

    from coreai_opt.io._schema_reader import schema_object

    with pytest.raises(TypeError, match=said):
        schema_object(schema.ExportedProgram, _corrupted(where))


def test_coreai_opt_load_runs_a_compressed_program_with_no_other_import(tmp_path: Path) -> None:
    """A fresh interpreter: `coreai_opt.load` alone registers coreai-torch's ops the program calls."""
    import subprocess
    import sys

    from coreai_opt.compression import PalettizeConfig
    from coreai_opt.recipes import compress_file

    out = tmp_path / "mlp.lut4.pt2"
    compress_file(SAMPLES / "mlp.pt2", out, PalettizeConfig(n_bits=4, weight_num_threshold=0))
    script = (
        "import sys, torch, coreai_opt\n"
        "p = coreai_opt.load(sys.argv[1])\n"
        "x = torch.randn(*p.graph_signature.user_inputs and [n.meta['val'].shape for n in p.graph.nodes "
        "if n.name == p.graph_signature.user_inputs[0]][0])\n"
        "names = {n.target.name() for n in p.graph.nodes if n.op == 'call_function' and hasattr(n.target, 'name')}\n"
        "print(bool(torch.isfinite(p.module()(x)).all()), 'coreai::lut_to_dense' in names)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(out)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True"]
