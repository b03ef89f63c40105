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
from coreai_opt.weights import (
    Calibration,
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

    def dense(self) -> torch.Tensor:
        form = self.encoding.form
        assert isinstance(form, Palettized)
        values = lut_to_dense(self.indices, _value(self.entries), form.axis if self.indices.dim() > 1 else 0)
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
    encodings as they were, and no passes, where no held weight reaches the program's output."""
    tables = [_Tuned.of(site, encoding) for site, encoding in held]
    optimizer = torch.optim.Adam([p for t in tables for p in t.parameters()], lr=_STEP)
    generator = torch.Generator().manual_seed(_SEED)
    count = calibration.sample_count
    steps = epochs * math.ceil(count / _ACCUMULATE)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 - step / steps)
    done, means = 0, []
    for _ in range(epochs):
        order = torch.randperm(count, generator=generator).tolist()
        total = 0.0
        for a in range(0, count, _ACCUMULATE):
            batch = order[a : a + _ACCUMULATE]
            optimizer.zero_grad()
            weights = {t.site.name: t.dense() for t in tables}
            loss = sum(calibration.divergence(weights, sample) for sample in batch) / len(batch)
            if not loss.requires_grad:  # type: ignore[union-attr]
                return [encoding for _, encoding in held], []  # no held weight reaches the program's output
            loss.backward()  # type: ignore[union-attr]
            optimizer.step()
            schedule.step()
            total += float(loss.detach()) * len(batch)  # type: ignore[union-attr]
            done += 1
            if progress is not None:
                progress(done, steps, total / min(a + _ACCUMULATE, count))
        means.append(total / count)
    return [t.tuned() for t in tables], means
