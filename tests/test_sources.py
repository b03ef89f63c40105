"""Hostile model sources and sidecars: files that lead out of their folder are never read or copied
(a Hugging Face cache's blob links excepted), sidecars are written as parsed, and a config's sizes
must be the stored weights' before transformers builds anything - each refusal one line."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

from tests._hf import hf_cache_snapshot, hf_folder, llama_gguf_variant, tiny_model, tokenizer_json
from tests.conftest import SAMPLES

SECRET = b"-----BEGIN OPENSSH PRIVATE KEY-----\ncoreopt-test-secret-3f9a\n-----END OPENSSH PRIVATE KEY-----\n"
OUTSIDE = "is a link to a file outside its folder"


def _secret(tmp_path: Path) -> Path:
    key = tmp_path / "home" / ".ssh" / "id_ed25519"
    key.parent.mkdir(parents=True)
    key.write_bytes(SECRET)
    return key


def _link(path: Path, target: Path) -> None:
    if path.exists() or path.is_symlink():
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, path)


def _leaks(folder: Path) -> list[str]:
    """Files under `folder` that are links or hold the secret's bytes."""
    found = []
    for path in folder.rglob("*"):
        if path.is_symlink() or (path.is_file() and SECRET[:40] in path.read_bytes()):
            found.append(path.name)
    return found


def _refused(result, *parts: str) -> str:  # type: ignore[no-untyped-def]
    """The one line of a refusal (exit 1), holding every part."""
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert all(part in lines[0] for part in parts), lines[0]
    return lines[0]


def _edit_config(folder: Path, **changes: object) -> None:
    config = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (folder / "config.json").write_text(json.dumps(config))


def _drop_weights(folder: Path, *names: str) -> None:
    from safetensors.numpy import load_file, save_file

    weights = load_file(str(folder / "model.safetensors"))
    kept = {name: array for name, array in weights.items() if not name.startswith(names)}
    save_file(kept, str(folder / "model.safetensors"), metadata={"format": "pt"})


def _deep(levels: int) -> str:
    return "[" * levels + "]" * levels


# --- files that lead out of their folder ---------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["tokenizer.json", "config.json", "special_tokens_map.json", "additional_chat_templates/x.jinja"]
)
def test_export_refuses_a_source_file_linked_out_of_its_folder(name: str, tmp_path: Path, coreopt) -> None:
    folder = hf_folder("llama", tmp_path)
    _link(folder / name, _secret(tmp_path))
    out = tmp_path / "out"
    out.mkdir()
    result = coreopt("export", folder, "-o", out / "m.pt2")
    _refused(result, f"{folder / name}: {OUTSIDE}")
    assert list(out.iterdir()) == []


def test_a_fifo_in_a_model_folder_is_refused_before_anything_opens_it(tmp_path: Path, coreopt) -> None:
    folder = hf_folder("llama", tmp_path)
    os.mkfifo(folder / "tokenizer_config.json")  # transformers would wait on it for a writer forever
    result = coreopt("export", folder, "-o", tmp_path / "m.pt2")
    _refused(result, "tokenizer_config.json: is not a regular file or a folder")


def test_the_tokenizer_reader_refuses_a_link_out_wherever_a_tokenizer_is_read(tmp_path: Path) -> None:
    from coreai_opt.calibration import text_tokens
    from coreai_opt.io import ModelFileError
    from coreai_opt.models import model_tokenizer, read_tokenizer

    secret = _secret(tmp_path)
    link = tmp_path / "in" / "m.tokenizer.json"
    _link(link, secret)
    text = tmp_path / "in" / "text.txt"
    text.write_text("the model")
    for read in (
        read_tokenizer,
        lambda p: model_tokenizer(p.with_name("m.pt2")),
        lambda p: text_tokens(text, p),
    ):
        with pytest.raises(ModelFileError, match=OUTSIDE):
            read(link)


@pytest.mark.parametrize(("command", "sidecar"), [("cast", "tokenizer"), ("quantize", "model")])
def test_a_sidecar_linked_out_is_refused_and_never_copied(
    command: str, sidecar: str, tmp_path: Path, coreopt
) -> None:
    program = tmp_path / "in" / "mlp.pt2"
    program.parent.mkdir()
    shutil.copy(SAMPLES / "mlp.pt2", program)
    _link(program.with_name(f"mlp.{sidecar}.json"), _secret(tmp_path))
    out = tmp_path / "out"
    out.mkdir()
    result = coreopt(command, program, "-o", out / "x.pt2")
    _refused(result, f"mlp.{sidecar}.json: {OUTSIDE}")
    assert _leaks(out) == [] and list(out.iterdir()) == []  # refused before anything was written


