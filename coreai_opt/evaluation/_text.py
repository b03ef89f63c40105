"""How well language models predict a text: perplexity of each program, and each candidate's
next-token distributions against the reference's (KL divergence, top-1 agreement).

Every program runs window by window in lockstep: each window's reference log-probabilities are
compared with every candidate's at once and then dropped, so memory does not grow with the text.
Candidates run in groups that fit in half the memory available (each counted at the reference's
size): the reference runs once a group - once for all of them wherever they fit. `.pt2` programs
run in PyTorch (compressed weights decoded once), `.aimodel` programs on the Core AI runtime - the
comparison room's sides.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from coreai_opt.io import ModelFileError, asset_bytes, model_format, require_existing

from ._config import EvalConfig
from ._language import Counter, LanguageSide, Progress
from ._tokens import Windows, token_stream

if TYPE_CHECKING:
    import torch


@dataclass
class TextScore:
    """One program's numbers on the text (the KL and top-1 fields are None for the reference)."""

    path: Path
    size_bytes: int
    bits_per_weight: float | None
    perplexity: float
    seconds: float
    tokens_per_second: float  # tokens through the program per second of its own run time
    perplexity_increase: float | None = None  # relative to the reference's
    kl_mean: float | None = None
    kl_p99: float | None = None
    top1: float | None = None

    def to_dict(self) -> dict[str, Any]:
        def num(v: float | None, digits: int = 6) -> float | str | None:
            return None if v is None else (round(v, digits) if math.isfinite(v) else str(v))

        return {
            "path": str(self.path), "size_bytes": self.size_bytes,
            "bits_per_weight": num(self.bits_per_weight, 4), "perplexity": num(self.perplexity),
            "perplexity_increase": num(self.perplexity_increase), "kl_mean": num(self.kl_mean, 8),
            "kl_p99": num(self.kl_p99, 8), "top1": num(self.top1), "seconds": num(self.seconds, 3),
            "tokens_per_second": num(self.tokens_per_second, 1),
        }  # fmt: skip


@dataclass
class TextEvaluation:
    source: str
    windows: Windows
    reference: TextScore
    candidates: list[TextScore] = field(default_factory=list)

    def failures(self, max_ppl_increase: float | None = None, max_kl: float | None = None) -> list[str]:
        """What each budget says of the candidates, a line per candidate over it."""
        found = []
        for row in self.candidates:
            rise, kl = row.perplexity_increase, row.kl_mean
            if max_ppl_increase is not None and not (rise is not None and rise <= max_ppl_increase):
                found.append(f"{row.path.name}: perplexity +{_pct(rise)} exceeds +{_pct(max_ppl_increase)}")
            if max_kl is not None and not (kl is not None and kl <= max_kl):
                found.append(f"{row.path.name}: KL {kl} exceeds {max_kl}")
        return found

    def to_csv(self) -> str:
        """One row per program, the reference first."""
        import csv
        import io

        rows = [self.reference.to_dict()] + [c.to_dict() for c in self.candidates]
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return out.getvalue()

    def to_dict(self) -> dict[str, Any]:
        w = self.windows
        return {
            "source": self.source, "tokens": w.tokens, "window": w.length, "stride": w.stride,
            "windows": len(w.starts), "scored_tokens": w.scored, "unscored_tail": w.dropped,
            "reference": self.reference.to_dict(), "candidates": [c.to_dict() for c in self.candidates],
        }  # fmt: skip


def _pct(v: float | None) -> str:
    return "inf" if v is None or not math.isfinite(v) else f"{100 * v:.2f}%"


