"""The token stream an evaluation scores: a text file cut with the model's tokenizer, or ids from
a safetensors file - and the sliding windows of the program's length over it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from coreai_opt.errors import ConfigError
from coreai_opt.io import ModelFileError, one_line

_ID_NAMES = ("tokens", "input_ids", "ids")


def text_token_ids(text: Path, tokenizer: Path | None) -> np.ndarray:
    """A text file's token ids under a `tokenizer.json` (the calibration room's reader)."""
    from coreai_opt.calibration import text_tokens

    return np.asarray(text_tokens(text, tokenizer), dtype=np.int64)


def file_token_ids(path: Path) -> np.ndarray:
    """Token ids from a safetensors file: its one integer tensor (or the one named tokens,
    input_ids or ids), any shape, read in row-major order."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise ModelFileError(path, f"not a readable safetensors file ({one_line(exc, 120)})") from None
    named = [tensors[n] for n in _ID_NAMES if n in tensors]
    found = named or list(tensors.values())
    if len(found) != 1:
        raise ModelFileError(
            path, f"holds {len(found)} tensors; name the token ids one of {', '.join(_ID_NAMES)}"
        )
    ids = found[0]
    if not np.issubdtype(ids.dtype, np.integer):
        raise ModelFileError(path, f"token ids are {ids.dtype}, not integers")
    return ids.reshape(-1).astype(np.int64)


@dataclass(frozen=True)
class Windows:
    """Windows of `length` tokens every `stride` tokens; each scores the positions the one
    before it did not, with `length - stride` tokens of context carried over (a token is scored
    from the logits of the one before it in its window, so a window's first token is never
    scored: windows that do not overlap score `length - 1` tokens each)."""

    tokens: int
    length: int
    stride: int

    def __post_init__(self) -> None:
        if not 1 <= self.stride <= self.length:
            raise ConfigError(f"stride must be in [1, {self.length}], not {self.stride}", "stride")
        if self.tokens < self.length:
            raise ConfigError(
                f"the text has {self.tokens} tokens, fewer than one window of {self.length}", "text"
            )

    @property
    def starts(self) -> range:
        return range(0, self.tokens - self.length + 1, self.stride)

    def first_row(self, index: int) -> int:
        """The first logits row window `index` scores (row r predicts token r + 1)."""
        return 0 if index == 0 else max(0, self.length - self.stride - 1)

    @property
    def scored(self) -> int:
        count = len(self.starts)
        return (self.length - 1) + (count - 1) * min(self.stride, self.length - 1)

    @property
    def dropped(self) -> int:
        """Tokens past the last full window, not scored."""
        last = self.starts[-1] + self.length
        return self.tokens - last


def check_ids(ids: np.ndarray, vocab: int | None, where: Path) -> None:
    if ids.size and (ids.min() < 0 or (vocab is not None and ids.max() >= vocab)):
        raise ModelFileError(where, f"token ids outside the model's vocabulary [0, {vocab})")


def window_batches(
    ids: np.ndarray, windows: Windows, batch: int
) -> Iterator[tuple[int, list[int], np.ndarray]]:
    """(index of the first window, the starts in this batch, ids [batch, length]) for a program
    that takes `batch` windows a run; a last, partial batch repeats its last window (ignored)."""
    starts = list(windows.starts)
    for first in range(0, len(starts), batch):
        group = starts[first : first + batch]
        rows = [ids[s : s + windows.length] for s in group]
        rows += [rows[-1]] * (batch - len(rows))
        yield first, group, np.stack(rows).astype(np.int64)


def token_stream(
    program: Path, text: Path | str | None, tokens: Path | str | None, tokenizer: Path | str | None,
    max_tokens: int | None,
) -> tuple[np.ndarray, str, Path | None]:  # fmt: skip
    """(the ids to score, where they came from, the tokenizer used): a text cut with `tokenizer`
    (default: the sidecar beside `program`) or a tokens file, at most `max_tokens`, checked
    against the program's vocabulary where `coreopt export` recorded it."""
    from coreai_opt.models import model_info

    if (text is None) == (tokens is None):
        raise ConfigError("give a text file or a tokens file (one of them)", "text")
    found = tokenizer_for(program, text, tokenizer)
    source = Path(text if text is not None else tokens)  # type: ignore[arg-type]
    ids = text_token_ids(source, found) if text is not None else file_token_ids(source)
    ids = ids[:max_tokens] if max_tokens is not None else ids
    info = model_info(program)
    check_ids(ids, info.vocab_size if info else None, source)
    return ids, str(source), found


def tokenizer_for(program: Path, text: object, given: Path | str | None) -> Path | None:
    """The tokenizer a text is cut with: the one given, else the one `coreopt export` saved beside
    the program; a one-line error naming the program when there is neither."""
    from coreai_opt.models import model_tokenizer, tokenizer_path

    if given is not None or text is None:
        return Path(given) if given is not None else None
    found = model_tokenizer(program)
    if found is None:
        raise ModelFileError(
            program, f"has no tokenizer beside it ({tokenizer_path(program).name}, as coreopt export writes "
            "it): give --tokenizer"
        )  # fmt: skip
    return found
