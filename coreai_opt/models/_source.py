"""A model's source as people keep it: a local Hugging Face folder or a GGUF file - checked.

Nothing here reaches the network or runs code from the source: a folder must hold `config.json`
and safetensors weights (pickled `*.bin` / `*.pt` weights are refused, never loaded), its
config's family must be one coreopt exports (custom code in `auto_map` is not run), and a GGUF
file's header is read by the `gguf` package (pure Python) before transformers sees it. No file of
the source may lead out of its folder (a link to ~/.ssh would otherwise be read, or copied beside
the output), and the config's sizes must be those of the weights stored (`_sizes`). The path the
user gives is theirs: a folder or GGUF file that is itself a link (an ollama blob, a model kept on
another disk) is followed first, and the rule applies to what the folder holds.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coreai_opt.io import (
    MissingPathError,
    ModelFileError,
    check_depth,
    check_links,
    one_line,
    read_in_folder,
    read_json,
)

from ._chat import folder_chat_template, gguf_chat_template
from ._families import FAMILIES, GGUF_ARCHITECTURES, Family, supported
from ._sizes import check_sizes, gguf_values
from ._stored import Stored, gguf_stored, safetensors_stored

_PICKLED = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")
_CONFIG_LIMIT = 4 << 20  # bytes of config.json read at most
_GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class ModelSource:
    """A checked source: where it is, which family it is, its config as the file states it, and
    the weights it stores (names and shapes)."""

    path: Path  # as the user gave it (errors name it)
    family: Family
    gguf: bool
    config: dict[str, Any]  # config.json (a folder) or the GGUF metadata's architecture facts
    stored: Stored
    real: Path  # where `path` leads, every link followed: the folder or file that was checked
    chat_template: str | None = None  # its chat template's text, never run (`_chat`)

    @property
    def config_path(self) -> Path:
        """The file that states the config: config.json, or the GGUF file."""
        return self.path if self.gguf else self.path / "config.json"


def open_source(path: Path | str) -> ModelSource:
    """Check a Hugging Face folder or GGUF file; a `ModelFileError` names what is wrong."""
    path = Path(path)
    if not path.exists():
        raise MissingPathError(path)
    real = Path(os.path.realpath(path))  # the user's own links are followed; what it holds is checked
    if real.is_dir():
        return _folder(path, real)
    if path.suffix.lower() == ".gguf":
        return _gguf(path, real)
    raise ModelFileError(path, "not a model source: give a Hugging Face model folder or a .gguf file")


def _folder(path: Path, real: Path) -> ModelSource:
    check_links(path, hidden=False)  # transformers opens the folder's files by name
    config_file = path / "config.json"
    if not os.path.lexists(config_file):
        raise ModelFileError(path, "holds no config.json: not a Hugging Face model folder")
    config = read_json(config_file, path, limit=_CONFIG_LIMIT)
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise ModelFileError(config_file, "names no model_type")
    family = FAMILIES.get(config["model_type"])
    if family is None:
        raise ModelFileError(
            config_file,
            f"model_type {config['model_type'][:60]!r} is not one coreopt exports ({supported()})",
        )
    check_depth(config, config_file, "the config")
    stored = safetensors_stored(path)
    if stored is None:
        pickled = sorted(p.name for pattern in _PICKLED for p in path.glob(pattern))
        if pickled:
            raise ModelFileError(
                path, f"holds pickled weights only ({pickled[0]}); coreopt reads safetensors, which run no "
                "code: save the model with safe_serialization=True"
            )  # fmt: skip
        raise ModelFileError(path, "holds no *.safetensors weights (model.safetensors or its shard index)")
    check_sizes(family, config, stored, config_file)
    return ModelSource(path, family, False, config, stored, real, folder_chat_template(path))


def _gguf(path: Path, real: Path) -> ModelSource:
    """A GGUF file, read where the user's path leads (`real`): its own links are the user's to make.
    Nothing beside it is read here, nor by transformers (`_loading.given_folder`)."""
    if read_in_folder(real, limit=len(_GGUF_MAGIC), whole=False) != _GGUF_MAGIC:
        raise ModelFileError(path, "not a GGUF file (no GGUF magic)")
    try:
        from gguf import GGUFReader
    except ImportError:
        raise ImportError("GGUF models need the gguf package: pip install 'coreopt[hf]'") from None
    try:
        reader = GGUFReader(str(real))  # the file just checked, every link followed
        field = reader.get_field("general.architecture")
        arch = bytes(field.parts[field.data[0]]).decode("utf-8") if field is not None else None
    except Exception as exc:  # the gguf reader raises whatever numpy does on bad bytes
        raise ModelFileError(path, f"not a readable GGUF file ({one_line(exc, 120)})") from None
    if arch is None:
        raise ModelFileError(path, "names no general.architecture")
    family = GGUF_ARCHITECTURES.get(arch)
    if family is None:
        names = ", ".join(sorted(GGUF_ARCHITECTURES))
        raise ModelFileError(path, f"GGUF architecture {arch[:60]!r} is not one coreopt exports ({names})")
    stored = gguf_stored(path, reader)
    check_sizes(family, gguf_values(family, reader, arch), stored, path)
    config = {"model_type": family.model_type, "gguf_architecture": arch}
    return ModelSource(path, family, True, config, stored, real, gguf_chat_template(reader))
