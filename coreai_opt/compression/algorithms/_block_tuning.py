"""Look-up tables and their codes tuned a block at a time (`PalettizeConfig.tune_blocks`), before
the end-to-end passes of `_tuning`: EfficientQAT's block-wise stage on palettized weights.

The calibration gives the program a block at a time (`calibration._blocks`: half a decoder layer,
its output compared with the float program's there). Within a block every held table's continuous
parameters are trained as `_tuning` trains them, and where a table has at most 16 entries so are
its codes: each weight keeps a float copy of itself (starting at its decoded value, GPTQ's
choice), which decides each element's code - the nearest entry - and takes the weight's gradient
straight through the choice (a straight-through estimator), so a code changes once its float copy
crosses the midpoint between two entries. The copy's steps are a thousandth of the weight's root
mean square, shrinking to zero: a code moves only where the block's loss keeps pushing it
(PV-tuning updates codes the same way, by the loss's gradient, a few at a time). A block's tables
and codes are final before the next block starts, which sees them in its inputs. Only one block's
copies, moments and activations are held at a time. Deterministic: samples in a seeded order.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np
import torch

from coreai_opt._memory import trim_heap
from coreai_opt.weights import (
    Calibration,
    Checkpoints,
    Encoding,
    Palettized,
    Stored,
    WeightSite,
    decode,
    shift_scale,
)

from ._tuning import _ACCUMULATE, _STEP, _Parameter, _Tuned, _value

_CODE_STEP = 1e-3  # Adam's first step on a weight's float copy, in units of its root mean square
_CODE_ENTRIES = 16  # tables of at most this many entries choose their codes again
_SEED = 0

BlockProgress = Callable[[int, int, float], None]  # (block, step in it, mean loss so far)


@dataclass
class _Coded:
    """One weight's tables (`_tuning._Tuned`) and, where its codes are chosen again, its float
    copy: the nearest entry to each element is its code."""

    tables: _Tuned
    copy: _Parameter | None
    first: torch.Tensor | None = None  # each element's first table entry (`nearest`), once found

    @classmethod
    def of(cls, site: WeightSite, encoding: Encoding, given: torch.Tensor | None) -> _Coded:
        """`given`: the weight as given, where its codes are chosen again: the float copy starts
        halfway from the decoded weight toward it, where that keeps every code - so an element
        whose code the method chose against its own value starts near the entries' midpoint."""
        tables = _Tuned.of(site, encoding)
        form = encoding.form
        assert isinstance(form, Palettized)
        if (
            given is not None
            and form.lut.shape[-1] == 1
            and form.lut.shape[-2] <= _CODE_ENTRIES
            and tables.indices.dim() > 0
        ):
            coded = cls(tables, None)
            with torch.no_grad():
                dense = tables.dense().float()
                halfway = (dense + given.to(dense.device).float()) / 2
                start = torch.where(coded.nearest(halfway) == tables.indices, halfway, dense)
            return cls(tables, _Parameter.of(start, dense.square().mean().sqrt()), coded.first)
        return cls(tables, None)

    def parameters(self) -> list[torch.Tensor]:
        return self.tables.parameters() + ([self.copy.delta] if self.copy is not None else [])

    def dense(self) -> torch.Tensor:
        """The weight decoded; its codes first chosen from its float copy, whose gradient is the
        decoded weight's."""
        if self.copy is None:
            return self.tables.dense()
        copy = self.copy.value()
        self.tables.indices = self.nearest(copy.detach())
        return self.tables.dense() + (copy - copy.detach())

    @torch.no_grad()
    def nearest(self, values: torch.Tensor) -> torch.Tensor:
        """Each element's code whose decoded value lies nearest `values` (the present code on a
        tie: a copy on an entry keeps it)."""
        tables = self.tables
        form = tables.encoding.form
        assert isinstance(form, Palettized)
        entries = form.lut.shape[-2]
        flat = _value(tables.entries).detach().reshape(-1)
        if self.first is None:  # each element's first entry in the flattened tables, found once
            self.first = _table_positions(tuple(tables.indices.shape), tuple(form.lut.shape[:-2])) * entries
        first = self.first
        scale = None if tables.scale is None else _value(tables.scale).detach()
        codes = tables.indices
        best = (values - self._decoded(flat[first + codes.long()], scale)).abs()
        for code in range(entries):
            distance = (values - self._decoded(flat[first + code], scale)).abs()
            closer = distance < best
            best = torch.where(closer, distance, best)
            codes = torch.where(closer, code, codes)
        return codes

    def _decoded(self, values: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
        if scale is None:
            return values.float()
        return shift_scale(values, scale, self.tables.offset).float()

    def tuned(self) -> Encoding:
        """The encoding with its tuned tables (rounded to their stored dtypes) and, where chosen
        again, each element's code nearest its float copy under those rounded tables."""
        encoding = self.tables.tuned()
        if self.copy is None:
            return encoding
        rounded = _Tuned.of(self.tables.site, encoding)
        rounded.indices = self.tables.indices
        codes = _Coded(rounded, None).nearest(self.copy.value().detach())
        form = encoding.form
        assert isinstance(form, Palettized)
        values = codes.numpy().astype(form.indices.values.dtype)
        return replace(encoding, form=replace(form, indices=replace(form.indices, values=values)))


def tune_blocks(
    held: list[tuple[WeightSite, Encoding]],
    calibration: Calibration,
    epochs: int,
    progress: BlockProgress | None = None,
) -> tuple[list[Encoding], Callable[[], None]]:
    """The held encodings with their tables and codes tuned block by block over `epochs` passes
    of the calibration samples each (see the module), each block's weights replaced in the
    calibration once it is done; the encodings as they were where the calibration cannot run its
    program a block at a time. Each finished block is checkpointed where the calibration keeps
    them, keyed by the program as it stood when the block began (the blocks before it included):
    a run stopped part way takes each finished block from there, to the same bytes. The second
    value forgets those checkpoints (call it once nothing after this stage can be stopped)."""
    encodings = [encoding for _, encoding in held]
    blocks = getattr(calibration, "blocks", None)
    kept: list[Checkpoints] = []
    if not epochs or blocks is None:
        return encodings, lambda: None
    index = {site.name: i for i, (site, _) in enumerate(held)}
    for number, block in enumerate(blocks(list(index)), start=1):
        mine = [held[index[name]] for name in block.weights]
        tuned = _block(mine, block, calibration, epochs, partial(_report, progress, number), kept)
        for (site, _), encoding in zip(mine, tuned, strict=True):
            encodings[index[site.name]] = encoding
            calibration.replace(site.name, decode(encoding), keep_original=True)

    def forget() -> None:
        for store in kept:
            store.drop()

    return encodings, forget


def _block(
    mine: list[tuple[WeightSite, Encoding]], block: Any, calibration: Calibration, epochs: int,
    report: Callable[[int, float], None], kept: list[Checkpoints],
) -> list[Encoding]:  # fmt: skip
    """One block's weights tuned, or taken from its checkpoint (its store added to `kept`)."""
    checkpoints = getattr(calibration, "checkpoints", None)
    store = None if checkpoints is None else checkpoints(partial(_identity, mine, epochs))
    if store is not None:
        kept.append(store)
        found = store.load(_expected(mine))
        if found is not None:
            report(0, float("nan"))
            return [_restored(encoding, found, k) for k, (_, encoding) in enumerate(mine)]
    coded = [_Coded.of(site, encoding, block.given(site.name)) for site, encoding in mine]
    _train(coded, block, calibration.sample_count, epochs, report)
    tuned = [c.tuned() for c in coded]
    if store is not None:
        store.store(_saved(tuned))
    return tuned


def _arrays(encoding: Encoding) -> list[Stored]:
    """What block tuning changes of a palettized encoding: its codes, table and scales."""
    form = encoding.form
    assert isinstance(form, Palettized)
    return [form.indices, form.lut] + ([form.decode.scale] if form.decode is not None else [])


def _expected(held: list[tuple[WeightSite, Encoding]]) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """The checkpoint a block of `held` weights stores: each changed array's bytes."""
    return {f"{k}.{j}": ((stored.values.nbytes,), torch.uint8)
            for k, (_, encoding) in enumerate(held) for j, stored in enumerate(_arrays(encoding))}  # fmt: skip


def _saved(tuned: list[Encoding]) -> dict[str, torch.Tensor]:
    """The block's tuned arrays as bytes (their shapes and dtypes are the held encodings')."""
    return {f"{k}.{j}": torch.from_numpy(np.ascontiguousarray(stored.values).reshape(-1).view(np.uint8).copy())
            for k, encoding in enumerate(tuned) for j, stored in enumerate(_arrays(encoding))}  # fmt: skip


def _restored(encoding: Encoding, found: dict[str, torch.Tensor], k: int) -> Encoding:
    """`encoding` with the arrays of a checkpoint's `k`-th weight, in its own shapes and dtypes."""
    arrays = [replace(stored, values=found[f"{k}.{j}"].numpy().view(stored.values.dtype).reshape(stored.values.shape))
              for j, stored in enumerate(_arrays(encoding))]  # fmt: skip
    form = encoding.form
    assert isinstance(form, Palettized)
    decode_ = form.decode if form.decode is None else replace(form.decode, scale=arrays[2])
    return replace(encoding, form=replace(form, indices=arrays[0], lut=arrays[1], decode=decode_))


def _identity(held: list[tuple[WeightSite, Encoding]], epochs: int) -> bytes:
    """What a block's result depends on besides the program and the samples: its weights'
    encodings as chosen, the passes and the step rule."""
    import hashlib

    from coreai_opt._cache import tensor_bytes

    # the version ("blocks 1") changes by hand with the cut rule or the loss (`calibration._blocks`)
    rule = f"blocks 1 {epochs} {_STEP} {_CODE_STEP} {_CODE_ENTRIES} {_ACCUMULATE} {_SEED}"
    digest = hashlib.sha256(rule.encode())
    for site, encoding in held:
        digest.update(site.name.encode() + b"\0")
        for stored in _arrays(encoding):
            values = np.ascontiguousarray(stored.values)
            digest.update(f"{values.dtype} {values.shape}".encode())
            digest.update(tensor_bytes(torch.from_numpy(values.reshape(-1).view(np.uint8))))
    return digest.digest()


def _report(progress: BlockProgress | None, block: int, step: int, mean: float) -> None:
    """A block's step (0 and NaN: taken from its checkpoint) to the progress line, if any."""
    if progress is not None:
        progress(block, step, mean)


def _train(
    coded: list[_Coded], block: Any, count: int, epochs: int, report: Callable[[int, float], None]
) -> None:
    """Adam over the block's parameters, `_ACCUMULATE` samples a step, steps shrinking to zero."""
    groups = [{"params": c.tables.parameters(), "lr": _STEP} for c in coded if c.tables.parameters()] + [
        {"params": [c.copy.delta], "lr": _CODE_STEP} for c in coded if c.copy is not None
    ]
    if not groups:
        return
    optimizer = torch.optim.Adam(groups)
    steps = epochs * math.ceil(count / _ACCUMULATE)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 - step / steps)
    generator = torch.Generator().manual_seed(_SEED)
    done, total, seen = 0, 0.0, 0
    for _ in range(epochs):
        order = torch.randperm(count, generator=generator).tolist()
        for a in range(0, count, _ACCUMULATE):
            batch = order[a : a + _ACCUMULATE]
            optimizer.zero_grad()
            loss = _step(coded, block, batch)
            optimizer.step()
            schedule.step()
            trim_heap()  # a step's activations, freed, back to the system
            done, total, seen = done + 1, total + loss * len(batch), seen + len(batch)
            report(done, total / seen)
    for c in coded:  # the codes of the last step's copies
        if c.copy is not None:
            c.tables.indices = c.nearest(c.copy.value().detach())


