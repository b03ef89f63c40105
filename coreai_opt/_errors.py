"""The error every invalid option value raises, in any package: it names the option at fault."""

from __future__ import annotations


class ConfigError(ValueError):
    """An invalid config or option value; `fields` names the parameters at fault, so a CLI can name
    its own flags for them."""

    def __init__(self, message: str, *fields: str) -> None:
        super().__init__(message)
        self.fields = fields
