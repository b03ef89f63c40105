"""Statistics of a `torch.export` program's weights on calibration samples, taken where each weight
is read.

The program runs in PyTorch (`ep.module()`, its compressed weights decoded once) under an FX
interpreter that, at every op reading a weight we gather for (the one ATen table: `_aten.WEIGHT_OPS`,
looking through views), accumulates what the op's activation operand holds: the second moment of
each input channel, or the input Gram matrix (a convolution's over its unfolded patches), in
float64. Squared gradients of a loss per weight element come from a backward pass: next-token
cross entropy for a language model (int ids in, [batch, tokens, vocabulary] logits out), else the
output's squared error, estimated with one seeded random sign vector per sample (Hutchinson: its
expectation is the diagonal of J^T J). Layer-by-layer runs (`sequential`) evaluate the graph in
segments between weight readers, sample by sample within a segment, pausing at each reader with
its activation for every sample, so a weight's statistics can be taken, the weight replaced by its
compressed form, and the rest of the program run on from there.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import stat
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coreai_opt._aten import state_only
from coreai_opt._cache import cache_folder_for, plain_name, user_cache
from coreai_opt.io import read_json_object
from coreai_opt.weights import Consumer, Needs, Statistics

from ._graph import call, state_value
from ._samples import Samples

if TYPE_CHECKING:
    import torch
    from torch.export import ExportedProgram
    from torch.fx import GraphModule, Node

CACHE_ENV = "COREOPT_CACHE"
_WITHOUT = "statistics are taken afresh and not stored"  # what a refused cache folder costs
_SQUARES_FILE = re.compile(r"\d{5,}\.f32")  # a Fisher pass's file a weight: what `_squares_file` makes
_JSON_LIMIT = 64 << 20  # a cache's JSON entry (rows, a Fisher index): a few hundred bytes a weight
# Raised when what statistics a name gets changes (3: an embedding's twin head, `_twins`).
_STATISTICS_VERSION = "3"


@dataclass(frozen=True)
class Reader:
    """An op that reads a weight: the weight's name, how the op reads it, and where its activation is."""

    node: Node
    name: str
    consumer: Consumer
    activation: int | None  # operand index (None: an embedding lookup, which has no activation)


def readers(gm: GraphModule) -> list[Reader]:
    """Every op of `gm` that reads a parameter or buffer as its weight, in graph order."""
    from coreai_opt._aten import PASS_THROUGH, WEIGHT_OPS, packet

    found = []
    for node in gm.graph.nodes:
        op = WEIGHT_OPS.get(packet(node)) if node.op == "call_function" else None
        if op is None or len(node.args) <= op.weight:
            continue
        source = node.args[op.weight]
        while getattr(source, "op", None) == "call_function" and packet(source) in PASS_THROUGH:
            source = source.args[0]
        if getattr(source, "op", None) != "get_attr":
            continue
        others = [i for i in op.activations if i != op.weight]
        found.append(Reader(node, str(source.target), op.consumer, others[0] if others else None))
    return found


def _rows(activation: torch.Tensor, reader: Reader) -> torch.Tensor:
    """The activation as [rows, input channels] for moments (a convolution: channels on axis 1)."""
    if reader.consumer is Consumer.CONV:
        return activation.movedim(1, -1).reshape(-1, activation.shape[1])
    return activation.reshape(-1, activation.shape[-1])


def _patches(activation: torch.Tensor, node: Node) -> torch.Tensor:
    """A 1-D or 2-D convolution's input as [positions, C_in * kernel] (groups of 1), the rows the
    weight reshaped to [C_out, C_in * kernel] multiplies."""
    import torch

    weight = node.args[1].meta["val"]  # type: ignore[union-attr]
    kernel = tuple(weight.shape[2:])
    stride, padding, dilation = (
        tuple(node.args[i]) if len(node.args) > i else (1,) * len(kernel) for i in (3, 4, 5)
    )  # type: ignore[arg-type]
    x = activation if len(kernel) == 2 else activation.unsqueeze(-1)
    if len(kernel) == 1:
        kernel, stride, padding, dilation = (*kernel, 1), (*stride, 1), (*padding, 0), (*dilation, 1)
    unfolded = torch.nn.functional.unfold(x, kernel, dilation=dilation, padding=padding, stride=stride)
    return unfolded.transpose(1, 2).reshape(-1, unfolded.shape[1])


