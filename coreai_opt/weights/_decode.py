"""How a compressed weight decodes: one decoder for every pass, container and check.

The kernels are coreai-torch's decompression ops as they compute - `lut_to_dense`,
`constexpr_blockwise_shift_scale` (integer data minus its zero point times the scale, in the
scale's dtype; float and FP4 data times the scale in float32, then in the output dtype),
`sparse_to_dense` - written with broadcasting instead of expanding every LUT and scale to the
weight's size, so the same arithmetic in the same dtypes gives the same bits at a fraction of the
memory. `decode(encoding)` applies them to an `Encoding`'s stored arrays (`torch_values`: what a
container hands the ops), on any device; `_export.fold_decompression` applies them to a program's
buffers, and the Core AI runtime computes the same values (tests/test_compress_pt2.py).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from coreai_opt._elements import Element, packed_element

from ._forms import Encoding, Form, Palettized, Quantized, ShiftScale, Stored

if TYPE_CHECKING:
    import torch


def torch_values(stored: Stored) -> torch.Tensor:
    """`stored` as the tensor coreai-torch's ops take: own dtypes for 8/16/32-bit elements (FP8 and
    E8M0 by their bits), sub-byte integers one per byte (signed ones sign-extended), OCP FP4 codes
    two per byte along the last axis, masks as booleans. Where the stored array already holds
    those bytes the tensor shares its memory (read it, never write it): a 1.1B model's codes are
    0.7 GB that a tuning or a write would otherwise hold twice."""
    import torch

    element, values = stored.element, np.ascontiguousarray(stored.values)
    if element.name == "ui1":
        return _shared(values if values.dtype == np.bool_ else values.astype(bool))
    if element.codes_per_byte > 1:  # a last axis of whole bytes (see _refusal): none spans two rows
        import tcast

        packed = tcast.pack_codes(torch.from_numpy(values.astype(np.uint8)), element.bits)
        return packed.reshape(*values.shape[:-1], values.shape[-1] // element.codes_per_byte)
    if element.is_float:
        if element.bits == 8:  # FP8 and E8M0 by their bits
            return _shared(values.view(np.uint8)).view(element.torch_dtype())
        if element.name == "bf16":
            return _shared(values.view(np.int16)).view(torch.bfloat16)
        return _shared(values)
    if element.bits == 8:
        return _shared(values)
    if element.kind.name == "INT":  # two's complement codes of `bits` bits
        half = np.int8(1 << (element.bits - 1))
        signed = values.astype(np.int8)  # codes below 2**bits: no wrap; one copy, turned in place
        np.bitwise_xor(signed, half, out=signed)
        np.subtract(signed, half, out=signed)
        return torch.from_numpy(signed)
    return _shared(values if values.dtype == np.uint8 else values.astype(np.uint8))


def _shared(values: np.ndarray) -> torch.Tensor:
    """`values` as a tensor over the same memory; a copy where numpy forbids writes (torch cannot
    mark a tensor read-only, and warns)."""
    import torch

    return torch.from_numpy(values if values.flags.writeable else values.copy())


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
    table = lut.reshape(-1, vector)
    if rank == 0:
        return table[indices.long()].reshape(()) if vector == 1 else table[indices.long()]
    counts = tuple(int(n) for n in lut.shape[:rank])
    if table.requires_grad and torch.is_grad_enabled():  # a table tuned end to end
        rows = _table_gather().apply(table, indices, counts, entries)
    else:
        rows = _gathered(table, indices, counts, entries)
    if vector == 1:
        return rows.reshape(indices.shape)
    axis = axis % rank
    shape = list(indices.shape)
    shape[axis] *= vector
    return rows.movedim(-1, axis + 1).reshape(shape)


def _table_rows(
    indices: torch.Tensor, counts: tuple[int, ...], entries: int
) -> Iterator[tuple[int, int, torch.Tensor]]:
    """(top, bottom, the row of the flattened tables each element of indices[top:bottom] reads), a
    piece of the first axis at a time: each element's int64 row (8 bytes an element, 0.5 GB at a
    1B model's head) exists only for its piece."""
    import torch

    from coreai_opt._pieces import spans

    rank = indices.dim()
    for top, bottom in spans(indices.shape[0], indices[:1].numel()):
        # dimensioned, so that adding uint8 indices promotes to int64
        flat = torch.zeros((1,) * rank, dtype=torch.int64, device=indices.device)
        for k, (size, count) in enumerate(zip(indices.shape, counts, strict=True)):
            if count > 1:
                along = torch.arange(top if k == 0 else 0, bottom if k == 0 else size, device=indices.device)
                block = along // (size // count)
                flat = flat * count + block.reshape([len(along) if i == k else 1 for i in range(rank)])
        yield top, bottom, (flat * entries).add(indices[top:bottom])  # int64, without a widened copy first


