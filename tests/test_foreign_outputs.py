"""Programs exported from Hugging Face models exactly as the README says (outputs in transformers'
`ModelOutput` containers): every command reads them without importing transformers' code paths,
computes what transformers computes, and names every converted weight after its module."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")

import torch

from tests._hf import VOCAB, tiny_model
from tests.conftest import run_aimodel

_NODE_NAME = re.compile(r"^[a-z_]+(_\d+)?$")  # what an unnamed converter constant looks like: `unsqueeze_15`


def _export_as_readme_says(model: torch.nn.Module, example: torch.Tensor, path: Path) -> None:
    import coreai_torch

    with torch.no_grad():
        program = torch.export.export(model, (example,))
    torch.export.save(program.run_decompositions(coreai_torch.get_decomp_table()), path)


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.Tensor, torch.Tensor]:
    from safetensors.torch import save_file

    model = tiny_model("llama")
    model.config.use_cache = False  # a cache object is no output a program can return
    ids = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(3))
    folder = tmp_path_factory.mktemp("hf_llama")
    _export_as_readme_says(model, ids, folder / "llama.pt2")
    save_file({"input_ids": ids}, folder / "inputs.safetensors")
    with torch.no_grad():
        logits = model(ids).logits
    return folder / "llama.pt2", ids, logits


def _weight_names(report) -> list[str]:  # type: ignore[no-untyped-def]
    return [w.name for w in report.weights if w.kind in ("weight", "parameter")]


def test_llama_loads_runs_and_says_its_outputs_were_flattened(llama) -> None:  # type: ignore[no-untyped-def]
    import coreai_opt
    from coreai_opt.inspection import inspect_model

    path, ids, logits = llama
    program = coreai_opt.load(path)
    (out,) = program.module()(ids)  # the ModelOutput read as a tuple of its one tensor
    torch.testing.assert_close(out, logits, rtol=1e-5, atol=1e-5)
    (note,) = inspect_model(path).notes
    assert "transformers.modeling_outputs.CausalLMOutputWithPast (logits)" in note
    assert "transformers.modeling_outputs" not in json.dumps(list(program.call_spec.out_spec.context or []))

    # torch's own loader cannot, in a process that has not imported transformers
    refused = subprocess.run([sys.executable, "-m", "cli.coreopt_app", "inspect", str(path), "--trust-pickle"],
                             capture_output=True, text=True, check=False)  # fmt: skip
    assert refused.returncode == 1, refused.stderr
    (line,) = refused.stderr.strip().splitlines()
    assert "CausalLMOutputWithPast in pytree is not registered" in line
    assert "without --trust-pickle" in line


def test_llama_compresses_casts_and_converts_with_module_names(llama, coreopt, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import coreai_opt
    from coreai_opt.inspection import inspect_model

    path, ids, logits = llama
    inputs = path.parent / "inputs.safetensors"
    q8 = tmp_path / "llama.int8.pt2"
    assert coreopt("quantize", path, "--dtype", "int8", "-o", q8, "-q").exit_code == 0
    (out,) = coreai_opt.load(q8).module()(ids)
    assert torch.nn.functional.cosine_similarity(out.flatten(), logits.flatten(), dim=0) > 0.999
    cast = coreopt("cast", path, "--to", "fp16", "--inputs", inputs, "-o", tmp_path / "c.pt2")
    assert cast.exit_code == 0, cast.stdout + cast.stderr

    aimodel = tmp_path / "llama.aimodel"
    assert coreopt("convert", path, "-o", aimodel).exit_code == 0
    names = _weight_names(inspect_model(aimodel))
    assert len(names) == len(set(names))
    assert {"model.embed_tokens.weight", "model.layers.1.mlp.down_proj.weight", "lm_head.weight"} <= set(
        names
    )
    assert not [n for n in names if _NODE_NAME.match(n)], names  # rotary tables under their attention module
    (runtime,) = run_aimodel(aimodel, {"input_ids": ids.numpy().astype(np.int32)}).values()
    np.testing.assert_allclose(runtime.reshape(logits.shape), logits.numpy(), rtol=1e-3, atol=1e-3)

    # block 64 fits only down_proj (its input axis is 64; the others' 32, and q/k/v/o are small)
    blocks = coreopt("quantize", aimodel, "--dtype", "int4", "--granularity", "block", "--block-size", "64",
                     "-o", tmp_path / "b64.aimodel", "--json")  # fmt: skip
    assert blocks.exit_code == 0, blocks.stderr
    report = json.loads(blocks.stdout)["report"]
    assert sorted(w["name"] for w in report["weights"]) == [
        f"model.layers.{i}.mlp.down_proj.weight" for i in (0, 1)
    ]
    (warning,) = [w for w in report["warnings"] if "kept uncompressed" in w]
    misfits = [s for s in report["skipped"] if s["kind"] == "layout"]
    assert warning.startswith(f"{len(misfits)} weights kept uncompressed, ")
    assert "not a multiple of block_size 64" in warning and misfits[0]["name"] in warning
    # one bits/weight: the program's figure of the compression report is inspect's (and compare's)
    program_bits = inspect_model(tmp_path / "b64.aimodel").mean_bits_per_weight
    assert report["model_bits_per_weight"] == pytest.approx(program_bits, rel=1e-12)
    assert report["bits_per_weight"] < 5.1 < program_bits


def test_resnet_conv_weights_keep_their_names_with_batch_norm_folded(tmp_path: Path, coreopt) -> None:  # type: ignore[no-untyped-def]
    from transformers import ResNetConfig, ResNetForImageClassification

    import coreai_opt
    from coreai_opt.inspection import inspect_model

    torch.manual_seed(0)
    config = ResNetConfig(
        embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_labels=5, layer_type="basic"
    )
    model = ResNetForImageClassification(config).eval()  # batch norms at their initial statistics
    pixels = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    path = tmp_path / "resnet.pt2"
    _export_as_readme_says(model, pixels, path)
    with torch.no_grad():
        expected = model(pixels).logits
    (out,) = coreai_opt.load(path).module()(pixels)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)

    aimodel = tmp_path / "resnet.aimodel"
    assert coreopt("convert", path, "-o", aimodel).exit_code == 0
    names = _weight_names(inspect_model(aimodel))
    assert len(names) == len(set(names))
    convs = [n for n in names if n.endswith(".weight.bn_folded")]
    assert len(convs) == sum(isinstance(m, torch.nn.Conv2d) for m in model.modules()) and all(
        n.startswith("resnet.") for n in convs
    ), names
    assert "resnet.embedder.embedder.convolution.weight.bn_folded" in convs
    assert not [n for n in names if _NODE_NAME.match(n) or re.match(r"^w\d+$", n)], names
    (runtime,) = run_aimodel(aimodel, {"pixel_values": pixels.numpy()}).values()
    np.testing.assert_allclose(runtime.reshape(expected.shape), expected.numpy(), rtol=1e-4, atol=1e-4)


def test_nested_foreign_containers_flatten_in_declared_order() -> None:
    from coreai_opt.io._treespec import flatten_unknown_outputs

    leaf = {"type": None, "context": None, "children_spec": []}
    inner = {"type": "lib.Pair", "context": '["a", "b"]', "children_spec": [leaf, leaf]}
    root = {"type": "builtins.dict", "context": '["x", "y"]', "children_spec": [inner, leaf]}
    spec = json.dumps([1, {"type": "other.Output", "context": '["out"]', "children_spec": [root]}])
    document = {"graph_module": {"module_call_graph": [{"fqn": "", "signature": {"out_spec": spec}}]}}
    found = flatten_unknown_outputs(document)
    assert [(f.container, f.fields) for f in found] == [("other.Output", ("out",)), ("lib.Pair", ("a", "b"))]
    _, rewritten = json.loads(document["graph_module"]["module_call_graph"][0]["signature"]["out_spec"])
    assert rewritten["type"] == "builtins.tuple" and rewritten["context"] == "null"
    kept = rewritten["children_spec"][0]
    assert kept["type"] == "builtins.dict" and kept["context"] == '["x", "y"]'  # torch's own: kept
    assert kept["children_spec"][0]["type"] == "builtins.tuple"
