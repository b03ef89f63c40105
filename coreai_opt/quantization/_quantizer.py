"""`Quantizer`: prepare a model (fake quantization), calibrate it, fine-tune it if wished, finalize.

    quantizer = Quantizer(model, QuantizerConfig())
    prepared = quantizer.prepare((example,))
    with quantizer.calibration_mode():
        for batch in data:
            prepared(batch)
    final = quantizer.finalize(backend=ExportBackend.CoreAI)
    ep = torch.export.export(final, (example,)).run_decompositions(coreai_torch.get_decomp_table())

`prepare` exports a copy of the model once (the caller's model is never changed; a quantizer
made `of_program` takes an exported program as it is) and inserts, in its module, an activation
quantizer before every linear, convolution and matrix-product input and a weight quantizer on
every weight they read. `finalize` edits that exported program in place - coreai-torch's
quantize/dequantize calls with the calibrated scales and zero points, the weights encoded by the
`.pt2` container exactly as `quantize_weights` would - and returns its module (`program` is the
program itself, ready to save or convert); nothing is exported again.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from coreai_opt.compression import CompressionReport, Skipped

from ._config import ExportBackend, Observer, QuantizerConfig
from ._graph import Plan, finalize_weights_config, plan
from ._modules import ActivationQuantizer, WeightQuantizer
from ._observers import QParams

if TYPE_CHECKING:
    from torch.export import ExportedProgram
    from torch.fx import GraphModule

_CODE_DTYPES = {"int8": torch.int8, "uint8": torch.uint8}
_CHECK_BATCHES = 32  # calibration batches kept to choose MSE ranges by the model's output
_SNR_MARGIN_DB = 0.01  # a range change must beat the estimate's noise, not just tie it

# a calibration pass: the prepared model's positional and keyword inputs
_Batch = tuple[tuple[Any, ...], dict[str, Any]]
# the float model's output leaves for a batch, and their energy
_Reference = tuple[list[torch.Tensor], float]


def _float_leaves(output: Any) -> list[torch.Tensor]:
    from torch.utils._pytree import tree_leaves

    return [t.detach() for t in tree_leaves(output) if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _record_batch(
    batches: list[_Batch], module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """Forward hook: keep a calibration pass (copies of its inputs) while fewer than are wanted."""
    from torch.utils._pytree import tree_map

    if len(batches) < _CHECK_BATCHES:

        def copied(value: Any) -> Any:
            return value.detach().clone() if isinstance(value, torch.Tensor) else value

        batches.append((tree_map(copied, args), tree_map(copied, kwargs)))


class NothingToQuantize(ValueError):
    """The model has no linear, convolution or matrix-product op the config quantizes."""


class NotCalibrated(RuntimeError):
    """`finalize` before any calibration pass reached every activation quantizer."""


@dataclass(frozen=True)
class ActivationResult:
    """One quantized activation: where, how, and the calibrated range and parameters."""

    name: str  # the graph value
    consumers: tuple[str, ...]
    dtype: str
    qscheme: str
    observer: str
    qparams: QParams
    range_from: str  # the observer whose range is used: "minmax" where MSE's lost the output check

    def to_dict(self) -> dict[str, Any]:
        p = self.qparams
        return {"name": self.name, "consumers": list(self.consumers), "dtype": self.dtype,
                "qscheme": self.qscheme, "observer": self.observer, "range_from": self.range_from,
                "range": [p.lo, p.hi],
                "scale": p.scale, "zero_point": p.zero_point}  # fmt: skip


@dataclass
class QuantizationReport:
    """What `finalize` quantized: every activation, and the weights as `quantize_weights` reports them."""

    activations: list[ActivationResult] = field(default_factory=list)
    weights: CompressionReport = field(default_factory=CompressionReport)
    float_ops: list[str] = field(default_factory=list)  # ops a None config left in float
    weights_left_float: list[Skipped] = field(default_factory=list)  # weights of quantized ops, and why

    def to_dict(self) -> dict[str, Any]:
        return {
            "activations": [a.to_dict() for a in self.activations],
            "weights": self.weights.to_dict(),
            "float_ops": self.float_ops,
            "weights_left_float": [
                {"name": s.name, "shape": list(s.shape), "reason": s.reason} for s in self.weights_left_float
            ],
        }


class Quantizer:
    """Weight and activation quantization with calibration and quantization-aware training."""

    def __init__(self, model: nn.Module, config: QuantizerConfig | None = None) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"Quantizer takes a torch.nn.Module, not {type(model).__name__}")
        self.model = model
        self.config = config if config is not None else QuantizerConfig()
        if not isinstance(self.config, QuantizerConfig):
            raise TypeError(f"config must be a QuantizerConfig, not {self.config!r}")
        self.prepared: GraphModule | None = None
        self.program: ExportedProgram | None = None  # the exported program finalize edits
        self.report: QuantizationReport | None = None
        self._plan: Plan | None = None
        self._example: tuple[Any, ...] = ()
        self._activations: list[ActivationQuantizer] = []
        self._unprepared: GraphModule | None = None

    @classmethod
    def of_program(cls, program: ExportedProgram, config: QuantizerConfig | None = None) -> Quantizer:
        """A quantizer for an exported program (coreai-torch's decompositions applied, as a `.pt2`
        holds it): `prepare` takes its module (`self.model`, which becomes the prepared module;
        `program.module()` gives a float one), `finalize` edits `program` itself in place."""
        from coreai_opt._export import ready_to_run

        ready_to_run(program)  # read from a file: its first run is a forked child's
        module = program.module()
        quantizer = cls(module, config)
        quantizer.program = program
        quantizer._unprepared = module  # prepare's module: unlifting a program again costs as much
        return quantizer

    @property
    def example_inputs(self) -> tuple[Any, ...]:
        """The inputs `prepare` exported with (`finalize` exports with them again)."""
        return self._example

    def prepare(self, example_inputs: tuple[Any, ...]) -> GraphModule:
        """An exported copy of the model with fake quantization inserted (differentiable)."""
        from coreai_opt._export import register_coreai_ops

        register_coreai_ops()
        example_inputs = tuple(example_inputs)
        if self.program is None:  # the one export: of a copy, so the caller's model stays as it is
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)  # torch's own pytree deprecations
                model = copy.deepcopy(self.model)
            self.program = torch.export.export(model, example_inputs)
        ep = self.program
        gm, self._unprepared = self._unprepared or ep.module(), None
        found = plan(gm, ep, self.config)
        if not found.activations and not found.weights:
            raise NothingToQuantize(
                "no linear, convolution or matrix-product op to quantize"
                + (f" ({len(found.float_ops)} left in float by the config)" if found.float_ops else "")
            )
        graph = gm.graph
        for k, point in enumerate(found.activations):
            module = ActivationQuantizer(
                point.config, point.value.name, tuple(c.name for c in point.consumers)
            )
            name = f"coreopt_act_{k}"
            gm.add_submodule(name, module)
            with graph.inserting_before(point.consumers[0]):
                quantized = graph.call_module(name, (point.value,))
            for consumer in point.consumers:
                consumer.replace_input_with(point.value, quantized)
            self._activations.append(module)
        for k, weight in enumerate(found.weights):
            name = f"coreopt_weight_{k}"
            gm.add_submodule(name, WeightQuantizer(weight.site, weight.config))
            with graph.inserting_after(weight.attr):
                decoded = graph.call_module(name, (weight.attr,))
            for user in [u for u in weight.attr.users if u is not decoded]:
                user.replace_input_with(weight.attr, decoded)
        graph.lint()
        gm.recompile()
        self.prepared, self._plan, self._example = gm, found, example_inputs
        return gm

    @contextlib.contextmanager
    def calibration_mode(self) -> Iterator[None]:
        """Forward passes inside only collect activation statistics (no gradients, float values);
        on leaving, every activation that was reached gets its scale and zero point.

        With the MSE observer, the first batches' inputs are kept until the end, and each
        activation's MSE range replaces its min-max range only where that brings the output
        closer to the float model's over those batches (mean SNR): one activation's least squared
        error is not the model's."""
        if self.prepared is None:
            raise RuntimeError("call prepare(example_inputs) before calibration_mode()")
        batches: list[_Batch] = []
        hook = None
        if any(m.config.observer is Observer.MSE for m in self._activations):
            hook = self.prepared.register_forward_pre_hook(
                functools.partial(_record_batch, batches), with_kwargs=True
            )
        for module in self._activations:
            module.observing = True
        try:
            with torch.no_grad():
                yield
        finally:
            if hook is not None:
                hook.remove()
            for module in self._activations:
                module.observing = False
                module.calibrate()
        if batches:
            self._choose_ranges_by_output(batches)

    def _choose_ranges_by_output(self, batches: list[_Batch]) -> None:
        """Greedy, in graph order, from all min-max ranges: an activation takes its MSE range when
        the mean output SNR against the float model rises by more than `_SNR_MARGIN_DB`."""
        choices = [m for m in self._activations if len(m.candidates) > 1]
        if not choices:
            return
        references = self._float_outputs(batches)
        for module in choices:
            module.qparams = module.candidates[1]  # min-max
        best = self._mean_output_snr(batches, references)
        for module in choices:
            module.qparams = module.candidates[0]  # the MSE range
            snr = self._mean_output_snr(batches, references)
            if snr > best + _SNR_MARGIN_DB:
                best = snr
            else:
                module.qparams = module.candidates[1]

    def _float_outputs(self, batches: list[_Batch]) -> list[_Reference]:
        """The prepared model's outputs with every quantizer passing its input through, and each
        batch's signal energy (the SNRs' numerator, the same for every candidate)."""
        assert self.prepared is not None
        quantizers = [
            m for m in self.prepared.modules() if isinstance(m, ActivationQuantizer | WeightQuantizer)
        ]
        for module in quantizers:
            module.passthrough = True
        try:
            with torch.no_grad():
                outputs = [_float_leaves(self.prepared(*args, **kwargs)) for args, kwargs in batches]
        finally:
            for module in quantizers:
                module.passthrough = False
        return [(leaves, sum(float((r.double() ** 2).sum()) for r in leaves)) for leaves in outputs]

    def _mean_output_snr(self, batches: list[_Batch], references: list[_Reference]) -> float:
        import tcast

        assert self.prepared is not None
        total = 0.0
        with torch.no_grad():
            for (args, kwargs), (reference, signal) in zip(batches, references, strict=True):
                output = _float_leaves(self.prepared(*args, **kwargs))
                noise = sum(
                    float(((r.double() - o.double()) ** 2).sum())
                    for r, o in zip(reference, output, strict=True)
                )
                total += tcast.snr_db(signal, noise)
        return total / len(batches)

    def finalize(self, backend: ExportBackend | str = ExportBackend.CoreAI) -> GraphModule:
        """The calibrated model with coreai-torch's ops: activations quantized and dequantized,
        weights encoded, in the exported program (`self.program`, edited in place: it saves and
        converts as it is) and its module, which runs in PyTorch. `self.report` says what was
        quantized."""
        return self.finalize_program(backend).module()

    def finalize_program(self, backend: ExportBackend | str = ExportBackend.CoreAI) -> ExportedProgram:
        """`finalize` without unlifting the program into a module: for callers that save or
        convert the program (`self.program`, returned) and never run it here."""
        from coreai_opt.compression import compress_

        if ExportBackend(backend) is not ExportBackend.CoreAI:
            raise ValueError(f"unknown backend {backend!r}")
        if self.prepared is None or self._plan is None or self.program is None:
            raise RuntimeError("call prepare(example_inputs) and calibrate before finalize()")
        missing = [m.value_name for m in self._activations if m.qparams is None]
        if missing:
            raise NotCalibrated(
                f"{len(missing)} activation(s) saw no calibration pass ({', '.join(missing[:3])}"
                f"{', ...' if len(missing) > 3 else ''}): run forward passes inside calibration_mode()"
            )
        ep = self.program
        _take_trained_weights(self.prepared, ep)
        report = QuantizationReport(
            float_ops=list(self._plan.float_ops), weights_left_float=list(self._plan.skipped)
        )
        for k, module in enumerate(self._activations):
            assert module.qparams is not None
            _quantize_activation(ep, k, module)
            report.activations.append(
                ActivationResult(module.value_name, module.consumers, module.config.dtype.value,
                                 module.config.qscheme.value, module.config.observer.value, module.qparams,
                                 module.range_from)
            )  # fmt: skip
        ep.graph.lint()
        report.weights = compress_(ep, finalize_weights_config(self._plan.weights))  # recompiles, validates
        self.report = report
        return ep