class _Sums:
    """Running sums of one weight's statistics."""

    def __init__(self) -> None:
        self.rows = 0
        self.moments: torch.Tensor | None = None
        self.gram: torch.Tensor | None = None

    def add(self, activation: torch.Tensor, reader: Reader, needs: Needs) -> None:
        if needs is Needs.INPUT_GRAM and reader.consumer is Consumer.CONV:
            groups = reader.node.args[8] if len(reader.node.args) > 8 else 1
            rows = (
                _patches(activation.float(), reader.node)
                if groups == 1
                else _rows(activation.float(), reader)
            )
        else:
            rows = _rows(activation.float(), reader)
        self.rows += rows.shape[0]
        squares = (rows.double() ** 2).sum(0)
        self.moments = squares if self.moments is None else self.moments + squares
        if needs is Needs.INPUT_GRAM:
            gram = (rows.T @ rows).double()  # float32 products, float64 sums across batches
            self.gram = gram if self.gram is None else self.gram + gram

    def mean(self) -> Statistics:
        rows = max(self.rows, 1)
        return Statistics(
            self.rows,
            moments=None if self.moments is None else self.moments / rows,
            gram=None if self.gram is None else self.gram / rows,
        )


def _first_readers(
    gm: GraphModule, names: Sequence[str], needs: Needs, state: Mapping[str, torch.Tensor] | None = None
) -> dict[str, Reader]:
    """Each named weight's reader to take statistics at: its first, or for moments and Gram its
    first that has an activation (a tied embedding is also the output head's weight) - or, where
    none has one, its twin's (`_twins`)."""
    found = readers(gm)
    chosen: dict[str, Reader] = {}
    wanted = set(names)
    for reader in found:
        if reader.name not in wanted:
            continue
        better = reader.activation is not None and chosen.get(reader.name, reader).activation is None
        if reader.name not in chosen or (needs is not Needs.GRADIENT_SQUARES and better):
            chosen[reader.name] = reader
    if needs is Needs.GRADIENT_SQUARES:
        return chosen
    lacking = [name for name in names if chosen.get(name) is None or chosen[name].activation is None]
    for name, twin in _twins(gm, found, lacking, state or {}).items():
        reader = next(r for r in found if r.name == twin and r.activation is not None)
        chosen[name] = dataclasses.replace(reader, name=name)
    return chosen


def _twins(
    gm: GraphModule, found: list[Reader], lacking: Sequence[str], state: Mapping[str, torch.Tensor]
) -> dict[str, str]:
    """For each weight in `lacking` (no reader gives it an activation), another weight of this
    program with the same shape, dtype and values that a reader with an activation multiplies:
    an embedding tied to the output head but exported as two tensors (embed_tokens, lm_head) is
    one constant once converted, and that constant's statistics are the head's. Values come from
    the exported program's state (`state`: the unlifted module keeps one of two tied tensors)."""
    import torch

    multiplied = list(dict.fromkeys(r.name for r in found if r.activation is not None))
    twins: dict[str, str] = {}
    for name in lacking:
        value = _state_tensor(gm, name, state)
        if value is None:
            continue
        for other in multiplied:
            candidate = _state_tensor(gm, other, state)
            if (candidate is not None and candidate.shape == value.shape and candidate.dtype == value.dtype
                    and torch.equal(candidate, value)):  # fmt: skip
                twins[name] = other
                break
    return twins


