"""Build the bundled sample models, deterministically, as `.pt2` and `.aimodel`.

    python sample_models/build.py [OUT_DIR]

Each model is seeded, exported with coreai-torch's decomposition table and saved with
`torch.export.save`; the export is then converted with coreai-torch and saved as an asset.
The models are small on purpose (the whole set stays well under 5 MB) but each one carries
a feature the casting and compression passes must handle.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

HERE = Path(__file__).resolve().parent


class MLP(nn.Module):
    """Three linear layers: the plainest compression target."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, 128)
        self.fc2 = nn.Linear(128, 128)
        self.fc3 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.fc1(x))
        x = nn.functional.gelu(self.fc2(x))
        return self.fc3(x)


class SmallCNN(nn.Module):
    """conv2d + batchnorm + pooling + a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(32)
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)
        x = torch.relu(self.bn2(self.conv2(x)))
        x = nn.functional.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.head(x)


class EncoderLayer(nn.Module):
    """Pre-norm attention block written out op by op (no fused SDPA), so masks stay visible."""

    def __init__(self, dim: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.ff1 = nn.Linear(dim, hidden)
        self.ff2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor, pad_mask: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        head_dim = dim // self.heads
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        q, k, v = (t.reshape(batch, seq, self.heads, head_dim).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / head_dim**0.5
        causal = torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1)
        scores = scores.masked_fill(causal, float("-inf"))
        # Padding positions get the fp32 minimum (not -inf): a fully padded row stays finite.
        scores = scores.masked_fill(pad_mask[:, None, None, :] == 0, torch.finfo(torch.float32).min)
        attn = torch.softmax(scores, dim=-1) @ v
        x = x + self.proj(attn.transpose(1, 2).reshape(batch, seq, dim))
        return x + self.ff2(nn.functional.gelu(self.ff1(self.norm2(x))))


class TinyTransformer(nn.Module):
    """int64 token ids -> embedding + arange positions -> 2 encoder layers -> mean pooling."""

    vocab = 256
    seq = 16

    def __init__(self, dim: int = 64, heads: int = 4, hidden: int = 128, layers: int = 2) -> None:
        super().__init__()
        self.tokens = nn.Embedding(self.vocab, dim)
        self.positions = nn.Embedding(self.seq, dim)
        self.layers = nn.ModuleList(EncoderLayer(dim, heads, hidden) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 8)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1])
        x = self.tokens(input_ids) + self.positions(positions)
        for layer in self.layers:
            x = layer(x, attention_mask)
        return self.head(self.norm(x).mean(dim=1))


class WideRange(nn.Module):
    """A buffer beyond the fp16 range (1e6) and a scalar multiply by 1e5."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 64)
        self.register_buffer("offset", torch.full((64,), 1.0e6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        return (h * 1.0e5 + self.offset) / self.offset


class IntArith(nn.Module):
    """Integer add/mul/sub of two int tensors feeding both an embedding index and a float path."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Embedding(128, 32)
        self.proj = nn.Linear(16, 32)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        doubled = ids * 2
        shifted = ids + 3
        total = doubled + shifted  # two int tensors
        index = total - ids  # 2 * ids + 3, stays below 128 for ids < 62
        product = total * ids
        dense = self.proj(product.to(torch.float32) / 100.0)
        return self.table(index).sum(dim=1) + dense


@dataclass(frozen=True)
class SampleModel:
    name: str
    factory: Callable[[], nn.Module]
    example_inputs: Callable[[], tuple[torch.Tensor, ...]]
    description: str


def _transformer_inputs() -> tuple[torch.Tensor, ...]:
    ids = torch.randint(0, TinyTransformer.vocab, (1, TinyTransformer.seq), dtype=torch.int64)
    mask = torch.ones(1, TinyTransformer.seq, dtype=torch.int64)
    mask[:, -3:] = 0
    return ids, mask


SAMPLES: tuple[SampleModel, ...] = (
    SampleModel("mlp", MLP, lambda: (torch.randn(4, 64),), "3-layer MLP"),
    SampleModel(
        "cnn", SmallCNN, lambda: (torch.randn(1, 3, 32, 32),), "conv + batchnorm + pooling + linear head"
    ),
    SampleModel("transformer", TinyTransformer, _transformer_inputs, "2-layer encoder on int64 token ids"),
    SampleModel("wide_range", WideRange, lambda: (torch.randn(4, 64),), "buffer of 1e6 and a x1e5 scalar"),
    SampleModel(
        "int_arith",
        IntArith,
        lambda: (torch.randint(0, 50, (2, 16), dtype=torch.int64),),
        "int add/mul/sub feeding an embedding and a float path",
    ),
)


def make_model(sample: SampleModel) -> nn.Module:
    """The sample's seeded model in eval mode: the same call always gives the same weights."""
    torch.manual_seed(0)
    model = sample.factory().eval()
    torch.manual_seed(1)
    if isinstance(model, SmallCNN):  # non-trivial running statistics make batchnorm matter
        for bn in (model.bn1, model.bn2):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
    for norm in model.modules():  # trained-looking affine norms, not the all-ones default
        if isinstance(norm, nn.LayerNorm):
            norm.weight.data.uniform_(0.8, 1.2)
            norm.bias.data.uniform_(-0.1, 0.1)
    return model


def export_sample(sample: SampleModel) -> torch.export.ExportedProgram:
    """Seeded construction and export; the same call always gives the same program."""
    import coreai_torch

    model = make_model(sample)
    inputs = sample.example_inputs()
    with torch.no_grad():
        exported = torch.export.export(model, inputs)
    return exported.run_decompositions(coreai_torch.get_decomp_table())


def build_sample(sample: SampleModel, out_dir: Path) -> tuple[Path, Path]:
    """Write `<name>.pt2` and `<name>.aimodel` into out_dir (overwriting)."""
    from coreai_opt.conversion import convert_exported_program
    from coreai_opt.io import save_aimodel, save_pt2

    out_dir.mkdir(parents=True, exist_ok=True)
    program = export_sample(sample)
    pt2 = save_pt2(program, out_dir / f"{sample.name}.pt2", force=True)
    aimodel = save_aimodel(convert_exported_program(program), out_dir / f"{sample.name}.aimodel", force=True)
    return pt2, aimodel


def build_all(out_dir: Path = HERE) -> list[Path]:
    paths: list[Path] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for sample in SAMPLES:
            paths.extend(build_sample(sample, out_dir))
    return paths


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE
    for path in build_all(target):
        print(path)
