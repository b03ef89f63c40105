"""TensorCast: low-precision number formats and casts (the numeric core of coreopt)."""

__version__ = "0.1.0"
__all__ = ["__version__"]
