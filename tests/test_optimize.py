"""`coreopt optimize`: the knapsack against brute force, the cost table against the Taylor term
recomputed by hand, plans that beat the uniform setting of their size on a tiny LLaMA, recipes that
`coreopt apply` reproduces byte for byte, and a cosine bound that holds on unseen samples."""

from __future__ import annotations

import dataclasses
import filecmp
import itertools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from coreai_opt.errors import ConfigError
from coreai_opt.optimization import CostTable, Goal, front, parse_choices, solve
from coreai_opt.transforms import RotateConfig

# ----- the allocation ---------------------------------------------------------------------------


def _random_table(seed: int, weights: int = 5, choices: int = 4) -> CostTable:
    rng = np.random.default_rng(seed)
    nbytes, damage = [], []
    for _ in range(weights):
        sizes = sorted(rng.integers(10, 200, choices - 1).tolist(), reverse=True)
        hurts = sorted(rng.random(choices - 1).tolist())
        row_b = [400.0, *map(float, sizes)]
        row_d = [0.0, *hurts]
        if rng.random() < 0.3:  # a choice this weight cannot take
            row_b[2], row_d[2] = math.inf, math.inf
        nbytes.append(row_b)
        damage.append(row_d)
    names = [f"w{i}" for i in range(weights)]
    return CostTable(names, [100] * weights, ["keep", *(f"c{k}" for k in range(1, choices))], nbytes, damage)


def _every_plan(table: CostTable) -> list[tuple[float, float, tuple[int, ...]]]:
    rows = [[k for k in range(len(table.choices)) if math.isfinite(r[k])] for r in table.nbytes]
    found = []
    for picks in itertools.product(*rows):
        b = sum(table.nbytes[w][k] for w, k in enumerate(picks))
        d = sum(table.damage[w][k] for w, k in enumerate(picks))
        found.append((b, d, picks))
    return found


@pytest.mark.parametrize("seed", range(6))
def test_the_knapsack_is_exact_against_every_plan(seed: int) -> None:
    table = _random_table(seed)
    plans = _every_plan(table)
    for budget in (300.0, 450.0, 700.0, 1100.0, 2000.0):
        best = min((d for b, d, _ in plans if b <= budget), default=None)
        plan = solve(table, budget, resolution=int(budget))  # one byte per unit: exact
        if best is None:
            assert plan is None
            continue
        assert plan is not None and plan.nbytes <= budget
        assert plan.damage == pytest.approx(best, abs=1e-12)
        coarse = solve(table, budget, resolution=50)  # bytes rounded up to units of budget / 50
        slack = len(table.names) * budget / 50
        tighter = min((d for b, d, _ in plans if b <= budget - slack), default=math.inf)
        if coarse is None:  # then not even the plans of budget - slack bytes fit
            assert tighter == math.inf
            continue
        assert coarse.nbytes <= budget and coarse.slack_bytes == pytest.approx(slack)
        assert best - 1e-12 <= coarse.damage <= tighter + 1e-12


@pytest.mark.parametrize("seed", range(4))
def test_the_smallest_plan_within_a_damage_bound_is_the_smallest_of_every_plan(seed: int) -> None:
    table = _random_table(seed)
    plans = _every_plan(table)
    knapsack = front(table, resolution=int(sum(max(b for b in r if math.isfinite(b)) for r in table.nbytes)))
    for bound in (0.05, 0.3, 1.0, 2.5):
        fits = [b for b, d, _ in plans if d <= bound + 1e-12]
        plan = knapsack.smallest_within(bound)
        assert plan is not None and plan.damage <= bound + 1e-12
        assert plan.nbytes == min(fits)


