"""Where quantizers go in an exported model's graph: the activations and weights of its linear,
convolution and matrix-product ops.

An operand of such an op is a weight when it is a parameter or buffer (`get_attr`), possibly
through transposing or reshaping views; every other float operand is an activation. An
activation read by several quantized ops with the same config gets one quantizer, so q, k and v
projections read the same codes. Weights are chosen by the compression package's rules (the
`.pt2` container's candidates), so `finalize` encodes exactly the weights prepared here.
"""

from __future__ import annotations

import glob
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from coreai_opt._aten import PASS_THROUGH, WEIGHT_OPS, module_path
from coreai_opt.compression import Override, QuantizeConfig, SkipKind, Skipped, WeightSite, select_sites
from coreai_opt.compression.grids import scale_shape
from coreai_opt.weights import Consumer

from ._config import ActivationConfig, OpConfig, OpType, QuantizerConfig

if TYPE_CHECKING:
    from torch.export import ExportedProgram
    from torch.fx import GraphModule, Node


_OP_TYPES = {Consumer.LINEAR: OpType.LINEAR, Consumer.CONV: OpType.CONV, Consumer.MATMUL: OpType.MATMUL}


def _ops() -> dict[Any, tuple[OpType, tuple[int, ...]]]:
    """ATen op -> (its type, the operands that are activations or, through views, weights), from
    the one ATen table (embedding lookups have no activation to quantize)."""
    return {
        packet: (_OP_TYPES[op.consumer], tuple(sorted({*op.activations, op.weight})))
        for packet, op in WEIGHT_OPS.items()
        if op.consumer in _OP_TYPES
    }


def _state_root(node: Node, views: frozenset[Any]) -> Node | None:
    """The `get_attr` a value is a view of, or None."""
    while node.op == "call_function" and getattr(node.target, "overloadpacket", None) in views:
        first = node.args[0]
        if not isinstance(first, torch.fx.Node):
            return None
        node = first
    return node if node.op == "get_attr" else None


def _is_float(node: Node) -> bool:
    value = node.meta.get("val")
    return isinstance(value, torch.Tensor) and value.is_floating_point()


@dataclass
class ActivationPoint:
    value: Node
    config: ActivationConfig
    consumers: list[Node] = field(default_factory=list)


@dataclass
class WeightPoint:
    attr: Node  # the get_attr node
    site: WeightSite
    config: QuantizeConfig
    consumers: list[Node] = field(default_factory=list)


@dataclass
class Plan:
    activations: list[ActivationPoint]
    weights: list[WeightPoint]
    skipped: list[Skipped]  # weights of quantized ops left in float, with the reason
    float_ops: list[str]  # ops left in float by a None config


def plan(gm: GraphModule, ep: ExportedProgram, config: QuantizerConfig) -> Plan:
    """Every activation and weight to quantize in `gm` (`ep.module()`, whose candidates `ep` lists)."""
    from coreai_opt._export import ExportWeights

    ops, views = _ops(), PASS_THROUGH
    activations: dict[tuple[str, ActivationConfig], ActivationPoint] = {}
    wanted: dict[str, tuple[QuantizeConfig, list[Node]]] = {}
    float_ops: list[str] = []
    attrs: dict[str, Node] = {}
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            attrs[str(node.target)] = node
        entry = ops.get(getattr(node.target, "overloadpacket", None)) if node.op == "call_function" else None
        if entry is None:
            continue
        op_type, operands = entry
        op_config = config.for_op(module_path(node), op_type)
        if op_config is None:
            float_ops.append(node.name)
            continue
        _collect(node, operands, op_config, views, activations, wanted)
    weights, skipped = _weights(ep, ExportWeights(ep).candidates(), wanted, attrs)
    return Plan(list(activations.values()), weights, skipped, float_ops)


def _collect(
    node: Node,
    operands: tuple[int, ...],
    op_config: OpConfig,
    views: frozenset[Any],
    activations: dict[tuple[str, ActivationConfig], ActivationPoint],
    wanted: dict[str, tuple[QuantizeConfig, list[Node]]],
) -> None:
    args = list(node.args)
    for arg in (args[i] for i in operands if i < len(args)):
        if not isinstance(arg, torch.fx.Node) or not _is_float(arg):
            continue
        root = _state_root(arg, views)
        if root is not None:
            if op_config.weights is not None:
                name = str(root.target)
                previous = wanted.get(name)
                if previous is not None and previous[0] != op_config.weights:
                    raise ValueError(f"weight {name} is read by ops with different weight configs")
                wanted.setdefault(name, (op_config.weights, []))[1].append(node)
            continue
        if op_config.activations is None:
            continue
        key = (arg.name, op_config.activations)
        point = activations.setdefault(key, ActivationPoint(arg, op_config.activations))
        if node not in point.consumers:
            point.consumers.append(node)


def _weights(
    ep: ExportedProgram,
    candidates: list[Any],
    wanted: dict[str, tuple[QuantizeConfig, list[Node]]],
    attrs: dict[str, Node],
) -> tuple[list[WeightPoint], list[Skipped]]:
    """The compression package's choice among the weights the quantized ops read."""

    def config_for(name: str) -> QuantizeConfig | Override:
        chosen = wanted.get(name)
        return chosen[0] if chosen is not None else Override(glob.escape(name), skip=True)

    relevant = [c for c in candidates if c.name in wanted]
    sites, skipped = select_sites(relevant, 0, config_for)
    points = []
    for site, site_config in sites:
        if site.count <= site_config.weight_num_threshold:
            reason = f"{site.count} elements <= threshold {site_config.weight_num_threshold}"
            skipped.append(site.skipped(reason, SkipKind.SMALL))
        elif isinstance(layout := scale_shape(site, site_config), str):
            skipped.append(site.skipped(layout, SkipKind.LAYOUT))
        elif site.name not in attrs:
            skipped.append(site.skipped("not a module attribute", SkipKind.NOT_A_WEIGHT))
        else:
            points.append(WeightPoint(attrs[site.name], site, site_config, wanted[site.name][1]))
    return points, skipped


def finalize_weights_config(points: list[WeightPoint]) -> QuantizeConfig:
    """One `QuantizeConfig` for `compress_` that encodes exactly these weights, each as prepared:
    an override per weight naming its options, then one that skips everything else."""
    fields = ("dtype", "qscheme", "granularity", "block_size", "scale_dtype")
    overrides = [
        Override.of(glob.escape(p.site.name), **{name: getattr(p.config, name) for name in fields})
        for p in points
    ]
    return QuantizeConfig(weight_num_threshold=0, overrides=(*overrides, Override.of("*", skip=True)))
