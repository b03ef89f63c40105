"""`coreopt quantize|palettize|sparsify`, and a command for every pass a plugin registers: the
weight passes of `coreai_opt.compression.registry`, each a one-step recipe whose options are its
config's fields (`_weights`)."""

from __future__ import annotations

import typer

from ._weights import command_of

_PALETTIZE_DOC = """Palettize weights with exact optimal k-means look-up tables and report every weight.

Example: coreopt palettize sample_models/transformer.aimodel --nbits 4 -o build/t.lut4.aimodel

Example: coreopt palettize model.pt2 --nbits 4 -o model.lut4.pt2   (coreai-torch ops; convert later)

Example: coreopt palettize model.aimodel --nbits 4 --granularity grouped --group-size 16 --lut-dtype int8

Example: coreopt palettize model.aimodel --nbits 2 --cluster-dim 2 --override 'head*:nbits=8' --json

Example: RAY_ADDRESS=auto coreopt palettize big.aimodel --nbits 4 --executor ray   (on a Ray cluster)

Example: coreopt palettize model.pt2 --nbits 4 --granularity grouped --group-size 16 --method gptq --calibration text.txt

Example: coreopt palettize model.aimodel --nbits 3 --method sensitive --calibration text.txt --calibration-program model.pt2
"""
_SPARSIFY_DOC = """Prune weights to a bitmask-sparse form (optionally quantized or palettized) and report every weight.

Example: coreopt sparsify sample_models/transformer.aimodel --sparsity 0.5 -o build/t.sparse.aimodel

Example: coreopt sparsify model.pt2 --nm 2:4 --quantize int8 -o model.2of4.pt2

Example: coreopt sparsify model.aimodel --nm 2:4 --quantize int8

Example: coreopt sparsify model.aimodel --sparsity 0.75 --block-size 4 --palettize 4 --json

Example: coreopt sparsify model.pt2 --sparsity 0.5 --method sparsegpt --calibration samples/ --device cuda
"""


def register(app: typer.Typer) -> None:
    """A command per registered pass (`quantize` with W8A8's options besides)."""
    from coreai_opt.compression import config_types

    from .quantize import quantize_command

    for kind, config_type in config_types().items():
        if kind == "quantize":
            app.command(kind)(quantize_command())
            continue
        doc, verb, output = _PASSES.get(kind, (_doc_of(config_type), "compressing", _OUTPUT))
        app.command(kind)(command_of(config_type, verb, doc, output))


_OUTPUT = "Output file (default: model.<tag>.<suffix> beside the input)."
_PASSES = {
    "palettize": (_PALETTIZE_DOC, "palettizing", "Output file (default: model.lut<nbits>.<suffix> beside the input)."),
    "sparsify": (_SPARSIFY_DOC, "sparsifying", "Output file (default: model.sparse<..>.<suffix> beside the input)."),
}  # fmt: skip


def _doc_of(config_type: type) -> str:
    """A plugin pass's help: its config's docstring, first paragraph."""
    return (config_type.__doc__ or config_type.__name__).strip().split("\n\n")[0]
