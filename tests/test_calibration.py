"""The calibration room: samples from files, draws and text; per-weight statistics taken where each
weight is read, equal to what the activations hold; layer by layer with weights swapped in; cached."""

from __future__ import annotations

import copy
import functools
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from coreai_opt.calibration import Samples, Source, calibrate
from coreai_opt.io import ModelFileError, load_pt2
from coreai_opt.weights import Needs, Statistics
from tests.conftest import SAMPLES

MLP_WEIGHTS = ["fc1.weight", "fc2.weight", "fc3.weight"]


@functools.cache
def _export_once(name: str) -> tuple[torch.export.ExportedProgram, torch.Tensor]:
    """The program and the random state its export leaves (it seeds the model's build)."""
    import _architectures as arch

    program = arch.export(next(a for a in arch.MATRIX if a.name == name))
    return program, torch.get_rng_state()


def _exported(name: str) -> torch.export.ExportedProgram:
    """tests/_architectures' program of that name, exported once a process (~0.7 CPU-s each
    time) and copied for each test, with the random state an export of it leaves: each test sees
    what it saw when it exported the program itself, whatever ran before it."""
    program, state = _export_once(name)
    torch.set_rng_state(state)
    return copy.deepcopy(program)


def _mlp_inputs(tmp_path: Path, count: int = 3) -> tuple[Path, torch.Tensor]:
    x = torch.randn(count, 4, 64, generator=torch.Generator().manual_seed(1))
    path = tmp_path / "x.safetensors"
    save_file({"x": x}, str(path))
    return path, x


def _reference_activations(x: torch.Tensor) -> dict[str, torch.Tensor]:
    """What fc1, fc2 and fc3 of the sample MLP read, as rows (relu, then gelu, between them)."""
    program = load_pt2(SAMPLES / "mlp.pt2")
    w = {k: v.detach() for k, v in program.state_dict.items()}
    a1 = x.reshape(-1, 64)
    a2 = torch.relu(a1 @ w["fc1.weight"].T + w["fc1.bias"])
    a3 = torch.nn.functional.gelu(a2 @ w["fc2.weight"].T + w["fc2.bias"])
    return {"fc1.weight": a1, "fc2.weight": a2, "fc3.weight": a3}


def test_moments_and_gram_are_those_of_each_weights_input(tmp_path: Path) -> None:
    path, x = _mlp_inputs(tmp_path)
    calibration = calibrate(load_pt2(SAMPLES / "mlp.pt2"), Samples.of(path), cache=False)
    moments = calibration.statistics(MLP_WEIGHTS, Needs.INPUT_MOMENTS)
    gram = calibration.statistics(MLP_WEIGHTS, Needs.INPUT_GRAM)
    for name, rows in _reference_activations(x).items():
        rows = rows.double()
        assert moments[name].rows == gram[name].rows == 12
        torch.testing.assert_close(moments[name].moments, (rows**2).mean(0), rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(gram[name].gram, rows.T @ rows / 12, rtol=1e-5, atol=1e-6)
        assert moments[name].gram is None and gram[name].gradient_squares is None


def test_layer_by_layer_each_weight_sees_the_ones_before_it_compressed(tmp_path: Path) -> None:
    path, _ = _mlp_inputs(tmp_path)
    calibration = calibrate(load_pt2(SAMPLES / "mlp.pt2"), Samples.of(path), cache=False)
    untouched = calibration.statistics(MLP_WEIGHTS, Needs.INPUT_GRAM)
    order = []
    for name, statistics in calibration.sequential(MLP_WEIGHTS, Needs.INPUT_GRAM):
        order.append(name)
        if name == "fc1.weight":  # as the program is: the same as one pass
            torch.testing.assert_close(statistics.gram, untouched[name].gram)
            calibration.replace(name, torch.zeros(128, 64))
        elif name == "fc2.weight":  # fc1 now gives relu(bias) for every row
            bias = torch.relu(load_pt2(SAMPLES / "mlp.pt2").state_dict["fc1.bias"].detach()).double()
            torch.testing.assert_close(statistics.moments, bias**2)
    assert order == MLP_WEIGHTS


class _TiedTwice(torch.nn.Module):
    """An embedding and an output head with equal weights held as two tensors (as GGUF exports of
    tied models have them): a converted program keeps one constant, named after the embedding."""

    def __init__(self, shared: bool) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(5)
        self.embed = torch.nn.Embedding(50, 16)
        self.embed.weight.data = torch.randn(50, 16, generator=generator)
        self.mix = torch.nn.Linear(16, 16)
        self.head = torch.nn.Linear(16, 50, bias=False)
        if shared:  # one Parameter: the unlifted module keeps one name, both ops read it
            self.head.weight = self.embed.weight
        else:
            self.head.weight.data = self.embed.weight.data.clone()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.mix(self.embed(ids))))


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("sequential", [False, True])
def test_an_embedding_twin_of_the_head_takes_the_heads_statistics(
    tmp_path: Path, sequential: bool, shared: bool
) -> None:
    """The embedding's own reader (a lookup) has no activation; its equal twin, the head, has:
    both names get the head's input statistics, in one pass and layer by layer, whether the two
    are one Parameter (the program reads it under one name) or equal copies. A weight with no
    equal twin keeps none."""
    model = _TiedTwice(shared).eval()
    program = torch.export.export(model, (torch.zeros(1, 8, dtype=torch.long),))
    ids = torch.randint(0, 50, (3, 1, 8), generator=torch.Generator().manual_seed(2))
    save_file({"ids": ids}, str(tmp_path / "ids.safetensors"))
    calibration = calibrate(program, Samples.of(tmp_path / "ids.safetensors"), cache=False)
    names = ["embed.weight", "head.weight"]
    if sequential:
        found = dict(calibration.sequential(names, Needs.INPUT_GRAM))
    else:
        found = calibration.statistics(names, Needs.INPUT_GRAM)
    with torch.no_grad():
        rows = torch.tanh(model.mix(model.embed(ids.reshape(-1, 8)))).reshape(-1, 16).double()
    for name in names:
        torch.testing.assert_close(found[name].gram, rows.T @ rows / 24, rtol=1e-5, atol=1e-6)
    if shared:
        return
    model.head.weight.data[0, 0] += 1.0  # no longer equal: the lookup has no statistics to give
    program = torch.export.export(model, (torch.zeros(1, 8, dtype=torch.long),))
    calibration = calibrate(program, Samples.of(tmp_path / "ids.safetensors"), cache=False)
    assert calibration.statistics(["embed.weight"], Needs.INPUT_GRAM)["embed.weight"].gram is None


