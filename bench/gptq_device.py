"""GPTQ and SparseGPT on the GPU against the CPU: the same codes, and the solve's time at 1.1B.

    python bench/gptq_device.py [--rows 65536] [--cpu NAME ...] [--loop]

For each weight shape of the 1.1B benchmark decoder (bench/decoders.py: TinyLlama's shape, dim
2048, MLP 5632, 4 KV heads, vocabulary 32000), a seeded random weight and the input Gram matrix
of `--rows` correlated input rows (128 x 512 calibration tokens by default) go through
`quantize --method gptq` (int4 per channel, uint4 asymmetric blocks of 32, MXFP4),
`palettize --method gptq` (LUT4 grouped by 16) and `sparsify --method sparsegpt` (50%, 2:4) on the
GPU, and - for the shapes named by `--cpu` - on the CPU too, comparing the stored codes and masks
element for element (the GPU runs GPTQ's fused block kernel, the CPU its torch loop). Prints per
method the solve time of one decoder layer, of the whole decoder (22 layers and the head), and the
agreement; `--loop` also times one layer on the GPU with the torch loop instead of the kernel.
The calibration forward passes are not in these times (they need the exported program, whose
decompositions come from coreai-torch); this measures what the methods add on top of them.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = {  # name: (out, in), per decoder layer unless "head"
    "q_proj": (2048, 2048),
    "k_proj": (256, 2048),
    "v_proj": (256, 2048),
    "o_proj": (2048, 2048),
    "gate_proj": (5632, 2048),
    "up_proj": (5632, 2048),
    "down_proj": (2048, 5632),
    "lm_head": (32000, 2048),
}
LAYERS = 22


def _gram(columns: int, rows: int, device: str, seed: int) -> torch.Tensor:
    generator = torch.Generator(device="cpu").manual_seed(seed)
    mix = (torch.randn(columns, columns, generator=generator) / math.sqrt(columns)).to(device)
    total = torch.zeros(columns, columns, dtype=torch.float64, device=device)
    for start in range(0, rows, 8192):
        count = min(8192, rows - start)
        x = torch.randn(count, columns, generator=generator).to(device) @ mix
        x[:, :16] *= 6.0  # a few loud channels, as language models have
        total += (x.T @ x).double()
    return total / rows


def _configs() -> dict[str, object]:
    from coreai_opt.compression import PalettizeConfig, QuantizeConfig, SparsifyConfig

    return {
        "gptq int4 channel": QuantizeConfig(dtype="int4", method="gptq"),
        "gptq uint4 block32": QuantizeConfig(
            dtype="uint4", qscheme="asym", granularity="block", block_size=32, method="gptq"
        ),
        "gptq mxfp4": QuantizeConfig(dtype="mxfp4", method="gptq"),
        "gptq lut4 group16": PalettizeConfig(
            n_bits=4, granularity="grouped", group_size=16, method="gptq", num_kmeans_workers=0
        ),
        "sparsegpt 50%": SparsifyConfig(target_sparsity=0.5, method="sparsegpt"),
        "sparsegpt 2:4": SparsifyConfig(n_m_ratio=(2, 4), method="sparsegpt"),
    }


def _codes(encoding: object) -> np.ndarray:
    form = encoding.form  # type: ignore[attr-defined]
    if hasattr(form, "lut"):
        return np.asarray(form.indices.values).view(np.uint8).reshape(-1)
    if hasattr(form, "mask"):
        return np.concatenate(
            [form.mask.reshape(-1).astype(np.uint8), np.asarray(form.kept.values).view(np.uint8).reshape(-1)]
        )
    return np.asarray(form.data.values).view(np.uint8).reshape(-1)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=128 * 512)
    parser.add_argument("--cpu", nargs="*", default=["k_proj", "q_proj", "down_proj"])
    parser.add_argument("--loop", action="store_true", help="also time a layer with the torch loop")
    args = parser.parse_args()
    from coreai_opt._elements import element
    from coreai_opt.compression import algorithm_for
    from coreai_opt.weights import Statistics, WeightSite

    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {torch.get_num_threads()} CPU threads")
    grams = {columns: _gram(columns, args.rows, "cuda", columns) for columns in (2048, 5632)}
    rows = []
    for label, config in _configs().items():
        encode = algorithm_for(config).encode()
        layer = head = 0.0
        agree, compared = 0, 0
        for name, (out, inputs) in SHAPES.items():
            generator = torch.Generator().manual_seed(out * 7 + inputs)
            w = (torch.randn(out, inputs, generator=generator) * 0.02).half()
            site = WeightSite(None, name, (out, inputs), element("f16"), 0, 1)
            gram = grams[inputs]
            statistics = Statistics(args.rows, moments=torch.diagonal(gram), gram=gram)
            encode(w, site, config, statistics)  # warm-up (kernels compiled, memory pooled)
            torch.cuda.synchronize()
            begun = time.perf_counter()
            on_gpu = encode(w, site, config, statistics)
            torch.cuda.synchronize()
            seconds = time.perf_counter() - begun
            if name == "lm_head":
                head = seconds
            else:
                layer += seconds
            if name in args.cpu:
                cpu = Statistics(args.rows, moments=torch.diagonal(gram).cpu(), gram=gram.cpu())
                begun = time.perf_counter()
                on_cpu = encode(w, site, config, cpu)
                cpu_seconds = time.perf_counter() - begun
                same = _codes(on_gpu) == _codes(on_cpu)
                agree += int(same.sum())
                compared += same.size
                print(f"  {label:20s} {name:10s} GPU {seconds:6.2f} s  CPU {cpu_seconds:6.1f} s  "
                      f"codes equal {same.mean():.6f}  data SNR GPU {on_gpu.learned.snr_db:.3f} CPU {on_cpu.learned.snr_db:.3f} dB")  # fmt: skip
        total = layer * LAYERS + head
        loop = _loop_layer(encode, config, grams, args.rows) if args.loop and "gptq" in label else math.nan
        rows.append((label, layer, total, agree / max(compared, 1), loop))
    print(f"\n{'method':22s} {'one layer s':>12s} {'1.1B decoder s':>15s} {'codes equal CPU/GPU':>20s} "
          f"{'torch loop: one layer s':>24s}")  # fmt: skip
    for label, layer, total, equal, loop in rows:
        print(f"{label:22s} {layer:12.2f} {total:15.1f} {equal:20.6f} {loop:24.2f}")


def _loop_layer(encode: object, config: object, grams: dict[int, torch.Tensor], rows: int) -> float:
    """One decoder layer's GPTQ on the GPU with the torch loop over columns (no fused kernel)."""
    from coreai_opt._elements import element
    from coreai_opt.compression.algorithms import _gptq
    from coreai_opt.weights import Statistics, WeightSite

    default = _gptq._fused_by_default
    _gptq._fused_by_default = lambda device: False
    try:
        seconds = 0.0
        for name, (out, inputs) in SHAPES.items():
            if name == "lm_head":
                continue
            generator = torch.Generator().manual_seed(out * 7 + inputs)
            w = (torch.randn(out, inputs, generator=generator) * 0.02).half()
            site = WeightSite(None, name, (out, inputs), element("f16"), 0, 1)
            gram = grams[inputs]
            torch.cuda.synchronize()
            begun = time.perf_counter()
            encode(w, site, config, Statistics(rows, moments=torch.diagonal(gram), gram=gram))  # type: ignore[operator]
            torch.cuda.synchronize()
            seconds += time.perf_counter() - begun
        return seconds
    finally:
        _gptq._fused_by_default = default


if __name__ == "__main__":
    main()
