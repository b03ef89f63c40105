"""Stateful decoders (`export --kv-cache`) and `generate`: transformers' own greedy tokens, the
decode path's logits equal to the window program's, sampling by seed, and the one-line refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from coreai_opt.generation import GenerateConfig, StatefulDecoder, generate
from coreai_opt.io import load_pt2
from tests.conftest import made_once

CONTEXT = 16  # the tiny_llama fixture's window length: its window program scores the same windows
PROMPT = [5, 7, 9, 11]


@pytest.fixture(scope="module")
def decoders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny LLaMA and GPT-2 (learned positions) exported with a cache of CONTEXT positions, and
    the LLaMA's folder (`folder`)."""
    from coreai_opt.models import export_file
    from tests._hf import hf_folder

    def make(root: Path) -> dict[str, Path]:
        folders = {family: hf_folder(family, root) for family in ("llama", "gpt2")}
        _give_a_chat_template(folders["llama"])
        made = {family: export_file(folder, root / f"{family}.kv.pt2", context=CONTEXT).output
                for family, folder in folders.items()}  # fmt: skip
        return made | {"folder": root / "llama"}

    return made_once(tmp_path_factory, "decoders", make)


@pytest.fixture(scope="module")
def coded(decoders: dict[str, Path], tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """The tiny LLaMA exported with a cache of each code dtype, once a session (an export of it
    takes 3-5 CPU-s); tests read these files and write elsewhere."""
    from coreai_opt.models import export_file

    def export(dtype: str) -> Path:
        def make(root: Path) -> dict[str, Path]:
            return {"model": export_file(decoders["folder"], root / f"{dtype}.pt2", context=CONTEXT,
                                         kv_cache_dtype=dtype).output}  # fmt: skip

        return made_once(tmp_path_factory, f"coded-{dtype}", make)["model"]

    return export


# ChatML templates of our own, in the three ways sources write them: a default system message in
# a literal with newlines, one with its newlines escaped (as a JSON file's text reads once parsed),
# none; and a template of another layout.
SMOL_LIKE = (
    "{% for m in messages %}{% if loop.first and m['role'] != 'system' %}{{ '<|im_start|>system\nYou are "
    "a careful assistant.<|im_end|>\n' }}{% endif %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + "
    "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
ESCAPED = (
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + "
    "'<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou are a tiny test model.<|im_end|>\\n' }}"
    "{%- endif %}{%- for m in messages %}{%- if m['role'] != 'system' %}{{- '<|im_start|>' + m['role'] + "
    "'\\n' + m['content'] + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
NO_SYSTEM = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
INST = "{{ bos_token }}{% for m in messages %}{{ '[INST] ' + m['content'] + ' [/INST]' }}{% endfor %}"
SPECIALS = ("<|im_start|>", "<|im_end|>")


def _give_a_chat_template(folder: Path) -> None:
    """SMOL_LIKE in the folder's tokenizer_config.json, and ChatML's two special tokens in its
    tokenizer (in place of its last two filler words, so the ids stay inside the vocabulary)."""
    from tokenizers import Tokenizer

    data = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = data["model"]["vocab"]
    for special, (word, index) in zip(
        SPECIALS, sorted(vocab.items(), key=lambda item: item[1])[-2:], strict=True
    ):
        del vocab[word]
        vocab[special] = index
    tokenizer = Tokenizer.from_str(json.dumps(data))
    tokenizer.add_special_tokens(list(SPECIALS))
    (folder / "tokenizer.json").write_text(tokenizer.to_str(), encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": SMOL_LIKE}), encoding="utf-8")


@pytest.mark.parametrize("template", [SMOL_LIKE, ESCAPED, NO_SYSTEM])
def test_a_chatml_template_renders_as_transformers_renders_it(template: str) -> None:
    """Our rendering of the recognised format against transformers' run of the template itself."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    from coreai_opt.models import chat_format

    oracle = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel({"[UNK]": 0}, unk_token="[UNK]")))
    oracle.chat_template = template
    chat = chat_format(template)
    assert chat is not None and chat.style == "chatml"
    user = [{"role": "user", "content": "Name a river.\nOne, please."}]
    for system in (None, "Answer in French."):
        said = [{"role": "system", "content": system}] if system is not None else []
        theirs = oracle.apply_chat_template(said + user, tokenize=False, add_generation_prompt=True)
        assert chat.render(user[0]["content"], system) == theirs
    assert chat_format(INST) is None and chat_format(None) is None


def _transformers_greedy(family: str, new: int) -> list[int]:
    from tests._hf import tiny_model

    with torch.no_grad():
        out = tiny_model(family).generate(
            torch.tensor([PROMPT]), max_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0
        )
    return out[0, len(PROMPT) :].tolist()


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_greedy_tokens_are_transformers_own(decoders: dict[str, Path], family: str) -> None:
    decoder = StatefulDecoder(load_pt2(decoders[family]))
    made = generate(decoder, PROMPT, GenerateConfig(max_new_tokens=12, ignore_eos=True))
    assert made.tokens == _transformers_greedy(family, 12)
    assert made.stopped == "length" and made.prompt_tokens == PROMPT
    again = generate(decoder, PROMPT, GenerateConfig(max_new_tokens=12, ignore_eos=True))
    assert again.tokens == made.tokens  # the cache is reset for every sequence


def test_the_decode_path_scores_as_the_window_program_does(decoders: dict[str, Path], tiny_llama) -> None:  # type: ignore[no-untyped-def]
    """The same 16 tokens through the window program, one prefill call, and 16 decode calls."""
    from coreai_opt._export import runnable

    ids = list(range(3, 19))
    with torch.no_grad():
        window = runnable(load_pt2(tiny_llama["ref"]))(torch.tensor([ids]))[0]
    decoder = StatefulDecoder(load_pt2(decoders["llama"]))
    decoder.reset()
    prefill = decoder(ids, 0)
    decoder.reset()
    steps = torch.cat([decoder([t], i) for i, t in enumerate(ids)])
    torch.testing.assert_close(prefill, window, rtol=0, atol=2e-6)
    torch.testing.assert_close(steps, window, rtol=0, atol=2e-6)
    logp = window.log_softmax(-1)[:-1].gather(1, torch.tensor(ids[1:])[:, None])
    decoded = steps.log_softmax(-1)[:-1].gather(1, torch.tensor(ids[1:])[:, None])
    assert abs(float(decoded.mean() / logp.mean()) - 1) < 1e-6  # perplexity within 1e-6 relative


def test_a_stateful_program_parses_each_size_expression_once_to_what_torch_makes(
    decoders: dict[str, Path], monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """The chunk length is symbolic, so model.json repeats a few size expressions hundreds of
    times: each distinct one reaches sympy once, and every node's shape is what torch's own
    parsing of every string makes."""
    import json
    import zipfile

    import sympy
    from torch._export.serde.serialize import GraphModuleDeserializer

    import coreai_opt.io._known as known

    monkeypatch.setattr(known, "_KNOWN", type(known._KNOWN)())  # read, not copied from a read before
    with zipfile.ZipFile(decoders["llama"]) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith("models/model.json")]
        text = archive.read(name).decode()
    written = [v for k, v in _items(json.loads(text)) if k == "expr_str"]
    assert len(written) > 4 * len(set(written)) > 0
    parsed: list[str] = []
    sympify = sympy.sympify
    monkeypatch.setattr(  # texts only: sympy objects pass through sympify too
        sympy, "sympify", lambda s, *a, **k: (isinstance(s, str) and parsed.append(s)) or sympify(s, *a, **k)
    )
    shapes = [str(n.meta.get("val")) for n in load_pt2(decoders["llama"]).graph.nodes]
    assert [k.template for k in known._KNOWN.values()] == [None]  # symbolic sizes: the verdict only
    assert sorted(set(parsed)) == sorted(parsed) and set(parsed) <= set(written) and parsed
    once = GraphModuleDeserializer._parse_sym_expr
    monkeypatch.setattr(GraphModuleDeserializer, "_parse_sym_expr", once.__wrapped__)
    parsed.clear()
    known._KNOWN.clear()
    assert shapes == [str(n.meta.get("val")) for n in load_pt2(decoders["llama"]).graph.nodes]
    assert len(parsed) >= len(written)  # torch's own way: every string, every time


def _items(document: object):  # type: ignore[no-untyped-def]
    """Every (key, value) pair of a parsed JSON document, depth first."""
    stack = [document]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            yield from item.items()
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def test_the_state_is_one_key_and_value_buffer_a_layer_of_kv_heads(decoders: dict[str, Path]) -> None:
    program = load_pt2(decoders["llama"])
    state = {n: program.state_dict[n] for n in program.graph_signature.buffers_to_mutate.values()}
    assert sorted(state) == ["key_cache_0", "key_cache_1", "value_cache_0", "value_cache_1"]
    assert {tuple(t.shape) for t in state.values()} == {(1, 2, CONTEXT, 8)}  # 2 kv-heads of 4 heads
    assert StatefulDecoder(program).state_bytes == 4 * 2 * CONTEXT * 8 * 4


def test_sampling_follows_its_seed_and_top_k_one_is_greedy(decoders: dict[str, Path]) -> None:
    decoder = StatefulDecoder(load_pt2(decoders["llama"]))

    def tokens(**options: object) -> list[int]:
        return generate(decoder, PROMPT, GenerateConfig(max_new_tokens=12, ignore_eos=True, **options)).tokens  # type: ignore[arg-type]

    sampled = tokens(temperature=1.5, seed=1)
    assert sampled == tokens(temperature=1.5, seed=1)
    assert sampled != tokens(temperature=1.5, seed=2)
    assert tokens(temperature=1.5, top_k=1, seed=3) == tokens()
    assert tokens(temperature=1.5, top_p=1e-6, seed=4) == tokens()


def test_generation_stops_at_eos_and_at_a_full_cache(decoders: dict[str, Path]) -> None:
    decoder = StatefulDecoder(load_pt2(decoders["llama"]))
    greedy = generate(decoder, PROMPT, GenerateConfig(max_new_tokens=40, ignore_eos=True))
    assert greedy.stopped == "context" and len(greedy.tokens) == CONTEXT - len(PROMPT) + 1
    stop = greedy.tokens[3]
    ended = generate(decoder, PROMPT, GenerateConfig(max_new_tokens=40), eos=[stop])
    assert ended.stopped == "eos" and ended.tokens == greedy.tokens[: greedy.tokens.index(stop) + 1]


def test_the_audit_bounds_a_count_by_the_declared_range(decoders: dict[str, Path]) -> None:
    """`arange(T)` on the dynamic token count is bounded by its symbol's declared maximum."""
    import _hostile as h

    from coreai_opt.io._program_audit import program_problem

    _, members = h._pt2_members(decoders["llama"])
    document = json.loads(members[h.MODEL_JSON])
    (symbol,) = document["range_constraints"]
    assert document["range_constraints"][symbol]["max_val"] == CONTEXT
    assert program_problem(document, [1 << 20]) is None
    for bounds, said in (({"min_val": 1, "max_val": 1 << 40}, "asks for more than"),
                         ({"min_val": 1, "max_val": None}, "does not bound"),
                         ({"min_val": 9, "max_val": 2}, "is empty"),
                         ({"min_val": 1, "max_val": "24"}, "not made of integers")):  # fmt: skip
        document["range_constraints"][symbol] = bounds
        assert said in program_problem(document, [1 << 20])  # type: ignore[operator]
    document["range_constraints"] = {"__import__('os')": {"min_val": 1, "max_val": 2}}
    assert "not a shape expression" in program_problem(document, [1 << 20])  # type: ignore[operator]


def test_generate_on_the_command_line(decoders: dict[str, Path], coreopt) -> None:  # type: ignore[no-untyped-def]
    model = decoders["llama"]
    result = coreopt("generate", model, "--prompt", "the model reads", "--max-new-tokens", "6", "--ignore-eos",
                     "--json")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    out = json.loads(result.stdout)
    assert set(out) >= {"prompt_tokens", "tokens", "text", "prefill_tokens_per_s", "decode_tokens_per_s"}
    decoder = StatefulDecoder(load_pt2(model))
    assert out["tokens"] == generate(decoder, out["prompt_tokens"], GenerateConfig(max_new_tokens=6,
                                                                                  ignore_eos=True)).tokens  # fmt: skip
    assert len(out["tokens"]) == 6 and out["state_bytes"] == decoder.state_bytes
    shown = coreopt("generate", model, "--prompt", "the model reads", "--max-new-tokens", "3")
    assert shown.exit_code == 0 and shown.stdout.startswith("the model reads")
    assert "tokens/s" in shown.stderr


def test_generate_lays_a_chat_prompt_out_in_the_model_s_chat_format(
    decoders: dict[str, Path], coreopt
) -> None:  # type: ignore[no-untyped-def]
    """The source's template became a chat format in the model's description; --chat writes the
    prompt as one user turn (special tokens as tokens) and stops at the end of a turn too."""
    from coreai_opt.generation import open_decoder
    from coreai_opt.models import model_info, read_tokenizer, tokenizer_path

    model = decoders["llama"]
    chat = model_info(model).chat
    assert chat is not None and chat.system == "You are a careful assistant."
    result = coreopt("generate", model, "--chat", "--system", "be brief", "--prompt", "the model reads",
                     "--max-new-tokens", "2", "--json")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    tokenizer = read_tokenizer(tokenizer_path(model))
    ids = tokenizer.encode(chat.render("the model reads", "be brief"), add_special_tokens=False).ids
    start, end = (tokenizer.token_to_id(t) for t in SPECIALS)
    assert json.loads(result.stdout)["prompt_tokens"] == ids and ids.count(start) == 3 and ids.count(end) == 2
    with open_decoder(model) as opened:
        assert opened.stop_ids(chat=True) == (*opened.eos, end) and opened.stop_ids() == opened.eos


def test_a_gguf_chat_template_is_read_as_text_and_a_bad_chat_format_refused(tmp_path: Path) -> None:
    from coreai_opt.io import ModelFileError
    from coreai_opt.models import ModelInfo, chat_format, open_source
    from tests._hf import llama_gguf_variant

    source = open_source(llama_gguf_variant(tmp_path / "chat.gguf", chat_template=ESCAPED))
    assert source.chat_template == ESCAPED
    assert chat_format(source.chat_template).system == "You are a tiny test model."
    good = {"format": "coreopt-model", "version": 1, "kind": "causal-lm", "model_type": "llama", "batch": 1,
            "seq_len": 8, "chat": {"style": "chatml", "system": None}}  # fmt: skip
    assert ModelInfo.from_dict(good, tmp_path / "m.json").chat == chat_format(NO_SYSTEM)
    for chat in (
        {"style": "jinja", "system": None},
        {"style": "chatml"},
        {"style": "chatml", "system": 3},
        "chatml",
    ):
        with pytest.raises(ModelFileError, match="malformed chat format"):
            ModelInfo.from_dict(good | {"chat": chat}, tmp_path / "m.json")


def test_generate_refuses_in_one_line(decoders: dict[str, Path], tiny_llama, tmp_path: Path, coreopt) -> None:  # type: ignore[no-untyped-def]
    model = decoders["llama"]
    (tmp_path / "m.aimodel").mkdir()
    cases = [
        (["generate", tiny_llama["ref"], "--prompt", "the"], 1, "is not a stateful decoder"),
        (["generate", model], 2, "give --prompt or --prompt-file"),
        (["generate", model, "--prompt", "a", "--prompt-file", tiny_llama["text"]], 2, "give --prompt or"),
        (["generate", model, "--prompt", "the " * (CONTEXT + 1)], 1, f"context holds 1 to {CONTEXT}"),
        (["generate", model, "--prompt", "a", "--temperature", "-1"], 2, "--temperature"),
        (["generate", decoders["gpt2"], "--chat", "--prompt", "a"], 1, "has no chat format coreopt renders"),
        (["generate", model, "--system", "a", "--prompt", "a"], 2, "give --chat too"),
        (["generate", tmp_path / "none.pt2", "--prompt", "a"], 1, "no such file"),
        (["generate", tmp_path / "m.aimodel", "--prompt", "a"], 1, "asset has no main.mlirb"),
        (["generate", tiny_llama["ref"].with_suffix(".onnx"), "--prompt", "a"], 1, "no such file"),
        (["export", tiny_llama["ref"], "-o", tmp_path / "x.pt2", "--context", "8"], 2, "give --kv-cache too"),
    ]
    for args, code, said in cases:
        result = coreopt(*args)
        assert result.exit_code == code, (args, result.stderr)
        if code == 1:  # bad input: one line
            assert result.stderr.count("\n") == 1 and said in result.stderr, (args, result.stderr)
        else:  # a usage error: click's panel, the message wrapped inside it
            assert said in " ".join(result.stderr.replace("│", " ").split()), (args, result.stderr)


def test_eval_and_calibration_read_a_stateful_decoder_as_its_window_program(
    decoders: dict[str, Path], tiny_llama, tmp_path: Path, coreopt
) -> None:  # type: ignore[no-untyped-def]
    """Windows of the context written from position 0: eval scores the decode path as the window
    program (KL 0), and GPTQ calibrated on the same text makes the same codes."""
    from coreai_opt.evaluation import evaluate_text

    text, window = tiny_llama["text"], tiny_llama["ref"]  # the same model, windows of CONTEXT tokens
    scored = evaluate_text(window, [decoders["llama"]], text=text, max_tokens=8 * CONTEXT)
    (candidate,) = scored.candidates
    assert candidate.perplexity == pytest.approx(scored.reference.perplexity, rel=1e-6)
    assert candidate.kl_mean < 1e-9 and candidate.top1 == 1.0
    outputs = {}
    for name, program in (("w", window), ("kv", decoders["llama"])):
        outputs[name] = tmp_path / f"{name}.gptq.pt2"
        done = coreopt("quantize", program, "-o", outputs[name], "--dtype", "int4", "--method", "gptq",
                       "--calibration", text, "-q")  # fmt: skip
        assert done.exit_code == 0, done.stderr
    window_state, stateful_state = (load_pt2(outputs[n]).state_dict for n in ("w", "kv"))
    codes = [n for n in window_state if window_state[n].dtype in (torch.int8, torch.uint8)]
    assert codes and all(torch.equal(window_state[n], stateful_state[n]) for n in codes)


def test_a_cast_decoder_keeps_its_cache_in_the_activations_dtype(
    decoders: dict[str, Path], tmp_path: Path, coreopt
) -> None:  # type: ignore[no-untyped-def]
    half = tmp_path / "half.pt2"
    done = coreopt("cast", decoders["llama"], "-o", half, "-q")
    assert done.exit_code == 0, done.stderr
    program = load_pt2(half)
    assert {program.state_dict[n].dtype for n in program.graph_signature.buffers_to_mutate.values()} == {
        torch.float16
    }
    full, cast = StatefulDecoder(load_pt2(decoders["llama"])), StatefulDecoder(program)
    assert cast.state_bytes * 2 == full.state_bytes
    with torch.no_grad():
        torch.testing.assert_close(cast(PROMPT, 0).float(), full(PROMPT, 0), rtol=0, atol=2e-2)


def test_the_converted_decoder_runs_on_the_core_ai_runtime(
    decoders: dict[str, Path], tmp_path: Path, coreopt
) -> None:  # type: ignore[no-untyped-def]
    """`convert` makes a one-token "main" and a chunk-wide "prefill" over one state; `generate` and
    `eval` run it in the runtime's worker: the .pt2's tokens, and its logits window by window."""
    from coreai_opt.evaluation import evaluate_text
    from coreai_opt.generation import open_decoder
    from tests._hf import TEXT

    asset = tmp_path / "llama.kv.aimodel"
    done = coreopt("convert", decoders["llama"], "-o", asset, "-q")
    assert done.exit_code == 0, done.stderr
    config = GenerateConfig(max_new_tokens=12, ignore_eos=True)
    with open_decoder(asset) as opened:
        assert (opened.decoder.context, opened.decoder.chunk) == (CONTEXT, CONTEXT)
        assert opened.decoder.state_bytes == StatefulDecoder(load_pt2(decoders["llama"])).state_bytes
        on_runtime = generate(opened.decoder, PROMPT, config).tokens
    assert on_runtime == generate(StatefulDecoder(load_pt2(decoders["llama"])), PROMPT, config).tokens
    text = tmp_path / "text.txt"
    text.write_text(TEXT, encoding="utf-8")
    scored = evaluate_text(decoders["llama"], [asset], text=text, max_tokens=4 * CONTEXT)  # prefill calls
    assert scored.candidates[0].kl_mean < 1e-6 and scored.candidates[0].top1 == 1.0
    assert scored.candidates[0].perplexity == pytest.approx(scored.reference.perplexity, rel=1e-5)


def test_float8_codes_are_a_cast_to_float8_e4m3fn_bit_for_bit() -> None:
    """Every code's value, and the codes of every code's value, midpoint (ties to even) and the
    float next to each midpoint, against torch's own cast; only -0 is written as +0 (same value)."""
    from coreai_opt.models._stateful import _fp8_codes, _fp8_magnitudes, _fp8_values

    every = torch.arange(256, dtype=torch.uint8)
    cast = every.view(torch.float8_e4m3fn).float()
    finite = ~cast.isnan()
    assert torch.equal(_fp8_values(every.float())[finite], cast[finite])
    values = torch.tensor(_fp8_magnitudes())
    middles = (values[:-1] + values[1:]) / 2
    near = [torch.nextafter(middles, torch.full_like(middles, bound)) for bound in (0.0, 1e3)]
    x = torch.cat(
        [values[1:], middles, *near, torch.randn(4096, generator=torch.Generator().manual_seed(0)) * 40]
    )
    x = torch.cat([x, -x]).clamp(-448, 448)
    assert torch.equal(_fp8_codes(x).to(torch.uint8), x.to(torch.float8_e4m3fn).view(torch.uint8))


@pytest.mark.parametrize("dtype", ["int8", "fp8", "int4"])
def test_a_quantized_cache_holds_codes_and_float16_parameters_per_token_and_head(
    decoders: dict[str, Path], coded, dtype: str
) -> None:  # fmt: skip
    """int8: symmetric codes of each written token's head vector and its largest magnitude; fp8: its
    float8 e4m3fn cast over that magnitude / 448; int4:
    codes in [0, 15] between the vector's least and largest (the tiny model's head dim of 8 is one
    run, too short to rotate), two a byte. Decoded where attention reads them: logits stay near
    the float cache's."""
    path = coded(dtype)
    decoder, full = StatefulDecoder(load_pt2(path)), StatefulDecoder(load_pt2(decoders["llama"]))
    per_vector = 8 + 2 if dtype in ("int8", "fp8") else 4 + 4  # bytes of codes + float16 parameters
    assert decoder.state_bytes == 4 * 2 * CONTEXT * per_vector
    ids = list(range(3, 3 + CONTEXT))
    decoder.reset()
    with torch.no_grad():
        logits, reference = decoder(ids, 0), full(ids, 0)
    keys = full.module.key_cache_0  # the float cache of layer 0 after the same tokens
    codes, parameters = decoder.module.key_cache_0, decoder.module.key_scale_0
    assert parameters.dtype == torch.float16
    if dtype == "int8":
        scale = (keys.abs().amax(-1, keepdim=True) / 127).half()
        assert torch.equal(parameters, scale)
        expected = torch.round(keys / scale.float()).clamp(-127, 127)
        assert torch.equal(codes.to(torch.int16), expected.to(torch.int16))
    elif dtype == "fp8":  # a cast to float8 e4m3fn of each vector over its largest magnitude / 448
        scale = (keys.abs().amax(-1, keepdim=True) / 448).half()
        assert torch.equal(parameters, scale)
        expected = (keys / scale.float()).clamp(-448, 448).to(torch.float8_e4m3fn)
        assert torch.equal(codes.view(torch.float8_e4m3fn).float(), expected.float())
    else:  # of the ranges tried for each run, the codes that lose least: no worse than the run's own
        codes = torch.stack([codes % 16, codes // 16], -1).flatten(-2).float()
        scale, least = parameters.float().unbind(-1)
        decoded = codes * scale[..., None] + least[..., None]
        whole_least = keys.amin(-1, keepdim=True).half().float()
        whole_scale = ((keys.amax(-1, keepdim=True) - keys.amin(-1, keepdim=True)) / 15).half().float()
        plain = torch.round((keys - whole_least) / whole_scale).clamp(0, 15) * whole_scale + whole_least
        assert codes.min() >= 0 and codes.max() <= 15
        assert bool((((decoded - keys) ** 2).sum(-1) <= ((plain - keys) ** 2).sum(-1) * (1 + 1e-6)).all())
    error = float((logits - reference).norm() / reference.norm())
    assert error < {"int8": 2e-3, "fp8": 1e-2, "int4": 5e-2}[dtype]


def test_an_int4_cache_is_turned_by_a_hadamard_rotation_that_attention_undoes(tmp_path: Path) -> None:
    """Head dim 16: the cached keys are codes of k R (R tcast's seeded Hadamard rotation, entries
    +-1/4), attention turns the queries by R and its output back by R^T; converted, the runtime
    makes the .pt2's tokens."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    import tcast
    from coreai_opt.models import export_file
    from tests._hf import tokenizer_json

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)  # fmt: skip
    folder = tmp_path / "wide"
    AutoModelForCausalLM.from_config(config).save_pretrained(folder, safe_serialization=True)
    (folder / "tokenizer.json").write_text(tokenizer_json(), encoding="utf-8")
    floats = export_file(folder, tmp_path / "f.pt2", context=CONTEXT).output
    turned = export_file(folder, tmp_path / "q.pt2", context=CONTEXT, kv_cache_dtype="int4").output
    program = load_pt2(turned)
    rotation = program.state_dict["kv_rotation"]
    assert torch.equal(rotation, tcast.hadamard(torch.eye(16), -1, 16, 0)) and torch.equal(
        rotation.abs() * 4, torch.ones(16, 16)
    )
    decoder, full = StatefulDecoder(program), StatefulDecoder(load_pt2(floats))
    ids = list(range(3, 3 + CONTEXT))
    with torch.no_grad():
        logits, reference = decoder(ids, 0), full(ids, 0)
    keys = full.module.key_cache_0 @ rotation  # what the cache holds codes of: the turned keys
    codes = decoder.module.key_cache_0
    codes = torch.stack([codes % 16, codes // 16], -1).flatten(-2).float()
    scale, least = decoder.module.key_scale_0.float().unbind(-1)  # one run of 16
    decoded = codes * scale[..., None] + least[..., None]
    assert float((decoded - keys).norm() / keys.norm()) < 0.1
    assert float((logits - reference).norm() / reference.norm()) < 5e-2
    from coreai_opt.generation import open_decoder
    from coreai_opt.recipes import convert_file

    asset = convert_file(turned, tmp_path / "q.aimodel").output  # the choice of range: no argmin there
    config = GenerateConfig(max_new_tokens=8, ignore_eos=True)
    with open_decoder(asset) as opened:
        assert generate(opened.decoder, PROMPT, config).tokens == generate(decoder, PROMPT, config).tokens


@pytest.mark.parametrize("dtype", ["int8"])  # the step rebuilds through the exporter: each dtype's tests above
def test_a_float_decoder_s_cache_quantizes_as_export_makes_it(
    decoders: dict[str, Path], coded, tmp_path: Path, dtype: str
) -> None:  # fmt: skip
    """A recipe's kv_cache step rebuilds the float decoder with the exporter's quantized cache:
    the same tensors, bit for bit, and the same logits as `export --kv-cache-dtype`; the input
    file is left as it was."""
    from coreai_opt.errors import ConfigError
    from coreai_opt.recipes import KVCache, Recipe, apply_recipe

    recipe = Recipe.from_dict({"steps": [{"kv_cache": {"dtype": dtype}}]})
    assert recipe == Recipe((KVCache(dtype=dtype),)) and Recipe.from_dict(recipe.to_dict()) == recipe
    with pytest.raises(ConfigError, match="dtype is one of int8, fp8, int4"):
        Recipe.from_dict({"steps": [{"kv_cache": {"dtype": "int2"}}]})
    exported = coded(dtype)
    before = decoders["llama"].read_bytes()
    result = apply_recipe(recipe, decoders["llama"], tmp_path / "q.pt2")
    assert decoders["llama"].read_bytes() == before
    ((kind, report),) = result.steps
    assert kind == "kv_cache" and report.relative_rms < 1e-5
    made, expected = load_pt2(result.output).state_dict, load_pt2(exported).state_dict
    assert set(made) == set(expected) and all(torch.equal(made[k], expected[k]) for k in made)
    decoder, reference = StatefulDecoder(load_pt2(result.output)), StatefulDecoder(load_pt2(exported))
    assert report.state_bytes_after == decoder.state_bytes < report.state_bytes_before
    with torch.no_grad():
        assert torch.equal(decoder(PROMPT, 0), reference(PROMPT, 0))


def test_quantize_compresses_the_weights_and_the_cache_together(
    decoders: dict[str, Path], coded, tmp_path: Path, coreopt
) -> None:  # type: ignore[no-untyped-def]
    """`quantize --kv-cache-dtype int8` = `quantize` of the decoder export made with an int8 cache."""
    import shutil

    from coreai_opt.models import copy_sidecars

    exported = Path(shutil.copyfile(coded("int8"), tmp_path / "e.pt2"))
    copy_sidecars(decoders["llama"], exported)
    both = coreopt("quantize", decoders["llama"], "--dtype", "int4", "--kv-cache-dtype", "int8", "-o",
                   tmp_path / "both.pt2", "--json")  # fmt: skip
    assert both.exit_code == 0, both.stderr
    out = json.loads(both.stdout)
    weights = coreopt("quantize", exported, "--dtype", "int4", "-o", tmp_path / "w.pt2", "-q")
    assert weights.exit_code == 0, weights.stderr
    made, expected = (load_pt2(tmp_path / n).state_dict for n in ("both.pt2", "w.pt2"))
    assert set(made) == set(expected) and all(torch.equal(made[k], expected[k]) for k in made)
    assert out["kv_cache"]["kv_cache_dtype"] == "int8"
    assert (
        out["kv_cache"]["state_bytes_after"] == StatefulDecoder(load_pt2(tmp_path / "both.pt2")).state_bytes
    )
    from coreai_opt.compression import QuantizeConfig
    from coreai_opt.recipes import Compress, KVCache, Recipe, default_output

    steps = (KVCache(dtype="fp8"), Compress(config=QuantizeConfig(dtype="int8")))
    assert default_output(decoders["llama"], Recipe(steps)).name == "llama.kv.kvfp8.int8.pt2"


def test_a_cache_that_cannot_be_quantized_is_refused_in_one_line(
    decoders: dict[str, Path], coded, tiny_llama, tmp_path: Path, coreopt
) -> None:  # type: ignore[no-untyped-def]
    """A window program, a cache already of codes, a cast decoder, one whose weights are stored
    compressed, an .aimodel, W8A8: each refused naming the file (or the flag), nothing written."""
    model = decoders["llama"]
    made = {"coded": coded("int8")}  # read only
    for name, args in (("half", ("cast",)), ("packed", ("quantize", "--dtype", "int8"))):
        made[name] = tmp_path / f"{name}.pt2"
        assert coreopt(args[0], model, *args[1:], "-o", made[name], "-q").exit_code == 0
    bare = tmp_path / "bare.pt2"
    bare.write_bytes(model.read_bytes())  # no description beside it
    other = tmp_path / "other.pt2"  # a description of another size beside it
    other.write_bytes(model.read_bytes())
    described = json.loads(model.with_suffix(".model.json").read_text())
    described["config"]["intermediate_size"] += 8
    other.with_suffix(".model.json").write_text(json.dumps(described))
    (tmp_path / "m.aimodel").mkdir()
    cases = [
        (other, "where its description states intermediate_size"),
        (tiny_llama["ref"], "is not a stateful decoder coreopt exported"),
        (made["coded"], "already keeps its key/value cache as codes"),
        (made["half"], "holds float16 weights: quantize its cache before casting"),
        (made["packed"], "quantize the cache before transforming or compressing it"),
        (bare, "is not a stateful decoder coreopt exported"),
        (tmp_path / "m.aimodel", ".pt2"),
    ]
    for path, said in cases:
        result = coreopt("quantize", path, "--kv-cache-dtype", "int8", "-o", tmp_path / "out.pt2")
        assert result.exit_code == 1, (path, result.stderr)
        assert str(path.name) in result.stderr, (path, result.stderr)
        assert result.stderr.count("\n") == 1 and said in result.stderr, (path, result.stderr)
        assert not (tmp_path / "out.pt2").exists()
    w8a8 = coreopt(
        "quantize", model, "--activations", "int8", "--calibration", "random", "--kv-cache-dtype", "int8"
    )
    assert w8a8.exit_code == 2 and "--kv-cache-dtype" in w8a8.stderr


def test_a_rotated_decoder_s_cache_quantizes_where_the_rotation_added_no_ops(
    decoders: dict[str, Path], tmp_path: Path, coreopt
) -> None:  # type: ignore[no-untyped-def]
    """The tiny LLaMA's head is its own (untied): a Hadamard rotation changes weight values only, so
    the rebuilt decoder reproduces the rotated program and its int8 cache stays near its floats."""
    turned, coded = tmp_path / "turned.pt2", tmp_path / "coded.pt2"
    assert coreopt("transform", decoders["llama"], "--rotate", "hadamard", "-o", turned, "-q").exit_code == 0
    done = coreopt("quantize", turned, "--dtype", "int8", "--threshold", "100000000", "--allow-empty",
                   "--kv-cache-dtype", "int8", "-o", coded, "--json")  # fmt: skip
    assert done.exit_code == 0, done.stderr
    assert json.loads(done.stdout)["kv_cache"]["relative_rms"] < 1e-5
    decoder, reference = StatefulDecoder(load_pt2(coded)), StatefulDecoder(load_pt2(turned))
    ids = list(range(3, 3 + CONTEXT))
    with torch.no_grad():
        logits, floats = decoder(ids, 0), reference(ids, 0)
    assert float((logits - floats).norm() / floats.norm()) < 2e-3


def test_a_description_names_no_code_to_run(decoders: dict[str, Path], monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Loading and attention options in a description (which could name a kernel on the Hub) never
    reach transformers: the config is built from the architecture's fields alone, and the rebuilt
    decoder attends by SDPA, as the exporter's does."""
    import transformers

    from coreai_opt.models import model_info
    from coreai_opt.models._recache import _rebuilt

    info = model_info(decoders["llama"])
    planted = ("_attn_implementation", "attn_implementation", "experts_implementation", "auto_map",
               "quantization_config", "trust_remote_code")  # fmt: skip
    for key in planted:
        info.config[key] = "kernels-community/flash-attn"
    given: dict[str, object] = {}
    build = transformers.AutoConfig.for_model

    def recorded(model_type: str, **options: object) -> object:
        given.update(options)
        return build(model_type, **options)

    monkeypatch.setattr(transformers.AutoConfig, "for_model", recorded)
    model = _rebuilt(load_pt2(decoders["llama"]), info)
    assert given and not set(planted) & set(given) and not any(k.startswith("_") for k in given)
    assert model.config._attn_implementation == "sdpa"
