"""Calibration samples: a safetensors file or directory, seeded draws, or token windows of a text.

A `Samples` only says where samples come from and how many to take; `inputs(program)` reads or
draws them for a `torch.export` program, checked against its user inputs (names, shapes, kinds,
finite floats) before any is used, in the program's input order and dtypes.
"""

from __future__ import annotations

import enum
import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coreai_opt.errors import ConfigError
from coreai_opt.io import ModelFileError

if TYPE_CHECKING:
    import torch
    from torch.export import ExportedProgram

RANDOM = "random"  # the source that draws seeded inputs (said explicitly)


class Source(enum.Enum):
    FILES = "files"  # a safetensors file or a directory of them
    RANDOM = "random"  # seeded draws by the input policy
    TEXT = "text"  # token windows of a text file, cut with a tokenizer


TEXT_SUFFIXES = (".txt", ".md", ".text")  # a text calibration file: cut into token windows
ALL_TOKENS = "all"  # a token budget that takes the whole text
DEFAULT_TEXT_TOKENS = 16384  # the tokens of a text calibration takes unless told (GPTQ's usual 128 x 128)


def is_text(source: object) -> bool:
    """Whether a calibration source is a text file (cut into token windows)."""
    return Path(str(source)).suffix.lower() in TEXT_SUFFIXES


def token_budget(value: object, name: str = "tokens", source: object = None) -> int | str | None:
    """A text calibration's token budget as given: None (the default: `DEFAULT_TEXT_TOKENS`, written
    out when `source` is a text), "all", or a count of 1 or more (also as digits, as the command
    line gives it)."""
    if value is None:
        return DEFAULT_TEXT_TOKENS if is_text(source) else None
    if value == ALL_TOKENS:
        return value  # type: ignore[return-value]
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{name} is a count of 1 or more or {ALL_TOKENS!r}, not {value!r}", name)
    return value


def recorded_budget(value: object, source: object) -> object:
    """A budget as a recipe recorded it: a text's without one was written before the default
    budget, when a text was taken whole - it still is (`apply` makes the same bytes)."""
    return ALL_TOKENS if value is None and is_text(source) else value


def check_source(source: str) -> None:
    """Refuse, before any model loads, a calibration source of no kind `Samples.of` reads: 'random',
    a text file (`TEXT_SUFFIXES`), a .safetensors file, or a folder of them."""
    path = Path(source)
    if source == RANDOM or path.suffix.lower() in (*TEXT_SUFFIXES, ".safetensors") or path.is_dir():
        return
    raise ConfigError(
        f"{source}: not calibration data coreopt reads; give a text file ({', '.join(TEXT_SUFFIXES)}), "
        "a .safetensors file or a folder of them, or 'random'", "source",
    )  # fmt: skip


