"""coreopt: shrink PyTorch models for Apple's Core AI stack.

Subpackages: `io` (model files), `inspection` (what a model holds), `conversion`
(torch.export -> Core AI), `casting`, `compression`, `quantization` (weights and activations).
Nothing heavy is imported here.
"""

__version__ = "0.1.0"
__all__ = ["ExportBackend", "__version__"]


def __getattr__(name: str) -> object:
    if name == "ExportBackend":  # the seed's `from coreai_opt import ExportBackend`
        from coreai_opt.quantization import ExportBackend

        return ExportBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
