"""Small, seeded versions of the architectures people ship, with realistic inputs.

Each entry builds a module and its example inputs (0/1 attention masks, ids inside the
vocabulary) so that tests can export, cast, run and convert it. bench/cast_graph.py and the
scaling benches build their larger decoders from the same `Llama` class.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

# ----- LLaMA / Mistral ---------------------------------------------------------------------------


@dataclass(frozen=True)
class LlamaShape:
    vocab: int = 256
    dim: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2  # grouped-query attention when fewer than heads
    hidden: int = 172
    tied: bool = False
    max_positions: int = 2048

    @property
    def parameters(self) -> int:
        head = self.dim // self.heads
        attention = self.dim * (self.heads * head) * 2 + self.dim * (self.kv_heads * head) * 2
        mlp = 3 * self.dim * self.hidden
        per_layer = attention + mlp + 2 * self.dim
        embeddings = self.vocab * self.dim * (1 if self.tied else 2)
        return self.layers * per_layer + embeddings + self.dim


class RMSNorm(nn.Module):
    """As Hugging Face's LLaMA writes it: normalise in float32, back to the input dtype, scale."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class Rotary(nn.Module):
    def __init__(self, head_dim: int, base: float = 10000.0) -> None:
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2).float() / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[:, None].float() * self.inv_freq[None, :]
        angles = torch.cat((freqs, freqs), dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)


