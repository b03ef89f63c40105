"""Make a virtual environment that holds another one's packages less some, by linking them.

    python scripts/link_venv.py SOURCE_VENV TARGET_VENV --without triton

`make test-without-triton` runs part of the suite where triton is not installed (as on macOS,
where it ships no wheel). Installing every package a second time costs about a minute of the CI
budget (torch alone is most of it); the same installed files, linked one entry of site-packages
at a time with the named distributions' packages and metadata left out, are the same environment
less those distributions: `importlib.util.find_spec` and `importlib.metadata` do not see them.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path


def _site_packages(venv: Path) -> Path:
    python = venv / "bin" / "python"
    done = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return Path(done.stdout.strip())


def _left_out(entry: str, names: list[str]) -> bool:
    """A distribution's package, module or metadata (`triton`, `triton-3.9.0.dist-info`, ...)."""
    stem = re.split(r"[-.]", entry, maxsplit=1)[0].lower()
    return stem in names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path)
    parser.add_argument("--without", action="append", default=[], help="a distribution to leave out")
    args = parser.parse_args()
    names = [name.lower().replace("-", "_") for name in args.without]
    source = _site_packages(args.source)
    shutil.rmtree(args.target, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(args.target)], check=True)
    target = _site_packages(args.target)
    linked = 0
    for entry in sorted(source.iterdir()):
        if _left_out(entry.name, names) or (target / entry.name).exists():
            continue
        (target / entry.name).symlink_to(entry.resolve())
        linked += 1
    print(f"{args.target}: {linked} entries of {source} linked, without {', '.join(args.without)}")


if __name__ == "__main__":
    main()
