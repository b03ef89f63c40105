"""`coreopt compare REF C1 C2 ...`: the reference runs once, one row per candidate, the same numbers
a one-candidate compare gives."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from conftest import SAMPLES

from coreai_opt.comparison import compare_files, compare_sweep
from coreai_opt.compression import PalettizeConfig, QuantizeConfig
from coreai_opt.inspection import inspect_model
from coreai_opt.recipes import compress_file


@pytest.fixture(scope="module")
def candidates(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    folder = tmp_path_factory.mktemp("sweep")
    source = SAMPLES / "transformer.aimodel"
    configs = [
        QuantizeConfig(dtype="int8"),
        PalettizeConfig(n_bits=4, granularity="channel"),
        PalettizeConfig(n_bits=2),
    ]
    return [compress_file(source, folder / f"c{i}.aimodel", c).output for i, c in enumerate(configs)]


def test_the_reference_runs_once_per_sample_and_rows_match_single_compares(candidates: list[Path]) -> None:
    reference = SAMPLES / "transformer.aimodel"
    calls: list[tuple[int, int, str]] = []
    sweep = compare_sweep(reference, candidates, samples=2, progress=lambda *a: calls.append(a))
    assert [c[2] for c in calls if c[2].startswith("transformer.aimodel")] == [
        "transformer.aimodel seed 0", "transformer.aimodel seed 1",
    ]  # fmt: skip
    assert len(calls) == 2 * (1 + len(candidates)) and all(c[1] == len(calls) for c in calls)
    assert [c[0] for c in calls] == list(range(1, len(calls) + 1))
    for row, path in zip(sweep.rows, candidates, strict=True):
        single = compare_files(reference, path, samples=2)
        assert row.candidate == path
        assert row.cosine_min == min(o.metrics.cosine for o in single.outputs)
        assert row.snr_db_min == min(o.metrics.snr_db for o in single.outputs)
        assert row.file_bytes == sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        assert row.bits_per_weight == inspect_model(path).mean_bits_per_weight
        assert row.ratio == sweep.reference_bytes / row.file_bytes
    cosines = [row.cosine_min for row in sweep.rows]
    assert cosines[0] > cosines[1] > cosines[2]  # int8 > 4-bit per channel > 2-bit per tensor
    sizes = [row.file_bytes for row in sweep.rows]
    assert sizes[2] < min(sizes[:2])  # (per-channel fp32 LUTs outweigh int8 codes on weights this small)


def test_cli_sweep_csv_json_and_plot(candidates: list[Path], tmp_path: Path, coreopt) -> None:  # type: ignore[no-untyped-def]
    reference = SAMPLES / "transformer.aimodel"
    table = coreopt("compare", reference, *candidates, "--csv")
    assert table.exit_code == 0, table.stderr
    rows = list(csv.DictReader(io.StringIO(table.stdout)))
    assert [r["candidate"] for r in rows] == [str(c) for c in candidates]
    assert list(rows[0]) == [
        "candidate", "file_bytes", "ratio", "bits_per_weight", "cosine_mean", "cosine_min", "snr_db_mean",
        "snr_db_min", "ok",
    ]  # fmt: skip
    document = json.loads(coreopt("compare", reference, *candidates, "--json", "--min-cosine", "0.99").stdout)
    assert [r["cosine_min"] for r in document["rows"]] == [float(r["cosine_min"]) for r in rows]
    assert [r["ok"] for r in document["rows"]] == [r["cosine_min"] >= 0.99 for r in document["rows"]]
    human = coreopt("compare", reference, *candidates)
    assert human.exit_code == 0 and "c1.aimodel" in human.stdout and "cos min" in human.stdout
    pytest.importorskip("matplotlib", reason="the plot extra is not installed (pip install 'coreopt[plot]')")
    png = tmp_path / "sweep.png"
    plotted = coreopt("compare", reference, *candidates, "--plot", png)
    assert plotted.exit_code == 0, plotted.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert coreopt("compare", reference, *candidates, "--plot", tmp_path / "sweep.jpg").exit_code == 2