def _state_tensor(gm: GraphModule, name: str, state: Mapping[str, torch.Tensor]) -> torch.Tensor | None:
    """The parameter or buffer of that name as exported, or as the module holds it, or None."""
    if name in state:
        return state[name].detach()
    *path, leaf = name.split(".")
    try:
        owner = gm.get_submodule(".".join(path))
    except AttributeError:
        return None
    value = owner._parameters.get(leaf, owner._buffers.get(leaf))
    return None if value is None else value.detach()


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
        self.gm = runnable(program)
        _place_factories(self.gm, self.device)
        self.gm.to(self.device)
        with torch.no_grad():
            self.inputs = [tuple(t.to(self.device) for t in inputs) for _, inputs in samples.inputs(program)]
        if not self.inputs:
            raise ValueError(f"{samples.describe()} gave no calibration samples")
        self.cache = cache
        self.seed = seed
        self.fast_gradients = not exact_gradients and _bfloat16_products(self.device)
        self.replaced: dict[str, torch.Tensor] = {}
        self.released: set[str] = set()  # replaced weights whose values as given were let go
        self.spent: set[str] = set()  # released weights a final pass let go of, replacement and all
        self.closed = False  # final statistics were taken: no program is held any more
        self._lookup_twins: set[str] | None = None
        self._fingerprint: str | None = None
        self._tuned_targets: tuple[tuple[str, ...], dict[str, list[str]]] | None = None

    # ----- the Calibration protocol ------------------------------------------------------------

    def statistics(self, names: Sequence[str], needs: Needs, *, final: bool = False) -> dict[str, Statistics]:
        self._check_whole()
        if needs is Needs.GRADIENT_SQUARES:
            found = dict(self._fisher(names))
        else:
            key = self._key(names, needs)
            loaded = self._load(key, names) if self.cache else None
            found = loaded if loaded is not None else self._activations(names, needs)
            if self.cache and loaded is None:
                self._store(key, found)
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
        yield from _LayerByLayer(self, names, needs, final).run()

    def _fisher(self, names: Sequence[str], *, final: bool = False) -> Iterator[tuple[str, Statistics]]:
        """Each weight's squared gradients as the segmented backward pass (`_fisher`) finishes
        it, of the program as it was when the pass began; `final`: a weight replaced without its
        original is let go once handed over, and the program once all are."""
        from ._fisher import SegmentedBackward

        held = [name for name in names if self._holds(name)]
        for name in names:
            if name not in held:
                yield name, Statistics(0)
        store = _FisherStore(self._key(names, Needs.GRADIENT_SQUARES)) if self.cache else None
        found = store.load(held, self.device) if store is not None else None
        if found is None:
            import torch

            generator = torch.Generator().manual_seed(self.seed)  # on the CPU: the same draws on any device
            passing = SegmentedBackward(self.gm, held, fast=self.fast_gradients).run(
                self.inputs, lambda output, inputs: _loss(output, inputs, generator)
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
        """The multiplied weights equal to a weight that is only looked up (`_twins`), found once
        from the weights as given - before any is let go."""
        if self._lookup_twins is None:
            found = readers(self.gm)
            multiplied = {r.name for r in found if r.activation is not None}
            lacking = [name for name in self.state if name not in multiplied]
            self._lookup_twins = set(_twins(self.gm, found, lacking, self.state).values())
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

    def divergence(self, weights: Mapping[str, torch.Tensor], sample: int) -> torch.Tensor:
        import torch

        self._check_whole()
        if self.released:
            raise RuntimeError(f"{sorted(self.released)[0]} was replaced without keeping the weight as given")
        inputs = self.inputs[sample]
        originals = {name: self.state[name].to(self.device) for name in self.replaced if name in self.state}
        with torch.no_grad():
            reference = self._call(originals, inputs)
        placed: dict[str, torch.Tensor] = {}
        for name, targets in self._targets(tuple(weights)).items():
            for target in targets:
                placed[target] = weights[name].to(self.device, self._parameter_dtype(target))
        return _divergence(self._call(placed, inputs), reference, inputs)

    def _call(self, tensors: Mapping[str, torch.Tensor], inputs: tuple[Any, ...]) -> Any:
        from torch.func import functional_call

        return functional_call(self.gm, dict(tensors), inputs)

    def _parameter_dtype(self, name: str) -> torch.dtype:
        *path, leaf = name.split(".")
        return getattr(self.gm.get_submodule(".".join(path)), leaf).dtype

    def _targets(self, names: tuple[str, ...]) -> dict[str, list[str]]:
        """Where this program computes with each named weight: under its own name where it holds
        one, and through an equal twin that is multiplied where the name is only looked up (a
        converted program's one constant for a tied embedding and head, `_twins`) - unless that
        twin is named itself."""
        if self._tuned_targets is None or self._tuned_targets[0] != names:
            found = readers(self.gm)
            multiplied = {r.name for r in found if r.activation is not None}
            lacking = [name for name in names if name not in multiplied]
            twins = _twins(self.gm, found, lacking, self.state)
            targets = {name: [name] if self._holds(name) else [] for name in names}
            for name, twin in twins.items():
                if twin not in targets:
                    targets[name].append(twin)
            self._tuned_targets = (names, targets)
        return self._tuned_targets[1]

    # ----- one pass per sample -----------------------------------------------------------------

    def _activations(self, names: Sequence[str], needs: Needs) -> dict[str, Statistics]:
        import torch

        chosen = _first_readers(self.gm, names, needs, self.state)
        by_node: dict[Node, list[Reader]] = {}
        for reader in chosen.values():
            by_node.setdefault(reader.node, []).append(reader)
        sums = {name: _Sums() for name in names}
        recorder = _Recording(self.gm, by_node, sums, needs)
        with torch.no_grad():
            for inputs in self.inputs:
                recorder.run(*inputs)
        return {name: sums[name].mean() for name in names}

    def _holds(self, name: str) -> bool:
        """Whether the program has a parameter or buffer of that name (a converted program's
        weights share the names; its other constants need not)."""
        *path, leaf = name.split(".")
        try:
            owner = self.gm.get_submodule(".".join(path))
        except AttributeError:
            return False
        return leaf in owner._parameters or leaf in owner._buffers

    # ----- the on-disk cache -------------------------------------------------------------------

    def fingerprint(self) -> str:
        """What identifies the program as it is now: its code and every state tensor's bytes."""
        if self._fingerprint is None:
            digest = hashlib.sha256(self.gm.code.encode())
            for name, tensor in sorted(
                {**dict(self.gm.named_parameters()), **dict(self.gm.named_buffers())}.items()
            ):
                digest.update(name.encode())
                digest.update(str(tensor.dtype).encode())
                digest.update(
                    tensor.detach().contiguous().cpu().view(-1).view(_bytes_dtype()).numpy().tobytes()
                )
            self._fingerprint = digest.hexdigest()
        return self._fingerprint

    def _key(self, names: Sequence[str], needs: Needs) -> str:
        parts = [_STATISTICS_VERSION, self.fingerprint(), self.samples.digest(), needs.value, str(self.seed),
                 *sorted(names)]  # fmt: skip
        if needs is Needs.GRADIENT_SQUARES and self.fast_gradients:
            parts.append("bfloat16 products")
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]

    def _load(self, key: str, names: Sequence[str]) -> dict[str, Statistics] | None:
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        folder = _usable_folder(create=False)
        if folder is None or not (folder / f"{key}.safetensors").is_file():
            return None
        try:
            tensors = load_file(str(folder / f"{key}.safetensors"))  # each tensor's bytes fit its shape
            rows = read_json_object(folder / f"{key}.json", limit=_JSON_LIMIT)
            if rows is None:
                return None
            here = {key: value.to(self.device) for key, value in tensors.items()}
            return {
                name: Statistics(
                    int(rows[name]),
                    here.get(f"{name}/moments"),
                    here.get(f"{name}/gram"),
                    here.get(f"{name}/gradient_squares"),
                )
                for name in names
            }
        except (OSError, ValueError, KeyError, TypeError, SafetensorError):
            return None  # a damaged cache entry is recomputed

    def _store(self, key: str, found: dict[str, Statistics]) -> None:
        from safetensors.torch import save_file

        from coreai_opt.io import ModelFileError, write_atomically

        tensors = {}
        for name, statistics in found.items():
            for field in ("moments", "gram", "gradient_squares"):
                value = getattr(statistics, field)
                if value is not None:
                    tensors[f"{name}/{field}"] = value.contiguous().cpu()
        try:
            folder = _usable_folder(create=True)
            if folder is None:
                return
            write_atomically(folder / f"{key}.safetensors", lambda tmp: save_file(tensors, str(tmp)))
            text = json.dumps({name: s.rows for name, s in found.items()})
            write_atomically(folder / f"{key}.json", lambda tmp: tmp.write_text(text))
        except (OSError, ModelFileError):
            pass  # a cache that cannot be written only costs time


