"""What W8A8 calibration costs on ResNet-18: CPU seconds of `coreopt quantize --activations` with 8
calibration samples, for this checkout and for any other code trees given (an older commit's
worktree: the before of a change).

    python bench/w8a8_cost.py [--tree PATH ...] [--samples 8] [--observers minmax mse] [--repeat N]

Two columns per run: the whole command, and its calibration flow alone - CPU from the moment the
program is loaded to the moment it is handed to the save (prepare, the passes, finalize, and in
trees that needed it the export of the finalized module), which leaves out interpreter start-up,
imports before the load, reading and writing the file. With --repeat the trees run interleaved
and the medians are printed.

The model is transformers' ResNet-18 layout (basic blocks, 64-128-256-512, seeded random weights,
11.7M parameters) at 224x224, exported with coreai-torch's decompositions and returning its logits
as a plain tensor (so an older tree that cannot read Hugging Face output containers reads it too).
Each tree runs the same command in its own process; CPU seconds are the child's user + system.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
warnings.filterwarnings("ignore")


def build(path: Path) -> None:
    import coreai_torch
    import torch
    from transformers import ResNetConfig, ResNetForImageClassification

    class Logits(torch.nn.Module):
        def __init__(self, model: torch.nn.Module) -> None:
            super().__init__()
            self.model = model

        def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
            return self.model(pixel_values).logits

    torch.manual_seed(0)
    config = ResNetConfig(embedding_size=64, hidden_sizes=[64, 128, 256, 512], depths=[2, 2, 2, 2],
                          layer_type="basic", num_labels=1000)  # fmt: skip
    model = Logits(ResNetForImageClassification(config).eval())
    with torch.no_grad():
        program = torch.export.export(model, (torch.randn(1, 3, 224, 224),))
    torch.export.save(program.run_decompositions(coreai_torch.get_decomp_table()), path)


FLOW_MARK = "calibration flow CPU s:"


def _flow_child(argv: list[str]) -> None:
    """Run the CLI in this process, timing from the program's load to its save (see the docstring).
    Older trees quantized activations in `quantization._file`, newer ones in `recipes._apply`."""
    import importlib

    try:
        module = importlib.import_module("coreai_opt.recipes._apply")
        module._quantize_activations  # noqa: B018
    except (ImportError, AttributeError):
        module = importlib.import_module("coreai_opt.quantization._file")
    marks: dict[str, float] = {}
    load, save = module.load_pt2, module.save_pt2

    def timed_load(*args: object, **kwargs: object) -> object:
        program = load(*args, **kwargs)
        marks["loaded"] = time.process_time()
        return program

    def timed_save(*args: object, **kwargs: object) -> object:
        marks["saving"] = time.process_time()
        return save(*args, **kwargs)

    module.load_pt2, module.save_pt2 = timed_load, timed_save
    from cli.coreopt_app import main as coreopt

    sys.argv = ["coreopt", *argv]
    try:
        coreopt()
    except SystemExit as done:
        if done.code:
            raise
    print(FLOW_MARK, marks["saving"] - marks["loaded"])


def cost(tree: Path, model: Path, samples: int, observer: str, out: Path) -> tuple[float, float, float, int]:
    """(CPU seconds, calibration flow CPU seconds, wall seconds, exit code) of one W8A8 run from `tree`."""
    args = [sys.executable, __file__, "--flow-child", "quantize", str(model), "--dtype", "int8",
            "--activations", "int8", "--calibration", "random", "--calibration-samples", str(samples),
            "--observer", observer, "-o", str(out), "--force", "-q"]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONWARNINGS="ignore")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    done = subprocess.run(args, cwd=tree, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        print(done.stderr[-2000:], file=sys.stderr)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    flows = [line for line in done.stdout.splitlines() if line.startswith(FLOW_MARK)]
    flow = float(flows[-1].removeprefix(FLOW_MARK)) if flows else float("nan")
    return cpu, flow, wall, done.returncode


def main() -> None:
    if sys.argv[1:2] == ["--flow-child"]:
        _flow_child(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tree", type=Path, nargs="*", default=[], help="other code trees to time")
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--observers", nargs="*", default=["minmax", "mse"])
    parser.add_argument("--repeat", type=int, default=1, help="interleaved rounds; medians printed")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "w8a8_cost")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = args.out / "resnet18.pt2"
    if not model.exists():
        build(model)
    print(f"{'tree':<40} {'observer':<10} {'CPU s':>8} {'flow s':>8} {'wall s':>8}  exit")
    for observer in args.observers:
        runs: dict[Path, list[tuple[float, float, float, int]]] = {}
        for _ in range(args.repeat):
            for tree in [ROOT, *args.tree]:
                runs.setdefault(tree, []).append(
                    cost(tree.resolve(), model, args.samples, observer, args.out / "resnet18.w8a8.pt2")
                )
        for tree, measured in runs.items():
            cpu, flow, wall = (statistics.median(m[i] for m in measured) for i in range(3))
            code = max(m[3] for m in measured)
            print(f"{tree!s:<40} {observer:<10} {cpu:8.1f} {flow:8.2f} {wall:8.1f}  {code}", flush=True)


if __name__ == "__main__":
    main()
