"""`coreopt export`: Hugging Face folders and GGUF files to `.pt2` programs that compute what
transformers computes, with their weights' Hugging Face names and their sidecars; bad sources
refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("gguf")

import torch

from tests._hf import VOCAB, hf_folder, llama_gguf, tiny_model, tokenizer_json

SEQ = 16


def _ids(batch: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, SEQ), generator=torch.Generator().manual_seed(7))


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "gpt2", "bert"])
def test_every_family_exports_what_transformers_computes(family: str, tmp_path: Path) -> None:
    import coreai_opt
    from coreai_opt.models import ModelKind, export_file, model_info, model_tokenizer

    folder = hf_folder(family, tmp_path)
    out = tmp_path / f"{family}.pt2"
    result = export_file(folder, out, seq_len=SEQ, batch=2)
    program = coreai_opt.load(out)  # through the audited loader, as every command opens it
    model = tiny_model(family)
    ids = _ids(2)
    with torch.no_grad():
        if family == "bert":
            mask = torch.ones_like(ids)
            mask[1, 12:] = 0  # the program takes the mask as an input, not as a constant
            want = model(input_ids=ids, attention_mask=mask)
            got = program.module()(ids, mask)
            torch.testing.assert_close(got[0], want.last_hidden_state, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(got[1], want.pooler_output, rtol=1e-5, atol=1e-5)
        else:
            torch.testing.assert_close(
                program.module()(ids), model(input_ids=ids).logits, rtol=1e-5, atol=1e-5
            )
    weights = {s.target for s in program.graph_signature.input_specs if s.kind.name == "PARAMETER"}
    assert weights <= set(model.state_dict()) and len(weights) >= 10  # Hugging Face's own names
    info = model_info(out)
    assert info == result.info
    assert info.kind is (ModelKind.ENCODER if family == "bert" else ModelKind.CAUSAL_LM)
    assert (info.model_type, info.batch, info.seq_len, info.vocab_size) == (family, 2, SEQ, VOCAB)
    assert model_tokenizer(out).read_text() == tokenizer_json()


def test_a_gguf_file_exports_what_transformers_loads_from_it(tmp_path: Path) -> None:
    import transformers

    from coreai_opt.models import export_model

    path = llama_gguf(tmp_path / "tiny.gguf")
    exported = export_model(path, seq_len=SEQ)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file=path.name, dtype=torch.float32
    )
    ids = _ids()
    with torch.no_grad():
        want = model.eval()(input_ids=ids).logits
    assert torch.equal(exported.program.module()(ids), want)
    # GGUF stores q/k rows permuted for llama.cpp's rotary layout; transformers undoes it
    original = tiny_model("llama").state_dict()
    params = dict(exported.program.named_parameters())
    assert torch.equal(
        params["model.layers.0.self_attn.v_proj.weight"], original["model.layers.0.self_attn.v_proj.weight"]
    )
    assert exported.info.source == str(path) and exported.tokenizer is None  # no tokenizer in this file


def test_export_cli_writes_the_program_and_its_sidecars(tmp_path: Path, coreopt) -> None:
    folder = hf_folder("llama", tmp_path)
    out = tmp_path / "out" / "tiny.pt2"
    out.parent.mkdir()
    result = coreopt("export", folder, "-o", out, "--seq-len", SEQ, "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert (
        doc["kind"] == "causal-lm"
        and doc["seq_len"] == SEQ
        and doc["parameters"] == sum(p.numel() for p in tiny_model("llama").parameters())
    )
    assert sorted(p.name for p in out.parent.iterdir()) == [
        "tiny.model.json",
        "tiny.pt2",
        "tiny.tokenizer.json",
    ]
    # a compressed program of the lineage carries them on
    q = tmp_path / "out" / "tiny.lut2.pt2"
    assert coreopt("palettize", out, "-o", q, "--nbits", 2, "--threshold", 0, "--quiet").exit_code == 0
    assert (tmp_path / "out" / "tiny.lut2.tokenizer.json").read_text() == tokenizer_json()
    assert json.loads((tmp_path / "out" / "tiny.lut2.model.json").read_text())["seq_len"] == SEQ


def _bad_source(kind: str, tmp_path: Path) -> tuple[Path, str]:
    folder = tmp_path / "model"
    folder.mkdir()
    config = {"model_type": "llama", "vocab_size": VOCAB}
    if kind == "missing":
        return tmp_path / "nowhere", "no such file or directory"
    if kind == "no-config":
        return folder, "holds no config.json"
    if kind == "bad-json":
        (folder / "config.json").write_text("{not json")
        return folder, "not a readable JSON file"
    if kind == "unsupported":
        (folder / "config.json").write_text(
            json.dumps({"model_type": "t5", "auto_map": {"AutoModel": "x.Y"}})
        )
        return folder, "model_type 't5' is not one coreopt exports"
    if kind == "pickled":
        (folder / "config.json").write_text(json.dumps(config))
        (folder / "pytorch_model.bin").write_bytes(b"\x80\x04cos\nsystem\n.")  # never opened
        return folder, "holds pickled weights only (pytorch_model.bin)"
    if kind == "no-weights":
        (folder / "config.json").write_text(json.dumps(config))
        return folder, "holds no *.safetensors weights"
    if kind == "broken-weights":
        (folder / "config.json").write_text(json.dumps(config))
        (folder / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}")
        return folder, "not a readable safetensors file"
    if kind == "not-gguf":
        path = tmp_path / "model.gguf"
        path.write_bytes(b"GGML" + bytes(60))
        return path, "not a GGUF file"
    if kind == "truncated-gguf":
        path = llama_gguf(tmp_path / "model.gguf")
        path.write_bytes(path.read_bytes()[:200])
        return path, "not a readable GGUF file"
    assert kind == "gguf-arch"
    import gguf

    path = tmp_path / "model.gguf"
    writer = gguf.GGUFWriter(str(path), "falcon")
    writer.add_tensor("x", np.zeros(4, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path, "GGUF architecture 'falcon' is not one coreopt exports"


@pytest.mark.parametrize(
    "kind",
    [
        "missing",
        "no-config",
        "bad-json",
        "unsupported",
        "pickled",
        "no-weights",
        "broken-weights",
        "not-gguf",
        "truncated-gguf",
        "gguf-arch",
    ],
)
def test_bad_sources_fail_in_one_line_and_write_nothing(kind: str, tmp_path: Path, coreopt) -> None:
    source, problem = _bad_source(kind, tmp_path)
    out = tmp_path / "out.pt2"
    result = coreopt("export", source, "-o", out)
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and problem in lines[0], result.stderr
    assert str(source.name) in lines[0]
    assert not out.exists() and not (tmp_path / "out.model.json").exists()


def test_a_length_past_the_models_positions_is_a_usage_error(tmp_path: Path, coreopt) -> None:
    folder = hf_folder("gpt2", tmp_path)
    result = coreopt("export", folder, "-o", tmp_path / "g.pt2", "--seq-len", 65)
    assert result.exit_code == 2 and "65 exceeds the 64 positions" in result.stderr
    assert not (tmp_path / "g.pt2").exists()