class _FisherStore:
    """One Fisher pass's squared gradients on disk, a file a weight, so they stream in and out as
    the pass hands them over: `<key>.fisher/` holds each weight's float32 values as raw bytes
    (written from the tensor's own memory and read into one array: a copy through a serialiser
    would be another 0.26 GB at a 1B model's head) and `index.json` (the weights in the pass's
    order with their shapes and rows), written into a temporary sibling renamed into place once
    the pass is done."""

    def __init__(self, key: str) -> None:
        self.name = f"{key}.fisher"

    def load(self, names: Sequence[str], device: torch.device) -> Iterator[tuple[str, Statistics]] | None:
        """The stored weights' statistics, read one at a time; None unless all of `names` are
        stored whole (a damaged entry is recomputed)."""
        root = _usable_folder(create=False)
        folder = cache_folder_for(root / self.name, create=False, without=_WITHOUT) if root else None
        if folder is None:
            return None
        index = read_json_object(folder / "index.json", limit=_JSON_LIMIT)
        entries = _fisher_entries(index) if index is not None else None
        try:
            if entries is None or sorted(entry[0] for entry in entries) != sorted(names):
                return None
            for _, file, _, shape in entries:
                found = os.lstat(folder / file)
                if not stat.S_ISREG(found.st_mode) or found.st_size != 4 * math.prod(shape):
                    return None
        except (OSError, ValueError):
            return None
        return self._read(folder, entries, device)

    def _read(
        self, folder: Path, entries: list[tuple[str, str, int, list[int]]], device: torch.device
    ) -> Iterator[tuple[str, Statistics]]:
        import numpy as np
        import torch

        for name, file, rows, shape in entries:
            count = math.prod(shape)
            values = np.fromfile(folder / file, dtype="<f4", count=count)
            if values.size != count:
                raise OSError(f"{folder / file} was cut short while being read")
            yield name, Statistics(rows, gradient_squares=torch.from_numpy(values.reshape(shape)).to(device))

    def saving(self, passing: Iterator[tuple[str, Statistics]]) -> Iterator[tuple[str, Statistics]]:
        """`passing`, each weight written as it goes by; stored once the pass is done (a cache
        that cannot be written only costs time)."""
        import shutil
        import tempfile

        try:
            root = _usable_folder(create=True)
            temporary = Path(tempfile.mkdtemp(prefix=f".{self.name}-", dir=root)) if root else None
        except OSError:
            root = temporary = None
        if root is None or temporary is None:  # not ours alone, or not writable: only costs time
            yield from passing
            return
        entries: list[list[Any]] | None = []
        try:
            for name, statistics in passing:
                squares = statistics.gradient_squares
                if entries is not None and squares is not None:
                    file = _squares_file(len(entries))
                    try:
                        squares.float().contiguous().cpu().numpy().astype("<f4", copy=False).tofile(
                            temporary / file
                        )
                        entries.append([name, file, statistics.rows, list(squares.shape)])
                    except OSError:
                        entries = None
                yield name, statistics
            if entries is not None:
                try:
                    (temporary / "index.json").write_text(json.dumps({"weights": entries}))
                    temporary.rename(root / self.name)
                except OSError:
                    pass  # another run stored the same pass first, or the disk is full
        finally:
            shutil.rmtree(temporary, ignore_errors=True)


