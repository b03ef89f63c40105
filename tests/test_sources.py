"""Hostile model sources and sidecars: files that lead out of their folder are never read or copied
(links to a Hugging Face cache's blobs excepted; a path the user typed is followed), nor are a GGUF
file's neighbours or files a tokenizer's arguments name outside the folder; sidecars are written as
parsed, once; a safetensors header's offsets must hold its shapes, and a config's sizes must be
the stored weights' before transformers builds anything - each refusal one line."""

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

from tests._hf import (
    TEXT,
    VOCAB,
    empty_gguf,
    gpt2_gguf,
    hf_cache_snapshot,
    hf_folder,
    hf_hub_blobs,
    llama_gguf_variant,
    tiny_model,
    tokenizer_json,
)
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
    _link(tmp_path / "in" / "tokenizer.json", secret)
    text = tmp_path / "in" / "text.txt"
    text.write_text("the model")
    for read in (
        read_tokenizer,
        lambda p: model_tokenizer(p.with_name("m.pt2")),
        lambda p: text_tokens(text, p.parent),  # a folder's tokenizer.json: found in it, not named
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


@pytest.mark.parametrize(
    "target",
    [
        "models--other--repo/snapshots/abc/tokenizer.json",  # a repository's file, but no blob
        "models--other--repo/blobs/sub/abc",  # not directly in blobs
        "models--/blobs/abc",  # no repository
        "datasets--other--repo/blobs/abc",  # not a model repository
        "blobs/abc",
    ],
)
def test_a_link_to_what_only_looks_like_a_hub_cache_blob_is_refused(target: str, tmp_path: Path) -> None:
    from coreai_opt.io import ModelFileError
    from coreai_opt.models import open_source

    folder = hf_folder("llama", tmp_path / "download")
    snapshot = hf_cache_snapshot(folder, tmp_path / "hub")
    other = tmp_path / "hub" / target
    other.parent.mkdir(parents=True)
    other.write_bytes(SECRET)
    _link(snapshot / "tokenizer.json", other)
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


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (empty_gguf, "holds no tensors"),
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
                if dim.gguf_key is not None:  # transformers reads the key, into the field checked
                    assert mapping.get(dim.gguf_key, "not read") == dim.field, (architecture, dim)
                    checked += 1
    assert checked >= 10


# --- what transformers is given: never a GGUF file's neighbours, never a name out of the folder ----

MARK = "coreopt-test-secret-3f9a"


def _secret_tokenizer() -> str:
    """A tokenizer.json that parses, holding a word that must never reach an output."""
    tokenizer = json.loads(tokenizer_json())
    tokenizer["model"]["vocab"][MARK] = VOCAB
    return json.dumps(tokenizer)


def _marked(folder: Path) -> list[str]:
    return [p.name for p in folder.rglob("*") if p.is_file() and MARK.encode() in p.read_bytes()]


def test_files_beside_a_gguf_file_are_never_read(tmp_path: Path, coreopt, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import tempfile

    import transformers

    clean = tmp_path / "clean"
    clean.mkdir()
    expected = transformers.AutoTokenizer.from_pretrained(
        str(clean),
        gguf_file=llama_gguf_variant(clean / "tiny.gguf", tokenizer=True).name,
        local_files_only=True,
    ).backend_tokenizer.to_str()
    downloads = tmp_path / "Downloads"
    downloads.mkdir()
    shutil.copy(clean / "tiny.gguf", downloads / "tiny.gguf")
    secret = tmp_path / "home" / ".ssh" / "tokenizer.json"
    secret.parent.mkdir(parents=True)
    secret.write_text(_secret_tokenizer())
    _link(downloads / "tokenizer.json", secret)
    (downloads / "tokenizer_config.json").write_text(json.dumps({"tokenizer_file": str(secret)}))
    private = tmp_path / "tmp"
    private.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    out = tmp_path / "out"
    result = coreopt("export", downloads / "tiny.gguf", "-o", out / "tiny.pt2", "--seq-len", "8", "--quiet")
    assert result.exit_code == 0, result.stderr
    assert (out / "tiny.tokenizer.json").read_text() == expected  # the GGUF's own tokenizer
    assert _marked(out) == [] and _leaks(out) == []
    assert list(private.iterdir()) == []  # the private folder transformers was given is gone


@pytest.mark.parametrize(
    ("name", "arguments", "named"),
    [
        ("tokenizer_config.json", {"fast_tokenizer_files": ["../x/tokenizer.4.0.0.json"]},
         "fast_tokenizer_files names '../x/tokenizer.4.0.0.json'"),
        ("tokenizer_config.json", {"fast_tokenizer_files": ["{x}/tokenizer.4.0.0.json"]},
         "fast_tokenizer_files names '{x}/tokenizer.4.0.0.json'"),
        ("special_tokens_map.json", {"tokenizer_file": "{x}/tokenizer.json"}, "tokenizer_file names '{x}/tokenizer.json'"),
        ("tokenizer_config.json", {"tokenizer_class": "GPT2Tokenizer", "vocab": "{x}/vocab.json",
                                   "merges": "{x}/merges.txt"}, "vocab names '{x}/vocab.json'"),
        ("tokenizer_config.json", {"tokenizer_class": "GPT2Tokenizer", "init_inputs": ["vocab.json", "merges.txt"]},
         "init_inputs names 'vocab.json'"),  # a plain name too: transformers opens it where coreopt runs
    ],
)  # fmt: skip
def test_tokenizer_arguments_that_name_files_out_of_the_folder_are_refused(
    name: str, arguments: dict[str, object], named: str, tmp_path: Path, coreopt, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    folder = hf_folder("llama", tmp_path)
    (folder / "tokenizer.json").unlink()  # transformers builds the tokenizer from the other files
    x = tmp_path / "x"
    x.mkdir()
    for file in ("tokenizer.json", "tokenizer.4.0.0.json"):
        (x / file).write_text(_secret_tokenizer())
    (x / "vocab.json").write_text(json.dumps({MARK: 0, "a": 1, "b": 2, "ab": 3}))
    (x / "merges.txt").write_text("#version: 0.2\na b\n")
    monkeypatch.chdir(x)
    text = json.dumps(arguments).replace("{x}", str(x))
    (folder / name).write_text(text)
    out = tmp_path / "out"
    out.mkdir()
    result = coreopt("export", folder, "-o", out / "m.pt2", "--seq-len", "8")
    _refused(result, f"{folder / name}: {named.replace('{x}', str(x))}, not a file of its folder")
    assert list(out.iterdir()) == []


def test_tokenizer_arguments_naming_files_of_the_folder_are_followed(tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    from coreai_opt.models import export_file

    folder = hf_folder("llama", tmp_path)
    (folder / "tokenizer.json").rename(folder / "tokenizer.4.0.0.json")
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"fast_tokenizer_files": ["tokenizer.4.0.0.json"]})
    )
    result = export_file(folder, tmp_path / "out" / "m.pt2", seq_len=8)
    assert result.tokenizer is not None
    made = Tokenizer.from_str(result.tokenizer.read_text())
    assert made.get_vocab() == Tokenizer.from_str(tokenizer_json()).get_vocab()


# --- links the user made: the path typed is followed, what a folder holds is checked ---------------


def test_a_gguf_file_linked_to_an_ollama_blob_exports(tmp_path: Path, coreopt) -> None:  # type: ignore[no-untyped-def]
    blob = tmp_path / "home" / ".ollama" / "models" / "blobs" / ("sha256-" + "0" * 64)
    blob.parent.mkdir(parents=True)
    llama_gguf_variant(blob)
    link = tmp_path / "models" / "tiny.gguf"
    _link(link, blob)
    out = tmp_path / "out" / "tiny.pt2"
    result = coreopt("export", link, "-o", out, "--seq-len", "8", "--quiet")
    assert result.exit_code == 0, result.stderr
    assert json.loads(out.with_name("tiny.model.json").read_text())["source"] == str(link)


def test_a_tokenizer_named_by_a_link_is_read(tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    from coreai_opt.calibration import Samples, text_tokens
    from coreai_opt.io import ModelFileError

    kept = tmp_path / "elsewhere" / "tokenizer.json"  # wherever the user keeps it
    kept.parent.mkdir()
    kept.write_text(tokenizer_json())
    link = tmp_path / "work" / "llama.tokenizer.json"
    _link(link, kept)
    text = tmp_path / "work" / "text.txt"
    text.write_text(TEXT)
    expected = Tokenizer.from_str(tokenizer_json()).encode(TEXT, add_special_tokens=False).ids
    assert text_tokens(text, link) == expected  # --tokenizer a link
    assert Samples.of(text, tokenizer=link).digest() == Samples.of(text, tokenizer=kept).digest()
    _link(tmp_path / "folder", kept.parent)
    assert text_tokens(text, tmp_path / "folder") == expected  # --tokenizer a link to a folder
    _link(tmp_path / "work" / "tokenizer.json", kept)  # a folder's file found in it may not lead out
    with pytest.raises(ModelFileError, match=f"tokenizer.json: {OUTSIDE}"):
        text_tokens(text, tmp_path / "work")


def test_a_local_dir_download_linked_into_the_hub_cache_exports(tmp_path: Path) -> None:
    from coreai_opt.io import ModelFileError
    from coreai_opt.models import export_file, open_source

    download = hf_folder("llama", tmp_path / "download")
    blobs = hf_hub_blobs(download, tmp_path / "home" / ".cache" / "huggingface" / "hub")
    local = tmp_path / "local"  # huggingface_hub < 0.23's local_dir: large files linked to the cache
    local.mkdir()
    shutil.copy(download / "config.json", local / "config.json")
    for name in ("model.safetensors", "tokenizer.json"):
        os.symlink(blobs[name], local / name)
    result = export_file(local, tmp_path / "out" / "tiny.pt2", seq_len=8)
    assert result.tokenizer is not None and result.tokenizer.read_text() == tokenizer_json()
    nested = blobs["config.json"].parent / "nested"  # a folder in blobs is no blob
    nested.mkdir()
    _link(local / "extra", nested)
    with pytest.raises(ModelFileError, match=f"extra: {OUTSIDE}"):
        open_source(local)


# --- a safetensors header's offsets against its shapes ---------------------------------------------


def _edit_header(path: Path, edit) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """Rewrite a safetensors file's header with `edit(header)` applied, its data left as it was;
    the header as edited."""
    data = path.read_bytes()
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + size])
    edit(header)
    text = json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + data[8 + size :])
    return header


