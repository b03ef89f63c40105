"""`coreopt eval --task`: multiple-choice accuracy of every program, a row each."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from coreai_opt.compression import flag_names
from coreai_opt.evaluation import EvalConfig

from .._common import human_bytes, print_json, shown, user_errors
from .._progress import weight_progress

TASK_SUFFIXES = (".jsonl", ".json")


def check_task(task: Path, values: dict[str, Any]) -> None:
    """Usage errors before any model loads: --task alone of the data options, a JSON lines file,
    no text bounds or plot."""
    others = [flag for key, flag in (("text", "--text"), ("tokens", "--tokens"), ("inputs", "--inputs"))
              if values.get(key) is not None]  # fmt: skip
    if others:
        raise typer.BadParameter(f"give --task or {others[0]}, not both", param_hint="--task")
    if task.suffix.lower() not in TASK_SUFFIXES:
        raise typer.BadParameter(
            f"{task}: give a task as JSON lines ({', '.join(TASK_SUFFIXES)})", param_hint="--task"
        )
    text_only = (("max_ppl_increase", "--max-ppl-increase"), ("max_kl", "--max-kl"), ("plot", "--plot"),
                 ("max_tokens", "--max-tokens"), ("stride", "--stride"), ("device", "--device"))  # fmt: skip
    for key, flag in text_only:
        if values.get(key) is not None:
            raise typer.BadParameter(f"{flag} serves --text, not --task", param_hint=flag)


def run_task(values: dict[str, Any], config: EvalConfig, silent: bool) -> None:
    from coreai_opt.evaluation import evaluate_task

    programs = [values["reference"], *(values["candidates"] or [])]
    with (
        user_errors(values["as_json"], flag_names(EvalConfig)),
        weight_progress(not silent, "scoring") as progress,
    ):
        result = evaluate_task(programs[0], programs[1:], task=values["task"], tokenizer=values["tokenizer"],
                               max_items=config.max_items, trust_pickle=values["trust_pickle"],
                               progress=progress)  # fmt: skip
    if values["as_csv"]:
        sys.stdout.write(result.to_csv())
    elif values["as_json"]:
        print_json(result.to_dict())
    elif values["quiet"]:
        from ..render import print_line

        print_line(f"task {Path(result.source).name}: " + "; ".join(
            f"{s.path.name}: acc {s.acc:.4f}, acc_norm {s.acc_norm:.4f}" for s in result.scores))  # fmt: skip
    else:
        _render(result)


def _pm(value: float, error: float | None) -> str:
    return f"{value:.4f}" + ("" if error is None else f" ± {error:.4f}")


def _render(result: Any) -> None:
    from ..render import console, distinct_tails, fitted_table

    console.print(f"[bold]{shown(Path(result.source).name)}[/bold]: {result.items} items")
    columns = [
        ("program", "left"),
        ("size", "right"),
        ("acc", "right"),
        ("acc_norm", "right"),
        ("seconds", "right"),
    ]
    names = distinct_tails([s.path.name for s in result.scores])
    rows = [[name, human_bytes(s.size_bytes), _pm(s.acc, s.acc_stderr), _pm(s.acc_norm, s.acc_norm_stderr),
             f"{s.seconds:.1f}"] for name, s in zip(names, result.scores, strict=True)]  # fmt: skip
    title = "Programs (the reference first; ± the standard error)"
    console.print(
        fitted_table(title, columns, rows, squeeze=((0, 14, "name"), (4, 0, "hide"), (1, 0, "hide")))
    )
