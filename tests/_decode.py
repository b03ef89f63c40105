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


def decode_lut(op: Any) -> np.ndarray:
    """lut_to_dense as its documentation defines it: block-wise LUTs, vectors inserted along `axis`."""
    indices = decode_constant(op.operands[0].owner).astype(np.int64)
    lut = decode_value(op.operands[1])
    axis = int(decode_constant(op.operands[2].owner))
    rank = indices.ndim
    entries, vector = lut.shape[-2], lut.shape[-1]
    block = [a // b for a, b in zip(indices.shape, lut.shape[:rank], strict=True)]
    grids = np.meshgrid(
        *[np.arange(n) // blk for n, blk in zip(indices.shape, block, strict=True)], indexing="ij"
    )
    assert entries == lut.shape[-2]
    picked = lut[(*grids, indices)]  # indices.shape + (V,)
    out = np.moveaxis(picked, -1, axis + 1)  # the V entries follow their position along `axis`
    shape = list(indices.shape)
    shape[axis] *= vector
    return out.reshape(shape)


def decode_blockwise(op: Any) -> np.ndarray:
    """scale * (data - offset1) + offset2 in float64 for a blockwise_shift_scale."""
    data, scale, offset1, offset2 = (decode_value(v) for v in op.operands)
    shape = data.shape
    return _blockwise(scale, shape) * (data - _blockwise(offset1, shape)) + _blockwise(offset2, shape)


def decode_sparse(value: Any) -> tuple[np.ndarray, np.ndarray]:
    """A bitmask-sparse value as (its nnz values in row-major order, the bool mask)."""
    owner = value.owner
    if owner.name == "coreai.build_sparse_with_bitmask":
        values = decode_value(owner.operands[0])
        mask = decode_constant(owner.operands[1].owner).astype(bool)
        assert values.shape == (int(mask.sum()),), (values.shape, int(mask.sum()))
        return values, mask
    if owner.name == "coreai.lut_to_sparse_with_bitmask":
        indices, mask = decode_sparse(owner.operands[0])
        lut = decode_value(owner.operands[1])
        assert lut.shape[-1] == 1, "vector LUTs on sparse indices are not decoded here"
        rank = mask.ndim
        block = [n // b for n, b in zip(mask.shape, lut.shape[:rank], strict=True)]
        positions = np.nonzero(mask)  # row-major, the order of the stored values
        tables = tuple(p // blk for p, blk in zip(positions, block, strict=True))
        return lut[(*tables, indices.astype(np.int64), 0)], mask
    raise AssertionError(f"cannot decode {owner.name} as sparse")


def decode_value(value: Any) -> np.ndarray:
    owner = value.owner
    if owner.name == "coreai.constant":
        return decode_constant(owner)
    if owner.name == "coreai.lut_to_dense":
        return decode_lut(owner)
    if owner.name == "coreai.blockwise_shift_scale":
        return decode_blockwise(owner)
    if owner.name == "coreai.sparse_with_bitmask_to_dense":
        values, mask = decode_sparse(owner.operands[0])
        dense = np.zeros(mask.shape)
        dense[mask] = values
        return dense
    raise AssertionError(f"cannot decode {owner.name}")


def densify(program: Any) -> int:
    """Replace every decompressed weight (blockwise_shift_scale / lut_to_dense / sparse bitmask trees
    over constants) by its dense value; returns how many."""
    from coreai._compiler import ir
    from coreai._compiler.dialects import coreai as dialect

    module = _coreai.mlir_module(program)
    decompress = (
        "coreai.blockwise_shift_scale",
        "coreai.lut_to_dense",
        "coreai.build_sparse_with_bitmask",
        "coreai.lut_to_sparse_with_bitmask",
        "coreai.sparse_with_bitmask_to_dense",
    )
    ops = [  # outermost decompression ops: their result feeds a compute op
        op
        for op in _coreai.walk_ops(module)
        if op.name in decompress and any(use.owner.name not in decompress for use in op.result.uses)
    ]
    for op in ops:
        dense = decode_value(op.result)
        out_type = op.result.type
        values = dense.astype(_FLOATS[_coreai.element_name(out_type)])
        with module.context, op.location, ir.InsertionPoint(op):
            attr = ir.DenseElementsAttr.get(np.ascontiguousarray(values), type=out_type)
            new = dialect.ConstantOp(value=attr).result
        op.result.replace_all_uses_with(new)
        op.erase()
    module.operation.verify()
    return len(ops)


def assert_runtime_matches_decoding(path: Any, weights: int, scratch: Any) -> None:
    """Run a compressed asset and its numpy-densified copy on the runtime: the same outputs."""
    from conftest import run_aimodel, sample_inputs

    from coreai_opt.io import load_aimodel, save_aimodel

    dense = load_aimodel(path)
    assert densify(dense) == weights
    dense_path = save_aimodel(dense, scratch / "dense.aimodel")
    inputs = sample_inputs(path)
    got, want = run_aimodel(path, inputs), run_aimodel(dense_path, inputs)
    for name in got:
        assert np.isfinite(got[name]).all()
        scale = max(1.0, float(np.abs(want[name]).max()))
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5 * scale)
