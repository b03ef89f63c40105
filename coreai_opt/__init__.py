"""coreopt: shrink PyTorch models for Apple's Core AI stack.

Subpackages: `io` (model files), `inspection` (what a model holds), `conversion`
(torch.export -> Core AI). Nothing heavy is imported here.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
