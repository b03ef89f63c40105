"""When the Ray executor pays off: work per weight against the cost of moving it (issue 21).

    python bench/ray_executor.py                  # per-weight table, then 0.1B end to end
    python bench/ray_executor.py --skip-model     # per-weight table only

Part 1, one weight of the 1.1B decoder's MLP shape ([5632, 2048] fp16, 23 MB): for each pass, the
seconds to encode it in this process (one thread) and the seconds a Ray task takes to receive the
weight and its encoding and return the encoding (the object-store transfer an encoding costs, with
no work in it), on a local cluster.

Part 2, the 0.1B decoder (.pt2), whole pass: `compress_` locally and on local Ray clusters of 1, 2
and 4 CPUs (encoders single-threaded inside tasks, so the CPUs are the parallelism), outputs
checked identical. Needs the Ray extra: pip install 'coreopt[ray]'.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ray  # noqa: E402

from bench.decoders import SHAPES, program  # noqa: E402
from coreai_opt._elements import of_torch  # noqa: E402
from coreai_opt.compression import (  # noqa: E402
    PalettizeConfig,
    QuantizeConfig,
    RayExecutor,
    SparsifyConfig,
    WeightSite,
    compress_,
)
from coreai_opt.compression._driver import encode_weight  # noqa: E402
from coreai_opt.io import load_pt2  # noqa: E402

CONFIGS = {
    "quantize int4 block 32": QuantizeConfig(dtype="int4", granularity="block", block_size=32),
    "palettize 4-bit channel": PalettizeConfig(n_bits=4, granularity="channel"),
    "palettize 4-bit grouped 16": PalettizeConfig(n_bits=4, granularity="grouped", group_size=16),
    "palettize 4-bit tensor": PalettizeConfig(n_bits=4),
    "sparsify 2:4": SparsifyConfig(n_m_ratio=(2, 4)),
}


def _echo(weight: torch.Tensor, encoding: object) -> object:
    return encoding


def per_weight() -> None:
    weight = torch.randn(5632, 2048, generator=torch.Generator().manual_seed(0)).mul(0.02).half()
    site = WeightSite(None, "mlp.up.weight", tuple(weight.shape), of_torch(weight.dtype), 0, 1)
    echo = ray.remote(num_cpus=1)(_echo)
    for _ in range(3):  # warm workers and object store before anything is timed
        ray.get(echo.remote(weight, weight))
    print(f"{'pass':<27} {'encode s':>9} {'transfer s':>10} {'encode/transfer':>15}")
    for label, config in CONFIGS.items():
        start = time.perf_counter()
        encoding = encode_weight(weight, site, config)
        encode = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(3):
            ray.get(echo.remote(weight, encoding))
        transfer = (time.perf_counter() - start) / 3
        print(f"{label:<27} {encode:>9.3f} {transfer:>10.3f} {encode / transfer:>15.1f}", flush=True)


def whole_model(size: str, labels: list[str]) -> None:
    source = program(size)
    parameters = SHAPES[size].parameters
    print(f"\n{size} decoder (.pt2), {parameters / 1e6:.0f}M parameters; seconds for compress_ "
          "(load and save excluded)")  # fmt: skip
    print(f"{'pass':<27} {'local':>7} {'ray 1':>7} {'ray 2':>7} {'ray 4':>7}  identical")
    for label in labels:
        config = CONFIGS[label]
        if isinstance(config, PalettizeConfig):  # one k-means thread per task: the CPUs are the tasks
            config = replace(config, num_kmeans_workers=1)
        times, states = [], []
        for cpus in (None, 1, 2, 4):
            ep = load_pt2(source)
            executor = None
            if cpus is not None:
                ray.init(
                    num_cpus=cpus, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR
                )
                executor = RayExecutor()
            start = time.perf_counter()
            compress_(ep, config, executor=executor)
            times.append(time.perf_counter() - start)
            if cpus is not None:
                ray.shutdown()
            states.append({k: v.clone() for k, v in ep.state_dict.items()})
            del ep
        same = all(
            s.keys() == states[0].keys() and all(torch.equal(s[k], states[0][k]) for k in s)
            for s in states[1:]
        )
        print(f"{label:<27} " + " ".join(f"{t:>7.1f}" for t in times) + f"  {same}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="0.1b", choices=list(SHAPES))
    parser.add_argument("--passes", nargs="+", default=list(CONFIGS), choices=list(CONFIGS), metavar="PASS")
    parser.add_argument("--skip-model", action="store_true")
    args = parser.parse_args()
    print(f"# {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"ray {ray.__version__}, torch threads {torch.get_num_threads()}")  # fmt: skip
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    torch.set_num_threads(1)
    per_weight()
    ray.shutdown()
    torch.set_num_threads(os.cpu_count() or 1)
    if not args.skip_model:
        whole_model(args.size, args.passes)


if __name__ == "__main__":
    main()
