"""Look-up tables tuned end to end (`PalettizeConfig.tune_epochs`): once every palettized
weight's indices are chosen and the weights are swapped into the calibration program, the
tables' continuous parameters - float entries, and the float scales of int8 / FP8 entries or of
channels - are trained together by gradient descent so the compressed program's output on the
calibration samples moves back toward the program's as given (next-token KL divergence for a
language model, relative squared error otherwise: `Calibration.divergence`).

Layer-wise methods (GPTQ, weighted k-means) each keep their own layer's output close; an error in
one layer changes what every later layer sees, which only an end-to-end objective accounts for
(AQLM and PV-tuning fine-tune their codebooks the same way). The indices stay as chosen; the
values end on their stored dtype's grid (tcast), so the encoding's layout and size are
unchanged. Adam's steps are in units of each table's root mean square entry (of each scale's own
size), so one step size fits tables of any scale, and shrink linearly to zero over the run: a
constant step overfits the calibration text at 4 bits (held-out KL rose while perplexity fell;
docs/benchmarks.md). Samples are visited in a seeded order: the result is deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

import tcast
from coreai_opt._memory import ReadOnce, trim_heap
from coreai_opt.weights import (
    Calibration,
    Checkpoints,
    Encoding,
    Palettized,
    ShiftScale,
    Stored,
    WeightSite,
    lut_to_dense,
    shift_scale,
    torch_values,
)

from ..grids import stored_float

_STEP = 5e-3  # Adam's first step size, in units of each table's root mean square entry
_ACCUMULATE = 4  # calibration samples per step
_SEED = 0
_ORDER = 3  # how a step adds its gradients up (2: a window and a weight at a time; 3: and a table's
# entries by `index_add_`): a checkpoint of another order resumes to other bytes, so it is another run

TuningProgress = Callable[[int, int, float], None]  # (steps done, steps in all, mean divergence)


def tunable(encoding: Encoding) -> bool:
    """Whether `encoding` has look-up tables with continuous parameters to tune: float entries of
    16 or 32 bits (without a zero point), or float scales of 16 or 32 bits - the table's own (int8
    entries) or its channels'. Indices, zero points and E8M0 scales keep their grids."""
    form = encoding.form
    return isinstance(form, Palettized) and (_float_entries(form) or _float_scale(form.decode))


def _float_entries(form: Palettized) -> bool:
    element = form.lut.element
    return element.is_float and element.bits >= 16 and (form.decode is None or form.decode.offset is None)


def _float_scale(decode: ShiftScale | None) -> bool:
    return decode is not None and decode.scale.element.is_float and decode.scale.element.bits >= 16


@dataclass
class _Parameter:
    """Stored values made trainable: value = base + delta x unit (delta from zero), `unit` the
    scale of one step (a table's root mean square entry, a scale's own size)."""

    base: torch.Tensor
    unit: torch.Tensor
    delta: torch.Tensor

    @classmethod
    def of(cls, base: torch.Tensor, unit: torch.Tensor) -> _Parameter:
        tiny = torch.finfo(torch.float32).tiny
        return cls(base, unit.clamp_min(tiny), torch.zeros_like(base, requires_grad=True))

    def value(self) -> torch.Tensor:
        return self.base + self.delta * self.unit


