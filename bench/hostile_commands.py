"""The hostile-input corpus through every command that reads it, each run its own process under an
address-space limit: the acceptance run of the "hostile input, round 4" issue.

    python bench/hostile_commands.py [--limit-gib 4] [--jobs 2] [--only program,valued,...]

Families (what a file from someone else can hold):
- program: every hostile program (tests/_hostile_programs.py VECTORS: names that become Python,
  file ops, gradient ops writing the heap, integers as dtypes, doubling cats, hostile sizes and
  expressions, deep weights, ...) and every pickle vector (tests/_hostile.py);
- valued: well-formed programs feeding admitted index- and size-taking ops constants far out of
  range (gather, index_select, embedding, index, index_put, scatter*, masked_scatter, grid_sampler);
- archive: a model.json inflating to 65 MiB from a 0.1 MB file, an entry torch does not write;
- source: Hugging Face folders and GGUF files (a tokenizer.json linked to a secret, a file beside
  a GGUF linked to one, 10,000,000 layers, a 100,000-deep config.json, a GGUF of no tensors);
- sidecar: a program whose model or tokenizer sidecar links to a secret, or nests 100,000 deep;
- recipe: 2,000 steps, `max_bytes: 1e400`, a 100,000-deep document;
- cache: a world-writable calibration cache with planted statistics and an index naming
  `../../secret`, a world-writable numba cache with a pickle that runs a command.
Each program file goes through every command that reads a `.pt2` (tests/_hostile.py
`every_pt2_command`), each other file through the commands that read it; a command run with
`--executor ray` is not limited (Ray's own processes reserve more address space than any limit). A run passes when it
exits 0 (the file was usable and nothing of it fired) or 1/2 with one stderr line naming the file,
with no traceback, no signal, no payload fired, no secret byte in its output folder, no file left
outside its output, at most 2 GiB resident and 30 s. Prints a table per family and every violation.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

import _hf  # noqa: E402
import _hostile as h  # noqa: E402
import _hostile_programs as hp  # noqa: E402

SECRET = b"SECRET-7f3a-DO-NOT-COPY"
MAX_SECONDS, MAX_RSS = 30.0, 2 << 30


@dataclass
class Run:
    """One command on one hostile file."""

    family: str
    case: str
    argv: list[str]
    file: Path  # what the error line must name
    output: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    may_pass: bool = True  # exit 0 is a pass (the file was usable)
    marker: Path | None = None


def _secret(folder: Path) -> Path:
    path = folder / "secret.key"
    path.write_bytes(SECRET)
    return path


# ----- the families -------------------------------------------------------------------------------


def _pt2_runs(
    family: str, makers: dict[str, Callable[[Path, Path], Path]], files: Path, out: Path
) -> list[Run]:
    """Every maker's program through every command that reads a `.pt2`."""
    runs = []
    for name, make in makers.items():
        marker = files / f"{name}.fired"
        path = make(files / f"{name}.pt2", marker)
        for command, argv, output in h.every_pt2_command(path, out):
            runs.append(Run(family, f"{name} / {command}", argv, path, output, may_pass=family == "valued",
                            marker=marker))  # fmt: skip
    return runs


def _program_runs(files: Path, out: Path) -> list[Run]:
    makers = {name: make for name, (make, _) in hp.VECTORS.items()} | dict(h.PICKLE_VECTORS)
    return _pt2_runs("program", makers, files, out)


def _valued_runs(files: Path, out: Path) -> list[Run]:
    return _pt2_runs("valued", dict(hp.VALUED_OPS), files, out)


def _archive_runs(files: Path, out: Path) -> list[Run]:
    import zipfile

    root, members = h._pt2_members(h.SAMPLES / "mlp.pt2")
    bomb = files / "bomb.pt2"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in (members | {h.MODEL_JSON: members[h.MODEL_JSON] + b" " * (65 << 20)}).items():
            archive.writestr(root + name, data)
    stranger = h.write_pt2(files / "stranger.pt2", root, members | {"extra2/payload": b"x" * 4096})
    return [Run("archive", f"{path.stem} / {command}", argv, path, output, may_pass=False)
            for path in (bomb, stranger) for command, argv, output in h.every_pt2_command(path, out)]  # fmt: skip


