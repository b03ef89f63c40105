"""`coreopt inspect`: what a model file holds."""

from __future__ import annotations

from pathlib import Path

import typer

from .._common import (
    json_option,
    print_json,
    quiet_option,
    trust_pickle_option,
    user_errors,
)


def register(app: typer.Typer) -> None:
    app.command()(inspect)


def inspect(
    model: Path = typer.Argument(..., help="A .pt2 (torch.export) or .aimodel (Core AI) file."),
    trust_pickle: bool = trust_pickle_option(),
    quiet: bool = quiet_option(),
    as_json: bool = json_option(),
) -> None:
    """Show inputs, outputs, an op histogram and how every weight is stored.

    Example: coreopt inspect sample_models/transformer.aimodel --json
    """
    from coreai_opt.inspection import inspect_model

    from ..render import model_line, print_line, render_model_report

    with user_errors(as_json):
        report = inspect_model(model, trust_pickle=trust_pickle)
    if as_json:
        print_json(report.to_dict())
    elif quiet:
        print_line(model_line(report))
    else:
        render_model_report(report)
