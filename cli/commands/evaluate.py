"""`coreopt eval`: what compression costs on real data - perplexity, KL and top-1 on a text."""

from __future__ import annotations

import dataclasses
import enum
import inspect
import math
import sys
from pathlib import Path
from typing import Any

import typer

from coreai_opt.compression import flag_names
from coreai_opt.evaluation import EvalConfig

from .._common import (
    human_bytes,
    json_option,
    option_errors,
    print_json,
    quiet_option,
    shown,
    trust_pickle_option,
    user_errors,
)
from .._config_options import config_from_options, config_parameters, keyword
from .._progress import weight_progress


class PlotMetric(enum.StrEnum):
    perplexity = "perplexity"
    kl = "kl"


def register(app: typer.Typer) -> None:
    app.command("eval")(evaluate)


_REFERENCE = typer.Argument(..., help="The reference .pt2 or .aimodel (e.g. the fp32 export).")
_CANDIDATES = typer.Argument(None, help="Compressed or cast programs to measure against it.")
_TEXT = typer.Option(None, "--text", help="A UTF-8 text file to score (cut with the tokenizer).")
_TOKENS = typer.Option(
    None, "--tokens", help="Token ids to score instead: a safetensors file with one integer tensor."
)
_TOKENIZER = typer.Option(
    None, "--tokenizer", help="A tokenizer.json (default: the one coreopt export saved beside REFERENCE)."
)
_INPUTS = typer.Option(
    None,
    "--inputs",
    help="Not a language model: a safetensors dataset (file or folder) to compare outputs on.",
)
_TASK = typer.Option(
    None,
    "--task",
    help="Multiple-choice accuracy instead: JSON lines of context, choices and label (or HellaSwag, "
    "ARC, PIQA, Winogrande lines as distributed), scored as lm-eval-harness scores them.",
)
_CSV = typer.Option(False, "--csv", help="Print one CSV row per program instead of a table.")
_PLOT = typer.Option(None, "--plot", help="Also write a PNG of the metric against bits per weight.")
_PLOT_METRIC = typer.Option(PlotMetric.perplexity, "--plot-metric", help="What --plot draws.")


def evaluate(**values: Any) -> None:
    """Score language models on a text: perplexity of each program, and each candidate's KL
    divergence from the reference's next-token distribution and top-1 agreement with it.

    The text is cut into windows of the programs' token length every --stride tokens; each token
    is scored once. A .pt2 runs in PyTorch (compressed weights decoded once), an .aimodel on the
    Core AI runtime. One row per program: size, bits per weight, perplexity and its increase, KL
    mean and 99th percentile, top-1, tokens per second. With --inputs (models that are not
    language models) it compares outputs on that dataset, as `coreopt compare --inputs` does.

    Example: coreopt eval smol.pt2 smol.int4.pt2 smol.lut4.pt2 --text corpus.txt --max-tokens 4096

    Example: coreopt eval smol.pt2 smol.int8.aimodel --text corpus.txt --max-ppl-increase 1 --json

    Example: coreopt eval ref.pt2 a.pt2 b.pt2 --text corpus.txt --csv --plot ppl.png

    With --task, each program's multiple-choice accuracy instead (acc, and acc_norm: each choice's
    log-likelihood over its length in characters), with its standard error, as lm-eval-harness
    scores loglikelihood tasks; contexts longer than the window are cut from the left.

    Example: coreopt eval bert.pt2 bert.int8.pt2 --inputs batch.safetensors

    Example: coreopt eval smol.pt2 smol.int4.pt2 --task hellaswag_val.jsonl --max-items 500 --json
    """
    as_csv, as_json, quiet, plot = values["as_csv"], values["as_json"], values["quiet"], values["plot"]
    reference, candidates, text, tokens = (
        values["reference"],
        values["candidates"] or [],
        values["text"],
        values["tokens"],
    )
    _exclusive(as_csv, as_json)
    config = config_from_options(EvalConfig, {k: v for k, v in values.items() if k in _SCORING})
    if values["max_items"] is not None and values["task"] is None:
        raise typer.BadParameter("--max-items serves --task", param_hint="--max-items")
    if values["task"] is not None:
        from ._task import check_task, run_task

        check_task(values["task"], values)
        run_task(values, config, quiet or as_json or as_csv)
        return
    if values["inputs"] is not None:
        if values["device"] is not None:
            raise typer.BadParameter("--device serves --text and --tokens", param_hint="--device")
        _outputs(reference, candidates, values["inputs"], text or tokens, values["trust_pickle"], quiet, as_json,
                 as_csv, plot)  # fmt: skip
        return
    _check_text(text, tokens, plot)
    result = _score(reference, candidates, text, tokens, values["tokenizer"], config, values["trust_pickle"], plot,
                    values["plot_metric"], quiet or as_json or as_csv)  # fmt: skip
    failures = config.failures(result)
    _report(result, failures, as_csv, as_json, quiet)
    if failures:
        raise typer.Exit(1)


_SCORING = {f.name for f in dataclasses.fields(EvalConfig)}


def _signature() -> inspect.Signature:
    """The command's arguments and options: the programs and data, how it scores (EvalConfig's
    fields, declared there once), how the result is shown."""

    return inspect.Signature([
        keyword("reference", _REFERENCE, Path), keyword("candidates", _CANDIDATES, list[Path]),
        keyword("text", _TEXT, Path | None), keyword("tokens", _TOKENS, Path | None),
        keyword("task", _TASK, Path | None),
        keyword("tokenizer", _TOKENIZER, Path | None), *config_parameters(EvalConfig),
        keyword("inputs", _INPUTS, Path | None), keyword("as_csv", _CSV, bool), keyword("plot", _PLOT, Path | None),
        keyword("plot_metric", _PLOT_METRIC, PlotMetric), keyword("trust_pickle", trust_pickle_option(), bool),
        keyword("quiet", quiet_option(), bool), keyword("as_json", json_option(), bool),
    ])  # fmt: skip


