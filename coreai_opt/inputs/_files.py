"""Inputs from a user's safetensors files: one tensor per input, by input name.

A file holds one sample (each tensor has the input's shape) or N of them: each tensor with a
leading sample axis (`[N, *shape]`), or - for an input whose first dim is 1, as exported models
take a batch of one - N along that dim (`[N, *shape[1:]]` for `[1, *shape[1:]]`, the way people
save a batch). A directory holds such files, read in name order. Every file's
header is checked before any data is read, so a bad file fails before a model runs, and the data
is read one file at a time.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from coreai_opt.io import ModelFileError

from ._policy import InputSpec, Kind

if TYPE_CHECKING:
    import torch

SUFFIX = ".safetensors"


@dataclass(frozen=True)
class _SampleFile:
    path: Path
    count: int
    batched: bool  # tensors carry N samples
    along_batch: frozenset[str] = frozenset()  # inputs whose samples lie along their batch dim of 1


@dataclass(frozen=True)
class InputSamples:
    """Checked samples of every input; iterate for `(label, {input name: tensor})`."""

    source: Path
    specs: tuple[InputSpec, ...]
    files: tuple[_SampleFile, ...]

    @property
    def count(self) -> int:
        return sum(f.count for f in self.files)

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[tuple[str, dict[str, torch.Tensor]]]:
        from safetensors import safe_open

        for entry in self.files:
            with safe_open(str(entry.path), framework="pt") as handle:
                tensors = {s.name: handle.get_tensor(s.name) for s in self.specs}
            if not entry.batched:
                yield entry.path.name, tensors
                continue
            for i in range(entry.count):
                yield (
                    f"{entry.path.name}[{i}]",
                    {
                        name: t[i : i + 1] if name in entry.along_batch else t[i]
                        for name, t in tensors.items()
                    },
                )


def _is_float(dtype: str) -> bool:
    """safetensors' dtype names: F16, BF16, F32, F8_E4M3, ... are floats; I*, U*, BOOL are not."""
    return dtype.startswith(("F", "BF"))


def _check_file(path: Path, specs: Sequence[InputSpec]) -> _SampleFile:
    """Read the header only: a tensor per input, each of the input's shape or holding N samples
    (see the module), the same number of samples in every tensor, integers where the model takes
    them."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            names = set(handle.keys())
            missing = [s.name for s in specs if s.name not in names]
            if missing:
                expected = ", ".join(s.name for s in specs)
                held = (
                    ", ".join(sorted(names)[:8]) + (", ..." if len(names) > 8 else "") or "no tensor at all"
                )
                raise ModelFileError(
                    path,
                    f"has no tensor for input(s) {', '.join(missing)} (the model takes {expected}; the file holds {held})",
                )
            header = {s.name: handle.get_slice(s.name) for s in specs}
            found = {
                name: (tuple(int(d) for d in h.get_shape()), h.get_dtype()) for name, h in header.items()
            }
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise ModelFileError(path, f"not a readable safetensors file ({exc})") from None
    counts: dict[str, int | None] = {}
    along: set[str] = set()
    for spec in specs:
        shape, dtype = found[spec.name]
        counts[spec.name], on_batch = _sample_count(path, spec, shape)
        if on_batch:
            along.add(spec.name)
        if spec.kind is not Kind.FLOAT and _is_float(dtype):
            raise ModelFileError(path, f"tensor {spec.name} is {dtype}; the model takes integers")
    if len(set(counts.values())) > 1:
        listed = ", ".join(
            f"{n}: {'no sample axis' if c is None else f'{c} samples'}" for n, c in counts.items()
        )
        raise ModelFileError(path, f"tensors disagree on the number of samples ({listed})")
    count = next(iter(counts.values()), None)
    if count == 0:
        raise ModelFileError(path, "holds no samples (a sample axis of length 0)")
    return _SampleFile(path, 1 if count is None else count, count is not None, frozenset(along))


def _sample_count(path: Path, spec: InputSpec, shape: tuple[int, ...]) -> tuple[int | None, bool]:
    """(samples in a tensor of `shape` for input `spec`, None for one without a sample axis;
    whether they lie along the input's batch dim of 1)."""
    if shape == spec.shape:
        return None, False
    if len(shape) == len(spec.shape) + 1 and shape[1:] == spec.shape:
        return shape[0], False
    if spec.shape and spec.shape[0] == 1 and len(shape) == len(spec.shape) and shape[1:] == spec.shape[1:]:
        return shape[0], True
    rest = ", ".join(map(str, spec.shape))
    also = f" or [N, {', '.join(map(str, spec.shape[1:]))}]" if spec.shape and spec.shape[0] == 1 else ""
    raise ModelFileError(
        path, f"tensor {spec.name} has shape {list(shape)}; the model takes {list(spec.shape)} "
        f"(or [N, {rest}]{also} for N samples)"
    )  # fmt: skip


def read_input_samples(path: Path | str, specs: Sequence[InputSpec]) -> InputSamples:
    """The samples of a safetensors file or of a directory of them, checked, not yet read."""
    path = Path(path)
    if path.is_dir():
        found = sorted(p for p in path.iterdir() if p.suffix == SUFFIX and p.is_file())
        if not found:
            raise ModelFileError(path, f"holds no {SUFFIX} files")
    elif path.is_file():
        found = [path]
    else:
        raise ModelFileError(path, "no such file or directory" if not path.exists() else "not a file")
    return InputSamples(path, tuple(specs), tuple(_check_file(p, specs) for p in found))


def read_inputs_file(path: Path | str, specs: Sequence[InputSpec]) -> dict[str, torch.Tensor]:
    """The one sample of a safetensors file (see `read_input_samples` for several)."""
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(path, "no such file" if not path.exists() else "not a file")
    samples = read_input_samples(path, specs)
    if samples.count != 1:
        raise ModelFileError(path, f"holds {samples.count} samples; one is taken here")
    return next(iter(samples))[1]
