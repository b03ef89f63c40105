"""Time of `cast_to_16_bit_precision` on transformer encoder exports of growing depth, and on a
LLaMA-style decoder of about 100M parameters.

    python bench/cast_graph.py [--layers 12 24 48] [--repeat 5] [--no-llama]

Prints a table: nodes, median seconds, nodes per second, and the time relative to the
smallest model. Goals (issue 4): linear growth (48 layers at most 4.5x the 12-layer time) and
under 0.75 s for a ~3,700-node, 48-layer export on a 2-core machine. The decoder (issue 23) is
tests/_architectures.py's `Llama` with fp16 weights (RMSNorm as Hugging Face writes it, rotary
grouped-query attention, SwiGLU), the shape on which the cast once broke the graph's order.
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

from coreai_opt.casting import cast_to_16_bit_precision

ROOT = Path(__file__).resolve().parents[1]


def _samples() -> object:
    spec = importlib.util.spec_from_file_location("sample_models_build", ROOT / "sample_models" / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def export_encoder(layers: int, path: Path) -> int:
    import coreai_torch

    samples = _samples()
    torch.manual_seed(0)
    model = samples.TinyTransformer(layers=layers).eval()  # type: ignore[attr-defined]
    inputs = samples._transformer_inputs()  # type: ignore[attr-defined]
    with torch.no_grad():
        program = torch.export.export(model, inputs).run_decompositions(coreai_torch.get_decomp_table())
    torch.export.save(program, path)
    return len(program.graph.nodes)


LLAMA_100M = dict(vocab=16000, dim=768, layers=12, heads=12, kv_heads=4, hidden=2048)


def export_llama(path: Path) -> tuple[int, int]:
    """The ~100M-parameter decoder in fp16: (nodes, parameters)."""
    import coreai_torch

    sys.path.insert(0, str(ROOT / "tests"))
    import _architectures as arch

    shape = arch.LlamaShape(**LLAMA_100M)  # type: ignore[arg-type]
    torch.manual_seed(0)
    model = arch.Llama(shape).eval().half()
    with torch.no_grad():
        program = torch.export.export(model, arch.token_inputs(shape.vocab, length=128))
        program = program.run_decompositions(coreai_torch.get_decomp_table())
    torch.export.save(program, path)
    return len(program.graph.nodes), shape.parameters


def median_cast_seconds(path: Path, repeat: int) -> float:
    times = []
    for _ in range(repeat + 1):  # the first run warms caches and is dropped
        program = torch.export.load(path)
        start = time.perf_counter()
        cast_to_16_bit_precision(program)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def main() -> None:
    warnings.filterwarnings("ignore")
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--layers", type=int, nargs="+", default=[12, 24, 48])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-llama", action="store_true", help="skip the 100M-parameter decoder")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for layers in args.layers:
            path = Path(tmp) / f"encoder{layers}.pt2"
            nodes = export_encoder(layers, path)
            rows.append((layers, nodes, median_cast_seconds(path, args.repeat)))
        llama = None
        if not args.no_llama:
            path = Path(tmp) / "llama100m.pt2"
            nodes, parameters = export_llama(path)
            llama = (nodes, parameters, median_cast_seconds(path, args.repeat))
    print(
        f"# torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.processor() or platform.machine()}"
    )
    print(f"{'layers':>6s} {'nodes':>6s} {'median s':>9s} {'nodes/s':>9s} {'us/node':>8s} {'x first':>8s}")
    base = rows[0][2]
    for layers, nodes, seconds in rows:
        print(
            f"{layers:6d} {nodes:6d} {seconds:9.4f} {nodes / seconds:9.0f} {seconds / nodes * 1e6:8.1f} {seconds / base:8.2f}"
        )
    if llama is not None:
        nodes, parameters, seconds = llama
        print(f"LLaMA-style decoder, {parameters / 1e6:.1f}M parameters in fp16 (12 layers, GQA 12/4 heads):")
        print(f"{'':6s} {nodes:6d} {seconds:9.4f} {nodes / seconds:9.0f} {seconds / nodes * 1e6:8.1f}")


if __name__ == "__main__":
    main()
