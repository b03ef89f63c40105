"""Every hostile file of the corpus through every command that reads it.

    python bench/bad_inputs.py [--full] [--seed 0] [--jobs 2]

The corpus (tests/_hostile.py) holds seeded mutants of the sample models - bit flips in `.aimodel`
bytecode with main.hash recomputed, truncations, lying metadata, damaged and re-zipped `.pt2`
archives, lied-about JSON values, zip-level attacks, lying safetensors headers - every pickle
vector, every hostile program (tests/_hostile_programs.py) and seeded mutations of the sample
programs' graphs (300 with --full, 30 without). Each file goes through each command that reads
it, in a fresh worker process per shard; the table counts, per generator, the files, how many
were refused (exit 1) or still worked (exit 0), and contract violations (more than one stderr line, a traceback, an untyped error, a
signal death, a modified input, a leftover file, a payload that ran). Without --full it runs the
sample tests/test_untrusted.py runs in CI.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

import _hostile  # noqa: E402
import _hostile_programs  # noqa: E402

PROGRAM_MUTANTS = 300  # seeded graph mutations of the sample programs (tests/test_program_audit.py's)


def _program_cases(folder: Path, seed: int, mutants: int) -> list[_hostile.Case]:
    """Every hostile program (names that become Python, file ops, hangs, huge sizes, ...) and
    `mutants` seeded mutations of the sample programs' graphs."""
    cases = []
    for name, (make, _) in _hostile_programs.VECTORS.items():
        marker = folder / f"{name}.fired"
        cases.append(_hostile.Case(name, make(folder / f"{name}.pt2", marker), "pt2", marker))
    watched, marker = folder / "watched.secret", folder / "mutant.fired"
    watched.write_bytes(b"secret")
    paths = _hostile_programs.mutants(folder, mutants, seed, secret=watched, marker=marker)
    cases += [_hostile.Case(f"pt2-graph-mutations-{i}", path, "pt2", marker) for i, path in enumerate(paths)]
    return cases


def _shard(
    seed: int, counts: dict[str, int], index: int, jobs: int, mutants: int
) -> list[tuple[str, str, list[str], float]]:
    """Build the corpus in this process and check every `jobs`-th case from `index`."""
    with tempfile.TemporaryDirectory() as folder:
        files, scratch = Path(folder, "files"), Path(folder, "out")
        files.mkdir()
        scratch.mkdir()
        cases = _hostile.corpus(files, seed, counts)
        cases += _program_cases(files, seed, mutants)
        rows = []
        for case in cases[index::jobs]:
            start = time.perf_counter()
            runs: list[_hostile.Run] = []
            problems = _hostile.check_case(case, scratch, runs)
            generator = case.name.rsplit("-", 1)[0]
            if case.name in _hostile_programs.VECTORS:
                generator = "program-vectors"
            elif case.name in _hostile.PICKLE_VECTORS:
                generator = "pickle-vectors"
            rows.append((generator, case.name, problems, time.perf_counter() - start, runs))
        return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--full", action="store_true", help="the whole corpus, not the CI sample")
    parser.add_argument("--seed", type=int, default=_hostile.CI_SEED)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    counts = _hostile.FULL_COUNTS if args.full else _hostile.CI_COUNTS
    mutants = PROGRAM_MUTANTS if args.full else 30
    start = time.perf_counter()
    with concurrent.futures.ProcessPoolExecutor(args.jobs) as pool:
        shards = list(
            pool.map(
                _shard,
                *zip(*[(args.seed, counts, i, args.jobs, mutants) for i in range(args.jobs)], strict=False),
            )
        )
    rows = [row for shard in shards for row in shard]
    table: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    failures = []
    for generator, name, problems, seconds, runs in rows:
        counter = table[generator]
        counter["files"] += 1
        counter["violations"] += bool(problems)
        counter["seconds"] += seconds  # type: ignore[assignment]
        counter["runs"] += len(runs)
        counter["worked"] += sum(run.exit_code == 0 for run in runs)
        counter["refused"] += sum(run.exit_code == 1 for run in runs)
        counter["crashes caught"] += sum("crashed" in run.message for run in runs)
        failures += [f"{name}: {problem}" for problem in problems]
    print(f"# bad-input corpus, seed {args.seed}, {'full' if args.full else 'CI sample'}; "
          f"{platform.node()}, {time.strftime('%Y-%m-%d')}")  # fmt: skip
    columns = ("files", "runs", "worked", "refused", "crashes caught", "violations")
    print(f"{'generator':24}" + "".join(f"{c:>15}" for c in columns) + f"{'s/file':>8}")
    total: collections.Counter[str] = collections.Counter()
    for generator, counter in sorted(table.items()):
        total.update(counter)
        print(f"{generator:24}" + "".join(f"{counter[c]:15d}" for c in columns)
              + f"{counter['seconds'] / counter['files']:8.2f}")  # fmt: skip
    print(f"{'total':24}" + "".join(f"{total[c]:15d}" for c in columns)
          + f"   wall {time.perf_counter() - start:.0f} s")  # fmt: skip
    for failure in failures:
        print("VIOLATION", failure)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
