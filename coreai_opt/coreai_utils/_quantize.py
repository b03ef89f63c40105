"""quantize_weights: integer and FP8/FP4 weight quantization emitted as `coreai.blockwise_shift_scale`.

Scales are computed in float64 from the weights, rounded to the dtype they are stored in, and only
then used to quantize the data, so the stored data matches the stored scale exactly. FP8/FP4 element
rounding and E8M0 scales go through tcast. FP8 float scales are stored as f32: amax / 57344 of a
small fp16 weight underflows fp16 (the peer's zero-scale bug).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
import torch

import tcast
from coreai_opt._coreai import _rewrite as rw
from coreai_opt._coreai._ir import constant_nbytes, stored_nbytes
from coreai_opt.inspection import weight_encoding

from ._options import CompressionGranularity, DType, QScheme
from ._results import CompressionReport, Progress, WeightResult

_STORAGE = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}
_FP = {
    DType.FP8_E4M3FN: ("e4m3fn", "f8E4M3FN", ml_dtypes.float8_e4m3fn, 8),
    DType.FP8_E5M2: ("e5m2", "f8E5M2", ml_dtypes.float8_e5m2, 15),
    DType.FP4_E2M1FN: ("e2m1fnuz", "f4E2M1FN", ml_dtypes.float4_e2m1fn, 2),
}


@dataclass(frozen=True)
class _Plan:
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
    weight_num_threshold: int = 0,
) -> None:
    """Raise ValueError naming the rule a combination breaks."""
    if weight_num_threshold < 0:
        raise ValueError("weight_num_threshold must be 0 or more")
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


def _scale_shape(site: rw.WeightSite, plan: _Plan) -> tuple[int, ...] | str:
    shape = site.shape
    if plan.granularity is CompressionGranularity.PER_TENSOR:
        return tuple(1 for _ in shape)
    if plan.granularity is CompressionGranularity.PER_CHANNEL:
        return tuple(d if i == site.output_axis else 1 for i, d in enumerate(shape))
    length = shape[site.input_axis]
    if length % plan.block_size:
        return f"input axis length {length} is not a multiple of block_size {plan.block_size}"
    return tuple(d // plan.block_size if i == site.input_axis else d for i, d in enumerate(shape))


def _blocks(w: np.ndarray, scale_shape: tuple[int, ...]) -> np.ndarray:
    """View w as [s0, b0, s1, b1, ...] so that reducing the odd axes gives one value per scale."""
    interleaved = []
    for size, blocks in zip(w.shape, scale_shape, strict=True):
        interleaved += [blocks, size // blocks]
    return w.reshape(interleaved)


def _reduce(w: np.ndarray, scale_shape: tuple[int, ...], fn: Callable[..., np.ndarray]) -> np.ndarray:
    axes = tuple(range(1, 2 * w.ndim, 2))
    return fn(_blocks(w, scale_shape), axis=axes).reshape(scale_shape)


def _expand(per_scale: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    out = per_scale
    for axis, (size, blocks) in enumerate(zip(shape, per_scale.shape, strict=True)):
        out = np.repeat(out, size // blocks, axis=axis)
    return out


def _stored_positive(values: np.ndarray, storage: Any) -> np.ndarray:
    """Scales rounded to their storage dtype, never zero, inf or NaN there."""
    info = np.finfo(storage)
    safe = np.where(np.isfinite(values) & (values > 0), values, 1.0)
    return np.clip(safe, float(info.smallest_normal), float(info.max)).astype(storage)


def _quantize_int(
    w: np.ndarray, site: rw.WeightSite, plan: _Plan, rewriter: rw.Rewriter
) -> tuple[Any, np.ndarray]:
    dtype, shape = plan.dtype, site.shape
    scale_shape = _scale_shape(site, plan)
    assert isinstance(scale_shape, tuple)
    storage = _STORAGE[site.element]
    bits = dtype.bits
    w64 = w.astype(np.float64)
    if plan.qscheme is QScheme.SYMMETRIC:
        qmax = 2 ** (bits - 1) - 1
        amax = _reduce(np.abs(w64), scale_shape, np.max)
        scale = _stored_positive(amax / qmax, storage)
        zero = np.zeros(scale_shape, np.int64)
        scale_full = _expand(scale.astype(np.float64), shape)
        codes = np.clip(np.rint(w64 / scale_full), -qmax, qmax)
    else:
        levels = 2**bits - 1
        lo = np.minimum(_reduce(w64, scale_shape, np.min), 0.0)
        hi = np.maximum(_reduce(w64, scale_shape, np.max), 0.0)
        scale = _stored_positive((hi - lo) / levels, storage)
        zero = np.clip(np.rint(-lo / scale.astype(np.float64)), 0, levels).astype(np.int64)
        scale_full, zero_full = _expand(scale.astype(np.float64), shape), _expand(zero, shape)
        # codes relative to the zero point, in [-zero, levels - zero]
        codes = np.clip(np.rint(w64 / scale_full) + zero_full, 0, levels) - zero_full
    # stored data: signed types hold codes + offset directly; unsigned types shift by 2^(bits-1) (sym) or zero
    if dtype.signed:
        shift = 0 if plan.qscheme is QScheme.SYMMETRIC else -(2 ** (bits - 1))
        offset = zero + shift
        stored = codes + _expand(offset, shape)
        element = f"si{bits}"
        as_bits = (stored.astype(np.int64) & (2**bits - 1)) if bits < 8 else stored.astype(np.int8)
        offset_bits = (offset & (2**bits - 1)) if bits < 8 else offset.astype(np.int8)
    else:
        offset = (
            zero if plan.qscheme is QScheme.ASYMMETRIC else np.full(scale_shape, 2 ** (bits - 1), np.int64)
        )
        stored = codes + _expand(offset, shape)
        element = f"ui{bits}"
        as_bits = stored.astype(np.uint8) if bits == 8 else stored.astype(np.int64)
        offset_bits = offset.astype(np.uint8) if bits == 8 else offset
    dequantized = (codes * scale_full).astype(np.float32)

    def build() -> Any:
        data = rewriter.constant(site, as_bits, element, shape)
        scale_c = rewriter.constant(site, scale, site.element, scale_shape)
        if np.any(offset):
            offset1 = rewriter.constant(site, offset_bits, element, scale_shape)
        else:
            offset1 = rewriter.zeros(element, scale_shape)
        offset2 = rewriter.zeros(site.element, scale_shape)
        return rw.blockwise_shift_scale(data, scale_c, offset1, offset2)

    return build, dequantized


def _quantize_fp(
    w: np.ndarray, site: rw.WeightSite, plan: _Plan, rewriter: rw.Rewriter
) -> tuple[Any, np.ndarray]:
    shape = site.shape
    scale_shape = _scale_shape(site, plan)
    assert isinstance(scale_shape, tuple)
    code, element, np_type, emax = _FP[plan.dtype]
    spec = tcast.number(code)
    amax = _reduce(np.abs(w.astype(np.float64)), scale_shape, np.max)
    if plan.scale_dtype is DType.FP8_E8M0FNU or plan.dtype is DType.FP4_E2M1FN:
        # OCP MX: 2^(floor(log2 amax) - emax), picked first; the data is then rounded with it
        _, exponent = np.frexp(np.where(amax > 0, amax, 2.0**-126))
        exponent = np.clip(exponent - 1 - emax, -127, 127).astype(np.int64)
        scale_values = np.ldexp(1.0, exponent)
        scale_bits = (exponent + 127).astype(np.uint8)
        scale_element = "f8E8M0FNU"
        scale_store = scale_bits
    else:
        scale_values = _stored_positive(amax / float(spec.max), np.float32).astype(np.float64)
        scale_element = "f32"
        scale_store = scale_values.astype(np.float32)
    scale_full = _expand(scale_values, shape)
    normalized = torch.from_numpy((w.astype(np.float64) / scale_full).astype(np.float32))
    on_grid = tcast.cast(normalized, code).numpy()  # tcast rounds; saturates at the format's max
    codes = on_grid.astype(np_type)  # exact: every value is already representable
    dequantized = (on_grid.astype(np.float64) * scale_full).astype(np.float32)
    data_bits = codes.view(np.uint8) & (0xF if plan.dtype is DType.FP4_E2M1FN else 0xFF)

    def build() -> Any:
        data = rewriter.constant(site, data_bits, element, shape)
        scale_c = rewriter.constant(site, scale_store, scale_element, scale_shape)
        offset1 = rewriter.zeros(element, scale_shape)
        offset2 = rewriter.zeros(site.element, scale_shape)
        return rw.blockwise_shift_scale(data, scale_c, offset1, offset2)

    return build, dequantized


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
    validate(dtype, qscheme, granularity, block_size, scale_dtype, weight_num_threshold)
    plan = _Plan(dtype, qscheme, granularity, block_size, scale_dtype)
    sites, skipped = rw.weight_sites(program, weight_num_threshold)
    report = CompressionReport(skipped=list(skipped))
    rewriter = rw.Rewriter(program)
    for done, site in enumerate(sites, 1):
        scale_shape = _scale_shape(site, plan)
        if isinstance(scale_shape, str):
            report.skipped.append(rw.Skipped(site.name, site.shape, scale_shape, rw.SkipKind.LAYOUT))
        else:
            w = rw.read_constant(site.op)
            quantizer = _quantize_int if dtype.is_int else _quantize_fp
            build, dequantized = quantizer(w, site, plan, rewriter)
            before = constant_nbytes(site.op)
            new = rewriter.replace(site, build)
            after, encoding = stored_nbytes(new), weight_encoding(new)
            snr = tcast.sqnr_db(torch.from_numpy(w), torch.from_numpy(dequantized))
            report.weights.append(WeightResult(site.name, site.shape, encoding, before, after, snr))
        if progress is not None:
            progress(done, len(sites), site.name)
    rewriter.verify()
    return report


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
