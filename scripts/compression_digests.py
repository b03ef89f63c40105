"""Digests of every compressed, cast and converted sample model and of every report (inspect's
too): a refactor must not change one byte.

    python scripts/compression_digests.py write [--out tests/golden/compression_digests.json]
    python scripts/compression_digests.py check [--golden tests/golden/compression_digests.json]

Compresses each sample model (`.pt2` and `.aimodel`) with each config of tests/test_compress_pt2.py
through `compress_file`, casts each `.pt2` to 16 bits and converts it, inspects every sample, and
records the SHA-256 of each output's bytes and of its `--json` report (timings and paths removed;
once more without the SNR figures, for a change that measures them differently). `check`
recomputes them and lists every difference (exit 1 if any). About 90 s on 2 cores;
tests/test_golden_outputs.py checks a slice of it in the suite.
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
_HERE = [""]  # the scratch folder of the run: its name is left out of the reports' digests


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

    text = json.dumps(clean(document), sort_keys=True)
    for place, name in ((_HERE[0], "<tmp>"), (str(ROOT), "<root>")):
        text = text.replace(place, name) if place else text
    return hashlib.sha256(text.encode()).hexdigest()


def _compressed(folder: str, sample: str, suffix: str, name: str, config: object) -> dict[str, str]:
    from coreai_opt.errors import NothingDoneError
    from coreai_opt.recipes import compress_file

    output = Path(folder) / f"{sample}.{name}{suffix}"
    try:
        result = compress_file(ROOT / "sample_models" / f"{sample}{suffix}", output, config, force=True)
    except NothingDoneError as exc:
        return {"nothing_done": str(exc).replace(folder, "<tmp>").replace(str(ROOT), "<root>")}
    return _written(output, result.to_dict())


def _written(output: Path, document: dict) -> dict[str, str]:
    return {"file": _tree_sha(output), "report": _report_sha(document),
            "report_without_snr": _report_sha(document, ("snr_db",))}  # fmt: skip


# the cast's check runs the float16 program on this machine's CPU: its errors differ in their last
# bits from one x86 CPU to another (an Intel Xeon's float16 arithmetic against an AMD EPYC's)
_MEASURED_ON_THIS_CPU = ("snr_db", "max_abs_error", "relative_error", "cosine")


def _cast_written(output: Path, document: dict) -> dict[str, str]:
    return {"file": _tree_sha(output), "report": _report_sha(document, _MEASURED_ON_THIS_CPU)}


def _other_commands(folder: str, sample: str) -> dict[str, dict[str, str]]:
    """The sample cast to 16 bits and converted (its .pt2), and both formats inspected."""
    from coreai_opt.inspection import inspect_model
    from coreai_opt.recipes import cast_file, convert_file

    source = ROOT / "sample_models" / f"{sample}.pt2"
    cast = Path(folder) / f"{sample}.16bit.pt2"
    converted = Path(folder) / f"{sample}.aimodel"
    found = {
        f"{sample}.pt2:cast-16bit": _cast_written(
            cast, cast_file(source, "16bit", cast, force=True).to_dict()
        ),
        # coreai-core keys a converted program's resources at random in each process (the same
        # bytes within one): the report only, until conversion names them by place
        f"{sample}.pt2:convert": {
            "report": _report_sha(convert_file(source, converted, force=True).to_dict())
        },
    }
    for suffix in (".pt2", ".aimodel"):
        report = inspect_model(ROOT / "sample_models" / f"{sample}{suffix}").to_dict()
        found[f"{sample}{suffix}:inspect"] = {"report": _report_sha(report)}
    return found


def digests(
    samples: tuple[str, ...] = SAMPLES, configs: tuple[str, ...] | None = None
) -> dict[str, dict[str, str]]:
    """Every entry of the given samples (the given configs only, and no other command, if named)."""
    found = {}
    with tempfile.TemporaryDirectory() as folder:
        _HERE[0] = folder
        for sample in samples:
            for suffix in (".pt2", ".aimodel"):
                for name, config in _configs().items():
                    if configs is None or name in configs:
                        found[f"{sample}{suffix}:{name}"] = _compressed(folder, sample, suffix, name, config)
            if configs is None:
                found.update(_other_commands(folder, sample))
    for key, value in found.items():
        print(key, *(v[:12] for v in value.values()), flush=True)
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
