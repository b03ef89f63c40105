"""`coreopt sensitivity`: each weight's trial, resumed from its first reader, measures exactly
what evaluating a program with only that weight compressed measures; with bfloat16 differences,
what the exact trial measures to a fraction of a percent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from tests._hf import TEXT, hf_folder

SEQ = 16


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from coreai_opt.models import export_file

    root = tmp_path_factory.mktemp("sensitivity")
    ref = export_file(hf_folder("llama", root), root / "ref.pt2", seq_len=SEQ, batch=2).output
    text = root / "text.txt"
    text.write_text(TEXT, encoding="utf-8")
    return {"ref": ref, "text": text, "root": root}


def test_each_weights_measure_is_the_evaluation_of_it_alone(exported) -> None:
    from coreai_opt.compression import Override, PalettizeConfig
    from coreai_opt.evaluation import evaluate_text, weight_sensitivity
    from coreai_opt.recipes import compress_file

    config = PalettizeConfig(n_bits=2, weight_num_threshold=0)
    result = weight_sensitivity(exported["ref"], config, text=exported["text"], exact_products=True)
    assert result.products == "exact"
    names = [w.name for w in result.weights]
    assert "lm_head.weight" in names and "model.layers.1.mlp.down_proj.weight" in names
    assert len(names) == 2 * 7 + 2  # every projection, the embedding and the head (norms are small vectors)
    assert [w.kl_mean for w in result.weights] == sorted((w.kl_mean for w in result.weights), reverse=True)
    for row in (result.weights[0], next(w for w in result.weights if "layers.1" in w.name)):
        alone = exported["root"] / f"alone.{row.name}.pt2"
        only = PalettizeConfig(n_bits=2, weight_num_threshold=0,
                               overrides=(Override.of(row.name, n_bits=2), Override.of("*", skip=True)))  # fmt: skip
        compress_file(exported["ref"], alone, only)
        measured = evaluate_text(exported["ref"], [alone], text=exported["text"]).candidates[0]
        assert row.kl_mean == pytest.approx(measured.kl_mean, rel=1e-4, abs=1e-7)  # exact float64 vs rounded
        assert row.perplexity_increase == pytest.approx(measured.perplexity_increase, rel=1e-4, abs=1e-7)
        assert row.top1 == measured.top1
        assert row.bytes_saved > 0
    assert result.weights[0].kl_mean > 10 * result.weights[-1].kl_mean
    # the Fisher estimate ranks the weights as the measurement does, roughly
    assert all(w.estimate is not None and w.estimate >= 0 for w in result.weights)
    assert result.rank_correlation is not None and result.rank_correlation > 0.5


def test_sensitivity_cli_json_and_config_forms(exported, coreopt, tmp_path: Path) -> None:
    from coreai_opt.recipes import config_from_text

    spec = tmp_path / "int4.yaml"
    spec.write_text(
        "kind: quantize\ndtype: int4\ngranularity: block\nblock_size: 8\nweight_num_threshold: 0\n"
    )
    inline = config_from_text("quantize:dtype=int4,granularity=block,block_size=8,weight_num_threshold=0")
    assert config_from_text(str(spec)) == inline
    result = coreopt("sensitivity", exported["ref"], "--text", exported["text"], "--config", spec, "--json",
                     "--no-estimate", "--max-tokens", 64)  # fmt: skip
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert (
        doc["config"]["dtype"] == "int4"
        and len(doc["weights"]) == 16
        and doc["scored_tokens"] == 4 * (SEQ - 1)
    )
    assert doc["weights"][0]["kl_mean"] >= doc["weights"][-1]["kl_mean"] and doc["rank_correlation"] is None
    from coreai_opt._cpu import native_bfloat16

    assert doc["products"] == ("bfloat16 differences" if native_bfloat16() else "exact")
    exact = coreopt("sensitivity", exported["ref"], "--text", exported["text"], "--config", spec, "--json",
                    "--no-estimate", "--max-tokens", 64, "--exact-products")  # fmt: skip
    assert exact.exit_code == 0, exact.stderr
    again = json.loads(exact.stdout)
    assert again["products"] == "exact"
    assert [w["name"] for w in again["weights"][:3]] == [w["name"] for w in doc["weights"][:3]]
    bad = coreopt("sensitivity", exported["ref"], "--text", exported["text"], "--config", "quantize:nbits=4")
    assert bad.exit_code == 2 and "--config" in bad.stderr


@pytest.mark.parametrize(("scale", "peaked"), [(1e-3, False), (0.1, False), (30.0, False), (0.1, True)])
def test_a_trials_kl_read_off_its_difference_from_the_reference_is_the_textbook_one(
    scale: float, peaked: bool
) -> None:
    """KL, NLL and top-1 from d = z - z_ref in float32 pieces of rows against the textbook float64
    formulas: a tiny change, a small one, one that destroys the prediction, and a reference so sure
    of one token that float32 holds no other token's probability while the candidate moves to one
    of those. Windows overlap, so each scores only the rows after its carried-over context."""
    import torch

    from coreai_opt.evaluation._scores import Reference
    from coreai_opt.evaluation._tokens import Windows

    generator = torch.Generator().manual_seed(3)
    batch, length, stride, vocab = 3, 11, 6, 300
    windows = Windows(length + stride * 2 * batch, length, stride)
    context = windows.first_row(1)  # the rows windows after the first do not score
    assert context == 4
    ids = torch.randint(0, vocab, (batch, length), generator=generator)
    reference = 4 * torch.randn(batch, length, vocab, generator=generator)
    candidate = reference + scale * torch.randn(batch, length, vocab, generator=generator)
    if peaked:  # every other token below e^-140 for the reference; the candidate's favourite
        reference[..., 7] += 150.0
        candidate[..., 7] += 150.0
        candidate[..., 8] += 200.0
    held = Reference(reference, ids, batch, windows, first=1)
    held.ROWS = 4  # several pieces a window
    kl, nll, agree = held.against(candidate)

    def scored(logits: torch.Tensor) -> torch.Tensor:
        return logits[:, context:-1].reshape(-1, vocab).double()

    logp = torch.log_softmax(scored(reference), -1)
    logq = torch.log_softmax(scored(candidate), -1)
    targets = ids[:, context + 1 :].reshape(-1, 1)
    rows = len(targets)
    expected = float((logp.exp() * (logp - logq)).sum())
    assert expected > 1e-7 * rows
    assert kl == pytest.approx(expected, rel=1e-4, abs=1e-10 * rows)
    assert nll == pytest.approx(-float(logq.gather(1, targets).sum()), rel=0, abs=1e-6 * rows)
    assert agree == int((logq.argmax(-1) == logp.argmax(-1)).sum())
    assert agree == (0 if peaked else agree) and (scale < 1 or agree < rows)
    assert held.nll == pytest.approx(-float(logp.gather(1, targets).sum()), rel=1e-12)
    assert abs(held.against(reference + 5.0)[0]) < 1e-7 * rows  # a shift of every logit changes nothing


def test_the_reference_distribution_taken_a_piece_of_rows_at_a_time_has_the_whole_batchs_bits(
    monkeypatch,
) -> None:  # type: ignore[no-untyped-def]
    """Its log-sum-exp, probabilities, their sums and the targets' NLL, each row's own: 4 rows a
    piece give the bits one piece of every row gives, and those the textbook's float64 gives."""
    from coreai_opt.evaluation._scores import Reference
    from coreai_opt.evaluation._tokens import Windows

    generator = torch.Generator().manual_seed(5)
    batch, length, vocab = 3, 11, 300
    windows = Windows(length * batch, length, length)
    ids = torch.randint(0, vocab, (batch, length), generator=generator)
    logits = 4 * torch.randn(batch, length, vocab, generator=generator)
    monkeypatch.setattr(Reference, "ROWS", 1 << 30)
    whole = Reference(logits, ids, batch, windows, first=0)
    monkeypatch.setattr(Reference, "ROWS", 4)
    pieces = Reference(logits, ids, batch, windows, first=0)
    for field in ("lse", "p", "mass", "target_nll"):
        assert torch.equal(getattr(pieces, field), getattr(whole, field)), field
    wide = whole.z.double()
    assert torch.equal(whole.lse, torch.logsumexp(wide, -1)) and whole.nll == pieces.nll
    assert torch.equal(whole.p, (wide - whole.lse[:, None]).exp().float())


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_bfloat16_differences_measure_what_exact_trials_do(
    family: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every weight's trial with its products as the reference's plus bfloat16 products of the
    differences, the head left factored, against the exact float32 trial: KL, NLL and top-1 of
    each weight close, the ranking the same. GPT-2 reads its weights through addmm with a bias.
    On any CPU: one without bfloat16 instructions takes the same products, emulated."""
    import coreai_opt._cpu
    from coreai_opt.compression import PalettizeConfig, trial_encodings
    from coreai_opt.evaluation import spearman
    from coreai_opt.evaluation._language import Counter
    from coreai_opt.evaluation._sensitivity import _Resumable, _trials
    from coreai_opt.evaluation._tokens import Windows, text_token_ids
    from coreai_opt.io import load_pt2
    from coreai_opt.models import export_file

    path = export_file(hf_folder(family, tmp_path), tmp_path / "m.pt2", seq_len=SEQ, batch=2).output
    ep = load_pt2(path)
    trials, _ = _trials(ep, PalettizeConfig(n_bits=2, weight_num_threshold=0), trial_encodings)
    decoded = {name: t[2] for name, t in trials.items()}
    text = tmp_path / "text.txt"
    text.write_text(TEXT, encoding="utf-8")
    ids = text_token_ids(text, path.with_suffix(".tokenizer.json"))[: 6 * SEQ]
    windows = Windows(len(ids), SEQ, SEQ)
    found = {}
    monkeypatch.setattr(coreai_opt._cpu, "native_bfloat16", lambda: True)
    for differences in (False, True):
        runner = _Resumable(ep, path, differences)
        assert (runner.head is not None) == differences  # the logits' product, factored
        found[differences], _ = runner.sums(ids, windows, decoded, Counter(None, 1))
    exact, fast = found[False], found[True]
    assert len(exact) >= 10
    for name, (kl, nll, agree) in exact.items():
        assert kl > 0  # down to 3e-7 nats a token (the q / k projections)
        assert fast[name][0] == pytest.approx(kl, rel=5e-3), name  # seen: 0.16% at most
        assert fast[name][1] == pytest.approx(nll, rel=5e-5), name
        assert abs(fast[name][2] - agree) <= 1 + windows.scored // 100, name
    assert spearman([v[0] for v in exact.values()], [fast[n][0] for n in exact]) > 0.99


@pytest.mark.parametrize(
    ("scale", "peaked"), [(2.0**-10, False), (2.0**-3, False), (2.0**3, False), (2.0**-3, True)]
)
def test_a_factored_heads_scores_are_those_of_its_logits(scale: float, peaked: bool) -> None:
    """`against_head` (the logits' change kept as bfloat16 factors, scored a few vocabulary columns
    at a time, rows past FAR from their logits) against `against` on the logits multiplied out:
    the factors are small multiples of a power of two, so both see the very same d."""
    import torch

    from coreai_opt.evaluation._deltas import FactoredChange
    from coreai_opt.evaluation._scores import Reference
    from coreai_opt.evaluation._tokens import Windows

    generator = torch.Generator().manual_seed(5)
    batch, length, stride, vocab, inner = 3, 11, 6, 300, 8
    windows = Windows(length + stride * 2 * batch, length, stride)
    ids = torch.randint(0, vocab, (batch, length), generator=generator)
    reference = 4 * torch.randn(batch, length, vocab, generator=generator)
    if peaked:  # every other token below e^-140 for the reference
        reference[..., 7] += 150.0
    left = (torch.randint(-2, 3, (batch * length, inner), generator=generator) * scale).bfloat16()
    right = torch.randint(-2, 3, (inner, vocab), generator=generator).bfloat16()
    change = (left.float() @ right.float()).reshape(batch, length, vocab)
    assert torch.equal(change.bfloat16().float(), change)  # exact in bfloat16 and float32
    held = Reference(reference, ids, batch, windows, first=1)
    held.COLUMNS = 64  # several pieces a row, the last one short
    expected = held.against(reference + change)
    kl, nll, agree = held.against_head(FactoredChange([(left, right)], 1.0))
    assert kl == pytest.approx(expected[0], rel=1e-4, abs=1e-7)
    assert nll == pytest.approx(expected[1], rel=1e-6)
    assert agree == expected[2]
    assert (scale < 1) == (float(change.amax()) < Reference.FAR)  # the large scale goes past FAR
    two = FactoredChange([(left, right), (left, right)], 0.5)  # two terms, halved: the same change
    assert held.against_head(two) == pytest.approx((kl, nll, agree), rel=1e-6)
    assert held.against_head(FactoredChange([], 1.0)) == (0.0, held.nll, len(held.targets))


def test_difference_products_never_write_the_reference() -> None:
    """mm and addmm in a trial: the reference's output plus bfloat16 products of what changed -
    the operand that moved, the weight swapped, or both - close to the float32 product, the
    recorded tensors untouched, and the reference's own tensor where nothing changed."""
    import torch
    from torch import fx

    from coreai_opt.evaluation._deltas import DeltaProducts

    aten = torch.ops.aten
    module = torch.nn.Module()
    generator = torch.Generator().manual_seed(0)
    module.w = torch.nn.Parameter(torch.randn(6, 5, generator=generator))
    module.bias = torch.nn.Parameter(torch.randn(6, generator=generator))
    graph = fx.Graph()
    x = graph.placeholder("x")
    weight = graph.call_function(aten.permute.default, (graph.get_attr("w"), [1, 0]))
    mm = graph.call_function(aten.mm.default, (x, weight))
    addmm = graph.call_function(aten.addmm.default, (graph.get_attr("bias"), x, weight), {"alpha": 0.5})
    graph.output((mm, addmm))
    deltas = DeltaProducts(graph)
    assert deltas.products == {mm, addmm}
    xs = torch.randn(4, 5, generator=generator)
    w_t = module.w.detach().t()
    refs = {}
    for node in (mm, addmm):
        args = (xs, w_t) if node is mm else (module.bias.detach(), xs, w_t)
        out = node.target(*args, **node.kwargs)
        deltas.record(node, args, out)
        refs[node] = (args, out, out.clone())
    moved = xs + 1e-2 * torch.randn(4, 5, generator=generator)
    swapped = (module.w.detach() + 1e-2 * torch.randn(6, 5, generator=generator)).t()
    for x_now, w_now in ((xs, w_t), (moved, w_t), (xs, swapped), (moved, swapped)):
        deltas.swap("w" if w_now is swapped else None)
        for node in (mm, addmm):
            args = (x_now, w_now) if node is mm else (module.bias.detach(), x_now, w_now)
            got = deltas.product(node, args, node.kwargs)
            if x_now is xs and w_now is w_t:
                assert got is refs[node][1]  # nothing changed
                continue
            exact = node.target(*args, **node.kwargs)
            change = exact - refs[node][1]
            assert float((got - exact).abs().max()) < 2e-2 * float(change.abs().max()), node
            assert torch.equal(refs[node][1], refs[node][2])  # the reference kept as it was


def test_the_estimate_is_per_token_whatever_the_number_of_samples(
    exported, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Fisher estimate of a text of one sample (2 windows of SEQ words) and of that text three
    times (three equal samples): the same per-token value (F is a mean over the samples). Each
    position's next token is the model's most likely one here, so that equal samples draw alike."""
    from coreai_opt.calibration import _losses
    from coreai_opt.compression import QuantizeConfig, trial_encodings
    from coreai_opt.evaluation._sensitivity import WeightSensitivity, _estimate, _trials
    from coreai_opt.io import load_pt2
    from coreai_opt.models import model_tokenizer

    ep = load_pt2(exported["ref"])
    trials, _ = _trials(ep, QuantizeConfig(dtype="int4", weight_num_threshold=0), trial_encodings)
    words = TEXT.split()[: 2 * SEQ]
    monkeypatch.setattr(_losses, "_drawn_tokens", lambda logits, generator: logits.argmax(-1))
    found = []
    for times in (1, 3):
        text = tmp_path / f"text{times}.txt"
        text.write_text(" ".join(words * times), encoding="utf-8")
        rows = [WeightSensitivity(name, (), 0, 0) for name in trials]
        _estimate(
            ep, rows, trials, text, tokenizer=model_tokenizer(exported["ref"]), max_tokens=None, exact=True
        )
        found.append([r.estimate for r in rows])
    assert all(e is not None and e > 0 for e in found[0])
    assert found[1] == pytest.approx(found[0], rel=1e-5)


def test_difference_products_take_each_batchs_activations_and_stay_off_where_they_cannot() -> None:
    """An activation x activation product whose right operand is a value from before the cut:
    each batch's own (no bfloat16 copy kept across batches, which only a weight's may be);
    16-bit products recorded as nothing (they run as they are); a graph with an in-place op left
    to exact trials."""
    import torch
    from torch import fx

    from coreai_opt.evaluation._deltas import DeltaProducts

    aten = torch.ops.aten
    graph = fx.Graph()
    x, y = graph.placeholder("x"), graph.placeholder("y")
    mm = graph.call_function(aten.mm.default, (x, y))
    graph.output(mm)
    deltas = DeltaProducts(graph)
    assert DeltaProducts.applies(graph)
    generator = torch.Generator().manual_seed(1)
    for _ in range(2):  # two batches
        a, b = torch.randn(4, 6, generator=generator), torch.randn(6, 5, generator=generator)
        deltas.clear()
        deltas.record(mm, (a, b), a @ b)
        moved = a + 1e-2 * torch.randn(4, 6, generator=generator)
        got = deltas.product(mm, (moved, b), {})
        change = moved @ b - a @ b
        assert float((got - moved @ b).abs().max()) < 2e-2 * float(change.abs().max())
    assert deltas.recorded
    half = DeltaProducts(graph)
    a16, b16 = torch.randn(4, 6).half(), torch.randn(6, 5).half()
    half.record(mm, (a16, b16), a16 @ b16)
    assert not half.recorded and half.product(mm, (a16 + 1, b16), {}) is None
    with graph.inserting_before(graph.output_node()):
        graph.call_function(aten.add_.Tensor, (x, y))
    assert not DeltaProducts.applies(graph)


def test_trials_off_the_cpu_take_exact_products_and_are_cached_as_such(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """bfloat16 differences are a CPU's (its bfloat16 instructions): a GPU's trials are exact, and
    optimize files them under "exact", never beside a CPU's differences."""
    from coreai_opt import _cpu
    from coreai_opt.evaluation import trial_products

    monkeypatch.setattr(_cpu, "native_bfloat16", lambda: True)
    assert trial_products() == trial_products(device="cpu") == "bfloat16 differences"
    assert trial_products(device="cuda") == trial_products(device="cuda:1") == "exact"
    assert trial_products(True) == trial_products(True, "cpu") == "exact"
    monkeypatch.setattr(_cpu, "native_bfloat16", lambda: False)
    assert trial_products() == "exact"


class _TinyLanguageModel(torch.nn.Module):
    """Ids -> logits through an embedding, one hidden layer and a head: a language model to the
    trial runner, exported with torch's own decompositions (no coreai-torch: a GPU image's)."""

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.embed = torch.nn.Parameter(torch.randn(96, 32, generator=generator))
        self.hidden = torch.nn.Parameter(torch.randn(64, 32, generator=generator) / 6)
        self.head = torch.nn.Parameter(torch.randn(96, 64, generator=generator) / 8)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = torch.nn.functional.embedding(ids, self.embed)
        return torch.relu(x @ self.hidden.T) @ self.head.T


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_gpu_measures_each_weight_as_the_cpu_does(tmp_path: Path) -> None:
    """The same trials on the GPU (the program's runs and the scores there) and on the CPU (exact
    products): every weight's KL, perplexity increase and top-1 agree."""
    import numpy as np
    from safetensors.numpy import save_file

    from coreai_opt.compression import QuantizeConfig
    from coreai_opt.evaluation import weight_sensitivity
    from coreai_opt.io import save_pt2

    ids = torch.zeros(2, 16, dtype=torch.long)
    program = torch.export.export(_TinyLanguageModel().eval(), (ids,)).run_decompositions()
    save_pt2(program, tmp_path / "tiny.pt2")
    tokens = np.random.default_rng(0).integers(0, 96, 16 * 2 * 6, dtype=np.int64)
    save_file({"tokens": tokens}, str(tmp_path / "ids.safetensors"))
    config = QuantizeConfig(dtype="int4", weight_num_threshold=0)
    runs = [weight_sensitivity(tmp_path / "tiny.pt2", config, tokens=tmp_path / "ids.safetensors",
                               exact_products=True, device=device) for device in (None, "cuda")]  # fmt: skip
    cpu, gpu = ({w.name: w for w in run.weights} for run in runs)
    assert set(cpu) == set(gpu) == {"embed", "hidden", "head"}
    for name, row in cpu.items():
        assert gpu[name].kl_mean == pytest.approx(row.kl_mean, rel=1e-4, abs=1e-9)
        assert gpu[name].perplexity_increase == pytest.approx(row.perplexity_increase, rel=1e-4, abs=1e-9)
        assert gpu[name].top1 == pytest.approx(row.top1, abs=1 / 96)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_gpu_prices_every_choice_as_the_cpu_does(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """optimize's cost table with its calibration, solves and estimates on the GPU (weights read
    there, k-means and the damage on the host): every weight's bytes as on the CPU, its damage
    close (the solves' products round differently on the two devices)."""
    from coreai_opt.calibration import Samples
    from coreai_opt.io import load_pt2, save_pt2
    from coreai_opt.optimization import cost_table, parse_choices

    program = torch.export.export(_TinyLanguageModel().eval(), (torch.zeros(2, 16, dtype=torch.long),))
    path = tmp_path / "tiny.pt2"
    save_pt2(program.run_decompositions(), path)
    choices = parse_choices("int4,lut4,lut2")
    tables = []
    for device in (None, "cuda"):
        monkeypatch.setenv("COREOPT_CACHE", str(tmp_path / f"cache-{device}"))
        tables.append(cost_table(path, lambda: load_pt2(path), choices, Samples.of("random", count=4), threshold=0,
                                 device=device))  # fmt: skip
    cpu, gpu = tables
    assert cpu.names == gpu.names and cpu.nbytes == gpu.nbytes
    for row_cpu, row_gpu in zip(cpu.damage, gpu.damage, strict=True):
        assert row_gpu == pytest.approx(row_cpu, rel=0.1)
