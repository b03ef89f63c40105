"""`coreopt export`'s file harness: export, save the program atomically, then its sidecars."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coreai_opt.io import ModelFileError, ModelFormat, check_output, model_format, save_pt2

from ._exporter import export_model
from ._sidecar import ModelInfo, write_info, write_tokenizer


@dataclass(frozen=True)
class ExportFileResult:
    source: Path
    output: Path
    info: ModelInfo
    parameters: int
    output_bytes: int
    tokenizer: Path | None
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": str(self.source), "output": str(self.output), "kind": self.info.kind.value,
            "model_type": self.info.model_type, "batch": self.info.batch, "seq_len": self.info.seq_len,
            "vocab_size": self.info.vocab_size, "context": self.info.context, "parameters": self.parameters,
            "output_bytes": self.output_bytes, "tokenizer": str(self.tokenizer) if self.tokenizer else None,
            "seconds": round(self.seconds, 3),
        }  # fmt: skip


def export_file(
    source: Path | str,
    output: Path | str,
    *,
    seq_len: int = 128,
    batch: int = 1,
    context: int | None = None,
    kv_cache_dtype: str | None = None,
    force: bool = False,
) -> ExportFileResult:
    """Export `source` to the `.pt2` `output`, with `<stem>.model.json` and (when the source has
    a tokenizer) `<stem>.tokenizer.json` beside it; with `context` (and `kv_cache_dtype`), as a
    stateful decoder (see `export_model`). Nothing is written when the export fails."""
    source, output = Path(source), Path(output)
    model_format(output, (ModelFormat.PT2,))
    check_output(output, force=force, inputs=(source,))
    if output.resolve().is_relative_to(source.resolve()) and source.is_dir():
        raise ModelFileError(output, "lies inside the source folder; write the program elsewhere")
    exported = export_model(
        source, seq_len=seq_len, batch=batch, context=context, kv_cache_dtype=kv_cache_dtype
    )
    save_pt2(exported.program, output, force=force, inputs=(source,))
    write_info(output, exported.info)
    tokenizer = write_tokenizer(output, exported.tokenizer) if exported.tokenizer is not None else None
    return ExportFileResult(
        source, output, exported.info, exported.parameters, output.stat().st_size, tokenizer, exported.seconds
    )
