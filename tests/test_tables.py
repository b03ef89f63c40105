"""Tables at 80 columns (CI logs, `| less`) and 60 (a split pane): no line wider, every weight name
whole (broken after its dots, never cut), every header whole, a column left out only where the
caption says so."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cli import _common
from cli.render import fitted_table, reflow

LONG = "encoder.layers.0.self_attention.query_key_value_projection.weight"


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.query_key_value_projection = torch.nn.Linear(64, 64, bias=False)
        self.output_projection_with_a_long_name = torch.nn.Linear(64, 48, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output_projection_with_a_long_name(torch.relu(self.query_key_value_projection(x)))


class _Layer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.self_attention = _Block()
        self.feed_forward_down = torch.nn.Linear(48, 64, bias=False)  # input 48: no block of 32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.feed_forward_down(self.self_attention(x))


class _Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = torch.nn.Module()
        self.encoder.layers = torch.nn.ModuleList([_Layer(), _Layer()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.encoder.layers:
            x = layer(x)
        return x


@pytest.fixture(scope="module")
def long_names(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    import coreai_torch

    torch.manual_seed(0)
    model = _Model().eval()
    path = tmp_path_factory.mktemp("tables") / "long.pt2"
    program = torch.export.export(model, (torch.randn(2, 64),))
    torch.export.save(program.run_decompositions(coreai_torch.get_decomp_table()), path)
    return path, [name for name, _ in model.named_parameters()]


def _names_in(output: str, header: str) -> list[str]:
    """The first column of every table whose header starts with `header`, wrapped names joined."""
    names: list[str] = []
    lines = output.splitlines()
    for at, line in enumerate(lines):
        if not line.startswith(f" {header} "):
            continue
        start = len(line) - len(line[len(header) + 1 :].lstrip())  # where the second column begins
        for row in lines[at + 2 :]:
            if not row.strip():
                break
            first = row[:start].strip()
            if names and names[-1].endswith((".", "_", "-")):
                names[-1] += first  # a name goes on after the separator it broke at
            elif first:
                names.append(first)
    return names


@pytest.mark.parametrize("width", [80, 60])
def test_command_tables_fit_and_keep_names_whole(
    long_names, coreopt, tmp_path: Path, width: int, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(_common.console, "width", width)
    path, names = long_names
    q4 = tmp_path / "q4.pt2"
    runs = {
        "inspect": coreopt("inspect", path),
        "quantize": coreopt("quantize", path, "--dtype", "int4", "--granularity", "block", "--block-size", "32",
                            "--threshold", "0", "-o", q4),
        "palettize": coreopt("palettize", path, "--nbits", "4", "--granularity", "grouped", "--group-size", "16",
                             "--lut-dtype", "int8", "--threshold", "0", "-o", tmp_path / "p4.pt2"),
    }  # fmt: skip
    runs["compare"] = coreopt("compare", path, q4, tmp_path / "p4.pt2")
    for command, done in runs.items():
        assert done.exit_code == 0, (command, done.stderr)
        lines = done.stdout.splitlines()
        assert max(map(len, lines)) <= width, (command, done.stdout)
        assert "…" not in done.stdout.replace("…q4.pt2", "").replace("…p4.pt2", ""), (
            done.stdout
        )  # nothing cut
    assert sorted(_names_in(runs["inspect"].stdout, "name")) == sorted(names)
    quantized = _names_in(runs["quantize"].stdout, "name")  # the weights table, then the skipped one
    assert sorted(quantized) == sorted(names) and quantized[-1].endswith("feed_forward_down.weight")
    assert sorted(_names_in(runs["palettize"].stdout, "name")) == sorted(names)
    header = next(line for line in runs["inspect"].stdout.splitlines() if line.startswith(" name "))
    assert header.split() == (["name", "kind", "shape", "encoding", "bytes", "bits/w"] if width == 80 else
                              ["name", "shape", "encoding", "bytes", "bits/w"])  # fmt: skip
    assert ("left out at this width: kind" in runs["inspect"].stdout) == (width == 60)


def test_columns_give_way_in_order_and_hidden_ones_are_named(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from rich.console import Console

    headers = ["program", "size", "bits/w", "perplexity", "Δ ppl", "KL mean", "KL p99", "top-1", "tok/s"]
    rows = [[LONG, "12.3 MiB", "4.01", "18.662", "+14.5%", "0.17600", "1.2345", "0.8123", "1234"]]
    squeeze = ((0, 14, "name"), (8, 0, "hide"), (6, 0, "hide"), (1, 0, "hide"))
    for width, hidden in ((120, []), (80, ["tok/s"]), (60, ["tok/s", "KL p99", "size"])):
        monkeypatch.setattr(_common.console, "width", width)
        table = fitted_table("t", [(h, "left") for h in headers], [list(r) for r in rows], squeeze=squeeze)
        console = Console(width=width, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
        console.print(table)
        text = console.export_text()
        assert max(map(len, text.splitlines())) <= width
        shown = [h for h in headers if h not in hidden]
        assert [c.header for c in table.columns] == shown
        assert f"left out at this width: {', '.join(hidden)}" in text if hidden else "left out" not in text
        assert "".join(_names_in(text, "program")) == LONG


def test_reflow_breaks_names_after_dots_then_underscores_never_cutting() -> None:
    assert reflow(LONG, 24, "name").splitlines() == [
        "encoder.layers.0.",
        "self_attention.query_",  # the part too long for a line broken after its underscores
        "key_value_projection.",
        "weight",
    ]
    assert reflow("a" * 30, 12, "name").splitlines() == ["a" * 12, "a" * 12, "a" * 6]
    assert reflow("si4 + f32 scale per channel", 10, "text").splitlines() == [
        "si4 + f32",
        "scale per",
        "channel",
    ]
    assert reflow("ui4 LUT(16 x si8)", 12, "cut") == "ui4 LUT(16 …"
    for width in range(4, len(LONG) + 1):
        lines = reflow(LONG, width, "name").splitlines()
        assert "".join(lines) == LONG and max(map(len, lines)) <= width
