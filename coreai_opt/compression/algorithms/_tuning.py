"""Look-up tables tuned end to end (`PalettizeConfig.tune_epochs`): once every palettized
weight's indices are chosen and the weights are swapped into the calibration program, the
tables' entries - a few values per table - are trained together by gradient descent so the
compressed program's output on the calibration samples moves back toward the program's as given
(next-token KL divergence for a language model, relative squared error otherwise:
`Calibration.divergence`).

Layer-wise methods (GPTQ, weighted k-means) each keep their own layer's output close; an error in
one layer changes what every later layer sees, which only an end-to-end objective accounts for
(AQLM and PV-tuning fine-tune their codebooks the same way). The indices stay as chosen; the
entries end on their stored dtype's grid (tcast), so the encoding's layout and size are
unchanged. Adam's steps are in units of each table's root mean square entry, so one step size
fits tables of any scale, and shrink linearly to zero over the run: a constant step overfits the
calibration text at 4 bits (held-out KL rose while perplexity fell; docs/benchmarks.md). Samples
are visited in a seeded order: the result is deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

import tcast
from coreai_opt.weights import (
    Calibration,
    Encoding,
    Palettized,
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
    """Whether `encoding` has look-up tables whose entries can be tuned: float entries of 16 or
    32 bits (quantized entries - int8, FP8 - keep their own grid), no zero point."""
    form = encoding.form
    if not isinstance(form, Palettized):
        return False
    element = form.lut.element
    return element.is_float and element.bits >= 16 and (form.decode is None or form.decode.offset is None)


@dataclass
class _Table:
    """One weight's tables as trainable values: entries = base + delta x unit (delta from zero)."""

    site: WeightSite
    encoding: Encoding
    indices: torch.Tensor  # as stored (lut_to_dense widens them a weight at a time)
    base: torch.Tensor  # the LUT as stored, float32 [*blocks, entries, vector]
    unit: torch.Tensor  # each table's root mean square entry
    scale: torch.Tensor | None  # per-channel (or per-LUT) scales, float32
    delta: torch.Tensor

    @classmethod
    def of(cls, site: WeightSite, encoding: Encoding) -> _Table:
        form = encoding.form
        assert isinstance(form, Palettized)
        base = torch_values(form.lut).float()
        unit = base.pow(2).mean(dim=(-2, -1), keepdim=True).sqrt().clamp_min(torch.finfo(torch.float32).tiny)
        scale = None if form.decode is None else torch_values(form.decode.scale).float()
        delta = torch.zeros_like(base, requires_grad=True)
        return cls(site, encoding, torch_values(form.indices), base, unit, scale, delta)

    def entries(self) -> torch.Tensor:
        return self.base + self.delta * self.unit

    def dense(self) -> torch.Tensor:
        form = self.encoding.form
        assert isinstance(form, Palettized)
        values = lut_to_dense(self.indices, self.entries(), form.axis if self.indices.dim() > 1 else 0)
        return values if self.scale is None else shift_scale(values, self.scale)

    def tuned(self) -> Encoding:
        """The encoding with the tuned entries, rounded to the LUT's stored dtype."""
        form = self.encoding.form
        assert isinstance(form, Palettized)
        element = form.lut.element
        rounded = tcast.cast(self.entries().detach(), element.tcast)
        return replace(
            self.encoding, form=replace(form, lut=stored_float(rounded.reshape(form.lut.shape), element))
        )


def tune_tables(
    held: list[tuple[WeightSite, Encoding]],
    calibration: Calibration,
    epochs: int,
    progress: TuningProgress | None = None,
) -> tuple[list[Encoding], list[float]]:
    """Each held encoding with its tables tuned over `epochs` passes of the calibration samples
    (see the module), and the mean divergence of each pass (as the tables stood during it); the
    encodings as they were, and no passes, where no held weight reaches the program's output."""
    tables = [_Table.of(site, encoding) for site, encoding in held]
    optimizer = torch.optim.Adam([t.delta for t in tables], lr=_STEP)
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