def _take_trained_weights(prepared: GraphModule, ep: ExportedProgram) -> None:
    """The prepared module's parameters as the program's (what fine-tuning made of them)."""
    for name, parameter in prepared.named_parameters():
        stored = ep.state_dict.get(name)
        if stored is not None and stored is not parameter:
            with torch.no_grad():
                stored.copy_(parameter)


def _quantize_activation(ep: ExportedProgram, k: int, module: ActivationQuantizer) -> None:
    """coreai-torch's per-tensor `quantize` then `dequantize` of one activation, read by every op
    that read it quantized (scale and zero point as buffers `coreopt_act_<k>.*`)."""
    from coreai_opt._export import ProgramEdit, register_coreai_ops

    ops = register_coreai_ops()
    p = module.qparams
    assert p is not None
    nodes = {node.name: node for node in ep.graph.nodes}
    value = nodes[module.value_name]
    consumers = [nodes[name] for name in module.consumers]
    dtype, code_dtype = value.meta["val"].dtype, _CODE_DTYPES[module.config.dtype.value]
    edit = ProgramEdit(ep)
    scale = edit.buffer(
        f"coreopt_act_{k}_scale", f"coreopt_act_{k}.scale", torch.tensor(p.scale, dtype=dtype)
    )
    zero = None
    if p.has_zero_point:
        zero_value = torch.tensor(p.zero_point, dtype=code_dtype)
        zero = edit.buffer(f"coreopt_act_{k}_zero_point", f"coreopt_act_{k}.zero_point", zero_value)
    order = {node: i for i, node in enumerate(ep.graph.nodes)}
    with ep.graph.inserting_before(min(consumers, key=order.__getitem__)):
        codes = edit.call(ops.quantize.default, value, scale, code_dtype, zero, None, 0)
        dequantized = edit.call(ops.dequantize.default, codes, scale, zero, None, 0, None, None)
    for consumer in consumers:
        consumer.replace_input_with(value, dequantized)
