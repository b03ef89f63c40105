"""Where the per-weight work of a pass runs: in this process, or as Ray tasks on a cluster.

The driver reads weights and writes encodings in site order; an executor only maps the encoder
over (weight, site, config) jobs and yields the results in the order the jobs came. The encoders
are deterministic, so every executor gives the same encodings and the written file is
byte-identical. Ray is imported only by `RayExecutor`, which a user asks for by name.
"""

from __future__ import annotations

import enum
import logging
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

R = TypeVar("R")


class ExecutorKind(enum.Enum):
    LOCAL = "local"  # this process: weights on a few threads, each with its share of torch's threads
    RAY = "ray"  # Ray tasks on the cluster `ray.init()` finds (a local one if there is none)


class Executor(Protocol):
    def map(self, fn: Callable[..., R], jobs: Iterable[tuple[Any, ...]]) -> Iterator[R]:
        """fn(*job) for every job, yielded in the jobs' order; jobs are drawn lazily."""
        ...


@dataclass(frozen=True)
class LocalExecutor:
    """Jobs in this process, `workers` weights at a time, each on its own thread with an equal
    share of torch's intra-op threads (0: two workers where torch has two threads or more).

    Why threads per weight: the encoders are chains of elementwise passes over cache-sized pieces,
    and torch's OpenMP threads spin between such short parallel regions - on 2 cores a third of
    the CPU seconds bought nothing. Two weights on one thread each keep both cores busy with no
    spinning (the ops release the GIL). Jobs are drawn as workers free up, so at most `workers`
    weights (plus the one being read) are held at once; results are yielded in the jobs' order.
    torch's thread count is restored when the map ends."""

    workers: int = 0

    def __post_init__(self) -> None:
        if self.workers < 0:
            raise ValueError(f"workers must be >= 0, got {self.workers}")

    def map(self, fn: Callable[..., R], jobs: Iterable[tuple[Any, ...]]) -> Iterator[R]:
        import torch

        threads = torch.get_num_threads()
        workers = self.workers or (2 if threads >= 2 else 1)
        if workers == 1:
            return (fn(*job) for job in jobs)
        return _on_threads(fn, jobs, workers, max(1, threads // workers), threads)


def _on_threads(
    fn: Callable[..., R], jobs: Iterable[tuple[Any, ...]], workers: int, share: int, threads: int
) -> Iterator[R]:
    import torch

    pool = ThreadPoolExecutor(workers, thread_name_prefix="coreopt-encode", initializer=torch.set_num_threads,
                              initargs=(share,))  # fmt: skip
    pending: deque[Future[R]] = deque()
    try:
        for job in jobs:
            pending.append(pool.submit(fn, *job))
            if len(pending) >= workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for future in pending:
            future.cancel()
        pool.shutdown(wait=True)
        torch.set_num_threads(threads)  # the workers' share was also torch's default for new threads


@dataclass(frozen=True)
class RayExecutor:
    """Jobs as Ray tasks; their arguments and results travel through Ray's object store.

    `address`: the cluster for `ray.init` when Ray is not initialized yet (None: the one in
    `RAY_ADDRESS`, else a new local one). `in_flight`: how many jobs may be submitted and not yet
    collected (None: twice the cluster's CPUs), which bounds the weights held in the object store.
    `num_cpus`: CPUs one task reserves (the encoders' threads use what the task gets).
    """

    address: str | None = None
    in_flight: int | None = None
    num_cpus: float = 1.0

    def __post_init__(self) -> None:
        if self.in_flight is not None and self.in_flight < 1:
            raise ValueError(f"in_flight must be >= 1, got {self.in_flight}")
        if self.num_cpus <= 0:
            raise ValueError(f"num_cpus must be > 0, got {self.num_cpus}")

    def map(self, fn: Callable[..., R], jobs: Iterable[tuple[Any, ...]]) -> Iterator[R]:
        ray = import_ray()
        if not ray.is_initialized():
            try:
                ray.init(
                    address=self.address or os.environ.get("RAY_ADDRESS"),
                    log_to_driver=False,
                    logging_level=logging.ERROR,
                )
            except Exception as exc:  # Ray raises its own types (a start-up timeout, a refused address)
                raise ClusterUnavailable(
                    f"--executor ray: no Ray cluster could be started or reached ({exc})"
                ) from None
        window = self.in_flight or max(2, 2 * int(ray.cluster_resources().get("CPU", 1)))
        task = ray.remote(num_cpus=self.num_cpus)(fn)
        pending: deque[Any] = deque()
        for job in jobs:
            pending.append(task.remote(*job))
            if len(pending) >= window:
                yield ray.get(pending.popleft())
        while pending:
            yield ray.get(pending.popleft())


class ClusterUnavailable(OSError):
    """Ray could not start a local cluster or reach the one named: the machine's problem, one line."""


def import_ray() -> Any:
    """The `ray` module, or an ImportError that says how to get it."""
    try:
        import ray
    except ImportError as error:
        raise ImportError(
            "the Ray executor needs Ray: pip install 'coreopt[ray]' (or run with executor 'local')"
        ) from error
    return ray


def executor_of(value: str | ExecutorKind | Executor | None) -> Executor:
    """An executor from its name (`local`, `ray`), its kind, or itself; None: local."""
    if value is None:
        return LocalExecutor()
    if isinstance(value, str):
        try:
            value = ExecutorKind(value)
        except ValueError:
            names = ", ".join(k.value for k in ExecutorKind)
            raise ValueError(f"unknown executor {value!r}: choose one of {names}") from None
    if value is ExecutorKind.LOCAL:
        return LocalExecutor()
    if value is ExecutorKind.RAY:
        import_ray()  # fail before any work when the extra is missing
        return RayExecutor()
    if not callable(getattr(value, "map", None)):
        raise TypeError(f"executor must be 'local', 'ray' or have a map(fn, jobs) method, not {value!r}")
    return value
