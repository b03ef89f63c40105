"""A model's chat format, recognised in its source's chat template and rendered by our own code.

A chat template is a Jinja program. Rendering one from a file someone else made is running their
code (transformers runs it in a sandbox); coreopt never does. It recognises the layout a template
writes - ChatML (`<|im_start|>role\\n...<|im_end|>\\n`: SmolLM2, Qwen2) - and the default system
message a template writes when the conversation has none (a string literal of the template), and
keeps only those facts (`ChatFormat`) in the model's description. A template of another layout
gives no format: `generate --chat` then says so instead of guessing.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coreai_opt.io import ModelFileError, read_in_folder, read_json

CHATML = "chatml"
STYLES = (CHATML,)
_TEMPLATE_LIMIT = 16 << 20  # bytes of a chat template read at most
_SYSTEM_LIMIT = 4096  # characters of a default system message
# A default system message: the literal text of a system turn in a Jinja string (quoted; a newline
# written as one or as the two characters of its escape), with no quote or markup inside it.
# ChatML's generation prompt as a template writes it: the assistant's turn opened by a newline
_OPENS_ASSISTANT = re.compile(r"<\|im_start\|>assistant(?:\n|\\n)")
_DEFAULT_SYSTEM = re.compile(r"<\|im_start\|>system(?:\n|\\n)([^'\"{}<]*)<\|im_end\|>")


@dataclass(frozen=True)
class ChatFormat:
    """How a chat model expects a conversation: its layout (`style`), the system message its
    template writes when none is given (None: none), and the text that ends a turn."""

    style: str
    system: str | None = None

    @property
    def end_of_turn(self) -> str:
        return "<|im_end|>"

    def render(self, prompt: str, system: str | None = None) -> str:
        """One user turn (`prompt`) after the system message (`system`, else the default one), and
        the opening of the assistant's turn - what the template writes with a generation prompt."""
        said = self.system if system is None else system
        turns = [("system", said)] if said is not None else []
        turns.append(("user", prompt))
        return "".join(f"<|im_start|>{role}\n{text}<|im_end|>\n" for role, text in turns) + (
            "<|im_start|>assistant\n"
        )

    def to_dict(self) -> dict[str, Any]:
        return {"style": self.style, "system": self.system}

    @classmethod
    def from_dict(cls, data: Any, path: Path) -> ChatFormat:
        """The format a model description holds; anything else is refused, naming `path`."""
        if (
            not isinstance(data, dict)
            or set(data) != {"style", "system"}
            or data["style"] not in STYLES
            or not (data["system"] is None or isinstance(data["system"], str))
            or len(data["system"] or "") > _SYSTEM_LIMIT
        ):
            raise ModelFileError(
                path, f"malformed chat format (a style of {', '.join(STYLES)} and a system text)"
            )
        return cls(data["style"], data["system"])


def chat_format(template: Any) -> ChatFormat | None:
    """The format a chat template writes, or None when there is no template or coreopt does not
    recognise its layout. The template is read as text, never run."""
    if not isinstance(template, str) or "<|im_end|>" not in template or not _OPENS_ASSISTANT.search(template):
        return None  # not ChatML's own layout (a role, then a newline), e.g. <|im_start|>assistant<|im_sep|>
    found = _DEFAULT_SYSTEM.search(template)
    system = found.group(1).replace("\\n", "\n") if found else None
    return ChatFormat(CHATML, system if system and len(system) <= _SYSTEM_LIMIT else None)


def folder_chat_template(folder: Path) -> str | None:
    """A Hugging Face folder's chat template: `chat_template.jinja`'s text, else
    `tokenizer_config.json`'s `chat_template` (a string, or a list of named templates whose
    "default" is taken); None when it has none. Both are read from the folder only."""
    jinja = folder / "chat_template.jinja"
    if os.path.lexists(jinja):
        return read_in_folder(jinja, folder, limit=_TEMPLATE_LIMIT).decode("utf-8", errors="replace")
    config = folder / "tokenizer_config.json"
    arguments = read_json(config, folder, limit=_TEMPLATE_LIMIT) if os.path.lexists(config) else None
    value = arguments.get("chat_template") if isinstance(arguments, dict) else None
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        value = named.get("default")
    return value if isinstance(value, str) else None


def gguf_chat_template(reader: Any) -> str | None:
    """A GGUF file's `tokenizer.chat_template` (UTF-8 text), or None."""
    from gguf import GGUFValueType

    field = reader.get_field("tokenizer.chat_template")
    if field is None or not field.data or field.types != [GGUFValueType.STRING]:
        return None
    return bytes(field.parts[field.data[0]][:_TEMPLATE_LIMIT]).decode("utf-8", errors="replace")
