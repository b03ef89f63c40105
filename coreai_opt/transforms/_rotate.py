"""Rotate a decoder's residual stream by an orthogonal Q folded into its weights (QuaRot,
SpinQuant's R1): every norm's gain is folded into the linears that read it first (so each norm
is the same for every rotation), then the embedding tables, every linear layer reading the
stream (W Q) and every one writing it (Q^T W, b Q) turn with it. The program keeps its ops and
computes the same function; its weights have no outlier channels left for a format to lose.

A gain that cannot be folded - the final norm's, before a head tied to the embedding - stays:
the stream is turned back for it and forward after it (two matmuls by Q^T and Q, stored as
weights), so the tied table stays one tensor. One matmul by Q^T diag(g) Q would do too, but its
small off-diagonal entries do not survive a 4-bit grid; a Hadamard Q's entries all do."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from coreai_opt._aten import CAST_PACKETS, VIEW_PACKETS, WEIGHT_OPS, packet
from coreai_opt.weights import Needs

from ._derived import KeptGain, turning_names
from ._equivalence import TransformError
from ._fold_norms import fold_norms, replace_tensor
from ._heads import HeadPair, trace_heads
from ._orthogonal import rotation_matrix
from ._registry import Edited
from ._stream import NotAStream, Stream, trace_stream

if TYPE_CHECKING:
    import torch
    from torch.export import ExportedProgram
    from torch.fx import Node


def rotate(program: ExportedProgram, config: Any, calibration: Any = None, progress: Any = None) -> Edited:
    """Fold the norms, then rotate the stream by `config.rotation` (seeded by `config.seed`) and,
    with `config.heads`, every attention layer's values and outputs head by head (seed + 1); a
    line for each norm, one for each rotation and one for each attention layer left. A learned
    rotation also gives the rotated program's input statistics on its calibration (`_derived`)."""
    try:
        stream = trace_stream(program)
    except NotAStream as why:
        raise TransformError(f"cannot rotate the residual stream: {why}") from None
    heads, left = trace_heads(program) if config.heads else ([], [])
    lines = fold_norms(program, config)
    q = rotation_matrix(stream.width, "random" if config.rotation == "random" else "hadamard", config.seed)
    measured = None
    if config.learns():
        q, lines, measured = _learned(program, stream, q, config, (calibration, progress), lines)
    gains = (
        {}
        if measured is None
        else {name: _kept_gain(program, node, name) for node, name in stream.gains.items()}
    )
    turn_weights(program.state_dict, stream, q)
    turned_heads = _turn_heads(program.state_dict, heads, config) + left
    kept = [name for node, name in stream.gains.items() if _unrotated_gain(program, node, name, q)]
    lines.append(
        f"residual stream of {stream.width} channels rotated ({config.rotation}, seed {config.seed}): "
        f"{len(stream.axes)} tensors turned - {stream.readers} readers, {stream.writers} writers"
    )
    lines += turned_heads
    lines += [
        f"{name}: kept, applied to the stream turned back (x Q^T, then Q: two {stream.width}x{stream.width} matmuls)"
        for name in kept
    ]
    if measured is None:
        return Edited(lines)
    from ._derived import rotated_statistics

    derived = rotated_statistics(
        measured, stream, q, [gains[name] for name in kept], {pair.output for pair in heads}
    )
    return Edited(lines, {Needs.INPUT_GRAM: derived}, calibration.samples.digest())


def _learned(program: ExportedProgram, stream: Stream, q0: torch.Tensor, config: Any, given: tuple[Any, Any],
             lines: list[str]) -> tuple[torch.Tensor, list[str], dict[str, Any]]:  # fmt: skip
    """Q learned from the seeded Hadamard one on the calibration's samples, run again through
    the program with its norms folded (the Gram matrices the rotated weights will meet), and the
    statistics measured there; each step reported to the progress callback given with the
    calibration."""
    import time

    from coreai_opt._memory import release_garbage
    from coreai_opt.calibration import calibrate

    from ._learned import learned_rotation

    calibration, progress = given
    began = time.perf_counter()
    folded = calibrate(program, calibration.samples, cache=calibration.cache, device=calibration.device)
    q, before, after, measured = learned_rotation(program.state_dict, stream, q0, config, folded, progress)
    del folded  # the folded program's run is gone (its statistics stay, to be turned)
    release_garbage(sum(t.numel() * t.element_size() for t in program.state_dict.values()))
    lines.append(f"rotation learned in {config.steps} steps ({time.perf_counter() - began:.0f} s): mean relative "
                 f"int{config.bits} rounding loss {before:.4g} at the Hadamard start -> {after:.4g}")  # fmt: skip
    return q.double(), lines, measured


def _kept_gain(program: ExportedProgram, node: Node, name: str) -> KeptGain:
    """The gain `name` that `node` applies, with the stored weight of the first linear layer that
    reads its output through views (the tied head), before the rotation rewrites around it."""
    from ._graph import parameters, source

    names, frontier, reader = parameters(program), [(node, user) for user in node.users], None
    while frontier and reader is None:
        value, user = frontier.pop(0)
        if packet(user) in VIEW_PACKETS | CAST_PACKETS and user.args and user.args[0] is value:
            frontier.extend((user, after) for after in user.users)
            continue
        facts = WEIGHT_OPS.get(packet(user))
        if facts is None or facts.weight >= len(user.args) or user.args[facts.weight] is value:
            continue
        weight, _ = source(user.args[facts.weight])
        reader = names.get(weight.name) if weight is not None else None
    return KeptGain(name, program.state_dict[name].detach(), reader)


