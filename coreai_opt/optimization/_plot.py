"""The accuracy-vs-size picture of an optimization, as PNG (matplotlib: `coreopt[plot]`)."""

from __future__ import annotations

from pathlib import Path

from ._records import OptimizeReport


def plot_optimization(report: OptimizeReport, path: Path) -> None:
    """Least estimated damage against bits per weight (the curve the solver sees), each round's
    and each uniform setting's measured damage (KL per token, or 1 - worst cosine) beside its
    estimate; log scale, written atomically."""
    from coreai_opt._plot import pyplot, save_figure

    plt = pyplot()
    figure, axes = plt.subplots(figsize=(7, 4.5), dpi=120)
    curve = [(b, d) for b, d in report.curve if d > 0]
    if curve:
        axes.plot(*zip(*curve, strict=True), color="grey", linewidth=1, label="least estimated damage")
    rounds = [(r.bits, r.measured.damage()) for r in report.rounds if r.measured is not None]
    if rounds:
        axes.scatter(*zip(*rounds, strict=True), marker="o", color="tab:blue", label="plan, measured")
    for u in report.uniform:
        if u.measured is not None:
            axes.scatter([u.bits], [u.measured.damage()], marker="s", color="tab:red")
            axes.annotate(
                u.choice, (u.bits, u.measured.damage()), fontsize=8, xytext=(4, 4), textcoords="offset points"
            )
    language = any(r.measured is not None and r.measured.kl_mean is not None for r in report.rounds)
    axes.set_yscale("log")
    axes.set_xlabel("bits per weight")
    axes.set_ylabel("KL per token" if language else "1 - worst cosine")
    axes.set_title(f"{report.program.name}: {report.goal.describe()}")
    axes.legend(fontsize=8)
    save_figure(figure, Path(path))