@dataclass
class _Tuned:
    """One weight's tables with their tunable parameters (`entries`, `scale`) and what stays as
    stored (indices, an int8 table, E8M0 scales, zero points)."""

    site: WeightSite
    encoding: Encoding
    indices: torch.Tensor  # as stored (lut_to_dense widens them a weight at a time)
    entries: _Parameter | torch.Tensor  # the table: trainable where its entries are float
    scale: _Parameter | torch.Tensor | None  # the decode's scales: trainable where float
    offset: torch.Tensor | None  # zero points, fixed

    @classmethod
    def of(cls, site: WeightSite, encoding: Encoding) -> _Tuned:
        form = encoding.form
        assert isinstance(form, Palettized)
        entries: _Parameter | torch.Tensor = torch_values(form.lut)
        if _float_entries(form):
            table = entries.float()
            entries = _Parameter.of(table, table.pow(2).mean(dim=(-2, -1), keepdim=True).sqrt())
        decode, scale, offset = form.decode, None, None
        if decode is not None:
            scale = torch_values(decode.scale)
            if _float_scale(decode):
                scale = scale.float()
                scale = _Parameter.of(scale, scale.abs())
            if decode.offset is not None and np.any(decode.offset.values):
                offset = torch_values(decode.offset)
        return cls(site, encoding, torch_values(form.indices), entries, scale, offset)

    def parameters(self) -> list[torch.Tensor]:
        return [p.delta for p in (self.entries, self.scale) if isinstance(p, _Parameter)]

    def dense(self, read: ReadOnce | None = None, indices: torch.Tensor | None = None) -> torch.Tensor:
        """The weight decoded (from `indices` in place of its own, where given); its indices `read`
        first where they are file pages handed back as a pass goes (`_driver` parks a held
        weight's codes: a 1.1B model's are 0.7-1 GB)."""
        if read is not None:
            read.passed(self.indices)
        indices = self.indices if indices is None else indices
        form = self.encoding.form
        assert isinstance(form, Palettized)
        values = lut_to_dense(indices, _value(self.entries), form.axis if indices.dim() > 1 else 0)
        return values if self.scale is None else shift_scale(values, _value(self.scale), self.offset)

    def tuned(self) -> Encoding:
        """The encoding with its tuned values, rounded to their stored dtypes."""
        form = self.encoding.form
        assert isinstance(form, Palettized)
        if isinstance(self.entries, _Parameter):
            form = replace(form, lut=_rounded(self.entries.value(), form.lut.element, form.lut.shape))
        if isinstance(self.scale, _Parameter):
            assert form.decode is not None
            scale = _rounded(self.scale.value(), form.decode.scale.element, form.decode.scale.shape)
            form = replace(form, decode=replace(form.decode, scale=scale))
        return replace(self.encoding, form=form)


def _value(held: _Parameter | torch.Tensor) -> torch.Tensor:
    return held.value() if isinstance(held, _Parameter) else held


def _rounded(values: torch.Tensor, element: Any, shape: tuple[int, ...]) -> Stored:
    return stored_float(tcast.cast(values.detach(), element.tcast).reshape(shape), element)


def tune_tables(
    held: list[tuple[WeightSite, Encoding]],
    calibration: Calibration,
    epochs: int,
    progress: TuningProgress | None = None,
) -> tuple[list[Encoding], list[float]]:
    """Each held encoding with its tables tuned over `epochs` passes of the calibration samples
    (see the module), and the mean divergence of each pass (as the tables stood during it); the
    encodings as they were, and no passes, where no held weight reaches the program's output.
    After each pass but the last the state is checkpointed where the calibration keeps them
    (`Calibration.checkpoints`): a run stopped part way resumes from its last pass, to the same
    bytes."""
    tables = [_Tuned.of(site, encoding) for site, encoding in held]
    run = _Run(tables, calibration.sample_count, epochs)
    checkpoints = getattr(calibration, "checkpoints", None)  # a Calibration of before it kept none
    store = checkpoints(lambda: _identity(tables, run)) if checkpoints is not None and epochs > 1 else None
    means = run.resume(store) if store is not None else []
    leaves = _leaves(tables, calibration)
    done = len(means) * run.per_epoch
    if progress is not None and means:
        progress(done, run.steps, means[-1])
    for _ in range(len(means), epochs):
        order = torch.randperm(run.count, generator=run.generator).tolist()
        total = 0.0
        for a in range(0, run.count, _ACCUMULATE):
            batch = order[a : a + _ACCUMULATE]
            run.optimizer.zero_grad()
            loss = _step_gradients(tables, calibration, batch, leaves)
            if loss is None:
                return [encoding for _, encoding in held], []  # no held weight reaches the program's output
            run.optimizer.step()
            run.schedule.step()
            trim_heap()  # a step's activations, freed, back to the system: not held as heap to the end
            total += loss * len(batch)
            done += 1
            if progress is not None:
                progress(done, run.steps, total / min(a + _ACCUMULATE, run.count))
        means.append(total / run.count)
        if store is not None and len(means) < epochs:
            store.store(run.state(means))
    if store is not None:
        store.drop()
    return [t.tuned() for t in tables], means


