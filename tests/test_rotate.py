"""Rotating a decoder's residual stream: the Hadamard matrices are exact, every weight the stream
touches turns by exactly Q (readers W Q, writers Q^T W), the program computes what it did (in
PyTorch and on the Core AI runtime, with the same ops), a gain before a tied head is kept around
two matmuls a 4-bit grid holds exactly, what the rotation cannot pass is refused with the program
left as it was, and a weight's outlier channels stop costing int4 its accuracy."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from coreai_opt.compression import QuantizeConfig, compress_
from coreai_opt.errors import ConfigError
from coreai_opt.io import load_pt2, save_aimodel, save_pt2
from coreai_opt.transforms import (
    RotateConfig,
    ScaleConfig,
    TransformError,
    default_tolerance,
    hadamard_matrix,
    largest_hadamard_factor,
    rotation_matrix,
    transform_,
    transform_from_dict,
)
from tests.conftest import SAMPLES, run_aimodel


@pytest.mark.parametrize("order", [1, 2, 12, 20, 28, 36, 60, 72, 96, 576])
def test_hadamard_matrices_are_exact(order: int) -> None:
    h = hadamard_matrix(order)
    assert set(h.unique().tolist()) <= {-1.0, 1.0}
    assert torch.equal(h @ h.T, order * torch.eye(order, dtype=torch.float64))


def test_rotations_are_orthogonal_seeded_and_reach_every_width() -> None:
    assert [largest_hadamard_factor(n) for n in (576, 896, 960, 52, 100)] == [576, 896, 960, 4, 20]
    for width, kind in ((576, "hadamard"), (52, "hadamard"), (40, "random")):
        q = rotation_matrix(width, kind, seed=3)
        torch.testing.assert_close(q @ q.T, torch.eye(width, dtype=torch.float64), rtol=0, atol=1e-12)
        assert torch.equal(q, rotation_matrix(width, kind, seed=3)) and not torch.equal(
            q, rotation_matrix(width, kind, seed=4)
        )
    q = rotation_matrix(576, "hadamard", seed=0)
    assert torch.equal(q.abs(), torch.full_like(q, 576**-0.5))  # every entry +-1/sqrt(n)


@pytest.fixture(scope="module")
def llama(tiny_llama: dict[str, Path]) -> Path:
    return tiny_llama["ref"]


@pytest.fixture(scope="module")
def tied_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny LLaMA with its head tied to the embedding (as SmolLM2's)."""
    pytest.importorskip("transformers")
    from coreai_opt.models import export_file
    from tests._hf import tiny_model, tokenizer_json

    root = tmp_path_factory.mktemp("tied_llama")
    model = tiny_model("llama")
    model.config.tie_word_embeddings = True
    model.lm_head.weight = model.model.embed_tokens.weight
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # trained models' gains differ by channel; a fresh model's are all 1
        for name, value in model.named_parameters():
            if name.endswith("norm.weight"):
                value.copy_(0.5 + torch.rand(value.shape, generator=generator))
    model.save_pretrained(root / "llama", safe_serialization=True)
    (root / "llama" / "tokenizer.json").write_text(tokenizer_json(), encoding="utf-8")
    return export_file(root / "llama", root / "tied.pt2", seq_len=16).output


def _drawn(program, seed: int) -> list[torch.Tensor]:  # type: ignore[no-untyped-def]
    from coreai_opt.inputs import drawn_inputs

    return drawn_inputs(program, seed)[0]


def _random_gains(*programs) -> None:  # type: ignore[no-untyped-def]
    """Gains that differ by channel (a fresh model's are all 1), the same in every program."""
    generator = torch.Generator().manual_seed(1)
    names = [k for k in programs[0].state_dict if k.endswith("norm.weight")]
    gains = {k: 0.5 + torch.rand(programs[0].state_dict[k].shape, generator=generator) for k in names}
    for program in programs:
        program.state_dict.update({k: torch.nn.Parameter(v.clone()) for k, v in gains.items()})


def _head_blocks(weight: torch.Tensor, axis: int, r: torch.Tensor) -> torch.Tensor:
    """`weight` along `axis`, head by head (blocks of r's size), times r - in float64."""
    moved = weight.double().movedim(axis, -1)
    blocks = moved.reshape(*moved.shape[:-1], -1, r.shape[0]) @ r
    return blocks.reshape(moved.shape).movedim(-1, axis).float()


