"""`coreopt eval --task`: multiple-choice accuracy as lm-eval-harness scores it - each choice's
log-likelihood checked against an independent scoring with transformers' own model - and the public
tasks' layouts read as lm-eval-harness words them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

import torch

from coreai_opt.errors import ConfigError
from coreai_opt.evaluation import TaskItem, evaluate_task, read_task

ITEMS = [
    {"context": "the model reads the", "choices": ["text", "word", "next word of a small"], "label": 0},
    {"context": "a small model of words predicts the next", "choices": ["word", "model reads"], "label": 0},
    {
        "context": "the next word of a small text is a word the model has  ",
        "choices": ["read", "a"],
        "label": 0,
    },
    # longer than the window of 16: cut from the left
    {
        "context": "the text feeds the model ; " * 4 + "the model",
        "choices": ["reads", "has read"],
        "label": 1,
    },
]


def _write(path: Path, items: list[dict]) -> Path:  # type: ignore[type-arg]
    path.write_text("".join(json.dumps(i) + "\n" for i in items), encoding="utf-8")
    return path


def _independent(items: list[TaskItem], window: int) -> list[list[float]]:
    """lm-eval-harness's loglikelihood of each pair with transformers' model of the same weights."""
    from tokenizers import Tokenizer

    from tests._hf import tiny_model, tokenizer_json

    model, tokenizer = tiny_model("llama"), Tokenizer.from_str(tokenizer_json())

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False).ids

    scores = []
    for item in items:
        row = []
        for context, continuation in item.pairs:
            moved = len(context) - len(context.rstrip())
            context, continuation = (
                context[: len(context) - moved],
                context[len(context) - moved :] + continuation,
            )
            start = encode(context)
            tail = encode(context + continuation)[len(start) :]
            sequence = (start + tail)[-(window + 1) :]
            with torch.no_grad():
                logits = model(torch.tensor([sequence[:-1]])).logits[0].double()
            logp = logits.log_softmax(-1)
            row.append(sum(float(logp[len(sequence) - 1 - len(tail) + k, t]) for k, t in enumerate(tail)))
        scores.append(row)
    return scores


def test_accuracy_is_an_independent_scoring_of_the_same_definition(tiny_llama, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    task = _write(tmp_path / "task.jsonl", ITEMS)
    result = evaluate_task(tiny_llama["ref"], [tiny_llama["ref"]], task=task)
    expected = _independent(read_task(task), 16)
    for score in result.scores:
        for ours, theirs in zip(score.lls, expected, strict=True):
            assert ours == pytest.approx(theirs, rel=1e-5, abs=1e-5)
    hits = [
        max(range(len(ll)), key=ll.__getitem__) == item["label"]
        for ll, item in zip(expected, ITEMS, strict=True)
    ]
    lengths = [[len(c) for c in item["choices"]] for item in ITEMS]
    normed = [max(range(len(ll)), key=lambda k, ll=ll, n=n: ll[k] / n[k]) == item["label"]
              for ll, n, item in zip(expected, lengths, ITEMS, strict=True)]  # fmt: skip
    reference, same = result.scores
    assert reference.acc == same.acc == sum(hits) / 4 and reference.acc_norm == sum(normed) / 4
    p = reference.acc
    assert reference.acc_stderr == pytest.approx((p * (1 - p) / 3) ** 0.5)


def test_public_layouts_read_as_lm_eval_harness_words_them(tmp_path: Path) -> None:
    lines = [
        {"activity_label": "Baking", "ctx_a": "She mixes the flour.", "ctx_b": "then she", "label": "1",
         "endings": ["eats it [title] Step 2.", "bakes  the cake."]},
        {"question": {"stem": "What melts?", "choices": [{"text": "ice", "label": "A"}, {"text": "rock", "label": "B"}]},
         "answerKey": "A"},
        {"question": "What floats?", "choices": {"text": ["stone", "wood"], "label": ["1", "2"]}, "answerKey": "2"},
        {"goal": "Open a jar", "sol1": "twist the lid", "sol2": "paint the lid", "label": 0},
        {"sentence": "The cup fell off the table because _ was tilted.", "option1": "the cup", "option2": "the table",
         "answer": "2"},
    ]  # fmt: skip
    items = read_task(_write(tmp_path / "mixed.jsonl", lines))
    assert items[0] == TaskItem(
        (("Baking: She mixes the flour. Then she", " eats it. Step 2."), ("Baking: She mixes the flour. Then she",
         " bakes the cake.")), 1, (16, 15))  # fmt: skip
    assert items[1].pairs == (
        ("Question: What melts?\nAnswer:", " ice"),
        ("Question: What melts?\nAnswer:", " rock"),
    )
    assert items[1].label == 0 and items[2].label == 1 and items[2].pairs[1][1] == " wood"
    assert items[3].pairs[0] == ("Question: Open a jar\nAnswer:", " twist the lid") and items[3].label == 0
    assert items[4].pairs == (("The cup fell off the table because the cup", " was tilted."),
                              ("The cup fell off the table because the table", " was tilted."))  # fmt: skip
    assert items[4].label == 1


def test_task_on_the_command_line_and_its_refusals(tiny_llama, tmp_path: Path, coreopt) -> None:  # type: ignore[no-untyped-def]
    task = _write(tmp_path / "task.jsonl", ITEMS)
    result = coreopt("eval", tiny_llama["ref"], "--task", task, "--max-items", "2", "--json")
    assert result.exit_code == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["items"] == 2 and set(out["programs"][0]) >= {
        "acc",
        "acc_norm",
        "acc_stderr",
        "acc_norm_stderr",
    }
    bad = _write(tmp_path / "bad.jsonl", [ITEMS[0], {"context": "a", "choices": ["b", "c"], "label": 5}])
    cases = [
        (["--task", bad], 1, f"{bad}: line 2: label 5 is not the index of one of the 2 choices"),
        (["--task", tmp_path / "t.csv"], 2, "give a task as JSON lines"),
        (["--task", task, "--text", tiny_llama["text"]], 2, "give --task or --text, not both"),
        (["--task", task, "--max-kl", "1"], 2, "--max-kl serves --text, not --task"),
        (["--task", task, "--stride", "4"], 2, "--stride serves --text, not --task"),
        (["--text", tiny_llama["text"], "--max-items", "3"], 2, "--max-items serves --task"),
    ]
    for args, code, said in cases:
        result = coreopt("eval", tiny_llama["ref"], *args)
        assert result.exit_code == code, (args, result.stderr)
        assert said in " ".join(result.stderr.replace("│", " ").split()), (args, result.stderr)


def _hf_logp(model, ids: list[int]) -> torch.Tensor:  # type: ignore[no-untyped-def]
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].double().log_softmax(-1)


def test_lm_eval_harness_requests_are_answered_as_its_hf_model_answers_them(tiny_llama) -> None:  # type: ignore[no-untyped-def]
    from tokenizers import Tokenizer

    from coreai_opt.evaluation import HarnessModel
    from tests._hf import tiny_model, tokenizer_json

    hf, tokenizer = tiny_model("llama"), Tokenizer.from_str(tokenizer_json())
    ours = HarnessModel(tiny_llama["ref"])
    window, start = ours.max_length, hf.config.bos_token_id
    assert window == 16

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False).ids

    # loglikelihood: the choices' sums as `--task` scores them; greedy where every token is the argmax
    context = "the model reads the"
    logp = _hf_logp(hf, encode(context))
    best = int(logp[-1].argmax())
    other = next(t for t in range(2, 50) if t != best)
    pairs = [(context, " " + tokenizer.id_to_token(best)), (context, " " + tokenizer.id_to_token(other))]
    (greedy_ll, greedy), (other_ll, not_greedy) = ours.loglikelihood(pairs)
    assert greedy and not not_greedy
    assert greedy_ll == pytest.approx(float(logp[-1, best]), abs=1e-5)
    assert other_ll == pytest.approx(float(logp[-1, other]), abs=1e-5)

    # loglikelihood_rolling: every token once, the first after the start token, windows of 16 whose
    # last one reaches back a whole window (lm-eval's docstring example: 10 tokens in windows of 4)
    text = "the text feeds the model ; " * 7
    ids, expected, a = encode(text), 0.0, 0
    tokens = [start, *ids]
    while a < len(ids):
        b = min(a + window, len(ids))
        s = max(0, b - window)
        logp = _hf_logp(hf, tokens[s:b])
        expected += sum(float(logp[j - s, tokens[j + 1]]) for j in range(a, b))
        a = b
    assert len(ids) > 2 * window and len(ids) % window
    assert ours.loglikelihood_rolling([text])[0] == pytest.approx(expected, rel=1e-5)
    ours.side.length = 4
    windows = list(ours._windows(list(range(10, 20))))
    assert [((c + x)[:-1][-4:], x) for c, x in windows] == [
        ([start, 10, 11, 12], [10, 11, 12, 13]),
        ([13, 14, 15, 16], [14, 15, 16, 17]),
        ([15, 16, 17, 18], [18, 19]),
    ]
    ours.side.length = window

    # generate_until: greedy tokens on the last window, cut before the first stop string
    made, ids = [], encode(context)
    for _ in range(12):
        token = int(_hf_logp(hf, (ids + made)[-window:])[-1].argmax())
        if token == hf.config.eos_token_id:
            break
        made.append(token)
    text = tokenizer.decode(made)
    stop = text.split()[len(text.split()) // 2]
    answers = ours.generate_until([
        (context, {"until": [stop], "max_gen_toks": 12}),
        (context, {"max_new_tokens": 3, "do_sample": False, "temperature": 0.7}),  # lm-eval's alias; greedy
    ])  # fmt: skip
    assert answers == [text[: text.find(stop)], tokenizer.decode(made[:3])]
    with pytest.raises(ConfigError, match="samples"):
        ours.generate_until([(context, {"temperature": 0.7})])
    with pytest.raises(ConfigError, match="no room for a context"):
        ours.generate_until([(context, {"max_gen_toks": 16})])
    ours.close()


def test_texts_are_cut_with_the_tokenizers_own_start_token_as_lm_eval_cuts_them(
    tiny_llama, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """A tokenizer whose template puts a start token first: every text gets it unless it begins with
    it; an empty context is the start token, or the continuation's own first token where that is it."""
    from tokenizers import Tokenizer
    from tokenizers.processors import TemplateProcessing

    from coreai_opt.evaluation._tasks import PairCoder
    from tests._hf import tokenizer_json

    tokenizer = Tokenizer.from_str(tokenizer_json())
    start = tokenizer.token_to_id("w0")
    tokenizer.post_processor = TemplateProcessing(single="w0 $A", special_tokens=[("w0", start)])
    tokenizer.save(str(tmp_path / "t.json"))
    coder = PairCoder(tmp_path / "t.json", tiny_llama["ref"], prefix=start)
    the, model, reads = (tokenizer.token_to_id(w) for w in ("the", "model", "reads"))
    assert coder.encode("the model") == [start, the, model] == coder.encode("w0 the model")
    assert coder.encode("the model", special=False) == [the, model]
    assert coder.pair("the model ", "reads") == ([start, the, model], [reads])
    assert coder.pair("", "the model") == ([start], [the, model])
    assert coder.pair("", "w0 the model") == ([start], [the, model])


