"""Caches are not trusted blindly: a cache folder is used only when it is a folder owned by this user
that nobody else may write (else the work is done afresh, with one warning line on stderr naming
the fix); a folder of coreopt's own cache others could write to is emptied and made private; a
link of the user's is followed to the folder it leads to, which is judged; an index names plain
files of its own folder, as its writer names them; a damaged entry is a miss; numba's pickled
kernels are never loaded from a folder that fails the rule, and importing them does no work."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from coreai_opt._cache import cache_folder_for, folder_problem, user_cache
from coreai_opt.calibration import Samples, calibrate
from coreai_opt.io import load_pt2
from coreai_opt.weights import Needs
from tests.conftest import ROOT, SAMPLES

MLP_WEIGHTS = ["fc1.weight", "fc2.weight", "fc3.weight"]


def _samples(tmp_path: Path) -> Samples:
    path = tmp_path / "x.safetensors"
    save_file({"x": torch.randn(2, 4, 64, generator=torch.Generator().manual_seed(1))}, str(path))
    return Samples.of(path)


def _gram(samples: Samples, cache: bool = True) -> dict[str, torch.Tensor]:
    found = calibrate(load_pt2(SAMPLES / "mlp.pt2"), samples, cache=cache).statistics(
        MLP_WEIGHTS, Needs.INPUT_GRAM
    )
    return {name: s.gram for name, s in found.items()}


def _squares(samples: Samples, cache: bool = True) -> dict[str, torch.Tensor]:
    found = calibrate(load_pt2(SAMPLES / "mlp.pt2"), samples, cache=cache).statistics(
        MLP_WEIGHTS, Needs.GRADIENT_SQUARES
    )
    return {name: s.gradient_squares for name, s in found.items()}


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _warnings(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("warning: cache folder")]


def _shared(folder: Path, mode: int = 0o777) -> str:
    """Why a folder outside coreopt's own cache that others may write to is not used, with the fix."""
    return f"others may write to it (mode {mode:04o}); `chmod go-w {folder}` makes it usable"


# ----- the rule ----------------------------------------------------------------------------------


def test_the_rule_takes_only_a_folder_of_this_users_that_nobody_else_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ours = tmp_path / "ours"
    ours.mkdir(mode=0o700)
    assert folder_problem(ours) is None
    (tmp_path / "link").symlink_to(ours)
    (tmp_path / "file").write_text("")
    assert folder_problem(tmp_path / "link") == "it is a symbolic link"
    assert folder_problem(tmp_path / "file") == "it is not a folder"
    assert folder_problem(tmp_path / "missing") == "it does not exist"
    for mode in (0o777, 0o770, 0o702):
        ours.chmod(mode)
        assert folder_problem(ours) == f"others may write to it (mode {mode:04o})"
    ours.chmod(0o755)  # others may read: nothing they could plant
    assert folder_problem(ours) is None
    uid = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: uid + 1)
    assert folder_problem(ours) == f"it is owned by user {uid}, not by this one ({uid + 1})"


def test_cache_folders_and_their_parents_are_made_private_and_a_bad_one_is_named_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    made = cache_folder_for(tmp_path / "a" / "b" / "c", create=True)
    assert made == tmp_path / "a" / "b" / "c"
    for folder in (tmp_path / "a", tmp_path / "a" / "b", made):
        assert folder.stat().st_mode & 0o777 == 0o700
    assert cache_folder_for(tmp_path / "none", create=False) is None and not (tmp_path / "none").exists()
    made.chmod(0o777)
    assert cache_folder_for(made, create=True, without="done afresh") is None
    assert cache_folder_for(made, create=False, without="done afresh") is None
    assert _warnings(capsys.readouterr().err) == [
        f"warning: cache folder {made} is not used: {_shared(made)}; done afresh"
    ]


def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home of the test's own: ~/.cache/coreopt is in it, no cache path set."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("COREOPT_CACHE", raising=False)
    return tmp_path / "home"


