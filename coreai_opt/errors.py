"""The error every invalid option value raises, in any package: it names the option at fault; and
`printable`, the one rule for text from outside (a file, a path, the environment) before it is
printed - here, below every package, so the CLIs and the cache rule (`_cache`, which `io` itself
imports) share it."""

from __future__ import annotations

import re

# What must never reach a terminal raw: C0/C1 controls (ESC starts cursor moves, colours, title
# changes), line and paragraph separators, bidi overrides, lone surrogates (they do not encode).
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def printable(text: object) -> str:
    """`text` as it may be printed: each unprintable character as its escape (`\\x1b`, `\\ud800`),
    so a name from a file or a path cannot drive the terminal or fail to encode."""
    return _UNPRINTABLE.sub(lambda match: ascii(match.group())[1:-1], str(text))


def shown(value: object) -> str:
    """A value as an error shows it: its repr, cut short (a value read from a file included)."""
    try:
        text = repr(value)
    except (ValueError, RecursionError):  # an integer of thousands of digits, a list nested deep
        return "a value too large to show"
    return text if len(text) <= 60 else text[:57] + "..."


class ConfigError(ValueError):
    """An invalid config or option value; `fields` names the parameters at fault, so a CLI can name
    its own flags for them."""

    def __init__(self, message: str, *fields: str) -> None:
        super().__init__(message)
        self.fields = fields


class NothingDoneError(ValueError):
    """A run whose options did nothing they asked for (nothing compressed, a pattern or op name
    matching nothing); callers may allow it (`allow_empty`)."""
