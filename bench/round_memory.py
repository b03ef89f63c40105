"""Host memory of one `optimize` round on a device, phase by phase: the plan's recipe applied
(`apply_recipe`, GPTQ on random calibration, as a round makes its program) and the program judged
against the reference (`evaluate_text`), with the process's resident memory sampled every 20 ms.

    python bench/round_memory.py [--size 1.1b] [--sequence 512] [--device cuda] [--tokens 2048]
                                 [--tune-epochs 0]

A round of `optimize_device.py` without its 7-minute cost table before it: the recipe is fixed
(look-up tables of 16 entries per group of 16 channels on the MLP weights, int4 in blocks of 32
on the attention weights, both by GPTQ), so the numbers say where a round's host memory goes,
not how good a plan is. Prints each phase's start and peak; writes them to `--out` (JSON) with
the main thread's innermost frames at each phase's peak, the progress events and the resident
memory every 0.1 s, so a peak can be put in its function and its moment.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]  # coreai_opt from this checkout, and decoders


class Sampler:
    """The resident memory every `every` seconds on a thread, its peak kept per named phase with
    the main thread's stack at that moment."""

    def __init__(self, every: float = 0.02) -> None:
        self.every, self.phase, self.peaks = every, "start", {}
        self.starts: dict[str, float] = {}
        self.began = time.perf_counter()
        self.series: list[tuple[float, float]] = []  # (seconds, GiB) every 0.1 s
        self.events: list[tuple[float, str]] = []  # (seconds, what progress said)
        self.where: dict[str, list[str]] = {}  # the main thread's innermost frames at each phase's peak
        self._main = threading.main_thread().ident
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def enter(self, phase: str) -> None:
        import decoders

        self.phase = phase
        self.starts[phase] = decoders.host_rss()[0]
        self.events.append((round(time.perf_counter() - self.began, 2), phase))

    def progress(self, done: int, total: int, what: str) -> None:
        """A progress callback: each stage's first and last steps kept as events."""
        if done in (0, 1, total):
            self.events.append((round(time.perf_counter() - self.began, 2), f"{done}/{total} {what}"))

    def _run(self) -> None:
        import decoders

        last = -1.0
        while not self._stop.wait(self.every):
            now = decoders.host_rss()[0]
            if now > self.peaks.get(self.phase, 0.0):
                self.peaks[self.phase] = now
                self.where[self.phase] = self._stack()
            seconds = time.perf_counter() - self.began
            if seconds - last >= 0.1:
                self.series.append((round(seconds, 2), round(now, 3)))
                last = seconds

    def _stack(self) -> list[str]:
        frame = sys._current_frames().get(self._main)
        if frame is None:
            return []
        frames = traceback.extract_stack(frame)[-12:]
        return [f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in frames]


def _recipe(args) -> object:
    from coreai_opt.calibration import CalibrationSpec
    from coreai_opt.compression import Override, PalettizeConfig, QuantizeConfig
    from coreai_opt.recipes import Compress, Recipe

    mlp = ("*gate_proj*", "*up_proj*", "*down_proj*")  # bench/decoders.py's names (no "mlp" in them)
    luts = PalettizeConfig(
        n_bits=4,
        granularity="grouped",
        group_size=16,
        method="gptq",
        num_kmeans_workers=0,
        overrides=(*(Override.of(p, method="gptq") for p in mlp), Override.of("*", skip=True)),
        tune_epochs=args.tune_epochs,
    )  # fmt: skip  (the first match wins, as in a plan's steps)
    ints = QuantizeConfig(dtype="int4", granularity="block", block_size=32, method="gptq",
                          overrides=tuple(Override.of(p, skip=True) for p in mlp))  # fmt: skip
    spec = CalibrationSpec(source="random", samples=args.samples, device=args.device)
    return Recipe((Compress(config=luts), Compress(config=ints)), spec)


def main() -> None:
    import decoders
    import torch

    parser = decoders.device_parser(__doc__, "round_memory")
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument(
        "--tune-epochs", type=int, default=0, help="the tables tuned end to end, as optimize's"
    )
    args = parser.parse_args()
    from coreai_opt.evaluation import evaluate_text
    from coreai_opt.recipes import apply_recipe

    program = decoders.program(args.size, sequence=args.sequence)
    ids = decoders.token_file(program, args.size, args.tokens, seed=1)
    out = program.with_name("round.pt2")
    with Sampler() as sampler:
        sampler.enter("device ready")
        if args.device.startswith("cuda"):
            torch.zeros(1, device=args.device) @ torch.zeros(1, device=args.device)  # context, cuBLAS
        sampler.enter("apply")
        began = time.perf_counter()
        apply_recipe(_recipe(args), program, out, force=True, allow_empty=True, progress=sampler.progress)
        applied = time.perf_counter() - began
        sampler.enter("judge")
        found = evaluate_text(program, [out], tokens=ids, max_tokens=args.tokens, device=args.device,
                              progress=sampler.progress)  # fmt: skip
        judged = time.perf_counter() - began - applied
    phases = {p: {"start_gib": round(sampler.starts[p], 2), "peak_gib": round(sampler.peaks.get(p, 0.0), 2),
                  "peak_in": sampler.where.get(p, [])} for p in sampler.starts}  # fmt: skip
    for name, row in phases.items():
        print(f"{name:14s} start {row['start_gib']:5.2f} GiB  peak {row['peak_gib']:5.2f} GiB")
    row = {"size": args.size, "sequence": args.sequence, "apply_s": round(applied, 1), "judge_s": round(judged, 1),
           "kl_mean": found.candidates[0].kl_mean, "phases": phases, "events": sampler.events,
           "series": sampler.series}  # fmt: skip
    decoders.report(row, args.device, args.out)


if __name__ == "__main__":
    main()
