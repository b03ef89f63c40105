"""Inputs for checks and comparisons: one policy for drawing them, one reader for files of them.

When a user gives no inputs, each one is drawn to look like real data: integers that index a
table from that table's range, integers and booleans that feed arithmetic or masks from {0, 1}
(an attention mask), floats from the standard normal. The policy reads how each input is used
from the program itself - a `torch.export` graph or a Core AI program - and every report says
how each input was drawn. `--inputs FILE|DIR` (safetensors, one tensor per input, optionally
holding N samples: a leading sample axis, or N along an input's batch dim of 1; a directory of
such files) gives real data instead.
"""

from ._files import InputSamples, read_input_samples, read_inputs_file
from ._policy import (
    Draw,
    InputRule,
    InputSpec,
    Kind,
    Usage,
    draw_inputs,
    input_rules,
    seeded_samples,
    seeded_source,
)
from ._usage import drawn_inputs, exported_program_specs, exported_program_usage, user_input_nodes

__all__ = [
    "Draw",
    "InputRule",
    "InputSamples",
    "InputSpec",
    "Kind",
    "Usage",
    "draw_inputs",
    "drawn_inputs",
    "exported_program_specs",
    "exported_program_usage",
    "input_rules",
    "read_input_samples",
    "read_inputs_file",
    "seeded_samples",
    "seeded_source",
    "user_input_nodes",
]