evaluate.__signature__ = _signature()  # type: ignore[attr-defined]


def _exclusive(as_csv: bool, as_json: bool) -> None:
    if as_csv and as_json:
        raise typer.BadParameter("give --csv or --json, not both", param_hint="--csv")


def _check_text(text: Path | None, tokens: Path | None, plot: Path | None) -> None:
    """Usage errors before any model loads: exactly one of --text and --tokens (a .safetensors
    file), not an empty file; a writable --plot."""
    if (text is None) == (tokens is None):
        raise typer.BadParameter("give --text or --tokens (one of them)", param_hint="--text")
    given, flag = (text, "--text") if text is not None else (tokens, "--tokens")
    assert given is not None
    if tokens is not None and tokens.suffix.lower() != ".safetensors":
        raise typer.BadParameter(f"{tokens}: give token ids as a .safetensors file", param_hint=flag)
    if given.is_file() and given.stat().st_size == 0:
        raise typer.BadParameter(f"{given} is empty", param_hint=flag)
    if plot is not None:
        from coreai_opt.comparison import check_plot_path

        with option_errors({}, "--plot"):
            check_plot_path(plot)


def _report(result: Any, failures: list[str], as_csv: bool, as_json: bool, quiet: bool) -> None:
    if as_csv:
        sys.stdout.write(result.to_csv())
    elif as_json:
        print_json(result.to_dict() | {"ok": not failures})
    elif quiet:
        from ..render import print_line

        print_line(_line(result, failures))
    else:
        _render(result, failures)


def _score(reference: Path, candidates: list[Path], text: Path | None, tokens: Path | None, tokenizer: Path | None,
           config: Any, trust_pickle: bool, plot: Path | None, plot_metric: PlotMetric, silent: bool) -> Any:  # fmt: skip
    from coreai_opt.evaluation import evaluate_text, plot_evaluation

    with user_errors(False, flag_names(EvalConfig)), weight_progress(not silent, "scoring") as progress:
        result = evaluate_text(
            reference, candidates, text=text, tokens=tokens, tokenizer=tokenizer, config=config,
            trust_pickle=trust_pickle, progress=progress,
        )  # fmt: skip
        if plot is not None:
            plot_evaluation(result, plot, metric=plot_metric.value)
    return result


def _outputs(reference: Path, candidates: list[Path], inputs: Path, text: Path | None, trust_pickle: bool,
             quiet: bool, as_json: bool, as_csv: bool, plot: Path | None) -> None:  # fmt: skip
    from . import compare as compare_command

    if text is not None:
        raise typer.BadParameter("give --inputs or --text/--tokens, not both", param_hint="--inputs")
    if not candidates:
        raise typer.BadParameter(
            "give at least one candidate to compare on --inputs", param_hint="CANDIDATES"
        )
    options = {"inputs": inputs, "samples": 1, "seed": 0, "int_range": None, "min_cosine": None,
               "trust_pickle": trust_pickle}  # fmt: skip
    result, one = compare_command._run(reference, candidates, options, plot, as_json, as_csv, quiet)
    compare_command._show(result, one, as_csv, as_json, quiet)


def _pct(value: float | None) -> str:
    if value is None:
        return "-"
    return "inf" if not math.isfinite(value) else f"{100 * value:+.2f}%"


def _num(value: float | None, spec: str) -> str:
    if value is None:
        return "-"
    return "inf" if not math.isfinite(value) else format(value, spec)


def _line(result: Any, failures: list[str]) -> str:
    parts = [f"eval {result.reference.path.name}: ppl {_num(result.reference.perplexity, '.3f')}"]
    for row in result.candidates:
        parts.append(f"{row.path.name}: ppl {_num(row.perplexity, '.3f')} ({_pct(row.perplexity_increase)}), "
                     f"KL {_num(row.kl_mean, '.4f')}, top-1 {_num(row.top1, '.3f')}")  # fmt: skip
    return "; ".join(parts) + ("" if not failures else f" - FAILED: {'; '.join(failures)}")


def _render(result: Any, failures: list[str]) -> None:
    from ..render import console, distinct_tails, fitted_table

    w = result.windows
    console.print(
        f"[bold]{shown(Path(result.source).name)}[/bold]: {w.tokens} tokens, {len(w.starts)} windows of {w.length} "
        f"every {w.stride}, {w.scored} tokens scored"
        + (f" ({w.dropped} past the last window not)" if w.dropped else "")
    )
    columns = [("program", "left")] + [(c, "right") for c in
               ("size", "bits/w", "perplexity", "Δ ppl", "KL mean", "KL p99", "top-1", "tok/s")]  # fmt: skip
    rows_in = [result.reference, *result.candidates]
    names = distinct_tails([r.path.name for r in rows_in])
    rows = []
    for name, row in zip(names, rows_in, strict=True):
        rows.append([
            name, human_bytes(row.size_bytes), _num(row.bits_per_weight, ".2f"), _num(row.perplexity, ".3f"),
            _pct(row.perplexity_increase), _num(row.kl_mean, ".5f"), _num(row.kl_p99, ".4f"), _num(row.top1, ".4f"),
            _num(row.tokens_per_second, ".0f"),
        ])  # fmt: skip
    title = "Programs (the reference first; --json, --csv: every column)"
    hide = ((8, 0, "hide"), (6, 0, "hide"), (1, 0, "hide"))  # tok/s, KL p99, size
    console.print(fitted_table(title, columns, rows, squeeze=((0, 14, "name"), *hide)))
    for line in failures:
        console.print(f"[red]over budget[/red] {shown(line)}")
