"""End-to-end tuning of look-up tables (`PalettizeConfig.tune_epochs`): the indices GPTQ chose
stay, float entries and scales move (on their stored dtype's grid), and the compressed program's divergence
from the program as given - measured here, independently, on the calibration samples - falls."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from coreai_opt.calibration import Samples, calibrate
from coreai_opt.compression import PalettizeConfig, compress_
from coreai_opt.errors import ConfigError
from coreai_opt.io import load_pt2
from tests.conftest import SAMPLES


@pytest.fixture(scope="module")
def llama(tiny_llama: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {**tiny_llama, "root": tmp_path_factory.mktemp("tuning")}


def _compressed(reference: Path, samples: Samples, config: PalettizeConfig):  # type: ignore[no-untyped-def]
    program = load_pt2(reference)
    report = compress_(program, config, calibration=calibrate(load_pt2(reference), samples, cache=False))
    return program, report


def _state(program, suffix: str) -> dict[str, torch.Tensor]:  # type: ignore[no-untyped-def]
    return {k: v for k, v in program.state_dict.items() if k.endswith(suffix)}


def _divergence(reference, candidate, samples: Samples, language: bool) -> float:  # type: ignore[no-untyped-def]
    """Mean next-token KL divergence (language) or relative squared error of the first output."""
    total, count = 0.0, 0
    ref_module, cand_module = reference.module(), candidate.module()
    with torch.no_grad():
        for _, inputs in samples.inputs(reference):
            p, q = ref_module(*inputs)[0].double(), cand_module(*inputs)[0].double()
            if language:
                logp, logq = torch.log_softmax(p, -1), torch.log_softmax(q, -1)
                total += float((logp.exp() * (logp - logq)).sum(-1).mean())
            else:
                total += float(((q - p) ** 2).mean() / (p**2).mean())
            count += 1
    return total / count


def test_tuned_tables_keep_the_indices_and_bring_the_language_model_back(llama) -> None:  # type: ignore[no-untyped-def]
    from coreai_opt.models import model_tokenizer

    samples = Samples.of(llama["text"], tokens=256, tokenizer=model_tokenizer(llama["ref"]))
    config = PalettizeConfig(
        n_bits=2, granularity="grouped", group_size=4, method="gptq", weight_num_threshold=0
    )
    plain, _ = _compressed(llama["ref"], samples, config)
    tuned, report = _compressed(llama["ref"], samples, dataclasses.replace(config, tune_epochs=3))
    assert len(report.tuning) == 3 and report.tuning[-1] < report.tuning[0]
    assert report.to_dict()["tuning"] == report.tuning
    indices, luts = _state(plain, ".indices"), _state(plain, ".lut")
    assert len(indices) == len(report.weights) == 16  # the embedding (a lookup) is tuned too
    for name, value in _state(tuned, ".indices").items():
        assert torch.equal(value, indices[name]), name
    moved = [name for name, value in _state(tuned, ".lut").items() if not torch.equal(value, luts[name])]
    assert len(moved) == len(luts)
    reference = load_pt2(llama["ref"])
    before = _divergence(reference, plain, samples, language=True)
    after = _divergence(reference, tuned, samples, language=True)
    assert after < 0.98 * before, (before, after)  # a random model's divergence is small: 0.00096 -> 0.00093
    again, _ = _compressed(llama["ref"], samples, dataclasses.replace(config, tune_epochs=3))
    for name, value in _state(again, ".lut").items():  # deterministic
        assert torch.equal(value, _state(tuned, ".lut")[name]), name


def test_tuning_brings_another_models_output_back_under_per_channel_scales() -> None:
    samples = Samples.of("random", count=8)
    config = PalettizeConfig(n_bits=2, granularity="grouped", group_size=8, method="gptq", weight_num_threshold=0,
                             enable_per_channel_scale=True)  # fmt: skip
    plain, _ = _compressed(SAMPLES / "mlp.pt2", samples, config)
    tuned, report = _compressed(SAMPLES / "mlp.pt2", samples, dataclasses.replace(config, tune_epochs=4))
    assert report.tuning and report.tuning[-1] < report.tuning[0]
    scales, luts = _state(plain, ".scale"), _state(plain, ".lut")
    assert scales and all(not torch.equal(v, scales[k]) for k, v in _state(tuned, ".scale").items())
    assert all(not torch.equal(v, luts[k]) for k, v in _state(tuned, ".lut").items())  # both move
    reference = load_pt2(SAMPLES / "mlp.pt2")
    before = _divergence(reference, plain, samples, language=False)
    after = _divergence(reference, tuned, samples, language=False)
    assert after < 0.9 * before, (before, after)


def test_tables_of_int8_entries_keep_their_entries_and_tune_their_scales() -> None:
    samples = Samples.of("random", count=8)
    config = PalettizeConfig(n_bits=2, granularity="grouped", group_size=8, method="gptq", weight_num_threshold=0,
                             lut_dtype="int8")  # fmt: skip
    plain, _ = _compressed(SAMPLES / "mlp.pt2", samples, config)
    tuned, report = _compressed(SAMPLES / "mlp.pt2", samples, dataclasses.replace(config, tune_epochs=4))
    assert report.tuning and report.tuning[-1] < report.tuning[0]
    for suffix in (".indices", ".lut"):  # int8 entries stay on their grid, as chosen
        kept = _state(plain, suffix)
        assert kept and all(torch.equal(v, kept[k]) for k, v in _state(tuned, suffix).items())
    scales = _state(plain, ".scale")
    moved = {k: v for k, v in _state(tuned, ".scale").items() if not torch.equal(v, scales[k])}
    assert len(moved) == len(scales) > 0 and all(v.dtype == scales[k].dtype for k, v in moved.items())
    reference = load_pt2(SAMPLES / "mlp.pt2")
    before = _divergence(reference, plain, samples, language=False)
    after = _divergence(reference, tuned, samples, language=False)
    assert after < 0.95 * before, (before, after)


@pytest.mark.parametrize(
    ("changes", "field"),
    [({"tune_epochs": -1}, "tune_epochs"), ({"tune_epochs": 2, "method": "kmeans"}, "tune_epochs")],
)  # fmt: skip
def test_tuning_needs_data(changes: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        PalettizeConfig(**changes)  # type: ignore[arg-type]
    assert field in caught.value.fields


def test_the_cli_tunes_and_names_the_flag_it_refuses(coreopt, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import json

    monkeypatch.setenv("COREOPT_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "m.pt2"
    result = coreopt("palettize", SAMPLES / "mlp.pt2", "--nbits", "2", "--method", "gptq", "--tune-epochs", "2",
                     "--calibration", "random", "--calibration-samples", "8", "--json", "-o", out)  # fmt: skip
    assert result.exit_code == 0, result.stderr
    tuning = json.loads(result.stdout)["report"]["tuning"]
    assert len(tuning) == 2 and tuning[1] < tuning[0]
    shown = coreopt("palettize", SAMPLES / "mlp.pt2", "--nbits", "2", "--method", "gptq", "--tune-epochs", "1",
                    "--calibration", "random", "--calibration-samples", "8", "-o", tmp_path / "t.pt2")  # fmt: skip
    assert shown.exit_code == 0 and "tuned end to end over 1 pass;" in " ".join(shown.stdout.split())
    refused = coreopt("palettize", SAMPLES / "mlp.pt2", "--tune-epochs", "2", "-o", tmp_path / "n.pt2")
    assert refused.exit_code == 2 and "--tune-epochs" in refused.stderr
    assert not (tmp_path / "n.pt2").exists()


def test_a_tuning_run_stopped_part_way_resumes_from_its_last_pass_to_the_same_bytes(
    llama, tmp_path: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """After each pass but the last, the tables, Adam's moments and the sample order's generator
    are checkpointed in the calibration cache: a run stopped in its third pass starts the rerun at
    its third pass (two passes' divergences kept), and writes the tables an unbroken run writes; a
    finished run leaves no checkpoint, and a damaged one is ignored."""
    from coreai_opt.compression.algorithms import _tuning
    from coreai_opt.models import model_tokenizer

    monkeypatch.setenv("COREOPT_CACHE", str(tmp_path / "cache"))
    samples = Samples.of(llama["text"], tokens=256, tokenizer=model_tokenizer(llama["ref"]))
    config = PalettizeConfig(n_bits=2, granularity="grouped", group_size=4, method="gptq", weight_num_threshold=0,
                             tune_epochs=3)  # fmt: skip

    original = _tuning.tune_tables

    def compressed(stop_at: int | None, seen: list[int]):  # type: ignore[no-untyped-def]
        def watched(held, calibration, epochs, progress=None):  # type: ignore[no-untyped-def]
            def step(done: int, steps: int, divergence: float) -> None:
                seen.append(done)
                if stop_at is not None and done == stop_at:
                    raise KeyboardInterrupt

            return original(held, calibration, epochs, step)

        monkeypatch.setattr(_tuning, "tune_tables", watched)
        program = load_pt2(llama["ref"])
        report = compress_(program, config, calibration=calibrate(load_pt2(llama["ref"]), samples))
        return program, report

    unbroken, report = compressed(None, seen := [])
    steps = len(seen)
    per_pass = steps // 3
    assert seen == list(range(1, steps + 1)) and not list((tmp_path / "cache" / "checkpoints").iterdir())
    with pytest.raises(KeyboardInterrupt):
        compressed(2 * per_pass + 1, [])
    (stored,) = (tmp_path / "cache" / "checkpoints").iterdir()
    resumed, again = compressed(None, seen := [])
    assert seen[0] == 2 * per_pass and seen[-1] == steps  # it began where the checkpoint was
    assert again.tuning == report.tuning
    for suffix in (".lut", ".indices"):
        for name, value in _state(unbroken, suffix).items():
            assert torch.equal(value, _state(resumed, suffix)[name]), name
    assert not stored.exists()
    with pytest.raises(KeyboardInterrupt):
        compressed(2 * per_pass + 1, [])
    (stored,) = (tmp_path / "cache" / "checkpoints").iterdir()
    data = bytearray(stored.read_bytes())
    data[-3] ^= 0x10  # one bit of a tensor flipped: the digest in its header says so, the run starts afresh
    stored.write_bytes(bytes(data))
    fresh, _ = compressed(None, seen := [])
    assert seen[0] == 1
    for name, value in _state(unbroken, ".lut").items():
        assert torch.equal(value, _state(fresh, ".lut")[name]), name


def test_the_divergence_gives_gradients_to_the_given_weights_only(llama) -> None:  # type: ignore[no-untyped-def]
    """What tuning backpropagates reaches the weights it passes in, and none of the program's own
    parameters (a file's keep `requires_grad`): no gradient gathers on a norm step after step."""
    from coreai_opt.models import model_tokenizer

    samples = Samples.of(llama["text"], tokens=64, tokenizer=model_tokenizer(llama["ref"]))
    calibration = calibrate(load_pt2(llama["ref"]), samples, cache=False)
    own = dict(calibration.gm.named_parameters())
    assert all(p.requires_grad for p in own.values())  # as the file keeps them
    names = [n for n, p in own.items() if p.dim() == 2][:2]
    leaves = {n: own[n].detach().clone().requires_grad_() for n in names}
    loss = calibration.divergence(leaves, 0)
    assert float(loss.detach()) == 0.0  # the weights as they are: no divergence yet
    loss.backward()
    assert all(leaves[n].grad is not None for n in names)
    assert [n for n, p in own.items() if p.grad is not None] == []


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_calibration_program_computes_with_the_tuned_leaves_themselves(
    llama, monkeypatch, device: str
) -> None:  # type: ignore[no-untyped-def]
    """Each tuned weight is held once: the leaf every step decodes into is the weight the
    calibration program holds (the same storage), not a second decoded copy beside it - on a GPU
    too, where the leaves (and their gradients) live on the GPU, not in the host's memory."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from coreai_opt.compression.algorithms import _tuning
    from coreai_opt.models import model_tokenizer

    samples = Samples.of(llama["text"], tokens=128, tokenizer=model_tokenizer(llama["ref"]))
    config = PalettizeConfig(n_bits=2, granularity="grouped", group_size=4, method="gptq", weight_num_threshold=0,
                             tune_epochs=1)  # fmt: skip
    checked: list[str] = []
    step = _tuning._step_gradients

    def watched(tables, calibration, batch, leaves):  # type: ignore[no-untyped-def]
        loss = step(tables, calibration, batch, leaves)
        held = dict(calibration.gm.named_parameters(remove_duplicate=False))
        for t in tables:
            name = t.site.name
            if name in held:
                assert held[name].data_ptr() == leaves[name].data_ptr(), name
                assert leaves[name].device.type == device and t.indices.device.type == "cpu", name
                checked.append(name)
        return loss

    monkeypatch.setattr(_tuning, "_step_gradients", watched)
    program = load_pt2(llama["ref"])
    calibration = calibrate(load_pt2(llama["ref"]), samples, cache=False, device=device)
    report = compress_(program, config, calibration=calibration)
    assert report.tuning and checked  # a tuned run, its leaves found in the program


def test_the_divergence_lets_the_weights_as_given_go_between_samples(llama, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """After each sample's divergence the replaced weights as given (read by its reference pass
    only) are released from the resident set (`release_clean_mapped`); the next sample reads them
    again, to the same value."""
    from coreai_opt import _memory
    from coreai_opt.models import model_tokenizer

    samples = Samples.of(llama["text"], tokens=64, tokenizer=model_tokenizer(llama["ref"]))
    calibration = calibrate(load_pt2(llama["ref"]), samples, cache=False)
    names = [n for n, p in calibration.gm.named_parameters() if p.dim() == 2][:2]
    for name in names:
        calibration.replace(name, calibration.state[name] * 0.5, keep_original=True)
    released: list[list[int]] = []
    release = _memory.release_clean_mapped
    monkeypatch.setattr(_memory, "RELEASE_EVERY", 1)
    monkeypatch.setattr(_memory, "release_clean_mapped", lambda a: released.append(a) or release(a))
    leaves = {n: calibration.state[n].detach().clone().requires_grad_() for n in names}
    first = float(calibration.divergence(leaves, 0).detach())
    assert released == [[calibration.state[n].data_ptr() for n in names]]
    assert (
        float(calibration.divergence(leaves, 0).detach()) == first == 0.0
    )  # the weights as given, read again


def test_a_step_takes_its_batchs_references_before_any_gradient_is_held(llama, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The weights as given are read in for the reference passes only: a step takes its whole
    batch's references at once, first, while no leaf holds a gradient; a divergence given its
    reference is the one that takes it, to the bit."""
    from coreai_opt.compression.algorithms import _tuning
    from coreai_opt.models import model_tokenizer

    samples = Samples.of(llama["text"], tokens=128, tokenizer=model_tokenizer(llama["ref"]))
    calibration = calibrate(load_pt2(llama["ref"]), samples, cache=False)
    names = [n for n, p in calibration.gm.named_parameters() if p.dim() == 2][:2]
    for name in names:
        calibration.replace(name, calibration.state[name] * 0.5, keep_original=True)
    leaves = {n: (calibration.state[n] * 0.5).requires_grad_() for n in names}
    (reference,) = calibration.references([1])
    given, taken = calibration.divergence(leaves, 1, reference), calibration.divergence(leaves, 1)
    assert float(given.detach()) == float(taken.detach()) > 0
    config = PalettizeConfig(n_bits=2, granularity="grouped", group_size=4, method="gptq", weight_num_threshold=0,
                             tune_epochs=1)  # fmt: skip
    seen: list[tuple[list[int], list[str]]] = []
    held: dict[str, torch.Tensor] = {}
    step, references = _tuning._step_gradients, type(calibration).references

    def stepping(tables, calibration, batch, leaves):  # type: ignore[no-untyped-def]
        held.update(leaves)
        return step(tables, calibration, batch, leaves)

    def watched(self, batch):  # type: ignore[no-untyped-def]
        seen.append((list(batch), [n for n, leaf in held.items() if leaf.grad is not None]))
        return references(self, batch)

    monkeypatch.setattr(_tuning, "_step_gradients", stepping)
    monkeypatch.setattr(type(calibration), "references", watched)
    tuned = calibrate(load_pt2(llama["ref"]), samples, cache=False)
    report = compress_(load_pt2(llama["ref"]), config, calibration=tuned)
    steps = -(-tuned.sample_count // _tuning._ACCUMULATE)
    assert report.tuning and len(seen) == steps > 1
    assert [len(batch) for batch, _ in seen[:-1]] == [_tuning._ACCUMULATE] * (steps - 1)
    assert all(grads == [] for _, grads in seen)  # no gradient held while the weights as given are in


def test_a_tuned_pass_hands_back_the_pages_of_every_weight_it_read(llama, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A pass that tunes keeps each weight as given for the tuning's reference, so the weights it
    reads from the program's mapped file would stay resident to its end: their addresses are
    handed back (`release_clean_mapped`) as it goes, every one of them by the end; a pass that
    does not tune lets each go as before and hands back none this way."""
    from coreai_opt import _memory
    from coreai_opt.models import model_tokenizer

    samples = Samples.of(llama["text"], tokens=64, tokenizer=model_tokenizer(llama["ref"]))
    released: list[int] = []
    hand_backs: list[list[int]] = []
    monkeypatch.setattr(_memory, "RELEASE_EVERY", 1)  # a hand-back before every weight read
    monkeypatch.setattr(_memory, "release_clean_mapped", lambda a: hand_backs.append(a) or released.extend(a))
    for epochs in (0, 1):
        released.clear()
        hand_backs.clear()
        config = PalettizeConfig(n_bits=2, granularity="grouped", group_size=4, method="gptq",
                                 weight_num_threshold=0, tune_epochs=epochs)  # fmt: skip
        program = load_pt2(llama["ref"])
        read = {n: t.data_ptr() for n, t in program.state_dict.items() if t.dim() == 2}
        report = compress_(
            program, config, calibration=calibrate(load_pt2(llama["ref"]), samples, cache=False)
        )
        tuned = {w.name for w in report.weights}
        assert len(tuned) == 16
        if epochs:
            assert {read[n] for n in tuned} <= set(released)
            ours = [a for a in hand_backs if set(a) & set(read.values())]  # not the calibration's own
            assert len(ours) >= 2 * len(tuned)  # as it went: each weight is read twice (encoded, reported)
        else:
            assert not set(read.values()) & set(released)


def test_held_codes_wait_for_the_tuning_as_file_pages_and_write_the_same_program(
    llama, tmp_path: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """Within a spill (`apply_recipe`'s), each weight held for the tuning has its indices parked
    there - file pages, not heap - and the tuning hands their pages back as it decodes, every
    step; the program written is bit for bit the one made with nothing parked."""
    from coreai_opt import _memory
    from coreai_opt.compression.algorithms import _tuning
    from coreai_opt.models import model_tokenizer

    samples = Samples.of(llama["text"], tokens=64, tokenizer=model_tokenizer(llama["ref"]))
    config = PalettizeConfig(n_bits=2, granularity="grouped", group_size=4, method="gptq",
                             weight_num_threshold=0, tune_epochs=1)  # fmt: skip
    held_in_files: list[bool] = []
    original = _tuning.tune_tables

    def watched(held, calibration, epochs, progress=None):  # type: ignore[no-untyped-def]
        mapped = [(low, high) for low, high, _, _ in _memory._file_mappings()]
        for _, encoding in held:
            at = encoding.form.indices.values.ctypes.data
            held_in_files.append(any(low <= at < high for low, high in mapped))
        return original(held, calibration, epochs, progress)

    monkeypatch.setattr(_tuning, "tune_tables", watched)
    monkeypatch.setattr(_memory, "PARK_FROM", 1)
    handed: list[int] = []
    release = _memory.release_clean_mapped
    monkeypatch.setattr(_memory, "release_clean_mapped", lambda a: handed.extend(a) or release(a))
    with _memory.spilling(tmp_path):
        parked, _ = _compressed(llama["ref"], samples, config)
    assert len(held_in_files) == 16 and all(held_in_files)
    indices = {t.data_ptr() for k, t in parked.state_dict.items() if k.endswith(".indices")}
    assert len(indices) == 16 and indices <= set(handed)  # the codes written are the parked ones
    held_in_files.clear()
    given, _ = _compressed(llama["ref"], samples, config)
    assert len(held_in_files) == 16 and not any(held_in_files)
    assert parked.state_dict.keys() == given.state_dict.keys()
    for name, value in given.state_dict.items():
        assert torch.equal(parked.state_dict[name], value), name