def test_a_decoder_rotates_with_every_stream_weight_turned_by_exactly_q(llama: Path) -> None:
    original, program = load_pt2(llama), load_pt2(llama)
    _random_gains(original, program)
    before = {k: v.detach().clone() for k, v in program.state_dict.items()}
    report = transform_(program, RotateConfig(seed=5, heads=True))
    layers = len({k.split(".")[2] for k in before if k.startswith("model.layers.")})
    assert report.changes[-2:] == [
        f"residual stream of 32 channels rotated (hadamard, seed 5): {7 * layers + 2} tensors turned - "
        f"{5 * layers + 1} readers, {2 * layers} writers",
        f"values and outputs of {layers} attention layers rotated head by head (8 channels)",
    ]
    q, r, state = rotation_matrix(32, "hadamard", 5), rotation_matrix(8, "hadamard", 6), program.state_dict
    g = before["model.layers.0.input_layernorm.weight"].double()
    folded = (before["model.layers.0.self_attn.q_proj.weight"].double() * g).float()
    assert torch.equal(state["model.layers.0.self_attn.q_proj.weight"], (folded.double() @ q).float())
    o = (before["model.layers.1.self_attn.o_proj.weight"].double().T @ q).T.float()  # the stream: rows
    assert torch.equal(
        state["model.layers.1.self_attn.o_proj.weight"], _head_blocks(o, 1, r)
    )  # heads: columns
    g = before["model.layers.1.input_layernorm.weight"].double()
    v = ((before["model.layers.1.self_attn.v_proj.weight"].double() * g).float().double() @ q).float()
    assert torch.equal(state["model.layers.1.self_attn.v_proj.weight"], _head_blocks(v, 0, r))
    table = before["model.embed_tokens.weight"].double()
    assert torch.equal(state["model.embed_tokens.weight"], (table @ q).float())
    assert report.equivalence.relative_rms < 1e-5  # type: ignore[union-attr]
    inputs = _drawn(original, seed=7)  # seeds the transform's own check did not use
    with torch.no_grad():
        torch.testing.assert_close(
            program.module()(*inputs), original.module()(*inputs), rtol=1e-4, atol=1e-5
        )


def test_the_gain_before_a_tied_head_stays_between_two_exact_matmuls(
    tied_llama: Path, tmp_path: Path
) -> None:
    original, program = load_pt2(tied_llama), load_pt2(tied_llama)
    report = transform_(program, RotateConfig())
    assert report.changes[-1].startswith("model.norm.weight: kept, applied to the stream turned back")
    state, q = program.state_dict, rotation_matrix(32, "hadamard", 0)
    assert torch.equal(state["model.norm.unrotation"], q.float()) and torch.equal(
        state["model.norm.rotation"], q.T.float()
    )
    heads = [k for k in state if k in ("lm_head.weight", "model.embed_tokens.weight")]
    assert all(state[k] is state[heads[0]] for k in heads)  # still one tied table
    save_pt2(program, tmp_path / "rotated.pt2")
    loaded = load_pt2(tmp_path / "rotated.pt2")
    inputs = _drawn(original, seed=7)
    with torch.no_grad():
        torch.testing.assert_close(loaded.module()(*inputs), original.module()(*inputs), rtol=1e-4, atol=1e-5)
    # int4 per channel holds both turning matrices exactly: compressing only them changes nothing
    config = QuantizeConfig.from_dict({"kind": "quantize", "dtype": "int4", "weight_num_threshold": 0,
                                       "overrides": [{"pattern": "model.layers.*", "skip": True},
                                                     {"pattern": "*embed*", "skip": True},
                                                     {"pattern": "lm_head*", "skip": True}]})  # fmt: skip
    rotated = loaded.module()(*inputs)
    assert sorted(w.name for w in compress_(loaded, config).weights) == [
        "model.norm.rotation",
        "model.norm.unrotation",
    ]
    with torch.no_grad():
        assert torch.equal(loaded.module()(*inputs), rotated)


