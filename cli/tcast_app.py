"""`tcast`: low-precision number formats; inspect them and cast tensor files to them."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import typer
from rich.panel import Panel
from rich.progress import Progress
from rich.table import Table

from tcast import CastMode, RoundMode, __version__

from ._common import (
    choices,
    console,
    err_console,
    force_option,
    json_option,
    option_errors,
    print_json,
    quiet_option,
    run,
    shown,
    user_errors,
    version_option,
)
from .render import print_line

ModeChoice = choices("ModeChoice", tuple(CastMode))
RoundChoice = choices("RoundChoice", tuple(RoundMode))

app = typer.Typer(
    name="tcast",
    help="TensorCast: low-precision number formats and casts.\n\nExample: tcast inspect mxfp4e2",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _root(version: bool = version_option("tcast", __version__)) -> None:
    """TensorCast: low-precision number formats and casts."""


def _resolve(name: str):  # type: ignore[no-untyped-def]
    import tcast

    try:
        return tcast.lookup(name)
    except ValueError:
        try:
            return tcast.datatype(name)
        except ValueError as exc:
            raise ValueError(f"{name!r} is neither a predefined datatype nor a number spec ({exc})") from None


def _fmt(value: float) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


@app.command()
def inspect(
    name: str = typer.Argument(
        ..., help="A predefined datatype (mxfp4e2, int8_f, ...) or a number code (e4m3fn)."
    ),
    as_json: bool = json_option(),
) -> None:
    """Every property of a format; for formats of 8 bits or fewer, a table of every code.

    Example: tcast inspect float8_e4m3fnuz
    """
    from tcast import code_table

    with user_errors(as_json):
        dtype = _resolve(name)
        codes = code_table(dtype.nspec) if dtype.nspec.bits <= 8 else []
    doc = dtype.describe() | {"codes": [c.__dict__ for c in codes]}
    if as_json:
        print_json(doc)
        return
    element = doc["element"]
    lines = [
        f"[bold]{dtype.name}[/bold]  element {element['code']} ({element['kind']}, {element['bits']} bits)"
    ]
    lines.append(f"scale: {doc['scale']}")
    if doc["bits_per_value"] is not None:
        lines.append(f"bits per value incl. scale: {doc['bits_per_value']:.4g}")
    console.print(Panel.fit("\n".join(lines), title="tcast inspect"))
    props = Table(title="Element format", title_justify="left", show_header=False)
    props.add_column("property")
    props.add_column("value", justify="right")
    for key, value in element.items():
        props.add_row(key, _fmt(value))
    console.print(props)
    if codes:
        table = Table(title=f"Every code of {element['code']}", title_justify="left")
        for column in ("code", "bits", "value", "kind"):
            table.add_column(column, justify="right" if column != "kind" else "left")
        for c in codes:
            table.add_row(str(c.code), c.bits, _fmt(c.value), c.kind)
        console.print(table)


@app.command("list")
def list_types(
    filter_: str = typer.Option("", "--filter", help="Only names containing this text."),
    as_json: bool = json_option(),
) -> None:
    """Every predefined datatype, grouped by how it scales, with element format, scale and bits per value.

    Example: tcast list --filter mx
    """
    import tcast

    rows = []
    for name in sorted(tcast.PREDEFINED):
        if filter_.lower() not in name.lower():
            continue
        dtype = tcast.lookup(name)
        tiles = dtype.sspec.tiles if dtype.sspec else ()
        rows.append(
            {
                "name": name,
                "group": dtype.family,
                "element": dtype.nspec.code,
                "scale": dtype.sspec.code if dtype.sspec else None,
                "tile": "x".join(str(t.size or "channel") for t in tiles) or None,
                "bits_per_value": dtype.bits_per_value(),
            }
        )
    if as_json:
        print_json(rows)
        return
    for group in sorted({row["group"] for row in rows}):
        table = Table(title=group, title_justify="left")
        for column in ("name", "element", "scale", "bits/value"):
            table.add_column(column)
        for row in rows:
            if row["group"] == group:
                bpv = row["bits_per_value"]
                table.add_row(row["name"], row["element"], row["scale"] or "-", f"{bpv:.4g}" if bpv else "-")
        console.print(table)


@app.command()
def cast(
    source: Path = typer.Argument(..., help="Input .safetensors file."),
    dtype: str = typer.Option(..., "--dtype", help="Target datatype, e.g. mxfp4e2."),
    output: Path = typer.Option(..., "-o", "--output", help="Output .safetensors file."),
    mode: ModeChoice = typer.Option(  # type: ignore[valid-type]
        CastMode.VIRTUAL.value, "--mode", help="virtual (fake-quantized floats) or actual (codes + scales)."
    ),
    roundmode: RoundChoice = typer.Option(  # type: ignore[valid-type]
        RoundMode.EVEN.value, "--round", help="Rounding of the elements."
    ),
    only: str | None = typer.Option(None, "--only", help="Cast only tensors whose name matches this regex."),
    force: bool = force_option(),
    quiet: bool = quiet_option(),
    as_json: bool = json_option(),
) -> None:
    """Cast every float tensor of a safetensors file and report the error of each.

    Example: tcast cast weights.safetensors --dtype mxfp4e2 -o weights.mxfp4.safetensors
    """
    import re

    from tcast import cast_file

    with option_errors({}, "--dtype"):
        target = _resolve(dtype)
    with option_errors({}, "--only"):
        try:
            re.compile(only or "")
        except re.error as exc:
            raise ValueError(f"{only!r} is not a regular expression ({exc})") from None
    with (
        user_errors(as_json),
        Progress(
            console=err_console, transient=True, disable=as_json or quiet or not err_console.is_terminal
        ) as progress,
    ):
        task = progress.add_task("casting", total=None)
        results = cast_file(
            source,
            output,
            target,
            castmode=mode.value,
            roundmode=roundmode.value,
            only=only,
            force=force,
            progress=lambda name: progress.update(task, description=f"casting {shown(name)}", advance=1),
        )
    _show_cast(source, output, target, mode.value, results, as_json, quiet)


def _show_cast(source: Path, output: Path, target: Any, mode: str, results: list[Any], as_json: bool,
               quiet: bool) -> None:  # fmt: skip
    done = [r for r in results if not r.skipped]
    if as_json:
        print_json({"source": str(source), "output": str(output), "datatype": target.name, "mode": mode,
                    "tensors": [r.to_dict() for r in results], "cast": len(done)})  # fmt: skip
        return
    if quiet:
        sqnrs = [r.sqnr_db for r in done if math.isfinite(r.sqnr_db)]
        mean = f", mean SQNR {sum(sqnrs) / len(sqnrs):.2f} dB" if sqnrs else ""
        print_line(f"tcast cast {source} -> {output} ({target.name}, {mode}): {len(done)} tensors cast{mean}")
        return
    table = Table(title=shown(f"{source} -> {output} ({target.name}, {mode})"), title_justify="left")
    for column in ("tensor", "shape", "SQNR dB", "max abs err", "bits/value"):
        table.add_column(column, justify="left" if column in ("tensor", "shape") else "right")
    for r in results:
        if r.skipped:
            table.add_row(
                shown(r.name), str(list(r.shape)), f"[dim]skipped: {shown(r.skipped)}[/dim]", "", ""
            )
        else:
            table.add_row(shown(r.name), str(list(r.shape)), f"{r.sqnr_db:.2f}", f"{r.max_abs_error:.4g}",
                          f"{r.bits_per_value:.3f}")  # fmt: skip
    console.print(table)
    if done:
        mean = sum(r.sqnr_db for r in done if math.isfinite(r.sqnr_db)) / max(1, len(done))
        console.print(f"[bold]Totals[/bold]: {len(done)} tensors cast, mean SQNR {mean:.2f} dB")


@app.command()
def upcast(
    source: Path = typer.Argument(..., help="A file written by `tcast cast --mode actual`."),
    output: Path = typer.Option(..., "-o", "--output", help="Output .safetensors file of floats."),
    force: bool = force_option(),
    quiet: bool = quiet_option(),
    as_json: bool = json_option(),
) -> None:
    """Restore float tensors from codes and scales.

    Example: tcast upcast weights.mxfp4.safetensors -o weights.restored.safetensors

    Example: tcast upcast weights.mxfp4.safetensors -o weights.restored.safetensors --force --json
    """
    from tcast import upcast_file

    with user_errors(as_json):
        names = upcast_file(source, output, force=force)
    if as_json:
        print_json({"source": str(source), "output": str(output), "restored": names})
        return
    print_line(f"tcast upcast {source} -> {output}: restored {len(names)} tensors")


def main() -> None:
    run(app)


if __name__ == "__main__":
    main()