class LlamaBlock(nn.Module):
    def __init__(self, shape: LlamaShape) -> None:
        super().__init__()
        self.heads, self.kv_heads = shape.heads, shape.kv_heads
        self.head_dim = shape.dim // shape.heads
        self.q_proj = nn.Linear(shape.dim, shape.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(shape.dim, shape.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(shape.dim, shape.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(shape.heads * self.head_dim, shape.dim, bias=False)
        self.gate_proj = nn.Linear(shape.dim, shape.hidden, bias=False)
        self.up_proj = nn.Linear(shape.dim, shape.hidden, bias=False)
        self.down_proj = nn.Linear(shape.hidden, shape.dim, bias=False)
        self.input_layernorm = RMSNorm(shape.dim)
        self.post_attention_layernorm = RMSNorm(shape.dim)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        b, t, _ = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        repeat = self.heads // self.kv_heads
        k = k.repeat_interleave(repeat, dim=1)
        v = v.repeat_interleave(repeat, dim=1)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim) + mask
        attn = torch.softmax(scores.float(), dim=-1).to(q.dtype) @ v
        x = x + self.o_proj(attn.transpose(1, 2).reshape(b, t, -1))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    """A LLaMA/Mistral-style decoder: token embedding, RMSNorm, rotary GQA attention with a causal
    and padding mask, SwiGLU MLP, lm_head (tied to the embedding or not)."""

    def __init__(self, shape: LlamaShape) -> None:
        super().__init__()
        self.shape = shape
        self.embed_tokens = nn.Embedding(shape.vocab, shape.dim)
        self.layers = nn.ModuleList(LlamaBlock(shape) for _ in range(shape.layers))
        self.norm = RMSNorm(shape.dim)
        self.rotary = Rotary(shape.dim // shape.heads)
        self.lm_head = nn.Linear(shape.dim, shape.vocab, bias=False)
        if shape.tied:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        t = input_ids.shape[1]
        x = self.embed_tokens(input_ids)
        positions = torch.arange(t, device=input_ids.device)
        cos, sin = self.rotary(positions, x.dtype)
        causal = torch.full((t, t), torch.finfo(x.dtype).min, dtype=x.dtype).triu(1)
        padding = (1 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        mask = causal[None, None] + padding
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self.lm_head(self.norm(x))


def token_inputs(
    vocab: int, batch: int = 1, length: int = 16, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Ids inside the vocabulary and a 0/1 attention mask with padding at the end of one row."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, length), generator=generator)
    mask = torch.ones(batch, length, dtype=torch.int64)
    mask[0, length - length // 4 :] = 0
    return ids, mask


# ----- GPT-2 ---------------------------------------------------------------------------------------


class Gpt2Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(
            nn.Linear(dim, 4 * dim), nn.GELU(approximate="tanh"), nn.Linear(4 * dim, dim)
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class Gpt2(nn.Module):
    """GPT-2: learned positions, LayerNorm, GELU, causal attention, lm_head tied to the embedding."""

    def __init__(
        self, vocab: int = 256, dim: int = 64, layers: int = 2, heads: int = 4, positions: int = 64
    ) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, dim), nn.Embedding(positions, dim)
        self.blocks = nn.ModuleList(Gpt2Block(dim, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        t = input_ids.shape[1]
        x = self.wte(input_ids) + self.wpe(torch.arange(t))
        mask = torch.full((t, t), float("-inf")).triu(1)
        for block in self.blocks:
            x = block(x, mask)
        return self.lm_head(self.ln_f(x))


# ----- vision --------------------------------------------------------------------------------------


class ViT(nn.Module):
    """A ViT encoder: patch embedding conv, class token, learned positions, pre-norm blocks."""

    def __init__(
        self,
        image: int = 32,
        patch: int = 8,
        dim: int = 64,
        layers: int = 2,
        heads: int = 4,
        classes: int = 10,
    ) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, dim, patch, stride=patch)
        tokens = (image // patch) ** 2 + 1
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, tokens, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(
            dim, heads, 2 * dim, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.patch(pixels).flatten(2).transpose(1, 2)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1) + self.pos
        return self.head(self.norm(self.encoder(x))[:, 0])


class ResNetBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x + self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))


class ResNet(nn.Module):
    """A ResNet stem and block stack: conv, batchnorm, max-pool, residual blocks, global pooling."""

    def __init__(self, channels: int = 16, blocks: int = 3, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, channels, 7, stride=2, padding=3, bias=False),
            nn.BatchNorm2d(channels),
            nn.ReLU(),
            nn.MaxPool2d(3, 2, 1),
        )
        self.blocks = nn.Sequential(*(ResNetBlock(channels) for _ in range(blocks)))
        self.fc = nn.Linear(channels, classes)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.fc(self.blocks(self.stem(pixels)).mean((2, 3)))


class MobileNet(nn.Module):
    """Depthwise-separable convolutions with hardswish, as MobileNetV3 stacks them."""

    def __init__(self, widths: tuple[int, ...] = (16, 24, 32), classes: int = 10) -> None:
        super().__init__()
        layers: list[nn.Module] = [
            nn.Conv2d(3, widths[0], 3, stride=2, padding=1),
            nn.BatchNorm2d(widths[0]),
            nn.Hardswish(),
        ]
        for cin, cout in itertools.pairwise(widths):
            layers += [
                nn.Conv2d(cin, cin, 3, stride=2, padding=1, groups=cin, bias=False), nn.BatchNorm2d(cin), nn.Hardswish(),
                nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout), nn.Hardswish(),
            ]  # fmt: skip
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Linear(widths[-1], 32), nn.Hardswish(), nn.Linear(32, classes))

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(pixels).mean((2, 3)))


# ----- speech and sequences ------------------------------------------------------------------------


class WhisperDecoderBlock(nn.Module):
    """Pre-norm causal self-attention, cross-attention to the audio encoding, GELU MLP."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.self_attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.cross_attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(3))
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, y: torch.Tensor, memory: torch.Tensor, causal: torch.Tensor) -> torch.Tensor:
        h = self.norms[0](y)
        y = y + self.self_attn(h, h, h, attn_mask=causal, need_weights=False)[0]
        h = self.norms[1](y)
        y = y + self.cross_attn(h, memory, memory, need_weights=False)[0]
        return y + self.mlp(self.norms[2](y))


class Whisper(nn.Module):
    """A Whisper-style encoder-decoder: conv front end over mel frames, sinusoidal positions in the
    encoder, a causal decoder with cross-attention to the encoder output."""

    def __init__(
        self, mels: int = 16, dim: int = 64, heads: int = 4, layers: int = 2, vocab: int = 128
    ) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(mels, dim, 3, padding=1)
        self.conv2 = nn.Conv1d(dim, dim, 3, stride=2, padding=1)
        enc = nn.TransformerEncoderLayer(
            dim, heads, 2 * dim, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(enc, layers, enable_nested_tensor=False)
        self.decoder = nn.ModuleList(WhisperDecoderBlock(dim, heads) for _ in range(layers))
        self.embed = nn.Embedding(vocab, dim)
        self.dec_pos = nn.Parameter(torch.randn(64, dim) * 0.02)
        self.ln = nn.LayerNorm(dim)
        self.dim = dim

    def _sinusoids(self, length: int) -> torch.Tensor:
        scales = torch.exp(-math.log(10000) * torch.arange(self.dim // 2) / (self.dim // 2 - 1))
        angles = torch.arange(length)[:, None] * scales[None, :]
        return torch.cat((angles.sin(), angles.cos()), dim=1)

    def forward(self, mel: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.conv2(F.gelu(self.conv1(mel)))).transpose(1, 2)
        memory = self.encoder(x + self._sinusoids(x.shape[1]))
        t = tokens.shape[1]
        y = self.embed(tokens) + self.dec_pos[:t]
        causal = torch.full((t, t), float("-inf")).triu(1)
        for block in self.decoder:
            y = block(y, memory, causal)
        return self.ln(y) @ self.embed.weight.T  # Whisper ties its output projection to the embedding


class Tagger(nn.Module):
    """A sequence tagger: embedding, bidirectional LSTM, GRU, per-token classifier."""

    def __init__(self, vocab: int = 200, dim: int = 32, hidden: int = 32, tags: int = 9) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.lstm = nn.LSTM(dim, hidden, batch_first=True, bidirectional=True)
        self.gru = nn.GRU(2 * hidden, hidden, batch_first=True)
        self.out = nn.Linear(hidden, tags)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x, _ = self.lstm(self.embed(input_ids))
        x, _ = self.gru(x)
        return self.out(x)


# ----- the matrix ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Architecture:
    name: str
    build: Callable[[], nn.Module]
    inputs: Callable[[int], tuple[torch.Tensor, ...]]  # seed -> example inputs
    dtype: torch.dtype = torch.float32  # the weights' dtype


def _pixels(size: int = 32) -> Callable[[int], tuple[torch.Tensor, ...]]:
    return lambda seed: (torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(seed)),)


def _whisper_inputs(seed: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(1, 16, 40, generator=generator), torch.randint(0, 128, (1, 12), generator=generator)


def _ids(vocab: int, length: int = 16) -> Callable[[int], tuple[torch.Tensor, ...]]:
    return lambda seed: (torch.randint(0, vocab, (1, length), generator=torch.Generator().manual_seed(seed)),)


MATRIX = (
    Architecture("llama-fp32", lambda: Llama(LlamaShape()), lambda s: token_inputs(256, seed=s)),
    Architecture(
        "llama-fp16", lambda: Llama(LlamaShape()), lambda s: token_inputs(256, seed=s), torch.float16
    ),
    Architecture(
        "mistral-gqa-tied",
        lambda: Llama(LlamaShape(heads=8, kv_heads=2, tied=True)),
        lambda s: token_inputs(256, seed=s),
    ),
    Architecture("gpt2", Gpt2, _ids(256)),
    Architecture("vit", ViT, _pixels()),
    Architecture("resnet", ResNet, _pixels(64)),
    Architecture("mobilenet", MobileNet, _pixels(64)),
    Architecture("whisper", Whisper, _whisper_inputs),
    Architecture("lstm-gru-tagger", Tagger, _ids(200, 8)),  # 8 steps: the recurrence unrolls
)


def build(arch: Architecture, seed: int = 0) -> nn.Module:
    """The architecture's module in eval mode, seeded weights (batchnorm statistics included)."""
    torch.manual_seed(seed)
    model = arch.build().eval()
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 1.5)
    return model.to(arch.dtype)


def export(arch: Architecture, seed: int = 0) -> torch.export.ExportedProgram:
    """Export with coreai-torch's decompositions, as the seed's casting flow does."""
    import coreai_torch

    model = build(arch, seed)
    with torch.no_grad():
        program = torch.export.export(model, arch.inputs(seed))
    return program.run_decompositions(coreai_torch.get_decomp_table())