def _turn_heads(state: dict[str, Any], pairs: list[HeadPair], config: Any) -> list[str]:
    """Each value / output pair's axes, head by head, times one R of the head dimension."""
    rotations: dict[int, torch.Tensor] = {}
    for pair in pairs:
        r = rotations.setdefault(
            pair.head_dim, rotation_matrix(pair.head_dim, config.rotation, config.seed + 1)
        )
        for name, axis in pair.turned:
            value = state[name].double().movedim(axis, -1)
            blocks = value.reshape(*value.shape[:-1], -1, pair.head_dim) @ r
            replace_tensor(state, name, blocks.reshape(value.shape).movedim(-1, axis))
    if not pairs:
        return []
    dims = ", ".join(str(d) for d in sorted(rotations))
    return [f"values and outputs of {len(pairs)} attention layers rotated head by head ({dims} channels)"]


def turn_weights(state: dict[str, Any], stream: Stream, q: torch.Tensor) -> None:
    """Every stored tensor along each of its stream axes times Q (in float64, stored back in its
    dtype); another name for the same storage (an exported tied embedding keeps two) turns with it.
    Each tensor read from the program's file leaves the resident set once turned (`page_out_mapped`:
    read again only if the transform is undone), so the weights are never all held twice."""
    from coreai_opt._memory import page_out_mapped

    for name, axes in stream.axes.items():
        old = state[name]
        value = old.double()
        for axis in sorted(axes):
            value = (value.movedim(axis, -1) @ q.to(value.device)).movedim(-1, axis)
        replace_tensor(state, name, value)
        for alias in [k for k, v in state.items() if k != name and _same_storage(v, old)]:
            state[alias] = state[name]
        if not old.is_cuda:
            page_out_mapped([old.data_ptr()])


def _same_storage(a: Any, b: Any) -> bool:
    return (
        a.data_ptr() == b.data_ptr()
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.dtype == b.dtype
    )


def _unrotated_gain(program: ExportedProgram, node: Node, name: str, q: torch.Tensor) -> bool:
    """`mul(g, x)` on the rotated stream -> `mul(g, x Q^T) Q`: the stream turned back for the gain
    and forward again after it, by two matmuls with stored weights Q and Q^T (a Hadamard Q's
    entries are all +-1/sqrt(n), which quantization or palettization with a scale per row
    represents exactly; pruning would not). False (nothing done) where g is one value throughout."""
    gain = program.state_dict[name]
    if bool((gain == gain.reshape(-1)[0]).all()):
        return False
    from coreai_opt._export import ProgramEdit

    edit = ProgramEdit(program)
    back_name, forward_name = turning_names(name)
    back = _linear(program, edit, node, node.args[1] if _reads(node.args[0], name, program) else node.args[0],
                   back_name, q, before=True)  # fmt: skip
    node.replace_input_with(back.args[0].args[0].args[0], back)  # type: ignore[union-attr]
    forward = _linear(program, edit, node, node, forward_name, q.T, before=False)
    own = {forward.args[0].args[0], *forward.args[1]}  # type: ignore[union-attr]  # its rows, and sizes it reads
    node.replace_all_uses_with(forward, delete_user_cb=lambda user: user not in own)
    return True


def _linear(program: ExportedProgram, edit: Any, node: Node, x: Node, target: str, weight: torch.Tensor,
            before: bool) -> Node:  # fmt: skip
    """`x @ weight.T` as torch.export writes a bias-free linear (view, permute of a stored
    [out, in] weight, mm, view), inserted before or after `node`; the last view. A dimension
    the program leaves symbolic (a stateful decoder's token count) is read off `x` by `sym_size`."""
    import torch

    aten = torch.ops.aten
    stored = edit.buffer("b_" + target.replace(".", "_"), target, weight.to(x.meta["val"].dtype).contiguous())
    shape = list(x.meta["val"].shape)
    place = program.graph.inserting_before(node) if before else program.graph.inserting_after(node)
    with place:
        rows = edit.call(aten.view.default, x, [-1, shape[-1]])
    with program.graph.inserting_after(rows):
        turned = edit.call(aten.permute.default, stored, [1, 0])
    with program.graph.inserting_after(turned):
        at = product = edit.call(aten.mm.default, rows, turned)
    for i, size in enumerate(shape):
        if not isinstance(size, int):
            with program.graph.inserting_after(at):
                at = shape[i] = edit.call(aten.sym_size.int, x, i)
    with program.graph.inserting_after(at):
        return edit.call(aten.view.default, product, shape)


def _reads(value: Any, name: str, program: ExportedProgram) -> bool:
    from ._graph import parameters, source

    placeholder, _ = source(value)
    return placeholder is not None and parameters(program).get(placeholder.name) == name
