"""A `torch.export` archive read without running anything it contains.

`torch.export.load` unpickles weights and constants marked `use_pickle`, opaque objects
(`pickle.loads`), legacy `.pt` state and the sample inputs (falling back from the weights-only
unpickler to the full one when the first refuses), loads AOTInductor shared libraries, and
evaluates the program's shape strings with sympy. `Pt2Archive` reads the same layout itself:

- the zip is audited first (`_zip.audit_zip`: names, sizes, methods, CRCs);
- JSON configs are parsed as data; tensors are built from the raw records (stored records are
  memory-mapped copy-on-write, so the file is never written and large weights are not copied);
- no pickle is ever loaded: every pickle stream is judged by its opcodes (`_pickles`) so the
  refusal can say what it would import, and then refused - weights and constants marked
  `use_pickle` (torch writes them for tensor subclasses), custom/opaque objects, legacy state;
  compiled code is refused too;
- the sample inputs are never loaded (no program needs them to run, cast or convert);
- output containers of other libraries (a Hugging Face `ModelOutput`) are read as tuples
  (`_treespec`): no library a file names is imported;
- the program itself is checked as data (`_program_audit`: names that reach generated Python,
  an operator allowlist, declared sizes against a budget from what the file stores, shape
  expressions and guards) before torch's deserializer runs, and once deserialized it is run on
  fake tensors: every node must compute what it declares, within the same budget (`_shapes`);
- a stored tensor's dtype must be a Core AI element type and its shape must fit its record's
  bytes (no expanded view of a few bytes that becomes gigabytes when a pass copies it).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._errors import CorruptArchiveError, UnsafeArchiveError
from ._expressions import guards_problem
from ._known import known_program, remember_program
from ._pickles import UnreadablePickle, forbidden_globals, torch_save_globals
from ._program_audit import MAX_RANK, dtype_problem, path_problem, program_problem, size_budget
from ._runs import mark
from ._schema_reader import parse_expressions_once, schema_object
from ._shapes import check_shapes
from ._treespec import FLATTENED_META, flatten_unknown_outputs
from ._zip import ZipEntry, audit_zip, read_entry, verify_zip

if TYPE_CHECKING:
    import torch
    from torch.export import ExportedProgram

MODEL = "model"  # torch.export.save writes one program under this name
MODEL_JSON = f"models/{MODEL}.json"
WEIGHTS_DIR = "data/weights/"
CONSTANTS_DIR = "data/constants/"
WEIGHTS_CONFIG = f"{WEIGHTS_DIR}{MODEL}_weights_config.json"
CONSTANTS_CONFIG = f"{CONSTANTS_DIR}{MODEL}_constants_config.json"
SAMPLE_INPUTS = f"data/sample_inputs/{MODEL}.pt"
LEGACY_STATE = (f"{WEIGHTS_DIR}{MODEL}.pt", f"{CONSTANTS_DIR}{MODEL}.pt")
ARCHIVE_VERSION = ("archive_version", "0")
COMPILED_DIRS = ("data/aotinductor/", "data/executorch/", "data/mtia")
TENSOR_CONSTANT, CUSTOM_OBJECT, OPAQUE_OBJECT = "tensor_", "custom_obj_", "opaque_obj_"
# What the JSON inside may inflate to: SmolLM2's 2,800-node program is 6 MB of model.json (stack
# traces included), a config a few hundred bytes a tensor; each is read and parsed once.
MAX_PROGRAM_JSON = 64 << 20
MAX_CONFIG_JSON = 16 << 20
# Every entry torch.export.save writes, as a pattern of its name under the archive's root: anything
# else is refused before a byte of it is inflated (the compiled-code and pickle entries named here are
# refused by `audit` with their own message).
_KNOWN_ENTRY = re.compile(
    r"(archive_format|archive_version|byteorder|\.data/version|\.data/serialization_id"
    rf"|{re.escape(MODEL_JSON)}|{re.escape(SAMPLE_INPUTS)}|extra/[^/]+"
    r"|data/weights/(weight_\d+|model_weights_config\.json|model\.pt)"
    r"|data/constants/((tensor|custom_obj|opaque_obj)_\d+|model_constants_config\.json|model\.pt)"
    r"|data/(aotinductor|executorch|mtia)/.*)\Z"
)
TRUST_HINT = "load it with --trust-pickle (trust_pickle=True) only if you made it yourself"


COREAI_OP_PREFIX = "torch.ops.coreai."  # how model.json names a call of a coreai-torch op


@dataclass(frozen=True)
class _Payload:
    """One weights/constants config entry: where its bytes are and how to read them."""

    fqn: str
    record: str  # archive-relative entry name
    is_param: bool
    use_pickle: bool
    meta: dict[str, Any] | None


class Pt2Archive:
    """The audited layout of one `.pt2` file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        entries = audit_zip(path, path, verify=False)
        roots = {name.split("/", 1)[0] for name in entries}
        if len(roots) != 1 or any("/" not in name for name in entries):
            if "serialized_exported_program.json" in entries:
                raise UnsafeArchiveError(
                    path, f"a legacy torch.export archive whose state is pickled; {TRUST_HINT}"
                )
            raise CorruptArchiveError(path, "zip archive holds no torch.export program")
        self.root = roots.pop() + "/"
        self.entries: dict[str, ZipEntry] = {name[len(self.root) :]: e for name, e in entries.items()}
        if MODEL_JSON not in self.entries:
            raise CorruptArchiveError(path, "zip archive holds no torch.export program")
        for name, entry in self.entries.items():
            if not _KNOWN_ENTRY.match(name):
                raise CorruptArchiveError(path, f"holds {name[:80]!r}, an entry torch.export does not write")
            if name.endswith(".json"):
                self._bounded(name, entry)
        verify_zip(path, path)  # every entry inflated once, now that none can be a bomb
        self._parsed: dict[str, Any] = {}
        self._digests: dict[str, bytes] = {}  # SHA-256 of each parsed entry's bytes

    # ----- raw access ---------------------------------------------------------------------------

    def read(self, name: str) -> bytes:
        return read_entry(self.path, self.root + name, self.path)

    def _bounded(self, name: str, entry: ZipEntry) -> None:
        limit = MAX_PROGRAM_JSON if name == MODEL_JSON else MAX_CONFIG_JSON
        if entry.size > limit:
            raise CorruptArchiveError(
                self.path, f"{name} inflates to {entry.size:,} bytes, more than any program of this kind "
                f"({limit:,})"
            )  # fmt: skip

    def read_json(self, name: str) -> Any:
        """A JSON entry parsed, once: its size is bounded before it is inflated."""
        if name in self._parsed:
            return self._parsed[name]
        self._bounded(name, self.entries[name])
        raw = self.read(name)
        self._digests[name] = hashlib.sha256(raw).digest()
        try:
            self._parsed[name] = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise CorruptArchiveError(self.path, f"{name} is not valid JSON ({_line(exc)})") from None
        return self._parsed[name]

    def record_bytes(self, name: str) -> torch.Tensor:
        """A record's bytes as a uint8 tensor: a copy-on-write map of a stored entry, else read.

        Each record is mapped on its own, so the pages of a weight a pass has replaced leave the
        process with its last tensor (one map of the file would keep every page it ever read)."""
        import numpy as np
        import torch

        entry = self.entries[name]
        if entry.size == 0:
            return torch.zeros(0, dtype=torch.uint8)
        if not entry.stored:
            return torch.frombuffer(bytearray(self.read(name)), dtype=torch.uint8)
        mapped = np.memmap(self.path, dtype=np.uint8, mode="c", offset=entry.data_offset, shape=(entry.size,))
        return torch.from_numpy(mapped)

    # ----- what would run on load ---------------------------------------------------------------

    def check_version(self) -> None:
        name, expected = ARCHIVE_VERSION
        if name not in self.entries:
            raise CorruptArchiveError(self.path, f"archive has no {name} (not written by torch.export.save)")
        found = self.read(name).decode("utf-8", "replace").strip()
        if found != expected:
            raise CorruptArchiveError(self.path, f"unsupported torch.export archive version {found[:20]!r}")
        if "byteorder" in self.entries and self.read("byteorder").strip() != b"little":
            raise CorruptArchiveError(self.path, "archive was written on a big-endian machine")

    def _refuse_pickle(self, record: str, what: str) -> None:
        """Raise unless the pickle in `record` imports only what the weights-only loader allows."""
        try:
            found = forbidden_globals(torch_save_globals(self.read(record), self.path))
        except UnreadablePickle as exc:
            raise UnsafeArchiveError(
                self.path, f"{record} ({what}) is a pickle with {exc}; {TRUST_HINT}"
            ) from None
        if found:
            shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
            raise UnsafeArchiveError(
                self.path, f"{record} ({what}) is a pickle that imports {shown}: code that would run on "
                f"load; {TRUST_HINT}"
            )  # fmt: skip

    def _refuse_pickled_tensor(self, record: str, what: str) -> None:
        """A tensor stored as a pickle is never unpickled, however harmless its imports look."""
        self._refuse_pickle(record, what)
        raise UnsafeArchiveError(
            self.path, f"{record} ({what}) is a pickled tensor (torch writes tensor subclasses so); "
            f"coreopt reads no pickles from model files: {TRUST_HINT}"
        )  # fmt: skip

    def payloads(self, config: str, directory: str) -> list[_Payload]:
        if config not in self.entries:
            raise CorruptArchiveError(self.path, f"archive has no {config}")
        document = self.read_json(config)
        entries = document.get("config") if isinstance(document, dict) else None
        if not isinstance(entries, dict):
            raise CorruptArchiveError(self.path, f"{config} has no config mapping")
        payloads = []
        for fqn, item in entries.items():
            if not isinstance(item, dict) or not isinstance(item.get("path_name"), str):
                raise CorruptArchiveError(self.path, f"{config}: entry {fqn!r} has no path_name")
            record = directory + item["path_name"]
            if record not in self.entries:
                raise CorruptArchiveError(self.path, f"{config}: {fqn!r} names {record}, which is missing")
            meta = item.get("tensor_meta")
            flags = (item.get("is_param", False), item.get("use_pickle", False))
            if not all(isinstance(flag, bool) for flag in flags) or not isinstance(meta, (dict, type(None))):
                raise CorruptArchiveError(self.path, f"{config}: entry {fqn!r} is malformed")
            payloads.append(_Payload(fqn, record, *flags, meta))
        return payloads

    def audit(self) -> None:
        """Refuse every way this archive could run code when torch loads it."""
        self.check_version()
        for name in self.entries:
            if name.startswith(COMPILED_DIRS):
                raise UnsafeArchiveError(
                    self.path, f"{name} is compiled code that would be loaded; {TRUST_HINT}"
                )
        for legacy in LEGACY_STATE:
            if legacy in self.entries:
                self._refuse_pickle(legacy, "legacy pickled state")
        stored: list[int] = []
        for payload in self.payloads(WEIGHTS_CONFIG, WEIGHTS_DIR):
            if payload.use_pickle:
                self._refuse_pickled_tensor(payload.record, f"weight {payload.fqn}")
            stored.append(self._stored_elements(payload))
        for payload in self.payloads(CONSTANTS_CONFIG, CONSTANTS_DIR):
            kind = payload.record.removeprefix(CONSTANTS_DIR)
            if kind.startswith((CUSTOM_OBJECT, OPAQUE_OBJECT)):
                raise UnsafeArchiveError(
                    self.path, f"{payload.record} (constant {payload.fqn}) is a pickled object that would "
                    f"run code on load; {TRUST_HINT}"
                )  # fmt: skip
            if not kind.startswith(TENSOR_CONSTANT):
                raise CorruptArchiveError(self.path, f"{payload.record}: unknown constant kind")
            if payload.use_pickle:
                self._refuse_pickled_tensor(payload.record, f"constant {payload.fqn}")
            stored.append(self._stored_elements(payload))
        if SAMPLE_INPUTS in self.entries and self.entries[SAMPLE_INPUTS].size:
            self._refuse_pickle(SAMPLE_INPUTS, "sample inputs")
        self.register_custom_ops()  # their schemas, for the arguments' check
        document = self.read_json(MODEL_JSON)
        self.budget = size_budget(stored)
        problem = program_problem(document, stored) or guards_problem(document)
        if problem:
            raise UnsafeArchiveError(self.path, f"{MODEL_JSON}: {problem}; {TRUST_HINT}")

    def _stored_elements(self, payload: _Payload) -> int:
        """A stored tensor's element count, once its name, dtype and layout agree with its record."""
        problem = path_problem(payload.fqn)
        if problem:
            raise UnsafeArchiveError(self.path, f"tensor name {payload.fqn[:60]!r} {problem}; {TRUST_HINT}")
        if payload.meta is None:
            raise CorruptArchiveError(self.path, f"{payload.record} has no tensor_meta")
        problem = dtype_problem(payload.meta.get("dtype"))
        if problem:
            raise CorruptArchiveError(self.path, f"{payload.fqn} {problem}")
        try:
            dtype, size, _, _ = _tensor_layout(payload.meta)
        except ValueError as exc:
            raise CorruptArchiveError(self.path, f"{payload.fqn}: {exc}") from None
        import torch

        elements = math.prod(size)
        itemsize = torch.empty((), dtype=dtype).element_size()
        if elements * itemsize > self.entries[payload.record].size:
            raise CorruptArchiveError(
                self.path, f"{payload.fqn}: shape {list(size)} needs {elements * itemsize:,} bytes, "
                f"{payload.record} stores {self.entries[payload.record].size:,} (an expanded or lying layout)"
            )  # fmt: skip
        return elements

    # ----- tensors ------------------------------------------------------------------------------

    def _tensor(self, payload: _Payload, bases: dict[str, torch.Tensor]) -> torch.Tensor:
        import torch

        assert not payload.use_pickle  # refused by audit()
        if payload.meta is None:
            raise CorruptArchiveError(self.path, f"{payload.record} has no tensor_meta")
        try:
            dtype, size, stride, offset = _tensor_layout(payload.meta)
        except ValueError as exc:
            raise CorruptArchiveError(self.path, f"{payload.fqn}: {exc}") from None
        base = bases.get(payload.record)
        if base is None:
            raw = self.record_bytes(payload.record)
            element = torch.empty((), dtype=dtype).element_size()
            if raw.numel() % element:
                raise CorruptArchiveError(
                    self.path, f"{payload.record} holds {raw.numel()} bytes, not whole {dtype} elements"
                )
            entry = self.entries[payload.record]
            if entry.stored and entry.data_offset % element:
                raw = raw.clone()  # keep every element naturally aligned
            base = raw.view(dtype) if raw.numel() else torch.zeros(0, dtype=dtype)
            bases[payload.record] = base
        extent = offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True)) + 1
        if math.prod(size) and extent > base.numel():
            raise CorruptArchiveError(
                self.path,
                f"{payload.fqn}: shape {list(size)} needs {extent} elements, {payload.record} has {base.numel()}",
            )
        if not math.prod(size):
            tensor = torch.zeros(size, dtype=dtype)
        else:
            tensor = torch.as_strided(base, size, stride, offset)
        if payload.is_param:
            return torch.nn.Parameter(tensor, requires_grad=bool(payload.meta.get("requires_grad")))
        return tensor

    def tensors(self, config: str, directory: str) -> dict[str, torch.Tensor]:
        bases: dict[str, torch.Tensor] = {}
        tensors = {}
        for payload in self.payloads(config, directory):
            try:
                tensors[payload.fqn] = self._tensor(payload, bases)
            except (RuntimeError, ValueError, TypeError) as exc:  # torch refusing a lied-about layout
                raise CorruptArchiveError(self.path, f"{payload.fqn}: {_line(exc)}") from None
        return tensors

    def register_custom_ops(self) -> None:
        """Define coreai-torch's compression ops if the program calls them (compressed weights):
        torch cannot deserialize a call of an op this process does not know."""
        document = self.read_json(MODEL_JSON)
        nodes = _field(_field(_field(document, "graph_module"), "graph"), "nodes")
        if isinstance(nodes, list) and any(
            isinstance(node, dict) and str(node.get("target", "")).startswith(COREAI_OP_PREFIX)
            for node in nodes
        ):
            from coreai_opt._custom_ops import register_coreai_ops

            register_coreai_ops()

    def _layout_digest(self) -> bytes:
        """What decides the program's graph and its stored tensors' shapes: the program's JSON and
        both tensor configs, as read (their records' bytes decide only values)."""
        digest = hashlib.sha256()
        for name in (MODEL_JSON, WEIGHTS_CONFIG, CONSTANTS_CONFIG):
            self.read_json(name)
            digest.update(name.encode() + b"\0" + self._digests[name])
        return digest.digest()

    def load_program(self) -> ExportedProgram:
        """The program, its weights and tensor constants (call `audit` first); a graph this
        process read before from the same entries is copied, not read again (`_known`)."""
        state_dict = self.tensors(WEIGHTS_CONFIG, WEIGHTS_DIR)
        constants = self.tensors(CONSTANTS_CONFIG, CONSTANTS_DIR)
        document = self.read_json(MODEL_JSON)
        flattened = flatten_unknown_outputs(document)
        self.register_custom_ops()
        key = (self._layout_digest(), self.budget)
        program, shapes = known_program(key, state_dict, constants)
        if shapes is None:  # a graph this process has not read: read and walk it
            program = self._deserialized(document, state_dict, constants)
            shapes = check_shapes(program, self.budget)
            remember_program(key, program, shapes)
        if shapes.problem:
            raise UnsafeArchiveError(self.path, f"{MODEL_JSON}: {shapes.problem}; {TRUST_HINT}")
        if program is None:  # walked before, but too large to keep
            program = self._deserialized(document, state_dict, constants)
        mark(program, self.path, shapes.value_bytes, shapes.flops)
        if flattened:
            program.graph_module.meta[FLATTENED_META] = flattened
        return program

    def _deserialized(
        self, document: Any, state_dict: dict[str, torch.Tensor], constants: dict[str, torch.Tensor]
    ) -> ExportedProgram:
        from torch._export.serde import schema
        from torch._export.serde.serialize import ExportedProgramDeserializer

        parse_expressions_once()
        try:
            serialized = schema_object(schema.ExportedProgram, document)
            return ExportedProgramDeserializer(None).deserialize(serialized, state_dict, constants, None)
        except Exception as exc:  # the deserializer raises any type on malformed programs
            raise CorruptArchiveError(
                self.path, f"cannot read the torch.export program ({_line(exc)})"
            ) from None


