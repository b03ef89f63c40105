"""The modules `Quantizer` inserts: fake quantization while preparing, coreai-torch's ops when final.

Prepared, an activation quantizer observes (during `calibration_mode`) or fake-quantizes with the
calibrated scale; a weight quantizer replaces its weight by the weight its encoding decodes to.
Both pass gradients straight through (activations only inside the quantization range), so a
prepared model can be fine-tuned. Final, an activation is `coreai::quantize` then
`coreai::dequantize` with the calibrated scale and zero point as buffers.
"""

from __future__ import annotations

import torch
from torch import nn

from coreai_opt.compression import QuantizeConfig, WeightSite
from coreai_opt.compression._quantize import dequantized

from ._config import ActivationConfig, Observer
from ._observers import QParams, RangeObserver, fake_quantize_values, qparams_for, qparams_in


class ActivationQuantizer(nn.Module):
    """Observes one activation while calibrating; fake-quantizes it once calibrated."""

    def __init__(self, config: ActivationConfig, name: str, consumers: tuple[str, ...]) -> None:
        super().__init__()
        self.config = config
        self.value_name = name  # the graph value it quantizes
        self.consumers = consumers  # the ops that read it quantized
        self.observer = RangeObserver(config)
        self.observing = False
        self.passthrough = False  # the float model, for reference outputs
        self.qparams: QParams | None = None
        # the ranges an output check may choose between, the observer's own first
        self.candidates: tuple[QParams, ...] = ()

    def calibrate(self) -> None:
        """Fix the scale and zero point from what was observed (when anything was). The MSE
        observer's range is one activation's best; the min-max range stays a candidate, since
        the model's output decides which of the two is better (see `Quantizer`)."""
        if not self.observer.passes:
            return
        self.qparams = qparams_for(self.observer)
        self.candidates = (self.qparams,)
        if self.config.observer is Observer.MSE:
            minmax = qparams_in(self.observer.lo, self.observer.hi, self.config)
            if (minmax.scale, minmax.zero_point) != (self.qparams.scale, self.qparams.zero_point):
                self.candidates += (minmax,)

    @property
    def range_from(self) -> str:
        """The observer whose range is in use (the min-max candidate shows as "minmax")."""
        if len(self.candidates) > 1 and self.qparams == self.candidates[1]:
            return Observer.MINMAX.value
        return self.config.observer.value

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.passthrough:
            return x
        if self.observing:
            try:
                self.observer.update(x)
            except ValueError as exc:
                raise ValueError(f"activation {self.value_name}: {exc}") from None
            return x
        if self.qparams is None:
            return x
        p = self.qparams
        scale = torch.tensor(p.scale, dtype=x.dtype)
        zero = torch.tensor(p.zero_point, dtype=x.dtype)
        y = fake_quantize_values(x.detach(), scale, zero, p.qmin, p.qmax)
        steps = x.detach() / scale + zero
        inside = (steps >= p.qmin - 0.5) & (steps <= p.qmax + 0.5)
        # the value is y exactly; the gradient is 1 inside the range, 0 where the value was clipped
        return y + (x - x.detach()) * inside


class WeightQuantizer(nn.Module):
    """A weight replaced by what its encoding decodes to; the gradient passes straight through."""

    def __init__(self, site: WeightSite, config: QuantizeConfig) -> None:
        super().__init__()
        self.site = site
        self.config = config
        self.passthrough = False  # the float model, for reference outputs

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        if self.passthrough:
            return w
        decoded = dequantized(w.detach(), self.site, self.config)
        assert not isinstance(decoded, str)  # the layout was checked when the model was prepared
        return decoded + (w - w.detach())


class QuantizeDequantize(nn.Module):
    """coreai-torch's per-tensor `quantize` then `dequantize` of an activation."""

    def __init__(self, qparams: QParams, dtype: torch.dtype, code_dtype: torch.dtype) -> None:
        super().__init__()
        self.register_buffer("scale", torch.tensor(qparams.scale, dtype=dtype))
        zero = torch.tensor(qparams.zero_point, dtype=code_dtype) if qparams.has_zero_point else None
        self.register_buffer("zero_point", zero)
        self.code_dtype = code_dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # positional, as coreai-torch's converter reads the arguments
        q = torch.ops.coreai.quantize(x, self.scale, self.code_dtype, self.zero_point, None, 0)
        return torch.ops.coreai.dequantize(q, self.scale, self.zero_point, None, 0, None, None)
