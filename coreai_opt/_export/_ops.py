"""coreai-torch's decompression ops: registering them, recognising them, and decoding them fast.

coreai-torch defines the ops (`torch.library.custom_op`) when its compression module is
imported; a `.pt2` that calls them cannot be loaded or run before that. Their eager kernels
expand every LUT and scale to the weight's full size (a 4-bit LUT costs 16 values per weight),
which takes many gigabytes on a large model, so `fold_decompression` decodes each weight once
with broadcasting instead - the same arithmetic in the same dtypes, so the same bits.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch.fx import Node

LUT_TO_DENSE = "coreai::lut_to_dense"
SHIFT_SCALE = "coreai::constexpr_blockwise_shift_scale"
SPARSE_TO_DENSE = "coreai::sparse_to_dense"
COREAI_OPS = frozenset({LUT_TO_DENSE, SHIFT_SCALE, SPARSE_TO_DENSE})


def register_coreai_ops() -> Any:
    """Define coreai-torch's custom ops in this process (idempotent); returns `torch.ops.coreai`."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # coreai-torch warns about the torch version on import
        import coreai_torch._compression.custom_layers  # noqa: F401  (defines the ops)
    return torch.ops.coreai


def coreai_decompositions() -> dict[Any, Any]:
    """coreai-torch's decomposition table (what `.pt2` programs for conversion are exported with)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the torch version warning on import
        import coreai_torch
    return coreai_torch.get_decomp_table()


def op_name(node: Node) -> str | None:
    """`coreai::lut_to_dense` etc. for a call of a coreai op, else None."""
    if node.op != "call_function":
        return None
    name = getattr(node.target, "name", None)
    text = name() if callable(name) else None
    return text if isinstance(text, str) and text in COREAI_OPS else None


def is_decompression(node: Node) -> bool:
    return op_name(node) is not None


def _blocks(t: torch.Tensor, blocks: tuple[int, ...]) -> torch.Tensor:
    """`t` [d0, d1, ...] viewed as [b0, d0/b0, b1, d1/b1, ...] (per-block parameters broadcast)."""
    shape: list[int] = []
    for size, count in zip(t.shape, blocks, strict=True):
        shape += [count, size // count]
    return t.reshape(shape)


def _per_block(param: torch.Tensor) -> torch.Tensor:
    """A block-wise parameter [b0, b1, ...] as [b0, 1, b1, 1, ...], to broadcast against `_blocks`."""
    shape: list[int] = []
    for count in param.shape:
        shape += [count, 1]
    return param.reshape(shape)


def lut_to_dense(indices: torch.Tensor, lut: torch.Tensor, axis: int) -> torch.Tensor:
    import torch

    rank = indices.dim()
    entries, vector = lut.shape[-2], lut.shape[-1]
    flat = torch.zeros((), dtype=torch.int64)
    for k, (size, count) in enumerate(zip(indices.shape, lut.shape[:rank], strict=True)):
        if count > 1:
            block = torch.arange(size) // (size // count)
            flat = flat * count + block.reshape([size if i == k else 1 for i in range(rank)])
    rows = lut.reshape(-1, vector)[flat * entries + indices.long()]  # [*indices.shape, vector]
    if vector == 1:
        return rows.reshape(indices.shape)
    axis = axis % rank
    shape = list(indices.shape)
    shape[axis] *= vector
    return rows.movedim(-1, axis + 1).reshape(shape)


def shift_scale(
    data: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor | None = None,
    minval: torch.Tensor | None = None,
    input_dtype: torch.dtype | None = None,
    output_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    import torch

    if minval is not None:
        raise ValueError("minval offsets are not written by coreopt")
    fp4 = is_packed_fp4(data, scale)
    if fp4 or data.is_floating_point():
        if fp4:
            data = unpack_fp4(data)
        blocks = _blocks(data.to(torch.float32), tuple(scale.shape))
        out = (blocks * _per_block(scale.to(torch.float32))).reshape(data.shape)
        return out.to(output_dtype if output_dtype is not None else scale.dtype)
    blocks = _blocks(data.to(scale.dtype), tuple(scale.shape))
    if zero_point is not None:
        blocks = blocks - _per_block(zero_point)
    return (blocks * _per_block(scale)).reshape(data.shape)


def is_packed_fp4(data: Any, scale: Any) -> bool:
    """coreai-torch's sign of FP4 data (tensors or fake tensors): uint8 pairs under E8M0 scales."""
    from coreai_opt._elements import of_torch

    return str(data.dtype) == "torch.uint8" and of_torch(scale.dtype).name == "f8E8M0FNU"


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """uint8 pairs of OCP FP4 codes (low nibble first) along the last axis, as float32 values."""
    import torch

    import tcast

    shape = (*packed.shape[:-1], 2 * packed.shape[-1])
    codes = tcast.unpack_codes(packed.contiguous(), 4, 2 * packed.numel()).reshape(shape)
    return tcast.decode(codes, tcast.number("e2m1ocp"), torch.float32)


def sparse_to_dense(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    import torch

    keep = mask.bool()
    dense = torch.zeros(mask.shape, dtype=values.dtype)
    dense[keep] = values
    return dense


_DECODERS = {LUT_TO_DENSE: lut_to_dense, SHIFT_SCALE: shift_scale, SPARSE_TO_DENSE: sparse_to_dense}


def fold_decompression(module: torch.fx.GraphModule) -> int:
    """Replace every decompression tree over attributes by the weight it decodes to (in place) and
    drop the attributes only those trees read; returns how many weights were folded. For
    `ep.module()`, before running it."""
    import torch

    graph = module.graph
    before = {str(n.target) for n in graph.nodes if n.op == "get_attr"}
    values: dict[Node, torch.Tensor] = {}
    folded = 0
    for node in list(graph.nodes):
        if node.op == "get_attr":
            value = _attribute(module, str(node.target))
            if isinstance(value, torch.Tensor):
                values[node] = value
            continue
        name = op_name(node)
        if name is None:
            continue
        args = [values.get(a, a) if isinstance(a, torch.fx.Node) else a for a in node.args]
        kwargs = {k: values.get(v, v) if isinstance(v, torch.fx.Node) else v for k, v in node.kwargs.items()}
        if any(isinstance(a, torch.fx.Node) for a in (*args, *kwargs.values())):
            continue  # reads a runtime value: leave it to the op
        values[node] = _DECODERS[name](*args, **kwargs)
        if all(op_name(user) is not None for user in node.users):
            continue  # an inner step of a tree: only its root becomes an attribute
        attribute = f"_coreopt_dense_{folded}"
        module.register_buffer(attribute, values[node])
        with graph.inserting_before(node):
            replacement = graph.get_attr(attribute)
        replacement.meta = dict(node.meta)
        node.replace_all_uses_with(replacement)
        folded += 1
    graph.eliminate_dead_code()
    after = {str(n.target) for n in graph.nodes if n.op == "get_attr"}
    for target in sorted(before - after):
        *path, last = target.split(".")
        delattr(_attribute(module, ".".join(path)) if path else module, last)
    module.recompile()
    return folded


def _attribute(module: torch.nn.Module, target: str) -> Any:
    value: Any = module
    for part in target.split("."):
        value = getattr(value, part)
    return value
