"""The weights of a Core AI program as a compression container: every coreai-core detail of it.

`CoreAIWeights` lists the program's float constants with how each is used (for the compression
package to choose from), reads a weight as a tensor, and writes an encoded weight as constants
and decompression ops (`blockwise_shift_scale`, `lut_to_dense`, the sparse bitmask ops) in its
place. Sub-byte codes are packed low bits first, as Core AI reads them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from coreai_opt._elements import ELEMENTS, element
from coreai_opt.weights import (
    Candidate,
    Consumer,
    Encoding,
    Palettized,
    Quantized,
    ShiftScale,
    Sparse,
    Stored,
    Use,
    WeightSite,
    Written,
)

from ._ir import (
    bytecode_page_releases,
    constant_array,
    constant_bytes,
    constant_nbytes,
    constant_ops,
    location_name,
    mlir_module,
    named_location,
    stored_nbytes,
    tensor_shape,
)

if TYPE_CHECKING:
    import torch

# op -> (the weight's operand, how the op reads it)
WEIGHT_CONSUMERS = {
    "coreai.conv2d": (1, Consumer.CONV),
    "coreai.batch_matmul": (1, Consumer.MATMUL),
    "coreai.decomposable.broadcasting_batch_matmul": (1, Consumer.MATMUL),
    "coreai.gather_nd": (0, Consumer.GATHER),
}


def constant_name(op: Any, index: int) -> str:
    """A readable name: the source name in the op's location, else `const#<index>`, the constant's
    position in the program (the same in every process, unlike a hash)."""
    return location_name(op) or f"const#{index}"


_RANDOM_SUFFIX = re.compile(r"^(?P<base>.+)_[a-z]{8}$")


def canonical_symbol_names(program: Any) -> int:
    """Rename the private graphs coreai's authoring API names with a random suffix (`layer_norm_
    kanpfudi`, drawn by `secrets` at every conversion) after their base name and place, the same in
    every run, so converting a program twice gives the same bytes; returns how many were renamed."""
    import hashlib

    from coreai._compiler import ir

    module = mlir_module(program)
    renamed = 0
    with module.context:
        for index, op in enumerate(module.body.operations):
            if "sym_name" not in op.attributes:
                continue
            old = ir.StringAttr(op.attributes["sym_name"]).value
            match = _RANDOM_SUFFIX.match(old)
            if match is None or old == "main":
                continue
            digest = hashlib.sha256(f"{match['base']}:{index}".encode()).digest()
            new = f"{match['base']}_" + "".join(chr(ord("a") + b % 26) for b in digest[:8])
            ir.SymbolTable.replace_all_symbol_uses(old, new, module.operation)
            op.attributes["sym_name"] = ir.StringAttr.get(new)
            renamed += 1
    return renamed


def name_constants(
    program: Any,
    name_of: Callable[[np.ndarray], str | None],
    name_of_node: Callable[[str], str | None] = lambda _: None,
) -> int:
    """Give every float constant that `name_of` recognises (its values as a numpy array of their own
    dtype and shape) that name in its location, so reports and overrides see the source's names;
    returns how many were named. A constant computed at conversion (a rotary table) keeps the FX
    node name the converter gave it, under the module it came from (`name_of_node`). The constant
    is rebuilt with the same value attribute (locations cannot be changed in place)."""

    module = mlir_module(program)
    named: list[tuple[Any, str]] = []  # (the renamed constant's value, its name)
    unnamed = []
    for op in constant_ops(module):
        mlir_type = op.result.type
        kind = ELEMENTS.get(str(getattr(mlir_type, "element_type", "")))
        if kind is None or not kind.is_float or kind.bits not in (16, 32) or not hasattr(mlir_type, "shape"):
            continue
        values = constant_array(op).view(kind.numpy_dtype()).reshape(tensor_shape(mlir_type))
        name = name_of(values)
        if name is None:
            unnamed.append(op)
            continue
        renamed = _renamed(module, op, name)
        if renamed is not None:
            named.append((renamed, name))
    for op in unnamed:  # a folded batch norm's bias: added to the output of the convolution it follows
        node = location_name(op)
        name = _folded_bias(op, named) or (name_of_node(node) if node else None)
        if name is not None and _renamed(module, op, name) is not None:
            named.append((None, name))
    return len(named)


def _renamed(module: Any, op: Any, name: str) -> Any:
    """`op` rebuilt with `name` in its location (locations cannot change in place); its new value,
    or None where the location cannot carry the name."""
    from coreai._compiler import ir
    from coreai._compiler.dialects import coreai as dialect

    with module.context:
        location = named_location(op, name)
    if location is None:
        return None
    with module.context, location, ir.InsertionPoint(op):
        new = dialect.ConstantOp(value=op.attributes["value"]).result
    op.result.replace_all_uses_with(new)
    op.erase()
    return new


def _folded_bias(op: Any, named: list[tuple[Any, str]]) -> str | None:
    """`<conv>.bias.bn_folded` for a constant added to the result of an op that reads a weight
    named `<conv>.weight.bn_folded`, else None."""
    for use in op.result.uses:
        adder = use.owner
        if not adder.name.endswith("add"):
            continue
        for operand in adder.operands:
            producer = getattr(operand.owner, "operands", None)
            for read in producer or ():
                name = next((n for v, n in named if v is not None and v == read), None)
                if name is not None and name.endswith(".weight.bn_folded"):
                    return name.removesuffix(".weight.bn_folded") + ".bias.bn_folded"
    return None


def _transpose_perm(op: Any) -> tuple[int, ...] | None:
    source = op.operands[1].owner
    if getattr(source, "name", None) != "coreai.constant":
        return None
    try:
        values = np.frombuffer(constant_bytes(source), dtype=np.uint32)
    except Exception:
        return None
    return tuple(int(v) for v in values)


def _uses(op: Any) -> tuple[Use, ...]:
    """How each op that reads the constant reads it (looking through one transpose)."""
    found = []
    for use in op.result.uses:
        owner = use.owner
        if owner.name == "coreai.transpose" and use.operand_number == 0:
            perm = _transpose_perm(owner)
            inner = list(owner.result.uses)
            if perm is None or not inner:
                found.append(Use(Consumer.OTHER, owner.name))
            for inner_use in inner:
                operand, consumer = WEIGHT_CONSUMERS.get(inner_use.owner.name, (None, Consumer.OTHER))
                if inner_use.operand_number == operand:
                    found.append(Use(consumer, inner_use.owner.name, perm))
                else:
                    found.append(Use(Consumer.OTHER, owner.name))
            continue
        operand, consumer = WEIGHT_CONSUMERS.get(owner.name, (None, Consumer.OTHER))
        found.append(Use(consumer if use.operand_number == operand else Consumer.OTHER, owner.name))
    return tuple(found)


def _element_type(name: str) -> Any:
    """The MLIR type of a Core AI element name."""
    from coreai._compiler import ir

    if name.startswith(("si", "ui")):
        width = int(name[2:])
        return ir.IntegerType.get_signed(width) if name[0] == "s" else ir.IntegerType.get_unsigned(width)
    factories = {
        "f32": ir.F32Type.get,
        "f16": ir.F16Type.get,
        "bf16": ir.BF16Type.get,
        "f8E4M3FN": ir.Float8E4M3FNType.get,
        "f8E5M2": ir.Float8E5M2Type.get,
        "f4E2M1FN": ir.Float4E2M1FNType.get,
        "f8E8M0FNU": ir.Float8E8M0FNUType.get,
    }
    return factories[name]()


def resource_constant(stored: Stored, key: str) -> Any:
    """A resource constant named `key` holding `stored` (sub-byte codes packed low bits first), at
    the current insertion point."""
    from coreai._compiler import ir
    from coreai._compiler.dialects import coreai as dialect

    bits = stored.element.bits
    if bits < 8:
        import torch

        import tcast

        data = tcast.pack_codes(torch.from_numpy(np.require(stored.values, requirements="CW")), bits).numpy()
    else:
        data = np.ascontiguousarray(stored.values).view(np.uint8).reshape(-1)
    tensor_type = ir.RankedTensorType.get(list(stored.shape), _element_type(stored.element.name))
    attr = ir.DenseResourceElementsAttr.get_from_buffer(memoryview(data), key, tensor_type)
    return dialect.ConstantOp(value=attr).result


class CoreAIWeights:
    """A Core AI program's weights, compressed in place (a `weights.Container`)."""

    def __init__(self, program: Any) -> None:
        self.module = mlir_module(program)
        self._count = 0
        self._releases = bytecode_page_releases()  # weights are read from coreai-core's map

    def candidates(self) -> list[Candidate]:
        found = []
        for index, op in enumerate(constant_ops(self.module)):
            mlir_type = op.result.type
            if not hasattr(mlir_type, "shape"):
                continue
            kind = ELEMENTS.get(str(mlir_type.element_type))
            if kind is None or not kind.is_float or kind.bits not in (16, 32):  # the float storage of weights
                continue
            name, shape = constant_name(op, index), tensor_shape(mlir_type)
            found.append(Candidate(op, name, shape, kind, _uses(op), stored_bytes=constant_nbytes(op)))
        return found

    def compressed(self) -> int:
        from ._ir import DECOMPRESSION_OPS, walk_ops

        def stored(op: Any) -> bool:  # a decompression of constants only (a cast of an activation is not)
            if op.name == "coreai.constant":
                return True
            owners = [getattr(operand.owner, "name", None) and operand.owner for operand in op.operands]
            return op.name in DECOMPRESSION_OPS and all(o and stored(o) for o in owners)

        def root(op: Any) -> bool:
            users = [use.owner.name for result in op.results for use in result.uses]
            return (
                op.name in DECOMPRESSION_OPS and any(u not in DECOMPRESSION_OPS for u in users) and stored(op)
            )

        return sum(root(op) for op in walk_ops(self.module))

    def read(self, site: WeightSite) -> torch.Tensor:
        """The weight as a tensor of its own dtype (f32, f16 or bf16), without conversion."""
        import torch

        raw = torch.from_numpy(constant_array(site.handle))
        return raw.view(site.element.torch_dtype()).reshape(site.shape)

    def refusal(self, site: WeightSite, encoding: Encoding) -> str | None:
        return None  # Core AI stores every encoding the compression package makes

    def write(self, site: WeightSite, encoding: Encoding) -> Written:
        from coreai._compiler import ir

        from ._describe import weight_encoding

        op = site.handle
        before = constant_nbytes(op)
        with self.module.context, op.location, ir.InsertionPoint(op):
            new = self._build(site, encoding.form)
        op.result.replace_all_uses_with(new)
        op.erase()
        self._releases.passed(before)
        return Written(weight_encoding(new), before, stored_nbytes(new))

    def finish(self) -> None:
        self.module.operation.verify()

    # ----- ops ---------------------------------------------------------------------------------

    def _build(self, site: WeightSite, form: Quantized | Palettized | Sparse) -> Any:
        if isinstance(form, Quantized):
            return self._shift_scale(site, self._constant(site, form.data), form.decode)
        if isinstance(form, Palettized):
            return self._lut_to_dense(site, form)
        return self._sparse(site, form)

    def _constant(self, site: WeightSite, stored: Stored) -> Any:
        self._count += 1
        return resource_constant(stored, f"coreopt_{site.name}_{self._count}")

    @staticmethod
    def _zeros(name: str, shape: tuple[int, ...]) -> Any:
        """An inline splat zero (verifiers require a visible constant zero for FP8/FP4 offsets)."""
        from coreai._compiler import ir
        from coreai._compiler.dialects import coreai as dialect

        element_type = _element_type(name)
        tensor_type = ir.RankedTensorType.get(list(shape), element_type)
        zero = (
            ir.IntegerAttr.get(element_type, 0)
            if name.startswith(("si", "ui"))
            else ir.FloatAttr.get(element_type, 0.0)
        )
        return dialect.ConstantOp(value=ir.DenseElementsAttr.get_splat(tensor_type, zero)).result

    @staticmethod
    def _axis(axis: int) -> Any:
        from coreai._compiler import ir
        from coreai._compiler.dialects import coreai as dialect

        scalar = ir.RankedTensorType.get([], ir.IntegerType.get_signed(16))
        return dialect.ConstantOp(
            value=ir.DenseElementsAttr.get(np.array(axis, np.int16), type=scalar)
        ).result

    def _shift_scale(
        self, site: WeightSite, data: Any, decode: ShiftScale, data_element: str | None = None
    ) -> Any:
        """blockwise_shift_scale(data, scale, offset1, 0): offset1 a real constant only where some
        offset is nonzero (else a zero splat); the output takes the weight's dtype."""
        from coreai._compiler.dialects import coreai as dialect

        scale = self._constant(site, decode.scale)
        shape = decode.scale.shape
        offset = decode.offset
        if offset is not None and np.any(offset.values):
            offset1 = self._constant(site, offset)
        else:
            offset1 = self._zeros(data_element or self._element_of(data), shape)
        return dialect.BlockwiseShiftScaleOp(
            data, scale, offset1, self._zeros(site.element.name, shape)
        ).result

    @staticmethod
    def _element_of(value: Any) -> str:
        return str(value.type.element_type)

    def _lut_to_dense(self, site: WeightSite, form: Palettized) -> Any:
        from coreai._compiler.dialects import coreai as dialect

        indices = self._constant(site, form.indices)
        lut = self._constant(site, form.lut)
        out = dialect.LutToDenseOp(indices, lut, self._axis(form.axis)).result
        if form.decode is None:
            return out
        return self._shift_scale(site, out, form.decode, form.lut.element.name)

    def _mask(self, site: WeightSite, mask: np.ndarray) -> Any:
        return self._constant(site, Stored(mask.astype(np.uint8), element("ui1")))

    def _sparse(self, site: WeightSite, form: Sparse) -> Any:
        from coreai._compiler.dialects import coreai as dialect

        kept = form.kept
        if isinstance(kept, Palettized):
            indices = self._constant(site, kept.indices)
            sparse_indices = dialect.build_sparse_with_bitmask(indices, self._mask(site, form.mask))
            lut = self._constant(site, kept.lut)
            sparse = dialect.lut_to_sparse_with_bitmask(sparse_indices, lut, self._axis(kept.axis))
            dense = dialect.sparse_with_bitmask_to_dense(sparse)
        elif isinstance(
            kept, Quantized
        ):  # decoded before the scatter (a zero point must not fill pruned zeros)
            values = self._shift_scale(site, self._constant(site, kept.data), kept.decode)
            dense = dialect.sparse_with_bitmask_to_dense(
                dialect.build_sparse_with_bitmask(values, self._mask(site, form.mask))
            )
        else:
            values = self._constant(site, kept)
            dense = dialect.sparse_with_bitmask_to_dense(
                dialect.build_sparse_with_bitmask(values, self._mask(site, form.mask))
            )
        if form.decode is None:
            return dense
        return self._shift_scale(site, dense, form.decode)
