"""Conversion of `torch.export` programs to Core AI through coreai-torch."""

from ._convert import ConversionResult, convert_exported_program, convert_file

__all__ = ["ConversionResult", "convert_exported_program", "convert_file"]