def test_a_folder_of_coreopts_own_cache_others_may_write_is_emptied_and_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Under umask 002 a folder made with mkdir's default (an older coreopt, numba) is 0775: one of
    ~/.cache/coreopt is made private and emptied - anything in it may be another user's - with one
    line; a link inside is removed, never what it leads to. Elsewhere such a folder is only refused."""
    _home(tmp_path, monkeypatch)
    folder = user_cache("calibration")
    (folder / "deep").mkdir(parents=True)
    (folder / "deep" / "planted.json").write_text("{}")
    (folder / "planted.safetensors").write_text("")
    outside = tmp_path / "precious"
    outside.write_text("kept")
    (folder / "link").symlink_to(outside)
    for each in (folder, folder / "deep"):
        each.chmod(0o775)
    assert cache_folder_for(folder, create=False, without="done afresh") == folder
    assert folder.stat().st_mode & 0o777 == 0o700 and not list(folder.iterdir())
    assert outside.read_text() == "kept"
    assert cache_folder_for(folder, create=True, without="done afresh") == folder  # once: now private
    assert _warnings(capsys.readouterr().err) == [
        f"warning: cache folder {folder} was reset: others may write to it (mode 0775), so what it held "
        "was removed and it is private now (0700)"
    ]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (elsewhere / "theirs").write_text("")
    elsewhere.chmod(0o775)
    assert cache_folder_for(elsewhere, create=False, without="done afresh") is None
    assert (elsewhere / "theirs").exists() and elsewhere.stat().st_mode & 0o777 == 0o775
    assert _warnings(capsys.readouterr().err) == [
        f"warning: cache folder {elsewhere} is not used: {_shared(elsewhere, 0o775)}; done afresh"
    ]


def test_statistics_in_a_group_writable_calibration_cache_are_dropped_and_caching_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """~/.cache/coreopt/calibration left 0775: what it held (doubled here) is never read, and the
    statistics taken afresh are stored there again - the cache stays on."""
    _home(tmp_path, monkeypatch)
    samples = _samples(tmp_path)
    fresh = _gram(samples, cache=False)
    assert _equal(_gram(samples), fresh)
    folder = user_cache("calibration")
    _poisoned_statistics(folder)
    folder.chmod(0o775)
    capsys.readouterr()
    assert _equal(_gram(samples), fresh)
    assert list(folder.glob("*.safetensors")) and folder.stat().st_mode & 0o777 == 0o700
    assert len(_warnings(capsys.readouterr().err)) == 1


def test_a_cache_folder_reached_through_the_users_own_link_is_judged_where_it_leads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """COREOPT_CACHE=~/cache, a link to scratch space: the folder it leads to keeps the rule, so it
    is used (statistics stored there and read back); a link to a folder that fails is refused,
    the warning naming that folder."""
    real, link = tmp_path / "scratch" / "cache", tmp_path / "cache"
    real.mkdir(parents=True, mode=0o700)
    link.symlink_to(real)
    assert cache_folder_for(link, create=False) == real
    samples = _samples(tmp_path)
    fresh = _gram(samples, cache=False)
    monkeypatch.setenv("COREOPT_CACHE", str(link))
    assert _equal(_gram(samples), fresh) and list(real.glob("*.safetensors"))
    _poisoned_statistics(real)
    assert _equal(_gram(samples), {k: 2 * v for k, v in fresh.items()})  # read from where it leads
    dangling = tmp_path / "later"
    dangling.symlink_to(tmp_path / "scratch" / "not yet")
    assert cache_folder_for(dangling, create=True) == tmp_path / "scratch" / "not yet"
    real.chmod(0o777)
    assert cache_folder_for(link, create=False, without="done afresh") is None
    assert _warnings(capsys.readouterr().err) == [
        f"warning: cache folder {real} is not used: {_shared(real)}; done afresh"
    ]


def test_a_cache_warning_escapes_a_path_as_every_printed_name_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The one rule of printable text (`coreai_opt.io.printable`, the CLIs' `plain`): controls and
    bidi overrides escaped, other characters (a no-break space) as they are."""
    from cli._common import plain
    from coreai_opt.io import printable

    folder = tmp_path / "a\x1b[31mb\u202ec\u00a0d"
    folder.mkdir()
    folder.chmod(0o777)
    assert cache_folder_for(folder, create=False, without="done afresh") is None
    (line,) = _warnings(capsys.readouterr().err)
    shown = printable(str(folder))
    assert "\\x1b[31mb\\u202ec\u00a0d" in shown and plain(str(folder)) == shown
    assert line.startswith(f"warning: cache folder {shown} is not used") and "\x1b" not in line


