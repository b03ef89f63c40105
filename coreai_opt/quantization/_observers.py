"""Activation ranges from calibration passes, and the scale and zero point of a range.

The scale rule is TensorCast's, the one `quantize_weights` uses for integer weights: a range
[lo, hi] (widened to hold zero) is cast as a two-value tensor, one row per candidate range, and
the cast's scale and zero point are the activation's. Symmetric: scale = amax / (2**(b-1) - 1),
no zero point (uint8 codes carry 128); asymmetric: scale = (hi - lo) / (2**b - 1), zero point
round(-lo / scale) in the storage type. Quantizing is coreai-torch's:
q = clamp(round(x / scale) + zero point, qmin, qmax), x' = (q - zero point) * scale.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

import tcast
from coreai_opt._elements import element
from coreai_opt.compression import DType, QScheme
from coreai_opt.compression.grids import cast_codes

from ._config import ActivationConfig, Observer

_BINS = 8192  # histogram bins of the percentile and MSE observers
_SHRINK_STEPS = 64  # candidate clip points per end in the MSE search
_MAX_ROUNDS = 8  # of the asymmetric coordinate search (it settles in two or three)


@dataclass(frozen=True)
class QParams:
    """Per-tensor quantization of one activation."""

    scale: float  # float32
    zero_point: int  # in the storage type (0 for symmetric int8)
    qmin: int
    qmax: int
    lo: float  # the range it was computed from
    hi: float

    @property
    def has_zero_point(self) -> bool:
        return self.zero_point != 0


def _limits(dtype: DType) -> tuple[int, int]:
    bits = dtype.bits
    return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if dtype.signed else (0, (1 << bits) - 1)


def qparams_of(
    lo: torch.Tensor, hi: torch.Tensor, config: ActivationConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 scales and int64 zero points (storage values) of K ranges at once, by TensorCast."""
    lo = torch.minimum(lo.double(), torch.zeros(()))
    hi = torch.maximum(hi.double(), torch.zeros(()))
    rows = torch.stack([lo, hi], dim=1).float()
    codes = cast_codes(rows, config.dtype, config.qscheme, element("f32").tcast, "_t0d1", tcast.ScaleMode.MAX)
    scale = codes.scale.reshape(-1).float()
    if codes.offset is None:
        return scale, torch.zeros_like(scale, dtype=torch.int64)
    zero = codes.offset.reshape(-1)
    if config.dtype.signed:  # storage bits of a two's complement byte
        zero = torch.where(zero >= 128, zero - 256, zero)
    return scale, zero


def fake_quantize_values(
    x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, qmin: int, qmax: int
) -> torch.Tensor:
    """coreai-torch's quantize then dequantize, elementwise (broadcasting over the parameters)."""
    q = torch.clamp(torch.round(x / scale) + zero_point, qmin, qmax)
    return (q - zero_point) * scale


