"""Peak host memory of compression that learns from data on the CPU path: the 1.1B decoder.

    python bench/learned_memory.py [--size 1.1b] [--samples 8] [--methods NAME ...]
                                   [--threads N] [--parallel K] [--out PATH]

Each method runs as the CLI runs it - `coreopt quantize | palettize | sparsify MODEL --method ...
--calibration random --calibration-samples N --threshold 0 -o OUT`: one program, calibrated and
compressed in place, then saved - in a child process of its own, `--parallel` children at a time
with `--threads` threads each. A child's peak host memory is its maximum resident set size as
the kernel counts it (`os.wait4`, what `/usr/bin/time -v` prints), printed beside the decoder's
fp16 bytes and issue 41's bound (fp16 bytes + 2 GiB). The decoder is bench/decoders.py's
(seeded random weights, fp16; TinyLlama's shape at 1.1B) exported at 512 tokens. Rows are
written to `--out` (JSON) as they finish; a row already there is not run again.

The kernel's count for a child starts at its parent's: Python starts children with vfork, and
exec records the parent's peak as the child's (a parent that once held 3 GiB gives every child
at least 3 GiB). So this process never holds a model: the decoder is built in a child of its
own, and a row whose peak this process's own could have set (or recorded before that was kept)
is shown as unknown.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

_BLOCK32 = ["--granularity", "block", "--block-size", "32"]
_LUT = ["palettize", "--nbits", "4", "--granularity", "grouped", "--group-size", "16", "--workers", "0"]
METHODS: dict[str, list[str]] = {
    "int4-ch-gptq": ["quantize", "--dtype", "int4", "--method", "gptq"],
    "uint4-b32-gptq": ["quantize", "--dtype", "uint4", *_BLOCK32, "--method", "gptq"],
    "mxfp4-gptq": ["quantize", "--dtype", "mxfp4", "--method", "gptq"],
    "lut4-g16-importance": [*_LUT, "--method", "importance"],
    "lut4-g16-gptq": [*_LUT, "--method", "gptq"],
    "lut4-g16-sensitive": [*_LUT, "--method", "sensitive"],
    "sparse50-sparsegpt": ["sparsify", "--sparsity", "0.5", "--method", "sparsegpt"],
    "sparse24-sparsegpt": ["sparsify", "--nm", "2:4", "--method", "sparsegpt"],
}
_CLI = "from cli.coreopt_app import main; main()"


def _start(
    name: str, model: Path, samples: int, threads: int, scratch: Path
) -> tuple[subprocess.Popen, float]:
    command = [sys.executable, "-c", _CLI, *METHODS[name], str(model), "--calibration", "random",
               "--calibration-samples", str(samples), "--threshold", "0", "--quiet",
               "-o", str(scratch / f"{name}.pt2")]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}  # fmt: skip
    log = (scratch / f"{name}.log").open("w")
    return subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
    ), time.perf_counter()


def _peak_here() -> int:
    """This process's peak resident set in bytes (VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def _built(size: str) -> Path:
    """bench/decoders.py's program, built (once) in a child so that its memory is not ours."""
    script = f"from decoders import program; print(program({size!r}, sequence=512))"
    paths = (str(ROOT / "bench"), str(ROOT), os.environ.get("PYTHONPATH", ""))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True)
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        sys.exit(f"building the {size} decoder failed: {last}")
    return Path(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1.1b")
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--methods", nargs="*", help="in this order (default: all)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--parallel", type=int, default=1)
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "bench" / "learned_memory.json")
    args = parser.parse_args()
    from decoders import SHAPES

    model = _built(args.size)
    fp16 = SHAPES[args.size].parameters * 2
    bound = fp16 + 2 * 2**30
    rows: dict[str, dict[str, object]] = json.loads(args.out.read_text()) if args.out.exists() else {}
    unknown = sorted(set(args.methods or ()) - set(METHODS))
    if unknown:
        parser.error(f"unknown methods {unknown}: choose from {list(METHODS)}")
    waiting = [m for m in args.methods or METHODS if f"{args.size}/{m}" not in rows]  # in the order given
    scratch = Path(tempfile.mkdtemp(prefix="learned_memory_"))
    running: dict[int, tuple[str, subprocess.Popen, float]] = {}
    print(f"{args.size}: fp16 {fp16 / 2**30:.2f} GiB, bound {bound / 2**30:.2f} GiB; {args.samples} x 512 "
          f"calibration tokens; {args.parallel} at a time, {args.threads} threads each", flush=True)  # fmt: skip
    while waiting or running:
        while waiting and len(running) < args.parallel:
            name = waiting.pop(0)
            child, begun = _start(name, model, args.samples, args.threads, scratch)
            running[child.pid] = (name, child, begun)
        pid, status, usage = os.wait4(-1, 0)
        if pid not in running:
            continue
        name, child, begun = running.pop(pid)
        child.returncode = os.waitstatus_to_exitcode(status)
        peak = usage.ru_maxrss * 1024  # kilobytes on Linux
        tail = (scratch / f"{name}.log").read_text().strip().splitlines()[-1:] if child.returncode else []
        rows[f"{args.size}/{name}"] = {"peak_rss_gib": peak / 2**30, "fp16_gib": fp16 / 2**30,
                                       "bound_gib": bound / 2**30, "seconds": time.perf_counter() - begun,
                                       "exit": child.returncode, "samples": args.samples,
                                       "threads": args.threads, "error": " ".join(tail),
                                       "bench_peak_gib": _peak_here() / 2**30}  # fmt: skip
        (scratch / f"{name}.pt2").unlink(missing_ok=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=1))
    for key, row in rows.items():
        verdict = "met" if row["peak_rss_gib"] <= row["bound_gib"] else "NOT met"  # type: ignore[operator]
        if row["peak_rss_gib"] <= row.get("bench_peak_gib", row["peak_rss_gib"]):  # type: ignore[operator]
            verdict = "unknown (the bench's own peak, or recorded before it was kept)"
        print(f"{key:28s} peak RSS {row['peak_rss_gib']:5.2f} GiB (bound {row['bound_gib']:.2f}) {verdict:7s} "
              f"{row['seconds']:6.0f} s  exit {row['exit']} {row['error']}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
