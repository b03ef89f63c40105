"""Hostile model files, built on demand from the samples: pickle payloads, damaged and lying archives.

Used by tests/test_untrusted.py (a seeded sample of the corpus) and bench/bad_inputs.py (all of
it). Every payload only creates a marker file, so a vector that fires is visible and harmless.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import random
import re
import shutil
import struct
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_models"
SAMPLE_NAMES = ("mlp", "cnn", "transformer", "wide_range", "int_arith")


class _RunsCommand:
    """Unpickling this runs `touch <marker>` through os.system, as a real attack would."""

    def __init__(self, marker: Path) -> None:
        self.command = f"touch '{marker}'"

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (self.command,)


def payload_pickle(marker: Path) -> bytes:
    return pickle.dumps(_RunsCommand(marker), protocol=2)


def payload_torch_save(marker: Path) -> bytes:
    """A `torch.save`-format zip whose data.pkl runs the command."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("archive/data.pkl", payload_pickle(marker))
        archive.writestr("archive/byteorder", "little")
        archive.writestr("archive/version", "3\n")
    return buffer.getvalue()


# ----- rewriting a .pt2 --------------------------------------------------------------------------


def _pt2_members(source: Path) -> tuple[str, dict[str, bytes]]:
    with zipfile.ZipFile(source) as archive:
        names = archive.namelist()
        root = names[0].split("/", 1)[0] + "/"
        return root, {name[len(root) :]: archive.read(name) for name in names}


def write_pt2(dest: Path, root: str, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_STORED) as archive:
        for name, data in members.items():
            archive.writestr(root + name, data)
    return dest


def rewrite_pt2(source: Path, dest: Path, change: Callable[[dict[str, bytes]], None]) -> Path:
    root, members = _pt2_members(source)
    change(members)
    return write_pt2(dest, root, members)


def _json_edit(members: dict[str, bytes], name: str, edit: Callable[[dict], None]) -> None:
    document = json.loads(members[name])
    edit(document)
    members[name] = json.dumps(document).encode()


WEIGHTS_CONFIG = "data/weights/model_weights_config.json"
CONSTANTS_CONFIG = "data/constants/model_constants_config.json"
MODEL_JSON = "models/model.json"


def pt2_pickled_weight(dest: Path, marker: Path, sample: str = "mlp") -> Path:
    """A weight entry marked use_pickle whose record is a pickle calling os.system."""

    def change(members: dict[str, bytes]) -> None:
        def edit(config: dict) -> None:
            first = next(iter(config["config"].values()))
            first["use_pickle"] = True
            members["data/weights/" + first["path_name"]] = payload_pickle(marker)

        _json_edit(members, WEIGHTS_CONFIG, edit)

    return rewrite_pt2(SAMPLES / f"{sample}.pt2", dest, change)


def pt2_pickled_sample_inputs(dest: Path, marker: Path, sample: str = "mlp") -> Path:
    def change(members: dict[str, bytes]) -> None:
        members["data/sample_inputs/model.pt"] = payload_torch_save(marker)

    return rewrite_pt2(SAMPLES / f"{sample}.pt2", dest, change)


def pt2_opaque_constant(dest: Path, marker: Path, sample: str = "mlp") -> Path:
    def change(members: dict[str, bytes]) -> None:
        def edit(config: dict) -> None:
            config["config"]["evil"] = {
                "path_name": "opaque_obj_0", "is_param": False, "use_pickle": True, "tensor_meta": None,
            }  # fmt: skip

        _json_edit(members, CONSTANTS_CONFIG, edit)
        members["data/constants/opaque_obj_0"] = payload_pickle(marker)

    return rewrite_pt2(SAMPLES / f"{sample}.pt2", dest, change)


def pt2_legacy_weights(dest: Path, marker: Path, sample: str = "mlp") -> Path:
    def change(members: dict[str, bytes]) -> None:
        members["data/weights/model.pt"] = payload_torch_save(marker)

    return rewrite_pt2(SAMPLES / f"{sample}.pt2", dest, change)