def _gathered(
    table: torch.Tensor, indices: torch.Tensor, counts: tuple[int, ...], entries: int
) -> torch.Tensor:
    """Each index's table row, [*indices.shape, vector]."""
    import torch

    rows = torch.empty((*indices.shape, table.shape[-1]), dtype=table.dtype, device=indices.device)
    for top, bottom, positions in _table_rows(indices, counts, entries):
        torch.index_select(table, 0, positions.reshape(-1), out=rows[top:bottom].view(-1, rows.shape[-1]))
    return rows


@functools.cache
def _table_gather() -> Any:
    """`_gathered` as an autograd function whose backward adds each element's gradient to its
    table row (`index_add_`, a piece at a time): autograd's own - the pieces' copies and an
    accumulating `index_put_` - took most of a tuning step's fold at SmolLM2-135M."""
    import torch

    class TableGather(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, table: torch.Tensor, indices: torch.Tensor, counts: tuple[int, ...],
                    entries: int) -> torch.Tensor:  # fmt: skip
            ctx.save_for_backward(indices)
            ctx.table_shape, ctx.counts, ctx.entries = table.shape, counts, entries
            return _gathered(table, indices, counts, entries)

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
            (indices,) = ctx.saved_tensors
            wide = torch.float32 if grad.dtype in (torch.float16, torch.bfloat16) else grad.dtype
            summed = torch.zeros(ctx.table_shape, dtype=wide, device=grad.device)
            for top, bottom, positions in _table_rows(indices, ctx.counts, ctx.entries):
                _add_rows(summed, positions.reshape(-1), grad[top:bottom].reshape(-1, summed.shape[-1]))
            return summed.to(grad.dtype), None, None, None

    return TableGather


def _add_rows(summed: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor) -> None:
    """summed[positions] += rows, repeats added up - in float32 at least (a 16-bit sum loses
    small gradients among millions of adds); on a GPU by an accumulating index_put_, which sorts
    first: index_add_ adds there by atomics, in an order that differs run to run."""
    rows = rows.to(summed.dtype)
    if summed.is_cuda:
        summed.index_put_((positions,), rows, accumulate=True)
    else:
        summed.index_add_(0, positions, rows)


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
    packed = packed_element(data.dtype, scale.dtype)
    if packed is not None or data.is_floating_point():
        values = unpacked(data, packed) if packed is not None else _float32(data)
        # contiguous, and never the caller's tensor: it is scaled in place
        values = (
            values.contiguous() if values is not data else data.clone(memory_format=torch.contiguous_format)
        )
        _blocks(values, tuple(scale.shape)).mul_(_per_block(scale.to(torch.float32)))
        return values.to(output_dtype if output_dtype is not None else scale.dtype)
    # the output is the one tensor of the weight's size made: the zero point and the scale are
    # applied to it in place (temporaries of every weight's size left holes in the heap that
    # held 1 GiB more than the weights after a 1B model's weights were decoded)
    dtype = scale.dtype if zero_point is None else torch.promote_types(scale.dtype, zero_point.dtype)
    out = data.to(dtype, memory_format=torch.contiguous_format, copy=True)
    blocks = _blocks(out, tuple(scale.shape))
    if zero_point is not None:
        blocks.sub_(_per_block(zero_point))
    blocks.mul_(_per_block(scale))
    return out


def _float32(data: torch.Tensor) -> torch.Tensor:
    """Float data as float32 (8-bit floats through tcast's decode: torch converts FP8 ~10x slower)."""
    import torch

    import tcast
    from coreai_opt._elements import of_torch

    element = of_torch(data.dtype)
    if element.bits != 8:
        return data.to(torch.float32)
    return tcast.decode(data.view(torch.uint8), tcast.number(element.tcast), torch.float32)


def unpacked(packed: torch.Tensor, element: Element) -> torch.Tensor:
    """Codes packed `element.codes_per_byte` to a byte (low bits first) along the last axis, as
    float32 values of `element`."""
    import torch

    import tcast

    per = element.codes_per_byte
    shape = (*packed.shape[:-1], per * packed.shape[-1])
    codes = tcast.unpack_codes(packed.contiguous(), element.bits, per * packed.numel()).reshape(shape)
    return tcast.decode(codes, tcast.number(element.tcast), torch.float32)


