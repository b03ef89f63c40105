"""`coreopt sensitivity --device cuda` of the benchmark decoders: every weight's trial on a GPU, timed.

    python bench/sensitivity_device.py [--size 1.1b] [--sequence 512] [--tokens 4096] [--device cuda]
                                       [--config quantize:dtype=int4] [--check] [--out PATH]

The decoder of bench/decoders.py (seeded random weights; TinyLlama's shape at 1.1B) exported at
`--sequence` tokens in fp32, and `--tokens` seeded random token ids in a safetensors file; then
`weight_sensitivity(program, config, tokens=..., device=...)`: each weight compressed alone
(encoded on the host), the program rerun from that weight's first reader on the device. With
`--check` the same measurement runs on the CPU too (exact products) and the largest relative
difference of a weight's KL is reported. Printed and written to `--out` (JSON): the seconds, the
most and least sensitive weights, the peak GPU memory and the process's peak host RSS. The weights
are random: the numbers say how fast and how large, not how accurate.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]  # coreai_opt from this checkout, and decoders


def main() -> None:
    import decoders

    parser = decoders.device_parser(__doc__, "sensitivity_device")
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--config", default="quantize:dtype=int4,weight_num_threshold=0")
    parser.add_argument("--check", action="store_true", help="also measure on the CPU and compare")
    args = parser.parse_args()

    from coreai_opt.evaluation import weight_sensitivity
    from coreai_opt.recipes import config_from_text

    began = time.perf_counter()
    program = decoders.program(args.size, fp32=True, sequence=args.sequence)
    exported = time.perf_counter() - began
    ids = decoders.token_file(program, args.size, args.tokens)
    config = config_from_text(args.config)
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    began = time.perf_counter()
    result = weight_sensitivity(program, config, tokens=ids, device=args.device)
    seconds = time.perf_counter() - began
    row = {
        "size": args.size, "sequence": args.sequence, "tokens": result.windows.scored, "config": args.config,
        "weights": len(result.weights), "export_s": round(exported, 1), "sensitivity_s": round(seconds, 1),
        "reference_perplexity": result.reference_perplexity,
        "most": [(w.name, w.kl_mean) for w in result.weights[:3]],
        "least": [(w.name, w.kl_mean) for w in result.weights[-3:]],
    }  # fmt: skip
    if args.check:
        began = time.perf_counter()
        cpu = weight_sensitivity(program, config, tokens=ids, exact_products=True)
        on_cpu = {w.name: w.kl_mean for w in cpu.weights}
        row["cpu_s"] = round(time.perf_counter() - began, 1)
        row["kl_max_relative_difference"] = max(
            abs(w.kl_mean - on_cpu[w.name]) / max(on_cpu[w.name], 1e-30) for w in result.weights
        )
        row["same_ranking"] = [w.name for w in result.weights] == [w.name for w in cpu.weights]
    decoders.report(row, args.device, args.out)


if __name__ == "__main__":
    main()
