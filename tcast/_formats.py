"""`number(code)`: a NumberSpec or a Codebook from a code, a common name or a torch dtype - the one
factory above both kinds of element format (so neither module needs the other)."""

from __future__ import annotations

from typing import Any

from ._codebook import parse
from ._number import NumberSpec


def number(code: Any) -> Any:
    """A NumberSpec from a code, a common name, or a torch dtype; a tcast.Codebook from a code
    starting `cb` (or a Codebook given)."""
    if isinstance(code, NumberSpec) or getattr(code, "is_codebook", False):
        return code
    if isinstance(code, str) and code.strip().lower().startswith(("cb", "icb")):
        return parse(code)
    return NumberSpec(code)
