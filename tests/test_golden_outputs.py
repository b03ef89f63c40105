"""Refactors change no byte: a slice of the sample models compressed (every config kind), cast,
converted and inspected, against digests written before (tests/golden, by
scripts/compression_digests.py, which checks every sample in about 35 s)."""

from __future__ import annotations

import importlib.util
import json

from conftest import ROOT

GOLDEN = json.loads((ROOT / "tests" / "golden" / "compression_digests.json").read_text())
# one config of every kind and storage path: integer and float codes, E8M0 scales, MX, LUTs of
# scalars and vectors with quantized entries, sparsity alone and joint
CONFIGS = ("int4-block", "uint4-channel-asym", "fp8e5m2-e8m0", "mxfp4", "lut2-vector", "lut8-int8-scale",
           "sparse-2of4-int8", "sparse50-lut4")  # fmt: skip


def _script():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(
        "compression_digests", ROOT / "scripts" / "compression_digests.py"
    )
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_compressed_outputs_and_reports_are_the_golden_bytes() -> None:
    found = _script().digests(("transformer",), CONFIGS)
    assert len(found) == 2 * len(CONFIGS)
    assert {key: GOLDEN[key] for key in found} == found


def test_cast_converted_and_inspected_samples_are_the_golden_bytes() -> None:
    found = _script().digests(("mlp",))
    assert {key for key in found if ":" in key and key.split(":")[1] in ("cast-16bit", "convert", "inspect")} == {
        "mlp.pt2:cast-16bit", "mlp.pt2:convert", "mlp.pt2:inspect", "mlp.aimodel:inspect",
    }  # fmt: skip
    assert {key: GOLDEN[key] for key in found} == found
