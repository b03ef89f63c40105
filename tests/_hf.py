"""Tiny Hugging Face models built from configs with seeded random weights: folders of config.json,
model.safetensors and a word-level tokenizer.json, and a LLaMA GGUF file written by gguf's writer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

VOCAB = 96
TEXT = (
    "the model reads the text and the text feeds the model ; a small model of words predicts the next word "
    "of the text , and the next word of a small text is a word the model has read . "
) * 12


def _configs() -> dict[str, Any]:
    from transformers import BertConfig, GPT2Config, LlamaConfig, MistralConfig, Qwen2Config

    shared = {"vocab_size": VOCAB}
    decoder = {**shared, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}  # fmt: skip
    return {
        "llama": LlamaConfig(**decoder, tie_word_embeddings=False),
        "mistral": MistralConfig(**decoder, sliding_window=None),
        "qwen2": Qwen2Config(**decoder),
        "gpt2": GPT2Config(
            **shared, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0
        ),
        "bert": BertConfig(
            **shared,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=64,
        ),
    }


def tiny_model(family: str) -> Any:
    """A seeded random model of `family` (eval mode, float32)."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = _configs()[family]
    kind = transformers.AutoModel if family == "bert" else transformers.AutoModelForCausalLM
    return kind.from_config(config).eval()


def tokenizer_json() -> str:
    """A word-level tokenizer over TEXT's words (unknown words map to [UNK])."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    words = ["[UNK]", *sorted(set(TEXT.split()))]
    words += [f"w{i}" for i in range(VOCAB - len(words))]
    tokenizer = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = WhitespaceSplit()
    return tokenizer.to_str()


def hf_folder(family: str, root: Path) -> Path:
    """`root/family`: config.json, model.safetensors, tokenizer.json."""
    folder = root / family
    tiny_model(family).save_pretrained(folder, safe_serialization=True)
    (folder / "tokenizer.json").write_text(tokenizer_json(), encoding="utf-8")
    return folder


_GGUF_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
               "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
               "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
               "post_attention_layernorm": "ffn_norm"}  # fmt: skip


def llama_gguf(path: Path) -> Path:
    """The tiny LLaMA as a float32 GGUF file (llama.cpp's tensor names and metadata keys)."""
    return llama_gguf_variant(path)


def _add_gguf_tokenizer(writer: Any) -> None:
    """A byte-level BPE vocabulary of VOCAB tokens as llama.cpp stores one (`tokenizer.ggml.*`):
    the 94 printable ASCII bytes but space, space itself, and "th" (from one merge)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    spelling = bytes_to_unicode()
    tokens = [spelling[b] for b in range(33, 127)] + [spelling[32], "th"]
    assert len(tokens) == VOCAB
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_merges(["t h"])
    writer.add_token_types([1] * VOCAB)  # 1: NORMAL
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)


def llama_gguf_variant(
    path: Path,
    *,
    drop: tuple[str, ...] = (),
    block_count: int | None = None,
    tokenizer: bool = False,
    chat_template: str | None = None,
) -> Path:
    """`llama_gguf` without the tensors named in `drop` (llama.cpp's names), stating `block_count`
    layers when given (a hostile file's claims); with a byte-level BPE tokenizer in its metadata
    when `tokenizer`, and `chat_template` when given."""
    import gguf

    model = tiny_model("llama")
    config = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    if tokenizer:
        _add_gguf_tokenizer(writer)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_block_count(config.num_hidden_layers if block_count is None else block_count)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(VOCAB)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}  # fmt: skip
    for i in range(config.num_hidden_layers):
        names |= {f"model.layers.{i}.{k}.weight": f"blk.{i}.{v}.weight" for k, v in _GGUF_NAMES.items()}
    for name, tensor in model.state_dict().items():
        if names[name] not in drop:
            writer.add_tensor(names[name], tensor.numpy().astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


_GPT2_GGUF_NAMES = {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output", "ln_2": "ffn_norm",
                    "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}  # fmt: skip


def empty_gguf(path: Path) -> Path:
    """A GGUF file that says it is a two-layer llama and holds no tensor."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def gpt2_gguf(path: Path) -> Path:
    """The tiny GPT-2 as a float32 GGUF file laid out as llama.cpp's converter writes one: its
    Conv1D weights ([in, out]) transposed into linear ones ([out, in])."""
    import gguf

    model = tiny_model("gpt2")
    config = model.config
    writer = gguf.GGUFWriter(str(path), "gpt2")
    writer.add_context_length(config.n_positions)
    writer.add_embedding_length(config.n_embd)
    writer.add_feed_forward_length(4 * config.n_embd)
    writer.add_block_count(config.n_layer)
    writer.add_head_count(config.n_head)
    writer.add_layer_norm_eps(config.layer_norm_epsilon)
    for name, tensor in model.state_dict().items():
        name = name.removeprefix("transformer.")
        if name.startswith("h."):
            _, layer, rest = name.split(".", 2)
            part, kind = rest.rsplit(".", 1)
            if kind == "weight" and part in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"):
                tensor = tensor.T
            name = f"blk.{layer}.{_GPT2_GGUF_NAMES[part]}.{kind}"
        else:
            name = {"wte.weight": "token_embd.weight", "wpe.weight": "position_embd.weight",
                    "ln_f.weight": "output_norm.weight", "ln_f.bias": "output_norm.bias",
                    "lm_head.weight": "output.weight"}[name]  # fmt: skip
        writer.add_tensor(name, np.ascontiguousarray(tensor.numpy().astype(np.float32)))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def hf_hub_blobs(folder: Path, cache: Path, repository: str = "models--tiny--llama") -> dict[str, Path]:
    """`folder`'s files copied into a Hugging Face hub cache's `cache/repository/blobs`, each named
    by its hash; file name -> blob."""
    import hashlib

    blobs = cache / repository / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    found = {}
    for file in sorted(folder.iterdir()):
        blob = blobs / hashlib.sha256(file.read_bytes()).hexdigest()
        blob.write_bytes(file.read_bytes())
        found[file.name] = blob
    return found


def hf_cache_snapshot(folder: Path, cache: Path, repository: str = "models--tiny--llama") -> Path:
    """`folder` laid out as the Hugging Face cache keeps a download: each file a blob named by its
    hash in `cache/repository/blobs`, linked from `cache/repository/snapshots/<revision>/` by a
    relative link (`../../blobs/<hash>`). The snapshot folder."""
    import os

    snapshot = cache / repository / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    for name, blob in hf_hub_blobs(folder, cache, repository).items():
        os.symlink(f"../../blobs/{blob.name}", snapshot / name)
    return snapshot


def exported_llama(root: Path) -> dict[str, Path]:
    """The tiny LLaMA exported at 16 tokens (`ref`) and a text to calibrate it on (`text`)."""
    from coreai_opt.models import export_file

    program = export_file(hf_folder("llama", root), root / "ref.pt2", seq_len=16).output
    text = root / "text.txt"
    text.write_text(TEXT, encoding="utf-8")
    return {"ref": program, "text": text, "root": root}
