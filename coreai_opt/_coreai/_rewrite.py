"""Reading and replacing weight constants of a Core AI program (every coreai-core detail of it).

The compression passes see weights as numpy arrays and hand back numpy arrays of codes; this
module turns those into `coreai.constant` ops (sub-byte types packed low bits first) and rewires
the graph.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

from ._ir import (
    constant_array,
    constant_bytes,
    constant_ops,
    element_bits,
    element_name,
    mlir_module,
    tensor_shape,
)

# Ops that take a weight, and which operand is the weight.
WEIGHT_CONSUMERS = {
    "coreai.conv2d": 1,
    "coreai.batch_matmul": 1,
    "coreai.decomposable.broadcasting_batch_matmul": 1,
    "coreai.gather_nd": 0,
}
FLOAT_ELEMENTS = ("f32", "f16", "bf16")


@dataclass
class WeightSite:
    """An eligible weight: the constant op, its name, shape, and the axes its consumer implies."""

    op: Any
    name: str
    shape: tuple[int, ...]
    element: str
    consumer: str
    output_axis: int  # the channel axis (one scale / LUT per channel)
    input_axis: int  # the axis blocks run along (reduction axis of the consumer)


class SkipKind(enum.Enum):
    """Why a float constant was left alone, in a form a renderer can group by."""

    SMALL = "small"  # at or below the element-count threshold
    NOT_A_WEIGHT = "not-a-weight"  # not consumed as a conv/matmul/gather weight
    LAYOUT = "layout"  # a weight, but its shape does not fit the requested granularity
    NON_FINITE = "non-finite"  # a weight holding NaN or Inf: no scale, LUT or mask represents it


@dataclass(frozen=True)
class Skipped:
    name: str
    shape: tuple[int, ...]
    reason: str
    kind: SkipKind


def constant_name(op: Any, index: int) -> str:
    """A readable name: the torch identifier in the op's location metadata, else `const#<index>`,
    the constant's position in the program (the same in every process, unlike a hash)."""
    text = str(op.location)
    marker = 'identifiers = ["'
    if marker in text:
        start = text.index(marker) + len(marker)
        return text[start : text.index('"', start)]
    return f"const#{index}"


def read_weight(op: Any) -> torch.Tensor:
    """A float constant as a tensor of its own dtype (f32, f16 or bf16), without conversion."""
    import torch

    dtypes = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
    element = element_name(op.result.type)
    if element not in dtypes:
        raise ValueError(f"cannot read a {element} constant as floats")
    raw = torch.from_numpy(constant_array(op))
    return raw.view(dtypes[element]).reshape(tensor_shape(op.result.type))


def _consumer(op: Any) -> tuple[str, int, int] | None:
    """(consumer op, output axis, input axis) of a weight constant, looking through one transpose."""
    uses = list(op.result.uses)
    if not uses:
        return None
    rank = len(tensor_shape(op.result.type))
    kinds = set()
    for use in uses:
        owner = use.owner
        name = owner.name
        if name == "coreai.transpose" and use.operand_number == 0:
            perm = _transpose_perm(owner)
            inner = list(owner.result.uses)
            if (
                perm is None
                or not inner
                or any(
                    u.owner.name not in WEIGHT_CONSUMERS or u.operand_number != WEIGHT_CONSUMERS[u.owner.name]
                    for u in inner
                )
            ):
                return None
            consumer = inner[0].owner.name
            # matmul y is [.., K, N]: output channels on the last axis, K on the one before
            out_after, in_after = (rank - 1, rank - 2) if "matmul" in consumer else (0, 1)
            kinds.add((consumer, perm[out_after], perm[in_after]))
        elif name in WEIGHT_CONSUMERS and use.operand_number == WEIGHT_CONSUMERS[name]:
            if name == "coreai.conv2d":
                kinds.add((name, 0, 1))
            elif name == "coreai.gather_nd":
                kinds.add((name, 0, rank - 1))
            else:
                kinds.add((name, rank - 1, rank - 2))
        else:
            return None
    return kinds.pop() if len(kinds) == 1 else None


def _transpose_perm(op: Any) -> list[int] | None:
    source = op.operands[1].owner
    if getattr(source, "name", None) != "coreai.constant":
        return None
    try:
        values = np.frombuffer(constant_bytes(source), dtype=np.uint32)
    except Exception:
        return None
    return [int(v) for v in values]


