"""FP pass, ops: creation ops, infinity-like scalars, overflow ops in fp32, retargeted casts, ignored ops."""

from __future__ import annotations

import pytest
import torch
from _casting import export, meta_mismatches, nodes_of, run_cast
from torch import nn

from coreai_opt.casting import CastTarget, OpOutcome, cast_fp32_to_fp16, cast_program, resolve_op
from coreai_opt.casting._graph import cast_target_dtype, is_cast

aten = torch.ops.aten


class Creation(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[-1]
        ramp = torch.arange(0.0, float(n)) * 0.5
        filled = torch.full((n,), 0.1) + torch.zeros(n) + torch.ones(n)
        like = torch.full_like(x, 1e-9)  # below fp16's smallest subnormal: snaps to 2**-24
        huge = torch.full((n,), 1e5)  # overflows fp16: this creation op stays fp32
        return x * ramp + filled + like + huge / 1e4


def test_creation_ops_get_fp16_with_clamped_scalars_unless_they_overflow() -> None:
    x = torch.randn(2, 8)
    ep = export(Creation(), x)
    reference = Creation()(x)
    report = cast_program(ep, CastTarget.FP16)
    fulls = nodes_of(ep, aten.full)
    by_value = {n.args[1]: n for n in fulls}
    assert by_value[1e5].kwargs.get("dtype", torch.float32) == torch.float32
    assert by_value[1e5].meta["val"].dtype == torch.float32
    small = [n for n in fulls if n.args[1] != 1e5]
    assert small and all(n.kwargs["dtype"] == torch.float16 for n in small)
    values = {n.args[1] for n in small}
    (like,) = nodes_of(ep, aten.full_like)
    assert like.args[1] == 2.0**-24 and like.kwargs["dtype"] == torch.float16
    assert float(torch.tensor(0.1).half()) in values  # scalars are fp16 values
    arange = nodes_of(ep, aten.arange)[0]
    assert arange.kwargs["dtype"] == torch.float16
    kept = [o for o in report.ops if o.outcome is OpOutcome.KEPT_FP32_OVERFLOW]
    assert any(o.detail == "scalar 100000" for o in kept)
    assert meta_mismatches(ep, x) == []
    torch.testing.assert_close(run_cast(ep, x).float(), reference, atol=1e-2, rtol=1e-2)


class Masks(nn.Module):
    def forward(self, scores: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        causal = torch.triu(torch.ones(4, 4, dtype=torch.bool), diagonal=1)
        scores = scores.masked_fill(causal, float("-inf"))
        scores = scores.masked_fill(keep == 0, torch.finfo(torch.float32).min)
        return torch.softmax(scores, dim=-1)


def test_infinity_like_scalars_become_fp16_max() -> None:
    scores, keep = torch.randn(1, 4, 4), torch.ones(1, 4, 4, dtype=torch.int64)
    ep = export(Masks(), scores, keep)
    cast_fp32_to_fp16(ep)
    fills = [n.args[0] for n in nodes_of(ep, aten.scalar_tensor)]
    assert sorted(fills) == [-65504.0, -65504.0]
    assert all(n.kwargs["dtype"] == torch.float16 for n in nodes_of(ep, aten.scalar_tensor))
    out = run_cast(ep, scores, keep)
    torch.testing.assert_close(out.float(), Masks()(scores, keep), atol=1e-3, rtol=1e-3)


class Scaled(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 1.0e5  # scalar beyond fp16: runs in fp32
        return (y / 3.0e5).relu()


def test_overflow_scalar_runs_in_fp32_between_one_upcast_and_one_downcast() -> None:
    x = torch.randn(4, 4)
    ep = export(Scaled(), x)
    cast_fp32_to_fp16(ep)
    (mul,) = nodes_of(ep, aten.mul)
    (source,) = mul.all_input_nodes
    assert is_cast(source) and cast_target_dtype(source) == torch.float32
    assert source.args[0].op == "placeholder"
    assert mul.meta["val"].dtype == torch.float32
    (div,) = nodes_of(ep, aten.div)
    assert div.meta["val"].dtype == torch.float32  # fp32 input: stays fp32 too (3e5 overflows anyway)
    downcasts = [u for u in div.users if is_cast(u)]
    assert len(downcasts) == 1 and cast_target_dtype(downcasts[0]) == torch.float16
    assert nodes_of(ep, aten.relu)[0].meta["val"].dtype == torch.float16
    torch.testing.assert_close(run_cast(ep, x).float(), Scaled()(x), atol=1e-3, rtol=1e-3)


class ExistingCasts(nn.Module):
    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return x + ids.to(torch.float32) / 10.0


def test_existing_casts_to_fp32_are_retargeted_to_fp16() -> None:
    x, ids = torch.randn(3), torch.tensor([1, 2, 3])
    ep = export(ExistingCasts(), x, ids)
    cast_fp32_to_fp16(ep)
    casts = [n for n in ep.graph.nodes if is_cast(n)]
    assert [cast_target_dtype(c) for c in casts] == [torch.float16]
    assert meta_mismatches(ep, x, ids) == []
    assert run_cast(ep, x, ids).dtype == torch.float16


class Activations(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.exp(x) + nn.functional.softplus(x) + torch.logsumexp(x, dim=-1, keepdim=True)


@pytest.mark.parametrize(
    "selector",
    [
        aten.exp.default,
        aten.exp,
        [aten.exp.default, "aten.log"],
        lambda n: n.target == aten.exp.default,
    ],
    ids=["overload", "packet", "collection", "predicate"],
)
def test_ignored_ops_run_in_fp32(selector: object) -> None:
    # exp runs in fp32 but its result is cast back to fp16, so keep exp(x) below 65504 (x < 11).
    x = torch.linspace(-10.0, 10.0, 12).reshape(2, 6)
    ep = export(Activations(), x)
    report = cast_program(ep, CastTarget.FP16, ignored_ops=selector)
    exps = nodes_of(ep, aten.exp.default)
    assert exps
    for exp in exps:
        assert exp.meta["val"].dtype == torch.float32
        (source,) = exp.all_input_nodes
        assert source.meta["val"].dtype == torch.float32
    assert {o.node for o in report.ops if o.outcome is OpOutcome.KEPT_FP32_IGNORED} >= {e.name for e in exps}
    assert meta_mismatches(ep, x) == []
    torch.testing.assert_close(run_cast(ep, x).float(), Activations()(x), atol=0.1, rtol=1e-2)


def test_resolve_op_names() -> None:
    assert resolve_op("aten.exp.default") is aten.exp.default
    assert resolve_op("torch.ops.aten.exp") is aten.exp
    with pytest.raises(ValueError, match="unknown op"):
        resolve_op("aten.no_such_op.default")
    with pytest.raises(ValueError, match=r"namespace\.op"):
        resolve_op("exp")


class RMSNorm(nn.Module):
    """LLaMA's norm on a residual stream whose RMS (300) squares past fp16's 65504."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        stream = x * 300.0
        variance = stream.pow(2).mean(-1, keepdim=True)
        return self.weight * (stream * torch.rsqrt(variance + 1e-5))


def test_a_norms_sum_of_squares_runs_in_fp32_and_leaves_as_fp16() -> None:
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(0))
    ep = export(RMSNorm(64), x)
    report = cast_program(ep, CastTarget.FP16)
    kept = {o.node for o in report.ops if o.outcome is OpOutcome.KEPT_FP32_NORM}
    chain = [
        *nodes_of(ep, aten.pow.Tensor_Scalar),
        *nodes_of(ep, aten.mean.dim),
        *nodes_of(ep, aten.rsqrt.default),
    ]
    assert len(chain) == 3 and {n.name for n in chain} <= kept
    for n in chain:
        assert n.meta["val"].dtype == torch.float32
    # only the root leaves fp32: one cast down after rsqrt, none between the statistic's ops
    (rsqrt,) = nodes_of(ep, aten.rsqrt.default)
    assert all(is_cast(u) and cast_target_dtype(u) == torch.float16 for u in rsqrt.users)
    assert meta_mismatches(ep, x) == []
    got = run_cast(ep, x)
    assert got.dtype == torch.float16 and bool(torch.isfinite(got).all())
    torch.testing.assert_close(got.float(), RMSNorm(64)(x), atol=2e-2, rtol=1e-2)
    # the same program with the statistic in fp16 is all zeros or inf: what the rule prevents
    with torch.no_grad():
        half = (x.half() * 300).pow(2).mean(-1, keepdim=True)
    assert not bool(torch.isfinite(half).all())