def _offsets(header: dict, name: str) -> list[int]:  # type: ignore[type-arg]
    return header[name]["data_offsets"]


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (lambda h: _offsets(h, "lm_head.weight").__setitem__(1, _offsets(h, "lm_head.weight")[1] - 4),
         "weight 'lm_head.weight' of [96, 32] F32 takes 12288 bytes, not bytes {lm_head.weight}"),
        (lambda h: h["lm_head.weight"].__setitem__("data_offsets", [10**9, 10**9 + 12288]),
         "weight 'lm_head.weight' of [96, 32] F32 takes 12288 bytes, not bytes {lm_head.weight}"),
        (lambda h: h["lm_head.weight"].__setitem__("data_offsets", [-12288, 0]),
         "weight 'lm_head.weight' of [96, 32] F32 takes 12288 bytes, not bytes {lm_head.weight}"),
        (lambda h: h["lm_head.weight"].__setitem__("shape", [96, 64]),
         "weight 'lm_head.weight' of [96, 64] F32 takes 24576 bytes, not bytes {lm_head.weight}"),
        (lambda h: h["lm_head.weight"].__setitem__("dtype", "Q4_K"), "weight 'lm_head.weight' has dtype 'Q4_K'"),
        (lambda h: h["lm_head.weight"].pop("data_offsets"), "weight 'lm_head.weight' has no data_offsets"),
        (lambda h: h["model.norm.weight"].__setitem__("data_offsets", _offsets(h, "model.layers.0.input_layernorm.weight")),
         "weights 'model.layers.0.input_layernorm.weight' and 'model.norm.weight' overlap"),
    ],
)  # fmt: skip
def test_a_safetensors_header_whose_offsets_do_not_hold_its_shapes_is_refused(
    edit, problem: str, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    from coreai_opt.io import ModelFileError
    from coreai_opt.models import open_source

    folder = hf_folder("llama", tmp_path)
    weights = folder / "model.safetensors"
    header = _edit_header(weights, edit)
    data = weights.stat().st_size - 8 - int.from_bytes(weights.read_bytes()[:8], "little")
    if "data_offsets" in header["lm_head.weight"]:
        start, end = _offsets(header, "lm_head.weight")
        problem = problem.replace("{lm_head.weight}", f"{start}..{end} of {data}")
    with pytest.raises(ModelFileError) as refused:
        open_source(folder)
    assert str(refused.value) == f"{weights}: not a readable safetensors file ({problem})"


def test_a_safetensors_file_cut_short_is_refused_in_one_line(tmp_path: Path, coreopt) -> None:  # type: ignore[no-untyped-def]
    folder = hf_folder("llama", tmp_path)
    weights = folder / "model.safetensors"
    header = _edit_header(weights, lambda h: None)
    data = weights.stat().st_size - 8 - len(json.dumps(header).encode())
    weights.write_bytes(weights.read_bytes()[:-4])
    name = max((n for n in header if n != "__metadata__"), key=lambda n: _offsets(header, n)[1])
    start, end = _offsets(header, name)
    shape, dtype = header[name]["shape"], header[name]["dtype"]
    assert end == data and dtype == "F32"
    _refused(
        coreopt("export", folder, "-o", tmp_path / "m.pt2"),
        f"{weights}: not a readable safetensors file (weight {name!r} of {shape} F32 takes {end - start} bytes, "
        f"not bytes {start}..{end} of {data - 4})",
    )
    assert not (tmp_path / "m.pt2").exists()


# --- the family table ---------------------------------------------------------------------------------


def test_a_gpt2_gguf_file_is_checked_along_the_axes_llama_cpp_stores(tmp_path: Path) -> None:
    from coreai_opt.io import ModelFileError
    from coreai_opt.models import open_source
    from coreai_opt.models._sizes import check_sizes

    path = gpt2_gguf(tmp_path / "gpt2.gguf")
    src = open_source(path)
    assert src.stored.shapes["blk.0.ffn_up.weight"] == (128, 32)  # [n_inner, n_embd]: Conv1D's transposed
    check_sizes(src.family, {"n_layer": 2, "n_embd": 32, "n_inner": 128, "n_head": 4}, src.stored, path)
    with pytest.raises(ModelFileError) as refused:
        check_sizes(src.family, {"n_inner": 32}, src.stored, path)
    assert str(refused.value) == f"{path}: n_inner is 32 but blk.0.ffn_up.weight is [128, 32]"


# --- sidecars read once, before the work ------------------------------------------------------------


def test_optimize_writes_the_sidecars_it_read_before_the_search(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from coreai_opt.models import ModelInfo
    from coreai_opt.optimization import Goal, optimize

    monkeypatch.setenv("COREOPT_CACHE", str(tmp_path / "cache"))
    program = tmp_path / "in" / "mlp.pt2"
    program.parent.mkdir()
    shutil.copy(SAMPLES / "mlp.pt2", program)
    info = {"format": "coreopt-model", "version": 1, "kind": "encoder", "model_type": "bert", "batch": 1,
            "seq_len": 4, "vocab_size": None, "source": "", "config": {"hidden_size": 8}}  # fmt: skip
    ModelInfo.from_dict(info, program)
    program.with_name("mlp.model.json").write_text(json.dumps(info))
    program.with_name("mlp.tokenizer.json").write_text(tokenizer_json())

    def swap(_: str) -> None:  # the sidecars change on disk once the search has begun
        program.with_name("mlp.model.json").write_text(json.dumps({**info, "seq_len": 99}))
        program.with_name("mlp.tokenizer.json").write_text(_secret_tokenizer())

    out = tmp_path / "out" / "mlp.small.pt2"
    out.parent.mkdir()
    optimize(program, Goal(target_bits=6), "random", "random", output=out, candidates="int8,int4", threshold=0,
             uniform=0, rounds=1, calibration_samples=4, eval_samples=2, say=swap)  # fmt: skip
    assert json.loads(out.with_name("mlp.small.model.json").read_text()) == info
    assert out.with_name("mlp.small.tokenizer.json").read_text() == tokenizer_json()


def test_apply_calibrates_on_text_with_the_tokenizer_sidecar_it_read(
    tmp_path: Path, monkeypatch, tiny_llama
) -> None:  # type: ignore[no-untyped-def]
    import coreai_opt.models
    from coreai_opt.recipes import quantize_activations_file

    llama = tiny_llama

    def asked_again(program: object) -> None:
        raise AssertionError(f"the tokenizer beside {program} was looked up again")

    monkeypatch.setattr(coreai_opt.models, "model_tokenizer", asked_again)
    out = tmp_path / "out" / "w8a8.pt2"
    result = quantize_activations_file(llama["ref"], out, calibration=llama["text"], calibration_tokens=32)
    assert out.with_name("w8a8.tokenizer.json").read_text() == tokenizer_json()
    assert result.samples == 2  # 32 tokens of the text: two windows of the program's 16