def test_sidecars_are_written_as_parsed_not_as_read(tmp_path: Path, coreopt) -> None:
    from coreai_opt.models import ModelInfo

    program = tmp_path / "in" / "mlp.pt2"
    program.parent.mkdir()
    shutil.copy(SAMPLES / "mlp.pt2", program)
    tokenizer = json.loads(tokenizer_json())
    tokenizer["model"]["note"] = "SMUGGLED"  # a field the tokenizers package ignores
    program.with_name("mlp.tokenizer.json").write_text(json.dumps(tokenizer, indent=4))
    info = ModelInfo.from_dict(
        {"format": "coreopt-model", "version": 1, "kind": "encoder", "model_type": "bert", "batch": 1,
         "seq_len": 4, "config": {"hidden_size": 8}}, program,
    ).to_dict()  # fmt: skip
    program.with_name("mlp.model.json").write_text(json.dumps({**info, "note": "SMUGGLED"}))
    out = tmp_path / "out" / "mlp.int8.pt2"
    assert coreopt("quantize", program, "-o", out, "--quiet").exit_code == 0
    assert out.with_name("mlp.int8.tokenizer.json").read_text() == tokenizer_json()
    assert json.loads(out.with_name("mlp.int8.model.json").read_text()) == info


def test_a_hugging_face_cache_snapshot_exports_through_its_blob_links(tmp_path: Path) -> None:
    from coreai_opt.models import export_file

    folder = hf_folder("llama", tmp_path / "download")
    pretty = json.loads(tokenizer_json())
    pretty["model"]["note"] = "SMUGGLED"
    (folder / "tokenizer.json").write_text(json.dumps(pretty, indent=2))
    snapshot = hf_cache_snapshot(folder, tmp_path / "hub")
    assert all(p.is_symlink() for p in snapshot.iterdir())
    result = export_file(snapshot, tmp_path / "out" / "tiny.pt2", seq_len=8)
    assert result.tokenizer is not None and result.tokenizer.read_text() == tokenizer_json()


def test_a_snapshot_link_to_another_repositorys_blob_is_refused(tmp_path: Path) -> None:
    from coreai_opt.io import ModelFileError
    from coreai_opt.models import open_source

    folder = hf_folder("llama", tmp_path / "download")
    snapshot = hf_cache_snapshot(folder, tmp_path / "hub")
    other = tmp_path / "hub" / "models--other--repo" / "blobs" / "abc"
    other.parent.mkdir(parents=True)
    other.write_bytes(SECRET)
    _link(snapshot / "tokenizer.json", Path("../../../models--other--repo/blobs/abc"))
    with pytest.raises(ModelFileError, match=f"tokenizer.json: {OUTSIDE}"):
        open_source(snapshot)


def test_the_folder_reader_takes_regular_files_of_the_folder_only(tmp_path: Path) -> None:
    from coreai_opt.io import ModelFileError, read_in_folder

    folder = tmp_path / "model"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "real.json").write_bytes(b"{}")
    _link(folder / "inside.json", Path("sub/real.json"))
    assert read_in_folder(folder / "inside.json", folder, limit=2) == b"{}"
    assert read_in_folder(folder / "sub" / "real.json", folder, limit=1, whole=False) == b"{"
    with pytest.raises(ModelFileError, match="larger than the 1 bytes"):
        read_in_folder(folder / "inside.json", limit=1)
    _secret(tmp_path)
    with pytest.raises(ModelFileError, match=OUTSIDE):
        read_in_folder(folder / ".." / "home" / ".ssh" / "id_ed25519", folder, limit=1000)
    os.mkfifo(folder / "fifo.json")  # opening it to read would wait for a writer forever
    start = time.perf_counter()
    with pytest.raises(ModelFileError, match="is not a regular file"):
        read_in_folder(folder / "fifo.json", limit=1000)
    assert time.perf_counter() - start < 1