def weight_sites(program: Any, threshold: int) -> tuple[list[WeightSite], list[Skipped]]:
    """Constants a compression pass may rewrite, and every other float constant with the reason why not."""
    module = mlir_module(program)
    sites, skipped = [], []
    for index, op in enumerate(constant_ops(module)):
        mlir_type = op.result.type
        if not hasattr(mlir_type, "shape"):
            continue
        element, shape = element_name(mlir_type), tensor_shape(mlir_type)
        if element not in FLOAT_ELEMENTS:
            continue
        name = constant_name(op, index)
        count = int(np.prod(shape)) if shape else 1
        if count <= threshold:
            skipped.append(Skipped(name, shape, f"{count} elements <= threshold {threshold}", SkipKind.SMALL))
            continue
        consumer = _consumer(op)
        if consumer is None:
            users = sorted({u.owner.name for u in op.result.uses})
            skipped.append(
                Skipped(
                    name,
                    shape,
                    f"not a weight of conv/matmul/gather (used by {', '.join(users)})",
                    SkipKind.NOT_A_WEIGHT,
                )
            )
            continue
        sites.append(WeightSite(op, name, shape, element, *consumer))
    return sites, skipped


def _element_type(element: str) -> Any:
    from coreai._compiler import ir

    if element.startswith(("si", "ui")):
        width = int(element[2:])
        return ir.IntegerType.get_signed(width) if element[0] == "s" else ir.IntegerType.get_unsigned(width)
    factories = {
        "f32": ir.F32Type.get,
        "f16": ir.F16Type.get,
        "bf16": ir.BF16Type.get,
        "f8E4M3FN": ir.Float8E4M3FNType.get,
        "f8E5M2": ir.Float8E5M2Type.get,
        "f4E2M1FN": ir.Float4E2M1FNType.get,
        "f8E8M0FNU": ir.Float8E8M0FNUType.get,
    }
    return factories[element]()


class Rewriter:
    """Builds constants and decompression ops in front of one weight and swaps them in."""

    def __init__(self, program: Any) -> None:
        self.program = program
        self.module = mlir_module(program)
        # resource constants reference these buffers until the program is saved: keep them with it
        keep = getattr(program, "_coreopt_buffers", None)
        if keep is None:
            keep = []
            program._coreopt_buffers = keep
        self._buffers: list[np.ndarray] = keep
        self._count = 0

    def constant(
        self, site: WeightSite, bits_or_values: np.ndarray, element: str, shape: tuple[int, ...]
    ) -> Any:
        """A constant of `element` type; `bits_or_values` holds unsigned codes for sub-byte/minifloat types,
        or the values themselves for f32/f16/si8/ui8."""
        from coreai._compiler import ir
        from coreai._compiler.dialects import coreai as dialect

        bits = element_bits(element)
        if bits < 8:
            import torch

            from tcast import pack_codes

            data = pack_codes(torch.from_numpy(np.ascontiguousarray(bits_or_values)), bits).numpy()
        else:
            data = np.ascontiguousarray(bits_or_values).view(np.uint8).reshape(-1)
        self._buffers.append(data)
        self._count += 1
        tensor_type = ir.RankedTensorType.get(list(shape), _element_type(element))
        attr = ir.DenseResourceElementsAttr.get_from_buffer(
            memoryview(data), f"coreopt_{site.name}_{self._count}", tensor_type
        )
        return dialect.ConstantOp(value=attr).result

    def zeros(self, element: str, shape: tuple[int, ...]) -> Any:
        """An inline splat zero constant (verifiers require a visible constant zero for FP8/FP4 offsets)."""
        from coreai._compiler import ir
        from coreai._compiler.dialects import coreai as dialect

        element_type = _element_type(element)
        tensor_type = ir.RankedTensorType.get(list(shape), element_type)
        if element.startswith(("si", "ui")):
            zero = ir.IntegerAttr.get(element_type, 0)
        else:
            zero = ir.FloatAttr.get(element_type, 0.0)
        return dialect.ConstantOp(value=ir.DenseElementsAttr.get_splat(tensor_type, zero)).result

    def shift_scale(
        self,
        site: WeightSite,
        data: Any,
        scale: np.ndarray,
        scale_element: str,
        shape: tuple[int, ...],
        offset: np.ndarray | None = None,
        offset_element: str = "",
    ) -> Any:
        """blockwise_shift_scale(data, scale, offset1, 0): offset1 a real constant only when some
        offset is nonzero (else a zero splat, which FP8/FP4 verifiers demand); the output takes
        the weight's dtype."""
        scale_c = self.constant(site, scale, scale_element, shape)
        if offset is not None and np.any(offset):
            offset1 = self.constant(site, offset, offset_element, shape)
        else:
            offset1 = self.zeros(offset_element, shape)
        return blockwise_shift_scale(data, scale_c, offset1, self.zeros(site.element, shape))

    def replace(self, site: WeightSite, build: Any) -> Any:
        """Run `build()` at the weight's position; its result replaces the weight and is returned."""
        from coreai._compiler import ir

        op = site.op
        with self.module.context, op.location, ir.InsertionPoint(op):
            new = build()
        op.result.replace_all_uses_with(new)
        op.erase()
        return new

    def verify(self) -> None:
        self.module.operation.verify()


def blockwise_shift_scale(data: Any, scale: Any, offset1: Any, offset2: Any) -> Any:
    from coreai._compiler.dialects import coreai as dialect

    return dialect.BlockwiseShiftScaleOp(data, scale, offset1, offset2).result
