"""Where coreopt keeps what it may recompute (calibration statistics, compiled kernels): one folder
per kind under ~/.cache/coreopt."""

from __future__ import annotations

from pathlib import Path


def user_cache(kind: str) -> Path:
    """~/.cache/coreopt/<kind> (not created here)."""
    return Path.home() / ".cache" / "coreopt" / kind
