"""Progress off a terminal (a CI log, a pipe): a plain line at most every 30 s with the count, the
time taken and an ETA - a long run shows it is alive, a short one prints nothing."""

from __future__ import annotations

import pytest

from cli import _progress


def test_log_lines_are_throttled_and_carry_an_eta(monkeypatch: pytest.MonkeyPatch, capsys) -> None:  # type: ignore[no-untyped-def]
    clock = iter([100.0, 101.0, 131.0, 140.0, 161.5, 400.0])
    monkeypatch.setattr(_progress.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(type(_progress.err_console), "is_terminal", property(lambda _self: False))
    with _progress.weight_progress(True, "comparing") as advance:
        assert advance is not None
        advance(1, 48, "a.aimodel")  # 1 s: nothing yet
        advance(12, 48, "b.aimodel")  # 31 s: a line, 3 x 31 s left
        advance(13, 48, "c.aimodel")  # 9 s after the last line: nothing
        advance(24, 48, "d.aimodel")  # 30.5 s after it: a line
        advance(48, 48, "e.aimodel")  # done: no ETA
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "comparing: 12/48 (b.aimodel), 0:00:31 so far, about 0:01:33 left",
        "comparing: 24/48 (d.aimodel), 0:01:01 so far, about 0:01:01 left",
        "comparing: 48/48 (e.aimodel), 0:05:00 so far",
    ]
    with _progress.weight_progress(False, "comparing") as nothing:
        assert nothing is None