def test_an_aimodel_asset_with_a_link_out_is_refused_before_it_is_read(tmp_path: Path) -> None:
    from coreai_opt.io import ModelFileError, verify_aimodel

    asset = tmp_path / "m.aimodel"
    asset.mkdir()
    (asset / "metadata.json").write_text('{"assetVersion": "1"}')
    (asset / "main.hash").write_bytes(bytes(32))
    _link(asset / "main.mlirb", _secret(tmp_path))
    with pytest.raises(ModelFileError, match=f"main.mlirb: {OUTSIDE}"):
        verify_aimodel(asset)


# --- JSON nested past any parser ------------------------------------------------------------------


def test_configs_and_sidecars_nested_too_deep_fail_in_one_line(tmp_path: Path, coreopt) -> None:
    folder = hf_folder("llama", tmp_path)
    config = (folder / "config.json").read_text().rstrip()
    (folder / "config.json").write_text(config[:-1] + f', "x": {_deep(100_000)}}}')
    result = coreopt("export", folder, "-o", tmp_path / "a.pt2")
    _refused(result, "config.json: nests deeper than any JSON file coreopt reads")
    (folder / "config.json").write_text(config[:-1] + f', "x": {_deep(40)}}}')
    result = coreopt("export", folder, "-o", tmp_path / "a.pt2")
    _refused(result, "config.json: the config nests deeper than 32 levels")
    program = tmp_path / "in" / "mlp.pt2"
    program.parent.mkdir()
    shutil.copy(SAMPLES / "mlp.pt2", program)
    program.with_name("mlp.model.json").write_text(_deep(100_000))
    _refused(coreopt("cast", program, "-o", tmp_path / "c.pt2"), "mlp.model.json: nests deeper")


def test_a_tokenizer_json_that_does_not_parse_is_refused(tmp_path: Path, coreopt) -> None:
    folder = hf_folder("llama", tmp_path)
    (folder / "tokenizer.json").write_text('{"model": "not a tokenizer"}')
    out = tmp_path / "out.pt2"
    _refused(coreopt("export", folder, "-o", out), "tokenizer.json: not a readable tokenizer")
    assert not out.exists()


# --- a config's sizes against the stored weights --------------------------------------------------


def test_ten_million_layers_in_a_config_are_refused_at_once(tmp_path: Path, coreopt) -> None:
    from coreai_opt.io import ModelFileError
    from coreai_opt.models import open_source

    folder = hf_folder("qwen2", tmp_path)  # transformers spends 25 s on this config alone
    _edit_config(folder, num_hidden_layers=10_000_000)
    start = time.perf_counter()
    with pytest.raises(ModelFileError):
        open_source(folder)
    assert time.perf_counter() - start < 0.5
    _refused(
        coreopt("export", folder, "-o", tmp_path / "q.pt2"),
        "config.json: num_hidden_layers is 10000000 but model.safetensors holds 2 layers (0-1)",
    )
    assert not (tmp_path / "q.pt2").exists()


@pytest.mark.parametrize(
    ("family", "changes", "problem"),
    [
        ("llama", {"hidden_size": 64}, "hidden_size is 64 but model.embed_tokens.weight is [96, 32]"),
        ("llama", {"vocab_size": 1 << 30}, "vocab_size is 1073741824 but model.embed_tokens.weight is [96, 32]"),
        ("llama", {"intermediate_size": 1 << 40}, "intermediate_size is 1099511627776 but model.layers.0.mlp"),
        ("llama", {"num_attention_heads": 5},
         "num_attention_heads is 5, which does not divide model.layers.0.self_attn.q_proj.weight [32, 32]"),
        ("llama", {"num_key_value_heads": 3},
         "num_key_value_heads is 3, which does not divide model.layers.0.self_attn.k_proj.weight [16, 32]"),
        ("llama", {"num_key_value_heads": 4, "num_attention_heads": 2},
         "num_key_value_heads 4 does not divide num_attention_heads 2"),
        ("llama", {"max_position_embeddings": 10**12}, "max_position_embeddings is 1000000000000, more than"),
        ("llama", {"intermediate_size": "64"}, "intermediate_size must be a positive integer, not '64'"),
        ("llama", {"num_hidden_layers": None}, "num_hidden_layers is 32 but model.safetensors holds 2 layers"),
        ("gpt2", {"n_positions": 1 << 20}, "n_positions is 1048576 but transformer.wpe.weight is [64, 32]"),
        ("bert", {"type_vocab_size": 1 << 24}, "type_vocab_size is 16777216 but embeddings.token_type_embeddings"),
    ],
)  # fmt: skip
def test_config_sizes_the_weights_do_not_bear_out_are_refused(
    family: str, changes: dict[str, object], problem: str, tmp_path: Path, coreopt
) -> None:
    folder = hf_folder(family, tmp_path)
    _edit_config(folder, **changes)  # None: left out (transformers' default stands in)
    _refused(coreopt("export", folder, "-o", tmp_path / "m.pt2"), f"config.json: {problem}")
    assert not (tmp_path / "m.pt2").exists()


