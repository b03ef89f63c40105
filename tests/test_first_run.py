"""A program read from a file runs first in a forked child (io._runs, _export.runnable), and a
node that fails when run is one line naming the file, the node and the reason."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import ROOT, SAMPLES

from coreai_opt._export import coreai_decompositions, runnable
from coreai_opt.io import FileRun, ProgramRunError, file_run, first_run, load_pt2, running

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the first run is forked on Linux"
)


@pytest.fixture(autouse=True)
def _own_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Passed first runs are remembered in a folder of this test's own."""
    monkeypatch.setenv("COREOPT_CHECKED_ASSETS", str(tmp_path / "record"))


def _run(tmp_path: Path, flops: float = 0.0) -> FileRun:
    return FileRun(tmp_path / "model.pt2", value_bytes=0, flops=flops)


def test_a_child_that_crashes_is_one_typed_error_and_this_process_lives_on(tmp_path: Path) -> None:
    import ctypes

    with pytest.raises(ProgramRunError, match=r"model.pt2: the program failed its first run, in a worker "
                       r"\(the process running it crashed \(SIGSEGV\)\)"):  # fmt: skip
        first_run(_run(tmp_path), lambda: ctypes.string_at(0))
    assert torch.ones(2).sum().item() == 2.0


def test_a_child_that_asks_for_more_memory_than_its_values_need_is_stopped(tmp_path: Path) -> None:
    with pytest.raises(ProgramRunError, match="ran out of memory"):
        first_run(_run(tmp_path), lambda: torch.ones(1 << 33, dtype=torch.uint8))  # 8 GiB: past its margin


def test_a_child_that_computes_past_its_time_is_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from coreai_opt.io import _runs

    monkeypatch.setattr(_runs, "_BASE_SECONDS", 1.0)

    def spin() -> None:
        while True:
            pass

    with pytest.raises(ProgramRunError, match="killed by SIGXCPU: past 1 CPU seconds"):
        first_run(_run(tmp_path), spin)


def test_a_program_read_from_a_file_runs_first_in_a_child_once_per_file(tmp_path: Path) -> None:
    """The first `runnable` forks (the program's own values and arithmetic set the limits); a
    second load of the unchanged file finds the run remembered, a changed file does not."""
    path = tmp_path / "transformer.pt2"
    shutil.copy(SAMPLES / "transformer.pt2", path)
    program = load_pt2(path)
    run = file_run(program)
    assert run is not None and not run.ran and run.value_bytes > 0 and run.flops > 0
    module = runnable(program)
    assert run.ran
    assert file_run(load_pt2(path)).ran  # type: ignore[union-attr]
    path.write_bytes(path.read_bytes())  # the same bytes, a new identity
    assert not file_run(load_pt2(path)).ran  # type: ignore[union-attr]
    tokens, mask = torch.arange(16).reshape(1, 16), torch.ones(1, 16, dtype=torch.int64)
    reference = load_pt2(SAMPLES / "transformer.pt2", trust_pickle=True).module()
    assert torch.equal(module(tokens, mask), reference(tokens, mask))


