"""A compressed weight as plain arrays, before any container turns it into ops or buffers.

Every form decodes to the weight in its own dtype:
- `Quantized`: `decode(data)`, with `decode` a block-wise shift-scale `scale * (data - offset)`;
- `Palettized`: the LUT entry of every index (vector entries fill `axis`), then `decode` if any;
- `Sparse`: the kept values scattered into the mask's positions (zeros elsewhere), then `decode`
  if any; the kept values are plain, or a 1-D `Quantized` decoded before scattering (a zero point
  must not turn pruned zeros into numbers), or a 1-D `Palettized`.

`Stored` arrays hold what a container writes: the values of 8-, 16- and 32-bit elements as their
own numpy dtype (ml_dtypes for bfloat16), and unsigned codes for sub-byte integers and the FP8,
FP4 and E8M0 bit patterns. Containers pack sub-byte codes themselves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from coreai_opt._elements import Element


@dataclass(frozen=True)
class Stored:
    values: np.ndarray
    element: Element

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.values.shape)

    @property
    def nbytes(self) -> int:
        """Bytes stored, sub-byte codes packed."""
        return math.ceil(self.values.size * self.element.bits / 8)


@dataclass(frozen=True)
class ShiftScale:
    """scale * (data - offset), block-wise: each parameter's shape divides the data's."""

    scale: Stored  # the weight's float element, or E8M0 codes
    offset: Stored | None  # in the data's element; None: zero

    @property
    def nbytes(self) -> int:
        return self.scale.nbytes + (self.offset.nbytes if self.offset is not None else 0)


def _decode_nbytes(decode: ShiftScale | None) -> int:
    return decode.nbytes if decode is not None else 0


@dataclass(frozen=True)
class Quantized:
    data: Stored  # codes in the weight's shape (or the kept values' 1-D shape)
    decode: ShiftScale

    @property
    def nbytes(self) -> int:
        return self.data.nbytes + self.decode.nbytes


@dataclass(frozen=True)
class Palettized:
    indices: Stored  # ui{n_bits}; the weight's shape with the vector axis divided by the vector length
    lut: Stored  # [*lut blocks, 2**n_bits, vector length]
    axis: int  # the axis vector entries fill (the output-channel axis)
    decode: ShiftScale | None  # quantized LUT entries and per-channel scales
    luts: int

    @property
    def nbytes(self) -> int:
        return self.indices.nbytes + self.lut.nbytes + _decode_nbytes(self.decode)


@dataclass(frozen=True)
class Sparse:
    mask: np.ndarray  # bool, the weight's shape: True where a value is kept
    kept: Stored | Quantized | Palettized  # one entry (or code) per True, in row-major order
    decode: ShiftScale | None  # applied to the dense codes (symmetric codes of zero are zero)

    @property
    def nbytes(self) -> int:
        return math.ceil(self.mask.size / 8) + self.kept.nbytes + _decode_nbytes(self.decode)


Form = Quantized | Palettized | Sparse


def nbytes_for_rows(form: Form, rows: int, of: int) -> int:
    """What `form`, holding `rows` of a weight's `of` output channels, would store for all of
    them: an encoding that keeps its rows apart stores arrays that each grow with the rows."""
    total = 0
    for size, bits in _arrays(form):
        grown, left = divmod(size * of, rows)
        if left:
            raise ValueError(f"an array of {size} values does not grow with {rows} of {of} rows")
        total += math.ceil(grown * bits / 8)
    return total


def _arrays(form: Form | Stored | ShiftScale | None) -> list[tuple[int, int]]:
    """(values, bits a value) of every array `form` stores."""
    if form is None:
        return []
    if isinstance(form, Stored):
        return [(form.values.size, form.element.bits)]
    if isinstance(form, ShiftScale):
        return _arrays(form.scale) + _arrays(form.offset)
    if isinstance(form, Quantized):
        return _arrays(form.data) + _arrays(form.decode)
    if isinstance(form, Palettized):
        return _arrays(form.indices) + _arrays(form.lut) + _arrays(form.decode)
    return [(form.mask.size, 1), *_arrays(form.kept), *_arrays(form.decode)]


@dataclass(frozen=True)
class Learned:
    """What calibration data did for one weight: its error weighted as the data says it matters
    (`weighting`: "output" - the consumer's output on the calibration data, through its input Gram
    matrix; "fisher" - squared gradients of the loss; "input-moments" - each input channel's mean
    square), as an SNR in dB, for this encoding and for the data-free one of the same config (None
    where that was not measured: an estimate's trial reads neither, and measures neither)."""

    method: str
    weighting: str
    snr_db: float | None
    data_free_snr_db: float | None


@dataclass(frozen=True)
class Encoding:
    """One weight's compressed form; once measured (`compression` decodes it with `decode` and
    compares), what it costs in accuracy as summed squares."""

    form: Form
    element: Element  # the weight's own element (what it decodes to)
    luts: int | None = None
    sparsity: float | None = None
    signal: float | None = None  # the weight's energy
    noise: float | None = None  # the energy of the decoded weight's error
    learned: Learned | None = None  # set by the methods that learn from data

    @property
    def nbytes(self) -> int:
        """What the encoding stores (a container may add a few bytes of alignment)."""
        return self.form.nbytes