def test_a_weights_row_mass_is_summed_a_piece_at_a_time_to_the_same_bits(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The rows' sums of squared gradients that price a sampled weight come a piece of rows at a
    time in float64 (no float64 copy of the whole): bit for bit the whole's sums where the rows
    lead (a linear layer's, an embedding's), over pieces that split them unevenly, and for a
    vector; to float64's rounding where they are columns (the pieces sum in another order)."""
    from coreai_opt import _pieces
    from coreai_opt.optimization._costs import _row_mass

    monkeypatch.setattr(_pieces, "PIECE", 1000)  # pieces of 1 or 3 rows below, the last one short
    squares = torch.rand(50, 300, generator=torch.Generator().manual_seed(0)) ** 4
    assert torch.equal(_row_mass(squares, 0), squares.double().sum(dim=1))
    torch.testing.assert_close(_row_mass(squares, 1), squares.double().sum(dim=0), rtol=1e-14, atol=0)
    assert torch.equal(_row_mass(squares[0], 0), squares[0].double())


def test_choices_parse_names_defaults_and_configs_of_ones_own() -> None:
    picked = parse_choices("int8,mine=quantize:dtype=int4,granularity=block,block_size=16,lut2")
    assert [c.name for c in picked] == ["int8", "mine", "lut2", "keep"]
    assert picked[1].config.block_size == 16 and picked[1].config.granularity.value == "block"
    assert [c.name for c in parse_choices(None)][:3] == ["keep", "int8", "int4-b32"]
    tensor = parse_choices("lut4-tensor")[0].config_for(True, 0)  # optional: one table a weight, GPTQ onto it
    assert (tensor.n_bits, tensor.granularity.value, tensor.method) == (4, "tensor", "gptq")
    assert "lut4-tensor" not in [c.name for c in parse_choices(None)]
    q8 = {c.name: c.config_for(True, 0) for c in parse_choices(None) if c.name.endswith("-q8")}
    assert {n: (c.n_bits, c.lut_dtype.value, c.method) for n, c in q8.items()} == {
        "lut6-q8": (6, "int8", "sensitive"),
        "lut4-q8": (4, "int8", "gptq"),
    }  # default: int8 table entries, the solver picks them where they cost nothing
    with pytest.raises(ConfigError, match="unknown candidate 'lut5'"):
        parse_choices("lut5")
    with pytest.raises(ConfigError, match="exactly one budget"):
        Goal(target_bits=4, max_kl=0.1)


# ----- a tiny LLaMA calibrated and evaluated on disjoint text --------------------------------------


@pytest.mark.parametrize("bits", [4, 6])
def test_int8_table_choices_store_a_quarter_of_the_table_bytes_and_move_entries_by_half_a_step(
    bits: int,
) -> None:
    """`lut{n}-q8` is `lut{n}` with each table's entries stored as int8 under one scale (float32,
    as this float32 model's tables):
    the same indices, 44 (4-bit) or 188 (6-bit) bytes less a table, each entry within half a
    quantization step (max |entry| / 254) of the float32 table's."""
    from coreai_opt.compression import trial_encodings
    from coreai_opt.io import load_pt2
    from coreai_opt.weights import Palettized, decode
    from tests.conftest import SAMPLES

    program = load_pt2(SAMPLES / "transformer.pt2")
    plain, q8 = (c.config_for(False, 0) for c in parse_choices(f"lut{bits},lut{bits}-q8")[:2])
    assert q8.lut_dtype is not None and dataclasses.replace(q8, lut_dtype=None) == plain
    pairs = [
        (site, exact, stored)
        for (site, exact), (_, stored) in zip(
            trial_encodings(program, plain), trial_encodings(program, q8), strict=True
        )
        if isinstance(getattr(exact, "form", None), Palettized)
    ]
    assert len(pairs) > 3
    for site, exact, stored in pairs:
        assert isinstance(stored.form, Palettized)
        tables = exact.form.luts
        assert exact.nbytes - stored.nbytes == tables * ((2**bits) * 3 - 4), site.name
        assert np.array_equal(exact.form.indices.values, stored.form.indices.values)
        dense, rounded = decode(exact).double(), decode(stored).double()
        rows = dense.reshape(tables, -1)  # a table's 16 channels are 16 consecutive rows
        step = rows.abs().amax(1, keepdim=True) / 254
        assert ((rounded.reshape(tables, -1) - rows).abs() <= step * (1 + 1e-6)).all(), site.name
        assert not torch.equal(dense, rounded)


@pytest.fixture(scope="module")
def llama(tiny_llama: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tests._hf import TEXT

    root = tmp_path_factory.mktemp("optimize")
    program = tiny_llama["ref"]
    words = TEXT.split()
    (root / "calib.txt").write_text(" ".join(words[: len(words) // 2]) * 2, encoding="utf-8")
    (root / "held.txt").write_text(" ".join(reversed(words)), encoding="utf-8")
    return {"ref": program, "calib": root / "calib.txt", "held": root / "held.txt", "root": root}


def test_a_large_weight_is_priced_on_row_groups_that_encode_as_the_whole_weight_does(
    llama, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    from coreai_opt.calibration import Samples, calibrate
    from coreai_opt.compression import sampled_trial_encodings, trial_encodings
    from coreai_opt.io import load_pt2
    from coreai_opt.models import model_tokenizer
    from coreai_opt.optimization import cost_table
    from coreai_opt.weights import Needs, decode, nbytes_for_rows

    monkeypatch.setenv("COREOPT_CACHE", str(llama["root"] / "cache-rows"))
    samples = Samples.of(llama["calib"], tokens=128, tokenizer=model_tokenizer(llama["ref"]))
    ep = load_pt2(llama["ref"])
    calibration = calibrate(ep, samples, cache=False)
    choices = parse_choices("int8,int4-b32,lut6,lut4-q8,lut4-tensor,lut4-v2")[
        :-1
    ]  # each algorithm and layout
    elements = 1024
    sampled: dict[str, list[str]] = {}
    rows_of: dict[str, dict[str, int]] = {}
    for choice in choices:
        config = choice.config_for(True, 0)
        whole = {site.name: encoding for site, encoding in trial_encodings(ep, config, calibration)}
        for site, encoding, sample in sampled_trial_encodings(ep, config, calibration, elements=elements):
            if sample is None:
                continue
            full = whole[site.name]
            sampled.setdefault(choice.name, []).append(site.name)
            rows_of.setdefault(choice.name, {})[site.name] = len(sample.rows)
            assert len(sample.rows) % 2 == 0  # even, as the weight's rows: codes packed two a byte
            assert len(sample.rows) * site.count // sample.of <= elements + site.count // sample.of * 16
            assert torch.equal(decode(encoding), sample.take(decode(full), site.output_axis)), site.name
            assert nbytes_for_rows(encoding.form, len(sample.rows), sample.of) == full.nbytes
    # every per-channel or grouped choice samples the large weights; a table or scale shared by
    # the whole weight never is
    assert set(sampled) == {c.name for c in choices} - {"lut4-tensor", "lut4-v2"}
    assert all(len(names) >= 5 for names in sampled.values())
    # a table of 64 entries is priced on a quarter of the values a 16-entry one is (its k-means
    # costs about four times as much a value): every weight the other samples, and smaller ones
    # too, on no more row groups, on fewer where the other took more than one
    tables, sixteen = rows_of["lut6"], rows_of["lut4-q8"]
    assert set(tables) > set(sixteen) and all(tables[n] <= rows for n, rows in sixteen.items())
    assert all(tables[n] < rows for n, rows in sixteen.items() if rows > 16)
    # the table's estimate is the sample rows' share of the Taylor term, its bytes the whole's
    choice = parse_choices("lut4")[0]
    exact = cost_table(llama["ref"], lambda: load_pt2(llama["ref"]), (choice,), samples, threshold=0)
    table = cost_table(
        llama["ref"],
        lambda: load_pt2(llama["ref"]),
        (choice,),
        samples,
        threshold=0,
        sample_elements=elements,
    )
    assert table.nbytes == exact.nbytes and table.names == exact.names
    fisher = calibration.statistics(table.names, Needs.GRADIENT_SQUARES)
    grams = calibration.statistics(table.names, Needs.INPUT_GRAM)
    per_window = fisher[table.names[0]].rows / len(calibration.inputs)
    weights = dict(ep.module().named_parameters())
    config = choice.config_for(True, 0)
    shares = {}
    for site, encoding, sample in sampled_trial_encodings(ep, config, calibration, elements=elements):
        w = table.names.index(site.name)
        if sample is None:
            assert table.damage[w] == exact.damage[w]
            continue
        rows, shares[site.name] = sample.rows, len(sample.rows) / sample.of
        delta = decode(encoding).double() - weights[site.name].detach().double()[rows]
        f, gram = fisher[site.name].gradient_squares[rows], grams[site.name].gram
        if gram is not None and gram.shape == (delta.shape[1], delta.shape[1]):
            s = f.sum(1) / (per_window * gram.diagonal().sum())
            part = 0.5 * float((s * ((delta @ gram) * delta).sum(1)).sum())
        else:
            part = 0.5 * float((f * delta.square()).sum()) / per_window
        whole = fisher[site.name].gradient_squares.double()
        share = float(whole[rows].sum() / whole.sum())  # the sample's share of the squared gradients
        assert 0 < share < 1 and table.damage[w][0] == pytest.approx(part / share, rel=1e-9)
        assert table.damage[w][0] == pytest.approx(exact.damage[w][0], rel=0.5)
    assert table.sampled == shares and len(shares) >= 5 and exact.sampled == {}


def test_the_cost_table_is_the_taylor_term_and_the_bytes_the_writer_stores(llama, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from coreai_opt.calibration import Samples, calibrate
    from coreai_opt.compression import compress_, trial_encodings
    from coreai_opt.evaluation import trial_divergences
    from coreai_opt.io import load_pt2
    from coreai_opt.models import model_tokenizer
    from coreai_opt.optimization import _costs, cost_table
    from coreai_opt.weights import Needs, decode

    monkeypatch.setenv("COREOPT_CACHE", str(llama["root"] / "cache-costs"))
    samples = Samples.of(llama["calib"], tokens=128, tokenizer=model_tokenizer(llama["ref"]))
    choices = parse_choices("int4,lut2")
    reduced: dict[str, Any] = {}
    gradients = _costs._gradients

    def reducing(*args: Any) -> Any:
        found, kept = gradients(*args)
        assert kept is None  # no learned method of these choices reads the squares again
        reduced.update(found)
        return found, kept

    monkeypatch.setattr(_costs, "_gradients", reducing)
    table = cost_table(llama["ref"], lambda: load_pt2(llama["ref"]), choices, samples, threshold=0)
    assert table.cached == [] and table.choices == ["int4", "lut2", "keep"]
    # by hand, K-FAC: 1/2 sum_j S_j dW_j G dW_j^T per token, S_j = sum_i F_ij / (T tr G), F the mean
    # squared gradient of a window's loss over T tokens; the diagonal 1/2 sum(F dW^2) / T without G
    ep = load_pt2(llama["ref"])
    calibration = calibrate(ep, samples, cache=False)
    fisher = calibration.statistics(table.names, Needs.GRADIENT_SQUARES)
    grams = calibration.statistics(table.names, Needs.INPUT_GRAM)
    per_window = fisher[table.names[0]].rows / len(calibration.inputs)
    config = choices[0].config_for(True, 0)
    weights = dict(ep.module().named_parameters())
    checked = kronecker = 0
    decoded = {}
    for site, encoding in trial_encodings(ep, config, calibration):
        w = table.names.index(site.name)
        delta = decode(encoding).double() - weights[site.name].detach().double()
        f, gram = fisher[site.name].gradient_squares, grams[site.name].gram
        if gram is not None and gram.shape == (delta.shape[1], delta.shape[1]):  # a linear layer's input
            s = f.sum(1) / (per_window * gram.diagonal().sum())
            expected = 0.5 * float((s * ((delta @ gram) * delta).sum(1)).sum())
            kronecker += 1
        else:  # the embedding lookup
            expected = 0.5 * float((f * delta.square()).sum()) / per_window
        assert table.damage[w][0] == pytest.approx(expected, rel=1e-9)
        assert table.nbytes[w][0] == encoding.nbytes
        if checked < 3:
            decoded[site.name] = decode(encoding)
        checked += 1
    assert kronecker == checked - 1
    assert checked == len(table.names) > 10
    # the estimate kept each weight's squared gradients as row sums (the same bits), and whole
    # only where no Gram matrix fits: a learned method of these choices reads none of them
    assert [n for n, g in reduced.items() if g.squares is not None] == ["model.embed_tokens.weight"]
    assert sorted(reduced) == sorted(table.names) and all(
        torch.equal(g.row_sums, fisher[n].gradient_squares.double().sum(1)) for n, g in reduced.items()
    )
    # the bytes of a uniform setting are what compressing with it stores
    report = compress_(load_pt2(llama["ref"]), choices[1].config_for(False, 0))
    assert table.uniform("lut2")[0] == sum(r.bytes_after for r in report.weights) + sum(
        table.nbytes[table.names.index(s.name)][2] for s in report.skipped if s.name in table.names
    )
    # a second run reads every choice from the cache and never opens the program
    again = cost_table(llama["ref"], lambda: pytest.fail("loaded"), choices, samples, threshold=0)
    assert sorted(again.cached) == ["int4", "lut2"] and again.damage == table.damage
    # trials over cached columns encode the anchors again (those weights only) and measure what
    # the whole column's encodings measure
    tried = cost_table(
        llama["ref"], lambda: load_pt2(llama["ref"]), choices, samples, threshold=0, trial_tokens=32
    )
    assert sorted(tried.cached) == ["int4", "lut2"] and tried.trial_tokens == 32
    ids = np.concatenate(
        [inputs[0].numpy().reshape(-1) for _, inputs in itertools.islice(samples.inputs(ep), 2)]
    )
    for name, kl in trial_divergences(ep, ids, decoded).items():
        assert tried.measured[tried.names.index(name)][0] == pytest.approx(kl, rel=1e-9)


def test_the_trials_keep_the_statistics_of_the_weights_they_encode_whole_and_no_others(
    llama, monkeypatch, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    """A 64-entry table is estimated on a quarter of the values a 16-entry one is, so it samples
    weights that the anchors (lut2, lut4) encode whole in the estimate: the trials keep only the
    statistics of the weights an anchor sampled, let each choice's go after its trials, and take
    none again from the calibration."""
    from coreai_opt.calibration import Samples, _capture
    from coreai_opt.io import load_pt2
    from coreai_opt.models import model_tokenizer
    from coreai_opt.optimization import _trials, cost_table

    monkeypatch.setenv("COREOPT_CACHE", str(tmp_path / "cache"))
    samples = Samples.of(llama["calib"], tokens=128, tokenizer=model_tokenizer(llama["ref"]))
    passes: list[list[str]] = []
    one_pass = _capture.one_pass
    monkeypatch.setattr(
        _capture, "one_pass", lambda gm, names, *a: passes.append(list(names)) or one_pass(gm, names, *a)
    )
    seen: list[tuple[str, set[str], set[str], int]] = []
    trials = _trials._trials

    def spy(loaded, choice, names, *rest):  # type: ignore[no-untyped-def]
        kept = {n for by_name in loaded.known.values() for n in by_name}
        whole = {n for n in names if choice.name not in loaded.encodings.get(n, {})}
        seen.append((choice.name, kept, whole, len(passes)))
        return trials(loaded, choice, names, *rest)

    monkeypatch.setattr(_trials, "_trials", spy)
    table = cost_table(llama["ref"], lambda: load_pt2(llama["ref"]), parse_choices("lut6,lut4,lut2"), samples,
                       threshold=0, trial_tokens=32, sample_elements=1024)  # fmt: skip
    assert [s[0] for s in seen] == ["lut2", "lut4"]
    (_, kept_first, whole_first, before), (_, kept_second, whole_second, _) = seen
    assert whole_first and whole_second and kept_second == whole_second
    assert kept_first == whole_first | whole_second
    assert set(table.sampled) > kept_first  # lut6 sampled weights no trial encodes again
    assert len(passes) == before  # the trials took no statistics of their own
    assert all(set(m) == {0, 1, 2} - {table.column("lut6")} for m in table.measured)


def test_squares_a_learned_choice_reads_again_are_kept_on_disk_with_the_same_table(
    llama, tmp_path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """lut6 (`sensitive` k-means) reads every weight's squared gradients again, in the estimate
    and the trials: on the host they wait on disk, read a weight at a time, and the cost table is
    the one of squares held in memory, to the bit."""
    import coreai_opt.calibration as calibration_package
    from coreai_opt.calibration import Samples
    from coreai_opt.io import load_pt2
    from coreai_opt.models import model_tokenizer
    from coreai_opt.optimization import _costs, cost_table

    samples = Samples.of(llama["calib"], tokens=128, tokenizer=model_tokenizer(llama["ref"]))
    kept: list[Any] = []
    gradients = _costs._gradients

    def keeping(*args: Any) -> Any:
        found = gradients(*args)
        kept.append(found[1])
        return found

    monkeypatch.setattr(_costs, "_gradients", keeping)
    tables, kept_as_given = [], calibration_package.kept_squares
    for where in ("disk", "memory"):
        monkeypatch.setenv("COREOPT_CACHE", str(tmp_path / where))
        if where == "memory":  # as on a GPU
            monkeypatch.setattr(calibration_package, "kept_squares", lambda on_disk: kept_as_given(False))
        tables.append(cost_table(llama["ref"], lambda: load_pt2(llama["ref"]), parse_choices("lut6,lut2"), samples,
                                 threshold=0, trial_tokens=32, sample_elements=1024))  # fmt: skip
    assert [k._folder is None for k in kept] == [False, True]
    on_disk, in_memory = tables
    np.testing.assert_array_equal(np.array(on_disk.damage), np.array(in_memory.damage))  # NaN: not estimated
    assert on_disk.nbytes == in_memory.nbytes
    assert on_disk.measured == in_memory.measured and on_disk.sampled == in_memory.sampled != {}


# data-free tables keep this quick (the learned methods are tests/test_learned.py's)
LUTS = "int8,l4=palettize:n_bits=4,granularity=grouped,group_size=16,l2=palettize:n_bits=2,granularity=grouped,group_size=16"


def test_a_weights_ratio_of_measured_to_estimated_damage_carries_to_its_other_choices() -> None:
    from coreai_opt.optimization._trials import corrected

    # keep, three estimates around the two measured choices (columns 2 and 3), one it cannot take
    estimate = [0.0, 1e-4, 1e-3, 1e-2, 10**-2.5, math.inf]
    found = corrected(estimate, {2: 2e-3, 3: 1e-2})
    assert found[0] == 0.0 and found[5] == math.inf
    assert found[2] == 2e-3 and found[3] == 1e-2  # measured: as measured
    assert found[1] == pytest.approx(2e-4, rel=1e-12)  # below both: the nearest one's ratio, 2
    assert found[4] == pytest.approx(10**-2.5 * math.sqrt(2), rel=1e-12)  # halfway in log: ratio 2^(1/2)
    # a measurement at or below zero (rounding) is no damage, and its ratio reads as the floor's
    assert corrected([1e-3, 1e-4], {0: -1e-9}) == [0.0, pytest.approx(1e-13, rel=1e-9, abs=0)]
    # a NaN measurement is none; an infinite one rules out its own choice only
    assert corrected([1e-3, 1e-4], {0: math.nan}) == [1e-3, 1e-4]
    assert corrected([1e-3, 1e-4, 1e-2], {0: math.inf, 2: 2e-2}) == [math.inf, pytest.approx(2e-4), 2e-2]
    assert corrected([1e-3, 2e-3], {}) == [1e-3, 2e-3]  # nothing measured: the estimate


def test_optimize_beats_the_uniform_setting_of_its_size_and_apply_reproduces_it(
    llama, coreopt, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("COREOPT_CACHE", str(llama["root"] / "cache"))
    out, recipe = (
        llama["root"] / "new" / "mixed.pt2",
        llama["root"] / "mixed.recipe.yaml",
    )  # a folder made for it
    result = coreopt("optimize", llama["ref"], "--calibration", llama["calib"], "--eval", llama["held"],
                     "--target-bits", "4.5", "--threshold", "0", "--candidates", LUTS, "--calibration-tokens", "128",
                     "--rotate", "none", "-o", out, "--recipe", recipe, "--json")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["met"] is True and doc["bits_per_weight"] <= 4.5
    assert doc["trial_tokens"] == 128 and doc["trials"] == 2 * len(doc["weights"])  # l4 and l2 measured
    assert len({w["choice"] for w in doc["weights"]}) >= 2  # mixed
    (uniform,) = doc["uniform"]
    assert uniform["choice"] == "l4" and uniform["bits_per_weight"] > doc["bits_per_weight"]
    (final,) = doc["rounds"]
    assert final["measured"]["kl_mean"] < uniform["measured"]["kl_mean"]
    assert final["measured"]["perplexity"] < uniform["measured"]["perplexity"]
    # every weight carries its chosen encoding in the file written
    from coreai_opt.inspection import inspect_model

    stored = {w.name: w for w in inspect_model(out).weights}
    for row in doc["weights"]:
        encoding = stored[row["name"]].encoding
        expected = {
            "int8": "si8 + f32 scale per channel",
            "l4": "ui4 LUT(16 x",
            "l2": "ui2 LUT(4 x",
            "keep": "f32",
        }
        assert encoding.startswith(expected[row["choice"]]), (row, encoding)
    # the recipe re-applied gives the same bytes
    again = llama["root"] / "again.pt2"
    applied = coreopt("apply", recipe, llama["ref"], "-o", again, "--quiet")
    assert applied.exit_code == 0, applied.stderr
    assert filecmp.cmp(out, again, shallow=False)
    # a new budget re-solves from the cached costs; a dry run writes nothing
    dry = coreopt("optimize", llama["ref"], "--calibration", llama["calib"], "--target-bits", "3", "--threshold", "0",
                  "--candidates", LUTS, "--calibration-tokens", "128", "--rotate", "none", "--dry-run", "--json")  # fmt: skip
    assert dry.exit_code == 0, dry.stderr
    plan = json.loads(dry.stdout)
    assert sorted(plan["cached_choices"]) == ["int8", "l2", "l4"] and plan["bits_per_weight"] <= 3
    assert plan["predicted_damage"] > doc["predicted_damage"]  # less room, more damage
    _check_trials(llama)


def _check_trials(llama: dict[str, Path]) -> None:
    """The trials of the run before, read from its cache: each weight's two smallest choices were
    measured as evaluating the program with that weight alone compressed measures, on the first
    calibration tokens; the other choices took the estimate times the measured ratio."""
    from safetensors.numpy import save_file

    from coreai_opt.calibration import Samples
    from coreai_opt.compression import Override
    from coreai_opt.evaluation import evaluate_text
    from coreai_opt.io import load_pt2
    from coreai_opt.models import model_tokenizer
    from coreai_opt.optimization import cost_table
    from coreai_opt.recipes import compress_file

    samples = Samples.of(llama["calib"], tokens=128, tokenizer=model_tokenizer(llama["ref"]))
    choices = parse_choices(LUTS)
    from coreai_opt.optimization import OptimizeConfig

    table = cost_table(llama["ref"], lambda: pytest.fail("loaded"), choices, samples, threshold=0, trial_tokens=512,
                       sample_elements=OptimizeConfig().estimate_sample)  # as the run before: its cache  # fmt: skip
    int8, l4, l2 = (table.column(c) for c in ("int8", "l4", "l2"))
    assert table.trial_tokens == 128 and all(set(m) == {l4, l2} for m in table.measured)  # all there are
    windows = [inputs[0].numpy().reshape(-1) for _, inputs in samples.inputs(load_pt2(llama["ref"]))]
    tokens = llama["root"] / "first.safetensors"
    save_file({"ids": np.concatenate(windows)}, str(tokens))
    for w in (0, len(table.names) - 1):  # the embedding / head and the last projection
        alone = llama["root"] / f"trial.{w}.pt2"
        config = choices[table.choices.index("l2")].config_for(True, 0)
        overrides = (Override.of(table.names[w], n_bits=2), Override.of("*", skip=True))
        compress_file(llama["ref"], alone, dataclasses.replace(config, overrides=overrides))
        kl = evaluate_text(llama["ref"], [alone], tokens=tokens).candidates[0].kl_mean
        # float32 evaluation vs trials whose products may be bfloat16 differences (within ~0.3%)
        assert table.damage[w][l2] == table.measured[w][l2] == pytest.approx(kl, rel=5e-3, abs=1e-8)
    # int8, unmeasured: its estimate times the measured / estimated ratio, interpolated in log
    # estimate between the measured choices (the nearest one's outside them)
    below = 0
    for w in range(len(table.names)):
        (x0, r0), (x1, r1) = sorted(
            (math.log(table.estimate[w][k]), math.log(table.measured[w][k] / table.estimate[w][k]))
            for k in (l4, l2)
        )
        x = math.log(table.estimate[w][int8])
        ratio = r0 if x <= x0 else r1 if x >= x1 else r0 + (r1 - r0) * (x - x0) / (x1 - x0)
        assert table.damage[w][int8] == pytest.approx(table.estimate[w][int8] * math.exp(ratio), rel=1e-9)
        below += x <= x0
    assert below == len(table.names)  # int8 is estimated below both 4- and 2-bit tables


def test_optimize_refuses_what_it_cannot_do(llama, coreopt, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("COREOPT_CACHE", str(llama["root"] / "cache"))
    base = ("optimize", llama["ref"], "--calibration", llama["calib"], "--threshold", "0")
    none = coreopt(*base, "--eval", llama["held"])
    assert none.exit_code == 2 and "exactly one budget" in none.stderr
    two = coreopt(*base, "--eval", llama["held"], "--target-bits", "4", "--max-kl", "0.1")
    assert two.exit_code == 2
    no_eval = coreopt(*base, "--target-bits", "4")
    assert no_eval.exit_code == 2 and "--eval" in no_eval.stderr
    tiny = coreopt(*base, "--eval", llama["held"], "--target-bits", "0.5", "--candidates", "int8", "--calibration-tokens", "128",
                   "--rotate", "none", "-o", tmp_path / "x.pt2")  # fmt: skip
    assert tiny.exit_code == 2 and "no plan fits" in tiny.stderr and not (tmp_path / "x.pt2").exists()


# ----- a CNN under a cosine bound ------------------------------------------------------------------


def test_a_cosine_bound_holds_on_samples_the_search_never_saw(coreopt, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from safetensors.torch import save_file

    from coreai_opt.comparison import compare_many
    from tests.conftest import SAMPLES

    monkeypatch.setenv("COREOPT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")  # the .aimodel's creation date, reproducible
    generator = torch.Generator().manual_seed(1)
    for name, count in (("calib", 8), ("val", 6), ("test", 6)):
        save_file(
            {"x": torch.randn(count, 1, 3, 32, 32, generator=generator)}, tmp_path / f"{name}.safetensors"
        )
    out, recipe = tmp_path / "cnn.mixed.aimodel", tmp_path / "cnn.recipe.json"
    result = coreopt("optimize", SAMPLES / "cnn.pt2", "--calibration", tmp_path / "calib.safetensors",
                     "--eval", tmp_path / "val.safetensors", "--min-cosine", "0.999", "--threshold", "0",
                     "--candidates", "int8,int4,lut4,lut2", "--uniform", "0", "--tune-epochs", "0", "--to", "aimodel", "-o", out,
                     "--recipe", recipe, "--json")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["met"] is True and doc["bits_per_weight"] < 8.5
    assert doc["trials"] == 0  # not a language model: the estimate alone
    steps = json.loads(recipe.read_text())["steps"]  # --rotate auto: a CNN has no residual stream to turn
    assert [next(iter(step)) for step in steps] == ["compress", "compress", "convert"][-len(steps) :]
    assert all("transform" not in step for step in steps)
    kept = [r for r in doc["rounds"] if r["ok"]]
    assert kept and min(r["measured"]["cosine"] for r in kept) >= 0.999
    assert doc["converted"]["cosine"] >= 0.999  # the .aimodel itself, on the Core AI runtime
    (unseen,) = compare_many(SAMPLES / "cnn.pt2", [out], inputs=tmp_path / "test.safetensors")
    assert unseen.worst_cosine is not None and unseen.worst_cosine >= 0.998
    again = tmp_path / "again.aimodel"
    applied = coreopt("apply", recipe, SAMPLES / "cnn.pt2", "-o", again, "--quiet")
    assert applied.exit_code == 0, applied.stderr
    assert _files(again) == _files(out)


def _files(path: Path) -> dict[str, bytes]:
    if path.is_file():
        return {"": path.read_bytes()}
    return {str(f.relative_to(path)): f.read_bytes() for f in sorted(path.rglob("*")) if f.is_file()}


def test_the_search_settings_are_one_config_that_the_cli_options_come_from(coreopt) -> None:  # type: ignore[no-untyped-def]
    """OptimizeConfig declares every search option once: its values are checked where it is made,
    it round-trips as plain data, and each CLI option is one of its fields, refused naming the flag."""
    import dataclasses

    from coreai_opt.compression import flag_names
    from coreai_opt.optimization import OptimizeConfig
    from tests.conftest import SAMPLES

    config = OptimizeConfig(candidates="keep,int8,lut4", rounds=2, to="aimodel", calibration_tokens=64)
    assert OptimizeConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    for bad, field in (({"rounds": 0}, "rounds"), ({"to": "tflite"}, "to"), ({"candidates": "nope"}, "candidates"),
                       ({"eval_tokens": 1}, "eval_tokens"), ({"threshold": True}, "threshold")):  # fmt: skip
        with pytest.raises(ConfigError) as refused:
            dataclasses.replace(config, **bad)
        assert field in refused.value.fields
    flags = flag_names(OptimizeConfig)
    shown = coreopt("optimize", "--help").stdout
    assert all(flag in shown for flag in flags.values()) and len(flags) == len(
        dataclasses.fields(OptimizeConfig)
    )
    for args, flag in ((["--rounds", "0"], "--rounds"), (["--to", "tflite"], "--to"), (["--candidates", "nope"], "--candidates")):  # fmt: skip
        done = coreopt(
            "optimize",
            SAMPLES / "mlp.pt2",
            "--calibration",
            "random",
            "--target-bits",
            "8",
            "--dry-run",
            *args,
        )
        assert done.exit_code == 2 and flag in done.stderr, (args, done.stderr)


def test_optimize_rotate_searches_the_rotated_program_and_its_recipe_starts_with_the_rotation(
    llama, coreopt, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """By default (--rotate auto) a decoder's stream is rotated, learned: the recipe's calibration
    learns it again on apply, to the same bytes."""
    import yaml

    monkeypatch.setenv("COREOPT_CACHE", str(llama["root"] / "cache"))
    out, recipe = llama["root"] / "rot" / "mixed.pt2", llama["root"] / "rot.recipe.yaml"
    result = coreopt("optimize", llama["ref"], "--calibration", llama["calib"], "--eval", llama["held"],
                     "--target-bits", "6", "--threshold", "0", "--candidates", "int8,int4", "--calibration-tokens",
                     "128", "--trial-tokens", "0", "--uniform", "0", "-o", out, "--recipe", recipe, "--json")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["met"] is True and doc["bits_per_weight"] <= 6 and doc["program"] == str(llama["ref"])
    steps = yaml.safe_load(recipe.read_text())["steps"]
    assert steps[0] == {"transform": {"config": {**RotateConfig(rotation="learned").to_dict()}}}
    assert [w["name"] for w in doc["weights"]][:1] and not list(out.parent.glob(".coreopt-rotate-*"))
    again = llama["root"] / "rot-again.pt2"
    applied = coreopt("apply", recipe, llama["ref"], "-o", again, "--quiet")
    assert applied.exit_code == 0, applied.stderr
    assert filecmp.cmp(out, again, shallow=False)


def test_a_rotation_its_check_refuses_stops_a_learned_search_and_auto_goes_on_unrotated(
    llama, monkeypatch, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    """--rotate learned stops at a refused rotation; auto says why and searches the program as it is
    (its recipe without the transform): the plan the same as --rotate none's."""
    from coreai_opt import transforms
    from coreai_opt.optimization import optimize
    from coreai_opt.transforms import TransformError

    monkeypatch.setattr(transforms, "default_tolerance", lambda state: 1e-30)  # below any rounding
    monkeypatch.setenv("COREOPT_CACHE", str(tmp_path / "cache"))
    common = {"threshold": 0, "candidates": "int8,int4", "calibration_tokens": 128, "trial_tokens": 0,
              "uniform": 0, "dry_run": True}  # fmt: skip
    with pytest.raises(TransformError, match="would change the program's outputs"):
        optimize(llama["ref"], Goal(target_bits=6), llama["calib"], rotate="learned", **common)
    said: list[str] = []
    found = optimize(llama["ref"], Goal(target_bits=6), llama["calib"], say=said.append, **common)
    assert any(line.startswith("no rotation: ") and "would change" in line for line in said), said
    assert not any(type(step).__name__ == "Transform" for step in found.recipe.steps)
    plain = optimize(llama["ref"], Goal(target_bits=6), llama["calib"], rotate="none", **common)
    assert found.report.weights == plain.report.weights and found.recipe == plain.recipe


def test_nothing_takes_the_rotated_programs_gram_matrices_again(llama, monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A learned rotation hands the rotated program's Gram matrices (its own, turned) to the cost
    table, whose estimates and trials - a sampled weight re-encoded whole by GPTQ included - take
    them from there: no pass over the calibration runs for them (the round's GPTQ takes its own
    layer by layer). The plan is the one the measured Gram matrices make."""
    from coreai_opt.calibration import _capture
    from coreai_opt.optimization import _optimize as module
    from coreai_opt.optimization import optimize

    passes: list[list[str]] = []
    one_pass = _capture.one_pass
    monkeypatch.setattr(
        _capture, "one_pass", lambda gm, names, *a: passes.append(list(names)) or one_pass(gm, names, *a)
    )
    handed: list[Any] = []  # what each cost table was given: emptied by the time it returns
    table = module.cost_table
    monkeypatch.setattr(
        module, "cost_table", lambda *a, known, **k: handed.append(known) or table(*a, known=known, **k)
    )
    common = {"threshold": 0, "candidates": "int8,int4", "calibration_tokens": 128, "trial_tokens": 64,
              "estimate_sample": 256, "uniform": 0, "force": True, "rotate": "learned"}  # fmt: skip
    monkeypatch.setenv("COREOPT_CACHE", str(tmp_path / "cache"))
    found = optimize(llama["ref"], Goal(target_bits=6), llama["calib"], llama["held"],
                     output=tmp_path / "known.pt2", **common)  # fmt: skip
    assert passes == [] and found.report.sampled > 0
    again = optimize(llama["ref"], Goal(target_bits=6), llama["calib"], llama["held"],
                     output=tmp_path / "again.pt2", **common)  # fmt: skip  # every column and trial cached
    assert again.report.weights == found.report.weights
    assert len(handed) == 2 and all(
        isinstance(h, dict) and not h for h in handed
    )  # nothing kept past its use
    from coreai_opt.transforms import _derived

    monkeypatch.setattr(_derived, "rotated_statistics", lambda *a: {})  # nothing known: all measured
    monkeypatch.setenv("COREOPT_CACHE", str(tmp_path / "cache-measured"))
    measured = optimize(llama["ref"], Goal(target_bits=6), llama["calib"], llama["held"],
                        output=tmp_path / "measured.pt2", **common)  # fmt: skip
    assert passes and set(passes[0]) >= {w["name"] for w in found.report.weights}
    choices = [(w["name"], w["choice"]) for w in found.report.weights]
    assert choices == [(w["name"], w["choice"]) for w in measured.report.weights]
    assert {c for _, c in choices} == {"int8", "int4"}
    for a, b in zip(found.report.weights, measured.report.weights, strict=True):  # up to the Grams' rounding
        assert a["estimated_damage"] == pytest.approx(b["estimated_damage"], rel=1e-3), a["name"]


def test_optimize_tunes_the_plans_tables_together_and_apply_reproduces_it(llama, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """--tune-epochs: the same plan, its indices kept, its tables tuned end to end in the palettize
    step, closer to the float model on the calibration windows than the untuned plan."""
    monkeypatch.setenv("COREOPT_CACHE", str(llama["root"] / "cache"))
    from coreai_opt.optimization import optimize
    from coreai_opt.recipes import apply_recipe

    common = {"threshold": 0, "candidates": "lut4,lut2", "calibration_tokens": 128, "trial_tokens": 0,
              "uniform": 0, "force": True, "rotate": "none"}  # fmt: skip
    plain = optimize(llama["ref"], Goal(target_bits=3), llama["calib"], llama["held"],
                     output=llama["root"] / "tune" / "plain.pt2", tune_epochs=0, **common)  # fmt: skip
    tuned = optimize(llama["ref"], Goal(target_bits=3), llama["calib"], llama["held"],
                     output=llama["root"] / "tune" / "tuned.pt2", tune_epochs=2, **common)  # fmt: skip
    (step,) = [s for s in tuned.recipe.steps if s.config.KIND == "palettize"]
    assert step.config.tune_epochs == 2
    assert [w["choice"] for w in tuned.report.weights] == [w["choice"] for w in plain.report.weights]
    from coreai_opt.io import load_pt2

    a, b = load_pt2(plain.program).state_dict, load_pt2(tuned.program).state_dict
    assert a.keys() == b.keys()
    indices = [k for k in a if k.endswith(".indices")]
    luts = [k for k in a if k.endswith(".lut")]
    assert indices and all(torch.equal(a[k], b[k]) for k in indices)
    assert luts and all(not torch.equal(a[k], b[k]) for k in luts)
    assert tuned.report.rounds[-1].measured.kl_mean < plain.report.rounds[-1].measured.kl_mean
    again = llama["root"] / "tune" / "again.pt2"
    apply_recipe(tuned.recipe, llama["ref"], again, force=True)
    assert filecmp.cmp(tuned.program, again, shallow=False)


def test_vector_tables_are_choices_whose_bits_the_writer_stores(llama, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """lut6-v2 / lut8-v4: one table of 2- / 4-long vectors a weight (GPTQ onto it), stored as such
    (on a tiny model the tables weigh a lot: 3 and 2 bits a weight plus a 0.5 / 4 KB table)."""
    monkeypatch.setenv("COREOPT_CACHE", str(llama["root"] / "cache"))
    from coreai_opt.io import load_pt2
    from coreai_opt.optimization import optimize

    found = optimize(llama["ref"], Goal(target_bits=8), llama["calib"], llama["held"], threshold=0,
                     candidates="lut6-v2,lut8-v4", calibration_tokens=256, trial_tokens=0, uniform=0, rotate="none",
                     tune_epochs=0,
                     output=llama["root"] / "vq" / "plan.pt2", force=True)  # fmt: skip
    picks = {w["choice"] for w in found.report.weights}
    assert picks <= {"lut6-v2", "lut8-v4", "keep"} and found.report.bits <= 8
    state = load_pt2(found.program).state_dict
    shapes = {tuple(v.shape[-2:]) for k, v in state.items() if k.endswith(".lut")}
    assert shapes == {(64, 2) if p == "lut6-v2" else (256, 4) for p in picks - {"keep"}} != set()


def test_an_optimize_run_stopped_while_tuning_resumes_and_writes_the_same_bytes(llama, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Issue 68's resumption: the cost table's columns and the statistics are cached, and the plan's
    tables tuned end to end checkpoint each pass; a run stopped in its tuning's last pass takes it up
    there (not from the first step) and writes the file an unbroken run writes."""
    from coreai_opt.compression.algorithms import _tuning
    from coreai_opt.optimization import optimize

    monkeypatch.setenv("COREOPT_CACHE", str(llama["root"] / "cache-resume"))
    common = {"threshold": 0, "candidates": "lut4,lut2", "calibration_tokens": 128, "trial_tokens": 0,
              "uniform": 0, "force": True, "rotate": "none", "tune_epochs": 3}  # fmt: skip
    original = _tuning.tune_tables
    seen: list[list[int]] = []

    def watched(stop_at: int | None):  # type: ignore[no-untyped-def]
        def tune(held, calibration, epochs, progress=None):  # type: ignore[no-untyped-def]
            steps: list[int] = []
            seen.append(steps)

            def step(done: int, of: int, divergence: float) -> None:
                steps.append(done)
                if done == stop_at:
                    raise KeyboardInterrupt

            return original(held, calibration, epochs, step)

        return tune

    monkeypatch.setattr(_tuning, "tune_tables", watched(None))
    unbroken = optimize(llama["ref"], Goal(target_bits=3), llama["calib"], llama["held"],
                        output=llama["root"] / "resume" / "unbroken.pt2", **common)  # fmt: skip
    per_pass = len(seen[0]) // 3
    monkeypatch.setattr(_tuning, "tune_tables", watched(2 * per_pass + 1))
    with pytest.raises(KeyboardInterrupt):
        optimize(llama["ref"], Goal(target_bits=3), llama["calib"], llama["held"],
                 output=llama["root"] / "resume" / "resumed.pt2", **common)  # fmt: skip
    assert not (llama["root"] / "resume" / "resumed.pt2").exists()
    seen.clear()
    monkeypatch.setattr(_tuning, "tune_tables", watched(None))
    resumed = optimize(llama["ref"], Goal(target_bits=3), llama["calib"], llama["held"],
                       output=llama["root"] / "resume" / "resumed.pt2", **common)  # fmt: skip
    assert (
        seen[0][0] == 2 * per_pass and seen[0][-1] == 3 * per_pass
    )  # the first tuning took up its third pass
    assert filecmp.cmp(unbroken.program, resumed.program, shallow=False)