def pt2_sympy_injection(dest: Path, marker: Path, sample: str = "mlp") -> Path:
    """A shape expression that sympify would eval: it runs the command when torch deserializes."""

    def change(members: dict[str, bytes]) -> None:
        def edit(program: dict) -> None:
            tensor = next(iter(program["graph_module"]["graph"]["tensor_values"].values()))
            tensor["sizes"][0] = {
                "as_expr": {"expr_str": f"__import__('os').system(\"touch '{marker}'\") + 1", "hint": None}
            }

        _json_edit(members, MODEL_JSON, edit)

    return rewrite_pt2(SAMPLES / f"{sample}.pt2", dest, change)


def pt2_compiled_code(dest: Path, marker: Path, sample: str = "mlp") -> Path:
    """An AOTInductor folder: torch.export.load would dlopen a shared library from it."""

    def change(members: dict[str, bytes]) -> None:
        members["data/aotinductor/model/model.so"] = b"\x7fELF not really"

    return rewrite_pt2(SAMPLES / f"{sample}.pt2", dest, change)


PICKLE_VECTORS: dict[str, Callable[[Path, Path], Path]] = {
    "pickled-weight": pt2_pickled_weight,
    "pickled-sample-inputs": pt2_pickled_sample_inputs,
    "opaque-constant": pt2_opaque_constant,
    "legacy-weights": pt2_legacy_weights,
    "sympy-injection": pt2_sympy_injection,
    "compiled-code": pt2_compiled_code,
}
# Vectors torch.export.load itself fires (compiled code fails before it runs anything: the
# library is not real).
LIVE_AGAINST_TORCH = (
    "pickled-weight",
    "pickled-sample-inputs",
    "opaque-constant",
    "legacy-weights",
    "sympy-injection",
)


# ----- generated corpus --------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """A hostile file: its path, the commands that read it, and a marker a payload would create."""

    name: str
    path: Path
    kind: str  # pt2 / aimodel / safetensors
    marker: Path | None = None


def _flip_bits(data: bytearray, rng: random.Random, start: int, count: int) -> None:
    for _ in range(count):
        index = rng.randrange(start, len(data))
        data[index] ^= 1 << rng.randrange(8)


def aimodel_bit_flips(dest: Path, rng: random.Random) -> Path:
    """A sample asset whose bytecode has a few flipped bits and a recomputed main.hash."""
    sample = rng.choice(SAMPLE_NAMES)
    shutil.copytree(SAMPLES / f"{sample}.aimodel", dest)
    data = bytearray((dest / "main.mlirb").read_bytes())
    _flip_bits(data, rng, 4, rng.choice((1, 2, 4, 8, 16)))
    (dest / "main.mlirb").write_bytes(bytes(data))
    (dest / "main.hash").write_bytes(hashlib.sha256(data).digest())
    return dest


def aimodel_truncated(dest: Path, rng: random.Random) -> Path:
    sample = rng.choice(SAMPLE_NAMES)
    shutil.copytree(SAMPLES / f"{sample}.aimodel", dest)
    data = (dest / "main.mlirb").read_bytes()
    cut = data[: rng.randrange(0, len(data))]
    (dest / "main.mlirb").write_bytes(cut)
    (dest / "main.hash").write_bytes(hashlib.sha256(cut).digest())
    return dest


def aimodel_metadata(dest: Path, rng: random.Random) -> Path:
    sample = rng.choice(SAMPLE_NAMES)
    shutil.copytree(SAMPLES / f"{sample}.aimodel", dest)
    variants = [
        {"producer": "x", "creationDate": "20261122T035158Z"},
        {"producer": "x", "assetVersion": "1.0", "creationDate": "20261122T035158Z"},
        {"producer": "x", "assetVersion": "9.9", "creationDate": "20261122T035158Z"},
        {"producer": "x", "assetVersion": 2, "creationDate": "20261122T035158Z"},
        ["not", "an", "object"],
        {"assetVersion": "2.0"},
    ]
    (dest / "metadata.json").write_text(json.dumps(rng.choice(variants)))
    return dest


def pt2_truncated(dest: Path, rng: random.Random) -> Path:
    data = (SAMPLES / f"{rng.choice(SAMPLE_NAMES)}.pt2").read_bytes()
    dest.write_bytes(data[: rng.randrange(0, len(data))])
    return dest