def _fisher_entries(index: dict[str, Any]) -> list[tuple[str, str, int, list[int]]] | None:
    """The Fisher index's entries, each [name, file, rows, shape] as `_FisherStore` writes them;
    None (a miss) for anything else - a file named by a path, above all, is never read."""
    entries = index.get("weights")
    if not isinstance(entries, list):
        return None
    found = []
    for entry in entries:
        if not isinstance(entry, list) or len(entry) != 4:
            return None
        name, file, rows, shape = entry
        file = plain_name(file, _SQUARES_FILE)
        if not isinstance(name, str) or file is None or not _count(rows):
            return None
        if not isinstance(shape, list) or not all(_count(n) for n in shape):
            return None
        found.append((name, file, rows, shape))
    return found


def _count(value: object) -> bool:
    """A whole number of rows or elements (JSON's true is no count)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _squares_file(number: int) -> str:
    """The name of a Fisher pass's `number`th weight's file, as `_SQUARES_FILE` reads it back (an
    index may name nothing else)."""
    name = f"{number:05d}.f32"
    if plain_name(name, _SQUARES_FILE) is None:
        raise ValueError(f"{name} is no name a Fisher index may hold")
    return name


def _usable_folder(*, create: bool) -> Path | None:
    """The cache folder when it keeps the rule of every cache folder (`coreai_opt._cache`), else
    None: statistics another user planted would shape the compressed model."""
    return cache_folder_for(cache_folder(), create=create, without=_WITHOUT)


def cache_folder() -> Path:
    """Where calibration statistics are kept between runs (`COREOPT_CACHE`, else ~/.cache/coreopt)."""
    base = os.environ.get(CACHE_ENV)
    return Path(base) if base else user_cache("calibration")


def _bytes_dtype() -> Any:
    import torch

    return torch.uint8


def _loss(output: Any, inputs: tuple[Any, ...], generator: Any) -> tuple[torch.Tensor, int]:
    """(loss, rows): next-token cross entropy for a language model, else the output's squared
    error as one random-sign projection of it."""
    import torch

    leaves = _float_leaves(output)
    ids = _language_ids(leaves, inputs)
    first = leaves[0]
    if ids is not None:
        logits = first[:, :-1].reshape(-1, first.shape[-1]).float()
        targets = ids[:, 1:].reshape(-1)
        return torch.nn.functional.cross_entropy(logits, targets, reduction="sum"), targets.numel()
    loss = sum(
        (leaf.float() * (torch.randint(0, 2, leaf.shape, generator=generator) * 2 - 1).to(leaf.device)).sum()
        for leaf in leaves
    )
    return loss, sum(leaf.numel() for leaf in leaves)  # type: ignore[return-value]


def _float_leaves(output: Any) -> list[torch.Tensor]:
    import torch

    return [
        t
        for t in torch.utils._pytree.tree_leaves(output)
        if isinstance(t, torch.Tensor) and t.is_floating_point()
    ]


def _language_ids(leaves: list[torch.Tensor], inputs: tuple[Any, ...]) -> torch.Tensor | None:
    """The [batch, tokens] ids of a language model's sample (its first output is logits
    [batch, tokens, vocabulary] over a vocabulary that holds every id), or None for any other
    model - a token tagger's [batch, tokens, labels] scores included: its labels are not its ids."""
    ids = next((t for t in inputs if not t.is_floating_point() and t.dim() == 2), None)
    first = leaves[0]
    if ids is None or first.dim() != 3 or first.shape[:2] != ids.shape or first.shape[1] < 2:
        return None
    return ids if int(ids.min()) >= 0 and int(ids.max()) < first.shape[-1] else None


