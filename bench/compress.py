"""Wall time of weight quantization on the sample transformer and a synthetic BERT-base.

    python bench/compress.py [--repeat 3] [--models transformer bert-base]

The BERT-base stand-in (12 layers, hidden 768, FFN 3072, 30,522-token vocabulary; 108.9M
parameters in fp16, 12 heads, sequence 128) is exported, converted with coreai-torch and cached
under build/bench/. For each configuration the table gives the median over --repeat runs (after
a warm-up run) of three timings: `compress_` on a loaded program (the compression itself),
`quantize_weights` (the seed API: a deep copy, then the same), and `quantize_file` (load,
compress, save the asset); `pt2 s` times `compress_` on the `.pt2` the asset was converted from
(the .pt2 route: coreai-torch's ops, no full-precision `.aimodel` needed) and `pt2/ai` its ratio
to `core s` (goal, issue 18: at most 1.2). Goal (issue 5): under 2.5 s per configuration on BERT-base for int8
per channel, int4 per block and fp8 on a 2-core machine (the peer library: about 5 s).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from coreai_opt.coreai_utils import (
    CompressionGranularity,
    DType,
    QScheme,
    QuantizeConfig,
    compress_,
    quantize_weights,
)
from coreai_opt.io import load_aimodel, load_pt2
from coreai_opt.recipes import quantize_file

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "build" / "bench"
G = CompressionGranularity

CONFIGS: list[tuple[str, dict]] = [
    ("int8 sym per channel", {"dtype": DType.INT8, "granularity": G.PER_CHANNEL}),
    ("int4 sym per block 32", {"dtype": DType.INT4, "granularity": G.PER_BLOCK}),
    ("fp8e4m3 per channel", {"dtype": DType.FP8_E4M3FN, "granularity": G.PER_CHANNEL}),
    ("uint4 asym per block 32", {"dtype": DType.UINT4, "qscheme": QScheme.ASYMMETRIC, "granularity": G.PER_BLOCK}),
    ("fp8e4m3 e8m0 per block 32", {"dtype": DType.FP8_E4M3FN, "granularity": G.PER_BLOCK,
                                   "scale_dtype": DType.FP8_E8M0FNU}),
    ("mxfp4 (e2m1, e8m0 / 32)", {"dtype": DType.FP4_E2M1FN, "granularity": G.PER_BLOCK}),
]  # fmt: skip


class _Layer(nn.Module):
    def __init__(self, dim: int = 768, hidden: int = 3072, heads: int = 12) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.ff1, self.ff2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        attn = torch.softmax(q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5, dim=-1) @ v
        x = x + self.out(attn.transpose(1, 2).reshape(b, t, d))
        return x + self.ff2(nn.functional.gelu(self.ff1(self.norm2(x))))


class BertBase(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(30522, 768), nn.Embedding(512, 768)
        self.layers = nn.ModuleList(_Layer() for _ in range(12))
        self.norm = nn.LayerNorm(768)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1]))
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


def bert_base_program() -> Path:
    """Build (once) the fp16 BERT-base-shaped `.pt2`, exported with coreai-torch's decompositions."""
    path = CACHE / "bert_base.pt2"
    if path.is_file():
        return path
    import coreai_torch

    from coreai_opt.io import save_pt2

    torch.manual_seed(0)
    model = BertBase().eval().half()
    with torch.no_grad():
        program = torch.export.export(model, (torch.randint(0, 30522, (1, 128)),))
        program = program.run_decompositions(coreai_torch.get_decomp_table())
    CACHE.mkdir(parents=True, exist_ok=True)
    return save_pt2(program, path)


def bert_base_asset() -> Path:
    """Build (once) the fp16 BERT-base-shaped asset, converted from `bert_base_program()`."""
    path = CACHE / "bert_base.aimodel"
    if path.is_dir():
        return path
    from coreai_opt.recipes import convert_file

    return convert_file(bert_base_program(), path).output


def _median(run: Callable[[], float], repeat: int) -> float:
    times = [run() for _ in range(repeat + 1)]
    return statistics.median(times[1:])


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench(path: Path, pt2: Path, name: str, repeat: int) -> list[str]:
    rows = []
    for label, options in CONFIGS:

        def in_memory(options: dict = options) -> float:
            program = load_aimodel(path)
            return _timed(lambda: compress_(program, QuantizeConfig(**options)))

        def exported(options: dict = options) -> float:
            program = load_pt2(pt2)
            return _timed(lambda: compress_(program, QuantizeConfig(**options)))

        def seed_api(options: dict = options) -> float:
            program = load_aimodel(path)
            return _timed(lambda: quantize_weights(program, **options))

        def whole_file(options: dict = options) -> float:
            with tempfile.TemporaryDirectory() as tmp:
                return _timed(lambda: quantize_file(path, Path(tmp) / "q.aimodel", QuantizeConfig(**options)))

        report = compress_(load_aimodel(path), QuantizeConfig(**options))
        elements = report.elements / 1e6
        core = _median(in_memory, repeat)
        route = _median(exported, repeat)
        rows.append(
            f"{name:<12} {label:<26} {len(report.weights):>4} {elements:>8.1f} {core:>8.3f} "
            f"{elements / core:>8.0f} {_median(seed_api, repeat):>8.3f} {_median(whole_file, repeat):>8.3f} "
            f"{route:>8.3f} {route / core:>6.2f} {report.bits_per_weight or 0:>6.2f}"
        )
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    warnings.filterwarnings("ignore")
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--models", nargs="+", default=["transformer", "bert-base"])
    args = parser.parse_args()
    paths = {"transformer": ROOT / "sample_models" / "transformer.aimodel"}
    programs = {"transformer": ROOT / "sample_models" / "transformer.pt2"}
    if "bert-base" in args.models:
        paths["bert-base"], programs["bert-base"] = bert_base_asset(), bert_base_program()
    print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.machine()}, "
          f"median of {args.repeat} after a warm-up")  # fmt: skip
    print(f"{'model':<12} {'configuration':<26} {'wts':>4} {'M elem':>8} {'core s':>8} {'M el/s':>8} "
          f"{'seed s':>8} {'file s':>8} {'pt2 s':>8} {'pt2/ai':>6} {'bits/w':>6}")  # fmt: skip
    for name in args.models:
        bench(paths[name], programs[name], name, args.repeat)


if __name__ == "__main__":
    main()
