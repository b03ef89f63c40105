"""quantize_weights: integer and FP8/FP4 weight quantization emitted as `coreai.blockwise_shift_scale`.

Scales are computed in float64 from the weights, rounded to the dtype they are stored in, and only
then used to quantize the data, so the stored data matches the stored scale exactly. FP8/FP4 element
rounding and E8M0 scales go through tcast. FP8 float scales are stored in the weight's dtype (the
runtime computes fp16 outputs wrongly, or aborts, with f32 scales) and rounded up: amax / 57344
of a small fp16 weight may fall among fp16 subnormals, but never to zero (the peer's bug) and
never below the ideal scale, so no element saturates.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
import torch

import tcast
from coreai_opt._coreai import _rewrite as rw

from ._driver import Compressed, compress_sites
from ._options import CompressionGranularity, DType, QScheme
from ._results import CompressionReport, Progress

_STORAGE = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}
_FP = {  # tcast code, Core AI element, emax
    DType.FP8_E4M3FN: ("e4m3fn", "f8E4M3FN", 8),
    DType.FP8_E5M2: ("e5m2", "f8E5M2", 15),
    DType.FP4_E2M1FN: ("e2m1fnuz", "f4E2M1FN", 2),
}


@dataclass(frozen=True)
class QuantizePlan:
    dtype: DType
    qscheme: QScheme
    granularity: CompressionGranularity
    block_size: int
    scale_dtype: DType | None


def validate(
    dtype: DType,
    qscheme: QScheme,
    granularity: CompressionGranularity,
    block_size: int,
    scale_dtype: DType | None,
) -> None:
    """Raise ValueError naming the rule a combination breaks."""
    if dtype is DType.FP8_E8M0FNU:
        raise ValueError("FP8_E8M0FNU is a scale dtype, not a weight dtype")
    if granularity is CompressionGranularity.PER_GROUPED_CHANNEL:
        raise ValueError("quantize_weights takes per-tensor, per-channel or per-block granularity")
    if not dtype.is_int and qscheme is QScheme.ASYMMETRIC:
        raise ValueError(
            f"{dtype.name} takes the symmetric scheme only (floating-point data has no zero point)"
        )
    if scale_dtype is not None and scale_dtype is not DType.FP8_E8M0FNU:
        raise ValueError("scale_dtype is None (the weight's float dtype) or FP8_E8M0FNU")
    if scale_dtype is not None and dtype.is_int:
        raise ValueError("scale_dtype applies to FP8/FP4 data; integer data takes float scales")
    if dtype is DType.FP4_E2M1FN and (
        granularity is not CompressionGranularity.PER_BLOCK or block_size != 32
    ):
        raise ValueError("FP4_E2M1FN is MX: per-block granularity with block_size 32")
    if granularity is CompressionGranularity.PER_BLOCK and block_size < 1:
        raise ValueError("block_size must be positive")


def _scale_shape(site: rw.WeightSite, plan: QuantizePlan) -> tuple[int, ...] | str:
    shape = site.shape
    if plan.granularity is CompressionGranularity.PER_TENSOR:
        return tuple(1 for _ in shape)
    if plan.granularity is CompressionGranularity.PER_CHANNEL:
        return tuple(d if i == site.output_axis else 1 for i, d in enumerate(shape))
    length = shape[site.input_axis]
    if length % plan.block_size:
        return f"input axis length {length} is not a multiple of block_size {plan.block_size}"
    return tuple(d // plan.block_size if i == site.input_axis else d for i, d in enumerate(shape))


@dataclass
class QuantizedCodes:
    """A weight as stored codes plus the blockwise_shift_scale parameters that decode them.

    `noise` and `signal` are the squared error of the decoding and the squared weight, summed.
    Symmetric integer and FP codes of zero are zero, so sparse forms may store only some codes.
    """

    codes: np.ndarray  # the weight's shape; unsigned bit patterns for sub-byte and FP types
    element: str
    scale: np.ndarray  # scale_shape, in scale_element's storage
    scale_element: str
    scale_shape: tuple[int, ...]
    offset: np.ndarray | None  # offset1 in `element`'s storage (None: zero)
    noise: float
    signal: float

    def decode(self, rewriter: rw.Rewriter, site: rw.WeightSite, data: Any) -> Any:
        """blockwise_shift_scale of `data` (a value holding these codes, dense) to the weight's dtype."""
        return rewriter.shift_scale(
            site, data, self.scale, self.scale_element, self.scale_shape, self.offset, self.element
        )