def pt2_bit_flips(dest: Path, rng: random.Random) -> Path:
    """Flipped bits anywhere in the zip (headers, directory, payloads): CRCs are not fixed."""
    data = bytearray((SAMPLES / f"{rng.choice(SAMPLE_NAMES)}.pt2").read_bytes())
    _flip_bits(data, rng, 0, rng.choice((1, 2, 4, 8)))
    dest.write_bytes(bytes(data))
    return dest


def pt2_member_flips(dest: Path, rng: random.Random) -> Path:
    """Flipped bits inside one JSON member, re-zipped so the CRCs match (the parser sees them)."""
    sample = rng.choice(SAMPLE_NAMES)

    def change(members: dict[str, bytes]) -> None:
        name = rng.choice([MODEL_JSON, WEIGHTS_CONFIG, CONSTANTS_CONFIG, "archive_version"])
        data = bytearray(members[name])
        if data:
            _flip_bits(data, rng, 0, rng.choice((1, 2, 4)))
        members[name] = bytes(data)

    return rewrite_pt2(SAMPLES / f"{sample}.pt2", dest, change)


def pt2_json_values(dest: Path, rng: random.Random) -> Path:
    """A numeric value of the program or weights JSON replaced by a lie (shapes, dtypes, strides)."""
    sample = rng.choice(SAMPLE_NAMES)
    lies = [-1, 0, 2**40, 7, 10**18, 3]

    def change(members: dict[str, bytes]) -> None:
        name = rng.choice([MODEL_JSON, WEIGHTS_CONFIG])
        document = json.loads(members[name])
        numbers = []
        stack = [document]
        while stack:
            item = stack.pop()
            pairs = item.items() if isinstance(item, dict) else enumerate(item)
            for key, value in pairs:
                if isinstance(value, (dict, list)):
                    stack.append(value)
                elif type(value) is int:
                    numbers.append((item, key))
        if numbers:
            holder, key = rng.choice(numbers)
            holder[key] = rng.choice(lies)
        members[name] = json.dumps(document).encode()

    return rewrite_pt2(SAMPLES / f"{sample}.pt2", dest, change)


def _zip_bytes(members: dict[str, bytes], method: int = zipfile.ZIP_STORED) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", method) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def pt2_zip_lies(dest: Path, rng: random.Random) -> Path:
    """Zip-level attacks: encryption flag, unknown method, bombs, traversal names, duplicates."""
    root, members = _pt2_members(SAMPLES / f"{rng.choice(SAMPLE_NAMES)}.pt2")
    kind = rng.choice(["encrypted", "method", "bomb", "traversal", "duplicate", "absolute", "directory"])
    if kind in ("traversal", "absolute"):
        bad = "../../escape.txt" if kind == "traversal" else "/etc/escape.txt"
        data = _zip_bytes({root + k: v for k, v in members.items()} | {bad: b"x"})
    elif kind == "duplicate":
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as archive:
            for name, value in members.items():
                archive.writestr(root + name, value)
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                archive.writestr(root + MODEL_JSON, b"{}")
        data = buffer.getvalue()
    elif kind == "bomb":
        data = _zip_bytes({root + k: v for k, v in members.items()} | {root + "extra/bomb": bytes(1 << 24)},
                          zipfile.ZIP_DEFLATED)  # fmt: skip
        data = _patch_central(data, root + "extra/bomb", size=1 << 40)
    else:
        data = bytearray(_zip_bytes({root + k: v for k, v in members.items()}))
        data = _patch_central(bytes(data), root + MODEL_JSON, flag=1 if kind == "encrypted" else None,
                              method=99 if kind == "method" else None,
                              offset=2**31 if kind == "directory" else None)  # fmt: skip
    dest.write_bytes(data)
    return dest


