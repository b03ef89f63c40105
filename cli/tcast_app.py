"""`tcast`: low-precision number formats; inspect them and cast tensor files to them."""

from __future__ import annotations

import typer

from tcast import __version__

from ._common import version_option

app = typer.Typer(
    name="tcast",
    help="TensorCast: low-precision number formats and casts.\n\nExample: tcast --version",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback(invoke_without_command=True)
def _root(ctx: typer.Context, version: bool = version_option("tcast", __version__)) -> None:
    """TensorCast: low-precision number formats and casts."""
    if ctx.invoked_subcommand is None:
        typer.echo(ctx.get_help())


def main() -> None:
    app()


if __name__ == "__main__":
    main()