def evaluate_text(
    reference: Path | str,
    candidates: list[Path | str] | tuple[Path | str, ...] = (),
    *,
    text: Path | str | None = None,
    tokens: Path | str | None = None,
    tokenizer: Path | str | None = None,
    config: EvalConfig | None = None,
    trust_pickle: bool = False,
    progress: Progress | None = None,
    **options: Any,
) -> TextEvaluation:
    """Perplexity of the reference and every candidate on `text` (cut with `tokenizer`, by default
    the one `coreopt export` saved beside the reference) or on the ids of a safetensors `tokens`
    file, over windows of the programs' token length every `stride` tokens (default: the window,
    so windows do not overlap); each candidate's KL divergence from the reference per scored token
    (mean and 99th percentile) and how often its most likely next token is the reference's.
    `config` (an `EvalConfig`; any of its fields given here replace the config's) says how much
    is scored (`max_tokens`) and the windows' `stride`."""
    config = dataclasses.replace(config or EvalConfig(), **options)
    max_tokens, stride = config.max_tokens, config.stride
    reference, paths = Path(reference), [Path(c) for c in candidates]
    for path in (reference, *paths):
        require_existing(path)
        model_format(path)
    ids, source, _ = token_stream(reference, text, tokens, tokenizer, max_tokens)
    with contextlib.ExitStack() as stack:
        from coreai_opt._export import checked_device

        device = checked_device(config.device)
        ref = LanguageSide.open(reference, trust_pickle, stack, None, device)
        windows = Windows(len(ids), ref.length, stride or ref.length)
        groups = _groups(paths, ref, device)
        counter = Counter(progress, len(windows.starts) * (len(groups) + len(paths)))
        result: TextEvaluation | None = None
        for group in groups:
            with contextlib.ExitStack() as held:
                sides = [_candidate(path, trust_pickle, held, ref, device) for path in group]
                ref_score, scores = _score_lockstep(ref, sides, ids, windows, counter)
            result = result or TextEvaluation(source, windows, ref_score)
            result.candidates.extend(scores)
    assert result is not None
    return result


