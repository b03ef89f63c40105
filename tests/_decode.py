"""An independent reading of compressed Core AI weights, for references in tests.

It decodes stored constants from their raw bytes with numpy and ml_dtypes only (its own
bit unpacking, its own E8M0 rule), computes `scale * (data - offset1) + offset2` in float64,
and can rewrite a program so every `blockwise_shift_scale` over constants becomes the dense
constant it stands for. Running that program and the compressed one on the runtime compares
the runtime's decompression with this reading.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from coreai_opt import _coreai

_MINIFLOATS = {
    "f8E4M3FN": ml_dtypes.float8_e4m3fn,
    "f8E5M2": ml_dtypes.float8_e5m2,
    "f4E2M1FN": ml_dtypes.float4_e2m1fn,
}
_FLOATS = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}


def _unpack(raw: np.ndarray, bits: int, count: int) -> np.ndarray:
    """Little-endian sub-byte codes, low bits first, as unsigned integers."""
    flat = np.unpackbits(raw, bitorder="little")[: count * bits].reshape(count, bits).astype(np.int64)
    return (flat << np.arange(bits)).sum(axis=1)


def decode_constant(op: Any) -> np.ndarray:
    """A constant's values in float64 (integers exact)."""
    t = op.result.type
    element, shape = _coreai.element_name(t), _coreai.tensor_shape(t)
    count = int(np.prod(shape)) if shape else 1
    raw = np.frombuffer(_coreai.constant_bytes(op), dtype=np.uint8)
    if element in _FLOATS:
        values = raw.view(_FLOATS[element]).astype(np.float64)
    elif element == "f8E8M0FNU":
        values = np.where(raw == 255, np.nan, np.ldexp(1.0, raw.astype(np.int64) - 127))
    elif element in _MINIFLOATS:
        codes = _unpack(raw, 4, count) if element == "f4E2M1FN" else raw.astype(np.int64)
        values = codes.astype(np.uint8).view(_MINIFLOATS[element]).astype(np.float64)
    elif element[:2] in ("si", "ui"):
        bits = int(element[2:])
        codes = _unpack(raw, bits, count) if bits < 8 else raw.astype(np.int64)
        if element.startswith("si"):
            codes = np.where(codes >= 2 ** (bits - 1), codes - 2**bits, codes)
        values = codes.astype(np.float64)
    else:
        raise AssertionError(f"no decoder for {element}")
    return values[:count].reshape(shape)


def _blockwise(param: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    out = param.reshape((1,) * (len(shape) - param.ndim) + param.shape)
    for axis, (size, blocks) in enumerate(zip(shape, out.shape, strict=True)):
        out = np.repeat(out, size // blocks, axis=axis)
    return out


def decode_blockwise(op: Any) -> np.ndarray:
    """scale * (data - offset1) + offset2 in float64 for a blockwise_shift_scale over constants."""
    data, scale, offset1, offset2 = (decode_constant(v.owner) for v in op.operands)
    shape = data.shape
    return _blockwise(scale, shape) * (data - _blockwise(offset1, shape)) + _blockwise(offset2, shape)


def densify(program: Any) -> int:
    """Replace every blockwise_shift_scale over constants by its dense value; returns how many."""
    from coreai._compiler import ir
    from coreai._compiler.dialects import coreai as dialect

    module = _coreai.mlir_module(program)
    ops = [
        op
        for op in _coreai.walk_ops(module)
        if op.name == "coreai.blockwise_shift_scale"
        and all(v.owner.name == "coreai.constant" for v in op.operands)
    ]
    for op in ops:
        dense = decode_blockwise(op)
        out_type = op.result.type
        values = dense.astype(_FLOATS[_coreai.element_name(out_type)])
        with module.context, op.location, ir.InsertionPoint(op):
            attr = ir.DenseElementsAttr.get(np.ascontiguousarray(values), type=out_type)
            new = dialect.ConstantOp(value=attr).result
        op.result.replace_all_uses_with(new)
        op.erase()
    module.operation.verify()
    return len(ops)
