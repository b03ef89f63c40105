"""A program made ready to run in this process: compressed weights decoded once, and - for a
program read from a file - its first run done in a forked child (`io.first_run`) before this
process runs it at all. Every place that runs a program comes here first."""

from __future__ import annotations

from typing import TYPE_CHECKING

from coreai_opt._memory import meta_stand_in
from coreai_opt.io import file_run, first_run, zero_inputs

from ._ops import _owner, fold_decompression

if TYPE_CHECKING:
    import torch
    from torch.export import ExportedProgram
    from torch.fx import GraphModule


def runnable(
    program: ExportedProgram,
    device: torch.device | str | None = None,
    *,
    stateless: bool = False,
    page_out: bool = False,
) -> GraphModule:
    """`program.module()` with its compressed weights decoded once (`fold_decompression`), after
    the program's first run (`ready_to_run`); on `device` when given (its buffers and constants
    copied there; parameters, which it shares with the program, moved). `stateless`: the writes
    back into mutated buffers dropped - for runs that are each a sequence of their own (a stateful
    decoder's calibration windows from position 0 read only what they write, and a gradient pass
    must not carry one sample's graph into the next through the state). On a device the weights
    are decoded there, after the first run (in a child that decodes its own copy on the host): a
    1B model's decoded weights never wait on the host beside its codes. `page_out`: the host
    copies' file pages leave the resident set as they are copied (`_Copier`), for a caller that
    will not read the program's values again soon (they would come back from the disk)."""
    module = program.module()
    if stateless:
        _drop_state_writes(module, set(program.graph_signature.buffers_to_mutate.values()))
    if device is None:
        fold_decompression(module)
        ready_to_run(program, module)
        return module
    import torch

    ready_to_run(program)
    place_factories(module, torch.device(device))
    copy = _Copier(torch.device(device), page_out)
    module._apply(copy)  # what .to() does, a tensor at a time through `copy`
    for name in program.graph_signature.lifted_tensor_constants:  # plain attributes: .to() passes them by
        owner, last = _owner(module, name)
        held = getattr(owner, last, None)
        if isinstance(held, torch.Tensor):
            setattr(owner, last, copy(held))
    copy.page_out()
    fold_decompression(module)
    return module


class _Copier:
    """Copies tensors to a device; with `pages_out`, pages out the host copies' file pages every
    `RELEASE_EVERY` bytes (`_memory.page_out_mapped`): a program read from a file keeps its own
    host tensors (the caller may still read them), but their pages, read once for the copy, need
    not stay resident - at 1.1B the codes' gigabyte did, beside everything else, until the caller
    let them go. The copied tensors are held until then, so no address is paged out freed."""

    def __init__(self, device: torch.device, pages_out: bool = True) -> None:
        from coreai_opt._memory import EveryBytes

        self.device, self.pages_out, self.copied = device, pages_out, []
        self.every = EveryBytes(self.page_out)

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        moved = t.to(self.device)
        if self.pages_out and moved is not t and t.device.type == "cpu" and t.numel():
            self.copied.append(t)
            self.every.passed(t.numel() * t.element_size())
        return moved

    def page_out(self) -> None:
        from coreai_opt._memory import page_out_mapped

        page_out_mapped([t.data_ptr() for t in self.copied])
        self.copied = []


def release_unheld(program: ExportedProgram, module: GraphModule) -> int:
    """Replace each of `program`'s tensors that `module` does not hold (the codes its decoded
    weights replaced; on a device, every tensor it copied there) by a meta tensor of the same
    shape and dtype, so its memory - a mapped record of the file - leaves the process; the bytes
    let go. For a caller that owns `program` and keeps it for its graph only: nothing may read
    its values, or run it, after this."""
    import torch

    held = {_storage(t) for t in _tensors(module) if t.device.type == "cpu"}
    released = 0
    for table in (program.state_dict, program.constants):
        for name, value in list(table.items()):
            if not isinstance(value, torch.Tensor) or value.device.type != "cpu" or value.numel() == 0:
                continue
            storage = _storage(value)
            if storage is None or storage in held:  # held, or of no storage it can tell: kept
                continue
            table[name] = meta_stand_in(value)
            released += value.numel() * value.element_size()
    return released


