"""Peak memory and time of every compression pass on the decoder family (issue 21).

    python bench/scaling.py                        # 0.1b 0.5b 1.1b, both containers
    python bench/scaling.py --sizes 0.1b --containers pt2

Each pass runs as its own `coreopt` process under `/usr/bin/time -v` (peak RSS is the process's
maximum resident set, so every pass starts from a fresh interpreter), writing to a temporary
directory. The table gives wall seconds, seconds per 100M parameters, peak RSS, and peak RSS less
the model's fp16 bytes (goal: at most 1.5 GiB for each pass at 1.1B). Models are built by
bench/decoders.py when missing. The conversions run on the .pt2 only: `convert` of the fp16
program, `cast` of the same decoder built in fp32 (its input is twice the fp16 bytes).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.decoders import SHAPES, asset, program  # noqa: E402

PASSES: dict[str, list[str]] = {
    "quantize int4 block 32": ["quantize", "--dtype", "int4", "--granularity", "block", "--block-size", "32"],
    "palettize 4-bit channel": ["palettize", "--nbits", "4", "--granularity", "channel"],
    "palettize 4-bit grouped 16": [
        "palettize",
        "--nbits",
        "4",
        "--granularity",
        "grouped",
        "--group-size",
        "16",
    ],
    "palettize 4-bit tensor": ["palettize", "--nbits", "4", "--granularity", "tensor"],
    "sparsify 2:4": ["sparsify", "--nm", "2:4"],
}
# the conversions, on the .pt2 only: (coreopt arguments, input is the fp32 program)
CONVERSIONS: dict[str, tuple[list[str], bool]] = {
    "convert to .aimodel": (["convert"], False),
    "cast fp32 -> fp16": (["cast"], True),
}
GIB = 1 << 30


def _measure(command: list[str]) -> tuple[float, int, int]:
    """(wall seconds, peak RSS bytes, exit code) of one process under /usr/bin/time -v."""
    done = subprocess.run(["/usr/bin/time", "-v", *command], capture_output=True, text=True)
    wall = re.search(r"Elapsed \(wall clock\) time.*: (?:(\d+):)?(\d+):([\d.]+)", done.stderr)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
    assert wall and rss, done.stderr[-2000:]
    hours, minutes, seconds = wall.groups()
    seconds_total = int(hours or 0) * 3600 + int(minutes) * 60 + float(seconds)
    if done.returncode:
        print(done.stdout[-1000:], done.stderr[-2000:], file=sys.stderr)
    return seconds_total, int(rss.group(1)) * 1024, done.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--containers", nargs="+", default=["aimodel", "pt2"], choices=["aimodel", "pt2"])
    every = [*PASSES, *CONVERSIONS]
    parser.add_argument("--passes", nargs="+", default=every, choices=every, metavar="PASS")
    args = parser.parse_args()
    coreopt = str(Path(sys.executable).with_name("coreopt"))
    print(f"# {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
          f"one coreopt process per pass under /usr/bin/time -v")  # fmt: skip
    print(f"{'model':<6} {'file':<8} {'pass':<27} {'rc':>2} {'wall s':>8} {'s/100M':>7} "
          f"{'peak GiB':>9} {'- fp16 GiB':>10}")  # fmt: skip
    for size in args.sizes:
        parameters = SHAPES[size].parameters
        fp16 = 2 * parameters
        for container in args.containers:
            model = asset(size) if container == "aimodel" else program(size)
            for label in args.passes:
                source, suffix, command = model, container, PASSES.get(label)
                if command is None:  # a conversion: from the .pt2 (fp16, or fp32 for cast)
                    if container != "pt2":
                        continue
                    command, fp32 = CONVERSIONS[label]
                    source = program(size, fp32=fp32)
                    suffix = "aimodel" if command == ["convert"] else "pt2"
                with tempfile.TemporaryDirectory(dir=ROOT / "build") as tmp:
                    out = Path(tmp) / f"out.{suffix}"
                    wall, rss, rc = _measure([coreopt, *command, str(source), "-o", str(out), "--json"])
                print(f"{size:<6} {container:<8} {label:<27} {rc:>2} {wall:>8.1f} "
                      f"{wall / parameters * 1e8:>7.2f} {rss / GIB:>9.2f} {(rss - fp16) / GIB:>10.2f}",
                      flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