def test_a_lookup_still_finds_its_twin_after_the_twin_was_replaced_without_its_original(
    tmp_path: Path,
) -> None:
    """A head compressed data-free before a layer-by-layer pass (an override) lets its value as
    given go, but that value is how the embedding is known to be its twin: it stays, and the
    embedding still takes the head's input statistics."""
    model = _TiedTwice(False).eval()
    program = torch.export.export(model, (torch.zeros(1, 8, dtype=torch.long),))
    ids = torch.randint(0, 50, (3, 1, 8), generator=torch.Generator().manual_seed(2))
    save_file({"ids": ids}, str(tmp_path / "ids.safetensors"))
    calibration = calibrate(program, Samples.of(tmp_path / "ids.safetensors"), cache=False)
    calibration.replace("mix.weight", torch.zeros(16, 16), keep_original=False)
    calibration.replace("head.weight", torch.zeros(50, 16), keep_original=False)
    assert "mix.weight" not in calibration.state and "head.weight" in calibration.state
    found = dict(calibration.sequential(["embed.weight"], Needs.INPUT_GRAM))
    with torch.no_grad():
        rows = torch.tanh(model.mix.bias.expand(24, 16)).double()  # mix is zero now: its bias alone
    torch.testing.assert_close(found["embed.weight"].gram, rows.T @ rows / 24, rtol=1e-5, atol=1e-6)


def test_gradient_squares_of_a_language_model_follow_next_token_cross_entropy() -> None:
    """The squares of each sample's gradient of the cross entropy of next tokens drawn from the
    model's own predictions (the calibration's seed, 0, on the CPU: in sample order)."""

    from coreai_opt.calibration._losses import _drawn_tokens

    program = _exported("llama-fp32")  # llama-fp32: ids and a mask in, logits out
    samples = Samples(Source.RANDOM, count=2, seed=3)
    calibration = calibrate(program, samples, cache=False)
    name = "layers.0.mlp.down.weight" if "layers.0.mlp.down.weight" in program.state_dict else None
    name = name or next(
        k for k in program.state_dict if k.endswith("weight") and program.state_dict[k].dim() == 2
    )
    found = calibration.statistics([name], Needs.GRADIENT_SQUARES)[name]
    expected = torch.zeros(program.state_dict[name].shape, dtype=torch.float64)
    module = program.module()
    parameter = dict(module.named_parameters())[name].requires_grad_(True)
    rows = 0
    generator = torch.Generator().manual_seed(0)
    for _, inputs in samples.inputs(program):
        logits = module(*inputs)
        ids = inputs[0]
        predicted = logits[:, :-1].reshape(-1, logits.shape[-1]).float()
        loss = torch.nn.functional.cross_entropy(
            predicted, _drawn_tokens(predicted, generator), reduction="sum"
        )
        (grad,) = torch.autograd.grad(loss, [parameter])
        expected += grad.double() ** 2
        rows += ids[:, 1:].numel()
    torch.testing.assert_close(found.gradient_squares.double(), expected / 2, rtol=1e-5, atol=1e-12)
    assert found.rows == rows


def _whole_backward_squares(program: torch.export.ExportedProgram, names: list[str], samples: Samples):
    """The squared gradients of one whole backward pass per sample (float64 sums), the loss as the
    calibration takes it (the cross entropy of drawn next tokens, or one seeded random-sign projection)."""
    from coreai_opt.calibration._losses import sample_loss

    module = program.module()
    parameters = dict(module.named_parameters(remove_duplicate=False))  # a tied weight under both names
    for parameter in parameters.values():
        parameter.requires_grad_(False)
    wanted = [parameters[name].requires_grad_(True) for name in names]
    totals = [torch.zeros(p.shape, dtype=torch.float64) for p in wanted]
    generator = torch.Generator().manual_seed(0)
    inputs = [inputs for _, inputs in samples.inputs(program)]
    for sample in inputs:
        loss, _ = sample_loss(module(*sample), sample, generator)
        for total, grad in zip(totals, torch.autograd.grad(loss, wanted), strict=True):
            total += grad.double() ** 2
    return {name: total / len(inputs) for name, total in zip(names, totals, strict=True)}


def test_a_token_taggers_loss_is_no_next_token_loss() -> None:
    """A token tagger's output is [batch, tokens, labels] like a language model's logits, but its
    labels are not its ids: the loss is the random-sign projection, not a cross entropy whose
    targets (ids up to 99) would index past its 5 labels. A language model's loss is the cross
    entropy of next tokens drawn from its own predictions by the generator."""
    from coreai_opt.calibration._losses import _drawn_tokens, sample_loss

    torch.manual_seed(0)
    embed, head = torch.nn.Embedding(100, 8), torch.nn.Linear(8, 5)
    ids = torch.tensor([[3, 99, 42, 7], [0, 1, 98, 2]])
    with torch.no_grad():
        scores = head(embed(ids))
        loss, rows = sample_loss(scores, (ids,), torch.Generator().manual_seed(0))
        assert rows == scores.numel() and torch.isfinite(loss)
        logits = torch.nn.Linear(8, 100)(embed(ids))
        loss, rows = sample_loss(logits, (ids,), torch.Generator().manual_seed(0))
        predicted = logits[:, :-1].reshape(-1, 100)
        drawn = _drawn_tokens(predicted, torch.Generator().manual_seed(0))
        expected = torch.nn.functional.cross_entropy(predicted, drawn, reduction="sum")
    assert rows == 6 and float(loss) == pytest.approx(float(expected), rel=1e-6)


def test_a_language_models_squared_gradients_are_of_its_own_predictions() -> None:
    """The Fisher pass's loss for a language model takes next tokens drawn from the model's own
    predictions, not the text's: the text's next ids do not move it, a model sure of one token
    draws only that one (loss ~0 however the text goes on), and the draws follow the generator."""
    from coreai_opt.calibration._losses import sample_loss

    ids = torch.tensor([[3, 9, 42, 7, 1], [0, 1, 98, 2, 5]])
    sure = torch.full((2, 5, 100), -30.0)
    sure[..., 17] = 30.0
    loss, rows = sample_loss(sure, (ids,), torch.Generator().manual_seed(0))
    assert rows == 8 and float(loss) < 1e-20
    spread = torch.randn(2, 5, 100, generator=torch.Generator().manual_seed(1))
    other_text = ids.flip(1)
    first, _ = sample_loss(spread, (ids,), torch.Generator().manual_seed(2))
    same, _ = sample_loss(spread, (other_text,), torch.Generator().manual_seed(2))
    other, _ = sample_loss(spread, (ids,), torch.Generator().manual_seed(3))
    assert float(first) == float(same) and float(first) != float(other)