class _Groups:
    """A weight viewed as [s0, b0, s1, b1, ...]: the odd axes run inside one scale group.

    Per-group values live in the broadcast shape [s0, 1, s1, 1, ...], so no full-size scale
    tensor is ever built.
    """

    def __init__(self, shape: tuple[int, ...], scale_shape: tuple[int, ...]) -> None:
        self.view_shape: list[int] = []
        self.group_shape: list[int] = []
        for size, groups in zip(shape, scale_shape, strict=True):
            self.view_shape += [groups, size // groups]
            self.group_shape += [groups, 1]
        self.inner = tuple(range(1, 2 * len(shape), 2))
        self.scale_shape = scale_shape

    def amin_amax(self, x: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """Exact per-group minimum and maximum, as float64 arrays of the group shape."""
        return (
            x.amin(dim=self.inner, keepdim=True).double().numpy(),
            x.amax(dim=self.inner, keepdim=True).double().numpy(),
        )

    def broadcast(self, per_group: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(per_group)).reshape(self.group_shape).to(dtype)

    def stored(self, per_group: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(per_group).reshape(self.scale_shape)


def _work_dtype(element: str) -> torch.dtype:
    """float32 for 16-bit weights, float64 for f32 ones: the quotient w / scale then rounds to the
    same integer as the exact quotient. (fp16 w and scale carry 11-bit significands and the quotient
    is below 2**8, so an inexact quotient is at least 2**-20 relative away from any half-integer;
    float32 division errs by at most 2**-24. The same argument with 24-bit significands needs float64.)
    """
    return torch.float32 if element in ("f16", "bf16") else torch.float64


def _error_energy(approx: torch.Tensor, x: torch.Tensor) -> float:
    """Sum of squared differences; overwrites `approx` (a temporary) with the difference."""
    diff = approx.sub_(x).reshape(-1)
    return float(torch.dot(diff, diff))


def _stored_positive(values: np.ndarray, storage: Any) -> np.ndarray:
    """Scales rounded to their storage dtype, never zero, inf or NaN there."""
    info = ml_dtypes.finfo(storage)  # numpy's finfo does not know bfloat16
    safe = np.where(np.isfinite(values) & (values > 0), values, 1.0)
    return np.clip(safe, float(info.smallest_normal), float(info.max)).astype(storage)


def _scale_up(ideal: np.ndarray, storage: Any) -> np.ndarray:
    """Scales in their storage dtype, rounded up (never below `ideal`, never zero): data divided
    by the stored scale then never exceeds the format's range, even where a tiny fp16 scale
    lands on a coarse subnormal step."""
    info = ml_dtypes.finfo(storage)
    safe = np.where(np.isfinite(ideal) & (ideal > 0), ideal, 1.0)
    safe = np.clip(safe, float(info.smallest_subnormal), float(info.max))
    stored = np.ascontiguousarray(safe.astype(storage))
    low = stored.astype(np.float64) < safe
    bits = stored.view(np.uint16 if stored.itemsize == 2 else np.uint32)
    bits[low] += 1  # the next larger value of a positive float
    return stored


def _int_codes(q: torch.Tensor, bits: int, signed: bool) -> torch.Tensor:
    """Stored integers as the unsigned bit patterns the constant builder takes."""
    if bits == 8:
        return q.to(torch.int8) if signed else q.to(torch.uint8)
    return q.to(torch.int8).view(torch.uint8) & (2**bits - 1)


def _quantize_int(w: torch.Tensor, site: rw.WeightSite, plan: QuantizePlan) -> QuantizedCodes:
    dtype, shape = plan.dtype, site.shape
    scale_shape = _scale_shape(site, plan)
    assert isinstance(scale_shape, tuple)
    groups = _Groups(shape, scale_shape)
    storage = _STORAGE[site.element]
    bits, work = dtype.bits, _work_dtype(site.element)
    x = w.to(work).reshape(groups.view_shape)
    lo, hi = groups.amin_amax(x)
    if plan.qscheme is QScheme.SYMMETRIC:
        qmax = 2 ** (bits - 1) - 1
        scale = _stored_positive(np.maximum(hi, -lo) / qmax, storage)
        zero = np.zeros(lo.shape, np.int64)
        low, high = -qmax, qmax
    else:
        levels = 2**bits - 1
        lo, hi = np.minimum(lo, 0.0), np.maximum(hi, 0.0)
        scale = _stored_positive((hi - lo) / levels, storage)
        zero = np.clip(np.rint(-lo / scale.astype(np.float64)), 0, levels).astype(np.int64)
        low, high = 0, levels  # codes + zero point
    # stored = codes + offset: signed types hold the codes (asym: shifted by -2^(bits-1));
    # unsigned types shift symmetric codes by 2^(bits-1)
    if dtype.signed:
        offset = zero - (0 if plan.qscheme is QScheme.SYMMETRIC else 2 ** (bits - 1))
    else:
        offset = zero if plan.qscheme is QScheme.ASYMMETRIC else np.full(lo.shape, 2 ** (bits - 1), np.int64)
    s = groups.broadcast(scale.astype(np.float64), work)
    q = torch.div(x, s).round_()  # half to even, like np.rint
    if plan.qscheme is QScheme.ASYMMETRIC:
        q.add_(groups.broadcast(zero.astype(np.float64), work))
    q.clamp_(low, high)
    shift = offset - (zero if plan.qscheme is QScheme.ASYMMETRIC else 0)  # from the clamped form to stored
    if np.any(shift):
        q.add_(groups.broadcast(shift.astype(np.float64), work))
    data = _int_codes(q, bits, dtype.signed)
    q.sub_(groups.broadcast(offset.astype(np.float64), work)).mul_(s)  # dequantized
    noise, signal = _error_energy(q, x), float(torch.dot(x.reshape(-1), x.reshape(-1)))
    element = f"{'si' if dtype.signed else 'ui'}{bits}"
    offset_bits = offset & (2**bits - 1) if bits < 8 else offset.astype(np.int8 if dtype.signed else np.uint8)
    return QuantizedCodes(
        data.reshape(shape).numpy(), element, groups.stored(scale), site.element, scale_shape,
        groups.stored(offset_bits), noise, signal,
    )  # fmt: skip


def _fp_codes(on_grid: torch.Tensor, dtype: DType) -> torch.Tensor:
    """Bit patterns of values already on the format's grid (so every conversion here is exact)."""
    if dtype is DType.FP8_E4M3FN:
        return on_grid.to(torch.float8_e4m3fn).view(torch.uint8)
    if dtype is DType.FP8_E5M2:
        return on_grid.to(torch.float8_e5m2).view(torch.uint8)
    # e2m1 magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6 are codes 0..7: 2m below 2, then m + 2 (6 -> 7)
    magnitude = on_grid.abs()
    index = torch.where(magnitude < 2, magnitude * 2, (magnitude + 2).clamp_(max=7))
    index.add_(torch.signbit(on_grid).to(index.dtype), alpha=8)
    return index.to(torch.uint8)


def _quantize_fp(w: torch.Tensor, site: rw.WeightSite, plan: QuantizePlan) -> QuantizedCodes:
    shape = site.shape
    scale_shape = _scale_shape(site, plan)
    assert isinstance(scale_shape, tuple)
    groups = _Groups(shape, scale_shape)
    code, element, emax = _FP[plan.dtype]
    x = w.to(torch.float32).reshape(groups.view_shape)
    lo, hi = groups.amin_amax(x)
    amax = np.maximum(hi, -lo)
    if plan.scale_dtype is DType.FP8_E8M0FNU or plan.dtype is DType.FP4_E2M1FN:
        # OCP MX: 2^(floor(log2 amax) - emax), picked first; the data is then rounded with it
        _, exponent = np.frexp(np.where(amax > 0, amax, 2.0**-126))
        exponent = np.clip(exponent - 1 - emax, -127, 127).astype(np.int64)
        scale_values = np.ldexp(1.0, exponent)
        scale_element, scale_store = "f8E8M0FNU", (exponent + 127).astype(np.uint8)
    else:
        # the weight's own dtype: the runtime rejects (f32 scale, fp16 output) with inf/NaN or a crash
        scale_store = _scale_up(amax / float(tcast.number(code).max), _STORAGE[site.element])
        scale_element, scale_values = site.element, scale_store.astype(np.float64)
    s = groups.broadcast(scale_values, torch.float32)
    # tcast rounds (ties to even) and saturates; on a CUDA device through its Triton engine
    device = "cuda" if torch.cuda.is_available() else "cpu"
    on_grid = tcast.cast(torch.div(x, s).to(device), code).cpu()
    data = _fp_codes(on_grid, plan.dtype)
    noise, signal = _error_energy(on_grid.mul_(s), x), float(torch.dot(x.reshape(-1), x.reshape(-1)))
    return QuantizedCodes(
        data.reshape(shape).numpy(), element, groups.stored(scale_store), scale_element, scale_shape,
        None, noise, signal,
    )  # fmt: skip


def quantize_codes(w: torch.Tensor, site: rw.WeightSite, plan: QuantizePlan) -> QuantizedCodes:
    """Codes and scales of one weight (its layout must suit the plan: see `_scale_shape`)."""
    return (_quantize_int if plan.dtype.is_int else _quantize_fp)(w, site, plan)


def quantize_program(
    program: Any,
    dtype: DType,
    qscheme: QScheme = QScheme.SYMMETRIC,
    granularity: CompressionGranularity = CompressionGranularity.PER_CHANNEL,
    block_size: int = 32,
    weight_num_threshold: int = 1024,
    scale_dtype: DType | None = None,
    progress: Progress | None = None,
) -> CompressionReport:
    """Quantize every eligible weight of `program` in place and report each one.

    `progress(done, total, name)` is called after each weight (for progress bars).
    """
    validate(dtype, qscheme, granularity, block_size, scale_dtype)
    plan = QuantizePlan(dtype, qscheme, granularity, block_size, scale_dtype)

    def one(w: torch.Tensor, site: rw.WeightSite, rewriter: rw.Rewriter) -> Compressed | str:
        scale_shape = _scale_shape(site, plan)
        if isinstance(scale_shape, str):
            return scale_shape
        coded = quantize_codes(w, site, plan)

        def build() -> Any:
            data = rewriter.constant(site, coded.codes, coded.element, site.shape)
            return coded.decode(rewriter, site, data)

        return Compressed(build, coded.signal, coded.noise)

    return compress_sites(program, weight_num_threshold, one, progress)


def quantize_weights(
    coreai_program: Any,
    dtype: DType,
    qscheme: QScheme = QScheme.SYMMETRIC,
    granularity: CompressionGranularity = CompressionGranularity.PER_CHANNEL,
    block_size: int = 32,
    weight_num_threshold: int = 1024,
    scale_dtype: DType | None = None,
    in_place: bool = False,
) -> Any:
    """Seed API: quantize the weights of an AIProgram; returns the (copied unless in_place) program."""
    program = coreai_program if in_place else copy.deepcopy(coreai_program)
    quantize_program(program, dtype, qscheme, granularity, block_size, weight_num_threshold, scale_dtype)
    return program