def _divergence(output: Any, reference: Any, inputs: tuple[Any, ...]) -> torch.Tensor:
    """A language model's mean next-token KL divergence from the reference's distribution, or
    for any other model each float output's squared error relative to its reference's energy."""
    import torch

    leaves, held = _float_leaves(output), _float_leaves(reference)
    if _language_ids(held, inputs) is not None:
        logp = torch.log_softmax(held[0].float(), dim=-1)
        logq = torch.log_softmax(leaves[0].float(), dim=-1)
        return (logp.exp() * (logp - logq)).sum(-1).mean()
    return sum(
        ((leaf.float() - ref.float()) ** 2).mean() / (ref.float() ** 2).mean().clamp_min(1e-30)
        for leaf, ref in zip(leaves, held, strict=True)
    )  # type: ignore[return-value]


class _Recording:
    """Runs the module on one sample, adding each chosen reader's activation to its sums."""

    def __init__(
        self, gm: GraphModule, by_node: dict[Node, list[Reader]], sums: dict[str, _Sums], needs: Needs
    ) -> None:
        from torch.fx import Interpreter

        outer = self

        class Interp(Interpreter):
            def run_node(self, n: Node) -> Any:
                for reader in outer.by_node.get(n, ()):
                    if reader.activation is not None:
                        args, _ = self.fetch_args_kwargs_from_env(n)
                        outer.sums[reader.name].add(args[reader.activation], reader, outer.needs)
                return super().run_node(n)

        self.interpreter = Interp(gm)
        self.by_node, self.sums, self.needs = by_node, sums, needs

    def run(self, *inputs: Any) -> Any:
        return self.interpreter.run(*inputs)