def sparse_to_dense(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    import torch

    dense = torch.zeros(mask.shape, dtype=values.dtype, device=values.device)
    # in the mask's order, as indexing by it places them, without its int64 index of every kept
    # element (16 bytes each: 0.5 GB for an output head's half); as bits, which every dtype has
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[values.element_size()]
    dense.view(bits).masked_scatter_(mask.bool(), values.contiguous().reshape(-1).view(bits))
    return dense


def _shift_scale_of(
    data: torch.Tensor, decode: ShiftScale, data_element: Any, weight_dtype: Any
) -> torch.Tensor:
    """`decode` applied to `data` as the container writes the call: integer data takes the zero
    point, float data an output dtype where its scales are E8M0."""
    scale = torch_values(decode.scale).to(data.device)
    zero_point = None
    if decode.offset is not None and np.any(decode.offset.values):
        zero_point = torch_values(decode.offset).to(data.device)
    output_dtype = None
    if data_element.is_float and decode.scale.element.name == "f8E8M0FNU":
        if weight_dtype is None:
            raise ValueError("E8M0 scales leave the decoded dtype open: give decode() the weight's dtype")
        output_dtype = weight_dtype
    return shift_scale(data, scale, zero_point, None, None, output_dtype)


def _data(stored: Stored, device: Any) -> torch.Tensor:
    """Quantized data as the decompression op reads it; FP4 codes as their float32 values (what the
    op unpacks its pairs to), so no packing constraint of a container applies."""
    if stored.element.codes_per_byte > 1:
        import torch

        import tcast

        codes = torch.from_numpy(stored.values.astype(np.int64)).to(device)
        return tcast.decode(codes, tcast.number(stored.element.tcast), torch.float32)
    return torch_values(stored).to(device)


def _dense(form: Form, weight_dtype: Any, device: Any) -> torch.Tensor:
    if isinstance(form, Quantized):
        return _shift_scale_of(_data(form.data, device), form.decode, form.data.element, weight_dtype)
    if isinstance(form, Palettized):
        indices = torch_values(form.indices).to(device)
        lut_values = form.lut.values
        if indices.dim() + 2 != lut_values.ndim:  # a LUT over the kept values of a sparse weight
            lut_values = lut_values.reshape((1,) * indices.dim() + lut_values.shape[-2:])
        lut = torch_values(Stored(lut_values, form.lut.element)).to(device)
        dense = lut_to_dense(indices, lut, form.axis if indices.dim() > 1 else 0)
        if form.decode is None:
            return dense
        return _shift_scale_of(dense, form.decode, form.lut.element, weight_dtype)
    kept = form.kept
    if isinstance(kept, (Palettized, Quantized)):  # decoded before the scatter: zeros stay zeros
        values = _dense(kept, weight_dtype, device)
        element = kept.lut.element if isinstance(kept, Palettized) else None
    else:
        values = torch_values(kept).to(device)
        element = kept.element
    mask = torch_values(Stored(form.mask, _mask_element())).to(device)
    dense = sparse_to_dense(values, mask)
    if form.decode is None:
        return dense
    return _shift_scale_of(
        dense, form.decode, element if element is not None else _float_element(dense), weight_dtype
    )


def _mask_element() -> Any:
    from coreai_opt._elements import ELEMENTS

    return ELEMENTS["ui1"]


def _float_element(tensor: torch.Tensor) -> Any:
    from coreai_opt._elements import of_torch

    return of_torch(tensor.dtype)


def _rows(stored: Stored, rows: int, start: int, stop: int) -> Stored | None:
    """Rows start:stop of an array over the weight's first axis: itself where it is shared by all
    rows (a first axis of 1), its own rows where it has one per row; None otherwise."""
    count = stored.values.shape[0] if stored.values.ndim else 1
    if count == 1:
        return stored
    return Stored(stored.values[start:stop], stored.element) if count == rows else None


def row_slice(form: Form, start: int, stop: int) -> Quantized | None:
    """Rows start:stop of a quantized weight (of rank 2 or more) as a form of their own, which
    decodes to exactly those rows of the weight; None where a stored array does not split there
    (scales over blocks of rows, other forms)."""
    if not isinstance(form, Quantized) or form.data.values.ndim < 2:
        return None
    rows = form.data.values.shape[0]
    scale = _rows(form.decode.scale, rows, start, stop)
    offset = None if form.decode.offset is None else _rows(form.decode.offset, rows, start, stop)
    if scale is None or (form.decode.offset is not None and offset is None):
        return None
    return Quantized(Stored(form.data.values[start:stop], form.data.element), ShiftScale(scale, offset))


def decode(encoding: Encoding | Form, dtype: Any = None, device: Any = None) -> torch.Tensor:
    """The weight an encoding stands for, as coreai-torch's ops (and the Core AI runtime) compute
    it, in the weight's dtype, on `device` (the CPU by default). An `Encoding` knows its weight's
    dtype; a bare form takes it as `dtype` (it matters under E8M0 scales, which leave it open)."""
    import torch

    form = encoding.form if isinstance(encoding, Encoding) else encoding
    if dtype is None and isinstance(encoding, Encoding):
        dtype = encoding.element.torch_dtype()
    device = torch.device("cpu") if device is None else torch.device(device)
    with torch.no_grad():
        dense = _dense(form, dtype, device)
    return dense if dtype is None else dense.to(dtype)