def test_lm_eval_model_registers_coreopt_with_lm_eval(tiny_llama, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The glue against lm-eval's interface (a stand-in: lm-eval itself needs scikit-learn)."""
    import sys
    import types

    from coreai_opt.evaluation import HarnessModel, lm_eval_model

    registry: dict[str, type] = {}

    class LM:
        def __init__(self) -> None:
            self._rank = 0

    modules = {name: types.ModuleType(name) for name in ("lm_eval", "lm_eval.api", "lm_eval.api.model",
                                                          "lm_eval.api.registry")}  # fmt: skip
    modules["lm_eval.api.model"].LM = LM
    modules["lm_eval.api.registry"].register_model = lambda name: lambda cls: registry.setdefault(name, cls)
    modules["lm_eval.api.registry"].get_model = registry.__getitem__
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    made = lm_eval_model()
    assert registry == {"coreopt": made} and lm_eval_model() is made and issubclass(made, LM)
    lm = made(path=str(tiny_llama["ref"]), batch_size=1, device=None)
    request = types.SimpleNamespace(args=("the model reads the", " text"))
    direct = HarnessModel(tiny_llama["ref"])
    assert lm.loglikelihood([request]) == direct.loglikelihood([request.args])
    assert lm.loglikelihood_rolling(
        [types.SimpleNamespace(args=("the model",))]
    ) == direct.loglikelihood_rolling(["the model"])
    direct.close()
    lm.model.close()