def _patch_central(data: bytes, name: str, *, size: int | None = None, flag: int | None = None,
                   method: int | None = None, offset: int | None = None) -> bytes:  # fmt: skip
    """Rewrite one central-directory record's fields (what zipfile believes about an entry)."""
    out = bytearray(data)
    encoded = name.encode()
    position = 0
    while (position := out.find(b"PK\x01\x02", position)) != -1:
        name_length = struct.unpack_from("<H", out, position + 28)[0]
        if bytes(out[position + 46 : position + 46 + name_length]) == encoded:
            if flag is not None:
                struct.pack_into("<H", out, position + 8, flag)
            if method is not None:
                struct.pack_into("<H", out, position + 10, method)
            if size is not None:
                struct.pack_into("<I", out, position + 24, min(size, 0xFFFFFFFF))
            if offset is not None:
                struct.pack_into("<I", out, position + 42, offset)
            return bytes(out)
        position += 4
    raise ValueError(f"{name} not in the central directory")


def safetensors_lies(dest: Path, rng: random.Random) -> Path:
    """A safetensors file whose header lies: sizes, offsets, dtypes, lengths, or plain garbage."""
    import numpy as np

    values = np.arange(64, dtype=np.float32).tobytes()
    header = {"w": {"dtype": "F32", "shape": [8, 8], "data_offsets": [0, len(values)]}}
    kind = rng.choice(["offsets", "shape", "dtype", "length", "garbage", "truncated", "overlap", "huge"])
    if kind == "offsets":
        header["w"]["data_offsets"] = [0, len(values) * 1000]
    elif kind == "shape":
        header["w"]["shape"] = [2**31, 2**31]
    elif kind == "dtype":
        header["w"]["dtype"] = "Q99"
    elif kind == "overlap":
        header["v"] = {"dtype": "F32", "shape": [8, 8], "data_offsets": [4, len(values) + 4]}
    elif kind == "huge":
        header["w"]["shape"] = [2**40]
        header["w"]["data_offsets"] = [0, 2**42]
    text = json.dumps(header).encode()
    length = len(text)
    if kind == "length":
        length = 2**40
    blob = struct.pack("<Q", length) + text + values
    if kind == "garbage":
        blob = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 64)))
    elif kind == "truncated":
        blob = blob[: rng.randrange(0, len(blob))]
    dest.write_bytes(blob)
    return dest


GENERATORS: dict[str, tuple[str, Callable[[Path, random.Random], Path]]] = {
    "aimodel-bit-flips": ("aimodel", aimodel_bit_flips),
    "aimodel-truncated": ("aimodel", aimodel_truncated),
    "aimodel-metadata": ("aimodel", aimodel_metadata),
    "pt2-truncated": ("pt2", pt2_truncated),
    "pt2-bit-flips": ("pt2", pt2_bit_flips),
    "pt2-member-flips": ("pt2", pt2_member_flips),
    "pt2-json-values": ("pt2", pt2_json_values),
    "pt2-zip-lies": ("pt2", pt2_zip_lies),
    "safetensors-lies": ("safetensors", safetensors_lies),
}
# How many of each a full corpus holds (bench/bad_inputs.py); the test samples from it.
FULL_COUNTS = {
    "aimodel-bit-flips": 200,
    "aimodel-truncated": 20,
    "aimodel-metadata": 12,
    "pt2-truncated": 20,
    "pt2-bit-flips": 20,
    "pt2-member-flips": 20,
    "pt2-json-values": 30,
    "pt2-zip-lies": 14,
    "safetensors-lies": 16,
}


def corpus(directory: Path, seed: int, counts: dict[str, int] | None = None) -> list[Case]:
    """Build the hostile files under `directory`: `counts` of each generator plus every pickle vector."""
    rng = random.Random(seed)
    cases: list[Case] = []
    for kind, count in (counts or FULL_COUNTS).items():
        fmt, make = GENERATORS[kind]
        suffix = {"aimodel": ".aimodel", "pt2": ".pt2", "safetensors": ".safetensors"}[fmt]
        for index in range(count):
            path = make(directory / f"{kind}-{index}{suffix}", random.Random(rng.getrandbits(64)))
            cases.append(Case(f"{kind}-{index}", path, fmt))
    for name, make in PICKLE_VECTORS.items():
        marker = directory / f"{name}.fired"
        cases.append(Case(name, make(directory / f"{name}.pt2", marker), "pt2", marker))
    return cases


# ----- running a case through the commands that read it ------------------------------------------

SAFE_INPUTS_PROGRAM = SAMPLES / "mlp.pt2"  # a program whose check reads a hostile --inputs file


