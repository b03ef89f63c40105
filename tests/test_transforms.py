"""Program transforms keep what the program computes: the norm scales folded into the linears
that read them give the same outputs (checked by the transform itself, and here), the folded
weights are exactly W diag(g) and b + W beta, a transform that would change the outputs is refused
with the program restored, and a recipe's transform step runs before its compress steps."""

from __future__ import annotations

import dataclasses
import json
import textwrap
from pathlib import Path
from typing import ClassVar

import pytest
import torch

from coreai_opt.errors import ConfigError
from coreai_opt.io import load_pt2
from coreai_opt.transforms import (
    FoldNormsConfig,
    Transform,
    TransformConfig,
    TransformError,
    register_transform,
    transform_,
    transform_from_dict,
    unregister_transform,
)
from tests.conftest import SAMPLES


def test_layer_norms_fold_into_the_linears_that_read_them() -> None:
    original = load_pt2(SAMPLES / "transformer.pt2")
    program = load_pt2(SAMPLES / "transformer.pt2")
    before = {k: v.detach().clone() for k, v in program.state_dict.items()}
    report = transform_(program, FoldNormsConfig())
    folded = [line.split(":")[0] for line in report.changes if "folded" in line]
    assert folded == [
        "layers.0.norm1.weight",
        "layers.0.norm2.weight",
        "layers.1.norm1.weight",
        "layers.1.norm2.weight",
    ]
    assert report.changes[-1].startswith("norm.weight: left (its output reaches mean")
    state = program.state_dict
    for norm, linear in (("layers.0.norm1", "layers.0.qkv"), ("layers.1.norm2", "layers.1.ff1")):
        g, beta = before[f"{norm}.weight"].double(), before[f"{norm}.bias"].double()
        w, b = before[f"{linear}.weight"].double(), before[f"{linear}.bias"].double()
        assert torch.equal(state[f"{linear}.weight"], (w * g).float())
        assert torch.equal(state[f"{linear}.bias"], (b + w @ beta).float())
        assert torch.equal(state[f"{norm}.weight"], torch.ones_like(g).float())
        assert torch.equal(state[f"{norm}.bias"], torch.zeros_like(beta).float())
    assert torch.equal(state["norm.weight"], before["norm.weight"])  # left as it was
    assert isinstance(state["layers.0.qkv.weight"], torch.nn.Parameter)
    # the transform's own check, and an independent one on other inputs
    assert report.equivalence is not None and report.equivalence.relative_rms < 1e-6
    inputs = _drawn(original, seed=7)  # seeds the transform's check did not use
    with torch.no_grad():
        expected, got = original.module()(*inputs), program.module()(*inputs)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def _drawn(program, seed: int) -> list[torch.Tensor]:  # type: ignore[no-untyped-def]
    from coreai_opt.inputs import drawn_inputs

    return drawn_inputs(program, seed)[0]


@pytest.fixture(scope="module")
def llama(tiny_llama: dict[str, Path]) -> Path:
    return tiny_llama["ref"]


def test_a_program_that_reinterprets_bits_is_not_made_to_compute_in_float64() -> None:
    """Its bits in float64 would be others: refused, so the check compares it in its own dtypes."""
    from coreai_opt._export import compute_in_float64

    class Bits(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x.view(torch.int32) & 0x7FFFFFFF).view(torch.float32)

    module = torch.export.export(Bits(), (torch.randn(4),)).module()
    with pytest.raises(NotImplementedError, match="reinterprets bits"):
        compute_in_float64(module)


def test_rms_norms_of_a_decoder_fold_and_its_logits_stay(llama: Path) -> None:
    program = load_pt2(llama)
    before = {k: v.detach().clone() for k, v in program.state_dict.items()}
    report = transform_(program, FoldNormsConfig())
    folded = [line for line in report.changes if "folded" in line]
    layers = {k.split(".")[2] for k in before if k.startswith("model.layers.")}
    assert len(folded) == 2 * len(layers) + 1  # input and post-attention norms, the final norm
    assert folded[-1] == "model.norm.weight: folded into lm_head.weight"  # an untied head takes it
    assert report.equivalence.relative_rms < 1e-5  # type: ignore[union-attr]
    g = before["model.layers.0.input_layernorm.weight"].double()
    q = before["model.layers.0.self_attn.q_proj.weight"].double()
    assert torch.equal(program.state_dict["model.layers.0.self_attn.q_proj.weight"], (q * g).float())


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Doubling(TransformConfig):
    KIND: ClassVar[str] = "doubling_for_a_test"


def _double_a_weight(program, config) -> list[str]:  # type: ignore[no-untyped-def]
    """Not an equivalence: the transform check must refuse it."""
    name = "layers.0.ff1.weight"
    program.state_dict[name] = torch.nn.Parameter(program.state_dict[name].detach() * 2)
    return [f"{name}: doubled"]


def test_a_transform_that_changes_the_outputs_is_refused_and_undone() -> None:
    toy = register_transform(Transform(_Doubling, _double_a_weight))
    try:
        program = load_pt2(SAMPLES / "transformer.pt2")
        held = dict(program.state_dict)
        with pytest.raises(
            TransformError, match=r"doubling_for_a_test would change the program's outputs by .* not applied"
        ):
            transform_(program, _Doubling())
        assert (
            all(program.state_dict[k] is v for k, v in held.items())
            and program.state_dict.keys() == held.keys()
        )
        assert transform_from_dict({"kind": "doubling_for_a_test"}) == _Doubling()
    finally:
        unregister_transform(toy)
    with pytest.raises(ConfigError, match="kind is one of fold_norms"):
        transform_from_dict({"kind": "doubling_for_a_test"})


@pytest.mark.parametrize(
    "data, problem",
    [({"kind": "fold_norms", "tolerance": 0}, "tolerance"), ({"kind": "fold_norms", "samples": 0}, "samples"),
     ({"kind": "fold_norms", "scale": 2}, "has no option 'scale'"), ({"kind": "fold_norms", "version": 9}, "version")],
)  # fmt: skip
def test_transform_configs_round_trip_and_refuse_bad_values(data: dict, problem: str) -> None:
    config = FoldNormsConfig(tolerance=1e-4, samples=3)
    assert transform_from_dict(json.loads(json.dumps(config.to_dict()))) == config
    with pytest.raises(ConfigError, match=problem):
        transform_from_dict(data)


def test_a_recipe_transforms_before_it_compresses(coreopt, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    recipe = tmp_path / "fold.yaml"
    recipe.write_text(
        textwrap.dedent("""\
        steps:
          - transform:
              config: {kind: fold_norms, tolerance: 0.0001}
          - compress:
              config: {kind: quantize, dtype: int8, weight_num_threshold: 0}
    """)
    )
    done = coreopt("apply", recipe, SAMPLES / "transformer.pt2", "-o", tmp_path / "out.pt2", "--json")
    assert done.exit_code == 0, done.stderr
    steps = json.loads(done.stdout)["steps"]
    assert [s["step"] for s in steps] == ["transform", "compress"]
    assert steps[0]["equivalence"]["relative_rms"] < 1e-4 and len(steps[0]["changes"]) == 5
    shown = coreopt("apply", recipe, SAMPLES / "transformer.pt2", "-o", tmp_path / "again.pt2", "--quiet")
    assert shown.exit_code == 0 and "transformed (fold_norms): 5 changes" in shown.stdout
