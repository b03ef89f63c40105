"""A stateful decoder program (`models.export_model(context=...)`) ready to call token by token:
its inputs and cache checked once, the cache zeroed for each new sequence."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch
    from torch.export import ExportedProgram


class NotADecoder(ValueError):
    """The program is not a stateful decoder (what it is instead, and how to make one)."""


class Decoder(Protocol):
    """What `generate` and `eval` call: `StatefulDecoder` (PyTorch), `AssetDecoder` (Core AI)."""

    context: int

    @property
    def state_bytes(self) -> int: ...

    def reset(self) -> None: ...

    def __call__(self, ids: Sequence[int], position: int) -> torch.Tensor: ...


def check_fit(ids: Sequence[int], position: int, context: int) -> None:
    """`ValueError` unless `ids` (at least one) written from `position` fit a cache of `context`."""
    if not ids or position < 0 or position + len(ids) > context:
        raise ValueError(f"{len(ids)} tokens at position {position} do not fit a context of {context}")


class StatefulDecoder:
    """`program` made runnable (`_export.runnable`: a program read from a file runs first in a
    worker; or its `module`, made so already); `__call__(ids, position)` runs ids at positions position.. and returns their logits,
    the cache keeping every key and value written until `reset`."""

    def __init__(self, program: ExportedProgram, device: Any = None, module: Any = None) -> None:
        from coreai_opt._export import runnable
        from coreai_opt.models import decoder_problem

        problem = decoder_problem(program)
        if problem:
            raise NotADecoder(problem)
        self.module = module if module is not None else runnable(program, device)  # one made already
        names = list(program.graph_signature.buffers_to_mutate.values())
        self.state = [self.module.get_buffer(name) for name in names]
        self.context = int(self.state[0].shape[2])
        self.device = self.state[0].device

    @property
    def state_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.state)

    def reset(self) -> None:
        """Zero the cache (a new sequence)."""
        for tensor in self.state:
            tensor.zero_()

    def __call__(self, ids: Sequence[int], position: int) -> torch.Tensor:
        """Logits `[len(ids), vocab]` of `ids` written at `position`, `position + 1`, ..."""
        import torch

        check_fit(ids, position, self.context)
        tokens = torch.tensor([list(ids)], dtype=torch.long, device=self.device)
        where = torch.tensor([position], dtype=torch.long, device=self.device)
        with torch.no_grad():
            return self.module(tokens, where)[0]
