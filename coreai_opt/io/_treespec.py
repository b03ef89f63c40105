"""Output containers of other libraries, read as tuples so a program loads without them.

A program exported from a Hugging Face model returns `CausalLMOutputWithPast` (a user's model, its
own dataclass): torch stores the container's type name in the output pytree spec and can only
rebuild it in a process that imported the library that registered it. coreopt never imports a
library a file names; every container type outside torch's built-in ones becomes a tuple of its
children in declared order (the order the program returns them), so the program loads and runs
as it is, and the flattening is said (`FlattenedOutput`, `inspect`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.export import ExportedProgram

FLATTENED_META = "coreopt_flattened_outputs"  # graph_module.meta key `load_pt2` sets

# The container types torch's pytree serializes without any library: the only ones kept.
KNOWN_CONTAINERS = frozenset(
    {
        "builtins.dict",
        "builtins.list",
        "builtins.tuple",
        "collections.OrderedDict",
        "collections.defaultdict",
        "collections.deque",
        "collections.namedtuple",
        "torch.Size",
        "torch.fx.immutable_collections.immutable_dict",
        "torch.fx.immutable_collections.immutable_list",
    }
)
_TUPLE = "builtins.tuple"
_TREESPEC_PROTOCOL = 1


@dataclass(frozen=True)
class FlattenedOutput:
    """One output container read as a tuple: its type name and the fields it declared."""

    container: str
    fields: tuple[str, ...]

    def describe(self) -> str:
        listed = f" ({', '.join(self.fields)})" if self.fields else ""
        return f"{self.container}{listed}"


def _fields(context: Any) -> tuple[str, ...]:
    """The field names a container's context declares, when it is a JSON list of names."""
    try:
        names = json.loads(context) if isinstance(context, str) else None
    except ValueError:
        return ()
    if isinstance(names, list) and all(isinstance(name, str) for name in names):
        return tuple(names)
    return ()


def _flatten_spec(node: dict[str, Any], found: list[FlattenedOutput]) -> None:
    stack = [node]
    while stack:
        item = stack.pop()
        kind = item.get("type")
        if kind is not None and kind not in KNOWN_CONTAINERS:
            found.append(FlattenedOutput(str(kind), _fields(item.get("context"))))
            item["type"], item["context"] = _TUPLE, "null"
        stack.extend(child for child in item.get("children_spec") or [] if isinstance(child, dict))


def flatten_unknown_outputs(document: dict[str, Any]) -> tuple[FlattenedOutput, ...]:
    """Rewrite a serialized program's output specs in place (call after the audit): every output
    container of a type outside `KNOWN_CONTAINERS` becomes a tuple of its children. Returns what
    was flattened, outermost first."""
    program_outputs: list[FlattenedOutput] = []
    for entry in document.get("graph_module", {}).get("module_call_graph", []):
        signature = entry.get("signature") if isinstance(entry, dict) else None
        if not isinstance(signature, dict) or not isinstance(signature.get("out_spec"), str):
            continue
        protocol, root = json.loads(signature["out_spec"])
        if protocol != _TREESPEC_PROTOCOL or not isinstance(root, dict):
            continue  # torch's deserializer reports a protocol it cannot read
        found: list[FlattenedOutput] = []
        _flatten_spec(root, found)
        if found:
            signature["out_spec"] = json.dumps([protocol, root])
        if entry.get("fqn") == "":  # the program itself (the others: preserved submodule calls)
            program_outputs = found
    return tuple(program_outputs)


def flattened_outputs(program: ExportedProgram) -> tuple[FlattenedOutput, ...]:
    """The output containers `load_pt2` read as tuples for this program (empty: none)."""
    return tuple(program.graph_module.meta.get(FLATTENED_META, ()))
