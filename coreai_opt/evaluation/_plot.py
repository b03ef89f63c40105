"""Perplexity (or KL) against bits per weight, one labelled point per candidate, as PNG."""

from __future__ import annotations

from pathlib import Path

from ._text import TextEvaluation

_SAME_BITS = 0.05  # points closer than this in bits per weight share a column: their labels stack
_LABEL_STEP = 11  # points between stacked labels


def plot_evaluation(result: TextEvaluation, path: Path, *, metric: str = "perplexity") -> None:
    """`metric` is `perplexity` or `kl`, on a log scale; the reference is a dashed line (its
    perplexity; zero KL needs none), not a point at 32 bits that would leave the bits axis empty."""
    from coreai_opt._plot import pyplot, save_figure

    if metric not in ("perplexity", "kl"):
        raise ValueError(f"plot metric {metric!r} is not perplexity or kl")
    plt = pyplot()
    figure, axes = plt.subplots(figsize=(7, 4.5), dpi=120)
    points = []
    for row in result.candidates:
        y = row.perplexity if metric == "perplexity" else row.kl_mean
        if row.bits_per_weight is not None and y is not None and 0 < y < float("inf"):
            points.append((row.bits_per_weight, y, row.path.name))
    stacked: list[float] = []
    for bits, y, name in sorted(points):
        axes.scatter([bits], [y], color="tab:blue")
        above = sum(abs(bits - other) < _SAME_BITS for other in stacked)  # labels already in this column
        stacked.append(bits)
        axes.annotate(
            name, (bits, y), fontsize=8, xytext=(4, 4 + _LABEL_STEP * above), textcoords="offset points"
        )
    reference = result.reference.perplexity
    if metric == "perplexity" and 0 < reference < float("inf"):
        axes.axhline(reference, color="black", linestyle="--", linewidth=1)
        axes.annotate(f"{result.reference.path.name}: {reference:.3f}", (0.01, reference), xycoords=("axes fraction", "data"),
                      fontsize=8, xytext=(0, 4), textcoords="offset points")  # fmt: skip
    axes.set_yscale("log")
    axes.set_xlabel("bits per weight")
    axes.set_ylabel("perplexity" if metric == "perplexity" else "KL divergence from the reference (mean)")
    axes.set_title(f"{metric} on {Path(result.source).name} ({result.windows.scored} tokens)")
    axes.margins(x=0.15)
    save_figure(figure, path)
