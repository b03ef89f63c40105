"""The weights of a `torch.export` program as a compression container.

`ExportWeights` lists the program's float parameters, buffers and constants with how each is used
(the same `Use`s the Core AI container reports, so the compression package chooses the same
weights with the same axes), reads a weight, and writes an encoded weight as buffers plus calls of
coreai-torch's decompression ops in its place. Sub-byte codes are stored one per byte (the ops take
them so; coreai-torch packs them on conversion), FP4 codes two per byte along the last axis (low
nibble first), masks as booleans.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from coreai_opt._custom_ops import register_coreai_ops
from coreai_opt._elements import ELEMENTS, Element, of_torch
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
    torch_values,
)

from ._edit import ProgramEdit
from ._ops import is_decompression

if TYPE_CHECKING:
    import torch
    from torch.export import ExportedProgram
    from torch.fx import Node


def _op_text(node: Node) -> str:
    name = getattr(node.target, "name", None)
    if callable(name):
        return str(name()).replace("::", ".")
    return str(node.target) if node.op == "call_function" else node.op


def uses(node: Node) -> tuple[Use, ...]:
    """How each op that reads `node` reads it (looking through one transposing view)."""
    from coreai_opt._aten import WEIGHT_OPS, packet, permutation

    rank = len(node.meta["val"].shape)
    found = []
    for user in node.users:
        perm = permutation(user, rank) if user.args and user.args[0] is node else None
        readers = [(u, perm) for u in user.users] if perm is not None else [(user, None)]
        if perm is not None and not user.users:
            found.append(Use(Consumer.OTHER, _op_text(user)))
        source = user if perm is not None else node
        for reader, order in readers:
            op = WEIGHT_OPS.get(packet(reader)) if reader.op == "call_function" else None
            at = op is not None and len(reader.args) > op.weight and reader.args[op.weight] is source
            found.append(Use(op.consumer if at else Consumer.OTHER, _op_text(reader), order))  # type: ignore[union-attr]
    return tuple(found)


@dataclass(frozen=True)
class _Slot:
    spec: Any  # the InputSpec
    node: Node
    in_state_dict: bool


def _bits_tensor(bits: int) -> torch.Tensor:
    import torch

    return torch.tensor(bits, dtype=torch.int64)


class ExportWeights:
    """A `torch.export` program's weights, compressed in place (a `weights.Container`)."""

    def __init__(self, ep: ExportedProgram) -> None:
        self.ep = ep
        # placeholder names go on from an earlier compression's (FX does not rename a clash here)
        taken = [n.name.split("_")[1] for n in ep.graph.nodes if n.name.startswith("coreopt_w")]
        self._count = max((int(t[1:]) for t in taken if t[1:].isdigit()), default=0)
        self._prefixes: dict[str, str] = {}  # weight -> the module path of its buffers
        self._ties: dict[str, list[_Slot]] = {}  # weight -> unused placeholders of the same tensor
        self._edit = ProgramEdit(ep)

    @functools.cached_property
    def ops(self) -> Any:
        """coreai-torch's ops, defined when the first compressed weight is written (reading a float
        program's weights, as trials do, needs no coreai-torch)."""
        return register_coreai_ops()

    # ----- the Container protocol --------------------------------------------------------------

    def candidates(self) -> list[Candidate]:
        from torch.export.graph_signature import InputKind

        nodes = {n.name: n for n in self.ep.graph.nodes if n.op == "placeholder"}
        found = []
        for spec in self.ep.graph_signature.input_specs:
            if spec.kind not in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
                continue
            node = nodes.get(spec.arg.name)
            tensor = self._tensor(spec)
            if node is None or tensor is None or not tensor.is_floating_point():
                continue
            try:
                element = of_torch(tensor.dtype)
            except ValueError:
                continue
            if element.bits not in (16, 32):
                continue
            slot = _Slot(spec, node, spec.target in self.ep.state_dict)
            found.append(Candidate(slot, spec.target, tuple(tensor.shape), element, uses(node)))
        return self._tie(found)

    def _tie(self, found: list[Candidate]) -> list[Candidate]:
        """Mark the placeholders torch.export leaves unused for a tied tensor (an embedding that is
        also the lm_head: the graph reads it through one name) as tied to the one it reads; writing
        that one drops them too, so the file holds the tensor once, compressed."""
        import torch

        used = [c for c in found if c.uses]
        marked = []
        for candidate in found:
            if not candidate.uses:
                tensor = self._tensor(candidate.handle.spec)
                twin = next(
                    (
                        u for u in used
                        if u.shape == candidate.shape and u.element == candidate.element
                        and torch.equal(self._tensor(u.handle.spec), tensor)  # type: ignore[arg-type]
                    ),
                    None,
                )  # fmt: skip
                if twin is not None:
                    self._ties.setdefault(twin.name, []).append(candidate.handle)
                    candidate = replace(candidate, tied_to=twin.name)
            marked.append(candidate)
        return marked

    def compressed(self) -> int:
        def root(node: Node) -> bool:
            return is_decompression(node) and any(not is_decompression(u) for u in node.users)

        return sum(root(node) for node in self.ep.graph.nodes)

    def read(self, site: WeightSite) -> torch.Tensor:
        tensor = self._tensor(site.handle.spec)
        assert tensor is not None
        return tensor.detach()

    def refusal(self, site: WeightSite, encoding: Encoding) -> str | None:
        """Why coreai-torch's ops cannot carry this encoding of this weight, or None."""
        return _refusal(encoding.form, site)

    def write(self, site: WeightSite, encoding: Encoding) -> Written:
        from ._describe import stored_form

        self._count += 1
        slot: _Slot = site.handle
        graph = self.ep.graph
        first_op = next(n for n in graph.nodes if n.op != "placeholder")
        with graph.inserting_before(first_op):
            value = self._build(site, encoding.form)
        slot.node.replace_all_uses_with(value)
        self._drop(slot)
        for tied in self._ties.pop(site.name, []):
            self._drop(tied)
        stored = stored_form(self.ep, value)  # as inspect reads it back: encoding, packed bytes
        before = math.prod(site.shape) * site.element.bits // 8
        return Written(stored.encoding, before, stored.nbytes)

    def finish(self) -> None:
        self.ep.graph.eliminate_dead_code()
        self.ep.graph.lint()
        self.ep.graph_module.recompile()
        self.ep.validate()

    # ----- state -------------------------------------------------------------------------------

    def _tensor(self, spec: Any) -> torch.Tensor | None:
        import torch

        value = self.ep.state_dict.get(spec.target)
        if value is None:
            value = self.ep.constants.get(spec.target)
        return value if isinstance(value, torch.Tensor) else None

    def _drop(self, slot: _Slot) -> None:
        """Remove the replaced weight: its placeholder, its input spec and its tensor."""
        self.ep.graph.erase_node(slot.node)
        self.ep.graph_signature.input_specs.remove(slot.spec)
        store = self.ep.state_dict if slot.in_state_dict else self.ep.constants
        store.pop(slot.spec.target, None)

    def _buffer(self, site: WeightSite, part: str, tensor: torch.Tensor) -> Node:
        """A new persistent buffer `<weight>_compressed.<part>` (placeholder `coreopt_w<n>_<part>`:
        the converter finds LUT indices by "indices"/"lut" in the placeholder's name, so no weight
        name may come in between)."""
        target = f"{self._prefixes.setdefault(site.name, self._prefix(site))}.{part}"
        return self._edit.buffer(f"coreopt_w{self._count}_{part}", target, tensor)

    def _prefix(self, site: WeightSite) -> str:
        """`<weight>_compressed`: the module path of the weight's buffers (one per weight, as
        coremltools lays them out; coreai-torch reads `quantization_n_bits` beside the data)."""
        prefix = f"{site.name}_compressed"
        while any(key.startswith(prefix + ".") for key in (*self.ep.state_dict, *self.ep.constants)):
            prefix += "_"
        return prefix

    def _call(self, op: Any, *args: Any) -> Node:
        return self._edit.call(op, *args)

    # ----- ops ---------------------------------------------------------------------------------

    def _build(self, site: WeightSite, form: Quantized | Palettized | Sparse) -> Node:
        if isinstance(form, Quantized):
            data = self._buffer(site, "data", torch_values(form.data))
            return self._shift_scale(site, data, form.decode, form.data.element, placeholder=True)
        if isinstance(form, Palettized):
            return self._lut_to_dense(site, form, form.indices.shape)
        return self._sparse(site, form)

    def _shift_scale(
        self, site: WeightSite, data: Node, decode: ShiftScale, element: Element, placeholder: bool = False
    ) -> Node:
        """coreai::constexpr_blockwise_shift_scale: scale * (data - zero point) in the weight's dtype
        (int data), or data * scale (float data; E8M0 scales name the output dtype)."""
        scale = self._buffer(site, "scale", torch_values(decode.scale))
        zero_point = output_dtype = None
        if decode.offset is not None and np.any(decode.offset.values):
            zero_point = self._buffer(site, "zero_point", torch_values(decode.offset))
        if element.is_float:
            if decode.scale.element.name == "f8E8M0FNU":
                output_dtype = site.element.torch_dtype()
        elif placeholder:
            # the width coreai-torch converts the codes to: torch.export cannot write torch.int4 as
            # the op's input_dtype, so it goes where coreai-torch also looks, beside the data
            target = self.ep.graph_signature.input_specs[self._spec_index(data)].target
            bits_key = target.rpartition(".")[0] + ".quantization_n_bits"
            self.ep.state_dict[bits_key] = _bits_tensor(element.bits)
        # positional, as torch.export writes the call: coreai-torch's converter reads args by index
        op = self.ops.constexpr_blockwise_shift_scale.default
        return self._call(op, data, scale, zero_point, None, None, output_dtype)  # no minval, input_dtype

    def _spec_index(self, node: Node) -> int:
        specs = self.ep.graph_signature.input_specs
        return next(i for i, s in enumerate(specs) if s.arg.name == node.name)

    def _lut_to_dense(self, site: WeightSite, form: Palettized, shape: tuple[int, ...]) -> Node:
        indices = self._buffer(site, "indices", torch_values(form.indices))
        lut_values = form.lut.values
        if len(shape) + 2 != lut_values.ndim:  # a LUT over the kept values of a sparse weight
            lut_values = lut_values.reshape((1,) * len(shape) + lut_values.shape[-2:])
        lut = self._buffer(site, "lut", torch_values(Stored(lut_values, form.lut.element)))
        dense = self._call(self.ops.lut_to_dense.default, indices, lut, form.axis if len(shape) > 1 else 0)
        if form.decode is None:
            return dense
        return self._shift_scale(site, dense, form.decode, form.lut.element)

    def _sparse(self, site: WeightSite, form: Sparse) -> Node:
        kept = form.kept
        if isinstance(kept, Palettized):
            values = self._lut_to_dense(site, kept, kept.indices.shape)
            element = kept.lut.element
        elif isinstance(kept, Quantized):  # decoded before the scatter: a zero point must not fill zeros
            data = self._buffer(site, "data", torch_values(kept.data))
            values = self._shift_scale(site, data, kept.decode, kept.data.element, placeholder=True)
            element = site.element
        else:
            values = self._buffer(site, "values", torch_values(kept))
            element = kept.element
        mask = self._buffer(site, "mask", torch_values(Stored(form.mask, ELEMENTS["ui1"])))
        dense = self._call(self.ops.sparse_to_dense.default, values, mask)
        if form.decode is None:
            return dense
        return self._shift_scale(site, dense, form.decode, element)


def _refusal(form: Any, site: WeightSite) -> str | None:
    if isinstance(form, Quantized):
        data = form.data.element
        if data.codes_per_byte > 1:
            if form.decode.scale.element.name != data.packed_under:
                return (f"{data.name} data in a .pt2 needs {data.packed_under} scales (coreai-torch recognises "
                        "its packed codes by them)")  # fmt: skip
            if form.data.shape[-1] % data.codes_per_byte:
                return (f"{data.name} codes pack {data.codes_per_byte} to a byte along the last axis; its length "
                        f"{form.data.shape[-1]} is not a multiple")  # fmt: skip
    if isinstance(form, Sparse):
        return _refusal(form.kept, site)
    return None
