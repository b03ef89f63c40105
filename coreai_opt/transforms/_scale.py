"""Per-channel scales between an activation and the linears that read it (AWQ), searched on
calibration data and folded into what produces the activation: y = W x = (W diag s)(x / s).

Two producers take the 1/s exactly: a norm's gain (and shift), and - in a gated MLP, where the
down projection reads act(gate) * up - the up projection's output rows. For each such pair the
scales are s = m^a (m: each channel's RMS on the calibration data, a in 0, 1/grid .. 1, s
normalised to a geometric mean of 1) with the a whose round to nearest of every reader's
weight - symmetric, `bits` bits per output channel or per `group_size` inputs (where the inputs divide
into such groups) - loses least on
the calibration inputs: the sum of (W_q - W) H (W_q - W)^T over readers, H the inputs' Gram
matrix. a = 0 (no scaling) is one of the candidates, so the proxy loss never grows.

`smooth` (SmoothQuant, for W8A8) takes s = r^a / w^(1-a) at the config's `alpha` instead: it
moves each activation channel's range into the weights that read it, so one scale per tensor
fits the activations; its proxy loss is reported, not minimised.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from coreai_opt._aten import VIEW_PACKETS, WEIGHT_OPS, aten, packet
from coreai_opt.weights import Needs, Use

from ._fold_norms import Reader, norm_groups, replace_tensor
from ._graph import bias_operand, parameters, source

if TYPE_CHECKING:
    import torch
    from torch.export import ExportedProgram
    from torch.fx import Node


@dataclass(frozen=True)
class _Pair:
    """Who takes 1/s (`divided`: state names and the axis each is divided along) and who takes s
    (`readers`); `label` names the pair in the report."""

    label: str
    divided: tuple[tuple[str, int], ...]
    readers: tuple[Reader, ...]


def scale_channels(
    program: ExportedProgram, config: Any, calibration: Any, progress: Any = None
) -> list[str]:
    """Search and fold the scales of every pair (in graph order), each reported to `progress`;
    a line for each."""
    pairs = _norm_pairs(program) + _mlp_pairs(program)
    statistics = calibration.statistics([p.readers[0].weight for p in pairs], Needs.INPUT_GRAM)
    state, lines = program.state_dict, []
    for done, pair in enumerate(pairs, 1):
        if progress is not None:
            progress(done, len(pairs), f"scales of {pair.label}")
        gram = statistics[pair.readers[0].weight].gram
        weights = [state[r.weight].detach().double().movedim(r.input_axis, -1) for r in pair.readers]
        search = _smooth if config.method == "smooth" else _search
        scales, alpha, before, after = search(weights, gram.double(), config)
        if alpha == 0:
            lines.append(f"{pair.label}: left (no scaling helps: proxy loss {before:.3g})")
            continue
        _apply(state, pair, scales)
        lines.append(f"{pair.label}: scaled (a = {alpha:.2f}; proxy loss {before:.3g} -> {after:.3g})")
    return lines


def _norm_pairs(program: ExportedProgram) -> list[_Pair]:
    return [
        _Pair(g.scale, ((g.scale, 0),) + (((g.shift, 0),) if g.shift else ()), g.readers)
        for g in norm_groups(program)
        if g.problem is None
    ]


def _mlp_pairs(program: ExportedProgram) -> list[_Pair]:
    """(up projection, down projection) where down reads mul(a, up(x)) through views alone."""
    names, pairs = parameters(program), []
    for node in program.graph.nodes:
        facts = WEIGHT_OPS.get(packet(node))
        if facts is None or not facts.activations or packet(node) is aten.embedding:
            continue
        reader = _weight_reader(node, facts, names)
        product = _through_views(node.args[facts.activations[0]])
        if (
            reader is None
            or getattr(product, "target", None) is not aten.mul.Tensor
            or len(product.users) != 1
        ):
            continue
        for operand in product.args:
            up = _through_views(operand)
            up_facts = WEIGHT_OPS.get(packet(up)) if hasattr(up, "op") else None
            if up_facts is None or len(up.users) != 1 or packet(up) is aten.embedding:
                continue
            producer = _weight_reader(up, up_facts, names)
            if producer is not None and _rows(program, up, up_facts, names) is not None:
                pairs.append(_Pair(producer.weight, _rows(program, up, up_facts, names), (reader,)))  # type: ignore[arg-type]
                break
    return pairs


def _weight_reader(op: Node, facts: Any, names: dict[str, str]) -> Reader | None:
    weight, perm = source(op.args[facts.weight]) if facts.weight < len(op.args) else (None, None)
    if weight is None or weight.name not in names or len(weight.users) != 1:
        return None
    _, axis = Use(facts.consumer, op.name, perm).axes(weight.meta["val"].dim())
    return Reader(names[weight.name], axis, None)


def _rows(
    program: ExportedProgram, op: Node, facts: Any, names: dict[str, str]
) -> tuple[tuple[str, int], ...] | None:
    """The up projection's weight along its output axis, and its bias, as (name, axis)."""
    weight, perm = source(op.args[facts.weight])
    out_axis, _ = Use(facts.consumer, op.name, perm).axes(weight.meta["val"].dim())  # type: ignore[union-attr]
    found = [(names[weight.name], out_axis)]  # type: ignore[union-attr]
    operand = bias_operand(op)
    if operand is not None:
        bias, bias_perm = source(operand)
        if bias is None or bias.name not in names or bias_perm is not None:
            return None
        found.append((names[bias.name], 0))
    state = program.state_dict
    return tuple(found) if all(state[n].is_floating_point() for n, _ in found) else None


