"""Every bad model file: exit 1, one line naming the file and the problem, input untouched, no output."""

from __future__ import annotations

import hashlib
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
from _hostile import tree_digest
from conftest import SAMPLES, copy_sample


def _pt2_text(d: Path) -> Path:
    p = d / "model.pt2"
    p.write_text("this is not a model\n")
    return p


def _pt2_truncated(d: Path) -> Path:
    data = (SAMPLES / "mlp.pt2").read_bytes()
    p = d / "model.pt2"
    p.write_bytes(data[: len(data) // 2])
    return p


def _pt2_empty(d: Path) -> Path:
    p = d / "model.pt2"
    p.write_bytes(b"")
    return p


def _pt2_foreign_zip(d: Path) -> Path:
    p = d / "model.pt2"
    with zipfile.ZipFile(p, "w") as archive:
        archive.writestr("notes/readme.txt", "a zip, but not an export")
    return p


def _pt2_corrupt_member(d: Path) -> Path:
    p = copy_sample("mlp", "pt2", d)
    data = bytearray(p.read_bytes())
    with zipfile.ZipFile(p) as archive:
        info = archive.getinfo(next(n for n in archive.namelist() if n.endswith("weight_0")))
    name_len = int.from_bytes(data[info.header_offset + 26 : info.header_offset + 28], "little")
    extra_len = int.from_bytes(data[info.header_offset + 28 : info.header_offset + 30], "little")
    start = info.header_offset + 30 + name_len + extra_len + 8  # inside the stored member's bytes
    data[start : start + 16] = bytes(16)
    p.write_bytes(bytes(data))
    return p


def _pt2_directory(d: Path) -> Path:
    p = d / "model.pt2"
    p.mkdir()
    return p


def _aimodel_file(d: Path) -> Path:
    p = d / "model.aimodel"
    p.write_bytes(b"not a directory")
    return p


def _aimodel_without(name: str) -> Callable[[Path], Path]:
    def make(d: Path) -> Path:
        p = copy_sample("mlp", "aimodel", d)
        (p / name).unlink()
        return p

    return make


def _aimodel_stale_hash(d: Path) -> Path:
    p = copy_sample("mlp", "aimodel", d)
    data = bytearray((p / "main.mlirb").read_bytes())
    data[-100] ^= 0xFF
    (p / "main.mlirb").write_bytes(bytes(data))
    return p


def _with_hash(p: Path, bytecode: bytes) -> Path:
    (p / "main.mlirb").write_bytes(bytecode)
    (p / "main.hash").write_bytes(hashlib.sha256(bytecode).digest())
    return p


def _aimodel_garbage(d: Path) -> Path:
    return _with_hash(copy_sample("mlp", "aimodel", d), b"\x00garbage bytes, hash updated to match" * 20)


def _aimodel_truncated_bytecode(d: Path) -> Path:
    p = copy_sample("mlp", "aimodel", d)
    data = (p / "main.mlirb").read_bytes()
    return _with_hash(p, data[: len(data) // 2])


def _aimodel_flipped_bytecode(d: Path) -> Path:
    p = copy_sample("mlp", "aimodel", d)
    data = bytearray((p / "main.mlirb").read_bytes())
    for i in range(64, 512, 7):  # damage the section headers, keep the magic number
        data[i] ^= 0x5A
    return _with_hash(p, bytes(data))


def _aimodel_bad_metadata(d: Path) -> Path:
    p = copy_sample("mlp", "aimodel", d)
    (p / "metadata.json").write_text("{ not json")
    return p


def _wrong_suffix(d: Path) -> Path:
    p = d / "model.onnx"
    shutil.copy2(SAMPLES / "mlp.pt2", p)
    return p


CASES: dict[str, tuple[Callable[[Path], Path], str]] = {
    "pt2-missing": (lambda d: d / "absent.pt2", "no such file"),
    "aimodel-missing": (lambda d: d / "absent.aimodel", "no such file"),
    "wrong-suffix": (_wrong_suffix, "expected a .pt2 or .aimodel"),
    "pt2-not-zip": (_pt2_text, "not a zip"),
    "pt2-truncated": (_pt2_truncated, "not a zip"),
    "pt2-empty": (_pt2_empty, "empty"),
    "pt2-foreign-zip": (_pt2_foreign_zip, "no torch.export program"),
    "pt2-corrupt-member": (_pt2_corrupt_member, "bad CRC"),
    "pt2-directory": (_pt2_directory, "is a directory"),
    "aimodel-is-file": (_aimodel_file, "must be a directory"),
    "aimodel-no-mlirb": (_aimodel_without("main.mlirb"), "no main.mlirb"),
    "aimodel-no-metadata": (_aimodel_without("metadata.json"), "no metadata.json"),
    "aimodel-no-hash": (_aimodel_without("main.hash"), "no main.hash"),
    "aimodel-stale-hash": (_aimodel_stale_hash, "main.hash does not match"),
    "aimodel-garbage-bytecode": (_aimodel_garbage, "bad magic"),
    "aimodel-truncated-bytecode": (_aimodel_truncated_bytecode, "damaged bytecode"),
    "aimodel-flipped-bytecode": (_aimodel_flipped_bytecode, "damaged bytecode"),
    "aimodel-bad-metadata": (_aimodel_bad_metadata, "not valid JSON"),
}


def _snapshot(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): tree_digest(p) for p in sorted(directory.iterdir())}


def _assert_clean_failure(result, path: Path, problem: str) -> None:  # type: ignore[no-untyped-def]
    assert result.exit_code == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert str(path) in lines[0]
    assert problem in lines[0]
    assert "Traceback" not in result.stderr + result.stdout


@pytest.mark.parametrize("case", sorted(CASES))
def test_inspect_rejects_bad_file(case: str, tmp_path: Path, coreopt) -> None:  # type: ignore[no-untyped-def]
    make, problem = CASES[case]
    path = make(tmp_path)
    before = _snapshot(tmp_path)
    result = coreopt("inspect", path)
    _assert_clean_failure(result, path, problem)
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize(("command", "output"), [("convert", "out.aimodel"), ("cast", "out.pt2")])
@pytest.mark.parametrize(
    "case", ["pt2-not-zip", "pt2-truncated", "pt2-foreign-zip", "pt2-missing", "wrong-suffix"]
)
def test_pt2_commands_reject_bad_file_and_write_nothing(
    case: str, command: str, output: str, tmp_path: Path, coreopt
) -> None:  # type: ignore[no-untyped-def]
    make, problem = CASES[case]
    source = make(tmp_path)
    before = _snapshot(tmp_path)
    result = coreopt(command, source, "-o", tmp_path / output)
    if case == "wrong-suffix":
        problem = "expected a .pt2"
    _assert_clean_failure(result, source, problem)
    assert _snapshot(tmp_path) == before  # no output, no temporary sibling


def test_convert_unwritable_output_directory(tmp_path: Path, coreopt) -> None:  # type: ignore[no-untyped-def]
    source = copy_sample("mlp", "pt2", tmp_path)
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where a directory should be")
    out = blocker / "sub" / "mlp.aimodel"
    before = _snapshot(tmp_path)
    result = coreopt("convert", source, "-o", out)
    _assert_clean_failure(result, out, "cannot create directory")
    assert _snapshot(tmp_path) == before


def test_convert_refuses_existing_output_without_force(tmp_path: Path, coreopt) -> None:  # type: ignore[no-untyped-def]
    source = copy_sample("mlp", "pt2", tmp_path)
    existing = copy_sample("cnn", "aimodel", tmp_path)
    target = tmp_path / "mlp.aimodel"
    existing.rename(target)
    before = _snapshot(tmp_path)
    result = coreopt("convert", source, "-o", target)
    _assert_clean_failure(result, target, "already exists")
    assert _snapshot(tmp_path) == before


def test_convert_wrong_output_suffix(tmp_path: Path, coreopt) -> None:  # type: ignore[no-untyped-def]
    source = copy_sample("mlp", "pt2", tmp_path)
    before = _snapshot(tmp_path)
    result = coreopt("convert", source, "-o", tmp_path / "out.pt2")
    _assert_clean_failure(result, tmp_path / "out.pt2", "expected a .aimodel")
    assert _snapshot(tmp_path) == before


def test_converter_failure_reports_the_converters_message(tmp_path: Path, coreopt) -> None:  # type: ignore[no-untyped-def]
    import coreai_torch
    import torch

    from coreai_opt.io import save_pt2

    class Unsupported(torch.nn.Module):  # a core ATen op (the load check lets it in) the converter lacks
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.sort(x, 0)[0]

    program = torch.export.export(Unsupported(), (torch.randn(4, 4),))
    source = save_pt2(program.run_decompositions(coreai_torch.get_decomp_table()), tmp_path / "sort.pt2")
    before = _snapshot(tmp_path)
    result = coreopt("convert", source)
    _assert_clean_failure(result, source, "unsupported ATen ops: aten.sort.default")
    assert _snapshot(tmp_path) == before


def test_an_op_outside_the_allowlist_is_refused_before_conversion(tmp_path: Path, coreopt) -> None:  # type: ignore[no-untyped-def]
    import coreai_torch
    import torch

    from coreai_opt.io import save_pt2

    class Outside(torch.nn.Module):  # cumprod: neither core ATen nor converted by coreai-torch
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cumprod(x, 0)

    program = torch.export.export(Outside(), (torch.randn(4, 4),))
    source = save_pt2(program.run_decompositions(coreai_torch.get_decomp_table()), tmp_path / "cumprod.pt2")
    before = _snapshot(tmp_path)
    result = coreopt("convert", source)
    _assert_clean_failure(result, source, "node 'cumprod' calls 'torch.ops.aten.cumprod.default'")
    assert _snapshot(tmp_path) == before


AIMODEL_CASES = [
    "aimodel-missing",
    "aimodel-is-file",
    "aimodel-no-mlirb",
    "aimodel-stale-hash",
    "aimodel-garbage-bytecode",
    "aimodel-flipped-bytecode",
    "aimodel-bad-metadata",
]


@pytest.mark.parametrize("case", [*AIMODEL_CASES, "wrong-suffix"])
def test_quantize_rejects_bad_file_and_writes_nothing(case: str, tmp_path: Path, coreopt) -> None:  # type: ignore[no-untyped-def]
    make, problem = CASES[case]
    source = make(tmp_path)
    before = _snapshot(tmp_path)
    result = coreopt("quantize", source, "-o", tmp_path / "out.aimodel")
    _assert_clean_failure(result, source, "expected a .aimodel" if case == "wrong-suffix" else problem)
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("case", AIMODEL_CASES)
@pytest.mark.parametrize("side", ["reference", "candidate"])
def test_compare_names_the_bad_file(case: str, side: str, tmp_path: Path, coreopt) -> None:  # type: ignore[no-untyped-def]
    make, problem = CASES[case]
    bad = make(tmp_path)
    good = SAMPLES / "mlp.aimodel"
    before = _snapshot(tmp_path)
    result = coreopt("compare", *((bad, good) if side == "reference" else (good, bad)))
    _assert_clean_failure(result, bad, problem)
    assert _snapshot(tmp_path) == before
