"""The modules `Quantizer` inserts: fake quantization while preparing, coreai-torch's ops when final.

Prepared, an activation quantizer observes (during `calibration_mode`) or fake-quantizes with the
calibrated scale; a weight quantizer replaces its weight by the weight its encoding decodes to.
Both pass gradients straight through (activations only inside the quantization range), so a
prepared model can be fine-tuned. `finalize` adds `coreai::quantize` then `coreai::dequantize`
calls to the program itself (`Quantizer`).
"""

from __future__ import annotations

import torch
from torch import nn

from coreai_opt.compression import QuantizeConfig, WeightSite
from coreai_opt.compression.grids import dequantized

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
    """A weight replaced by what its encoding decodes to; the gradient passes straight through.

    The decoded weight is kept until the weight changes (a training step bumps its version), so
    calibration passes encode each weight once, not once per pass."""

    def __init__(self, site: WeightSite, config: QuantizeConfig) -> None:
        super().__init__()
        self.site = site
        self.config = config
        self.passthrough = False  # the float model, for reference outputs
        self._kept: tuple[tuple[int, int, int], torch.Tensor] | None = None

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        if self.passthrough:
            return w
        key = (id(w), w.data_ptr(), w._version)
        if self._kept is None or self._kept[0] != key:
            decoded = dequantized(w.detach(), self.site, self.config)
            assert not isinstance(decoded, str)  # the layout was checked when the model was prepared
            self._kept = (key, decoded)
        if not (w.requires_grad and torch.is_grad_enabled()):
            return self._kept[1]  # calibrating: no straight-through term to build (a weight-sized add)
        return self._kept[1] + (w - w.detach())
