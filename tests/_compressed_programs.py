"""Hand-authored Core AI programs carrying compressed weights, for tests only.

Built with coreai-core's authoring API, packed by hand the way the runtime reads sub-byte
data (little-endian, low bits first), so the tests know every byte and the dense weights.
"""

from dataclasses import dataclass, field
from typing import Annotated, Any

import numpy as np

IN, OUT, BATCH = 32, 16, 2


def pack_low_first(codes: np.ndarray, bits: int) -> np.ndarray:
    """Pack unsigned codes of `bits` bits each into bytes, low bits first."""
    flat = codes.reshape(-1).astype(np.uint64)
    bitstream = ((flat[:, None] >> np.arange(bits, dtype=np.uint64)) & 1).astype(np.uint8).reshape(-1)
    pad = (-bitstream.size) % 8
    bitstream = np.concatenate([bitstream, np.zeros(pad, np.uint8)])
    return np.packbits(bitstream.reshape(-1, 8), axis=1, bitorder="little").reshape(-1)


@dataclass
class CompressedProgram:
    program: Any
    dense: dict[str, np.ndarray]  # the dense fp32 weights the runtime should reconstruct
    keepalive: list[np.ndarray] = field(default_factory=list)

    def reference(self, x: np.ndarray) -> np.ndarray:
        return sum(x.astype(np.float32) @ w for w in self.dense.values())


def build_compressed_program(seed: int = 0) -> CompressedProgram:
    """y = x @ W_lut + x @ W_int8 + x @ W_sparse, with x [2, 32] f16 and every W [32, 16]."""
    import coreai.authoring as au
    from coreai._compiler import ir
    from coreai._compiler.dialects import coreai as dialect
    from coreai.authoring import AIProgram, Module, TensorType, Value, graph

    # The graph body's annotations are evaluated eagerly (no `from __future__ import annotations`
    # in this file), because coreai reads them with the local names in scope.
    rng = np.random.default_rng(seed)
    keepalive: list[np.ndarray] = []

    def packed(codes: np.ndarray, element: Any, name: str) -> Value:
        data = pack_low_first(codes, element.width)
        keepalive.append(data)
        tensor_type = ir.RankedTensorType.get(list(codes.shape), element)
        attr = ir.DenseResourceElementsAttr.get_from_buffer(memoryview(data), name, tensor_type)
        return Value._from_mlir(dialect.ConstantOp(value=attr).result)

    lut_codes = rng.integers(0, 16, size=(IN, OUT)).astype(np.uint8)
    lut = np.linspace(-1, 1, 16, dtype=np.float16).reshape(1, 1, 16, 1)
    q_data = rng.integers(-127, 128, size=(IN, OUT)).astype(np.int8)
    q_scale = (rng.uniform(0.001, 0.01, size=(1, OUT))).astype(np.float16)
    mask = rng.random((IN, OUT)) < 0.5
    values = rng.standard_normal(int(mask.sum())).astype(np.float16)

    dense = {
        "lut": lut.reshape(-1)[lut_codes].astype(np.float32),
        "int8": q_data.astype(np.float32) * q_scale.astype(np.float32),
        "sparse": np.zeros((IN, OUT), np.float32),
    }
    dense["sparse"][mask] = values.astype(np.float32)

    module = Module.create()
    with module:

        @graph
        def main(
            x: Annotated[Value, TensorType((BATCH, IN), np.float16)],
        ) -> Annotated[Value, TensorType((BATCH, OUT), np.float16, name="y")]:
            w_lut = au.lut_to_dense(
                packed(lut_codes, ir.IntegerType.get_unsigned(4), "lut_indices"), lut, np.array(0, np.int16)
            )
            w_int8 = au.blockwise_shift_scale(
                q_data, q_scale, np.zeros((1, OUT), np.int8), np.zeros((1, OUT), np.float16)
            )
            sparse = au.build_sparse_with_bitmask(
                au.constant.constant(values),
                packed(mask.astype(np.uint8), ir.IntegerType.get_unsigned(1), "bitmask"),
            )
            w_sparse = au.sparse_with_bitmask_to_dense(sparse)
            y = au.broadcasting_batch_matmul(x, w_lut)
            y = au.broadcasting_add(y, au.broadcasting_batch_matmul(x, w_int8))
            return au.broadcasting_add(y, au.broadcasting_batch_matmul(x, w_sparse))

    return CompressedProgram(AIProgram(module), dense, keepalive)
