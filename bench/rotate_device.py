"""`coreopt transform --rotate learned` on a GPU: the 1.1B benchmark decoder, timed, with its peaks.

    python bench/rotate_device.py [--size 1.1b] [--sequence 512] [--samples 8] [--device cuda]
                                  [--steps 300] [--out PATH]

The decoder of bench/decoders.py (seeded random weights, fp16; TinyLlama's shape at 1.1B) exported
at `--sequence` tokens, then rotated as `coreopt transform MODEL --rotate learned --calibration
random --calibration-samples N --device D` does: a recipe of one transform step through
`apply_recipe` - the load, the calibration on `--samples` seeded random token windows (8 x 512 =
4,096 tokens, as on SmolLM2), the norms folded, the Gram matrices taken layer by layer, the Cayley
steps, the weights turned, the check against the original on the device, the save. Printed and
written to `--out` (JSON): the export and the transform's seconds, the rounding loss before and
after, the check, the peak GPU memory and the process's peak host RSS.

A machine without coreai-torch exports with torch's own decompositions (the rotation needs none of
coreai's ops, and never imports coreai on an uncompressed program).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def main() -> None:
    import decoders

    parser = decoders.device_parser(__doc__, "rotate_device")
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()

    from coreai_opt.calibration import CalibrationSpec
    from coreai_opt.recipes import Recipe, Transform, apply_recipe
    from coreai_opt.transforms import RotateConfig

    began = time.perf_counter()
    source = decoders.program(args.size, sequence=args.sequence)
    exported = time.perf_counter() - began
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    recipe = Recipe(
        (Transform(config=RotateConfig(rotation="learned", steps=args.steps)),),
        CalibrationSpec(source="random", samples=args.samples, device=args.device),
    )
    began = time.perf_counter()
    result = apply_recipe(recipe, source, source.with_name(source.stem + ".rotated.pt2"), force=True)
    seconds = time.perf_counter() - began
    ((_, report),) = result.steps
    row = {
        "size": args.size, "sequence": args.sequence, "samples": args.samples, "steps": args.steps,
        "export_s": round(exported, 1), "transform_s": round(seconds, 1),
        "changes": [line for line in report.changes if line.startswith(("rotation learned", "residual"))],
        "check": report.equivalence.to_dict(),
    }  # fmt: skip
    decoders.report(row, args.device, args.out)


if __name__ == "__main__":
    main()