def _step(coded: list[_Coded], block: Any, batch: list[int]) -> float:
    """The block's mean loss over `batch`, its gradient left on every parameter: each weight
    decoded once, each sample's graph taken back on its own into the decoded weights (one
    sample's activations held at a time), then each decode taken back once."""
    dense = {c.tables.site.name: c.dense() for c in coded}
    leaves = {
        name: value.requires_grad_()
        for name, value in block.placed({n: v.detach() for n, v in dense.items()}).items()
    }
    total = 0.0
    for sample in batch:
        loss = block.loss(leaves, sample) / len(batch)
        loss.backward()
        total += float(loss.detach())
    for name, value in dense.items():
        grad = leaves[name].grad
        if grad is not None and value.requires_grad:
            value.backward(grad.to(value.device, value.dtype))  # the tables' own device: the host's sums
    return total


def _table_positions(shape: tuple[int, ...], counts: tuple[int, ...]) -> torch.Tensor:
    """For each element of a weight of `shape`, which of the tables laid out as `counts` (one axis
    per weight axis, each dividing it) it reads: int64, the weight's shape."""
    position = torch.zeros((1,) * len(shape), dtype=torch.int64)
    for axis, (size, count) in enumerate(zip(shape, counts, strict=True)):
        along = torch.arange(size) // (size // count)
        position = position * count + along.reshape([-1 if k == axis else 1 for k in range(len(shape))])
    return position.expand(shape)
