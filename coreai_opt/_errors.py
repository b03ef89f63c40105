"""The error every invalid option value raises, in any package: it names the option at fault."""

from __future__ import annotations


class ConfigError(ValueError):
    """An invalid config or option value; `fields` names the parameters at fault, so a CLI can name
    its own flags for them."""

    def __init__(self, message: str, *fields: str) -> None:
        super().__init__(message)
        self.fields = fields


class NothingDoneError(ValueError):
    """A run whose options did nothing they asked for (nothing compressed, a pattern or op name
    matching nothing); callers may allow it (`allow_empty`)."""