def test_drawn_next_tokens_follow_the_models_probabilities() -> None:
    """30,000 rows predicting tokens 0, 1, 2 with probabilities 0.6, 0.3, 0.1 (the rest ~0): the
    drawn tokens' shares are those probabilities within 1% - a draw, not the most likely token."""
    from coreai_opt.calibration._losses import _drawn_tokens

    logits = torch.full((30_000, 50), -40.0)
    logits[:, :3] = torch.tensor([0.6, 0.3, 0.1]).log()
    drawn = _drawn_tokens(logits, torch.Generator().manual_seed(4))
    shares = torch.bincount(drawn, minlength=50).double() / len(drawn)
    torch.testing.assert_close(
        shares[:3], torch.tensor([0.6, 0.3, 0.1], dtype=torch.float64), atol=0.01, rtol=0
    )
    assert shares[3:].sum() == 0


@pytest.fixture
def cut_small_programs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cut these small programs as a billion-parameter one is cut (by default a program whose
    pass fits 2 GiB is one segment)."""
    from coreai_opt.calibration import _fisher

    monkeypatch.setattr(_fisher, "WHOLE_PASS_BYTES", 0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16_bit_products_on_the_cpu_are_taken_in_float32_forward_and_backward(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mm, addmm and bmm of 16-bit CPU operands: the float32 product rounded to 16 bits, and each
    operand's gradient the float32 one rounded to its dtype - bit for bit what autograd gives
    through explicit casts, also with the weight widened 8 columns at a time; anything else is
    left to run as it is."""
    from coreai_opt import _pieces
    from coreai_opt._cpu import native_bfloat16
    from coreai_opt.calibration._products import widened

    monkeypatch.setattr(_pieces, "PIECE", 40 * 8)  # 3 pieces of the 24 columns

    aten = torch.ops.aten
    generator = torch.Generator().manual_seed(0)

    def leaf(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=generator).to(dtype).requires_grad_()

    cases = [
        (aten.mm.default, (leaf(16, 40), leaf(40, 24)), {}),
        (aten.addmm.default, (leaf(24), leaf(16, 40), leaf(40, 24)), {"beta": 0.5, "alpha": 2.0}),
        (aten.addmm.default, (leaf(16, 1), leaf(16, 40), leaf(40, 24)), {}),
        (aten.bmm.default, (leaf(2, 8, 5), leaf(2, 5, 6)), {}),
    ]
    for target, args, kwargs in cases:
        out = widened(target, args, kwargs)
        cast = target(*[x.float() for x in args], **kwargs).to(dtype)
        assert out.dtype == dtype and torch.equal(out, cast)
        cotangent = torch.randn(out.shape, generator=generator).to(dtype)
        for mine, theirs in zip(
            torch.autograd.grad(out, args, cotangent), torch.autograd.grad(cast, args, cotangent), strict=True
        ):
            assert mine.dtype == dtype and torch.equal(mine, theirs)
    a, b = cases[0][1]
    assert widened(aten.mm.default, (a.float(), b.float()), {}) is None
    assert widened(aten.add.Tensor, (a, a), {}) is None
    assert widened(aten.mm.default, (a.to(torch.float16), b.float()), {}) is None  # mixed, no bfloat16
    with torch.no_grad():  # a forward pass alone: bfloat16 left to the CPU where it has the instructions
        native = dtype == torch.bfloat16 and native_bfloat16()
        assert (widened(aten.mm.default, (a, b), {}) is None) == native


@pytest.mark.parametrize("wide", [torch.float32, torch.float16])
def test_a_product_of_a_bfloat16_weight_is_taken_in_bfloat16_and_its_gradient_kept_in_the_weights_layout(
    wide: torch.dtype,
) -> None:
    """The Fisher pass's fast products: a bfloat16 weight (plain or a transposed view, either
    side) times a wider matrix is the bfloat16 product returned in the wider dtype, and the
    gradients are autograd's through explicit casts - bit for bit - with the weight's in bfloat16,
    laid out as the weight is (no copy for AccumulateGrad to make)."""
    from coreai_opt.calibration._products import widened

    aten = torch.ops.aten
    generator = torch.Generator().manual_seed(4)

    def leaf(*shape: int, dtype: torch.dtype = wide) -> torch.Tensor:
        return torch.randn(shape, generator=generator).to(dtype).requires_grad_()

    weight = leaf(24, 40, dtype=torch.bfloat16)
    cases = [
        (aten.mm.default, (leaf(16, 40), weight.T), {}),  # x @ W^T, the linear layer's product
        (aten.mm.default, (leaf(16, 24), weight), {}),
        (aten.mm.default, (weight, leaf(40, 8)), {}),  # the weight on the left
        (aten.addmm.default, (leaf(24), leaf(16, 40), weight.T), {"beta": 0.5, "alpha": 2.0}),
    ]
    for target, args, kwargs in cases:
        out = widened(target, args, kwargs)
        cast = target(*[x if x.dtype == torch.bfloat16 or x.dim() == 1 else x.to(torch.bfloat16)
                        for x in args], **kwargs).to(wide) if target is aten.mm.default else None  # fmt: skip
        if cast is None:  # addmm: the bias added in the wide dtype after the product
            bias, a, b = args
            cast = (torch.mm(a.to(torch.bfloat16), b).to(wide) * 2.0).add(bias.to(wide), alpha=0.5)
        assert out.dtype == wide and torch.equal(out, cast)
        cotangent = torch.randn(out.shape, generator=generator).to(wide)
        mine = torch.autograd.grad(out, args, cotangent)
        theirs = torch.autograd.grad(cast, args, cotangent)
        for x, m, t in zip(args, mine, theirs, strict=True):
            assert m.dtype == x.dtype and m.stride() == x.stride()
            assert torch.equal(m, t), (target, x.shape)


