"""Conversion of `torch.export` programs to Core AI through coreai-torch."""

from ._convert import ConverterFailure, convert_exported_program, convert_with_log

__all__ = ["ConverterFailure", "convert_exported_program", "convert_with_log"]
