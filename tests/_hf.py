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


def llama_gguf_variant(path: Path, *, drop: tuple[str, ...] = (), block_count: int | None = None) -> Path:
    """`llama_gguf` without the tensors named in `drop` (llama.cpp's names), stating `block_count`
    layers when given (a hostile file's claims)."""
    import gguf

    model = tiny_model("llama")
    config = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
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


def hf_cache_snapshot(folder: Path, cache: Path, repository: str = "models--tiny--llama") -> Path:
    """`folder` laid out as the Hugging Face cache keeps a download: each file a blob named by its
    hash in `cache/repository/blobs`, linked from `cache/repository/snapshots/<revision>/` by a
    relative link (`../../blobs/<hash>`). The snapshot folder."""
    import hashlib
    import os

    blobs = cache / repository / "blobs"
    snapshot = cache / repository / "snapshots" / ("0" * 40)
    blobs.mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True)
    for file in sorted(folder.iterdir()):
        digest = hashlib.sha256(file.read_bytes()).hexdigest()
        (blobs / digest).write_bytes(file.read_bytes())
        os.symlink(f"../../blobs/{digest}", snapshot / file.name)
    return snapshot


def exported_llama(root: Path) -> dict[str, Path]:
    """The tiny LLaMA exported at 16 tokens (`ref`) and a text to calibrate it on (`text`)."""
    from coreai_opt.models import export_file

    program = export_file(hf_folder("llama", root), root / "ref.pt2", seq_len=16).output
    text = root / "text.txt"
    text.write_text(TEXT, encoding="utf-8")
    return {"ref": program, "text": text, "root": root}
