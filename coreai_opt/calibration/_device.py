"""The device a calibration runs on: the graph's tensors made there, and whether its Fisher pass
takes its products in bfloat16.

`torch.export` records the device a graph's tensor factories were traced on, so a program moved to
a GPU is pointed there first (`place_factories`); and only a CPU with bfloat16 instructions runs
the Fisher pass's weight products in bfloat16 (`bfloat16_products`) - a GPU keeps the program's
dtypes. `ProgramCalibration` calls both through this module when it is made, so a test that
stands in for a CPU with bfloat16 instructions replaces `bfloat16_products` here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch.fx import GraphModule


def bfloat16_products(device: torch.device) -> bool:
    """Whether the Fisher pass takes its weights' products in bfloat16 here (`_fisher`, fast
    gradients): on a CPU with bfloat16 instructions (`coreai_opt._cpu.native_bfloat16`). A GPU keeps
    the program's dtypes."""
    from coreai_opt._cpu import native_bfloat16

    return device.type == "cpu" and native_bfloat16()


def place_factories(gm: GraphModule, device: torch.device) -> None:
    """Point the graph's tensor factories (a causal mask's `full`, `arange`, `_to_copy`) at
    `device`: torch.export records the device they were traced on, and a graph moved to a GPU
    would still build those tensors on the CPU."""
    import torch

    changed = False
    for node in gm.graph.nodes:
        placed = node.kwargs.get("device") if node.op == "call_function" else None
        if placed is not None and torch.device(placed) != device:
            node.kwargs = {**node.kwargs, "device": device}
            changed = True
    if changed:
        gm.recompile()
