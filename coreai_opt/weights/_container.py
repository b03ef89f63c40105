"""What a program must offer to have its weights compressed, and which class offers it for which
program type.

A container lists its float tensors, reads a weight, and writes an encoded weight in its place,
reporting what it stored (`Written`). Containers are found by the program's type through
`CONTAINERS` - a table of import paths, so nothing here (or in a pass) imports the container
packages, which import this one.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ._forms import Encoding
from ._sites import Candidate, WeightSite

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Written:
    """What a container reports of a weight it wrote: how it is stored (as inspect names it) and
    what it costs, before and after."""

    encoding: str
    bytes_before: int
    bytes_after: int


class Container(Protocol):
    """A program whose weights can be compressed (a Core AI program: `coreai_opt._coreai`; a
    `torch.export` program: `coreai_opt._export`)."""

    def candidates(self) -> list[Candidate]: ...

    def compressed(self) -> int:
        """How many weights the program already holds compressed (they are never encoded again)."""
        ...

    def read(self, site: WeightSite) -> torch.Tensor: ...

    def refusal(self, site: WeightSite, encoding: Encoding) -> str | None:
        """Why this container cannot store `encoding` of the weight (it is then skipped), or None."""
        ...

    def write(self, site: WeightSite, encoding: Encoding) -> Written: ...

    def finish(self) -> None: ...


# program type (module.QualifiedName) -> the container class (module:Class) that compresses it
CONTAINERS: dict[str, str] = {
    "coreai.authoring.asset.AIProgram": "coreai_opt._coreai._rewrite:CoreAIWeights",
    "torch.export.exported_program.ExportedProgram": "coreai_opt._export._weights:ExportWeights",
}


def register_container(program_type: type | str, container: str) -> None:
    """Let `container_of` wrap programs of `program_type` in `container` (`module:Class`)."""
    key = (
        program_type
        if isinstance(program_type, str)
        else f"{program_type.__module__}.{program_type.__qualname__}"
    )
    CONTAINERS[key] = container


def container_of(program: Any) -> Container:
    """The container that writes `program`'s weights, found by the program's type (or a base)."""
    for kind in type(program).__mro__:
        path = CONTAINERS.get(f"{kind.__module__}.{kind.__qualname__}")
        if path is not None:
            module, _, name = path.partition(":")
            return getattr(importlib.import_module(module), name)(program)
    kinds = ", ".join(sorted(key.rpartition(".")[2] for key in CONTAINERS))
    raise TypeError(f"cannot compress a {type(program).__name__}: give one of {kinds}")