def _leaves(tables: list[_Tuned], calibration: Calibration) -> dict[str, torch.Tensor]:
    """Each table's weight decoded, as the tensor every step decodes it into, on the calibration's
    device, and swapped into the calibration program: where the program computes with the tensor
    it is given (in the weight's own dtype) it then holds these, not a decoded copy of its own
    beside them (the weights' size again, float32, for as long as the run lasts). On a GPU the
    leaves and their gradients stay there (a 1.1B model's are 8.8 GB): the host holds the tables,
    and one weight's decode at a time."""
    device = getattr(calibration, "device", None)  # a Calibration of before it said none: the tables'
    leaves, read = {}, ReadOnce()
    for t in tables:
        with torch.no_grad():
            leaves[t.site.name] = t.dense(read).to(device)
        calibration.replace(t.site.name, leaves[t.site.name], keep_original=True)
        leaves[t.site.name].requires_grad_()
    read.release()
    return leaves


def _step_gradients(
    tables: list[_Tuned], calibration: Calibration, batch: list[int], leaves: dict[str, torch.Tensor]
) -> float | None:
    """The mean divergence over `batch`, its gradient left on every table's parameters; None where
    no held weight reaches the program's output. The decoded weights enter the program as leaves
    (`leaves`, decoded into again), each sample's graph goes back on its own, and each weight's
    decode goes back once, one weight at a time. A step holds every decoded weight and its
    gradient (float32), the batch's reference outputs, one sample's activations and one weight's
    gather indices (int64, 8 bytes an element), not the batch's activations and every weight's
    indices at once."""
    read = ReadOnce()  # the indices' pages, where parked, held a weight's worth at a time
    with torch.no_grad():
        for t in tables:
            leaves[t.site.name].copy_(t.dense(read))  # each gradient was taken back and cleared below
    # the program's outputs as given, taken before any gradient is held: the weights as given,
    # read in for them, are never resident beside the leaves' gradients (0.54 GB each at 135M)
    references = calibration.references(batch)
    total = 0.0
    for sample in batch:  # each reference let go as it is used
        trim_heap()  # the reference passes' or the last sample's activations, freed: glibc keeps them
        loss = calibration.divergence(leaves, sample, references.pop(0)) / len(batch)
        if not loss.requires_grad:
            read.release()
            return None
        loss.backward()
        total += float(loss.detach())
    for t in tables:
        leaf = leaves[t.site.name]
        grad, leaf.grad = leaf.grad, None
        if grad is not None:
            dense = t.dense(read)
            dense.backward(grad.to(dense.device))  # the tables' own device: the CPU's sums, in order
    read.release()
    return total


