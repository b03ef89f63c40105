"""Seeded random-weight LLaMA-style decoders for the scaling benchmarks (issue 21).

    python bench/decoders.py 0.1b 0.5b 1.1b      # build what is missing under build/bench/

Each size is a decoder of RMSNorm, grouped-query attention (q/k/v/o) and a SwiGLU MLP, with an
untied lm_head, in fp16: exported with coreai-torch's decompositions to `decoder_<size>.pt2`
and converted to `decoder_<size>.aimodel`. The weights are drawn from one seeded generator, so
every build of a size is the same model. Nothing here is committed; `bench/scaling.py` builds
what it needs.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "build" / "bench"


@dataclass(frozen=True)
class DecoderShape:
    dim: int
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    vocab: int = 32000

    @property
    def parameters(self) -> int:
        head = self.dim // self.heads
        attention = 2 * self.dim * self.dim + 2 * self.dim * self.kv_heads * head
        per_layer = attention + 3 * self.dim * self.hidden + 2 * self.dim
        return self.layers * per_layer + 2 * self.vocab * self.dim + self.dim


SHAPES = {
    "0.1b": DecoderShape(dim=768, layers=8, hidden=2048, heads=12, kv_heads=4),
    "0.5b": DecoderShape(dim=1536, layers=16, hidden=4096, heads=12, kv_heads=4),
    "1.1b": DecoderShape(dim=2048, layers=22, hidden=5632, heads=32, kv_heads=4),  # TinyLlama's shape
}
SEQUENCE = 64


class RMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(variance + 1e-5)).to(x.dtype) * self.weight


class Block(nn.Module):
    def __init__(self, s: DecoderShape) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head = s.heads, s.kv_heads, s.dim // s.heads
        self.attention_norm, self.mlp_norm = RMSNorm(s.dim), RMSNorm(s.dim)
        self.q_proj = nn.Linear(s.dim, s.dim, bias=False)
        self.k_proj = nn.Linear(s.dim, s.kv_heads * self.head, bias=False)
        self.v_proj = nn.Linear(s.dim, s.kv_heads * self.head, bias=False)
        self.o_proj = nn.Linear(s.dim, s.dim, bias=False)
        self.gate_proj = nn.Linear(s.dim, s.hidden, bias=False)
        self.up_proj = nn.Linear(s.dim, s.hidden, bias=False)
        self.down_proj = nn.Linear(s.hidden, s.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.attention_norm(x)
        q = self.q_proj(h).reshape(b, t, self.heads, self.head).transpose(1, 2)
        k = self.k_proj(h).reshape(b, t, self.kv_heads, self.head).transpose(1, 2)
        v = self.v_proj(h).reshape(b, t, self.kv_heads, self.head).transpose(1, 2)
        repeat = self.heads // self.kv_heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        causal = torch.full((t, t), float("-inf"), dtype=x.dtype).triu(1)
        scores = torch.softmax((q @ k.transpose(-2, -1)) * self.head**-0.5 + causal, dim=-1)
        x = x + self.o_proj((scores @ v).transpose(1, 2).reshape(b, t, d))
        h = self.mlp_norm(x)
        return x + self.down_proj(nn.functional.silu(self.gate_proj(h)) * self.up_proj(h))


class Decoder(nn.Module):
    def __init__(self, s: DecoderShape) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(s.vocab, s.dim)
        self.layers = nn.ModuleList(Block(s) for _ in range(s.layers))
        self.norm = RMSNorm(s.dim)
        self.lm_head = nn.Linear(s.dim, s.vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


def _decoder(size: str, dtype: torch.dtype = torch.float16) -> Decoder:
    """The model of a size in `dtype`, weights ~ N(0, 0.02) from one seeded generator (built in
    that dtype: a float32 copy of 1.1B parameters would need 4.4 GB more)."""
    with torch.device("meta"):
        model = Decoder(SHAPES[size])
    model = model.to_empty(device="cpu").to(dtype)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=generator, dtype=torch.float32).mul_(0.02))
    return model.eval()


def program(size: str, fp32: bool = False, sequence: int = SEQUENCE) -> Path:
    """Build (once) `build/bench/decoder_<size>.pt2` (fp32: `decoder_<size>_fp32.pt2`, the same
    weights in float32, for `coreopt cast`; another `sequence` length: `decoder_<size>_s<n>.pt2`)."""
    tail = ("_fp32" if fp32 else "") + ("" if sequence == SEQUENCE else f"_s{sequence}")
    path = CACHE / f"decoder_{size}{tail}.pt2"
    if path.is_file():
        return path
    from coreai_opt.io import save_pt2

    model = _decoder(size, torch.float32 if fp32 else torch.float16)
    with torch.no_grad():
        exported = torch.export.export(model, (torch.zeros(1, sequence, dtype=torch.long),))
        exported = exported.run_decompositions(_decompositions())
    CACHE.mkdir(parents=True, exist_ok=True)
    del model
    saved = save_pt2(exported, path)
    del exported
    gc.collect()
    return saved


def device_parser(doc: str, name: str) -> argparse.ArgumentParser:
    """The options every device benchmark of these decoders takes: --size, --sequence (512),
    --device (cuda) and --out (build/bench/NAME.json)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--size", default="1.1b")
    parser.add_argument("--sequence", type=int, default=512)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "bench" / f"{name}.json")
    return parser