def _groups(paths: list[Path], ref: LanguageSide, device: str | None) -> list[list[Path]]:
    """The candidates in groups scored together: as many as fit in half the memory available beside
    the reference - the host's, and a GPU's where they run on one (`device`) - each counted at the
    reference's size (a compressed candidate runs decoded) and a batch of its logits; one at least
    (two programs in memory), one group of none when there are no candidates."""
    each = _resident_bytes(ref) + ref.batch * ref.length * _vocab(ref) * 4  # its weights, a batch of logits
    available = min(_available_bytes(), _device_free_bytes(device))
    room = max(1, int(available / 2 // max(each, 1)) - 1)
    return [paths[i : i + room] for i in range(0, len(paths), room)] or [[]]


def _device_free_bytes(device: str | None) -> int:
    """A CUDA device's free memory (with the reference already there: the candidates' room), or
    no bound elsewhere."""
    if device is None or not device.startswith("cuda"):
        return 1 << 62
    import torch

    free, _ = torch.cuda.mem_get_info(torch.device(device))
    return int(free)


def _available_bytes() -> int:
    """The memory this process may still take: MemAvailable of /proc/meminfo (Linux; elsewhere the
    machine's memory), less where a cgroup's limit (a container's) leaves less."""
    import os

    found = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    try:
        with open("/proc/meminfo", encoding="ascii") as info:
            found = next(
                (int(line.split()[1]) * 1024 for line in info if line.startswith("MemAvailable:")), found
            )
    except (OSError, ValueError, IndexError):
        pass
    return min(found, _cgroup_room())


def _cgroup_room() -> int:
    """What a cgroup v2 limit leaves (memory.max less memory.current), or no bound."""
    try:
        limit, used = (
            Path(f"/sys/fs/cgroup/memory.{n}").read_text(encoding="ascii").strip() for n in ("max", "current")
        )
        return max(int(limit) - int(used), 0) if limit.isdigit() and used.isdigit() else 1 << 62
    except OSError:
        return 1 << 62


def _vocab(side: LanguageSide) -> int:
    """The logits' width `coreopt export` recorded beside the program (else a large vocabulary's)."""
    from coreai_opt.models import model_info

    info = model_info(side.path)
    return info.vocab_size if info is not None and info.vocab_size else 1 << 17


def _resident_bytes(side: LanguageSide) -> int:
    """What a program takes in memory: a `.pt2`'s tensors, an `.aimodel`'s files."""
    program = getattr(side.side, "program", None)
    if program is None:
        return asset_bytes(side.path)
    tensors = [*program.state_dict.values(), *program.constants.values()]
    return sum(t.numel() * t.element_size() for t in tensors if hasattr(t, "element_size"))


def _candidate(
    path: Path, trust_pickle: bool, stack: contextlib.ExitStack, ref: LanguageSide, device: str | None
) -> LanguageSide:
    side = LanguageSide.open(path, trust_pickle, stack, ref.length, device)
    if side.length != ref.length or side.batch != ref.batch:
        raise ModelFileError(path, f"takes [{side.batch}, {side.length}] tokens; the reference takes "
                             f"[{ref.batch}, {ref.length}]")  # fmt: skip
    return side


def _targets(ids: np.ndarray, windows: Windows, index: int) -> tuple[int, torch.Tensor]:
    import torch

    row = windows.first_row(index)
    start = windows.starts[index]
    return row, torch.from_numpy(ids[start + row + 1 : start + windows.length].copy())


def _score_lockstep(
    ref: LanguageSide, sides: list[LanguageSide], ids: np.ndarray, windows: Windows, counter: Counter
) -> tuple[TextScore, list[TextScore]]:
    """The reference's score and each candidate's, every program a window at a time."""
    ref.seconds = 0.0  # this pass's time: the reference runs once a group
    nll, tallies = 0.0, [_Tally() for _ in sides]
    streams = [ref.logits(ids, windows, counter), *(side.logits(ids, windows, counter) for side in sides)]
    for (index, logits), *others in zip(*streams, strict=True):
        row, targets = _targets(ids, windows, index)
        logp = _log_probabilities(logits[row:-1])
        nll -= float(logp.gather(1, targets[:, None]).sum())
        for tally, (_, theirs) in zip(tallies, others, strict=True):
            tally.add(logp, theirs[row:-1], targets)
    reference = _score(ref, nll / windows.scored, windows)
    return reference, [
        tally.score(side, windows, reference) for tally, side in zip(tallies, sides, strict=True)
    ]


_ROWS = 64  # a window's rows compared at a time: [rows, vocab] float64 temporaries, not [window, vocab]


def _log_probabilities(logits: torch.Tensor) -> torch.Tensor:
    """log_softmax of each row, as float32 keeps it, in float64: computed `_ROWS` rows at a time
    (a whole window's float64 temporaries were 0.1-0.7 GB at a 49k or 32k vocabulary)."""
    import torch

    out = torch.empty(logits.shape, dtype=torch.float64)
    for top in range(0, logits.shape[0], _ROWS):
        out[top : top + _ROWS] = torch.log_softmax(logits[top : top + _ROWS].double(), dim=-1).float()
    return out


@dataclass
class _Tally:
    """A candidate's sums so far: negative log-likelihood, KL per scored token, top-1 agreements."""

    nll: float = 0.0
    agree: int = 0
    kls: list[torch.Tensor] = field(default_factory=list)

    def add(self, logp: torch.Tensor, logits: torch.Tensor, targets: torch.Tensor) -> None:
        for top in range(0, logits.shape[0], _ROWS):
            rows = slice(top, top + _ROWS)
            p, logq = logp[rows], _log_probabilities(logits[rows])
            self.nll -= float(logq.gather(1, targets[rows, None]).sum())
            self.kls.append((p.exp() * (p - logq)).sum(-1).float())
            self.agree += int((p.argmax(-1) == logq.argmax(-1)).sum())

    def score(self, side: LanguageSide, windows: Windows, reference: TextScore) -> TextScore:
        import torch

        score = _score(side, self.nll / windows.scored, windows)
        kl = torch.cat(self.kls).double()
        finite = bool(torch.isfinite(kl).all())
        score.kl_mean = float(kl.mean()) if finite else math.inf
        score.kl_p99 = float(torch.quantile(kl, 0.99)) if finite else math.inf
        score.top1 = self.agree / windows.scored
        score.perplexity_increase = score.perplexity / reference.perplexity - 1.0
        return score


def _score(side: LanguageSide, mean_nll: float, windows: Windows) -> TextScore:
    perplexity = math.exp(mean_nll) if math.isfinite(mean_nll) and mean_nll < 700 else math.inf
    processed = len(windows.starts) * windows.length
    return TextScore(
        side.path,
        asset_bytes(side.path),
        side.weight_bits(),
        perplexity,
        side.seconds,
        processed / side.seconds,
    )
