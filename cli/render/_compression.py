"""`coreopt quantize`, `palettize`, `sparsify` (and `compress`, a compression step of `apply`):
the weights compressed, those skipped, the totals."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.panel import Panel

from .._common import console, human_bytes, shown
from ._shared import db, fitted_table, shape, weights_squeeze

if TYPE_CHECKING:
    from coreai_opt.compression import CompressionReport, Skipped
    from coreai_opt.recipes import CompressionFileResult


def weights_table(report: CompressionReport) -> None:
    """Every compressed weight: shape, encoding (LUT counts in it), stored bytes, bits per weight, SNR."""
    zeros = any(w.sparsity is not None for w in report.weights)
    learned = any(w.learned is not None for w in report.weights)
    headers = ("name", "shape", "encoding", *(("zeros",) if zeros else ()), "stored", "bits/w", "SNR dB",
               *(("data SNR", "data-free") if learned else ()))  # fmt: skip
    columns = [(h, "left" if h in ("name", "shape", "encoding") else "right") for h in headers]
    rows = [
        [
            w.name, shape(w.shape), w.encoding,
            *((f"{w.sparsity:.1%}" if w.sparsity is not None else "",) if zeros else ()),
            human_bytes(w.bytes_after), f"{w.bits_per_weight:.2f}", db(w.snr_db),
            *((db(w.learned.snr_db), db(w.learned.data_free_snr_db)) if w.learned else ("", "")
              if learned else ()),
        ]
        for w in report.weights
    ]  # fmt: skip
    hide = (len(headers) - 1, len(headers) - 2) if learned else ()  # data-free, data SNR
    console.print(fitted_table("Weights", columns, rows, squeeze=weights_squeeze(0, 1, 2, hide=hide)))


def skipped_table(skipped: list[Skipped], threshold: object) -> None:
    """Weights left alone, and why (the small ones counted, not listed)."""
    from coreai_opt.coreai_utils import SkipKind

    listed = [s for s in skipped if s.kind is not SkipKind.SMALL]
    if listed:
        rows = [[s.name, shape(s.shape), s.reason] for s in listed]
        columns = [("name", "left"), ("shape", "left"), ("reason", "left")]
        squeeze = weights_squeeze(0, 1, 2, detail_widths=(24, 16))
        console.print(fitted_table("Skipped", columns, rows, squeeze=squeeze))
    small = len(skipped) - len(listed)
    if small:
        console.print(
            f"[dim]{small} small constants skipped (<= {threshold} elements; --json lists them)[/dim]"
        )


def _option(name: str, value: Any) -> str:
    """An option as the command line spells it (n:m as 2:4, lists comma separated)."""
    if isinstance(value, list):
        return (":" if name == "n_m_ratio" else ", ").join(map(str, value))
    return str(value)


def _flags_of(kind: str) -> dict[str, str]:
    """Field name -> the flag a user typed for it (a pass no longer registered: the field names)."""
    from coreai_opt.compression import config_types, flag_names

    config_type = config_types().get(kind)
    return flag_names(config_type) if config_type is not None else {}


def render_compression(result: CompressionFileResult) -> None:
    report = result.report
    spelled = _flags_of(result.method)
    options = shown(
        "   ".join(
            f"{spelled.get(k, k)} {_option(k, v)}" for k, v in result.options.items() if v not in (None, [])
        )
    )
    console.print(
        Panel.fit(
            f"[bold]{shown(result.source)}[/bold] -> [bold]{shown(result.output)}[/bold]\n{options}\n"
            f"{len(report.weights)} weights compressed, {len(report.skipped)} skipped   "
            f"{result.seconds:.2f} s",
            title=f"coreopt {result.method}",
        )
    )
    if report.weights:
        weights_table(report)
    skipped_table(report.skipped, result.options.get("weight_num_threshold"))
    if report.weights:
        console.print(
            f"[bold]Totals[/bold]: all float tensors {human_bytes(report.total_bytes_before)} -> "
            f"{human_bytes(report.total_bytes_after)} ({report.total_ratio:.2f}x), of which compressed "
            f"weights {human_bytes(report.bytes_before)} -> {human_bytes(report.bytes_after)} "
            f"({report.ratio:.2f}x) and kept {human_bytes(report.kept_bytes)}   "
            f"bits/weight {report.bits_per_weight:.2f} over the compressed weights, "
            f"{report.model_bits_per_weight:.2f} over every float tensor (inspect's, compare's)   file on disk "
            f"{human_bytes(result.file_bytes_before)} -> {human_bytes(result.file_bytes_after)}"
        )
    if learned := [w.learned for w in report.weights if w.learned is not None]:
        gain = sum(x.snr_db - x.data_free_snr_db for x in learned if _finite(x.snr_db, x.data_free_snr_db))
        console.print(
            f"[bold]Data[/bold]: {len(learned)} weights learned from {shown(report.calibration or 'calibration')} "
            f"({learned[0].weighting}-weighted "
            f"error, 'data SNR'): {gain / len(learned):+.2f} dB on average against the data-free encoding"
        )
    if report.tuning:
        passes = " -> ".join(f"{d:.4g}" for d in report.tuning)
        console.print(
            f"[bold]Tuning[/bold]: look-up tables tuned end to end over {len(report.tuning)} pass{'es' * (len(report.tuning) > 1)}; mean "
            f"divergence from the original on the calibration data, pass by pass: {passes} (the data SNR is "
            "the layer-wise one, before tuning)"
        )
    for warning in report.warnings:
        console.print(f"[yellow]warning: {shown(warning)}[/yellow]")
    if result.kv_cache is not None:
        console.print(f"[bold]Cache[/bold]: {result.kv_cache.line()}")
    if result.spot_check is not None:
        console.print(spot_line(result))


def spot_line(result: CompressionFileResult) -> str:
    """The spot check's numbers; where the result is broken, a plain warning naming the methods
    that learn from data (when the run used none)."""
    from coreai_opt.compression import algorithm_named, config_type, methods
    from coreai_opt.evaluation import BROKEN_KL, BROKEN_TOP1

    spot = result.spot_check
    line = (f"[bold]Spot check[/bold] ({spot.tokens} tokens of Python's documentation, against the original): "
            f"KL {spot.kl_mean:.4f}, top-1 {spot.top1:.3f}, perplexity {100 * spot.perplexity_increase:+.1f}%")  # fmt: skip
    if not spot.broken:
        return line
    kind = config_type(result.method)
    learning = sorted((m for m in methods(kind) if not algorithm_named(kind, m).data_free),
                      key=lambda m: m not in ("gptq", "sparsegpt"))  # the Hessian methods first  # fmt: skip
    hint = ""
    if result.report.calibration is None and learning:  # the run learned nothing from data
        hint = (
            f" A method that learns from data usually fixes this: --method {learning[0]} --calibration TEXT."
        )
    return (f"{line}\n[red]warning: the result looks broken: its most likely next token is the original's "
            f"{100 * spot.top1:.0f}% of the time (below {100 * BROKEN_TOP1:.0f}% or KL above {BROKEN_KL:g} says broken).{hint}[/red]")  # fmt: skip


def _finite(*values: float | None) -> bool:
    return all(v is not None and v not in (float("inf"), float("-inf")) for v in values)


def compression_line(result: CompressionFileResult) -> str:
    report = result.report
    ratio = f" ({report.total_ratio:.2f}x)" if report.total_ratio else ""
    warnings = f", {len(report.warnings)} warnings" if report.warnings else ""
    if result.kv_cache is not None:
        warnings += f"; cache {result.kv_cache.dtype} ({result.kv_cache.state_bytes_after:,} state bytes)"
    spot = result.spot_check
    if spot is not None:
        warnings += f"; spot check KL {spot.kl_mean:.4f}, top-1 {spot.top1:.3f}" + (
            " - BROKEN" if spot.broken else ""
        )
    return (
        f"{result.method} {result.source} -> {result.output}: {len(report.weights)} weights compressed, "
        f"{len(report.skipped)} skipped; float tensors {human_bytes(report.total_bytes_before)} -> "
        f"{human_bytes(report.total_bytes_after)}{ratio}; file {human_bytes(result.file_bytes_before)} -> "
        f"{human_bytes(result.file_bytes_after)}{warnings}; {result.seconds:.1f} s"
    )