def _through_views(value: Any) -> Any:
    """What `value` is a view of, back through views used once."""
    while packet(value) in VIEW_PACKETS and len(value.users) == 1:
        value = value.args[0]
    return value


def _search(
    weights: list[torch.Tensor], gram: torch.Tensor, config: Any
) -> tuple[torch.Tensor, float, float, float]:
    """(scales, a, proxy loss unscaled, proxy loss scaled) of the best a on the grid."""
    import torch

    rms = gram.diagonal().clamp_min(1e-12).sqrt()
    ones = torch.ones_like(rms)
    best = (ones, 0.0, _loss(weights, ones, gram, config))
    first = best[2]
    for step in range(1, config.grid + 1):
        alpha = step / config.grid
        scales = rms**alpha
        scales = scales / (scales.max() * scales.min()).sqrt()
        loss = _loss(weights, scales, gram, config)
        if loss < best[2]:
            best = (scales, alpha, loss)
    return best[0], best[1], first, best[2]


def _smooth(
    weights: list[torch.Tensor], gram: torch.Tensor, config: Any
) -> tuple[torch.Tensor, float, float, float]:
    """SmoothQuant's migration: s = r^a / w^(1 - a), r each channel's RMS on the calibration data
    (the range a per-tensor activation scale must cover), w its largest weight over every reader,
    a = `config.alpha`; the proxy losses are reported, not searched."""
    import torch

    rms = gram.diagonal().clamp_min(1e-12).sqrt()
    largest = torch.stack([w.abs().reshape(-1, w.shape[-1]).amax(dim=0) for w in weights]).amax(dim=0)
    scales = rms**config.alpha / largest.clamp_min(1e-12) ** (1 - config.alpha)
    scales = scales / (scales.max() * scales.min()).sqrt()
    ones = torch.ones_like(rms)
    return scales, config.alpha, _loss(weights, ones, gram, config), _loss(weights, scales, gram, config)


def _loss(weights: list[torch.Tensor], scales: torch.Tensor, gram: torch.Tensor, config: Any) -> float:
    total = 0.0
    for weight in weights:
        error = _rounded(weight * scales, config) / scales - weight
        total += float(((error @ gram) * error).sum())
    return total


def _rounded(weight: torch.Tensor, config: Any) -> torch.Tensor:
    """Symmetric round to nearest with `config.bits` bits, a scale per output row (per group of
    `config.group_size` inputs when set): the proxy of the format the weights will take."""
    top = 2 ** (config.bits - 1) - 1
    rows = weight.reshape(-1, weight.shape[-1])
    if config.group_size and rows.shape[-1] % config.group_size == 0:
        rows = rows.reshape(rows.shape[0], -1, config.group_size)
    else:
        rows = rows.unsqueeze(1)
    step = rows.abs().amax(dim=-1, keepdim=True).clamp_min(1e-30) / top
    return ((rows / step).round().clamp(-top - 1, top) * step).reshape(weight.shape)


def _apply(state: dict[str, Any], pair: _Pair, scales: torch.Tensor) -> None:
    for name, axis in pair.divided:
        value = state[name].double()
        shape = [1] * value.dim()
        shape[axis] = -1
        replace_tensor(state, name, value / scales.reshape(shape))
    for reader in pair.readers:
        value = state[reader.weight].double()
        shape = [1] * value.dim()
        shape[reader.input_axis] = -1
        replace_tensor(state, reader.weight, value * scales.reshape(shape))
