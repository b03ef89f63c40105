"""`coreopt eval --device cuda` of the 1.1B benchmark decoder: 65,536 tokens, timed, with its peaks.

    python bench/eval_device.py [--size 1.1b] [--sequence 512] [--tokens 65536] [--device cuda]
                                [--out PATH]

The decoder of bench/decoders.py (seeded random weights; TinyLlama's shape at 1.1B) exported at
`--sequence` tokens in fp16 (the reference) and in fp32 (the candidate: the same weights; a GPU
image without coreai-torch cannot load a compressed program, whose decoding ops are coreai-torch's),
and `--tokens` seeded random token ids in a safetensors file; then `evaluate_text(reference,
[candidate], tokens=..., device=...)`: both programs window by window in lockstep on the device.
Printed and written to `--out` (JSON): the seconds of the exports and of the evaluation, its
numbers, the peak GPU memory and the process's peak host RSS. The weights are random: the numbers
say how fast and how large, not how accurate.
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

    parser = decoders.device_parser(__doc__, "eval_device")
    parser.add_argument("--tokens", type=int, default=65536)
    args = parser.parse_args()

    from coreai_opt.evaluation import EvalConfig, evaluate_text

    began = time.perf_counter()
    reference = decoders.program(args.size, sequence=args.sequence)
    candidate = decoders.program(args.size, fp32=True, sequence=args.sequence)
    exported = time.perf_counter() - began
    ids = decoders.token_file(reference, args.size, args.tokens)
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    began = time.perf_counter()
    result = evaluate_text(reference, [candidate], tokens=ids, config=EvalConfig(device=args.device))
    seconds = time.perf_counter() - began
    row = {
        "size": args.size, "sequence": args.sequence, "tokens": result.windows.scored,
        "windows": len(result.windows.starts), "export_s": round(exported, 1), "eval_s": round(seconds, 1),
        "reference": result.reference.to_dict(), "candidate": result.candidates[0].to_dict(),
    }  # fmt: skip
    decoders.report(row, args.device, args.out)


if __name__ == "__main__":
    main()
