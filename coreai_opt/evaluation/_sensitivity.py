"""How much each weight's compression alone costs on a text: the KL divergence from the
reference's next-token distribution, the perplexity increase and the bytes it saves, measured by
swapping the decoded weight into the program in memory (no file written), one weight at a time.

A weight only changes what comes after its first reader, so each window runs the reference once,
keeping the values alive at every weight's first reader, and each trial resumes from there: on a
decoder, half a forward pass per weight on average. Beside the measurement, a cheap estimate -
the second-order Taylor term 1/2 sum(F * dW^2) with F the squared gradients of the next-token
loss on the same text (the calibration room's Fisher) - and the rank correlation between them.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from coreai_opt.io import ModelFileError, load_pt2, require_existing

from ._text import Progress, _Counter
from ._tokens import Windows, token_stream, window_batches

if TYPE_CHECKING:
    import torch
    from torch.fx import GraphModule, Node


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

    def to_dict(self) -> dict[str, Any]:
        w = self.windows
        return {
            "program": str(self.program), "config": self.config, "source": self.source, "tokens": w.tokens,
            "window": w.length, "windows": len(w.starts), "scored_tokens": w.scored,
            "reference_perplexity": self.reference_perplexity, "rank_correlation": self.rank_correlation,
            "seconds": round(self.seconds, 3), "estimate_seconds": round(self.estimate_seconds, 3),
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
    trust_pickle: bool = False,
    progress: Progress | None = None,
) -> SensitivityResult:
    """Each weight `config` would compress, measured alone (see the module); windows of the
    program's length that do not overlap. `estimate` (text only) adds the Fisher estimate."""
    from coreai_opt.compression import trial_encodings

    start = time.perf_counter()
    path = Path(program)
    require_existing(path)
    ids, source, found = token_stream(path, text, tokens, tokenizer, max_tokens)
    ep = load_pt2(path, trust_pickle=trust_pickle)
    runner = _Resumable(ep, path)  # a language model, before any weight is encoded
    trials, skipped = _trials(ep, config, trial_encodings)
    windows = Windows(len(ids), runner.length, runner.length)
    batches = -(-len(windows.starts) // runner.batch)
    counter = _Counter(progress, batches * (1 + len(trials)))
    rows, ppl = runner.measure(ids, windows, trials, counter)
    result = SensitivityResult(path, config.to_dict(), source, windows, ppl, rows, skipped)
    if estimate and text is not None:
        begun = time.perf_counter()
        _estimate(ep, rows, trials, text, found, max_tokens)
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
    at each weight's first reader, then from that reader on with the weight swapped."""

    def __init__(self, ep: Any, path: Path) -> None:
        from torch.fx import Interpreter

        from coreai_opt._export import fold_decompression

        self.gm: GraphModule = ep.module()
        fold_decompression(self.gm)
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
        self.batch, self.length = tuple(ints[0].meta["val"].shape)
        if self._first_output_shape()[:2] != (self.batch, self.length):
            raise ModelFileError(
                path, "returns no [batch, tokens, vocabulary] logits first: not a language model"
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
                env[node] = self.interpreter.run_node(node)
            for used in node.all_input_nodes:
                if self.last_use[used] == i:
                    env.pop(used, None)
        raise AssertionError("a graph without an output")

    def _logits(self, output: Any) -> torch.Tensor:
        import torch

        first = next(t for t in torch.utils._pytree.tree_leaves(output) if isinstance(t, torch.Tensor))
        return first

    def measure(
        self, ids: np.ndarray, windows: Windows, trials: dict[str, tuple[Any, Any, Any]], counter: _Counter
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
        self, ids: np.ndarray, windows: Windows, decoded: dict[str, Any], counter: _Counter
    ) -> tuple[dict[str, list[float]], float]:
        """Per weight swapped in alone: KL, NLL and top-1 agreements summed over the scored
        tokens; the reference's NLL summed."""
        import torch

        cuts = {name: self.cut(name) for name in decoded}
        keep = {c: [n for n in self.nodes[:c] if self.last_use[n] >= c] for c, _ in cuts.values()}
        sums = {name: [0.0, 0.0, 0] for name in decoded}
        ref_nll = 0.0
        with torch.no_grad():
            for first, group, stacked in window_batches(ids, windows, self.batch):
                batch = torch.from_numpy(stacked)
                env: dict[Node, Any] = {self.placeholders[0]: batch}
                for extra in self.placeholders[1:]:
                    env[extra] = torch.ones(tuple(extra.meta["val"].shape), dtype=extra.meta["val"].dtype)
                output, saved = self._run(env, 0, keep)
                ref = _Reference(self._logits(output), batch, len(group), windows, first)
                ref_nll += ref.nll
                counter.step(f"reference window {first + 1}")
                for name, (cut, attr) in cuts.items():
                    env = dict(saved[cut])
                    env[attr] = decoded[name].to(env[attr].dtype) if attr in env else decoded[name]
                    out, _ = self._run(env, cut)
                    kl, nll, agree = ref.against(self._logits(out))
                    total = sums[name]
                    total[0] += kl
                    total[1] += nll
                    total[2] += agree
                    counter.step(name)
        return sums, ref_nll


class NotALanguageModel(ValueError):
    """The program does not take `[batch, tokens]` ids and return next-token logits first."""


def trial_divergences(
    program: Any, ids: np.ndarray, decoded: dict[str, Any], *, progress: Progress | None = None
) -> dict[str, float]:
    """The mean KL divergence per scored token from the program's own next-token distribution of
    each weight in `decoded` (name -> the values to run it with) swapped in alone, on `ids` cut
    into windows of the program's length that do not overlap (a language model `ExportedProgram`
    taking `[batch, tokens]` ids and returning logits first; `NotALanguageModel` otherwise). What
    `optimize` measures its anchors with."""
    try:
        runner = _Resumable(program, Path("<program>"))
    except ModelFileError as exc:
        raise NotALanguageModel(f"the program {exc.problem}") from None
    windows = Windows(len(ids), runner.length, runner.length)
    batches = -(-len(windows.starts) // runner.batch)
    sums, _ = runner.sums(ids, windows, decoded, _Counter(progress, batches * (1 + len(decoded))))
    return {name: total[0] / windows.scored for name, total in sums.items()}


class _Reference:
    """The reference's scored rows of one batch, kept so that a trial's divergence is read off the
    difference d = z - z_ref of its logits from the reference's (exact where they are close): with
    p the reference's probabilities and m their sum (1 up to rounding),
    lse(z) = lse(z_ref) + log(sum p e^d / m) and KL = m (lse(z) - lse(z_ref)) - sum p d. Both
    terms are as small as d is, so float32 products summed by torch's cascade keep the KL to ~1e-5
    of itself at 1e-4 nats a token (the test checks 1e-4 down to ~1e-6 nats) - where widening a
    batch's logits to float64 (1016 rows x 49,152 tokens: 0.4 GB a copy, several a trial, each
    conversion slow) cost a trial a third of its time. BLAS dot products would not do: they sum
    float32 in order."""

    _ROWS = 128  # rows a piece (25 MB float32 temporaries at a 49,152-token vocabulary)

    def __init__(
        self, logits: torch.Tensor, batch: torch.Tensor, count: int, windows: Windows, first: int
    ) -> None:
        import torch

        self.rows = [(k, windows.first_row(first + k)) for k in range(count)]
        self.targets = torch.cat([batch[k, row + 1 :] for k, row in self.rows])[:, None]
        self.z = torch.cat([logits[k, row:-1] for k, row in self.rows]).float()
        wide = self.z.double()
        self.lse = torch.logsumexp(wide, -1)
        logp = wide - self.lse[:, None]
        self.p = logp.exp().float()
        self.mass = self.p.double().sum(-1)
        self.top = self.z.argmax(-1)
        self.nll = -float(logp.gather(1, self.targets).sum())

    def against(self, logits: torch.Tensor) -> tuple[float, float, int]:
        """(KL summed over the rows, NLL summed, rows whose most likely token agrees)."""
        kl, nll, agree, at = 0.0, 0.0, 0, 0
        for k, row in self.rows:
            scored = logits[k, row:-1]
            for a in range(0, len(scored), self._ROWS):
                z = scored[a : a + self._ROWS].float()
                rows = slice(at, at + len(z))
                at += len(z)
                d = z - self.z[rows]
                shift = self._shift(z, d, rows)
                kl += float((shift * self.mass[rows] - (self.p[rows] * d).sum(-1).double()).sum())
                nll += float((self.lse[rows] + shift - z.gather(1, self.targets[rows])[:, 0]).sum())
                agree += int((z.argmax(-1) == self.top[rows]).sum())
        return kl, nll, agree

    def _shift(self, z: torch.Tensor, d: torch.Tensor, rows: slice) -> torch.Tensor:
        """lse(z) - lse(z_ref) = top + log(sum p e^(d - top) / m), top = max d, to d's precision:
        the sum is m + sum p (e^(d - top) - 1), the second term (one sign) carrying all of it where
        d is small. Where the sum falls below m/2 the candidate moved its mass, possibly onto tokens
        whose reference probability float32 cannot hold (below e^-103): those rows take lse(z)
        itself (where the sum is at least m/2, such a token adds less than e^-103 of it)."""
        import torch

        p, mass = self.p[rows], self.mass[rows]
        top = d.amax(-1)
        fraction = (p * torch.expm1(d - top[:, None])).sum(-1).double() / mass  # in [-1, 0]
        shift = torch.log1p(fraction) + top
        far = fraction < -0.5
        if bool(far.any()):
            shift[far] = torch.logsumexp(z[far].double(), -1) - self.lse[rows][far]
        return shift


def _estimate(ep: Any, rows: list[WeightSensitivity], trials: dict[str, Any], text: Any, tokenizer: Any,
              max_tokens: int | None) -> None:  # fmt: skip
    """Each row's 1/2 sum(F dW^2) per token, F the squared gradients of the next-token loss."""
    from coreai_opt.calibration import Samples, calibrate
    from coreai_opt.weights import Needs

    samples = Samples.of(text, tokens=max_tokens, tokenizer=tokenizer)
    found = calibrate(ep, samples, cache=False).statistics(list(trials), Needs.GRADIENT_SQUARES)
    weights = {n: p for n, p in ep.module().named_parameters()} | dict(ep.module().named_buffers())
    for row in rows:
        stats = found[row.name]
        if stats.gradient_squares is None:
            continue
        delta = (trials[row.name][2].double() - weights[row.name].detach().double()) ** 2
        row.estimate = float(0.5 * (stats.gradient_squares * delta).sum() / max(stats.rows, 1))