def token_file(program: Path, size: str, tokens: int, seed: int = 0) -> Path:
    """`tokens` seeded random token ids of the decoder `size`'s vocabulary, in a safetensors file
    beside `program` (`ids_<tokens>.safetensors`, key "tokens"): what the device benchmarks score."""
    import numpy as np
    from safetensors.numpy import save_file

    path = program.with_name(f"ids_{tokens}.safetensors")
    ids = np.random.default_rng(seed).integers(0, SHAPES[size].vocab, tokens, dtype=np.int64)
    save_file({"tokens": ids}, str(path))
    return path


def report(row: dict[str, object], device: str, out: Path) -> None:
    """Print a device benchmark's row with `peaks(device)`, and write it to `out` as JSON."""
    import json

    text = json.dumps(row | peaks(device), indent=1)
    print(text, flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)


def host_rss() -> tuple[float, float]:
    """This process's resident memory now and its peak so far, GiB (Linux)."""
    import resource

    pages = int(Path("/proc/self/statm").read_text().split()[1])
    now = pages * resource.getpagesize() / 2**30
    return now, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def peaks(device: str) -> dict[str, object]:
    """The device's name, its peak memory and the process's peak host RSS (GiB)."""
    import resource

    cuda = device.startswith("cuda")
    return {
        "device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
        "gpu_peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else 0,
        "host_peak_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
    }  # fmt: skip


def _decompositions() -> dict | None:
    """coreai-torch's decomposition table, or torch's own (None) on a machine without it (a GPU
    image: the programs a rotation or a compression reads need none of coreai's ops)."""
    try:
        import coreai_torch
    except ImportError:
        return None
    return coreai_torch.get_decomp_table()


def asset(size: str) -> Path:
    """Build (once) `build/bench/decoder_<size>.aimodel`, converted from `program(size)`."""
    path = CACHE / f"decoder_{size}.aimodel"
    if path.is_dir():
        return path
    from coreai_opt.recipes import convert_file

    return convert_file(program(size), path).output


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sizes", nargs="*", default=list(SHAPES), choices=list(SHAPES))
    args = parser.parse_args()
    for size in args.sizes:
        start = time.perf_counter()
        pt2 = program(size)
        built = time.perf_counter()
        aimodel = asset(size)
        print(f"{size}: {SHAPES[size].parameters / 1e9:.3f}B parameters; {pt2} ({built - start:.0f} s), "
              f"{aimodel} ({time.perf_counter() - built:.0f} s)", flush=True)  # fmt: skip


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