@dataclass(frozen=True)
class Samples:
    """Where calibration samples come from, and how many to take at most."""

    kind: Source
    path: Path | None = None
    count: int | None = None  # at most this many samples (random: exactly; default 32)
    seed: int = 0
    tokens: int | None = None  # text: at most this many tokens (None: all; `of` applies the default budget)
    tokenizer: Path | None = None  # text: a tokenizer.json, or a folder holding one

    def __post_init__(self) -> None:
        if self.count is not None and (not isinstance(self.count, int) or self.count < 1):
            raise ConfigError(f"a sample count must be 1 or more, not {self.count!r}", "count")
        if self.tokens is not None and (not isinstance(self.tokens, int) or self.tokens < 1):
            raise ConfigError(f"a token count must be 1 or more, not {self.tokens!r}", "tokens")
        if self.kind is not Source.RANDOM and self.path is None:
            raise ConfigError(f"{self.kind.value} samples need a path", "path")

    @classmethod
    def of(cls, source: str | Path, *, count: int | None = None, seed: int = 0, tokens: int | str | None = None,
           tokenizer: Path | str | None = None) -> Samples:  # fmt: skip
        """`random`, a text file (`.txt`, `.md`: cut into token windows; at most `tokens` of it -
        `DEFAULT_TEXT_TOKENS` when None, every one with "all"), or safetensors."""
        if str(source) == RANDOM:
            return cls(Source.RANDOM, count=count, seed=seed)
        check_source(str(source))
        budget = token_budget(tokens, source=source)
        tokens = None if budget == ALL_TOKENS else budget  # type: ignore[assignment]
        path = Path(source)
        if is_text(path):
            return cls(Source.TEXT, path, count, seed, tokens, Path(tokenizer) if tokenizer else None)
        return cls(Source.FILES, path, count, seed)

    def describe(self) -> str:
        if self.kind is Source.RANDOM:
            from coreai_opt.inputs import seeded_source

            return seeded_source(range(self.seed, self.seed + (self.count or 32)))
        if self.kind is Source.TEXT:
            budget = "every token" if self.tokens is None else f"at most {self.tokens} tokens"
            if self.tokens == DEFAULT_TEXT_TOKENS:
                budget += ", the default: --calibration-tokens all takes every one"
            return f"{self.path} (token windows, {budget})"
        return str(self.path)

    def inputs(self, program: ExportedProgram) -> Iterator[tuple[str, tuple[torch.Tensor, ...]]]:
        """(label, the program's user inputs) per sample, checked, at most `count` of them."""
        import itertools

        from coreai_opt.inputs import exported_program_specs, user_input_nodes

        dtypes = [node.meta["val"].dtype for node in user_input_nodes(program)]
        specs = exported_program_specs(program)
        if self.kind is Source.RANDOM:
            found = self._random(program, specs)
        elif self.kind is Source.TEXT:
            from coreai_opt.models import decoder_context

            found = self._text(specs, decoder_context(program))
        else:
            found = self._files(specs)
        limit = self.count if self.count is not None or self.kind is not Source.RANDOM else 32
        for label, sample in itertools.islice(found, limit):
            yield label, tuple(sample[s.name].to(d) for s, d in zip(specs, dtypes, strict=True))

    def _random(self, program: Any, specs: list[Any]) -> Iterator[tuple[str, dict[str, torch.Tensor]]]:
        import torch

        from coreai_opt.inputs import exported_program_usage, input_rules, seeded_samples

        seeds = range(self.seed, self.seed + (self.count or 32))
        drawn = seeded_samples(specs, input_rules(specs, exported_program_usage(program)), seeds)
        return ((label, {n: torch.from_numpy(a) for n, a in arrays.items()}) for label, arrays in drawn)

    def _files(self, specs: list[Any]) -> Iterator[tuple[str, dict[str, torch.Tensor]]]:
        import torch

        from coreai_opt.inputs import read_input_samples

        assert self.path is not None
        samples = read_input_samples(self.path, specs)
        for label, sample in samples:
            for name, tensor in sample.items():
                if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                    raise ModelFileError(self.path, f"sample {label}: input {name} holds NaN or Inf")
            yield label, sample

    def _text(self, specs: list[Any], context: int | None) -> Iterator[tuple[str, dict[str, torch.Tensor]]]:
        """Consecutive windows of the text's tokens, each the length of the program's token input
        (a stateful decoder's: its context, every window written from position 0)."""
        import torch

        assert self.path is not None
        ids = [s for s in specs if s.kind.value == "int"]
        if not ids or len(ids[0].shape) != 2:
            raise ModelFileError(
                self.path, "text calibrates a language model: the program takes no [batch, tokens] ids"
            )
        batch, length = ids[0].shape if context is None else (1, context)
        window = batch * length
        budget = (
            max(self.tokens, window) if self.tokens == DEFAULT_TEXT_TOKENS else self.tokens
        )  # a window at least
        tokens = text_tokens(self.path, self.tokenizer)[:budget]
        for start in range(0, len(tokens) - window + 1, window):
            chunk = torch.tensor(tokens[start : start + window], dtype=torch.int64).reshape(batch, length)
            sample = {ids[0].name: chunk}
            for other in specs[1:]:  # an attention mask: everything attended; a decoder's position: 0
                sample[other.name] = (torch.zeros if context else torch.ones)(other.shape, dtype=torch.int64)
            yield f"tokens {start}..{start + window}", sample

    def digest(self) -> str:
        """What identifies these samples' contents (for caches): the source bytes and settings."""
        parts = [self.kind.value, str(self.count), str(self.seed), str(self.tokens)]
        digest = hashlib.sha256("|".join(parts).encode())
        if self.path is not None:
            files = [self.path] if self.path.is_file() else sorted(self.path.glob("*.safetensors"))
            for file in files:
                digest.update(file.name.encode())
                digest.update(hashlib.sha256(file.read_bytes()).digest())
        if self.tokenizer is not None:  # as parsed, as `text_tokens` reads it
            digest.update(_tokenizer(self.tokenizer).to_str().encode())
        return digest.hexdigest()


def _tokenizer(path: Path) -> Any:
    """The tokenizer a user named - a tokenizer.json, or the one in a folder - parsed. The path
    given is the user's own, links and all (an ollama or Hugging Face cache blob): it is followed
    first, and only a folder's tokenizer.json must be the folder's own file (a link out of it is
    refused, `read_tokenizer`)."""
    from coreai_opt.models import read_tokenizer

    real = Path(os.path.realpath(path))
    file, folder = (path / "tokenizer.json", real) if real.is_dir() else (path, real.parent)
    if not os.path.lexists(file):
        raise ModelFileError(file, "no such tokenizer file")
    return read_tokenizer(file, folder)


def text_tokens(path: Path, tokenizer: Path | None) -> list[int]:
    """A text file's token ids under a Hugging Face `tokenizer.json` (the `tokenizers` package)."""
    if tokenizer is None:
        raise ConfigError(
            "text samples need the model's tokenizer (a tokenizer.json or its folder)", "tokenizer"
        )
    coder = _tokenizer(tokenizer)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelFileError(path, f"not a readable UTF-8 text file ({exc})") from None
    return coder.encode(text, add_special_tokens=False).ids