def _storage(t: torch.Tensor) -> int | None:
    """Where a tensor's storage starts, or None for one that has none to tell (a wrapper subclass)."""
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def _tensors(module: GraphModule) -> list[torch.Tensor]:
    """The tensors a module holds: parameters, buffers and plain tensor attributes (constants)."""
    import torch

    found = [*module.parameters(), *module.buffers()]
    for sub in module.modules():
        found += [v for v in vars(sub).values() if isinstance(v, torch.Tensor)]
    return found


def _drop_state_writes(gm: GraphModule, buffers: set[str]) -> None:
    """Erase the unlifted module's `copy_(buffer, new value)` nodes into `buffers`."""
    import torch

    dropped = [
        node for node in gm.graph.nodes
        if node.op == "call_function" and node.target is torch.ops.aten.copy_.default and not node.users
        and node.args[0].op == "get_attr" and node.args[0].target in buffers
    ]  # fmt: skip
    for node in dropped:
        gm.graph.erase_node(node)
    if dropped:
        gm.recompile()


def place_factories(gm: GraphModule, device: torch.device) -> None:
    """Point the graph's tensor factories (a causal mask's `full`, `arange`, `_to_copy`) at
    `device`: torch.export records the device they were traced on, and a graph moved to a GPU
    would still build those tensors on the CPU."""
    import torch

    changed = False
    for node in gm.graph.nodes:
        placed = node.kwargs.get("device") if node.op == "call_function" else None
        if placed is not None and torch.device(placed) != device:
            node.kwargs = {**node.kwargs, "device": device}
            changed = True
    if changed:
        gm.recompile()


def compute_in_float64(gm: GraphModule) -> None:
    """Make `gm` (a module `runnable` made) compute in float64: each floating-point tensor it
    holds cast just before the node that first reads it - a copy, let go after its last reader,
    so the program's own tensors stay as they are and one weight at a time is held twice - every
    floating-point dtype its graph names (casts, factories, metadata checks) float64, and every
    view a reshape (CUDA's float64 attention lays out its result otherwise than the float32 one
    the graph was traced on). Its floating-point inputs must come in float64. Two programs
    compared so differ by what their weights differ by, not by their float32 arithmetic's own
    rounding (5 epsilons of SmolLM2-135M's logits against float64, and another for every order
    of operations). A graph that reinterprets bits (`view.dtype`) cannot: NotImplementedError."""
    import torch
    import torch.utils._pytree as pytree

    def widened(value: object) -> object:
        return torch.float64 if isinstance(value, torch.dtype) and value.is_floating_point else value

    graph = gm.graph
    for node in graph.find_nodes(op="call_function", target=torch.ops.aten.view.dtype):
        raise NotImplementedError(f"{node.name} reinterprets bits: in float64 they would be others")
    order = {node: index for index, node in enumerate(graph.nodes)}
    for node in list(graph.nodes):
        if node.op == "call_function":
            node.args, node.kwargs = pytree.tree_map(widened, (node.args, node.kwargs))
            if node.target is torch.ops.aten.view.default:
                node.target = torch.ops.aten.reshape.default
        elif node.op == "get_attr" and node.users and _float_attribute(gm, node.target):
            with graph.inserting_before(min(node.users, key=order.__getitem__)):
                cast = graph.call_function(torch.ops.aten._to_copy.default, (node,), {"dtype": torch.float64})
            node.replace_all_uses_with(cast, delete_user_cb=lambda user, cast=cast: user is not cast)
    gm.recompile()


def _float_attribute(gm: GraphModule, target: str) -> bool:
    import torch

    owner, last = _owner(gm, target)
    held = getattr(owner, last, None)
    return isinstance(held, torch.Tensor) and held.is_floating_point()


def ready_to_run(program: ExportedProgram, module: GraphModule | None = None) -> None:
    """A program read from a file runs first in a forked child, on zeros, its compressed weights
    folded (the decoders' memory, not coreai-torch's expansion of every table): `ProgramRunError`
    when that run fails or dies. `module`: the folded module the caller will run, if built."""
    run = file_run(program)
    if run is None or run.ran:
        return

    def call() -> None:
        ready = module if module is not None else program.module()
        if module is None:
            fold_decompression(ready)
        ready(*zero_inputs(program))

    first_run(run, call)


def checked_device(name: str | None) -> str | None:
    """A torch device this machine has (one line otherwise)."""
    if name is None or name == "cpu":
        return None
    import torch

    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"--device {name!r} is not a torch device (cpu, cuda, cuda:1, ...)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: this machine has no CUDA device torch can use")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return name
