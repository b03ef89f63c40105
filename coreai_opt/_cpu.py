"""What this machine's CPU does fast: a fact the calibration and evaluation rooms both act on."""

from __future__ import annotations

import functools


@functools.cache
def native_bfloat16() -> bool:
    """Whether this CPU multiplies bfloat16 matrices in hardware (x86: AVX512-BF16 or AMX; other
    CPUs: what oneDNN reports), where its products run at 3-5x float32's speed; elsewhere
    bfloat16 is emulated, slower than float32."""
    import platform

    import torch

    try:
        if platform.machine().lower() in ("x86_64", "amd64", "i386", "i686"):
            return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False
