"""FP pass, state: parameters, buffers and lifted constants go to fp16 unless a finite value overflows."""

from __future__ import annotations

import torch
from _casting import export, meta_mismatches, node, run_cast
from torch import nn

from coreai_opt.casting import CastTarget, StateOutcome, cast_fp32_to_fp16, cast_program


class Stateful(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        with torch.no_grad():
            self.fc.weight[0, :4] = torch.tensor([1e-9, -1e-9, 0.0, -0.0])  # below fp16's smallest subnormal
            self.fc.weight[1, 0] = 3e-8  # rounds to 2**-24 anyway
        self.register_buffer(
            "big", torch.tensor([1.0, -7.0e4, 2.0, float("inf")]).repeat(2)
        )  # 7e4 > fp16 max
        self.register_buffer("edge", torch.tensor([65504.0, -65504.0, float("-inf"), 1.0]).repeat(2))
        self.register_buffer("quantized", torch.arange(-4, 4, dtype=torch.int8))
        self.register_buffer("counts", torch.arange(8, dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lifted = torch.tensor([0.5, 0.25, 0.125, 1e-30, 2.0, 4.0, 8.0, 16.0])  # becomes a lifted constant
        y = self.fc(x) + lifted + self.quantized.float() * self.counts
        return y + self.big / 1e5 + torch.clamp(self.edge, -1.0, 1.0)


def _program() -> tuple[torch.export.ExportedProgram, Stateful, torch.Tensor]:
    torch.manual_seed(0)
    model = Stateful()
    x = torch.randn(3, 8)
    return export(model, x), model, x


def test_parameters_become_fp16_bit_exact_with_tiny_values_snapped() -> None:
    ep, model, _ = _program()
    cast_fp32_to_fp16(ep)
    weight = ep.state_dict["fc.weight"]
    assert isinstance(weight, nn.Parameter) and weight.dtype == torch.float16
    original = model.fc.weight.detach()
    expected = original.half()
    tiny = 2.0**-24
    assert weight[0, 0].item() == tiny and weight[0, 1].item() == -tiny  # snapped, signs kept
    assert weight[0, 2].item() == 0.0 and not torch.signbit(weight[0, 2])
    assert torch.signbit(weight[0, 3])  # -0 stays -0
    assert weight[1, 0].item() == tiny
    rest = torch.ones_like(original, dtype=torch.bool)
    rest[0, :2] = False
    assert torch.equal(weight[rest].view(torch.int16), expected[rest].view(torch.int16))
    assert ep.state_dict["fc.bias"].dtype == torch.float16


def test_overflowing_buffer_stays_fp32_and_the_report_names_its_max() -> None:
    ep, _, _ = _program()
    report = cast_program(ep, CastTarget.FP16)
    assert ep.state_dict["big"].dtype == torch.float32
    kept = {s.name: s for s in report.state if s.outcome is StateOutcome.KEPT_FP32_OVERFLOW}
    assert set(kept) == {"big"}
    assert kept["big"].max_abs == 7.0e4  # the finite maximum; inf is not an overflow
    # exactly +-65504 and -inf fit: converted
    assert ep.state_dict["edge"].dtype == torch.float16
    assert torch.equal(
        ep.state_dict["edge"][:4].float(), torch.tensor([65504.0, -65504.0, float("-inf"), 1.0])
    )
    assert report.state_bytes_after < report.state_bytes_before


def test_int_buffers_untouched_and_lifted_constants_cast() -> None:
    ep, model, _ = _program()
    cast_fp32_to_fp16(ep)
    assert (
        torch.equal(ep.state_dict["quantized"], model.quantized)
        and ep.state_dict["quantized"].dtype == torch.int8
    )
    assert ep.state_dict["counts"].dtype == torch.int64
    constants = [t for t in ep.constants.values() if isinstance(t, torch.Tensor)]
    assert constants and all(t.dtype == torch.float16 for t in constants)
    lifted = constants[0]
    assert lifted[3].item() == 2.0**-24  # 1e-30 snapped, not flushed


def test_placeholders_match_their_tensors_and_the_program_runs_close_to_fp32() -> None:
    ep, model, x = _program()
    with torch.no_grad():
        reference = model(x)
    cast_fp32_to_fp16(ep)
    store = {**ep.state_dict, **ep.constants}
    for spec in ep.graph_signature.input_specs:
        if spec.target is not None:
            assert node(ep, spec.arg.name).meta["val"].dtype == store[spec.target].dtype, spec.target
    assert node(ep, "x").meta["val"].dtype == torch.float16
    assert meta_mismatches(ep, x) == []
    out = run_cast(ep, x)
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.float(), reference, atol=2e-2, rtol=2e-3)
