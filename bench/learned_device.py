"""Compression that learns from data on a GPU: the 1.1B benchmark decoder end to end.

    python bench/learned_device.py [--size 1.1b] [--sequence 512] [--samples 128] [--device cuda]
                                   [--methods NAME ...] [--compare-cpu 0.1b] [--out PATH]

The decoder of bench/decoders.py (seeded random weights, fp16; TinyLlama's shape at 1.1B) is
exported at `--sequence` tokens and calibrated on `--samples` seeded random token windows (128 x
512 = 65,536 tokens by default). Each method runs the library's own flow, as `coreopt quantize |
palettize | sparsify --calibration ... --device` does: load the program, `calibrate(...,
device=...)` with the statistics cache off (every method pays for its own forward passes),
`compress_`, `save_pt2`. Printed per method: load, calibrate + compress and save seconds, and
peak GPU memory. With `--compare-cpu SIZE`, the methods also run on a SIZE decoder on the CPU and
on the device (8 samples), and every stored tensor of the two results is compared element for
element. Rows are written to `--out` (JSON) as they finish, so a run cut off resumes there.

A GPU machine without coreai-core (its image has torch, numba, safetensors, typer, rich) takes a
site folder on PYTHONPATH: coreai-core's and coreai-torch's wheels for its Python, plus strenum
and yuvio, unpacked, with coreai/runtime/ (native libraries, ~150 MB, never called on a `.pt2`)
replaced by a module that defines the names coreai.authoring imports (AIModel,
AIModelAssetMetadata, AIModelAssetSummary, SpecializationOptions, _AIModelAsset, _use_os_coreai).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def configs() -> dict[str, object]:
    from coreai_opt.compression import PalettizeConfig, QuantizeConfig, SparsifyConfig

    def lut(method: str) -> PalettizeConfig:
        return PalettizeConfig(n_bits=4, granularity="grouped", group_size=16, method=method,
                               num_kmeans_workers=0, weight_num_threshold=0)  # fmt: skip

    return {
        "int4-ch-gptq": QuantizeConfig(dtype="int4", method="gptq", weight_num_threshold=0),
        "uint4-b32-gptq": QuantizeConfig(
            dtype="uint4", granularity="block", block_size=32, method="gptq", weight_num_threshold=0
        ),
        "lut4-g16-sensitive": lut("sensitive"),
        "lut4-g16-importance": lut("importance"),
        "lut4-g16-gptq": lut("gptq"),
        "sparse50-sparsegpt": SparsifyConfig(target_sparsity=0.5, method="sparsegpt", weight_num_threshold=0),
        "sparse24-sparsegpt": SparsifyConfig(n_m_ratio=(2, 4), method="sparsegpt", weight_num_threshold=0),
        "mxfp4-gptq": QuantizeConfig(dtype="mxfp4", method="gptq", weight_num_threshold=0),
    }


def run(source: Path, config: object, samples: object, device: str, target: Path) -> dict[str, float]:
    """One method on one program, the library's flow, timed by phase."""
    from coreai_opt.calibration import calibrate
    from coreai_opt.compression import compress_
    from coreai_opt.io import UnwritableOutputError, load_pt2, save_pt2

    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    begun = time.perf_counter()
    program = load_pt2(source)
    loaded = time.perf_counter()
    calibration = calibrate(load_pt2(source), samples, cache=False, device=device)  # type: ignore[arg-type]
    report = compress_(program, config, calibration=calibration)  # type: ignore[arg-type]
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    compressed = time.perf_counter()
    del calibration
    gc.collect()
    failed = ""
    try:
        save_pt2(program, target, force=True)
    except UnwritableOutputError as error:  # e.g. E8M0 scales under torch < 2.12: timed up to here
        failed = str(error)
    saved = time.perf_counter()
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else 0.0
    row = {"load_s": loaded - begun, "compress_s": compressed - loaded, "save_s": saved - compressed,
           "total_s": saved - begun, "gpu_peak_gib": peak, "bits": report.bits_per_weight or 0.0,
           "weights": len(report.weights)}  # fmt: skip
    return {**row, "save_s": float("nan"), "save_failed": failed} if failed else row


