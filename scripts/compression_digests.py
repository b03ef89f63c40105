"""Digests of every compressed sample model and its report: a refactor must not change one byte.

    python scripts/compression_digests.py write [--out tests/golden/compression_digests.json]
    python scripts/compression_digests.py check [--golden tests/golden/compression_digests.json]

Compresses each sample model (`.pt2` and `.aimodel`) with each config of tests/test_compress_pt2.py
through `compress_file`, and records the SHA-256 of the output's bytes and of its `--json` report
(timings and paths removed; once more without the SNR figures, for a change that measures them
differently). `check` recomputes them and lists every difference (exit 1 if any).
Runs in about ten minutes on 2 cores: a tool for refactors, not part of the suite.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]
GOLDEN = ROOT / "tests" / "golden" / "compression_digests.json"
SAMPLES = ("mlp", "cnn", "transformer", "wide_range", "int_arith")


def _configs() -> dict[str, object]:
    from coreai_opt.compression import CompressionGranularity as G
    from coreai_opt.compression import DType, PalettizeConfig, QScheme, QuantizeConfig, SparsifyConfig

    return {
        "int8-channel": QuantizeConfig(dtype=DType.INT8),
        "int4-block": QuantizeConfig(dtype=DType.INT4, granularity=G.PER_BLOCK),
        "uint4-channel-asym": QuantizeConfig(dtype=DType.UINT4, qscheme=QScheme.ASYMMETRIC),
        "uint4-block-asym": QuantizeConfig(
            dtype=DType.UINT4, qscheme=QScheme.ASYMMETRIC, granularity=G.PER_BLOCK
        ),
        "int2-channel": QuantizeConfig(dtype=DType.INT2),
        "fp8e4m3": QuantizeConfig(dtype=DType.FP8_E4M3FN),
        "fp8e5m2-e8m0": QuantizeConfig(
            dtype=DType.FP8_E5M2, granularity=G.PER_BLOCK, scale_dtype=DType.FP8_E8M0FNU
        ),
        "mxfp4": QuantizeConfig(dtype=DType.FP4_E2M1FN),
        "lut1-tensor": PalettizeConfig(n_bits=1),
        "lut2-channel": PalettizeConfig(n_bits=2, granularity=G.PER_CHANNEL),
        "lut4-tensor": PalettizeConfig(n_bits=4),
        "lut6-grouped": PalettizeConfig(n_bits=6, granularity=G.PER_GROUPED_CHANNEL, group_size=16),
        "lut8-int8-scale": PalettizeConfig(
            n_bits=8,
            lut_dtype=DType.INT8,
            granularity=G.PER_GROUPED_CHANNEL,
            group_size=16,
            enable_per_channel_scale=True,
        ),
        "lut4-uint8": PalettizeConfig(n_bits=4, lut_dtype=DType.UINT8, granularity=G.PER_CHANNEL),
        "lut2-vector": PalettizeConfig(n_bits=2, cluster_dim=2),
        "sparse50": SparsifyConfig(target_sparsity=0.5),
        "sparse-block4": SparsifyConfig(target_sparsity=0.5, block_size=4),
        "sparse-2of4-int8": SparsifyConfig(n_m_ratio=(2, 4), quantize_dtype=DType.INT8),
        "sparse50-uint8": SparsifyConfig(target_sparsity=0.5, quantize_dtype=DType.UINT8),
        "sparse50-fp8": SparsifyConfig(target_sparsity=0.5, quantize_dtype=DType.FP8_E4M3FN),
        "sparse50-lut4": SparsifyConfig(target_sparsity=0.5, palettize_nbits=4),
    }


def _tree_sha(path: Path) -> str:
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        if file.name == "metadata.json":
            continue  # its creation date is the run's
        digest.update(str(file.relative_to(path.parent)).encode())
        digest.update(file.read_bytes())
    return digest.hexdigest()


def _report_sha(document: dict, leave: tuple[str, ...] = ()) -> str:
    def clean(value: object) -> object:
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items() if k not in ("seconds", "source", "output", *leave)}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value

    return hashlib.sha256(json.dumps(clean(document), sort_keys=True).encode()).hexdigest()


def digests() -> dict[str, dict[str, str]]:
    from coreai_opt._errors import NothingDoneError
    from coreai_opt.recipes import compress_file

    found = {}
    with tempfile.TemporaryDirectory() as folder:
        for sample in SAMPLES:
            for suffix in (".pt2", ".aimodel"):
                for name, config in _configs().items():
                    key = f"{sample}{suffix}:{name}"
                    output = Path(folder) / f"{sample}.{name}{suffix}"
                    try:
                        result = compress_file(ROOT / "sample_models" / f"{sample}{suffix}", output, config,
                                               force=True)  # fmt: skip
                    except NothingDoneError as exc:
                        found[key] = {
                            "nothing_done": str(exc).replace(folder, "<tmp>").replace(str(ROOT), "<root>")
                        }
                        continue
                    document = result.to_dict()
                    found[key] = {"file": _tree_sha(output), "report": _report_sha(document),
                                  "report_without_snr": _report_sha(document, ("snr_db",))}  # fmt: skip
                    print(key, found[key]["file"][:12], found[key]["report"][:12], flush=True)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("action", choices=("write", "check"))
    parser.add_argument("--golden", type=Path, default=GOLDEN)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    found = digests()
    if args.action == "write":
        args.golden.parent.mkdir(parents=True, exist_ok=True)
        args.golden.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
        return
    golden = json.loads(args.golden.read_text())
    changed = sorted(k for k in golden.keys() | found.keys() if golden.get(k) != found.get(k))
    for key in changed:
        print("CHANGED", key, golden.get(key), found.get(key))
    print(f"{len(found) - len(changed)} of {len(found)} unchanged")
    sys.exit(1 if changed else 0)


if __name__ == "__main__":
    main()