def _source_runs(files: Path, out: Path) -> list[Run]:
    secret = _secret(files)
    linked = _hf.hf_folder("llama", files / "linked")
    (linked / "tokenizer.json").unlink()
    (linked / "tokenizer.json").symlink_to(secret)
    layers = _hf.hf_folder("qwen2", files / "layers")
    config = json.loads((layers / "config.json").read_text())
    (layers / "config.json").write_text(json.dumps(config | {"num_hidden_layers": 10_000_000}))
    deep = _hf.hf_folder("llama", files / "deep")
    (deep / "config.json").write_text('{"model_type": "llama", "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    beside = files / "beside"
    beside.mkdir()
    gguf = _hf.llama_gguf(beside / "model.gguf")
    (beside / "tokenizer.json").symlink_to(secret)
    empty = _hf.empty_gguf(files / "empty.gguf")
    runs = []
    for name, source, may_pass in (("linked-tokenizer", linked, False), ("ten-million-layers", layers, False),
                                   ("deep-config", deep, False), ("gguf-beside-a-link", gguf, True),
                                   ("gguf-no-tensors", empty, False)):  # fmt: skip
        target = out / f"{name}.pt2"
        argv = ["export", str(source), "-o", str(target), "--seq-len", "16"]
        runs.append(Run("source", f"{name} / export", argv, source, target, may_pass=may_pass))
    return runs


def _sidecar_runs(files: Path, out: Path) -> list[Run]:
    secret = _secret(files)
    runs = []
    for name, make in (("linked-model-json", lambda p: p.with_name(f"{p.stem}.model.json").symlink_to(secret)),
                       ("linked-tokenizer-json", lambda p: p.with_name(f"{p.stem}.tokenizer.json").symlink_to(secret)),
                       ("deep-model-json", lambda p: p.with_name(f"{p.stem}.model.json").write_text("[" * 100_000))):  # fmt: skip
        folder = files / name
        folder.mkdir()
        program = folder / "mlp.pt2"
        shutil.copy(h.SAMPLES / "mlp.pt2", program)
        make(program)
        for command, argv, output in h.every_pt2_command(program, out):
            if output is not None:  # the commands that write a program copy its sidecars
                runs.append(Run("sidecar", f"{name} / {command}", argv, program.with_name(f"mlp.{name.split('-')[1]}.json"),
                                output, may_pass=False))  # fmt: skip
    return runs


def _recipe_runs(files: Path, out: Path) -> list[Run]:
    recipes = {
        "2000-steps": json.dumps({"version": 1, "steps": [{"cast": {}}] * 2000}),
        "infinite-budget": "version: 1\nsteps:\n  - budget: {max_bytes: 1e400}\n",
        "deep": '{"version": 1, "steps": ' + "[" * 100_000 + "]" * 100_000 + "}",
    }
    runs = []
    for name, text in recipes.items():
        recipe = files / f"{name}.recipe.{'yaml' if name == 'infinite-budget' else 'json'}"
        recipe.write_text(text)
        target = out / f"{name}.pt2"
        runs.append(Run("recipe", f"{name} / apply", ["apply", str(recipe), str(h.SAMPLES / "mlp.pt2"), "-o", str(target)],
                        recipe, target, may_pass=False))  # fmt: skip
    return runs


def _cache_runs(files: Path, out: Path) -> list[Run]:
    """Caches other users could write to: what they hold is never read (the commands still work)."""
    secret = _secret(files)
    calibration = files / "shared-calibration"
    calibration.mkdir(mode=0o777)
    os.chmod(calibration, 0o777)
    planted = calibration / "planted.fisher"
    planted.mkdir()
    (planted / "index.json").write_text(
        json.dumps({"weights": [["fc1.weight", f"../../{secret.name}", 1, [4]]]})
    )
    numba = files / "shared-numba"
    numba.mkdir()
    os.chmod(numba, 0o777)
    marker = files / "numba.fired"
    (numba / "planted.nbi").write_bytes(h.payload_pickle(marker))
    target = out / "cached.pt2"
    argv = ["palettize", str(h.SAMPLES / "mlp.pt2"), "--nbits", "2", "--method", "sensitive", "--calibration",
            "random", "-o", str(target)]  # fmt: skip
    env = {"COREOPT_CACHE": str(calibration), "NUMBA_CACHE_DIR": str(numba)}
    return [
        Run(
            "cache", "shared caches / palettize", argv, calibration, target, env, may_pass=True, marker=marker
        )
    ]


FAMILIES: dict[str, Callable[[Path, Path], list[Run]]] = {
    "program": _program_runs, "valued": _valued_runs, "archive": _archive_runs, "source": _source_runs, "sidecar": _sidecar_runs,
    "recipe": _recipe_runs, "cache": _cache_runs,
}  # fmt: skip


# ----- running and judging ------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    code: int  # negative: the signal that ended it
    seconds: float
    rss: int
    stderr: str


def _execute(run: Run, limit: int) -> Outcome:
    """`coreopt ARGV` in a fresh process with an address-space limit; its exit, time and peak RSS."""

    def limited() -> None:
        if "ray" not in run.argv:  # Ray's own processes (raylet, GCS) reserve more than any limit: not ours
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    env = dict(os.environ, **run.env, PYTHONPATH=str(ROOT))
    start = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        process = subprocess.Popen([sys.executable, "-m", "cli.coreopt_app", *run.argv], cwd=ROOT, env=env,
                                   stdout=subprocess.DEVNULL, stderr=err, preexec_fn=limited)  # fmt: skip
        try:
            _, status, usage = os.wait4(process.pid, 0)
        except BaseException:
            process.kill()
            raise
        process.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        stderr = err.read().decode("utf-8", "replace")
    return Outcome(process.returncode, time.perf_counter() - start, usage.ru_maxrss * 1024, stderr)


def _violations(run: Run, outcome: Outcome, out: Path, before: set[str]) -> list[str]:
    problems = []
    lines = [
        line for line in outcome.stderr.strip().splitlines() if not line.startswith("warning: cache folder")
    ]
    if outcome.code < 0:
        problems.append(f"killed by signal {-outcome.code}")
    elif outcome.code == 0:
        if not run.may_pass:
            problems.append("exit 0 where the file must be refused")
        if lines:
            problems.append(f"{len(lines)} stderr lines on success")
    elif outcome.code in (1, 2):
        if len(lines) != 1 or str(run.file) not in lines[0]:
            problems.append(f"not one line naming the file: {outcome.stderr.strip()[:300]!r}")
        if run.output is not None and run.output.exists():
            problems.append("failed but left its output")
    else:
        problems.append(f"exit code {outcome.code}")
    if "Traceback" in outcome.stderr:
        problems.append("traceback")
    if run.marker is not None and run.marker.exists():
        problems.append("the payload ran")
    if outcome.seconds > MAX_SECONDS:
        problems.append(f"{outcome.seconds:.0f} s")
    if outcome.rss > MAX_RSS:
        problems.append(f"{outcome.rss / 2**30:.1f} GiB resident")
    for path in out.rglob("*"):
        if path.is_file() and SECRET in path.read_bytes():
            problems.append(f"the secret is in {path.name}")
    stem = run.output.name.rsplit(".", 1)[0] + "." if run.output is not None else None
    left = {
        p.name for p in out.iterdir() if stem is None or not p.name.startswith(stem)
    } - before  # its sidecars
    if left:
        problems.append(f"left {sorted(left)}")
    return problems


def _shard(families: list[str], index: int, jobs: int, limit: int) -> list[tuple[Run, Outcome, list[str]]]:
    with tempfile.TemporaryDirectory() as folder:
        files, out = Path(folder, "files"), Path(folder, "out")
        files.mkdir()
        out.mkdir()
        runs = []
        for family in families:
            (files / family).mkdir()
            runs += FAMILIES[family](files / family, out)
        rows = []
        for run in runs[index::jobs]:
            before = {p.name for p in out.iterdir()}
            outcome = _execute(run, limit)
            rows.append((run, outcome, _violations(run, outcome, out, before)))
            for made in out.glob(f"{run.output.name.rsplit('.', 1)[0]}.*") if run.output is not None else ():
                shutil.rmtree(made) if made.is_dir() else made.unlink()
        return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--limit-gib", type=float, default=4.0)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--only", default=",".join(FAMILIES))
    args = parser.parse_args()
    families = args.only.split(",")
    limit = int(args.limit_gib * 2**30)
    start = time.perf_counter()
    with concurrent.futures.ProcessPoolExecutor(args.jobs) as pool:
        shards = list(
            pool.map(_shard, *zip(*[(families, i, args.jobs, limit) for i in range(args.jobs)], strict=True))
        )
    rows = [row for shard in shards for row in shard]
    print(f"# hostile corpus, every command in its own process under a {args.limit_gib:g} GiB address-space "
          f"limit; {platform.node()}, {time.strftime('%Y-%m-%d')}")  # fmt: skip
    print("| family | runs | exit 0 | refused | signals | max s | max RSS GiB | violations |")
    print("|---|---|---|---|---|---|---|---|")
    table: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    longest: dict[str, float] = collections.defaultdict(float)
    largest: dict[str, int] = collections.defaultdict(int)
    for run, outcome, problems in rows:
        counter = table[run.family]
        counter["runs"] += 1
        counter["worked"] += outcome.code == 0
        counter["refused"] += outcome.code in (1, 2)
        counter["signals"] += outcome.code < 0
        counter["violations"] += bool(problems)
        longest[run.family] = max(longest[run.family], outcome.seconds)
        largest[run.family] = max(largest[run.family], outcome.rss)
    for family, counter in table.items():
        print(f"| {family} | {counter['runs']} | {counter['worked']} | {counter['refused']} | {counter['signals']} "
              f"| {longest[family]:.1f} | {largest[family] / 2**30:.2f} | {counter['violations']} |")  # fmt: skip
    print(f"# {len(rows)} runs in {time.perf_counter() - start:.0f} s")
    failures = [(run, problems) for run, _, problems in rows if problems]
    for run, problems in failures:
        print(f"VIOLATION {run.family} {run.case}: {'; '.join(problems)}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
