"""W8A8 on the sample models: accuracy against fp32 in PyTorch and on the Core AI runtime, per observer.

    python bench/w8a8.py

For each sample model and observer: the seeded model is prepared, calibrated on 32 seeded
samples, finalized, exported, cast to 16 bits and converted; then compared with the fp32 program
on 32 other samples (worst and mean cosine, mean SNR), in PyTorch (the finalized export) and on
the runtime (the converted program), and the runtime against the cast export in PyTorch.
"""

from __future__ import annotations

import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
warnings.filterwarnings("ignore")


def main() -> None:
    from conftest import SAMPLES, load_sample_builder
    from safetensors.torch import save_file

    from coreai_opt._export import coreai_decompositions
    from coreai_opt.casting import cast_to_16_bit_precision
    from coreai_opt.comparison import compare_files
    from coreai_opt.conversion import convert_exported_program
    from coreai_opt.inputs import exported_program_specs
    from coreai_opt.io import load_pt2, save_aimodel, save_pt2
    from coreai_opt.quantization import Observer, Quantizer, QuantizerConfig

    build = load_sample_builder()
    table = Table(title="W8A8 vs fp32 (32 held-out samples; cosine worst / mean, SNR mean)")
    for column in ("model", "observer", "torch cosine", "torch SNR dB", "runtime cosine", "runtime vs torch",
                   "calibrate s"):  # fmt: skip
        table.add_column(column, justify="left" if column in ("model", "observer") else "right")
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        for name in ("cnn", "transformer"):
            sample = next(s for s in build.SAMPLES if s.name == name)

            def inputs(seed: int, sample: object = sample) -> tuple[torch.Tensor, ...]:
                torch.manual_seed(seed)
                return sample.example_inputs()  # type: ignore[attr-defined]

            names = [s.name for s in exported_program_specs(load_pt2(SAMPLES / f"{name}.pt2"))]
            held = [inputs(s) for s in range(1000, 1032)]
            held_out = tmp / f"{name}.held.safetensors"
            save_file({n: torch.stack([x[i] for x in held]) for i, n in enumerate(names)}, str(held_out))
            for observer in Observer:
                start = time.perf_counter()
                quantizer = Quantizer(build.make_model(sample), QuantizerConfig.w8a8(observer))
                prepared = quantizer.prepare(inputs(0))
                with quantizer.calibration_mode():
                    for seed in range(100, 132):
                        prepared(*inputs(seed))
                final = quantizer.finalize()
                seconds = time.perf_counter() - start
                program = torch.export.export(final, inputs(0)).run_decompositions(coreai_decompositions())
                save_pt2(program, tmp / "final.pt2", force=True)
                cast_to_16_bit_precision(program)
                save_pt2(program, tmp / "cast.pt2", force=True)
                save_aimodel(convert_exported_program(program), tmp / "w8a8.aimodel", force=True)
                in_torch = compare_files(SAMPLES / f"{name}.pt2", tmp / "final.pt2", inputs=held_out)
                runtime = compare_files(SAMPLES / f"{name}.pt2", tmp / "w8a8.aimodel", inputs=held_out)
                agree = compare_files(tmp / "cast.pt2", tmp / "w8a8.aimodel", inputs=held_out)
                t, r, a = in_torch.outputs[0], runtime.outputs[0], agree.outputs[0]
                table.add_row(
                    name, observer.value, f"{t.metrics.cosine:.5f} / {t.spread.cosine_mean:.5f}",
                    f"{t.spread.snr_db_mean:.2f}", f"{r.metrics.cosine:.5f} / {r.spread.cosine_mean:.5f}",
                    f"{a.metrics.cosine:.6f}", f"{seconds:.2f}",
                )  # fmt: skip
    Console().print(table)


if __name__ == "__main__":
    main()
