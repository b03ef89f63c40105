"""How much each weight's compression alone costs on a text: the KL divergence from the
reference's next-token distribution, the perplexity increase and the bytes it saves, measured by
swapping the decoded weight into the program in memory (no file written), one weight at a time.

A weight only changes what comes after its first reader, so each window runs the reference once,
keeping the values alive at every weight's first reader, and each trial resumes from there: on a
decoder, half a forward pass per weight on average. Beside the measurement, a cheap estimate -
the second-order Taylor term 1/2 sum(F * dW^2) with F the squared gradients of the next-token
loss on the same text (the calibration room's Fisher) - and the rank correlation between them.

On a CPU with bfloat16 instructions a trial's matrix products are the reference's plus products
of the differences in bfloat16, and the head's change is scored without forming the logits
(`_deltas`, `_scores`): SmolLM2-135M's 211 weights on 1,024 tokens 284 -> 110 s on 2 cores (8,192
tokens: 14 minutes), KLs within 0.3% of the float32 ones (Spearman 0.99999). `exact_products`
keeps the program's own products.
"""

from __future__ import annotations

import gc
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from coreai_opt._memory import trim_heap
from coreai_opt.io import ModelFileError, ProgramRunError, load_pt2, require_existing, running

from ._language import Counter, Progress
from ._tokens import Windows, token_stream, window_batches

if TYPE_CHECKING:
    import torch
    from torch.fx import GraphModule, Node

    from ._scores import Reference


@dataclass
class WeightSensitivity:
    name: str
    shape: tuple[int, ...]
    bytes_before: int
    bytes_after: int
    kl_mean: float = 0.0
    perplexity_increase: float = 0.0
    top1: float = 1.0
    estimate: float | None = None  # 1/2 sum(F dW^2) per token

    @property
    def bytes_saved(self) -> int:
        return self.bytes_before - self.bytes_after

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "shape": list(self.shape), "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after, "bytes_saved": self.bytes_saved, "kl_mean": self.kl_mean,
            "perplexity_increase": self.perplexity_increase, "top1": self.top1, "estimate": self.estimate,
        }  # fmt: skip


@dataclass
class SensitivityResult:
    program: Path
    config: dict[str, Any]
    source: str
    windows: Windows
    reference_perplexity: float
    weights: list[WeightSensitivity]  # most sensitive (largest KL) first
    skipped: list[dict[str, Any]] = field(default_factory=list)
    rank_correlation: float | None = None  # Spearman, measured KL vs estimate
    seconds: float = 0.0
    estimate_seconds: float = 0.0
    products: str = "exact"  # or "bfloat16 differences" (see the module)

    def to_dict(self) -> dict[str, Any]:
        w = self.windows
        return {
            "program": str(self.program), "config": self.config, "source": self.source, "tokens": w.tokens,
            "window": w.length, "windows": len(w.starts), "scored_tokens": w.scored,
            "reference_perplexity": self.reference_perplexity, "rank_correlation": self.rank_correlation,
            "seconds": round(self.seconds, 3), "estimate_seconds": round(self.estimate_seconds, 3),
            "products": self.products,
            "weights": [x.to_dict() for x in self.weights], "skipped": self.skipped,
        }  # fmt: skip