@pytest.mark.parametrize(
    ("dropped", "problem"),
    [
        (("model.layers.1.",), "config.json: num_hidden_layers is 2 but model.safetensors holds 1 layer (0)"),
        (("model.embed_tokens.",), "model.safetensors: lacks embed_tokens.weight, a weight every llama model has"),
        (("model.layers.1.mlp.up_proj.",),
         "model.safetensors: lacks 1 weight(s) the model needs (model.layers.1.mlp.up_proj.weight); they would be random"),
    ],
)  # fmt: skip
def test_a_folder_missing_weights_is_refused(
    dropped: tuple[str, ...], problem: str, tmp_path: Path, coreopt
) -> None:
    folder = hf_folder("llama", tmp_path)
    _drop_weights(folder, *dropped)
    _refused(coreopt("export", folder, "-o", tmp_path / "m.pt2"), problem)
    assert not (tmp_path / "m.pt2").exists()


def _empty_gguf(path: Path) -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (_empty_gguf, "holds no tensors"),
        (lambda p: llama_gguf_variant(p, drop=("token_embd.weight",)),
         "lacks token_embd.weight, a weight every llama model has"),
        (lambda p: llama_gguf_variant(p, block_count=10_000_000),
         "num_hidden_layers is 10000000 but t.gguf holds 2 layers (0-1)"),
        (lambda p: llama_gguf_variant(p, drop=("blk.1.ffn_up.weight",)),
         "lacks 1 weight(s) the model needs (model.layers.1.mlp.up_proj.weight)"),
    ],
)  # fmt: skip
def test_a_gguf_file_without_the_tensors_its_architecture_needs_is_refused(
    make, problem: str, tmp_path: Path, coreopt
) -> None:  # type: ignore[no-untyped-def]
    path = make(tmp_path / "t.gguf")
    _refused(coreopt("export", path, "-o", tmp_path / "m.pt2"), f"t.gguf: {problem}")
    assert not (tmp_path / "m.pt2").exists()


def test_a_sharded_folder_is_read_from_its_index_and_shards_stay_in_the_folder(tmp_path: Path) -> None:
    from coreai_opt.io import ModelFileError
    from coreai_opt.models import open_source

    folder = tmp_path / "sharded"
    model = tiny_model("llama")
    model.save_pretrained(folder, safe_serialization=True, max_shard_size="20KB")
    assert len(list(folder.glob("model-*.safetensors"))) > 1
    stored = open_source(folder).stored
    assert stored.path.name == "model.safetensors.index.json"
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == stored.shapes
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    index["weight_map"]["lm_head.weight"] = "../elsewhere.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelFileError, match="names a shard outside its folder"):
        open_source(folder)


def test_an_encoder_stored_without_its_pooler_exports_without_one(tmp_path: Path) -> None:
    from coreai_opt.models import export_model

    folder = hf_folder("bert", tmp_path)
    _drop_weights(folder, "pooler.")  # as roberta-base is published
    exported = export_model(folder, seq_len=8)
    outputs = exported.program.graph_signature.output_specs
    assert len(outputs) == 1 and not any("pooler" in n for n, _ in exported.program.named_parameters())


def test_the_gguf_keys_of_the_family_table_are_those_transformers_reads() -> None:
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    from coreai_opt.models import FAMILIES

    checked = 0
    for family in FAMILIES.values():
        for architecture in family.gguf:
            mapping = GGUF_CONFIG_MAPPING[architecture]
            assert mapping["block_count"] == family.shapes.layers
            for dim in family.shapes.dims:
                if dim.gguf_key is not None:
                    assert mapping.get(dim.gguf_key) in (dim.field, None), (architecture, dim)
                    checked += 1
    assert checked >= 10