def commands(case: Case, scratch: Path) -> list[tuple[str, list[str], Path | None]]:
    """(cli, argv, output) for every command that reads the case's file."""
    path = str(case.path)
    out = scratch / f"{case.name}.out"
    if case.kind == "pt2":
        return [
            ("coreopt", ["inspect", path], None),
            ("coreopt", ["cast", path, "-o", f"{out}.pt2"], Path(f"{out}.pt2")),
            ("coreopt", ["convert", path, "-o", f"{out}.aimodel"], Path(f"{out}.aimodel")),
        ]
    if case.kind == "aimodel":
        reference = str(SAMPLES / "mlp.aimodel")
        return [
            ("coreopt", ["inspect", path], None),
            ("coreopt", ["quantize", path, "-o", f"{out}.q.aimodel"], Path(f"{out}.q.aimodel")),
            ("coreopt", ["palettize", path, "-o", f"{out}.p.aimodel"], Path(f"{out}.p.aimodel")),
            ("coreopt", ["sparsify", path, "-o", f"{out}.s.aimodel"], Path(f"{out}.s.aimodel")),
            ("coreopt", ["compare", reference, path], None),
        ]
    return [
        (
            "tcast",
            ["cast", path, "--dtype", "mxfp8e4", "-o", f"{out}.safetensors"],
            Path(f"{out}.safetensors"),
        ),
        ("tcast", ["upcast", path, "-o", f"{out}.up.safetensors"], Path(f"{out}.up.safetensors")),
        (
            "coreopt",
            ["cast", str(SAFE_INPUTS_PROGRAM), "--inputs", path, "-o", f"{out}.pt2"],
            Path(f"{out}.pt2"),
        ),
    ]


PT2_COMMANDS = ("inspect", "cast", "convert", "quantize", "palettize", "sparsify", "compare", "eval",
                "sensitivity", "apply", "optimize", "quantize-on-ray")  # fmt: skip


def every_pt2_command(path: Path, scratch: Path) -> list[tuple[str, list[str], Path | None]]:
    """(name, argv, output) of every coreopt command that reads a `.pt2`, each in its cheapest
    form: what a hostile program must get through (tests/test_program_audit.py, bench/bad_inputs.py)."""
    out = scratch / f"{path.stem}.out"
    tokens = _token_ids(scratch)
    recipe = scratch / "cast.recipe.json"
    if not recipe.exists():
        recipe.write_text(json.dumps({"version": 1, "steps": [{"cast": {}}]}))
    file = str(path)
    return [
        ("inspect", ["inspect", file], None),
        ("cast", ["cast", file, "-o", f"{out}.cast.pt2"], Path(f"{out}.cast.pt2")),
        ("convert", ["convert", file, "-o", f"{out}.aimodel"], Path(f"{out}.aimodel")),
        ("quantize", ["quantize", file, "-o", f"{out}.q.pt2"], Path(f"{out}.q.pt2")),
        ("palettize", ["palettize", file, "--nbits", "2", "-o", f"{out}.p.pt2"], Path(f"{out}.p.pt2")),
        ("sparsify", ["sparsify", file, "-o", f"{out}.s.pt2"], Path(f"{out}.s.pt2")),
        ("compare", ["compare", str(SAMPLES / "mlp.pt2"), file], None),
        ("eval", ["eval", file, str(SAMPLES / "mlp.pt2"), "--tokens", str(tokens)], None),
        (
            "sensitivity",
            ["sensitivity", file, "--config", "quantize:dtype=int8", "--tokens", str(tokens)],
            None,
        ),
        ("apply", ["apply", str(recipe), file, "-o", f"{out}.apply.pt2"], Path(f"{out}.apply.pt2")),
        (
            "optimize",
            ["optimize", file, "--calibration", "random", "--target-bits", "8", "--dry-run", "-q"],
            None,
        ),
        (
            "quantize-on-ray",
            ["quantize", file, "--executor", "ray", "-o", f"{out}.ray.pt2"],
            Path(f"{out}.ray.pt2"),
        ),
    ]


