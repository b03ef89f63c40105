"""Perplexity (or KL) against bits per weight, one labelled point per program, as PNG."""

from __future__ import annotations

from pathlib import Path

from ._text import TextEvaluation


def plot_evaluation(result: TextEvaluation, path: Path, *, metric: str = "perplexity") -> None:
    """`metric` is `perplexity` (the reference drawn too) or `kl` (candidates only); log scale."""
    from coreai_opt._plot import pyplot, save_figure

    if metric not in ("perplexity", "kl"):
        raise ValueError(f"plot metric {metric!r} is not perplexity or kl")
    plt = pyplot()
    figure, axes = plt.subplots(figsize=(7, 4.5), dpi=120)
    rows = ([result.reference] if metric == "perplexity" else []) + result.candidates
    for row in rows:
        y = row.perplexity if metric == "perplexity" else row.kl_mean
        if row.bits_per_weight is None or y is None or not y < float("inf"):
            continue
        axes.scatter([row.bits_per_weight], [y], color="black" if row is result.reference else "tab:blue")
        axes.annotate(
            row.path.name, (row.bits_per_weight, y), fontsize=8, xytext=(4, 4), textcoords="offset points"
        )
    axes.set_yscale("log")
    axes.set_xlabel("bits per weight")
    axes.set_ylabel("perplexity" if metric == "perplexity" else "KL divergence from the reference (mean)")
    axes.set_title(f"{metric} on {Path(result.source).name} ({result.windows.scored} tokens)")
    save_figure(figure, path)