def weight_sensitivity(
    program: Path | str,
    config: Any,
    *,
    text: Path | str | None = None,
    tokens: Path | str | None = None,
    tokenizer: Path | str | None = None,
    max_tokens: int | None = None,
    estimate: bool = True,
    exact_products: bool = False,
    trust_pickle: bool = False,
    device: str | None = None,
    progress: Progress | None = None,
) -> SensitivityResult:
    """Each weight `config` would compress, measured alone (see the module); windows of the
    program's length that do not overlap. `estimate` (text only) adds the Fisher estimate.
    `exact_products` takes every trial's products, and the estimate's gradients, in the
    program's own dtypes (slower; the default differs by ~0.1-0.3% of a KL). `device`: where the
    program's runs, the trials and the estimate's gradients take place (a torch device; default
    the CPU); the weights are encoded on the host, the scores taken where the logits are."""
    from coreai_opt._export import checked_device
    from coreai_opt.compression import trial_encodings

    start = time.perf_counter()
    path = Path(program)
    device = checked_device(device)
    require_existing(path)
    ids, source, found = token_stream(path, text, tokens, tokenizer, max_tokens)
    ep = load_pt2(path, trust_pickle=trust_pickle)
    with running(path):
        # a language model, before any encoding
        runner = _Resumable(ep, path, _differences(exact_products), device)
        trials, skipped = _trials(ep, config, trial_encodings)
        windows = Windows(len(ids), runner.length, runner.length)
        batches = -(-len(windows.starts) // runner.batch)
        counter = Counter(progress, batches * (1 + len(trials)))
        rows, ppl = runner.measure(ids, windows, trials, counter)
        products = "bfloat16 differences" if runner.deltas and runner.deltas.recorded else "exact"
        del runner  # its copy of the program (on the device) before the estimate makes its own
        gc.collect()  # a graph module and its graph refer to each other: only the collector frees them
        result = SensitivityResult(path, config.to_dict(), source, windows, ppl, rows, skipped)
        result.products = products
        if estimate and text is not None:
            begun = time.perf_counter()
            _estimate(ep, rows, trials, text, tokenizer=found, max_tokens=max_tokens, exact=exact_products,
                      device=device)  # fmt: skip
            result.estimate_seconds = time.perf_counter() - begun
        result.rank_correlation = spearman([r.kl_mean for r in rows], [r.estimate or 0.0 for r in rows])
    rows.sort(key=lambda r: -r.kl_mean)
    result.seconds = time.perf_counter() - start
    return result


def _trials(
    ep: Any, config: Any, trial_encodings: Any
) -> tuple[dict[str, tuple[Any, Any]], list[dict[str, Any]]]:
    """name -> (site, decoded weight) for every weight that would be compressed; the others."""
    from coreai_opt.weights import Skipped, decode

    trials, skipped = {}, []
    for site, outcome in trial_encodings(ep, config):
        if isinstance(outcome, Skipped):
            skipped.append({"name": site.name, "reason": outcome.reason})
        else:
            trials[site.name] = (site, outcome, decode(outcome))
    if not trials:
        raise ValueError("the config compresses no weight of this program")
    return trials, skipped


def spearman(a: list[float], b: list[float]) -> float | None:
    """Spearman's rank correlation (ties take their mean rank); None for fewer than 3 values."""
    if len(a) < 3:
        return None

    def ranks(values: list[float]) -> np.ndarray:
        order = np.argsort(values, kind="stable")
        out = np.empty(len(values))
        out[order] = np.arange(len(values), dtype=np.float64)
        for value in set(values):  # ties: their mean rank
            where = np.asarray(values) == value
            out[where] = out[where].mean()
        return out

    ra, rb = ranks(a), ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return None
    return float(np.corrcoef(ra, rb)[0, 1])


class _Resumable:
    """The program's module, run node by node: once per window in full, keeping the values alive
    at each weight's first reader, then from that reader on with the weight swapped. With
    `differences` the full run also records every float32 product's operands and output (~1 GB a
    batch of 1,024 tokens at SmolLM2-135M), which the trials' products are read off (`_deltas`: a
    CPU's bfloat16 instructions; on another `device` every product is taken whole)."""

    def __init__(self, ep: Any, path: Path, differences: bool, device: str | None = None) -> None:
        import torch
        from torch.fx import Interpreter

        from coreai_opt._export import runnable
        from coreai_opt.models import decoder_context

        from ._deltas import DeltaProducts

        self.device = torch.device(device or "cpu")
        self.gm: GraphModule = runnable(ep, device, stateless=True)  # each window a sequence of its own
        self.nodes = list(self.gm.graph.nodes)
        position = {n: i for i, n in enumerate(self.nodes)}
        self.last_use = {n: max((position[u] for u in n.users), default=i) for i, n in enumerate(self.nodes)}
        self.attrs = {n.target: n for n in self.nodes if n.op == "get_attr"}
        self.position = position
        self.interpreter = Interpreter(self.gm)
        placeholders = [n for n in self.nodes if n.op == "placeholder"]
        shapes = [tuple(n.meta["val"].shape) for n in placeholders if "val" in n.meta]
        ints = [n for n in placeholders if "val" in n.meta and not n.meta["val"].is_floating_point()]
        if not ints or len(shapes[0]) != 2:
            raise ModelFileError(path, "takes no [batch, tokens] ids: not a language model")
        self.placeholders = placeholders
        differences = (
            differences and trial_products(device=device) != "exact" and DeltaProducts.applies(self.gm.graph)
        )
        self.deltas = DeltaProducts(self.gm.graph) if differences else None
        context = decoder_context(ep)  # a stateful decoder: windows of its context from position 0
        self.fill = torch.zeros if context else torch.ones  # its position; else an attention mask
        self.batch, self.length = (1, context) if context else tuple(ints[0].meta["val"].shape)
        if not context and self._first_output_shape()[:2] != (self.batch, self.length):
            raise ModelFileError(
                path, "returns no [batch, tokens, vocabulary] logits first: not a language model"
            )
        self.head = (
            None if self.deltas is None else self.deltas.head(self.nodes[-1], self._first_output_shape())
        )

    def _first_output_shape(self) -> tuple[int, ...]:
        import torch

        output = self.nodes[-1]
        leaves = [
            n.meta.get("val") for n in torch.utils._pytree.tree_leaves(output.args[0]) if hasattr(n, "meta")
        ]
        first = next((v for v in leaves if isinstance(v, torch.Tensor)), None)
        return tuple(first.shape) if first is not None and first.dim() == 3 else ()

    def cut(self, name: str) -> tuple[int, Node]:
        node = self.attrs.get(name)
        if node is None or not node.users:
            raise ValueError(f"weight {name} is not read by the program")
        return min(self.position[u] for u in node.users), node

    def _run(
        self, env: dict[Node, Any], begin: int, keep: dict[int, list[Node]] | None = None
    ) -> tuple[Any, dict]:
        saved: dict[int, dict[Node, Any]] = {}
        for i in range(begin, len(self.nodes)):
            if keep is not None and i in keep:
                saved[i] = {n: env[n] for n in keep[i]}
            node = self.nodes[i]
            if node.op == "output":
                args, _ = self.interpreter.fetch_args_kwargs_from_env(node)
                return args[0], saved
            if node.op != "placeholder":  # the inputs are in env already
                self.interpreter.env = env
                env[node] = self._value(node, keep is not None)
                if node is self.head and keep is None and _factored(env[node]):
                    return env.pop(node), saved  # a trial's logits, left factored
            for used in node.all_input_nodes:
                if self.last_use[used] == i:
                    env.pop(used, None)
        raise AssertionError("a graph without an output")

    def _value(self, node: Node, reference: bool) -> Any:
        deltas = self.deltas
        if deltas is None or node not in deltas.products:
            return self.interpreter.run_node(node)
        args, kwargs = self.interpreter.fetch_args_kwargs_from_env(node)
        if reference:
            out = node.target(*args, **kwargs)
            deltas.record(node, args, out)
            return out
        method = deltas.factored if node is self.head else deltas.product
        found = method(node, args, kwargs)
        return node.target(*args, **kwargs) if found is None else found

    def _scores(self, ref: Reference, out: Any) -> tuple[float, float, int]:
        return ref.against_head(out) if _factored(out) else ref.against(self._logits(out))

    def _logits(self, output: Any) -> torch.Tensor:
        import torch

        first = next(t for t in torch.utils._pytree.tree_leaves(output) if isinstance(t, torch.Tensor))
        return first

    def measure(
        self, ids: np.ndarray, windows: Windows, trials: dict[str, tuple[Any, Any, Any]], counter: Counter
    ) -> tuple[list[WeightSensitivity], float]:
        sums, ref_nll = self.sums(ids, windows, {name: t[2] for name, t in trials.items()}, counter)
        scored = windows.scored
        ppl = math.exp(ref_nll / scored)
        found = []
        for name, (kl, nll, agree) in sums.items():
            site, encoding, _ = trials[name]
            found.append(WeightSensitivity(
                name, tuple(site.shape), site.nbytes, encoding.nbytes, kl / scored,
                math.exp(nll / scored) / ppl - 1.0, agree / scored,
            ))  # fmt: skip
        return found, ppl

    def sums(
        self, ids: np.ndarray, windows: Windows, decoded: dict[str, Any], counter: Counter
    ) -> tuple[dict[str, list[float]], float]:
        """Per weight swapped in alone: KL, NLL and top-1 agreements summed over the scored
        tokens; the reference's NLL summed."""
        import torch

        from ._scores import Reference

        cuts = {name: self.cut(name) for name in decoded}
        place = self.device
        if _fit(decoded, place):  # moved once, not once a window
            decoded = {name: value.to(place) for name, value in decoded.items()}
        keep = {c: [n for n in self.nodes[:c] if self.last_use[n] >= c] for c, _ in cuts.values()}
        sums = {name: [0.0, 0.0, 0] for name in decoded}
        ref_nll = 0.0
        with torch.no_grad():
            for first, group, stacked in window_batches(ids, windows, self.batch):
                batch = torch.from_numpy(stacked).to(place)  # the scores are taken where the logits are
                env: dict[Node, Any] = {self.placeholders[0]: batch}
                for extra in self.placeholders[1:]:
                    meta = extra.meta["val"]
                    env[extra] = self.fill(tuple(meta.shape), dtype=meta.dtype, device=place)
                if self.deltas is not None:
                    self.deltas.clear()
                output, saved = self._run(env, 0, keep)
                ref = Reference(self._logits(output), batch, len(group), windows, first)
                ref_nll += ref.nll
                counter.step(f"reference window {first + 1}")
                for name, (cut, attr) in cuts.items():
                    env = dict(saved[cut])
                    value = decoded[name].to(place)
                    env[attr] = value.to(env[attr].dtype) if attr in env else value
                    if self.deltas is not None:
                        self.deltas.swap(name)
                    out, _ = self._run(env, cut)
                    kl, nll, agree = self._scores(ref, out)
                    total = sums[name]
                    total[0] += kl
                    total[1] += nll
                    total[2] += agree
                    counter.step(name)
        if self.deltas is not None:
            self.deltas.release()  # before the estimate's calibration: ~1 GB a batch, the bf16 weights
        return sums, ref_nll


def _fit(decoded: dict[str, Any], place: torch.device) -> bool:
    """Whether every decoded weight fits in half the free memory of the device `place` (a GPU's:
    else each moves there for its trial; the CPU's: they are there)."""
    import torch

    if place.type != "cuda":
        return place.type == "cpu"
    total = sum(v.numel() * v.element_size() for v in decoded.values())
    free = (
        torch.cuda.mem_get_info(place)[0]
        + torch.cuda.memory_reserved(place)
        - torch.cuda.memory_allocated(place)
    )
    return 2 * total < free


def trial_products(exact_products: bool = False, device: str | None = None) -> str:
    """How trials on `device` take their float32 matrix products: "bfloat16 differences" on a CPU
    with bfloat16 instructions (unless `exact_products`), else "exact" (a GPU's trials are) - what
    measured trials are cached under (`optimize`), since the two differ by ~0.1-0.3% of a KL."""
    from coreai_opt._cpu import native_bfloat16

    on_cpu = device is None or str(device).startswith("cpu")
    return "bfloat16 differences" if on_cpu and not exact_products and native_bfloat16() else "exact"


def _differences(exact_products: bool) -> bool:
    return trial_products(exact_products) != "exact"


def _factored(value: Any) -> bool:
    from ._deltas import FactoredChange

    return isinstance(value, FactoredChange)


class NotALanguageModel(ValueError):
    """The program does not take `[batch, tokens]` ids and return next-token logits first."""


def trial_divergences(
    program: Any,
    ids: np.ndarray,
    decoded: dict[str, Any],
    *,
    exact_products: bool = False,
    device: str | None = None,
    progress: Progress | None = None,
) -> dict[str, float]:
    """The mean KL divergence per scored token from the program's own next-token distribution of
    each weight in `decoded` (name -> the values to run it with) swapped in alone, on `ids` cut
    into windows of the program's length that do not overlap (a language model `ExportedProgram`
    taking `[batch, tokens]` ids and returning logits first; `NotALanguageModel` otherwise). What
    `optimize` measures its anchors with. `exact_products` and `device` as in `weight_sensitivity`."""
    try:
        runner = _Resumable(program, Path("<program>"), _differences(exact_products), device)
    except ProgramRunError:
        raise
    except ModelFileError as exc:
        raise NotALanguageModel(f"the program {exc.problem}") from None
    windows = Windows(len(ids), runner.length, runner.length)
    batches = -(-len(windows.starts) // runner.batch)
    sums, _ = runner.sums(ids, windows, decoded, Counter(progress, batches * (1 + len(decoded))))
    del runner
    gc.collect()  # its program copy (a graph module refers to itself) before the next piece's
    trim_heap()  # and what its passes freed: glibc keeps a freed heap otherwise
    return {name: total[0] / windows.scored for name, total in sums.items()}


def _estimate(
    ep: Any,
    rows: list[WeightSensitivity],
    trials: dict[str, Any],
    text: Any,
    *,
    tokenizer: Any,
    max_tokens: int | None,
    exact: bool,
    device: str | None = None,
) -> None:
    """Each row's 1/2 sum(F dW^2) per token, F the squared gradients of a sample's next-token
    loss on the text, a mean over the samples: divided by the tokens a sample counts, not by all
    of them (which made the estimate shrink as the text grew)."""
    from coreai_opt.calibration import ALL_TOKENS, Samples, calibrate
    from coreai_opt.weights import Needs

    samples = Samples.of(text, tokens=max_tokens or ALL_TOKENS, tokenizer=tokenizer)  # the text measured
    calibration = calibrate(ep, samples, cache=False, exact_gradients=exact, device=device)
    found = calibration.statistics(list(trials), Needs.GRADIENT_SQUARES)
    count = max(calibration.sample_count, 1)
    weights = {n: p for n, p in ep.module().named_parameters()} | dict(ep.module().named_buffers())
    for row in rows:
        stats = found[row.name]
        if stats.gradient_squares is None:
            continue
        delta = (trials[row.name][2].double() - weights[row.name].detach().double()) ** 2
        squares = stats.gradient_squares.cpu()  # where the calibration ran: the host's copy
        row.estimate = float(0.5 * (squares * delta).sum() * count / max(stats.rows, 1))