class _Run:
    """The optimizer of a tuning run, its sample order's generator and its step schedule, and
    their state as tensors (a checkpoint) after a whole number of passes."""

    def __init__(self, tables: list[_Tuned], count: int, epochs: int) -> None:
        self.parameters = [p for t in tables for p in t.parameters()]
        self.optimizer = torch.optim.Adam(self.parameters, lr=_STEP)
        self.generator = torch.Generator().manual_seed(_SEED)
        self.count, self.epochs = count, epochs
        self.per_epoch = math.ceil(count / _ACCUMULATE)
        self.steps = epochs * self.per_epoch
        self.schedule = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._factor)

    def _factor(self, step: int) -> float:
        return 1.0 - step / self.steps

    def state(self, means: list[float]) -> dict[str, torch.Tensor]:
        """The run after `len(means)` passes: every table's parameters, which of them Adam has
        stepped (each one every step: their count is the steps done) and its moments, and the
        passes' mean divergences (the sample order is replayed from the seed, never stored)."""
        done = torch.zeros(self.epochs, dtype=torch.float64)
        done[: len(means)] = torch.tensor(means, dtype=torch.float64)
        stepped = torch.tensor([p in self.optimizer.state for p in self.parameters], dtype=torch.bool)
        tensors = {"passes": torch.tensor(len(means)), "means": done, "stepped": stepped}
        for i, p in enumerate(self.parameters):
            held = self.optimizer.state.get(p, {})
            tensors[f"delta.{i}"] = p.detach()
            for name in ("exp_avg", "exp_avg_sq"):
                tensors[f"{name}.{i}"] = held.get(name, torch.zeros_like(p)).detach()
        return tensors

    def resume(self, store: Checkpoints) -> list[float]:
        """The passes a checkpoint of this run had done (their mean divergences), with its state
        restored; none where no such checkpoint is stored, or one whose state this run could not
        have reached (nothing is restored from it)."""
        found = store.load(self._expected())
        passes = 0 if found is None else int(found["passes"])
        if found is None or not 0 < passes < self.epochs or not self._reachable(found):
            return []
        done = passes * self.per_epoch
        with torch.no_grad():
            for i, p in enumerate(self.parameters):
                p.copy_(found[f"delta.{i}"])
                if found["stepped"][i]:
                    self.optimizer.state[p] = {
                        "step": torch.tensor(float(done)), "exp_avg": found[f"exp_avg.{i}"].clone(),
                        "exp_avg_sq": found[f"exp_avg_sq.{i}"].clone(),
                    }  # fmt: skip
        for _ in range(passes):  # the orders the passes done drew
            torch.randperm(self.count, generator=self.generator)
        self.schedule.last_epoch = done
        for group in self.optimizer.param_groups:
            group["lr"] = group["initial_lr"] * self._factor(done)
        return found["means"][:passes].tolist()

    def _reachable(self, found: dict[str, torch.Tensor]) -> bool:
        """Some parameter stepped, finite values, second moments of no sign, and nothing moved
        where nothing stepped."""
        if not bool(found["stepped"].any()):
            return False
        if not all(bool(torch.isfinite(t).all()) for t in found.values() if t.is_floating_point()):
            return False
        for i, stepped in enumerate(found["stepped"].tolist()):
            moments = [found[f"{name}.{i}"] for name in ("delta", "exp_avg", "exp_avg_sq")]
            if bool((moments[2] < 0).any()) or (not stepped and any(bool(m.any()) for m in moments)):
                return False
        return True

    def _expected(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        shapes = {"passes": ((), torch.int64), "means": ((self.epochs,), torch.float64),
                  "stepped": ((len(self.parameters),), torch.bool)}  # fmt: skip
        for i, p in enumerate(self.parameters):
            shapes[f"delta.{i}"] = shapes[f"exp_avg.{i}"] = shapes[f"exp_avg_sq.{i}"] = (
                tuple(p.shape),
                p.dtype,
            )
        return shapes


def _identity(tables: list[_Tuned], run: _Run) -> bytes:
    """What a tuning run's result depends on besides the program and the samples: every table's
    indices and values as chosen, the passes and the step rule."""
    import hashlib

    from coreai_opt._cache import tensor_bytes

    digest = hashlib.sha256(f"{run.epochs} {run.count} {_STEP} {_ACCUMULATE} {_SEED} {_ORDER}".encode())
    for t in tables:
        digest.update(t.site.name.encode() + b"\0")
        for part in (t.indices, _stored(t.entries), None if t.scale is None else _stored(t.scale), t.offset):
            if part is not None:
                digest.update(str((part.dtype, tuple(part.shape))).encode())
                digest.update(tensor_bytes(part))
    return digest.digest()


def _stored(held: _Parameter | torch.Tensor) -> torch.Tensor:
    return held.base if isinstance(held, _Parameter) else held
