"""A model's source as people keep it: a local Hugging Face folder or a GGUF file - checked.

Nothing here reaches the network or runs code from the source: a folder must hold `config.json`
and safetensors weights (pickled `*.bin` / `*.pt` weights are refused, never loaded), its
config's family must be one coreopt exports (custom code in `auto_map` is not run), and a GGUF
file's header is read by the `gguf` package (pure Python) before transformers sees it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coreai_opt.io import MissingPathError, ModelFileError, one_line

from ._families import FAMILIES, GGUF_ARCHITECTURES, Family, supported

_PICKLED = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")
_CONFIG_LIMIT = 4 << 20  # bytes of config.json read at most


@dataclass(frozen=True)
class ModelSource:
    """A checked source: where it is, which family it is, and its config as the file states it."""

    path: Path
    family: Family
    gguf: bool
    config: dict[str, Any]  # config.json (a folder) or the GGUF metadata's architecture facts

    @property
    def folder(self) -> Path:
        return self.path.parent if self.gguf else self.path


def open_source(path: Path | str) -> ModelSource:
    """Check a Hugging Face folder or GGUF file; a `ModelFileError` names what is wrong."""
    path = Path(path)
    if not path.exists():
        raise MissingPathError(path)
    if path.is_dir():
        return _folder(path)
    if path.suffix.lower() == ".gguf":
        return _gguf(path)
    raise ModelFileError(path, "not a model source: give a Hugging Face model folder or a .gguf file")


def _folder(path: Path) -> ModelSource:
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelFileError(path, "holds no config.json: not a Hugging Face model folder")
    if config_file.stat().st_size > _CONFIG_LIMIT:
        raise ModelFileError(config_file, "is too large for a model config")
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFileError(config_file, f"not a readable JSON file ({one_line(exc, 120)})") from None
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise ModelFileError(config_file, "names no model_type")
    family = FAMILIES.get(config["model_type"])
    if family is None:
        raise ModelFileError(
            config_file,
            f"model_type {config['model_type'][:60]!r} is not one coreopt exports ({supported()})",
        )
    if not any(path.glob("*.safetensors")):
        pickled = sorted(p.name for pattern in _PICKLED for p in path.glob(pattern))
        if pickled:
            raise ModelFileError(
                path, f"holds pickled weights only ({pickled[0]}); coreopt reads safetensors, which run no "
                "code: save the model with safe_serialization=True"
            )  # fmt: skip
        raise ModelFileError(path, "holds no *.safetensors weights")
    return ModelSource(path, family, False, config)


def _gguf(path: Path) -> ModelSource:
    with path.open("rb") as handle:
        if handle.read(4) != b"GGUF":
            raise ModelFileError(path, "not a GGUF file (no GGUF magic)")
    try:
        from gguf import GGUFReader
    except ImportError:
        raise ImportError("GGUF models need the gguf package: pip install 'coreopt[hf]'") from None
    try:
        reader = GGUFReader(str(path))
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
    return ModelSource(path, family, True, {"model_type": family.model_type, "gguf_architecture": arch})
