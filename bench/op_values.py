"""Every operator a program from a file may call, run on hostile values the loader lets through.

    python bench/op_values.py [--trials 2000] [--seed 1] [--ops aten.gather.default,...]

Each op runs `--trials` seeded argument sets whose shapes pass its meta kernel (what the loader's
fake-tensor run checks) with indices far out of range, NaN, infinities and huge counts in them,
in a forked child with an address-space limit (tests/_op_values.py). Prints each op's trials that
reached the kernel, its time, and any that died of a signal with the arguments that killed it.
CI runs 8 trials an op (tests/test_op_values.py).
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

import _op_values as ov  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--ops", default="", help="comma-separated op names (default: every admitted op)")
    args = parser.parse_args()
    wanted = set(filter(None, args.ops.split(",")))
    ops = [op for op in ov.admitted_ops() if not wanted or op.name in wanted]
    print(
        f"# {len(ops)} ops x {args.trials} trials, seed {args.seed}; {platform.node()}, {time.strftime('%Y-%m-%d')}"
    )
    start, deaths, runs = time.perf_counter(), [], 0
    for op in ops:
        begun = time.perf_counter()
        outcome = ov.probe(op, args.seed, args.trials)
        runs += outcome.run
        line = f"{op.name:55} {outcome.run:6d} reached {time.perf_counter() - begun:7.1f} s"
        if outcome.died is not None:
            deaths.append(op.name)
            line += f"  DIED {outcome.died} on {ov.describe(op, args.seed, outcome.trial)}"  # type: ignore[arg-type]
        print(line, flush=True)
    print(f"# {runs} trials reached a kernel; {len(deaths)} ops died ({', '.join(deaths) or 'none'}); "
          f"{time.perf_counter() - start:.0f} s")  # fmt: skip
    sys.exit(1 if deaths else 0)


if __name__ == "__main__":
    main()