def _token_ids(scratch: Path) -> Path:
    """A small safetensors file of token ids (what a language-model command reads beside the model)."""
    path = scratch / "ids.safetensors"
    if not path.exists():
        import numpy as np
        from safetensors.numpy import save_file

        save_file({"input_ids": np.arange(64, dtype=np.int64).reshape(1, 64) % 10}, str(path))
    return path


def tree_digest(path: Path) -> str:
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        digest.update(str(file.relative_to(path.parent)).encode())
        digest.update(file.read_bytes())
    return digest.hexdigest()


def listing(directory: Path) -> set[str]:
    return {p.name for p in directory.iterdir()}


def contract_violations(case: Case, exit_code: int, stderr: str, output: Path | None) -> list[str]:
    """What a run broke of the bad-input contract (empty: it kept it).

    A mutant that is still a valid model may succeed (exit 0, its output written); a failure must
    be exit 1 with one stderr line naming the file, and no fallback `unexpected <Error>` message.
    """
    problems = []
    lines = stderr.strip().splitlines()
    if exit_code == 0:
        if output is not None and not output.exists():
            problems.append("exit 0 without its output")
    elif exit_code == 1:
        if len(lines) != 1:
            problems.append(f"{len(lines)} stderr lines")
        elif str(case.path) not in lines[0]:
            problems.append("error line does not name the file")
        if any(re.search(r"unexpected \w+(Error|Exception)\b", line) for line in lines):
            problems.append("untyped 'unexpected' error")
        if output is not None and output.exists():
            problems.append("failed but left its output")
    else:
        problems.append(f"exit code {exit_code}")
    if "Traceback" in stderr:
        problems.append("traceback")
    if case.marker is not None and case.marker.exists():
        problems.append("the payload ran")
    return problems


def run_cli(cli: str, argv: list[str]) -> tuple[int, str]:
    """Run a command in this process as a user would: (exit code, stderr).

    stderr includes what native code wrote to file descriptor 2 (MLIR diagnostics, say), which
    a user sees on the terminal though Python's sys.stderr never carries it.
    """
    import sys
    import tempfile

    from typer.testing import CliRunner

    if cli == "coreopt":
        from cli.coreopt_app import app
    else:
        from cli.tcast_app import app
    sys.__stderr__.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as native:
        os.dup2(native.fileno(), 2)
        try:
            result = CliRunner().invoke(app, argv, catch_exceptions=False)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        native.seek(0)
        leaked = native.read().decode("utf-8", "replace")
    return result.exit_code, result.stderr + leaked


@dataclass(frozen=True)
class Run:
    command: str
    exit_code: int
    message: str  # the first stderr line


def check_case(case: Case, scratch: Path, runs: list[Run] | None = None) -> list[str]:
    """Run one case through every command that reads it; every contract violation, described.

    `runs`, when given, receives each command's outcome (for the bench's table).
    """
    problems = []
    before = tree_digest(case.path) if case.path.exists() else None
    for cli, argv, output in commands(case, scratch):
        files = listing(scratch)
        exit_code, stderr = run_cli(cli, argv)
        if runs is not None:
            runs.append(Run(f"{cli} {argv[0]}", exit_code, (stderr.strip().splitlines() or [""])[0]))
        for problem in contract_violations(case, exit_code, stderr, output):
            problems.append(f"{cli} {argv[0]}: {problem} ({stderr.strip()[:200]!r})")
        left = listing(scratch) - files - ({output.name} if output is not None and exit_code == 0 else set())
        if left:
            problems.append(f"{cli} {argv[0]}: left {sorted(left)}")
        if (tree_digest(case.path) if case.path.exists() else None) != before:
            problems.append(f"{cli} {argv[0]}: modified its input")
    return problems


CI_SEED = 20261123
# The sample CI runs (tests/test_untrusted.py); bench/bad_inputs.py --full runs FULL_COUNTS.
CI_COUNTS = {  # each .aimodel case spawns a verifier per command (~7 CPU-s): a sample; --full has the rest
    "aimodel-bit-flips": 6,
    "aimodel-truncated": 3,
    "aimodel-metadata": 3,
    "pt2-truncated": 8,
    "pt2-bit-flips": 8,
    "pt2-member-flips": 10,
    "pt2-json-values": 12,
    "pt2-zip-lies": 14,
    "safetensors-lies": 16,
}
