"""coreopt: shrink PyTorch models for Apple's Core AI stack.

`load(path)` opens a `.pt2` or `.aimodel`. Subpackages: `io` (model files), `models` (Hugging
Face folders and GGUF files to `.pt2`), `evaluation` (perplexity, KL, top-1 on text),
`inspection` (what a model holds), `conversion` (torch.export -> Core AI), `casting`,
`compression`, `quantization` (weights and activations), `optimization` (`optimize`: mixed
precision under a budget).
Nothing heavy is imported here.
"""

__version__ = "0.1.0"
__all__ = ["ExportBackend", "__version__", "load", "optimize"]


def load(path: str | object, *, trust_pickle: bool = False) -> object:
    """A model file as every coreopt command opens it: a `.pt2` as an `ExportedProgram` (checked
    before anything in it runs; coreai-torch's compression ops registered when it calls them, so a
    compressed program runs with `.module()`), an `.aimodel` as a coreai-core program."""
    from pathlib import Path

    from coreai_opt.io import ModelFormat, load_aimodel, load_pt2, model_format, require_existing

    path = Path(path)  # type: ignore[arg-type]
    require_existing(path)
    if model_format(path) is ModelFormat.PT2:
        return load_pt2(path, trust_pickle=trust_pickle)
    return load_aimodel(path)


def __getattr__(name: str) -> object:
    if name == "ExportBackend":  # the seed's `from coreai_opt import ExportBackend`
        from coreai_opt.quantization import ExportBackend

        return ExportBackend
    if name == "optimize":  # coreai_opt.optimize(program, budget, calibration, evaluation)
        from coreai_opt.optimization import optimize

        return optimize
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
