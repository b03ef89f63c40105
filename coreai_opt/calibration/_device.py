"""The device a calibration runs on: whether its Fisher pass takes its products in bfloat16.

Only a CPU with bfloat16 instructions runs the Fisher pass's weight products in bfloat16
(`bfloat16_products`) - a GPU keeps the program's dtypes. `ProgramCalibration` calls it through
this module when it is made, so a test that stands in for a CPU with bfloat16 instructions
replaces `bfloat16_products` here. (The program itself is moved there by `_export.runnable`.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def bfloat16_products(device: torch.device) -> bool:
    """Whether the Fisher pass takes its weights' products in bfloat16 here (`_fisher`, fast
    gradients): on a CPU with bfloat16 instructions (`coreai_opt._cpu.native_bfloat16`). A GPU keeps
    the program's dtypes."""
    from coreai_opt._cpu import native_bfloat16

    return device.type == "cpu" and native_bfloat16()