def test_one_json_reader_for_model_files_and_caches(tmp_path: Path) -> None:
    """`coreai_opt.io`'s JSON reading: a model's file fails in one typed line (nesting too deep for
    the parser included), a cache entry is a miss; depth is walked without recursion."""
    from coreai_opt.io import ModelFileError, check_depth, parse_json, read_json_object, walk_json

    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ModelFileError, match="nests deeper than any JSON file coreopt reads"):
        parse_json(deep.read_bytes(), deep)
    with pytest.raises(ModelFileError, match="not a readable JSON file"):
        parse_json(b"\xff{}", deep)
    entry = tmp_path / "entry.json"
    for text, found in [('{"a": 1}', {"a": 1}), ("[1]", None), ("{", None), ("{}" + " " * 64, None)]:
        entry.write_text(text)
        assert read_json_object(entry, limit=64) == found
    assert (
        read_json_object(deep, limit=1 << 20) is None and read_json_object(tmp_path / "gone", limit=9) is None
    )
    value = {"a": [1, {"b": None}], "c": "x"}
    assert sorted(place for _, place in walk_json(value)) == [
        (),
        ("a",),
        ("a", 0),
        ("a", 1),
        ("a", 1, "b"),
        ("c",),
    ]
    nested: list[Any] = []
    for _ in range(40):
        nested = [nested]
    check_depth([[[]]], deep, "it", limit=3)
    with pytest.raises(ModelFileError, match="it nests deeper than 3 levels"):
        check_depth([[[[]]]], deep, "it", limit=3)
    with pytest.raises(ModelFileError, match="nests deeper than 32 levels"):
        check_depth(nested, deep, "the config")


# ----- calibration statistics ---------------------------------------------------------------------


def _poisoned_statistics(folder: Path) -> None:
    """Every stored statistic doubled, in place (a planted file with the right name)."""
    for path in folder.glob("*.safetensors"):
        save_file({k: 2 * v for k, v in load_file(str(path)).items()}, str(path))


def _refused(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, planted: Path
) -> tuple[Path, Path, str]:
    """A cache path (the one given, the folder it leads to) holding `planted`'s files that fails
    the rule as `kind` says, and why (a link is followed: the folder it leads to fails)."""
    folder = tmp_path / kind
    shutil.copytree(planted, folder)
    if kind == "stranger":
        uid = os.getuid()
        monkeypatch.setattr(os, "getuid", lambda: uid + 1)
        monkeypatch.setenv("COREOPT_CHECKED_ASSETS", "off")  # the record is no longer "ours" either
        return folder, folder, f"it is owned by user {uid}, not by this one ({uid + 1})"
    mode = {"shared": 0o777, "group": 0o770, "link": 0o777}[kind]
    folder.chmod(mode)
    if kind == "link":
        (tmp_path / "given").symlink_to(folder)
        return tmp_path / "given", folder, _shared(folder)
    return folder, folder, _shared(folder, mode)


