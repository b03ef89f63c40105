"""docs/cli.md's reference is every command's `--help` as the code prints it today."""

from __future__ import annotations

import importlib.util

from conftest import ROOT


def test_the_cli_reference_in_the_docs_is_up_to_date() -> None:
    spec = importlib.util.spec_from_file_location("cli_reference", ROOT / "scripts" / "cli_reference.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    assert module.DOC.read_text() == module.current(), "run: python scripts/cli_reference.py write"
