"""Statistics of a program's weights as they are, from one run of the whole program per sample.

The module runs under an FX interpreter that, at every op chosen to read a weight (`_readers`),
adds what the op's activation operand holds to that weight's sums (`_sums`) before the op runs.
Nothing is replaced along the way: this is the capture for methods that learn every weight from
the program as given, and its statistics are what the disk cache (`_cache`) keeps.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from coreai_opt.weights import Needs, Statistics

from ._readers import Reader, first_readers
from ._sums import Sums, rows_key

if TYPE_CHECKING:
    import torch
    from torch.fx import GraphModule, Node


def one_pass(
    gm: GraphModule,
    names: Sequence[str],
    needs: Needs,
    state: Mapping[str, torch.Tensor],
    inputs: Sequence[tuple[Any, ...]],
    progress: Any = None,
) -> dict[str, Statistics]:
    """Each named weight's statistics over all samples (`inputs`), one run of `gm` a sample (each
    reported to `progress(done, total, label)` when given)."""
    import torch

    chosen = first_readers(gm, names, needs, state)
    by_node: dict[Node, list[Reader]] = {}
    for reader in chosen.values():
        by_node.setdefault(reader.node, []).append(reader)
    keys = {name: rows_key(chosen[name]) if name in chosen else name for name in names}
    shared = {key: Sums() for key in keys.values()}  # readers of the same rows add them once, to one sums
    sums = {name: shared[keys[name]] for name in names}
    recorder = _recording_class()(gm, by_node, sums, needs)
    with torch.no_grad():
        for done, sample in enumerate(inputs, 1):
            recorder.run(*sample)
            if progress is not None:
                progress(done, len(inputs), "calibration samples")
    means = {key: one.mean() for key, one in shared.items()}
    return {name: means[keys[name]] for name in names}


@functools.cache
def _recording_class() -> type:
    """An FX interpreter that runs the module on one sample (`run`), adding each chosen reader's
    activation to its sums. The class is made once and holds nothing of a call: a recorder in a
    reference cycle (a class made per call, closing over the sums) kept every Gram matrix
    resident until the cyclic collector ran, minutes later."""
    from torch.fx import Interpreter

    class _Recording(Interpreter):
        def __init__(
            self, gm: GraphModule, by_node: dict[Node, list[Reader]], sums: dict[str, Sums], needs: Needs
        ) -> None:
            super().__init__(gm)
            self.by_node, self.sums, self.needs = by_node, sums, needs
            self.added: set[int] = set()  # the sums this sample has added to

        def run(self, *inputs: Any, **kwargs: Any) -> Any:
            self.added.clear()
            return super().run(*inputs, **kwargs)

        def run_node(self, n: Node) -> Any:
            for reader in self.by_node.get(n, ()):
                sums = self.sums[reader.name]
                if reader.activation is not None and id(sums) not in self.added:
                    args, _ = self.fetch_args_kwargs_from_env(n)
                    sums.add(args[reader.activation], reader, self.needs)
                    self.added.add(id(sums))
            return super().run_node(n)

    return _Recording