@pytest.mark.parametrize("kind", ["shared", "group", "link", "stranger"])
def test_statistics_planted_in_a_folder_that_fails_the_rule_are_never_read(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The planted files are where the cache looks (a checked folder holding them is read: the
    doubled values come back); in a folder that fails the rule they are not, the statistics equal
    the uncached ones bit for bit, nothing is stored there, and one line says why."""
    samples = _samples(tmp_path)
    fresh = _gram(samples, cache=False)
    checked = tmp_path / "checked"
    monkeypatch.setenv("COREOPT_CACHE", str(checked))
    assert _equal(_gram(samples), fresh)
    _poisoned_statistics(checked)
    assert _equal(_gram(samples), {k: 2 * v for k, v in fresh.items()})  # a checked folder is read
    capsys.readouterr()
    given, folder, why = _refused(kind, tmp_path, monkeypatch, checked)
    before = sorted(p.name for p in folder.iterdir())
    monkeypatch.setenv("COREOPT_CACHE", str(given))
    assert _equal(_gram(samples), fresh)
    assert _equal(_squares(samples), _squares(samples, cache=False))  # the Fisher pass's store too
    assert sorted(p.name for p in folder.iterdir()) == before
    assert _warnings(capsys.readouterr().err) == [
        f"warning: cache folder {folder} is not used: {why}; statistics are taken afresh and not stored"
    ]


@pytest.mark.parametrize(
    "damage",
    [
        "header",
        "short",
        "rows deep",
        "rows list",
        "rows infinite",
        "no tensors",
        "same stranger",
        "same circle",
    ],
)
def test_a_damaged_statistics_entry_is_a_miss(
    damage: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    samples = _samples(tmp_path)
    monkeypatch.setenv("COREOPT_CACHE", str(tmp_path / "cache"))
    first = _gram(samples)
    (stored,) = (tmp_path / "cache").glob("*.safetensors")
    rows = stored.with_suffix(".json")
    if damage == "header":
        stored.write_bytes(b"\xff" * 16)
    elif damage == "short":
        stored.write_bytes(stored.read_bytes()[:-8])
    elif damage == "rows deep":
        rows.write_text("[" * 100_000 + "]" * 100_000)
    elif damage == "rows infinite":  # JSON's 1e999 reads as inf, which is no count
        index = json.loads(rows.read_text())
        index["rows"][next(iter(index["rows"]))] = "infinite"
        rows.write_text(json.dumps(index).replace('"infinite"', "1e999"))
    elif damage == "no tensors":  # a valid file holding nothing: no statistics, not empty ones
        save_file({}, str(stored))
    elif damage.startswith("same"):  # a weight said to share statistics another does not hold
        index = json.loads(rows.read_text())
        a, b = MLP_WEIGHTS[:2]
        index["same"] = {a: "nothing.weight"} if damage == "same stranger" else {a: b, b: a}
        rows.write_text(json.dumps(index))
    else:
        rows.write_text("[8, 8, 8]")
    assert _equal(_gram(samples), first)


def test_statistics_are_written_a_tensor_at_a_time_as_safetensors_reads_them(tmp_path: Path) -> None:
    """The cache's own writer and reader (one tensor on the host at a time) keep every tensor bit
    for bit, in each dtype the statistics use and of any shape; safetensors' reader takes the file."""
    from coreai_opt.calibration._cache import read_safetensors, write_safetensors

    generator = torch.Generator().manual_seed(0)
    tensors = {
        "a.weight/gram": torch.randn(5, 5, generator=generator, dtype=torch.float64),
        "b/moments": torch.randn(3, generator=generator),
        "c": torch.randn(2, 3, generator=generator).to(torch.bfloat16),
        "d": torch.randn(7, generator=generator).half()[::2],  # not contiguous
        "scalar": torch.tensor(2.5, dtype=torch.float64),
        "empty": torch.zeros(0, 4),
    }
    write_safetensors(tmp_path / "s.safetensors", tensors)
    ours = read_safetensors(tmp_path / "s.safetensors", torch.device("cpu"))
    for back in (load_file(str(tmp_path / "s.safetensors")), ours):
        assert set(back) == set(tensors)
        for name, value in tensors.items():
            assert back[name].dtype == value.dtype and torch.equal(back[name], value), name
    assert int.from_bytes((tmp_path / "s.safetensors").read_bytes()[:8], "little") % 8 == 0


# ----- the Fisher pass's index ------------------------------------------------------------------


def _stored_fisher(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Samples, dict[str, Any], Path]:
    """Squared gradients stored in a checked cache: the samples, the values and the pass's folder."""
    samples = _samples(tmp_path)
    monkeypatch.setenv("COREOPT_CACHE", str(tmp_path / "cache"))
    first = _squares(samples)
    (stored,) = (tmp_path / "cache").glob("*.fisher")
    return samples, first, stored


def _recomputed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    from coreai_opt.calibration._fisher import SegmentedBackward

    runs: list[int] = []
    real_run = SegmentedBackward.run
    monkeypatch.setattr(SegmentedBackward, "run", lambda self, *a: runs.append(1) or real_run(self, *a))
    return runs


def test_a_stored_fisher_pass_is_read_from_its_own_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checked folder still caches: the second run reads the files its index names (a file
    changed in place, the same size, comes back as it now is)."""
    samples, _, stored = _stored_fisher(tmp_path, monkeypatch)
    index = json.loads((stored / "index.json").read_text())["weights"]
    name, file, _, shape = index[0]
    (stored / file).write_bytes(torch.full(shape, 7.0).numpy().astype("<f4").tobytes())
    runs = _recomputed(monkeypatch)
    again = _squares(samples)
    assert not runs and torch.equal(again[name], torch.full(shape, 7.0))


@pytest.mark.parametrize(
    "entry", ["absolute", "parent", "nested", "not a name", "short", "long", "deep", "shape"]
)
def test_a_fisher_index_naming_anything_but_its_own_plain_files_is_a_miss(
    entry: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An index entry naming a file elsewhere (of exactly the size its shape asks for, holding
    other values) is never read: the pass runs again and its values are the true ones."""
    samples, first, stored = _stored_fisher(tmp_path, monkeypatch)
    path = stored / "index.json"
    index = json.loads(path.read_text())
    _, file, _, shape = index["weights"][0]
    size = 4 * torch.Size(shape).numel()
    outside = tmp_path / "outside.f32"
    outside.write_bytes(torch.full(shape, 7.0).numpy().astype("<f4").tobytes())
    (stored / "sub").mkdir()
    shutil.copy(outside, stored / "sub" / file)
    changed = {
        "absolute": str(outside), "parent": "../../outside.f32", "nested": f"sub/{file}", "not a name": 5,
    }  # fmt: skip
    if entry in changed:
        index["weights"][0][1] = changed[entry]
    elif entry == "short":
        (stored / file).write_bytes(b"\0" * (size - 4))
    elif entry == "long":
        (stored / file).write_bytes(b"\0" * (size + 4))
    elif entry == "shape":
        index["weights"][0][3] = [-1, -size // 4]
    path.write_text("[" * 100_000 + "]" * 100_000 if entry == "deep" else json.dumps(index))
    runs = _recomputed(monkeypatch)
    assert _equal(_squares(samples), first) and runs == [1]


# ----- optimize's cache -------------------------------------------------------------------------


def test_optimizes_cache_reads_and_writes_only_its_own_names_in_checked_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from coreai_opt.optimization import _cache

    monkeypatch.setenv("COREOPT_CACHE", str(tmp_path / "cache"))
    column, trials = _cache.entry("ab" * 16), _cache.entry("cd" * 16, "v2", "bf16", 64)
    assert (column.name, trials.name) == (f"{'ab' * 16}.json", f"{'cd' * 16}.trials-v2-bf16-64.json")
    for unreadable in (("../x",), ("a.b",), ("",)):  # a name `read` would refuse is never made
        with pytest.raises(ValueError, match="no name the optimize cache reads back"):
            _cache.entry("cd" * 16, *unreadable)
    _cache.write(column, {"weights": {}})
    _cache.write(trials, {"tokens": 64})
    assert _cache.folder().stat().st_mode & 0o777 == 0o700
    assert _cache.read(column) == {"weights": {}} and _cache.read(trials) == {"tokens": 64}
    (_cache.folder() / "passwd").write_text("{}")
    assert _cache.read(_cache.folder() / "passwd") is None
    column.write_text("[" * 100_000 + "]" * 100_000)
    assert _cache.read(column) is None
    capsys.readouterr()
    _cache.folder().chmod(0o777)
    assert _cache.read(trials) is None
    _cache.write(column, {"weights": {}})
    assert column.read_text().startswith("[[")  # not written
    assert _warnings(capsys.readouterr().err) == [
        f"warning: cache folder {_cache.folder()} is not used: {_shared(_cache.folder())}; "
        "every cost is measured afresh and not stored"
    ]


# ----- the checked-assets record ----------------------------------------------------------------


def test_a_checked_assets_record_others_may_write_is_named_and_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from coreai_opt.io._checked import RECORD_ENV, remember, was_checked

    record = tmp_path / "record"
    monkeypatch.setenv(RECORD_ENV, str(record))
    key = ((1, 2, 3, 4, 5), "asset")
    remember(key)
    assert was_checked(key) and record.stat().st_mode & 0o777 == 0o700
    record.chmod(0o777)
    assert not was_checked(key)
    assert _warnings(capsys.readouterr().err) == [
        f"warning: cache folder {record} is not used: {_shared(record)}; "
        "every .aimodel from elsewhere is checked in a worker"
    ]


# ----- numba's kernel cache ---------------------------------------------------------------------

_KERNEL_RUN = textwrap.dedent(
    """
    import io, os, sys
    import numba
    import numpy as np
    from numba.core.caching import NullCache

    numba_cache_dir, stderr = numba.config.CACHE_DIR, sys.stderr
    sys.stderr = io.StringIO()
    import coreai_opt.compression.algorithms._kmeans_kernels as kernels
    sys.stderr, printed = stderr, sys.stderr.getvalue()
    assert not printed and not os.path.lexists(os.environ.get("ABSENT", "/nonexistent")), "work at import"
    points, sums = np.arange(5.0), [np.zeros(6) for _ in range(3)]
    assert kernels.run_cost(points, points, points, 0, 2) == 0.0
    kernels.prefix_sums(points, np.ones(5), 2.0, False, *sums)
    assert list(sums[0]) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    dispatchers = [v for v in vars(kernels).values() if hasattr(v, "_cache")]
    assert dispatchers and numba.config.CACHE_DIR == numba_cache_dir, "numba's CACHE_DIR changed"
    print("cached" if not any(isinstance(d._cache, NullCache) for d in dispatchers) else "uncached")
    """
)


def _run_kernel(
    cache: Path | None, home: Path | None = None, absent: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """A new process (numba decides about its disk cache when the kernels are made) running two
    kernels with `cache` as NUMBA_CACHE_DIR (None: unset, so ~/.cache/coreopt/numba of `home`).
    It fails where importing the kernels printed anything or made `absent`, or where numba's
    CACHE_DIR is not as it was before once they are made."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    changes = {"NUMBA_CACHE_DIR": cache, "HOME": home, "ABSENT": absent}
    env.update({k: str(v) for k, v in changes.items() if v is not None})
    return subprocess.run(
        [sys.executable, "-c", _KERNEL_RUN],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )


class _Fires:
    """Unpickling this creates `marker` (as a planted payload would run a command)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))


def _plant_kernel_index(cache: Path, payload: bytes) -> None:
    """`payload` where numba looks for run_cost's index under `cache` (its own naming)."""
    from numba.core.caching import UserProvidedCacheLocator

    from coreai_opt.compression.algorithms import _kmeans_kernels as kernels

    folder = cache / UserProvidedCacheLocator.get_suitable_cache_subpath(kernels.__file__)
    folder.mkdir(mode=0o700, parents=True)
    line = kernels.run_cost.py_func.__code__.co_firstlineno
    version = f"py{sys.version_info.major}{sys.version_info.minor}{sys.abiflags}"
    (folder / f"_kmeans_kernels.run_cost-{line}.{version}.nbi").write_bytes(payload)


def test_numba_never_unpickles_kernels_from_a_folder_that_fails_the_rule(tmp_path: Path) -> None:
    """A pickle planted as numba's index (.nbi) in a 0777 NUMBA_CACHE_DIR is not loaded: the kernels
    compile without the disk cache and one line says so. The same plant in a checked folder is
    loaded - so it sits where numba looks, and a checked folder is still read."""
    marker = tmp_path / "fired"
    shared, checked = tmp_path / "shared", tmp_path / "checked"
    for cache in (shared, checked):
        _plant_kernel_index(cache, pickle.dumps(_Fires(marker)))
    shared.chmod(0o777)
    refused = _run_kernel(shared)
    assert refused.stdout.split() == ["uncached"] and not marker.exists()
    assert _warnings(refused.stderr) == [
        f"warning: cache folder {shared} is not used: {_shared(shared)}; "
        "the k-means kernels compile afresh (about 15 s) and are not stored"
    ]
    read = _run_kernel(checked)
    assert read.stdout.split() == ["cached"] and not _warnings(read.stderr) and marker.exists()


def test_the_kernels_are_made_on_first_use_and_their_cache_folder_then(tmp_path: Path) -> None:
    """Importing the kernels makes no folder and prints nothing (`_KERNEL_RUN` checks); the first
    call makes ~/.cache/coreopt/numba, private, and the kernels are cached there."""
    home = tmp_path / "home"
    done = _run_kernel(None, home=home, absent=home / ".cache")
    assert done.stdout.split() == ["cached"] and not _warnings(done.stderr)
    assert (home / ".cache" / "coreopt" / "numba").stat().st_mode & 0o777 == 0o700
    assert list((home / ".cache" / "coreopt" / "numba").rglob("*.nbi"))


def test_a_refused_numba_folder_leaves_numbas_cache_dir_as_it_was(tmp_path: Path) -> None:
    """Where the kernels' folder is refused they compile afresh, with one warning when they are
    made (not at import), and numba's CACHE_DIR is what it was (`_KERNEL_RUN` checks): other
    numba code in the process is not pointed at the refused folder."""
    home = tmp_path / "home"
    refused = home / ".cache" / "coreopt" / "numba"
    refused.parent.mkdir(parents=True, mode=0o700)
    refused.write_text("")
    done = _run_kernel(None, home=home)
    assert done.stdout.split() == ["uncached"]
    assert _warnings(done.stderr) == [
        f"warning: cache folder {refused} is not used: it is not a folder; "
        "the k-means kernels compile afresh (about 15 s) and are not stored"
    ]


def test_numbas_folder_made_under_umask_002_is_reset_and_used(tmp_path: Path) -> None:
    """numba makes its folders 0777 less the umask: under umask 002 the kernels' folder in
    ~/.cache/coreopt is group-writable. It is emptied - the pickle planted there never loads - made
    private, and the kernels are cached there, with one line saying so."""
    from numba.core.caching import UserProvidedCacheLocator

    from coreai_opt.compression.algorithms import _kmeans_kernels as kernels

    home, marker = tmp_path / "home", tmp_path / "fired"
    numba_folder = home / ".cache" / "coreopt" / "numba"
    _plant_kernel_index(numba_folder, pickle.dumps(_Fires(marker)))
    folder = numba_folder / UserProvidedCacheLocator.get_suitable_cache_subpath(kernels.__file__)
    folder.chmod(0o775)
    done = _run_kernel(None, home=home)
    assert done.stdout.split() == ["cached"] and not marker.exists()
    assert folder.stat().st_mode & 0o777 == 0o700 and list(folder.glob("*.nbi"))
    assert _warnings(done.stderr) == [
        f"warning: cache folder {folder} was reset: others may write to it (mode 0775), so what it "
        "held was removed and it is private now (0700)"
    ]