def test_an_op_whose_kernel_crashes_is_a_line_not_a_dead_process(tmp_path: Path) -> None:
    """An admitted op whose native kernel crashes on a value (simulated: relu's CPU kernel reads
    address 0) kills the child that runs the program first; `compare` prints one line and exits 1."""
    script = textwrap.dedent(
        """
        import ctypes, sys, warnings, torch
        library = torch.library.Library("aten", "IMPL")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "overriding a previously registered kernel": the point
            library.impl("relu", lambda x: ctypes.string_at(0), "CPU")
        from typer.testing import CliRunner
        from cli.coreopt_app import app
        result = CliRunner().invoke(app, sys.argv[1:])
        sys.stderr.write(result.stderr)
        sys.exit(result.exit_code)
        """
    )
    model = tmp_path / "mlp.pt2"
    shutil.copy(SAMPLES / "mlp.pt2", model)
    env = {"COREOPT_CHECKED_ASSETS": str(tmp_path / "record"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", script, "compare", str(model), str(model)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=env)  # fmt: skip
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {model}: the program failed its first run"), lines
    assert "crashed (SIGSEGV)" in lines[0]


def test_a_node_that_refuses_its_values_is_named(tmp_path: Path) -> None:
    class Picks(torch.nn.Module):
        def forward(self, table: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
            return torch.index_select(table * 2, 0, rows)

    path = tmp_path / "picks.pt2"
    program = torch.export.export(Picks(), (torch.randn(4, 3), torch.tensor([1])))
    torch.export.save(program.run_decompositions(coreai_decompositions()), path)
    module = runnable(load_pt2(path))
    with pytest.raises(ProgramRunError) as failed, running(path):
        module(torch.randn(4, 3), torch.tensor([100]))
    assert str(failed.value) == (
        f"{path}: the program failed when run: node index_select (aten.index_select.default): "
        "index out of range in self"
    )


def test_coreopts_own_failures_are_not_the_programs(tmp_path: Path) -> None:
    with pytest.raises(ZeroDivisionError), running(tmp_path / "model.pt2"):
        _ = 1 / 0


def test_on_a_device_the_weights_decode_after_the_first_run_to_the_same_bits(tmp_path: Path) -> None:
    """`runnable(program, device)` runs the file first in a child that decodes its own copy, then
    decodes on the device: the same outputs, bit for bit, as decoding on the host first."""
    from coreai_opt.compression import PalettizeConfig, QuantizeConfig
    from coreai_opt.recipes import compress_file

    tokens, mask = torch.arange(16).reshape(1, 16), torch.ones(1, 16, dtype=torch.int64)
    for index, config in enumerate((QuantizeConfig(weight_num_threshold=0), PalettizeConfig(n_bits=4))):
        path = compress_file(SAMPLES / "transformer.pt2", tmp_path / f"c{index}.pt2", config).output
        program = load_pt2(path)
        run = file_run(program)
        assert run is not None and not run.ran
        module = runnable(program, "cpu")
        assert run.ran
        on_host = runnable(load_pt2(path))
        assert any(name.startswith("_coreopt_dense") for name, _ in module.named_buffers())
        assert torch.equal(module(tokens, mask), on_host(tokens, mask))


def test_release_unheld_lets_go_of_the_codes_and_the_module_runs_the_same(tmp_path: Path) -> None:
    """After decoding, the program's codes are the only tensors the module does not hold: they
    become meta tensors of the same shapes (their bytes counted), and the module's outputs stay."""
    from coreai_opt._export import release_unheld
    from coreai_opt.compression import QuantizeConfig
    from coreai_opt.recipes import compress_file

    path = compress_file(
        SAMPLES / "transformer.pt2", tmp_path / "q.pt2", QuantizeConfig(weight_num_threshold=0)
    ).output
    program = load_pt2(path)
    module = runnable(program)
    tokens, mask = torch.arange(16).reshape(1, 16), torch.ones(1, 16, dtype=torch.int64)
    before = module(tokens, mask)
    shapes = {k: (v.shape, v.dtype) for k, v in program.state_dict.items()}
    codes = {k for k in program.state_dict if "compressed" in k}
    released = release_unheld(program, module)
    assert codes and released == sum(shapes[k][0].numel() * shapes[k][1].itemsize for k in codes)
    assert {k for k, v in program.state_dict.items() if v.device.type == "meta"} == codes
    assert {k: (v.shape, v.dtype) for k, v in program.state_dict.items()} == shapes
    assert torch.equal(module(tokens, mask), before)


def test_folding_lets_go_of_each_weights_codes_once_decoded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the weights decode, the codes of every weight decoded before are gone from the module
    (a device holds one weight's codes beside the decoded weights), and the result is the same."""
    from coreai_opt._export import _ops
    from coreai_opt.compression import QuantizeConfig
    from coreai_opt.recipes import compress_file

    path = compress_file(
        SAMPLES / "transformer.pt2", tmp_path / "q.pt2", QuantizeConfig(weight_num_threshold=0)
    ).output
    module = load_pt2(path).module()
    expected = runnable(load_pt2(path))
    codes = lambda: sum(  # noqa: E731
        1 for n, b in module.named_buffers() if "compressed" in n and b.device.type != "meta"
    )
    seen: list[int] = []
    decode = _ops._DECODERS[_ops.SHIFT_SCALE]
    monkeypatch.setitem(
        _ops._DECODERS, _ops.SHIFT_SCALE, lambda *a, **k: (seen.append(codes()), decode(*a, **k))[1]
    )
    assert _ops.fold_decompression(module) == len(seen) > 2
    assert seen == sorted(seen, reverse=True) and seen[-1] < seen[0] and codes() == 0
    tokens, mask = torch.arange(16).reshape(1, 16), torch.ones(1, 16, dtype=torch.int64)
    assert torch.equal(module(tokens, mask), expected(tokens, mask))
