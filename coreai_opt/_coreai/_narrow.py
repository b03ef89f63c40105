"""Narrow look-up tables that repeat themselves: a `lut_to_dense` of 4-bit indices, all below 8,
into a table of 16 entries whose second half repeats the first reads only that first half - the same
weight from 3-bit indices and an 8-entry table.

coreai-torch packs no 3-bit indices, so a `.pt2` that carries 3-bit codes is converted with its
tables repeated to 16 entries (`coreai_opt.conversion`); this gives the converted program the
3-bit codes Core AI stores. The rewrite is exact for any program: every index it keeps picks the
entry it picked before.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from coreai_opt._elements import ELEMENTS, element

from ._ir import constant_array, element_bits, element_name, mlir_module, tensor_shape, walk_ops
from ._rewrite import resource_constant

_WIDE, _NARROW = 4, 3  # index bits: the converter's, and the codes they carry
NARROWED_ENTRIES = 2**_NARROW  # the tables a converter is handed repeated to 2**_WIDE entries


def narrow_repeated_luts(program: Any) -> int:
    """Rewrite every repeated 16-entry table read through 4-bit indices below 8 as 3-bit indices
    into its first 8 entries, in place; returns how many were rewritten."""
    module = mlir_module(program)
    found = [op for op in walk_ops(module) if op.name == "coreai.lut_to_dense"]
    count = 0
    for op in found:
        narrowed = _narrowed(op)
        if narrowed is None:
            continue
        indices, lut = narrowed
        count += 1
        _replace(module, op, indices, lut, count)
    if count:
        module.operation.verify()
    return count


def _narrowed(op: Any) -> tuple[Any, Any] | None:
    """(3-bit indices, 8-entry table) as `Stored` values where `op` reads a repeated table through
    indices below 8, else None."""
    import torch

    import tcast
    from coreai_opt.weights import Stored

    index_op, lut_op = (operand.owner for operand in list(op.operands)[:2])
    if (
        getattr(index_op, "name", None) != "coreai.constant"
        or getattr(lut_op, "name", None) != "coreai.constant"
    ):
        return None
    index_type, lut_type = index_op.result.type, lut_op.result.type
    lut_shape = tensor_shape(lut_type)
    if element_name(index_type) != f"ui{_WIDE}" or len(lut_shape) < 2 or lut_shape[-2] != 2**_WIDE:
        return None
    width = element_bits(lut_type)
    if width % 8 or element_name(lut_type) not in ELEMENTS:
        return None
    table = constant_array(lut_op).view(f"<u{width // 8}").reshape(lut_shape)
    half = NARROWED_ENTRIES
    if not np.array_equal(table[..., :half, :], table[..., half:, :]):
        return None
    shape = tensor_shape(index_type)
    codes = tcast.unpack_codes(torch.from_numpy(constant_array(index_op)), _WIDE, int(np.prod(shape)))
    if codes.numel() and int(codes.max()) >= half:
        return None
    indices = Stored(codes.numpy().reshape(shape), element(f"ui{_NARROW}"))
    lut = Stored(np.ascontiguousarray(table[..., :half, :]), ELEMENTS[element_name(lut_type)])
    return indices, lut


def _replace(module: Any, op: Any, indices: Any, lut: Any, count: int) -> None:
    """`op` read from the narrowed constants; the old constants go once nothing reads them."""
    from coreai._compiler import ir
    from coreai._compiler.dialects import coreai as dialect

    old = [operand.owner for operand in list(op.operands)[:2]]
    with module.context, op.location, ir.InsertionPoint(op):
        new = dialect.LutToDenseOp(
            resource_constant(indices, f"coreopt_lut{_NARROW}_indices_{count}"),
            resource_constant(lut, f"coreopt_lut{_NARROW}_lut_{count}"),
            list(op.operands)[2],
        ).result
    op.result.replace_all_uses_with(new)
    op.erase()
    for constant in old:
        if not list(constant.result.uses):
            constant.erase()
