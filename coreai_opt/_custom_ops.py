"""coreai-torch's own ops (`torch.ops.coreai.*`), defined in this process on demand: torch cannot
deserialize a call of an op it does not know, and `io` must read their schemas before it hands a
compressed program to torch (`_export` decodes them; both come here)."""

from __future__ import annotations

import warnings
from typing import Any


def register_coreai_ops() -> Any:
    """Define coreai-torch's custom ops in this process (idempotent); returns `torch.ops.coreai`."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # coreai-torch warns about the torch version on import
        import coreai_torch._compression.custom_layers  # noqa: F401  (defines the ops)
    return torch.ops.coreai
