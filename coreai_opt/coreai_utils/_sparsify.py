"""sparsify_weights: pruning stored as `coreai.build_sparse_with_bitmask` + `sparse_with_bitmask_to_dense`.

Which weights are kept:
- magnitude (`target_sparsity`): the largest |w| of the whole tensor; `round(count * target)` are zeroed.
- block (`block_size`): blocks of `block_size` consecutive output channels at each position of the
  other axes, ranked by L2 norm; whole blocks are kept or zeroed.
- n:m (`n_m_ratio=(n, m)`): along the consumer's input (reduction) axis, in every run of m weights
  the n largest |w| are KEPT and m - n zeroed (2:4 keeps half). The peer library zeroes n instead.
Ties go to the lower index, so the result is deterministic.

Joint forms store only the kept values, compressed:
- INT8, FP8_E4M3FN, FP8_E5M2: symmetric per-output-channel codes of the pruned weight; the sparse
  tensor holds the kept codes and `blockwise_shift_scale` decodes the dense codes (pruned positions
  hold code 0, which decodes to 0).
- UINT8: a zero point would decode pruned positions to -zero_point x scale, so uint8 codes are
  decoded before the sparse tensor is built: one scale and zero point per block of up to 32 kept
  values, in row-major order (magnitude and block pruning keep a multiple of 32 values for this).
- palettize: one k-means LUT (exact 1-D, as in palettize_weights) over the kept values, decoded by
  `lut_to_sparse_with_bitmask`.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from coreai_opt._coreai import _rewrite as rw

from ._driver import Compressed, compress_sites
from ._options import CompressionGranularity, DType, QScheme
from ._palettize import N_BITS, PalettizePlan, _axis_constant, _scalar_clusters
from ._quantize import QuantizedCodes, QuantizePlan, quantize_codes
from ._results import CompressionReport, Progress

JOINT_DTYPES = (DType.INT8, DType.UINT8, DType.FP8_E4M3FN, DType.FP8_E5M2)
_UINT8_BLOCK = 32
_TORCH = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


class _DefaultSparsity(float):
    """The seed's default target_sparsity (0.5), told apart from an explicit 0.5 so that passing
    n_m_ratio alone is not a conflict."""


DEFAULT_SPARSITY = _DefaultSparsity(0.5)


@dataclass(frozen=True)
class SparsifyPlan:
    target_sparsity: float | None = DEFAULT_SPARSITY
    block_size: int | None = None
    n_m_ratio: tuple[int, int] | None = None
    quantize_dtype: DType | None = None
    palettize_nbits: int | None = None

    @property
    def sparsity(self) -> float | None:
        """The magnitude/block target, None under n:m."""
        return None if self.n_m_ratio is not None else self.target_sparsity

    def validate(self) -> None:
        explicit = self.target_sparsity is not None and not isinstance(self.target_sparsity, _DefaultSparsity)
        if self.n_m_ratio is not None and explicit:
            raise ValueError("give exactly one of target_sparsity and n_m_ratio")
        if self.n_m_ratio is None:
            if self.target_sparsity is None:
                raise ValueError("give exactly one of target_sparsity and n_m_ratio")
            if not 0.0 < float(self.target_sparsity) < 1.0:
                raise ValueError(
                    f"target_sparsity must lie strictly between 0 and 1, not {self.target_sparsity}"
                )
        else:
            ratio = self.n_m_ratio
            if (
                len(ratio) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in ratio)
                or not 0 < ratio[0] < ratio[1]
            ):
                raise ValueError(
                    f"n_m_ratio is (n, m) with 0 < n < m: n of every m weights are kept, not {ratio}"
                )
            if self.block_size is not None:
                raise ValueError("block_size applies to magnitude sparsity, not to n:m")
        if self.block_size is not None and self.block_size < 2:
            raise ValueError("block_size must be 2 or more (None prunes single weights)")
        if self.quantize_dtype is not None and self.palettize_nbits is not None:
            raise ValueError("give at most one of quantize_dtype and palettize_nbits")
        if self.quantize_dtype is not None and self.quantize_dtype not in JOINT_DTYPES:
            raise ValueError("quantize_dtype is INT8, UINT8, FP8_E4M3FN or FP8_E5M2")
        if self.palettize_nbits is not None and self.palettize_nbits not in N_BITS:
            raise ValueError(f"palettize_nbits must be one of {', '.join(map(str, N_BITS))}")

    @property
    def tag(self) -> str:
        """Names the default output file: sparse50, sparse2of4, sparse50-b4-int8, sparse2of4-lut4."""
        if self.n_m_ratio is not None:
            tag = f"sparse{self.n_m_ratio[0]}of{self.n_m_ratio[1]}"
        else:
            tag = f"sparse{round(float(self.target_sparsity or 0) * 100)}"
            if self.block_size is not None:
                tag += f"-b{self.block_size}"
        if self.quantize_dtype is not None:
            tag += f"-{self.quantize_dtype.value}"
        if self.palettize_nbits is not None:
            tag += f"-lut{self.palettize_nbits}"
        return tag


def _top(scores: torch.Tensor, keep: int) -> torch.Tensor:
    """A flat mask of the `keep` largest scores (ties to the lower index)."""
    order = torch.sort(scores.reshape(-1), descending=True, stable=True).indices
    mask = torch.zeros(scores.numel(), dtype=torch.bool)
    mask[order[:keep]] = True
    return mask


def _kept_units(units: int, sparsity: float, unit_size: int, uint8: bool) -> int:
    """How many units (weights or blocks) to keep; for UINT8 a multiple of 32 values when possible."""
    keep = max(1, units - round(units * sparsity))
    if uint8:
        step = _UINT8_BLOCK // math.gcd(_UINT8_BLOCK, unit_size)
        if keep >= step:
            keep -= keep % step
    return keep


def sparsity_mask(w: torch.Tensor, site: rw.WeightSite, plan: SparsifyPlan) -> torch.Tensor | str:
    """The kept positions of one weight (bool, its shape), or why its layout cannot take the plan."""
    magnitude = w.float().abs()
    uint8 = plan.quantize_dtype is DType.UINT8
    if plan.n_m_ratio is not None:
        n, m = plan.n_m_ratio
        moved = magnitude.movedim(site.input_axis, -1)
        if moved.shape[-1] % m:
            return f"input axis length {moved.shape[-1]} is not a multiple of m={m}"
        runs = moved.reshape(-1, m)
        order = torch.sort(runs, dim=1, descending=True, stable=True).indices
        mask = torch.zeros_like(runs, dtype=torch.bool).scatter_(1, order[:, :n], True)
        return mask.reshape(moved.shape).movedim(-1, site.input_axis)
    sparsity = float(plan.target_sparsity or 0.0)
    if plan.block_size is None:
        keep = _kept_units(magnitude.numel(), sparsity, 1, uint8)
        return _top(magnitude, keep).reshape(w.shape)
    size = plan.block_size
    moved = magnitude.movedim(site.output_axis, 0)
    channels = moved.shape[0]
    if channels % size:
        return f"{channels} output channels are not a multiple of block_size {size}"
    blocks = moved.reshape(channels // size, size, -1)
    norms = blocks.double().square().sum(dim=1)  # [C / size, rest]: L2 norm squared of each block
    keep = _kept_units(norms.numel(), sparsity, size, uint8)
    kept = _top(norms, keep).reshape(norms.shape)
    mask = kept[:, None, :].expand(-1, size, -1).reshape(moved.shape)
    return mask.movedim(0, site.output_axis)


def _native(values: torch.Tensor) -> np.ndarray:
    """A float tensor as a numpy array of its own width (bf16 as its int16 bit patterns)."""
    if values.dtype is torch.bfloat16:
        return values.view(torch.int16).numpy()
    return values.numpy()


# A sparse form: the builder of its ops, and the squared error over the kept values it stores.
_Sparse = tuple[Callable[[], Any], float]


def _plain(w: torch.Tensor, mask: torch.Tensor, site: rw.WeightSite, rewriter: rw.Rewriter) -> _Sparse:
    values = _native(w[mask].contiguous())

    def build() -> Any:
        data = rewriter.constant(site, values, site.element, (values.size,))
        return _to_dense(data, _mask_constant(rewriter, site, mask))

    return build, 0.0


def _quantized(
    w: torch.Tensor, mask: torch.Tensor, site: rw.WeightSite, plan: SparsifyPlan, rewriter: rw.Rewriter
) -> _Sparse | str:
    dtype = plan.quantize_dtype
    assert dtype is not None
    kept = int(mask.sum())
    if dtype is DType.UINT8:
        block = math.gcd(kept, _UINT8_BLOCK)
        if block < 8:
            return f"{kept} kept values do not split into blocks of 8 or more for uint8 scales"
        values = w[mask].contiguous()
        line = dataclasses.replace(site, shape=(kept,), output_axis=0, input_axis=0)
        q_plan = QuantizePlan(dtype, QScheme.ASYMMETRIC, CompressionGranularity.PER_BLOCK, block, None)
        coded = quantize_codes(values, line, q_plan)

        def build_uint8() -> Any:
            data = rewriter.constant(line, coded.codes, coded.element, (kept,))
            return _to_dense(coded.decode(rewriter, line, data), _mask_constant(rewriter, site, mask))

        return build_uint8, coded.noise
    pruned = torch.where(mask, w, torch.zeros((), dtype=w.dtype))
    q_plan = QuantizePlan(dtype, QScheme.SYMMETRIC, CompressionGranularity.PER_CHANNEL, 32, None)
    coded: QuantizedCodes = quantize_codes(pruned, site, q_plan)
    codes = coded.codes[mask.numpy()]

    def build() -> Any:
        data = rewriter.constant(site, codes, coded.element, (kept,))
        return coded.decode(rewriter, site, _to_dense(data, _mask_constant(rewriter, site, mask)))

    return build, coded.noise


def _palettized(
    w: torch.Tensor, mask: torch.Tensor, site: rw.WeightSite, plan: SparsifyPlan, rewriter: rw.Rewriter
) -> _Sparse:
    n_bits = plan.palettize_nbits
    assert n_bits is not None
    values = w[mask].contiguous()
    exact = site.element in ("f16", "bf16")
    rows = values.float()[None, :]
    centroids, index = _scalar_clusters(rows, values[None, :] if exact else None, PalettizePlan(n_bits))
    lut = torch.from_numpy(centroids[0]).to(_TORCH[site.element])
    noise = float(((lut.double()[index[0]] - values.double()) ** 2).sum())
    rank = len(site.shape)
    lut_shape = (*(1,) * rank, 2**n_bits, 1)
    indices = index[0].to(torch.uint8).numpy()

    def build() -> Any:
        from coreai._compiler.dialects import coreai as dialect

        idx = rewriter.constant(site, indices, f"ui{n_bits}", (indices.size,))
        sparse_idx = dialect.build_sparse_with_bitmask(idx, _mask_constant(rewriter, site, mask))
        lut_c = rewriter.constant(site, _native(lut), site.element, lut_shape)
        sparse = dialect.lut_to_sparse_with_bitmask(sparse_idx, lut_c, _axis_constant(site.output_axis))
        return dialect.sparse_with_bitmask_to_dense(sparse)

    return build, noise


def _mask_constant(rewriter: rw.Rewriter, site: rw.WeightSite, mask: torch.Tensor) -> Any:
    return rewriter.constant(site, mask.to(torch.uint8).numpy(), "ui1", site.shape)


def _to_dense(values: Any, mask: Any) -> Any:
    from coreai._compiler.dialects import coreai as dialect

    return dialect.sparse_with_bitmask_to_dense(dialect.build_sparse_with_bitmask(values, mask))


def _sparsify_one(
    w: torch.Tensor, site: rw.WeightSite, plan: SparsifyPlan, rewriter: rw.Rewriter
) -> Compressed | str:
    mask = sparsity_mask(w, site, plan)
    if isinstance(mask, str):
        return mask
    if plan.palettize_nbits is not None:
        sparse: _Sparse | str = _palettized(w, mask, site, plan, rewriter)
    elif plan.quantize_dtype is not None:
        sparse = _quantized(w, mask, site, plan, rewriter)
    else:
        sparse = _plain(w, mask, site, rewriter)
    if isinstance(sparse, str):
        return sparse
    x = w.double()
    pruned_energy = float(x[~mask].square().sum())
    build, kept_noise = sparse
    zeros = 1.0 - int(mask.sum()) / math.prod(site.shape)
    return Compressed(build, float(x.square().sum()), kept_noise + pruned_energy, sparsity=zeros)


def sparsify_program(
    program: Any,
    plan: SparsifyPlan,
    weight_num_threshold: int = 1024,
    progress: Progress | None = None,
) -> CompressionReport:
    """Sparsify every eligible weight of `program` in place and report each one."""
    plan.validate()
    return compress_sites(
        program, weight_num_threshold, lambda w, site, rw_: _sparsify_one(w, site, plan, rw_), progress
    )


def sparsify_weights(
    coreai_program: Any,
    target_sparsity: float | None = DEFAULT_SPARSITY,
    block_size: int | None = None,
    n_m_ratio: tuple[int, int] | None = None,
    quantize_dtype: DType | None = None,
    palettize_nbits: int | None = None,
    weight_num_threshold: int = 1024,
    in_place: bool = False,
) -> Any:
    """Seed API: prune the weights of an AIProgram (optionally compressing the kept values);
    returns the (copied unless in_place) program. `n_m_ratio=(n, m)` keeps n of every m weights."""
    plan = SparsifyPlan(
        target_sparsity, block_size, tuple(n_m_ratio) if n_m_ratio is not None else None,  # type: ignore[arg-type]
        quantize_dtype, palettize_nbits,
    )  # fmt: skip
    plan.validate()
    program = coreai_program if in_place else copy.deepcopy(coreai_program)
    sparsify_program(program, plan, weight_num_threshold)
    return program
