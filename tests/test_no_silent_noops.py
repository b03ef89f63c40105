"""Options that do nothing fail loudly; an encoding that would grow a weight is not applied; report
totals cover every float tensor of the program."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _casting import export
from conftest import SAMPLES
from torch import nn

from coreai_opt.compression import PalettizeConfig, SkipKind
from coreai_opt.io import load_pt2, save_pt2
from coreai_opt.recipes import compress_file


class DepthwiseBlock(nn.Module):
    """A depthwise 3x3 conv (576 weights: one 16-entry LUT per channel outweighs them) and a
    pointwise 1x1 conv (4,096 weights: LUTs pay off)."""

    def __init__(self) -> None:
        super().__init__()
        self.depthwise = nn.Conv2d(64, 64, 3, padding=1, groups=64, bias=False)
        self.pointwise = nn.Conv2d(64, 64, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pointwise(torch.relu(self.depthwise(x)))


def _float_bytes(path: Path) -> dict[str, int]:
    program = load_pt2(path)
    return {k: v.numel() * v.element_size() for k, v in program.state_dict.items() if v.is_floating_point()}


def test_an_encoding_that_would_grow_a_weight_is_kept_and_totals_cover_every_tensor(tmp_path: Path) -> None:
    torch.manual_seed(0)
    source = tmp_path / "dw.pt2"
    save_pt2(export(DepthwiseBlock(), torch.randn(1, 64, 8, 8)), source)
    config = PalettizeConfig(n_bits=4, granularity="channel", weight_num_threshold=0)
    result = compress_file(source, tmp_path / "dw.lut4.pt2", config)
    report = result.report
    grown = [s for s in report.skipped if s.kind is SkipKind.WOULD_GROW]
    # 576 fp32 values: 2,304 bytes; 4-bit indices 288 bytes + 64 LUTs of 16 fp32 entries 4,096 bytes
    assert [(s.name, s.shape, s.reason, s.nbytes) for s in grown] == [
        ("depthwise.weight", (64, 1, 3, 3), "kept: would grow (2,304 -> 4,384 bytes)", 2304)
    ]
    assert [(w.name, w.bytes_before, w.bytes_after) for w in report.weights] == [
        ("pointwise.weight", 16384, 2048 + 4096)
    ]
    before, after = _float_bytes(source), _float_bytes(result.output)
    assert after["depthwise.weight"] == 2304  # left as it was
    assert report.total_bytes_before == sum(before.values()) == 2304 + 16384
    assert report.total_bytes_after == 2304 + 6144
    assert report.total_ratio == pytest.approx((2304 + 16384) / (2304 + 6144))
    document = report.to_dict()
    assert (document["total_bytes_before"], document["total_bytes_after"], document["kept_bytes"]) == (
        18688, 8448, 2304,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (
            ["quantize", "{model}", "--dtype", "int4", "--granularity", "block", "--block-size", "33"],
            "nothing was compressed (3 weights left, e.g. 2 as 'input axis length 128 is not a multiple of "
            "block_size 33')",
        ),
        (
            ["palettize", "{model}", "--override", "no.such.layer*:skip"],
            "override 'no.such.layer*' matched no weight (names are like '",
        ),
        (["sparsify", "{model}", "--threshold", "100000000"], "nothing was compressed (no eligible weight"),
        (["cast", "{pt2}", "--ignore-op", "aten.softmax", "--no-check"], "the program calls no aten.softmax"),
    ],
)
def test_options_that_do_nothing_exit_1_and_write_nothing_unless_allowed(
    args: list[str], problem: str, tmp_path: Path, coreopt
) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / ("out.pt2" if "{pt2}" in args else "out.aimodel")
    args = [a.format(model=SAMPLES / "mlp.aimodel", pt2=SAMPLES / "mlp.pt2") for a in args]
    refused = coreopt(*args, "-o", out)
    assert refused.exit_code == 1
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and problem in lines[0] and "--allow-empty" in lines[0], refused.stderr
    assert not out.exists()
    allowed = coreopt(*args, "-o", out, "--allow-empty", "--json")
    assert allowed.exit_code == 0, allowed.stderr
    assert out.exists()
