"""Executors run the per-weight encoding elsewhere; the file written is the same byte for byte."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from conftest import SAMPLES

from coreai_opt.compression import (
    LocalExecutor,
    PalettizeConfig,
    QuantizeConfig,
    RayExecutor,
    SparsifyConfig,
    executor_of,
)
from coreai_opt.recipes import compress_file

CONFIGS = {
    "quantize": QuantizeConfig(dtype="int4", granularity="block", block_size=16, weight_num_threshold=256),
    "palettize": PalettizeConfig(n_bits=4, granularity="grouped", group_size=4, weight_num_threshold=256),
    "sparsify": SparsifyConfig(n_m_ratio=(2, 4), quantize_dtype="int8", weight_num_threshold=256),
}


def _files(path: Path) -> dict[str, bytes]:
    if path.is_file():
        return {"": path.read_bytes()}
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def _same_file(source: Path, tmp_path: Path, config: Any, executor: Any) -> None:
    """Compress `source` on this process and on `executor`: same report, same bytes."""
    local = compress_file(source, tmp_path / f"local{source.suffix}", config)
    other = compress_file(source, tmp_path / f"other{source.suffix}", config, executor=executor)
    assert _files(local.output) == _files(other.output)
    assert other.report.to_dict() == local.report.to_dict()
    assert local.report.weights, f"{source.name}: nothing compressed, the comparison proves nothing"


class OutOfOrderExecutor:
    """Runs jobs on threads and finishes them in reverse order, yielding in the jobs' order: what a
    cluster does to results, without one."""

    def map(self, fn: Callable[..., Any], jobs: Iterable[tuple[Any, ...]]) -> Iterator[Any]:
        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(fn, *job) for job in list(jobs)]
            results = [f.result() for f in reversed(futures)][::-1]
        yield from results


@pytest.mark.parametrize("suffix", [".aimodel", ".pt2"])
def test_an_executor_that_finishes_out_of_order_writes_the_same_file(
    suffix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    _same_file(SAMPLES / f"transformer{suffix}", tmp_path, CONFIGS["palettize"], OutOfOrderExecutor())


@pytest.fixture
def four_torch_threads() -> Iterator[None]:
    """torch with four threads of its own (make test gives each worker one), as a user's machine
    has: the local executor's default takes two weights at a time, and shares them out."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(4)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("method", list(CONFIGS))
@pytest.mark.usefixtures("four_torch_threads")
def test_weights_on_threads_write_the_file_one_thread_writes(
    method: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The local executor's threads (two weights at a time, one torch thread each) give the bytes
    of one weight at a time on torch's own threads; torch's thread count is back afterwards."""
    import torch

    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    threads = torch.get_num_threads()
    for suffix in (".aimodel", ".pt2"):
        folder = tmp_path / suffix.lstrip(".")
        folder.mkdir()
        one = compress_file(SAMPLES / f"transformer{suffix}", folder / f"one{suffix}", CONFIGS[method],
                            executor=LocalExecutor(workers=1))  # fmt: skip
        many = compress_file(SAMPLES / f"transformer{suffix}", folder / f"many{suffix}", CONFIGS[method],
                             executor=LocalExecutor(workers=3))  # fmt: skip
        default = compress_file(
            SAMPLES / f"transformer{suffix}", folder / f"default{suffix}", CONFIGS[method]
        )
        assert _files(one.output) == _files(many.output) == _files(default.output)
        assert many.report.to_dict() == one.report.to_dict() and one.report.weights
    assert torch.get_num_threads() == threads


@pytest.mark.usefixtures("four_torch_threads")
def test_threads_stop_and_torch_threads_come_back_when_a_weight_fails() -> None:
    import torch

    threads = torch.get_num_threads()
    seen: list[int] = []

    def encode(k: int) -> int:
        seen.append(torch.get_num_threads())  # each worker's share
        if k == 3:
            raise RuntimeError("weight 3 is bad")
        return k * k

    results = LocalExecutor(workers=2).map(encode, ((k,) for k in range(50)))
    assert [next(results) for _ in range(3)] == [0, 1, 4]
    with pytest.raises(RuntimeError, match="weight 3 is bad"):
        list(results)
    assert len(seen) < 50  # jobs are drawn as workers free up: the rest never started
    assert set(seen) == {threads // 2} == {2}
    assert torch.get_num_threads() == threads
    with pytest.raises(ValueError, match="workers"):
        LocalExecutor(workers=-1)


def test_executors_by_name_and_bad_values() -> None:
    assert isinstance(executor_of(None), LocalExecutor)
    assert isinstance(executor_of("local"), LocalExecutor)
    custom = OutOfOrderExecutor()
    assert executor_of(custom) is custom
    with pytest.raises(ValueError, match="unknown executor 'dask': choose one of local, ray"):
        executor_of("dask")
    with pytest.raises(TypeError, match="map"):
        executor_of(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="in_flight"):
        RayExecutor(in_flight=0)


def test_executor_ray_without_the_extra_fails_before_any_work(
    coreopt: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    out = tmp_path / "out.aimodel"
    result = coreopt("quantize", SAMPLES / "mlp.aimodel", "-o", out, "--executor", "ray")
    assert result.exit_code == 1
    assert (
        result.stderr
        == "error: the Ray executor needs Ray: pip install 'coreopt[ray]' (or run with executor 'local')\n"
    )
    assert not out.exists()


def test_ray_cluster_of_four_workers_writes_the_local_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two sample models (a conv net; attention with linear layers), every pass, each model and each
    pass on both containers: byte-identical to the local path (one test, so one cluster on the
    machine)."""
    ray = pytest.importorskip("ray", reason="the Ray extra is not installed (pip install 'coreopt[ray]')")
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    try:
        assert ray.cluster_resources()["CPU"] == 4
        executor = RayExecutor(in_flight=3)  # fewer than the weights: the window refills
        compared = 0
        for name in ("cnn", "transformer"):  # a conv and an attention model (linear layers too)
            for method, config in CONFIGS.items():  # containers alternate: each model and pass meets both
                suffix = (".aimodel", ".pt2")[compared % 2]
                folder = tmp_path / f"{name}{suffix}.{method}"
                folder.mkdir()
                _same_file(SAMPLES / f"{name}{suffix}", folder, config, executor)
                compared += 1
        assert compared == 2 * len(CONFIGS)
    finally:
        ray.shutdown()


def test_a_ray_cluster_that_cannot_start_is_one_line_not_an_unexpected_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, coreopt
) -> None:  # type: ignore[no-untyped-def]
    """Ray's own start-up failure (here: raised by a stand-in for `ray.init`; under an address-space
    limit the raylet times out) is the machine's problem: exit 1, one line saying so."""
    import types

    from coreai_opt.compression import _executors

    def refuse(**_: Any) -> None:
        raise RuntimeError("The current node timed out during startup.\nThe raylet failed to start.")

    fake = types.SimpleNamespace(is_initialized=lambda: False, init=refuse)
    monkeypatch.setattr(_executors, "import_ray", lambda: fake)
    result = coreopt("quantize", SAMPLES / "mlp.pt2", "--executor", "ray", "-o", tmp_path / "out.pt2")
    assert result.exit_code == 1
    assert result.stderr == (
        "error: --executor ray: no Ray cluster could be started or reached (The current node timed out during "
        "startup. The raylet failed to start.)\n"
    )
    assert not (tmp_path / "out.pt2").exists()
