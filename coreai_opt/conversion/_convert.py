"""Run coreai-torch's converter on a program in memory (files: `coreai_opt.recipes`)."""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from coreai_opt._elements import of_torch

if TYPE_CHECKING:
    from coreai.authoring import AIProgram
    from torch.export import ExportedProgram


def convert_exported_program(program: ExportedProgram) -> AIProgram:
    """Convert with coreai-torch; its console chatter is kept out of our output. Every weight
    constant of the result carries its source's qualified name (`layers.0.fc2.weight`)."""
    converted, _ = convert_with_log(program)
    return converted


def _digest(values: np.ndarray) -> bytes:
    """What identifies a tensor's values: dtype, shape and bytes (sha256, the same in every process)."""
    head = f"{values.dtype.str}{values.shape}".encode()
    return hashlib.sha256(head + np.ascontiguousarray(values).tobytes()).digest()


def _source_names(program: ExportedProgram) -> Callable[[np.ndarray], str | None]:
    """Recognise a converted constant by its values: the qualified name of the parameter, buffer or
    constant it holds, as stored or transposed (the converter folds a weight's transpose into it).
    Tied tensors (one embedding read by the lookup and the lm_head) share the first name."""
    import torch
    from torch.export.graph_signature import InputKind

    tensors: list[tuple[str, np.ndarray]] = []
    for spec in program.graph_signature.input_specs:
        if spec.kind not in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            continue
        tensor = program.state_dict.get(spec.target, program.constants.get(spec.target))
        if tensor is None or not tensor.is_floating_point():
            continue
        try:
            element = of_torch(tensor.dtype)
        except ValueError:
            continue
        if element.bits not in (16, 32):  # weights are stored in 16 or 32 bits; codes and scales are not
            continue
        bits = tensor.detach().contiguous().view(torch.int16 if element.bits == 16 else torch.int32)
        values = bits.numpy().view(element.numpy_dtype())  # numpy has no bfloat16: through the bits
        tensors.append((spec.target, values))
    direct: dict[bytes, str] = {}
    for name, values in tensors:
        direct.setdefault(_digest(values), name)
    transposed: dict[bytes, str] = {}

    def name_of(values: np.ndarray) -> str | None:
        found = direct.get(_digest(values))
        if found is None and values.ndim == 2:
            if not transposed:  # only when some constant is not stored as its source is
                for name, source in tensors:
                    if source.ndim == 2:
                        transposed.setdefault(_digest(source.T), name)
            found = transposed.get(_digest(values))
        if found is None and values.ndim >= 2:
            found = _folded(values, tensors)
        return found

    return name_of


def _module_of_node(program: ExportedProgram) -> Callable[[str], str | None]:
    """`<module path>.<node>` for an FX node of `program` called inside a submodule, else None."""
    paths = {}
    for node in program.graph.nodes:
        stack = node.meta.get("nn_module_stack") or {}
        path = next(reversed(stack.values()), ("",))[0] if stack else ""
        if path:
            paths[node.name] = f"{path}.{node.name}"
    return paths.get


def _folded(values: np.ndarray, tensors: list[tuple[str, np.ndarray]]) -> str | None:
    """`<name>.bn_folded` when `values` is a source weight scaled per output channel (the converter
    folds a batch norm into the convolution before it), else None."""
    rows = values.reshape(values.shape[0], -1).astype(np.float64)
    for name, source in tensors:
        if source.shape != values.shape:
            continue
        base = source.reshape(source.shape[0], -1).astype(np.float64)
        energy = (base * base).sum(1)
        if not (energy > 0).all():
            continue
        scale = (rows * base).sum(1) / energy
        residual = rows - scale[:, None] * base
        if (residual * residual).sum() <= 1e-10 * (rows * rows).sum():
            # a batch norm at its initial statistics scales by 1/sqrt(1 + eps): folded all the same
            return name if (scale == 1.0).all() else f"{name}.bn_folded"
    return None


@contextlib.contextmanager
def _repeated_luts(program: ExportedProgram) -> Iterator[None]:
    """While coreai-torch converts: every 8-entry table a `lut_to_dense` reads (3-bit indices, which
    its packing does not know) repeated to 16 entries, so it packs the indices as 4-bit codes; the
    converted program is narrowed back (`narrow_repeated_luts`). The program is restored after."""
    import torch

    from coreai_opt._coreai import NARROWED_ENTRIES
    from coreai_opt._export import LUT_TO_DENSE, op_name

    state, constants = program.state_dict, program.constants
    placeholders = {spec.arg.name: spec.target for spec in program.graph_signature.input_specs}
    saved: list[tuple[Any, Any, dict[str, Any], str, Any]] = []
    try:
        for node in program.graph.nodes:
            lut = node.args[1] if op_name(node) == LUT_TO_DENSE else None
            target = placeholders.get(getattr(lut, "name", None))
            store = state if target in state else constants
            table = store.get(target)
            if table is None or table.dim() < 2 or table.shape[-2] != NARROWED_ENTRIES:
                continue
            fake = lut.meta.get("val")
            saved.append((lut, fake, store, target, table))
            store[target] = wide = torch.cat([table, table], dim=-2)
            lut.meta["val"] = fake.fake_mode.from_tensor(wide) if hasattr(fake, "fake_mode") else wide
        yield
    finally:
        for lut, fake, store, target, table in reversed(saved):
            store[target] = table
            lut.meta["val"] = fake


class ConverterFailure(RuntimeError):
    """coreai-torch raised; the message adds the MLIR diagnostic it printed, if any."""


def convert_with_log(program: ExportedProgram) -> tuple[AIProgram, str]:
    """The converted program and what the converter printed (its log and MLIR diagnostics). A
    stateful decoder converts as two functions over one set of weights and one state
    (`models.decoder_entries`: "main" decodes a token, "prefill" takes a chunk)."""
    from coreai_opt._coreai import first_error, native_stderr
    from coreai_opt.models import decoder_entries, decoder_problem

    entries = {"main": program} if decoder_problem(program) is not None else decoder_entries(program)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import coreai_torch

        log = io.StringIO()
        failure = None
        # the converter replaces compressed weights' codes in the state_dict by packed sub-byte
        # tensors: the caller's program must stay as it was (and runnable)
        states = [(entry, dict(entry.state_dict)) for entry in entries.values()]
        quiet = logging.getLogger("coreai_torch")
        level = quiet.level
        quiet.setLevel(logging.ERROR)  # "cannot infer nbits" for FP8 data: expected, not a problem
        with contextlib.redirect_stdout(log), native_stderr() as diagnostics, contextlib.ExitStack() as luts:
            try:
                converter = coreai_torch.TorchConverter()
                for name, entry in entries.items():
                    luts.enter_context(_repeated_luts(entry))
                    converter.add_exported_program(entry, entrypoint_name=name)
                result = converter.to_coreai()
            except Exception as exc:
                failure = exc
            finally:
                for entry, state in states:
                    entry.state_dict.clear()
                    entry.state_dict.update(state)
                quiet.setLevel(level)
    if failure is not None:
        message = " ".join(str(failure).split()) or type(failure).__name__
        detail = first_error(diagnostics)
        raise ConverterFailure(f"{message} ({detail})" if detail else message) from failure
    from coreai_opt._coreai import canonical_symbol_names, name_constants, narrow_repeated_luts

    narrow_repeated_luts(result)  # back to the 3-bit codes the .pt2 carries
    name_constants(result, _source_names(program), _module_of_node(program))
    canonical_symbol_names(result)  # coreai names composites at random: the same bytes every time
    return result, "\n".join([log.getvalue().strip(), *diagnostics]).strip()
