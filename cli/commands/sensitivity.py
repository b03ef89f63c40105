"""`coreopt sensitivity`: what compressing each weight alone costs on a text, ranked."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import typer

from .._common import human_bytes, json_option, option_errors, print_json, quiet_option, shown, user_errors
from .._progress import weight_progress


def register(app: typer.Typer) -> None:
    app.command("sensitivity")(sensitivity)


_MODEL = typer.Argument(..., help="The .pt2 language model (e.g. from coreopt export).")
_CONFIG = typer.Option(
    ...,
    "--config",
    help="The compression to try on each weight: a config file (JSON or YAML, as a recipe's compress "
    "step holds it) or KIND:key=value,... e.g. palettize:n_bits=4,granularity=grouped,group_size=16.",
)
_TEXT = typer.Option(None, "--text", help="A UTF-8 text file to measure on.")
_TOKENS = typer.Option(None, "--tokens", help="Token ids instead: a safetensors file.")
_TOKENIZER = typer.Option(None, "--tokenizer", help="A tokenizer.json (default: the sidecar).")
_MAX_TOKENS = typer.Option(None, "--max-tokens", min=2, help="Measure on at most this many tokens.")
_ESTIMATE = typer.Option(True, "--estimate/--no-estimate", help="Also the Fisher estimate (--text).")
_EXACT_PRODUCTS = typer.Option(
    False,
    "--exact-products",
    help="Take every trial's matrix products (and the estimate's gradients) in the program's own "
    "dtypes. By default, on CPUs with bfloat16 instructions, a trial's products are the reference's "
    "plus bfloat16 products of the differences: ~2.6x faster, KLs within ~0.3%.",
)
_TOP = typer.Option(20, "--top", min=1, help="Rows shown at each end of the ranking (--json: all).")
_DEVICE = typer.Option(
    None,
    "--device",
    help="Where the program's runs, the trials and the estimate's gradients take place: cpu (default), cuda, "
    "cuda:1, ... (the weights are encoded on the host).",
)


def sensitivity(
    model: Path = _MODEL,
    config: str = _CONFIG,
    text: Path | None = _TEXT,
    tokens: Path | None = _TOKENS,
    tokenizer: Path | None = _TOKENIZER,
    max_tokens: int | None = _MAX_TOKENS,
    estimate: bool = _ESTIMATE,
    exact_products: bool = _EXACT_PRODUCTS,
    top: int = _TOP,
    device: str | None = _DEVICE,
    quiet: bool = quiet_option(),
    as_json: bool = json_option(),
) -> None:
    """Compress one weight at a time in memory and measure each alone on a text: the KL divergence
    from the program's own next-token distribution, the perplexity increase and the bytes saved,
    ranked from the most sensitive. Nothing is written. A weight's trial reruns the program from
    that weight's first reader only. Beside it, the Fisher (second-order Taylor) estimate and its
    rank correlation with the measurement. --json keeps every row for coreopt optimize.

    Example: coreopt sensitivity smol.pt2 --text corpus.txt --config palettize:n_bits=4 --max-tokens 8192

    Example: coreopt sensitivity smol.pt2 --text corpus.txt --config int4.yaml --json > sensitivity.json

    Example: coreopt sensitivity big.pt2 --text corpus.txt --config quantize:dtype=int4 --device cuda
    """
    from coreai_opt.evaluation import weight_sensitivity
    from coreai_opt.recipes import config_from_text

    if (text is None) == (tokens is None):
        raise typer.BadParameter("give --text or --tokens (one of them)", param_hint="--text")
    with user_errors(as_json), option_errors({}, "--config"):  # a bad file exits 1, a bad value 2
        parsed = config_from_text(config)
    with (
        user_errors(as_json, {"max_tokens": "--max-tokens"}),
        weight_progress(not (quiet or as_json), "measuring") as bar,
    ):
        result = weight_sensitivity(
            model, parsed, text=text, tokens=tokens, tokenizer=tokenizer, max_tokens=max_tokens,
            estimate=estimate, exact_products=exact_products, device=device, progress=bar,
        )  # fmt: skip
    if as_json:
        print_json(result.to_dict())
    elif quiet:
        from ..render import print_line

        print_line(_line(result))
    else:
        _render(result, top)


def _line(result: Any) -> str:
    top = result.weights[0] if result.weights else None
    rho = "-" if result.rank_correlation is None else f"{result.rank_correlation:.3f}"
    head = f"{top.name} (KL {top.kl_mean:.5f})" if top else "-"
    return (f"sensitivity {result.program.name}: {len(result.weights)} weights on {result.windows.scored} tokens "
            f"in {result.seconds:.1f} s; most sensitive {head}; rank correlation with the estimate {rho}")  # fmt: skip


def _render(result: Any, top: int) -> None:
    from ..render import console, fitted_table

    w = result.windows
    console.print(
        f"[bold]{shown(result.program.name)}[/bold], {result.config['kind']} on {w.scored} tokens "
        f"({len(w.starts)} windows of {w.length}), reference perplexity {result.reference_perplexity:.3f}, "
        f"products: {result.products}"
    )
    rows_in = (
        result.weights if len(result.weights) <= 2 * top else result.weights[:top] + result.weights[-top:]
    )
    columns = [("#", "right"), ("weight", "left")] + [
        (c, "right") for c in ("KL mean", "Δ ppl", "top-1", "saved", "estimate")
    ]
    rank = {id(r): i + 1 for i, r in enumerate(result.weights)}
    rows = [
        [str(rank[id(r)]), r.name, f"{r.kl_mean:.5f}", f"{100 * r.perplexity_increase:+.3f}%",
         f"{r.top1:.4f}", human_bytes(r.bytes_saved), "-" if r.estimate is None else f"{r.estimate:.3g}"]
        for r in rows_in
    ]  # fmt: skip
    title = "Weights, most sensitive first" + (
        "" if rows_in is result.weights else f" (top and bottom {top})"
    )
    console.print(
        fitted_table(title, columns, rows, squeeze=((1, 14, "name"), (6, 0, "hide"), (4, 0, "hide")))
    )
    if result.rank_correlation is not None and not math.isnan(result.rank_correlation):
        console.print(
            f"Spearman rank correlation, measured KL vs estimate: {result.rank_correlation:.3f} "
            f"(measured in {result.seconds - result.estimate_seconds:.1f} s, estimate in {result.estimate_seconds:.1f} s)"
        )
    if result.skipped:
        console.print(f"{len(result.skipped)} weights the config leaves alone (--json lists them)")