class RangeObserver:
    """Collects one activation's statistics over calibration passes; `range()` gives [lo, hi]."""

    def __init__(self, config: ActivationConfig) -> None:
        self.config = config
        self.passes = 0
        self.lo = math.inf  # exact extremes seen
        self.hi = -math.inf
        self.avg_lo = 0.0  # moving averages
        self.avg_hi = 0.0
        self.hist: torch.Tensor | None = None  # float64 counts over [hist_lo, hist_hi]
        self.hist_lo = 0.0
        self.hist_hi = 0.0

    def update(self, x: torch.Tensor) -> None:
        x = x.detach()
        if x.numel() == 0:
            return
        if not bool(torch.isfinite(x).all()):
            raise ValueError("calibration produced NaN or Inf")
        low, high = (float(v) for v in torch.aminmax(x.float()))
        c = float(self.config.averaging_constant)
        if self.passes == 0:
            self.avg_lo, self.avg_hi = low, high
        else:
            self.avg_lo += c * (low - self.avg_lo)
            self.avg_hi += c * (high - self.avg_hi)
        self.lo, self.hi = min(self.lo, low), max(self.hi, high)
        self.passes += 1
        if self.config.observer in (Observer.PERCENTILE, Observer.MSE):
            self._histogram(x.reshape(-1).double())

    def _histogram(self, x: torch.Tensor) -> None:
        lo, hi = self.lo, self.hi  # already holding this pass
        if hi <= lo:
            hi = lo + max(abs(lo), 1.0) * 1e-6  # one value so far: a tiny range around it
        if self.hist is None:
            self.hist = torch.zeros(_BINS, dtype=torch.float64)
            self.hist_lo, self.hist_hi = lo, hi
        elif lo < self.hist_lo or hi > self.hist_hi:
            # the range grew: the old counts move to the new bins by their bins' centres
            self.hist = torch.bincount(
                self._index(self._centres(), lo, hi), weights=self.hist, minlength=_BINS
            )
            self.hist_lo, self.hist_hi = lo, hi
        self.hist += torch.bincount(self._index(x, self.hist_lo, self.hist_hi), minlength=_BINS).double()

    @staticmethod
    def _index(x: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
        width = (hi - lo) / _BINS
        return torch.clamp(((x - lo) / width).floor(), 0, _BINS - 1).long()

    def range(self) -> tuple[float, float]:
        """The calibrated range (raises if no pass was observed)."""
        if self.passes == 0:
            raise ValueError("no calibration pass reached this activation")
        kind = self.config.observer
        if kind is Observer.MINMAX:
            return self.lo, self.hi
        if kind is Observer.MOVING_AVERAGE:
            return self.avg_lo, self.avg_hi
        if kind is Observer.PERCENTILE:
            return self._percentile_range()
        return self._mse_range()

    def _centres(self) -> torch.Tensor:
        width = (self.hist_hi - self.hist_lo) / _BINS
        return self.hist_lo + (torch.arange(_BINS, dtype=torch.float64) + 0.5) * width

    def _percentile_range(self) -> tuple[float, float]:
        assert self.hist is not None
        share = 1.0 - float(self.config.percentile) / 100.0
        cdf = torch.cumsum(self.hist, 0) / self.hist.sum()
        width = (self.hist_hi - self.hist_lo) / _BINS
        low_bin = int(torch.searchsorted(cdf, torch.tensor(share, dtype=torch.float64), right=True))
        high_bin = int(torch.searchsorted(cdf, torch.tensor(1.0 - share, dtype=torch.float64)))
        lo = max(self.lo, self.hist_lo + low_bin * width)
        hi = min(self.hi, self.hist_lo + (min(high_bin, _BINS - 1) + 1) * width)
        return lo, max(hi, lo)

    def _mse_range(self) -> tuple[float, float]:
        """Search clip points for the least squared error over the histogram: each bin's centre
        quantized with the candidate's own scale and zero point (the real scale rule), weighted by
        the bin's count. Symmetric: 64 clip points of amax. Asymmetric: the two ends in turn, each
        over 64 clip points with the other end held, until neither moves (a coordinate search;
        starting from the min-max range, which is among the candidates)."""
        assert self.hist is not None
        fractions = torch.linspace(1.0 / _SHRINK_STEPS, 1.0, _SHRINK_STEPS, dtype=torch.float64)
        lo, hi = min(self.lo, 0.0), max(self.hi, 0.0)
        if self.config.qscheme is QScheme.SYMMETRIC:
            amax = max(-lo, hi) * fractions
            best = self._least_error(-amax, amax)
            return float(-amax[best]), float(amax[best])
        low, high = lo, hi
        for _ in range(_MAX_ROUNDS):
            before = (low, high)
            highs = hi * fractions
            high = float(highs[self._least_error(torch.full_like(highs, low), highs)])
            lows = lo * fractions
            low = float(lows[self._least_error(lows, torch.full_like(lows, high))])
            if (low, high) == before:
                break
        return low, high

    def _least_error(self, low_ends: torch.Tensor, high_ends: torch.Tensor) -> int:
        """Index of the candidate range of least histogram-weighted squared error (the first, the
        narrowest, of equal errors)."""
        assert self.hist is not None
        scale, zero = qparams_of(low_ends, high_ends, self.config)
        qmin, qmax = _limits(self.config.dtype)
        centres = self._centres()[None, :]
        deviation = centres - fake_quantize_values(centres, scale.double()[:, None], zero.double()[:, None],
                                                   qmin, qmax)  # fmt: skip
        return int(torch.argmin((deviation**2 * self.hist).sum(1)))


def qparams_in(lo: float, hi: float, config: ActivationConfig) -> QParams:
    """The scale and zero point of one range."""
    scale, zero = qparams_of(torch.tensor([lo]), torch.tensor([hi]), config)
    qmin, qmax = _limits(config.dtype)
    return QParams(float(scale[0]), int(zero[0]), qmin, qmax, lo, hi)


def qparams_for(observer: RangeObserver) -> QParams:
    """The scale and zero point of the observer's calibrated range."""
    return qparams_in(*observer.range(), observer.config)