class _LayerByLayer:
    """The program evaluated in segments that end at weight readers, pausing at each: the caller
    takes the statistics, replaces the weight, and the run goes on with it. Within a segment the
    samples go one at a time through all of its nodes, so only values that outlive the segment
    (a reader's activation, the residual stream) are held for every sample at once - never an
    attention score matrix per sample (~4 GiB at 1.1B on 128 x 512 tokens). Each op sees the
    same operands as in a node-by-node run, so the statistics are the same bit for bit - but for
    16-bit matrix products on the CPU, taken in float32 (`_products`: the same values up to the
    order of their sums, 3-18x faster than PyTorch's fp16 kernels there)."""

    def __init__(
        self, calibration: ProgramCalibration, names: Sequence[str], needs: Needs, final: bool = False
    ) -> None:
        self.calibration = calibration
        self.gm = calibration.gm
        self.needs = needs
        self.final = final
        self.chosen = _first_readers(self.gm, names, needs, calibration.state)
        self.pending: dict[Node, list[Reader]] = {}
        for reader in self.chosen.values():
            self.pending.setdefault(reader.node, []).append(reader)
        missing = [name for name in names if name not in self.chosen]
        self.unread = missing  # weights no op reads: their statistics are empty
        self.held: dict[Node, list[Any]] = {}

    def run(self) -> Iterator[tuple[str, Statistics]]:
        import torch

        graph = self.gm.graph
        state = state_only(graph)
        order = {node: index for index, node in enumerate(graph.nodes)}
        last_use: dict[Node, int] = {}
        for node in graph.nodes:
            for used in node.all_input_nodes:
                last_use[used] = order[node]
        values = self.held  # every sample's value of each node read after the segment run last
        fixed: dict[Node, Any] = {}  # state-only nodes: one value, recomputed after a replace
        placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        for position, node in enumerate(placeholders):
            values[node] = [inputs[position] for inputs in self.calibration.inputs]
        for name in self.unread:
            yield name, Statistics(0)
        passing = _last_reads(graph, state, order) if self.final else []
        segment: list[Node] = []
        with torch.no_grad():
            for node in graph.nodes:
                if node.op in ("placeholder", "output") or node in state:
                    continue  # state: computed on demand from the weights as they are now
                if node in self.pending:
                    self._run_segment(segment, order[node], values, fixed, state, last_use, order)
                    segment = []
                    fixed.clear()  # views of weights the segment read: recomputed where needed
                    while passing and passing[-1][0] < order[node]:  # read for the last time: let go
                        name = passing.pop()[1]
                        if name in self.calibration.released and name in self.calibration.replaced:
                            self.calibration._let_go(name)
                    for reader in self.pending.pop(node):
                        sums = _Sums()
                        if reader.activation is not None:
                            for activation in self._operand(
                                node.args[reader.activation], values, fixed, state
                            ):
                                sums.add(activation, reader, self.needs)
                        yield reader.name, sums.mean()
                        fixed.clear()  # the caller replaced the weight: views of it are stale
                    if not self.pending:
                        return  # every weight has its statistics: the rest of the program is not needed
                segment.append(node)

    def _run_segment(
        self, segment: list[Node], pause: int, values: dict[Node, list[Any]], fixed: dict[Node, Any],
        state: set[Node], last_use: dict[Node, int], order: dict[Node, int],
    ) -> None:  # fmt: skip
        """Evaluate `segment` sample by sample, keeping for every sample the values read at or after
        the node at index `pause`, and dropping held values the segment read for the last time."""
        kept = [node for node in segment if last_use.get(node, -1) >= pause]
        outside = {used for node in segment for used in node.all_input_nodes if used in values}
        for node in kept:
            values[node] = []
        for k in range(len(self.calibration.inputs)):
            local: dict[Node, Any] = {}
            for node in segment:
                local[node] = self._evaluate(node, k, values, local, fixed, state)
                for used in node.all_input_nodes:
                    if used in local and last_use.get(used) == order[node] and used not in kept:
                        del local[used]
            for node in kept:
                values[node].append(local[node])
        for used in outside:
            if last_use.get(used, -1) < pause:
                del values[used]

    def _operand(
        self, arg: Any, values: dict[Node, list[Any]], fixed: dict[Node, Any], state: set[Node]
    ) -> list[Any]:
        from torch.fx import Node as FxNode

        if isinstance(arg, FxNode):
            if arg in state:
                return [state_value(self.gm, arg, fixed)] * len(self.calibration.inputs)
            return values[arg]
        return [arg] * len(self.calibration.inputs)

    def _evaluate(
        self, node: Node, k: int, values: dict[Node, list[Any]], local: dict[Node, Any], fixed: dict[Node, Any],
        state: set[Node],
    ) -> Any:  # fmt: skip
        """`node` on sample `k`: operands from this sample's segment, the held values, or state."""
        from torch.fx.node import map_arg

        def pick(n: Node) -> Any:
            if n in local:
                return local[n]
            return state_value(self.gm, n, fixed) if n in state else values[n][k]

        return call(self.gm, node, map_arg(node.args, pick), map_arg(node.kwargs, pick), "layer by layer")


def _last_reads(graph: Any, state: set[Node], order: dict[Node, int]) -> list[tuple[int, str]]:
    """(index of the last node that reads it, through weight-only nodes such as a transpose,
    name) of every weight the graph gets, the last read first (a list to pop from the end)."""
    last: dict[str, int] = {}
    for node in graph.nodes:
        if node.op != "get_attr":
            continue
        reached, frontier = -1, [node]
        while frontier:
            for user in frontier.pop().users:
                if user in state:
                    frontier.append(user)
                else:
                    reached = max(reached, order[user])
        name = str(node.target)
        last[name] = max(last.get(name, -1), reached)
    return sorted(((index, name) for name, index in last.items()), reverse=True)


def _bfloat16_products(device: torch.device) -> bool:
    """Whether the Fisher pass takes its weights' products in bfloat16 here (`_fisher`, fast
    gradients): on a CPU with bfloat16 instructions (`coreai_opt._cpu.native_bfloat16`). A GPU keeps
    the program's dtypes."""
    from coreai_opt._cpu import native_bfloat16

    return device.type == "cpu" and native_bfloat16()


def _place_factories(gm: GraphModule, device: torch.device) -> None:
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