@pytest.mark.parametrize(("heads", "device"), [(False, "cpu"), (True, "cpu"), (False, "cuda")])
def test_a_learned_rotation_knows_the_rotated_programs_gram_matrices(
    tied_llama: Path, heads: bool, device: str
) -> None:
    """The statistics a learned rotation derives are those a pass over the rotated program
    measures, up to float32 rounding - the turning matmuls around the kept gain included; with
    heads turned, the output projections' (their inputs turned head by head) are left out. On a
    GPU they are derived there, where the calibration keeps its statistics."""
    from coreai_opt.calibration import Samples, Source, calibrate
    from coreai_opt.weights import Needs

    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    program = load_pt2(tied_llama)
    samples = Samples(Source.RANDOM, count=3, seed=4)
    config = RotateConfig(rotation="learned", steps=5, heads=heads)
    report = transform_(program, config, calibrate(program, samples, cache=False, device=device))
    assert report.samples_digest == samples.digest()
    derived = report.known[Needs.INPUT_GRAM]
    linears = [k for k, v in program.state_dict.items() if v.dim() == 2 and "embed" not in k]
    outputs = {k for k in linears if k.endswith("o_proj.weight")}
    assert {"model.norm.rotation", "model.norm.unrotation", "lm_head.weight"} <= set(derived)
    assert set(linears) - set(derived) == (outputs if heads else set())
    assert all(s.gram is None or s.gram.device.type == device for s in derived.values())
    _assert_measured_alike(derived, program, samples, device)
    # the same Gram is turned once for the readers of one input
    q, k = (derived[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qk")
    assert q is k


def _assert_measured_alike(
    derived: dict, program: torch.export.ExportedProgram, samples: object, device: str = "cpu"
) -> None:  # type: ignore[type-arg]
    """Each derived statistic is the one a pass over `program` measures (on `device`), up to
    float32 rounding (2e-5 of the Gram's largest diagonal entry); its Gram kept in float32, its
    moments in float64."""
    from coreai_opt.calibration import calibrate
    from coreai_opt.weights import Needs

    calibration = calibrate(program, samples, cache=False, device=device)
    measured = calibration.statistics(sorted(derived), Needs.INPUT_GRAM)
    for name, found in derived.items():
        want = measured[name]
        assert found.rows == want.rows, name
        if want.gram is None:
            assert found.gram is None, name
            continue
        assert (
            found.gram.dtype == torch.float32 and found.moments.dtype == want.gram.dtype == torch.float64
        ), name
        scale = float(want.gram.diagonal().max())
        torch.testing.assert_close(found.gram.double(), want.gram, rtol=0, atol=2e-5 * scale, msg=name)
        torch.testing.assert_close(found.moments, want.moments, rtol=0, atol=2e-5 * scale, msg=name)


class _ReadsAndWritesTheStream(torch.nn.Module):
    """A stream that a weight both reads and writes (x + W norm(x)), an untied head, and a gain
    with a zero before it: the head's gain is folded, so no matmul is kept around it."""

    def __init__(self) -> None:
        super().__init__()
        gains = 0.5 + torch.rand(3, 16, generator=torch.Generator().manual_seed(3))
        gains[2, 5] = 0.0
        self.gain0, self.gain1, self.gain2 = (torch.nn.Parameter(g) for g in gains)
        self.embed = torch.nn.Embedding(40, 16)
        self.mix = torch.nn.Linear(16, 16, bias=False)
        self.up = torch.nn.Linear(16, 32, bias=False)
        self.down = torch.nn.Linear(32, 16, bias=False)
        self.head = torch.nn.Linear(16, 40, bias=False)

    @staticmethod
    def _norm(x: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * gain

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        x = x + self.mix(self._norm(x, self.gain0))
        x = x + self.down(torch.relu(self.up(self._norm(x, self.gain1))))
        return self.head(self._norm(x, self.gain2))


def test_a_weight_that_reads_and_writes_the_stream_reads_it_turned() -> None:
    """A weight that reads the stream and writes it back (x + W norm(x)) sees the stream turned:
    its derived Gram is turned, as a pure reader's is, while a pure writer keeps its own - each as
    a pass over the rotated program measures it."""
    from coreai_opt.calibration import Samples, Source, calibrate
    from coreai_opt.weights import Needs

    program = torch.export.export(_ReadsAndWritesTheStream().eval(), (torch.zeros(1, 8, dtype=torch.long),))
    samples = Samples(Source.RANDOM, count=3, seed=4)
    report = transform_(
        program, RotateConfig(rotation="learned", steps=5), calibrate(program, samples, cache=False)
    )
    derived = report.known[Needs.INPUT_GRAM]
    assert {"mix.weight", "up.weight", "down.weight", "head.weight"} <= set(derived)
    _assert_measured_alike(derived, program, samples)


def test_rotation_keeps_the_op_count_and_the_runtime_agrees(llama: Path, tmp_path: Path) -> None:
    from coreai_opt.conversion import convert_exported_program
    from coreai_opt.inspection import inspect_model

    program = load_pt2(llama)
    transform_(program, RotateConfig())
    counts = []
    for name, source in (("plain", load_pt2(llama)), ("rotated", program)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            counts.append(
                inspect_model(
                    save_aimodel(convert_exported_program(source), tmp_path / f"{name}.aimodel")
                ).ops
            )
    assert counts[0] == counts[1]
    inputs = _drawn(program, seed=1)
    with torch.no_grad():
        ours = program.module()(*inputs).numpy().astype(np.float64)
    (runtime,) = run_aimodel(
        tmp_path / "rotated.aimodel", {"input_ids": inputs[0].numpy().astype(np.int32)}
    ).values()
    assert np.abs(runtime - ours).max() <= 1e-4 * np.abs(ours).max()


def _outlier_columns(program, channel: int, factor: float) -> None:  # type: ignore[no-untyped-def]
    """One input channel of every linear layer that reads the stream `factor` times larger: weights
    with an outlier column, as trained LLMs have."""
    state = program.state_dict
    for name in [
        k for k in state if k.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight", "up_proj.weight"))
    ]:
        weight = state[name].detach().clone()
        weight[:, channel] *= factor
        state[name] = torch.nn.Parameter(weight)


def test_rotation_takes_the_cost_of_outlier_columns_out_of_int4(llama: Path) -> None:
    """int4's error over the float model: without outlier columns (the floor), with them, and
    with them rotated - the rotation takes nearly all of what the outliers added (measured:
    0.156, 0.270, 0.167)."""
    errors = []
    for factor, rotate in ((1.0, False), (20.0, False), (20.0, True)):
        reference, program = load_pt2(llama), load_pt2(llama)
        _outlier_columns(reference, channel=3, factor=factor)
        _outlier_columns(program, channel=3, factor=factor)
        inputs = _drawn(reference, seed=2)
        if rotate:
            transform_(program, RotateConfig())
        compress_(program, QuantizeConfig(dtype="int4", weight_num_threshold=0))
        with torch.no_grad():
            expected = reference.module()(*inputs)
            errors.append(float((program.module()(*inputs) - expected).norm() / expected.norm()))
    floor, outliers, rotated = errors
    assert rotated - floor < 0.2 * (outliers - floor), errors


def test_what_the_rotation_cannot_pass_is_refused_and_the_program_left_as_it_was(tied_llama: Path) -> None:
    program = load_pt2(SAMPLES / "transformer.pt2")
    held, nodes = dict(program.state_dict), [n.name for n in program.graph.nodes]
    with pytest.raises(
        TransformError, match=r"reaches a LayerNorm \(native_layer_norm.*\), which a rotation does not pass"
    ):
        transform_(program, RotateConfig())
    assert [n.name for n in program.graph.nodes] == nodes and all(
        program.state_dict[k] is v for k, v in held.items()
    )
    # a rotation refused after its graph edits (a tolerance below fp32 rounding) is undone whole
    program = load_pt2(tied_llama)
    held, nodes = dict(program.state_dict), [n.name for n in program.graph.nodes]
    specs = list(program.graph_signature.input_specs)
    inputs = _drawn(program, seed=0)
    with torch.no_grad():
        was = program.module()(*inputs)
    with pytest.raises(TransformError, match="would change the program's outputs"):
        transform_(program, RotateConfig(tolerance=1e-12))
    assert [n.name for n in program.graph.nodes] == nodes and program.graph_signature.input_specs == specs
    assert program.state_dict.keys() == held.keys() and all(
        program.state_dict[k] is v for k, v in held.items()
    )
    with torch.no_grad():  # the weights paged out of memory while it ran are read again from the file
        assert torch.equal(program.module()(*inputs), was)


def test_a_float16_program_is_held_to_its_own_rounding_and_a_float32_one_to_fp32s(llama: Path) -> None:
    """The default tolerance is ten machine epsilons of the weights' coarsest float dtype: a
    float16 program's rotation (its weights stored again in float16) passes, and is refused under
    float32's tolerance (which a float32 program's rotation passes: the tests above)."""
    from coreai_opt.casting import CastTarget, cast_program

    assert default_tolerance(load_pt2(llama).state_dict) == 10 * torch.finfo(torch.float32).eps
    half = load_pt2(llama)
    cast_program(half, CastTarget.FP16)
    assert default_tolerance(half.state_dict) == 10 * torch.finfo(torch.float16).eps
    with pytest.raises(TransformError, match="would change the program's outputs"):
        transform_(half, RotateConfig(tolerance=10 * torch.finfo(torch.float32).eps))
    report = transform_(half, RotateConfig())
    assert 1e-4 < report.equivalence.relative_rms < 10 * torch.finfo(torch.float16).eps  # type: ignore[union-attr]


def _float_outputs(program, inputs, *, exact: bool) -> list[torch.Tensor]:  # type: ignore[no-untyped-def]
    from coreai_opt._export import compute_in_float64, runnable

    module = runnable(program)
    if exact:
        compute_in_float64(module)
    with torch.no_grad():
        return [module(*sample) for sample in inputs]


def _relative_rms(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x.double() - y.double()).norm() / x.double().norm()) for x, y in zip(a, b, strict=True))


def test_the_check_computes_both_programs_in_float64_and_sees_only_what_the_rotation_changed(
    tiny_llama: dict[str, Path],
) -> None:
    """A program made to compute in float64 makes every floating-point value of its graph in
    float64 and leaves the program's float32 tensors as they were; so the check sees what a
    rotation changed - its weights stored again in float32, under one epsilon - and not the
    float32 arithmetic's own rounding, which differs between the two programs by more."""
    from torch.fx import Interpreter

    from coreai_opt._export import compute_in_float64, runnable

    program = load_pt2(tiny_llama["ref"])
    before = {name: value.clone() for name, value in program.state_dict.items()}
    inputs = [_drawn(program, seed) for seed in range(2)]
    module = runnable(program)
    compute_in_float64(module)
    made: set[torch.dtype] = set()

    class Recording(Interpreter):
        def run_node(self, node):  # type: ignore[no-untyped-def]
            value = super().run_node(node)
            if node.op != "get_attr":  # the program's own tensors, cast where they are first read
                made.update(
                    t.dtype for t in torch.utils._pytree.tree_leaves(value) if isinstance(t, torch.Tensor)
                )
            return value

    with torch.no_grad():
        exact = Recording(module).run(*inputs[0])
    assert {dtype for dtype in made if dtype.is_floating_point} == {torch.float64}, made
    rounded = _float_outputs(program, inputs[:1], exact=False)
    assert 1e-8 < _relative_rms([exact], rounded) < 1e-6  # the float32 arithmetic's own rounding
    assert all(
        v.dtype == before[k].dtype and torch.equal(v, before[k]) for k, v in program.state_dict.items()
    )
    original = load_pt2(tiny_llama["ref"])
    report = transform_(program, RotateConfig(seed=1))
    checked = report.equivalence.relative_rms  # type: ignore[union-attr]
    exact = _float_outputs(original, inputs, exact=True)
    assert checked == pytest.approx(
        _relative_rms(exact, _float_outputs(program, inputs, exact=True)), rel=1e-9
    )
    assert checked < torch.finfo(torch.float32).eps / 2
    in_float32 = _relative_rms(
        _float_outputs(original, inputs, exact=False), _float_outputs(program, inputs, exact=False)
    )
    assert in_float32 > 3 * checked


def test_a_program_without_float64_kernels_is_checked_in_its_own_dtypes(llama: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Where the program cannot compute in float64, both run as they are, and the report says so."""
    from coreai_opt import _export

    def no_float64(module):  # type: ignore[no-untyped-def]
        raise NotImplementedError("no float64 kernel")

    monkeypatch.setattr(_export, "compute_in_float64", no_float64)
    report = transform_(load_pt2(llama), RotateConfig(seed=1))
    check = report.equivalence.to_dict()  # type: ignore[union-attr]
    assert check["in_float64"] is False and torch.finfo(torch.float32).eps / 2 < check["relative_rms"] < 1e-6
    monkeypatch.undo()
    assert transform_(load_pt2(llama), RotateConfig(seed=1)).equivalence.to_dict()["in_float64"] is True  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "data, problem",
    [({"kind": "rotate", "rotation": "spiral"}, "rotation is one of hadamard, random"),
     ({"kind": "rotate", "seed": -1}, "seed"), ({"kind": "rotate", "seed": True}, "seed")],
)  # fmt: skip
def test_rotate_configs_round_trip_and_refuse_bad_values(data: dict, problem: str) -> None:
    config = RotateConfig(rotation="random", seed=9, tolerance=1e-4)
    assert transform_from_dict(json.loads(json.dumps(config.to_dict()))) == config
    with pytest.raises(ConfigError, match=problem):
        transform_from_dict(data)


def test_the_transform_command(coreopt, llama: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "rot.pt2"
    done = coreopt("transform", llama, "--rotate", "hadamard", "-o", out, "--json")
    assert done.exit_code == 0, done.stderr
    document = json.loads(done.stdout)
    (report,) = document["transforms"]
    assert report["kind"] == "rotate" and report["equivalence"]["relative_rms"] < 1e-5
    assert out.exists() and (tmp_path / "rot.model.json").exists()  # the sidecars travel with it
    compressed = coreopt("quantize", out, "--dtype", "int4", "-o", tmp_path / "rot.int4.pt2", "--quiet")
    assert compressed.exit_code == 0, compressed.stderr
    for args, code, words in (
        (("--rotate", "spiral"), 2, "spiral"),
        ((), 2, "nothing to do"),
    ):
        refused = coreopt("transform", llama, *args, "-o", tmp_path / "x.pt2")
        assert refused.exit_code == code and words in refused.stderr, refused.stderr
    refused = coreopt(
        "transform", SAMPLES / "transformer.pt2", "--rotate", "hadamard", "-o", tmp_path / "x.pt2"
    )
    assert refused.exit_code == 1 and not (tmp_path / "x.pt2").exists()
    assert refused.stderr.startswith(
        f"error: {SAMPLES / 'transformer.pt2'}: cannot rotate the residual stream"
    )
    assert len(refused.stderr.strip().splitlines()) == 1


def _massive_channel(program, channel: int, factor: float) -> None:  # type: ignore[no-untyped-def]
    """One channel of the embedding `factor` times larger: a stream with a massive activation
    channel, as trained LLMs have."""
    state = program.state_dict
    table = state["model.embed_tokens.weight"].detach().clone()
    table[:, channel] *= factor
    state["model.embed_tokens.weight"] = torch.nn.Parameter(table)


def test_awq_scales_fold_exactly_and_cut_the_int4_loss_of_a_massive_channel(
    tiny_llama: dict[str, Path],
) -> None:
    import re

    from coreai_opt.calibration import Samples, calibrate
    from coreai_opt.models import model_tokenizer

    llama = tiny_llama["ref"]
    samples = Samples.of(tiny_llama["text"], tokens=256, tokenizer=model_tokenizer(llama))
    reference, program = load_pt2(llama), load_pt2(llama)
    for each in (reference, program):
        _massive_channel(each, channel=3, factor=30.0)
    before = {k: v.detach().clone() for k, v in program.state_dict.items()}
    with pytest.raises(TransformError, match="scale learns from data"):
        transform_(program, ScaleConfig())
    report = transform_(program, ScaleConfig(), calibrate(program, samples, cache=False))
    assert report.equivalence.relative_rms < 1e-5  # type: ignore[union-attr]
    losses = {line.split(":")[0]: re.search(r"proxy loss (\S+) -> (\S+)\)", line) for line in report.changes}
    for name in ("model.layers.0.input_layernorm.weight", "model.layers.1.post_attention_layernorm.weight"):
        was, now = (float(v) for v in losses[name].groups())  # type: ignore[union-attr]
        assert now < 0.5 * was  # the massive channel no longer sets every row's step
    state = program.state_dict
    q, q0 = (
        state["model.layers.0.self_attn.q_proj.weight"].double(),
        before["model.layers.0.self_attn.q_proj.weight"].double(),
    )
    scales = (q / q0)[0]
    torch.testing.assert_close(q, q0 * scales, rtol=1e-6, atol=0)
    torch.testing.assert_close(state["model.layers.0.self_attn.v_proj.weight"].double(),
                               before["model.layers.0.self_attn.v_proj.weight"].double() * scales, rtol=1e-6, atol=0)  # fmt: skip
    gain = before["model.layers.0.input_layernorm.weight"].double()
    torch.testing.assert_close(
        state["model.layers.0.input_layernorm.weight"].double(), gain / scales, rtol=1e-6, atol=0
    )
    assert scales[3] == scales.max()  # the massive channel takes the largest scale
    inputs = _drawn(reference, seed=2)
    with torch.no_grad():
        expected = reference.module()(*inputs)
    errors = []
    for each in (reference, program):
        compress_(each, QuantizeConfig(dtype="int4", weight_num_threshold=0))
        with torch.no_grad():
            errors.append(float((each.module()(*inputs) - expected).norm() / expected.norm()))
    assert errors[1] < errors[0], errors  # measured: 0.217 -> 0.204 (the head and v/o set the rest)


def test_a_transform_that_learns_asks_for_data(coreopt, llama: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    refused = coreopt("transform", llama, "--scale", "awq", "-o", tmp_path / "x.pt2")
    assert refused.exit_code == 2 and "--calibration" in refused.stderr
    with pytest.raises(ConfigError, match="bits is an integer from 2 to 8"):
        ScaleConfig(bits=1)
    assert transform_from_dict(ScaleConfig(group_size=32).to_dict()) == ScaleConfig(group_size=32)


def test_smooth_moves_each_channels_range_into_its_readers(tiny_llama: dict[str, Path]) -> None:
    from coreai_opt.calibration import Samples, calibrate
    from coreai_opt.models import model_tokenizer
    from coreai_opt.weights import Needs

    llama = tiny_llama["ref"]
    samples = Samples.of(tiny_llama["text"], tokens=256, tokenizer=model_tokenizer(llama))
    program = load_pt2(llama)
    _massive_channel(program, channel=3, factor=30.0)
    before = {k: v.detach().clone() for k, v in program.state_dict.items()}
    calibration = calibrate(program, samples, cache=False)
    names = [f"model.layers.0.self_attn.{p}_proj.weight" for p in "qkv"]
    rms = calibration.statistics(names[:1], Needs.INPUT_GRAM)[names[0]].gram.diagonal().sqrt()
    report = transform_(program, ScaleConfig(method="smooth", alpha=0.5), calibration)
    assert report.equivalence.relative_rms < 1e-5  # type: ignore[union-attr]
    largest = torch.stack([before[n].double().abs().amax(dim=0) for n in names]).amax(dim=0)
    expected = rms**0.5 / largest**0.5
    expected = expected / (expected.max() * expected.min()).sqrt()
    scales = program.state_dict[names[0]].double()[0] / before[names[0]].double()[0]
    torch.testing.assert_close(scales, expected, rtol=1e-6, atol=0)
    assert int(scales.argmax()) == 3  # the massive channel's range goes into the weights most


def test_a_learned_rotation_lowers_the_rounding_loss_it_reports_and_stays_orthogonal(
    tiny_llama: dict[str, Path],
    coreopt,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    import re

    from coreai_opt.calibration import Samples, calibrate
    from coreai_opt.models import model_tokenizer

    llama = tiny_llama["ref"]
    samples = Samples.of(tiny_llama["text"], tokens=256, tokenizer=model_tokenizer(llama))
    original, program = load_pt2(llama), load_pt2(llama)
    _outlier_columns(original, channel=3, factor=20.0)
    _outlier_columns(program, channel=3, factor=20.0)
    before = {k: v.detach().clone() for k, v in program.state_dict.items()}
    config = RotateConfig(rotation="learned", steps=100, learning_rate=0.01, heads=False)
    with pytest.raises(TransformError, match="rotate learns from data"):
        transform_(program, config)
    steps: list[tuple[int, int]] = []
    report = transform_(
        program, config, calibrate(program, samples, cache=False), lambda d, t, _: steps.append((d, t))
    )
    assert steps == [(k, 100) for k in range(1, 101)]  # every step reported, for a bar with an ETA
    (line,) = [line for line in report.changes if line.startswith("rotation learned")]
    start, end = (float(v) for v in re.search(r"loss (\S+) at the Hadamard start -> (\S+)$", line).groups())  # type: ignore[union-attr]
    assert end < 0.9 * start  # measured: 0.0074 -> 0.0062
    assert report.equivalence.relative_rms < 1e-5  # type: ignore[union-attr]
    # the embedding turned by Q: Q recovered from it is orthogonal (the table has more rows than columns)
    table, turned = (
        before["model.embed_tokens.weight"].double(),
        program.state_dict["model.embed_tokens.weight"].double(),
    )
    q = torch.linalg.lstsq(table, turned).solution
    torch.testing.assert_close(q @ q.T, torch.eye(32, dtype=torch.float64), rtol=0, atol=1e-5)
    assert not torch.allclose(q, rotation_matrix(32, "hadamard", 0), atol=1e-3)  # it moved
    refused = coreopt("transform", llama, "--rotate", "learned", "-o", tmp_path / "x.pt2")
    assert refused.exit_code == 2 and "learn from data" in refused.stderr and "calibration" in refused.stderr


def test_qwen2_rotates_with_its_value_bias_turned_head_by_head(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from coreai_opt.models import export_file
    from tests._hf import hf_folder

    exported = export_file(hf_folder("qwen2", tmp_path), tmp_path / "qwen2.pt2", seq_len=16).output
    original, program = load_pt2(exported), load_pt2(exported)
    bias = original.state_dict["model.layers.0.self_attn.v_proj.bias"].detach().double()
    report = transform_(program, RotateConfig(seed=2, heads=True))
    assert report.changes[-1] == "values and outputs of 2 attention layers rotated head by head (8 channels)"
    assert report.equivalence.relative_rms < 1e-5  # type: ignore[union-attr]
    r = rotation_matrix(8, "hadamard", 3)
    expected = (bias.reshape(-1, 8) @ r).reshape(-1).float()
    assert torch.equal(program.state_dict["model.layers.0.self_attn.v_proj.bias"], expected)
    inputs = _drawn(original, seed=7)
    with torch.no_grad():
        torch.testing.assert_close(
            program.module()(*inputs), original.module()(*inputs), rtol=1e-4, atol=1e-5
        )


def test_a_stateful_decoder_with_a_tied_head_rotates_and_generates_the_same_tokens(
    tied_llama: Path, tmp_path: Path, coreopt
) -> None:  # type: ignore[no-untyped-def]
    """The gain kept before a tied head is turned back and forth by matmuls whose row count is
    the call's token count (symbolic in a stateful decoder: read by sym_size): the rotated decoder
    prefills and decodes as the original does, and its cache cannot be quantized by rebuilding it
    (the rotation added ops), which is said in one line."""
    from coreai_opt.generation import GenerateConfig, StatefulDecoder, generate
    from coreai_opt.models import export_file

    decoder = export_file(tied_llama.parent / "llama", tmp_path / "kv.pt2", context=16).output
    turned = tmp_path / "kv.rot.pt2"
    done = coreopt("transform", decoder, "--rotate", "hadamard", "-o", turned, "-q")
    assert done.exit_code == 0, done.stderr
    original, rotated = StatefulDecoder(load_pt2(decoder)), StatefulDecoder(load_pt2(turned))
    with torch.no_grad():
        for ids, position in (([5, 7, 9, 11], 0), ([13], 4)):
            torch.testing.assert_close(rotated(ids, position), original(ids, position), rtol=1e-4, atol=1e-5)
    config = GenerateConfig(max_new_tokens=8, ignore_eos=True)
    assert generate(rotated, [5, 7, 9], config).tokens == generate(original, [5, 7, 9], config).tokens
    refused = coreopt("quantize", turned, "--kv-cache-dtype", "int8", "-o", tmp_path / "q.pt2")
    assert refused.exit_code == 1 and refused.stderr.count("\n") == 1
    assert "quantize the cache before transforming" in refused.stderr


def test_statistics_kept_in_float32_share_only_what_was_shared(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rotation's float32 copies follow the objects measured: readers handed one statistics
    (q, k, v) share one copy, and one made where a let-go one lived - with its id, as the
    allocator reuses freed memory at once; here every id is made the same - gets its own."""
    from coreai_opt.transforms import _learned
    from coreai_opt.weights import Statistics

    monkeypatch.setattr(_learned, "id", lambda _: 0, raising=False)  # ids recur: all of them, here
    grams = [torch.full((2 + i % 2, 2 + i % 2), float(i), dtype=torch.float64) for i in range(6)]

    def measured():  # type: ignore[no-untyped-def]
        for i, gram in enumerate(grams):
            shared = Statistics(8, gram=gram)
            yield from ((f"{i}.{p}", shared) for p in "qkv")

    found = _learned._in_float32(measured(), "cpu")
    for i, gram in enumerate(grams):
        q, k, v = (found[f"{i}.{p}"] for p in "qkv")
        assert q is k is v and q.gram.dtype == torch.float32 and torch.equal(q.gram, gram.float()), i
