"""A `weights.Calibration` for one `torch.export` program and its samples: statistics of its
weights on the samples, taken where each weight is read, and the program with compressed weights
swapped in.

The program runs in PyTorch (`ep.module()`, its compressed weights decoded once) on the calibration
device (`_device`). Input moments and Gram matrices, in float64, come from one pass per sample
(`_one_pass`) or layer by layer (`_layer_by_layer`: segments between weight readers, so a weight's
statistics can be taken, the weight replaced by its compressed form, and the rest of the program
run on from there); squared gradients of a loss per weight element (`_losses`) from a segmented
backward pass (`_fisher`). Statistics are cached on disk by program and samples (`_cache`). This
class holds the program, the samples and the weights replaced or let go, and keeps the protocol's
promises about them: once a final pass has let go of the program, nothing runs it again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from coreai_opt.weights import Needs, Statistics

from . import _device
from ._cache import FisherStore, load_statistics, program_fingerprint, statistics_key, store_statistics
from ._checkpoints import CacheCheckpoints
from ._layer_by_layer import LayerByLayer
from ._losses import output_divergence, sample_loss
from ._one_pass import one_pass
from ._readers import readers, twins_of
from ._samples import Samples

if TYPE_CHECKING:
    import torch
    from torch.export import ExportedProgram

    from ._blocks import Block


class ProgramCalibration:
    """A `weights.Calibration` for one `torch.export` program and its samples (see the module)."""

    def __init__(
        self,
        program: ExportedProgram,
        samples: Samples,
        *,
        cache: bool = True,
        seed: int = 0,
        device: str | torch.device | None = None,
        exact_gradients: bool = False,
    ) -> None:
        import torch

        from coreai_opt._export import runnable

        self.samples = samples
        self.state = dict(program.state_dict)  # as exported (tied tensors under both names)
        self.device = torch.device(device or "cpu")
        self.gm = runnable(program, self.device, stateless=True)  # each sample a sequence of its own
        with torch.no_grad():
            self.inputs = [tuple(t.to(self.device) for t in inputs) for _, inputs in samples.inputs(program)]
        if not self.inputs:
            raise ValueError(f"{samples.describe()} gave no calibration samples")
        self.cache = cache
        self.seed = seed
        self.fast_gradients = not exact_gradients and _device.bfloat16_products(self.device)
        self.replaced: dict[str, torch.Tensor] = {}
        self.released: set[str] = set()  # replaced weights whose values as given were let go
        self.spent: set[str] = set()  # released weights a final pass let go of, replacement and all
        self.closed = False  # final statistics were taken: no program is held any more
        self._lookup_twins: set[str] | None = None
        self._fingerprint: str | None = None
        self._tuned_targets: tuple[tuple[str, ...], dict[str, list[str]]] | None = None
        self.progress: Any = None  # (done, total, label) as one-pass statistics and the Fisher pass go

    # ----- the Calibration protocol ------------------------------------------------------------

    def statistics(self, names: Sequence[str], needs: Needs, *, final: bool = False) -> dict[str, Statistics]:
        self._check_whole()
        if needs is Needs.GRADIENT_SQUARES:
            found = dict(self._fisher(names))
        else:
            key = self._key(names, needs)
            loaded = load_statistics(key, names, self.device) if self.cache else None
            found = (
                loaded
                if loaded is not None
                else one_pass(self.gm, names, needs, self.state, self.inputs, self.progress)
            )
            if self.cache and loaded is None:
                store_statistics(key, found)
        if final:
            self._close()
        return found

    def sequential(
        self, names: Sequence[str], needs: Needs, *, final: bool = False
    ) -> Iterator[tuple[str, Statistics]]:
        self._check_whole()
        if needs is Needs.GRADIENT_SQUARES:  # the backward pass's order: from the output back
            yield from self._fisher(names, final=final)
            return
        yield from LayerByLayer(self, names, needs, final).run()

    def blocks(self, names: Sequence[str]) -> Iterator[Block]:
        """The program a block at a time (`_blocks`): each block that reads some of the named
        weights, with its loss against the program as given; the caller replaces a block's weights
        before it takes the next."""
        from ._blocks import BlockByBlock

        self._check_whole()
        if self.released:
            raise RuntimeError(f"{sorted(self.released)[0]} was replaced without keeping the weight as given")
        return BlockByBlock(self, names).blocks()

    def _fisher(self, names: Sequence[str], *, final: bool = False) -> Iterator[tuple[str, Statistics]]:
        """Each weight's squared gradients as the segmented backward pass (`_fisher`) finishes
        it, of the program as it was when the pass began; `final`: a weight replaced without its
        original is let go once handed over, and the program once all are."""
        from ._fisher import SegmentedBackward

        held = [name for name in names if self._holds(name)]
        for name in names:
            if name not in held:
                yield name, Statistics(0)
        store = FisherStore(self._key(names, Needs.GRADIENT_SQUARES)) if self.cache else None
        found = store.load(held, self.device) if store is not None else None
        if found is None:
            import torch

            generator = torch.Generator().manual_seed(self.seed)  # on the CPU: the same draws on any device
            passing = SegmentedBackward(self.gm, held, fast=self.fast_gradients, progress=self.progress).run(
                self.inputs, lambda output, inputs: sample_loss(output, inputs, generator)
            )
            found = passing if store is None else store.saving(passing)
        elif final:
            self._close()  # nothing will run the program again
        for name, statistics in found:
            yield name, statistics
            if final and name in self.released and name in self.replaced:
                self._let_go(name)
        if final and not self.closed:
            self._close()

    def _twins_of_lookups(self) -> set[str]:
        """The multiplied weights equal to a weight that is only looked up (`twins_of`), found once
        from the weights as given - before any is let go."""
        if self._lookup_twins is None:
            found = readers(self.gm)
            multiplied = {r.name for r in found if r.activation is not None}
            lacking = [name for name in self.state if name not in multiplied]
            self._lookup_twins = set(twins_of(self.gm, found, lacking, self.state).values())
        return self._lookup_twins

    def _check_whole(self) -> None:
        if self.closed:
            raise RuntimeError("this calibration's final statistics were taken: it let go of its program "
                               "(calibrate anew)")  # fmt: skip
        if self.spent:
            raise RuntimeError(
                f"{sorted(self.spent)[0]} was let go by a final layer-by-layer pass: this calibration "
                "cannot run the program again (calibrate anew)"
            )

    def _close(self) -> None:
        """Let go of the program (its weights as given and as replaced) and the samples: the
        caller's last statistics are taken, and the weights leave with the program's own."""
        from torch.fx import Graph, GraphModule
        from torch.nn import Module

        self.closed = True
        self.gm = GraphModule(Module(), Graph())
        self.state, self.replaced, self.inputs = {}, {}, []

    def _let_go(self, name: str) -> None:
        """Drop the replaced weight `name` (a final pass has gone past its last reader): an empty
        tensor stands in, so nothing that runs the program again could pass unnoticed."""
        import torch

        *path, leaf = name.split(".")
        owner = self.gm.get_submodule(".".join(path))
        empty = torch.empty(0, dtype=getattr(owner, leaf).dtype, device=self.device)
        if leaf in owner._parameters:
            owner._parameters[leaf] = torch.nn.Parameter(empty, requires_grad=False)
        else:
            setattr(owner, leaf, empty)
        del self.replaced[name]
        self.spent.add(name)

    def replace(self, name: str, value: torch.Tensor, *, keep_original: bool = True) -> None:
        import torch

        if self.closed:
            return  # the caller said nothing more is asked: no program is left to swap it into
        if not self._holds(name):
            return  # a constant of a converted program that this program does not name: nothing reads it here
        *path, leaf = name.split(".")
        owner = self.gm.get_submodule(".".join(path))
        dtype = getattr(owner, leaf).dtype
        value = value.to(self.device)
        if leaf in owner._parameters:
            owner._parameters[leaf] = torch.nn.Parameter(value.to(dtype), requires_grad=False)
        else:
            setattr(owner, leaf, value.to(dtype))
        self.replaced[name] = value
        if not keep_original:  # the last reference to the weight as given: its pages leave the process
            if name not in self._twins_of_lookups():  # those are how a looked-up weight finds its twin
                self.state.pop(name, None)
            self.released.add(name)
        self._fingerprint = None

    @property
    def sample_count(self) -> int:
        return len(self.inputs)

    def references(self, samples: Sequence[int]) -> list[Any]:
        import torch

        self._check_whole()
        if self.released:
            raise RuntimeError(f"{sorted(self.released)[0]} was replaced without keeping the weight as given")
        originals = {name: self.state[name].to(self.device) for name in self.replaced if name in self.state}
        with torch.no_grad():
            found = [self._call(originals, self.inputs[sample]) for sample in samples]
        del originals
        self._release_originals()
        return found

    def divergence(
        self, weights: Mapping[str, torch.Tensor], sample: int, reference: Any = None
    ) -> torch.Tensor:
        if reference is None:
            (reference,) = self.references([sample])  # checks the program whole
        else:
            self._check_whole()
        inputs = self.inputs[sample]
        placed: dict[str, torch.Tensor] = {}
        for name, targets in self._targets(tuple(weights)).items():
            for target in targets:
                placed[target] = weights[name].to(self.device, self._parameter_dtype(target))
        # the program's own parameters take no gradient (a file's keep `requires_grad`): only the
        # given weights' reach anything, and none is kept where none of theirs reaches the output
        every = dict(self.gm.named_parameters(remove_duplicate=False))
        given = {id(every[target]) for target in placed if target in every}  # a tied one: under any name
        fixed = {name: p.detach() for name, p in self.gm.named_parameters() if id(p) not in given}
        return output_divergence(self._call({**fixed, **placed}, inputs), reference, inputs)

    def _release_originals(self) -> None:
        """The replaced weights as given, read by the reference passes only, leave the resident
        set until the next step's reference passes read them again from the page cache: a tuning
        step's forward and backward passes do not hold them beside the leaves and their gradients
        (SmolLM2's fp32 weights, 0.54 GB). Only where they are worth a walk over the mappings."""
        from coreai_opt._memory import RELEASE_EVERY, release_clean_mapped

        originals = [self.state[name] for name in self.replaced if name in self.state]
        if sum(t.numel() * t.element_size() for t in originals) >= RELEASE_EVERY:
            release_clean_mapped([t.data_ptr() for t in originals if t.device.type == "cpu" and t.numel()])

    def _call(self, tensors: Mapping[str, torch.Tensor], inputs: tuple[Any, ...]) -> Any:
        from torch.func import functional_call

        return functional_call(self.gm, dict(tensors), inputs)

    def _parameter_dtype(self, name: str) -> torch.dtype:
        *path, leaf = name.split(".")
        return getattr(self.gm.get_submodule(".".join(path)), leaf).dtype

    def _targets(self, names: tuple[str, ...]) -> dict[str, list[str]]:
        """Where this program computes with each named weight: under its own name where it holds
        one, and through an equal twin that is multiplied where the name is only looked up (a
        converted program's one constant for a tied embedding and head, `twins_of`) - unless that
        twin is named itself."""
        if self._tuned_targets is None or self._tuned_targets[0] != names:
            found = readers(self.gm)
            multiplied = {r.name for r in found if r.activation is not None}
            lacking = [name for name in names if name not in multiplied]
            twins = twins_of(self.gm, found, lacking, self.state)
            targets = {name: [name] if self._holds(name) else [] for name in names}
            for name, twin in twins.items():
                if twin not in targets:
                    targets[name].append(twin)
            self._tuned_targets = (names, targets)
        return self._tuned_targets[1]

    def _holds(self, name: str) -> bool:
        """Whether the program has a parameter or buffer of that name (a converted program's
        weights share the names; its other constants need not)."""
        *path, leaf = name.split(".")
        try:
            owner = self.gm.get_submodule(".".join(path))
        except AttributeError:
            return False
        return leaf in owner._parameters or leaf in owner._buffers

    # ----- the on-disk cache (`_cache`) ---------------------------------------------------------

    def checkpoints(self, identity: Callable[[], bytes]) -> CacheCheckpoints | None:
        """The cache's checkpoints of a pass on this program as it is now (every weight replaced so
        far included) and these samples, on this device and torch, keyed by them and `identity()`;
        None where this calibration keeps no cache."""
        import hashlib

        import torch

        if not self.cache:
            return None
        digest = hashlib.sha256(b"coreopt checkpoint 1\0")
        where = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else self.device.type
        parts = (self.fingerprint(), self.samples.digest(), str(self.seed), str(self.fast_gradients), where,
                 torch.__version__)  # fmt: skip
        for part in parts:
            digest.update(part.encode() + b"\0")
        digest.update(identity())
        return CacheCheckpoints(digest.hexdigest())

    def fingerprint(self) -> str:
        """What identifies the program as it is now: its code and every state tensor's bytes."""
        if self._fingerprint is None:
            self._fingerprint = program_fingerprint(self.gm)
        return self._fingerprint

    def _key(self, names: Sequence[str], needs: Needs) -> str:
        return statistics_key(
            self.fingerprint(), self.samples.digest(), needs, self.seed, names, fast=self.fast_gradients
        )