def _tensor_layout(meta: dict[str, Any]) -> tuple[Any, tuple[int, ...], tuple[int, ...], int]:
    """dtype, sizes, strides and storage offset of a serialized tensor_meta, validated."""
    from torch._export.serde import schema
    from torch._export.serde.serialize import _SERIALIZE_TO_TORCH_DTYPE

    def ints(values: Any) -> tuple[int, ...]:
        if not isinstance(values, list):
            raise ValueError("not a list")
        out = []
        for value in values:
            number = value.get("as_int") if isinstance(value, dict) else None
            if type(number) is not int or number < 0 or number >= 1 << 62:
                raise ValueError(f"{value!r} is not a concrete non-negative size")
            out.append(number)
        return tuple(out)

    try:
        dtype = _SERIALIZE_TO_TORCH_DTYPE[schema.ScalarType(meta["dtype"])]
        size, stride = ints(meta["sizes"]), ints(meta["strides"])
        (offset,) = ints([meta["storage_offset"]])
        if len(size) != len(stride):
            raise ValueError("sizes and strides differ in length")
        if len(size) > MAX_RANK:
            raise ValueError(f"{len(size)} dimensions (at most {MAX_RANK})")
        if math.prod(size) >= 1 << 62:
            raise ValueError("more elements than any tensor holds")
    except (KeyError, ValueError, TypeError) as exc:
        raise ValueError(f"bad tensor_meta ({exc})") from None
    return dtype, size, stride, offset


def _line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return (text or type(exc).__name__)[:300]


def _field(document: object, name: str) -> object:
    """`document[name]` where the document is a JSON object, else None: a malformed
    model.json is refused by the deserializer, never by an AttributeError here."""
    return document.get(name) if isinstance(document, dict) else None
