"""Wall time of palettization on a synthetic BERT-base (108.9M fp16 parameters).

    python bench/palettize.py [--workers 2] [--configs 4-tensor 4-channel ...]

The model is the one bench/compress.py builds and caches under build/bench/. Each configuration
palettizes every weight above the 1,024-element threshold once (`palettize_program` on a loaded
program; one run, the k-means kernels compiled beforehand) and reports the time, the mean bits per
weight (LUTs included), the mean weight SNR and the total squared error of the weights. Goals
(issue 6): per-tensor <= 4 s and per-channel <= 20 s on a 2-core machine (the peer library:
19.7 s per-tensor, 33 s grouped-16, 309 s per-channel).
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import time
import warnings

import numpy as np
import torch
from compress import bert_base_asset

from coreai_opt.compression.algorithms._kmeans_1d import kmeans_1d
from coreai_opt.coreai_utils import CompressionGranularity, PalettizeConfig, compress_
from coreai_opt.io import load_aimodel

G = CompressionGranularity
CONFIGS = {
    "4-tensor": PalettizeConfig(n_bits=4),
    "4-channel": PalettizeConfig(n_bits=4, granularity=G.PER_CHANNEL),
    "4-grouped16": PalettizeConfig(n_bits=4, granularity=G.PER_GROUPED_CHANNEL, group_size=16),
    "2-tensor": PalettizeConfig(n_bits=2),
    "8-tensor": PalettizeConfig(n_bits=8),
}


def main() -> None:
    warnings.filterwarnings("ignore")
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS))
    args = parser.parse_args()
    path = bert_base_asset()
    kmeans_1d(np.arange(40.0), np.ones(40), np.array([0, 40]), 4)  # compile (or load) the kernels
    print(
        f"# torch {torch.__version__}, {args.workers} k-means threads, {platform.machine()}, bert-base fp16"
    )
    print(f"{'configuration':<14} {'weights':>7} {'M elem':>7} {'seconds':>8} {'bits/w':>7} {'mean SNR':>9}")
    for name in args.configs:
        config = dataclasses.replace(CONFIGS[name], num_kmeans_workers=args.workers)
        program = load_aimodel(path)
        start = time.perf_counter()
        report = compress_(program, config)
        seconds = time.perf_counter() - start
        snr = np.mean([w.snr_db for w in report.weights])
        print(f"{name:<14} {len(report.weights):>7} {report.elements / 1e6:>7.1f} {seconds:>8.2f} "
              f"{report.bits_per_weight:>7.2f} {snr:>9.2f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