def test_a_program_whose_whole_pass_fits_2_gib_is_one_segment() -> None:
    """Cutting costs a second forward pass: a program whose squares and one sample's values fit
    2 GiB (SmolLM2-135M's at 128 tokens: 1.8 GB) is not cut; one of a billion parameters is."""

    from coreai_opt.calibration import _fisher

    program = _exported("llama-fp32")
    calibration = calibrate(program, Samples(Source.RANDOM, count=1, seed=3), cache=False)
    names = [k for k, v in program.state_dict.items() if v.dim() == 2]
    assert len(_fisher.SegmentedBackward(calibration.gm, names).segments) == 1
    whole = 4 * sum(program.state_dict[n].numel() for n in names)
    assert whole < _fisher.WHOLE_PASS_BYTES < 4 * 1_100_000_000


@pytest.mark.usefixtures("cut_small_programs")
@pytest.mark.parametrize("fast", [False, True], ids=["exact", "bfloat16 products"])
@pytest.mark.parametrize("name", ["llama-fp32", "llama-fp16", "vit", "mistral-gqa-tied", "gpt2"])
def test_squared_gradients_a_segment_at_a_time_are_the_whole_backward_passes(
    name: str, fast: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Fisher pass cut into segments (a decoder's blocks; a ViT's head, under the random-sign
    loss of a model that is not a language model; an embedding tied to the output head, its
    lookup's rows added to the head's gradient there) gives every weight the squares of one
    whole backward pass. With its weights' products in bfloat16 (fast gradients) they stay within
    a few percent of them, and only weights read as a product's matrix are held in bfloat16. The
    language models' next tokens are seeded uniform draws here, as a text's would be: tokens
    drawn from these random models' own sharp predictions leave gradients so small that the
    products' rounding is 10-15% of them (docs/benchmarks.md, 2026-12-02)."""

    from coreai_opt.calibration import _device, _losses
    from coreai_opt.calibration._fisher import SegmentedBackward

    monkeypatch.setattr(
        _losses,
        "_drawn_tokens",
        lambda logits, generator: torch.randint(0, logits.shape[-1], logits.shape[:1], generator=generator),
    )

    program = _exported(name)
    samples = Samples(Source.RANDOM, count=2, seed=3)
    calibration = calibrate(program, samples, cache=False, exact_gradients=not fast)
    calibration.fast_gradients = fast  # also where this CPU has no bfloat16 instructions (slower then)
    names = [k for k, v in program.state_dict.items() if v.dim() >= 2 and calibration._holds(k)]
    passing = SegmentedBackward(calibration.gm, names, fast=fast)
    assert (
        len(passing.segments)
        == {"llama-fp32": 4, "llama-fp16": 4, "vit": 2, "mistral-gqa-tied": 4, "gpt2": 6}[name]
    )
    found = calibration.statistics(names, Needs.GRADIENT_SQUARES)
    expected = _whole_backward_squares(program, names, samples)
    errors = {}
    for weight in names:
        assert found[weight].gradient_squares.dtype == torch.float32
        squares = found[weight].gradient_squares.double()
        errors[weight] = float((squares - expected[weight]).norm() / expected[weight].norm())
        if not fast and name != "llama-fp16":
            torch.testing.assert_close(squares, expected[weight], rtol=2e-5, atol=1e-30)
    if not fast:  # llama-fp16: its products widened to float32, the same up to fp16 rounding
        assert max(errors.values()) < 2e-3, errors
        assert not passing.narrowed
        return
    assert max(errors.values()) < 3e-2 and sorted(errors.values())[len(errors) // 2] < 1.5e-2, errors
    kept = {"llama-fp32": ["embed_tokens.weight"], "llama-fp16": ["embed_tokens.weight"], "mistral-gqa-tied": [],
            "vit": ["cls_token", "patch.weight", "pos"], "gpt2": ["wpe.weight"]}[name]  # fmt: skip
    assert sorted(n for n in names if n not in passing.narrowed) == kept  # lookups, a convolution, additions
    assert _device.bfloat16_products(torch.device("cuda")) is False  # a GPU keeps the program's dtypes


def test_only_weights_read_as_a_products_matrix_through_views_are_held_in_bfloat16() -> None:
    """Fast gradients narrow a weight only where every read is a matrix of mm / addmm through
    views: a linear layer's weight, not its bias (addmm's added term), not a weight that is also
    scaled (its multiply would run in bfloat16), not one read by a batched product."""
    from torch import nn

    from coreai_opt.calibration._fisher import SegmentedBackward

    class Mixed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(8, 8)
            self.scaled = nn.Parameter(torch.randn(8, 8))
            self.batched = nn.Parameter(torch.randn(2, 8, 8))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.linear(x) + x @ self.scaled + (self.scaled * 2).sum()
            return (y[None].expand(2, -1, -1) @ self.batched).sum(0)

    program = torch.export.export(Mixed(), (torch.randn(4, 8),)).run_decompositions()  # linear: addmm
    calibration = calibrate(program, Samples(Source.RANDOM, count=1, seed=0), cache=False)
    names = list(program.state_dict)
    assert SegmentedBackward(calibration.gm, names, fast=True).narrowed == {"linear.weight"}
    assert SegmentedBackward(calibration.gm, names, fast=False).narrowed == set()


@pytest.mark.usefixtures("cut_small_programs")
def test_a_tied_embedding_with_a_padding_row_takes_no_gradient_there_from_its_lookup(tmp_path: Path) -> None:
    """A lookup's padding row gets no gradient from it (only from the head it is tied to), as
    autograd has it, when the lookup lies segments away from the head."""
    from torch import nn

    from coreai_opt.calibration._fisher import SegmentedBackward

    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(32, 16, padding_idx=0)
            self.blocks = nn.ModuleList(nn.Linear(16, 16) for _ in range(3))
            self.head = nn.Linear(16, 32, bias=False)
            self.head.weight = self.embed.weight

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            x = self.embed(ids)
            for block in self.blocks:
                x = x + torch.tanh(block(x))
            return self.head(x)

    torch.manual_seed(0)
    ids = torch.tensor([[0, 3, 0, 5, 7, 3, 0, 9]])
    program = torch.export.export(Tied().eval(), (ids,))
    save_file({"ids": torch.randint(0, 32, (3, 8), generator=torch.Generator().manual_seed(1)).index_fill(1, torch.tensor([0, 5]), 0)},
              str(tmp_path / "ids.safetensors"))  # fmt: skip
    samples = Samples.of(tmp_path / "ids.safetensors")
    calibration = calibrate(program, samples, cache=False)
    names = [k for k, v in program.state_dict.items() if v.dim() == 2 and calibration._holds(k)]
    passing = SegmentedBackward(calibration.gm, names)
    assert len(passing.segments) == 3 and passing.split == {"head.weight"}
    assert any(0 in inputs[0] for inputs in calibration.inputs)  # a padding id is looked up
    found = calibration.statistics(names, Needs.GRADIENT_SQUARES)
    expected = _whole_backward_squares(program, names, samples)
    for name in names:
        torch.testing.assert_close(
            found[name].gradient_squares.double(), expected[name], rtol=2e-5, atol=1e-30
        )


@pytest.mark.usefixtures("cut_small_programs")
def test_the_fisher_pass_cuts_a_decoder_at_its_residual_stream_and_hands_over_from_the_head() -> None:
    """Every cut of a decoder leaves one differentiable value for the next segment, the residual
    stream [1, tokens, dim]; the pass hands the weights over a segment at a time from the head
    back; and a final pass lets each weight go once its replacement is in, then the program."""

    from coreai_opt.calibration._fisher import SegmentedBackward

    program = _exported("llama-fp32")
    calibration = calibrate(program, Samples(Source.RANDOM, count=2, seed=3), cache=False)
    names = [k for k, v in program.state_dict.items() if v.dim() == 2]
    passing = SegmentedBackward(calibration.gm, names)
    for segment in passing.segments[1:]:
        crossing = [node for node in segment.inputs if node in passing.differentiable]
        assert [tuple(node.meta["val"].shape) for node in crossing] == [(1, 16, 64)]
    untouched = calibration.statistics(names, Needs.GRADIENT_SQUARES)
    order, let_go = [], []
    for name, statistics in calibration.sequential(names, Needs.GRADIENT_SQUARES, final=True):
        assert torch.equal(statistics.gradient_squares, untouched[name].gradient_squares), name
        let_go.append(sorted(calibration.spent))
        order.append(name)
        calibration.replace(name, torch.zeros(untouched[name].gradient_squares.shape), keep_original=False)
    layer = [f"layers.1.{p}_proj.weight" for p in ("q", "k", "v", "o", "gate", "up", "down")]
    assert order == ["lm_head.weight", *layer, *(n.replace("1", "0") for n in layer), "embed_tokens.weight"]
    assert let_go[1] == ["lm_head.weight"] and len(let_go[-1]) == len(names) - 1
    assert calibration.closed


@pytest.mark.usefixtures("cut_small_programs")
def test_squared_gradients_are_stored_a_weight_a_file_and_streamed_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Fisher pass's cache: a file a weight and an index written last; read back without
    running the program; a damaged entry is computed again."""

    from coreai_opt.calibration._fisher import SegmentedBackward

    monkeypatch.setenv("COREOPT_CACHE", str(tmp_path / "cache"))
    program = _exported("llama-fp32")
    samples = Samples(Source.RANDOM, count=2, seed=3)
    names = [k for k, v in program.state_dict.items() if v.dim() == 2]
    first = calibrate(program, samples).statistics(names, Needs.GRADIENT_SQUARES)
    (stored,) = (tmp_path / "cache").iterdir()
    assert stored.suffix == ".fisher" and len(list(stored.glob("*.f32"))) == len(names)
    runs = []
    real_run = SegmentedBackward.run
    monkeypatch.setattr(SegmentedBackward, "run", lambda self, *a: runs.append(1) or real_run(self, *a))
    again = calibrate(program, samples).statistics(names, Needs.GRADIENT_SQUARES)
    assert not runs
    for name in names:
        assert torch.equal(again[name].gradient_squares, first[name].gradient_squares)
        assert again[name].rows == first[name].rows == 30
    sorted(stored.glob("*.f32"))[3].write_bytes(b"damaged")
    mended = calibrate(program, samples).statistics(names, Needs.GRADIENT_SQUARES)
    assert runs == [1] and all(
        torch.equal(mended[n].gradient_squares, first[n].gradient_squares) for n in names
    )


@pytest.mark.usefixtures("cut_small_programs")
def test_squares_kept_on_disk_read_back_the_same_bits_a_weight_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`kept_squares`: each weight's squares written as they pass, read back bit-equal (with
    their whole mean, so nobody sums them again) only when asked; narrowing keeps them unread and
    shares the folder, which goes with the last view."""
    import gc

    from coreai_opt.calibration import kept_squares
    from coreai_opt.weights import Narrowable, Statistics, known_of, statistics_from

    monkeypatch.setenv("COREOPT_CACHE", str(tmp_path / "cache"))
    program = _exported("llama-fp32")
    names = [k for k, v in program.state_dict.items() if v.dim() == 2]
    calibration = calibrate(program, Samples(Source.RANDOM, count=2, seed=3), cache=False)
    whole = calibration.statistics(names, Needs.GRADIENT_SQUARES)
    kept = kept_squares()
    passing = [*((n, whole[n]) for n in names), ("unread", Statistics(0))]
    assert [n for n, _ in kept.keeping(iter(passing))] == [*names, "unread"]
    assert isinstance(kept, Narrowable) and list(kept) == [*names, "unread"] and kept["unread"].rows == 0
    folder = Path(kept._folder.name)
    assert folder.parent == tmp_path / "cache"  # on disk beside the cache's own files, not in TMPDIR
    assert sorted(p.name for p in folder.iterdir()) == [f"{k:05d}.f32" for k in range(1, len(names) + 1)]
    for name in names:
        back = kept[name]
        assert back.gradient_squares.dtype == torch.float32 and back.rows == whole[name].rows
        assert torch.equal(back.gradient_squares, whole[name].gradient_squares), name
        assert back.gradient_mean() == whole[name].gradient_mean()
        assert back.gradient_squares.data_ptr() != kept[name].gradient_squares.data_ptr()  # read anew
    reads: list[str] = []
    read = type(kept).__getitem__
    monkeypatch.setattr(type(kept), "__getitem__", lambda self, n: reads.append(n) or read(self, n))
    narrowed = known_of({Needs.GRADIENT_SQUARES: kept}, set(names[:2]))[Needs.GRADIENT_SQUARES]
    asked = statistics_from(calibration, names[1:2], Needs.GRADIENT_SQUARES, {Needs.GRADIENT_SQUARES: kept})
    assert reads == [] and list(narrowed) == names[:2] and list(asked) == names[1:2]
    assert torch.equal(asked[names[1]].gradient_squares, whole[names[1]].gradient_squares)
    assert reads == [names[1]] and names[2] not in narrowed
    del kept, asked
    gc.collect()
    assert folder.is_dir()  # the narrowed view still reads it
    del narrowed
    gc.collect()
    assert not folder.exists()
    wide = kept_squares()  # float64 squares (not the Fisher pass's): held, their bits as given
    doubled = Statistics(1, gradient_squares=whole[names[0]].gradient_squares.double())
    assert [n for n, _ in wide.keeping(iter([("wide", doubled)]))] == ["wide"] and wide["wide"] is doubled
    full = kept_squares()  # a folder that takes nothing (a full disk): held in memory instead
    monkeypatch.setattr(type(full), "_path", lambda self, file: tmp_path / "gone" / file)
    assert [n for n, _ in full.keeping(iter(passing[:1]))] == names[:1] and full[names[0]] is whole[names[0]]
    held = kept_squares(on_disk=False)  # squares on a GPU: held as they came, no folder
    assert [n for n, _ in held.keeping(iter(passing))] == [*names, "unread"] and held._folder is None
    assert all(held[n] is whole[n] for n in names) and list(held.narrowed(names[:1])) == names[:1]


def test_statistics_are_cached_by_program_and_samples(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COREOPT_CACHE", str(tmp_path / "cache"))
    path, _ = _mlp_inputs(tmp_path)
    first = calibrate(load_pt2(SAMPLES / "mlp.pt2"), Samples.of(path)).statistics(
        MLP_WEIGHTS, Needs.INPUT_GRAM
    )
    stored = sorted(p.suffix for p in (tmp_path / "cache").iterdir())
    assert stored == [".json", ".safetensors"]
    again = calibrate(load_pt2(SAMPLES / "mlp.pt2"), Samples.of(path))
    again._activations = None  # type: ignore[assignment,method-assign]  (a recompute would fail)
    cached = again.statistics(MLP_WEIGHTS, Needs.INPUT_GRAM)
    for name in MLP_WEIGHTS:
        assert torch.equal(cached[name].gram, first[name].gram) and cached[name].rows == first[name].rows
    save_file({"x": torch.randn(2, 4, 64)}, str(path))  # other samples: another key
    other = calibrate(load_pt2(SAMPLES / "mlp.pt2"), Samples.of(path)).statistics(
        MLP_WEIGHTS, Needs.INPUT_GRAM
    )
    assert other["fc1.weight"].rows == 8


def test_samples_come_from_files_draws_and_text(tmp_path: Path) -> None:
    program = load_pt2(SAMPLES / "mlp.pt2")
    path, x = _mlp_inputs(tmp_path, count=5)
    taken = list(Samples.of(path, count=2).inputs(program))
    assert [label for label, _ in taken] == ["x.safetensors[0]", "x.safetensors[1]"]
    assert torch.equal(taken[1][1][0], x[1])
    drawn = list(Samples.of("random", count=3, seed=7).inputs(program))
    assert len(drawn) == 3 and not torch.equal(drawn[0][1][0], drawn[1][1][0])
    assert torch.equal(list(Samples.of("random", count=3, seed=7).inputs(program))[2][1][0], drawn[2][1][0])
    bad = tmp_path / "bad.safetensors"
    save_file({"x": torch.full((4, 64), math.nan)}, str(bad))
    with pytest.raises(ModelFileError, match="holds NaN or Inf"):
        list(Samples.of(bad).inputs(program))


def test_text_is_cut_into_token_windows_with_the_models_tokenizer(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    text = "the quick brown fox jumps over the lazy dog " * 20
    tokenizer.train_from_iterator([text], trainers.WordLevelTrainer(vocab_size=64, special_tokens=["[UNK]"]))
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "prose.txt").write_text(text)
    program = _exported("llama-fp32")  # takes ids [1, 16] and a mask
    samples = Samples.of(tmp_path / "prose.txt", tokenizer=tmp_path)
    windows = list(samples.inputs(program))
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    assert len(windows) == len(ids) // 16
    assert windows[1][1][0].tolist() == [ids[16:32]]
    assert torch.equal(windows[0][1][1], torch.ones(1, 16, dtype=windows[0][1][1].dtype))
    limited = list(Samples.of(tmp_path / "prose.txt", tokenizer=tmp_path, tokens=40).inputs(program))
    assert len(limited) == 2


class _Masked(torch.nn.Module):
    """A causal mask built inside the graph, as a decoder's attention does."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = torch.full((x.shape[1], x.shape[1]), float("-inf")).triu(1)
        return (self.proj(x) @ x.transpose(1, 2) + mask).softmax(-1)


def test_tensor_factories_follow_the_calibration_device() -> None:
    """torch.export records the CPU as the mask's device; a graph moved to another device must
    build it there too (the meta device stands in for a GPU: mixing it with the CPU fails)."""
    from coreai_opt._export._runnable import place_factories

    program = torch.export.export(_Masked(), (torch.randn(1, 4, 8),))
    unplaced = program.module().to("meta")
    with pytest.raises(RuntimeError):
        unplaced(torch.randn(1, 4, 8, device="meta"))
    placed = program.module()
    place_factories(placed, torch.device("meta"))
    placed.to("meta")
    out = placed(torch.randn(1, 4, 8, device="meta"))
    assert out.device.type == "meta" and out.shape == (1, 4, 4)
    back = program.module()
    place_factories(back, torch.device("cpu"))  # where it was traced: nothing changes
    x = torch.randn(1, 4, 8)
    assert torch.equal(back(x), program.module()(x))


def test_layer_by_layer_holds_only_what_outlives_each_segment_and_measures_the_same() -> None:
    """A decoder layer by layer: at every pause the values held for all samples at once are only
    ones read from there on (the reader's activation, the residual stream); at no time are
    attention scores or probabilities among them (each sample makes and drops those within its
    segment); and with no weight replaced each Gram matrix is the one-pass one, bit for bit."""

    from coreai_opt._aten import state_only
    from coreai_opt.calibration._layer_by_layer import LayerByLayer

    program = _exported("llama-fp32")  # llama-fp32: attention, MLP, residuals
    calibration = calibrate(program, Samples(Source.RANDOM, count=3, seed=4), cache=False)
    names = [k for k, v in program.state_dict.items() if k.endswith("weight") and v.dim() == 2]
    one_pass = calibration.statistics(names, Needs.INPUT_GRAM)
    runner = LayerByLayer(calibration, names, Needs.INPUT_GRAM)
    graph = calibration.gm.graph
    order = {node: index for index, node in enumerate(graph.nodes)}
    state = state_only(graph)
    readers = {reader.name: reader.node for reader in runner.chosen.values()}
    evaluate, held_while_running = runner._evaluate, set()

    def watched(node, *args):  # type: ignore[no-untyped-def]
        held_while_running.update(runner.held)
        return evaluate(node, *args)

    runner._evaluate = watched  # type: ignore[method-assign]
    seen = 0
    for name, statistics in runner.run():
        if statistics.gram is None:
            continue
        seen += 1
        assert torch.equal(statistics.gram, one_pass[name].gram), name
        pause = order[readers[name]]
        for node, held in runner.held.items():  # at the pause: only what is read from here on
            assert len(held) == 3 and node not in state
            assert max(order[user] for user in node.users) >= pause, (name, node)
    assert seen >= 8 and len(held_while_running) > 20
    scores = (torch.ops.aten.bmm.default, torch.ops.aten._softmax.default)
    assert not [node for node in held_while_running if node.target in scores]


def test_a_pass_that_tunes_nothing_lets_each_weight_go_once_read_for_the_last_time() -> None:
    """Compressing through the program being calibrated (as the CLI does): once a weight is
    replaced nothing holds its tensor as given, and once the final pass has gone past its last
    reader not even its replacement - so the pass holds about one copy of the model, not three.
    Asking the calibration for anything afterwards says why it cannot, rather than run a program
    with weights missing; the end-to-end comparison with the weights as given does too."""
    import gc
    import weakref

    from coreai_opt.compression import QuantizeConfig, compress_

    program = load_pt2(SAMPLES / "mlp.pt2")
    calibration = calibrate(program, Samples(Source.RANDOM, count=2, seed=0), cache=False)
    given = {name: weakref.ref(program.state_dict[name]) for name in MLP_WEIGHTS}
    config = QuantizeConfig(dtype="int4", method="gptq", weight_num_threshold=0)
    compress_(program, config, calibration=calibration)
    gc.collect()
    assert [name for name, ref in given.items() if ref() is not None] == []
    assert calibration.released == set(MLP_WEIGHTS)
    assert calibration.spent == {"fc1.weight", "fc2.weight"}  # fc3's reader never ran: the pass ends at it
    assert [calibration.gm.get_parameter(name).numel() for name in MLP_WEIGHTS[:2]] == [0, 0]
    assert list(calibration.replaced) == ["fc3.weight"]
    with pytest.raises(RuntimeError, match=r"fc1\.weight was let go by a final layer-by-layer pass"):
        calibration.statistics(MLP_WEIGHTS, Needs.INPUT_MOMENTS)
    with pytest.raises(RuntimeError, match=r"fc1\.weight was let go"):
        calibration.divergence({}, 0)


def test_final_statistics_taken_at_once_let_go_of_the_whole_program() -> None:
    """Importance-weighted k-means takes every weight's statistics in one pass: after it the
    calibration holds no program, so each weight as given leaves with the program's own."""
    import gc
    import weakref

    from coreai_opt.compression import PalettizeConfig, compress_

    program = load_pt2(SAMPLES / "mlp.pt2")
    calibration = calibrate(program, Samples(Source.RANDOM, count=2, seed=0), cache=False)
    given = {name: weakref.ref(program.state_dict[name]) for name in MLP_WEIGHTS}
    config = PalettizeConfig(n_bits=4, method="importance", weight_num_threshold=0, num_kmeans_workers=0)
    report = compress_(program, config, calibration=calibration)
    gc.collect()
    assert sorted(w.name for w in report.weights if w.learned is not None) == MLP_WEIGHTS
    assert calibration.closed and [name for name, ref in given.items() if ref() is not None] == []
    with pytest.raises(RuntimeError, match="final statistics were taken"):
        calibration.sequential(MLP_WEIGHTS, Needs.INPUT_GRAM).__next__()


def test_a_pass_that_is_not_final_keeps_the_replacements_and_the_weights_as_given() -> None:
    """Tuned tables compare with the weights as given, and a pass with another after it runs
    the program again: neither lets anything go, and the calibration still answers."""
    program = load_pt2(SAMPLES / "mlp.pt2")
    calibration = calibrate(program, Samples(Source.RANDOM, count=2, seed=0), cache=False)
    for name, _ in calibration.sequential(MLP_WEIGHTS, Needs.INPUT_GRAM):
        calibration.replace(name, torch.zeros_like(program.state_dict[name]), keep_original=False)
    assert calibration.released == set(MLP_WEIGHTS) and not calibration.spent
    assert calibration.statistics(MLP_WEIGHTS, Needs.INPUT_MOMENTS)["fc1.weight"].rows == 8


def test_readers_of_one_input_share_one_gram_computed_and_cached_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A layer's q, k and v projections (and gate and up) read the same rows: one pass takes their
    Gram matrix once and hands them the same tensor; the cache stores it once and loads it shared;
    every other weight keeps its own."""
    from safetensors.torch import load_file

    monkeypatch.setenv("COREOPT_CACHE", str(tmp_path / "cache"))
    program = _exported("llama-fp32")
    samples = Samples(Source.RANDOM, count=2, seed=4)
    names = [k for k, v in program.state_dict.items() if k.endswith("proj.weight") and v.dim() == 2]
    for found in (calibrate(program, samples).statistics(names, Needs.INPUT_GRAM),  # computed, then loaded
                  calibrate(program, samples).statistics(names, Needs.INPUT_GRAM)):  # fmt: skip
        by_tensor: dict[int, list[str]] = {}
        for name in names:
            by_tensor.setdefault(id(found[name].gram), []).append(name.split(".")[-2])
        assert sorted(map(sorted, by_tensor.values())) == sorted(
            [["k_proj", "q_proj", "v_proj"], ["o_proj"], ["gate_proj", "up_proj"], ["down_proj"]]
            * (len(names) // 7)
        )
    (stored,) = (tmp_path / "cache").glob("*.safetensors")
    assert len([key for key in load_file(str(stored)) if key.endswith("/gram")]) == 4 * len(names) // 7


def test_layer_by_layer_readers_of_one_input_share_one_gram_after_replacements() -> None:
    """Layer by layer too, q, k and v (gate and up) take one Gram matrix, in every layer after
    weights before it were replaced: it is, bit for bit, the one k (and up) take alone in a pass
    with the same replacements (q and gate zeroed: all made before their layer's rows, whose
    readers follow them)."""

    program = _exported("llama-fp32")
    samples = Samples(Source.RANDOM, count=2, seed=4)
    names = [k for k, v in program.state_dict.items() if k.endswith("proj.weight") and v.dim() == 2]
    zeroed = [name for name in names if name.endswith(("q_proj.weight", "gate_proj.weight"))]
    calibration = calibrate(program, samples, cache=False)
    shared: dict[str, Statistics] = {}
    for name, statistics in calibration.sequential(names, Needs.INPUT_GRAM):
        shared[name] = statistics
        if name in zeroed:
            calibration.replace(name, torch.zeros_like(program.state_dict[name]))
    alone = calibrate(program, samples, cache=False)
    for name in zeroed:  # a weight's replacement reaches only what follows it: the same pass
        alone.replace(name, torch.zeros_like(program.state_dict[name]))
    apart = [name for name in names if name.endswith(("k_proj.weight", "up_proj.weight"))]
    for name, statistics in alone.sequential(apart, Needs.INPUT_GRAM):  # no reader beside it to share with
        assert torch.equal(shared[name].gram, statistics.gram), name
    by_tensor: dict[int, list[str]] = {}
    for name in names:
        by_tensor.setdefault(id(shared[name].gram), []).append(name.split(".")[-2])
    assert sorted(map(sorted, by_tensor.values())) == sorted(
        [["k_proj", "q_proj", "v_proj"], ["o_proj"], ["gate_proj", "up_proj"], ["down_proj"]]
        * (len(names) // 7)
    )


class _ReadsALookupAndAConvolution(torch.nn.Module):
    """A linear layer reading an embedding lookup's output directly (OPT's `project_in`), and one
    reading a convolution's: each reader is keyed apart from the op before it."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(50, 16)
        self.project = torch.nn.Linear(16, 16, bias=False)
        self.conv = torch.nn.Conv1d(16, 16, 1, bias=False)
        self.after = torch.nn.Linear(16, 8, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        y = self.conv(self.project(x).transpose(1, 2)).transpose(1, 2)
        return self.after(y)


@pytest.mark.parametrize("sequential", [False, True])
def test_a_linear_reading_a_lookup_or_a_convolution_takes_its_own_rows(
    tmp_path: Path, sequential: bool
) -> None:
    """Keyed by rows, a linear layer that reads a lookup's output shares nothing with the lookup
    (which has no rows), nor one that reads a convolution's output with the convolution: each
    Gram matrix is that of its own input, in one pass and layer by layer."""
    model = _ReadsALookupAndAConvolution().eval()
    program = torch.export.export(model, (torch.zeros(1, 8, dtype=torch.long),))
    ids = torch.randint(0, 50, (3, 1, 8), generator=torch.Generator().manual_seed(2))
    save_file({"ids": ids}, str(tmp_path / "ids.safetensors"))
    calibration = calibrate(program, Samples.of(tmp_path / "ids.safetensors"), cache=False)
    names = ["embed.weight", "project.weight", "conv.weight", "after.weight"]
    if sequential:
        found = dict(calibration.sequential(names, Needs.INPUT_GRAM))
    else:
        found = calibration.statistics(names, Needs.INPUT_GRAM)
    with torch.no_grad():
        x = model.embed(ids.reshape(-1, 8))
        h = model.project(x)
        y = model.conv(h.transpose(1, 2)).transpose(1, 2)
    assert found["embed.weight"].gram is None
    for name, rows in (("project.weight", x), ("conv.weight", h), ("after.weight", y)):
        rows = rows.reshape(-1, 16).double()
        torch.testing.assert_close(found[name].gram, rows.T @ rows / 24, rtol=1e-5, atol=1e-6, msg=name)


def test_a_text_calibration_takes_a_default_token_budget_or_every_token(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import pytest

    from coreai_opt.calibration import DEFAULT_TEXT_TOKENS, CalibrationSpec, Samples
    from coreai_opt.errors import ConfigError

    text = tmp_path / "calib.txt"
    text.write_text("some words", encoding="utf-8")
    assert Samples.of(text).tokens == DEFAULT_TEXT_TOKENS == 16384
    assert "the default: --calibration-tokens all takes every one" in Samples.of(text).describe()
    assert Samples.of(text, tokens="all").tokens is None and Samples.of(text, tokens="300").tokens == 300
    assert CalibrationSpec(source=str(text), tokens="512").tokens == 512
    written = CalibrationSpec(source=str(text)).to_dict()  # a text's budget is written out
    assert written["tokens"] == 16384 and CalibrationSpec.from_dict(written).tokens == 16384
    assert CalibrationSpec.from_dict({"source": str(text)}).tokens == "all"  # a recipe from before the budget
    for bad in ("some", "0", -3, True):
        with pytest.raises(ConfigError, match="a count of 1 or more or 'all'"):
            CalibrationSpec(source=str(text), tokens=bad)


def test_one_pass_leaves_no_sums_to_the_cyclic_collector(tmp_path: Path) -> None:
    """The statistics of a pass are the means it returns: every running sum (a Gram matrix of each
    weight's input) is freed when the pass ends, by reference counting alone. A recorder caught in
    a reference cycle kept them all resident until the cyclic collector ran (at 0.1B parameters,
    1 GiB of float64 Grams through `optimize`'s cost table into its first round)."""
    import gc

    from coreai_opt.calibration._sums import Sums

    path, _ = _mlp_inputs(tmp_path)
    calibration = calibrate(load_pt2(SAMPLES / "mlp.pt2"), Samples.of(path), cache=False)
    gc.collect()
    gc.disable()
    try:
        before = {id(o) for o in gc.get_objects() if isinstance(o, Sums)}  # another test's, if any
        found = calibration.statistics(MLP_WEIGHTS, Needs.INPUT_GRAM)
        left = [o for o in gc.get_objects() if isinstance(o, Sums) and id(o) not in before]
    finally:
        gc.enable()
    weights = load_pt2(SAMPLES / "mlp.pt2").state_dict
    for name in MLP_WEIGHTS:  # the means outlive the pass, as they should
        columns = weights[name].shape[1]
        assert found[name].gram.shape == (columns, columns)
    assert left == []
