"""Every operator a program from a file may call survives hostile values (tests/_op_values.py).

Each op runs `TRIALS` seeded argument sets that the loader would let through (their shapes pass
the op's meta kernel, their results are small) in a forked child; none may die of a signal, and
at least one must reach the kernel. The trials are regenerated from their seed, so a failure
names the arguments that crashed. bench/op_values.py runs thousands an op (it found
`_embedding_bag`'s crash, which left the allowlist).
"""

from __future__ import annotations

import sys

import _op_values as ov
import pytest

TRIALS = 4  # a seeded sample in CI (about 20 CPU seconds in all); bench/op_values.py runs thousands
SEED = 20261128
OPS = ov.admitted_ops()

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forks a child per op")


@pytest.mark.parametrize("op", OPS, ids=[op.name for op in OPS])
def test_an_admitted_op_never_crashes_on_values_a_file_can_give(op: ov.Op) -> None:
    outcome = ov.probe(op, SEED, TRIALS)
    assert outcome.died is None, f"{outcome.died} on {ov.describe(op, SEED, outcome.trial)}"
    assert outcome.run >= 1, "no trial reached the kernel: the test would pass without testing it"


def test_the_probe_sees_a_crash() -> None:
    """An op that reads address 0 once a trial reaches it: the probe reports the signal and the
    trial (it can fail)."""
    import ctypes

    import torch

    relu = torch.ops.aten.relu.default
    outcome = ov.probe(ov.Op("crash", lambda *_: ctypes.string_at(0), relu._schema, relu), SEED, 5)
    assert outcome.died == "SIGSEGV" and outcome.trial is not None and outcome.run >= 1, outcome