def agreement(a: Path, b: Path) -> dict[str, float]:
    """Element-for-element agreement of every stored tensor of two programs; for integer codes
    (stored one a byte in a `.pt2`) also how many differ by more than one step, and the most."""
    from coreai_opt.io import load_pt2

    left, right = load_pt2(a), load_pt2(b)
    tensors_a = {**left.state_dict, **left.constants}
    tensors_b = {**right.state_dict, **right.constants}
    equal = total = int_equal = int_total = far = 0
    widest = 0
    for name, x in tensors_a.items():
        y = tensors_b[name]
        same = int((x == y).sum()) if x.shape == y.shape else 0
        equal, total = equal + same, total + x.numel()
        if not x.is_floating_point() and x.shape == y.shape:
            step = (x.long() - y.long()).abs()
            int_equal, int_total = int_equal + same, int_total + x.numel()
            far, widest = far + int((step > 1).sum()), max(widest, int(step.max()))
    return {"all_equal": equal / max(total, 1), "codes_equal": int_equal / max(int_total, 1),
            "codes_over_one_step": far / max(int_total, 1), "widest_step": float(widest)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1.1b")
    parser.add_argument("--sequence", type=int, default=512)
    parser.add_argument("--samples", type=int, default=128)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--methods", nargs="*", help="default: all")
    parser.add_argument("--compare-cpu", metavar="SIZE", help="also compare CPU and device codes at SIZE")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "bench" / "learned_device.json")
    args = parser.parse_args()
    from decoders import SHAPES, program

    from coreai_opt.calibration import Samples

    rows: dict[str, dict[str, float]] = json.loads(args.out.read_text()) if args.out.exists() else {}
    chosen = {k: v for k, v in configs().items() if not args.methods or k in args.methods}
    scratch = Path(tempfile.mkdtemp(prefix="learned_device_"))
    begun = time.perf_counter()
    source = program(args.size, sequence=args.sequence)
    print(f"{args.size} ({SHAPES[args.size].parameters / 1e9:.3f}B) at {args.sequence} tokens: "
          f"{source} ({time.perf_counter() - begun:.0f} s)", flush=True)  # fmt: skip
    samples = Samples.of("random", count=args.samples)
    for name, config in chosen.items():
        key = f"{args.size}/{args.device}/{name}"
        if key not in rows:
            rows[key] = run(source, config, samples, args.device, scratch / f"{name}.pt2")
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(rows, indent=1))
            (scratch / f"{name}.pt2").unlink(missing_ok=True)
        row = rows[key]
        print(f"{key:36s} load {row['load_s']:6.1f} s  calibrate+compress {row['compress_s']:7.1f} s  "
              f"save {row['save_s']:5.1f} s  total {row['total_s']:7.1f} s  GPU peak "
              f"{row['gpu_peak_gib']:5.1f} GiB  {row['bits']:.2f} bits/w {row.get('save_failed', '')}",
              flush=True)  # fmt: skip
    if args.compare_cpu:
        small = Samples.of("random", count=8)
        small_source = program(args.compare_cpu, sequence=args.sequence)
        for name, config in chosen.items():
            key = f"{args.compare_cpu}/cpu-vs-{args.device}/{name}"
            if key not in rows:
                paths = {d: scratch / f"{name}.{d.replace(':', '')}.pt2" for d in ("cpu", args.device)}
                for device, path in paths.items():
                    run(small_source, config, small, device, path)
                rows[key] = agreement(paths["cpu"], paths[args.device])
                args.out.write_text(json.dumps(rows, indent=1))
            row = rows[key]
            print(f"{key:36s} stored codes equal {row['codes_equal']:.6f} (over one step apart "
                  f"{row.get('codes_over_one_step', float('nan')):.6f}, widest {row.get('widest_step', 0):.0f}), "
                  f"all tensors {row['all_equal']:.6f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
