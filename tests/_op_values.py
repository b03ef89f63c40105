"""Hostile values for every operator a program from a file may call, run where a crash is seen.

A file chooses every argument of every node: tensors of any Core AI dtype holding any values
(indices far out of range, NaN, infinities), integers anywhere in int64, any float, and - within
the schema's types (`io._signatures`) - any dtype, the strided layout, any memory format. The
loader first runs the program on fake tensors (`io._shapes`), so a real kernel only ever meets
arguments whose shapes its meta kernel accepts, and results of at most the size budget. So each
trial here is kept only when its fake run passes and computes at most `FAKE_BUDGET` elements, and
is then run for real in a forked child (an address-space limit, an alarm): a child that dies of a
signal is an op that must leave the allowlist or have its values checked.

Used by tests/test_op_values.py (a few dozen trials an op) and bench/op_values.py (thousands).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import random
import resource
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

INTEGERS = (
    -(1 << 63),
    -(1 << 31) - 1,
    -(1 << 15),
    -7,
    -1,
    0,
    1,
    2,
    3,
    4,
    5,
    8,
    255,
    1 << 31,
    1 << 33,
    (1 << 63) - 1,
)
FLOATS = (math.nan, math.inf, -math.inf, 0.0, -0.0, 1e-45, 0.5, 1.5, -2.0, 3.4e38, 1.7e308, -1.7e308)
SHAPES = (
    (),
    (0,),
    (1,),
    (4,),
    (4, 4),
    (2, 4, 4),
    (1, 2, 4, 4),
    (2, 3, 4, 4),
    (1, 1, 2, 4, 4),
    (1, 3),
    (3, 1),
    (4, 0),
)
FAKE_BUDGET = 1 << 20  # the trial's outputs, in elements: far below any real budget, so runs stay quick
HEADROOM = 2 << 30  # address space a child may add to what the parent holds
ALARM_S = 10  # one real run, at most
ATTEMPTS = 25  # candidates drawn for each trial that reaches the kernel, at most (and 300 more)
EXTRA_ATTEMPTS = 300


def element_dtypes() -> tuple[torch.dtype, ...]:
    """The dtypes a program from a file may declare: Core AI's element types (`_elements`)."""
    from coreai_opt._elements import of_torch

    found = []
    for dtype in (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
                  torch.bfloat16, torch.float32, torch.float64, torch.uint16, torch.uint32, torch.uint64,
                  torch.float8_e4m3fn, torch.float8_e5m2):  # fmt: skip
        try:
            of_torch(dtype)
        except ValueError:
            continue
        found.append(dtype)
    return tuple(found)


@dataclass(frozen=True)
class Op:
    """An operator under test: its name, its callable and its schema; `checked` is what the loader
    runs on fake tensors for it (itself, but for a decoder: the op it stands in for)."""

    name: str
    call: Any
    schema: Any
    checked: Any = None


def admitted_ops() -> list[Op]:
    """Every ATen op the allowlist admits; coreai-torch's ops, and the decoders that stand in for
    them when a program's compressed weights are folded (`_export.fold_decompression`)."""
    from coreai_opt._export import register_coreai_ops
    from coreai_opt.io._allowlist import ATEN_OPS, COREAI_OPS
    from coreai_opt.weights import _decode

    ops = []
    for namespace, packet, names in (
        ("aten", torch.ops.aten, ATEN_OPS),
        ("coreai", register_coreai_ops(), COREAI_OPS),
    ):
        for qualified in names:
            name, overload = qualified.split(".")
            op = getattr(getattr(packet, name), overload)
            ops.append(Op(f"{namespace}.{qualified}", op, op._schema))
    coreai = register_coreai_ops()
    for name, decoder in (("lut_to_dense", _decode.lut_to_dense), ("constexpr_blockwise_shift_scale", _decode.shift_scale),
                          ("sparse_to_dense", _decode.sparse_to_dense)):  # fmt: skip
        op = getattr(coreai, name).default
        ops.append(Op(f"fold.{name}", decoder, op._schema, op))
    return sorted(ops, key=lambda op: op.name)


# Argument names that say what a value is: an index tensor (int64, mostly out of range), a mask
# (bool), a dimension (mostly a real one), a size or count (mostly small), so that most trials are
# well formed enough to reach the kernel's index paths with hostile values in them.
_INDEX_NAMES = frozenset({"index", "indices", "offsets", "per_sample_weights", "indices_or_sections"})
_MASK_NAMES = frozenset({"mask"})
_DIM_NAMES = frozenset({"dim", "dims", "dim0", "dim1", "dim2", "axis", "start_dim", "end_dim"})


def _floats(*shape: int) -> Callable[[random.Random], torch.Tensor]:
    return lambda rng: torch.tensor([rng.choice(FLOATS) if rng.random() < 0.2 else rng.gauss(0, 1)
                                     for _ in range(math.prod(shape))]).reshape(shape)  # fmt: skip


def _small(*choices: Any) -> Callable[[random.Random], Any]:
    """Mostly one of `choices`, sometimes a hostile integer in their place (a list: in one slot)."""

    def draw(rng: random.Random) -> Any:
        value = rng.choice(choices)
        if rng.random() < 0.3:
            if isinstance(value, list) and value:
                value = list(value)
                value[rng.randrange(len(value))] = rng.choice(INTEGERS)
            elif not isinstance(value, list):
                value = rng.choice(INTEGERS)
        return value

    return draw


# Arguments that are well formed only in concert (a convolution's weight for its input's channels,
# a window no larger than its image): drawn for these ops so that their kernels are reached at all.
_WINDOW = {"kernel_size": _small([2, 2], [1, 2], [3, 3]), "stride": _small([], [1, 1], [2, 2]),
           "padding": _small([0, 0], [1, 1]), "dilation": _small([1, 1], [2, 2])}  # fmt: skip
_HINTS: dict[str, dict[str, Callable[[random.Random], Any]]] = {
    "aten.convolution.default": {"input": _floats(1, 2, 5, 5), "weight": _floats(3, 2, 2, 2), "bias": _floats(3),
        "stride": _small([1, 1], [2, 2]), "padding": _small([0, 0], [1, 1]), "dilation": _small([1, 1]),
        "transposed": _small(False, True), "output_padding": _small([0, 0]), "groups": _small(1)},
    "aten.max_pool2d_with_indices.default": {"self": _floats(1, 2, 5, 5), **_WINDOW},
    "aten.max_pool3d_with_indices.default": {"self": _floats(1, 1, 3, 5, 5), "kernel_size": _small([1, 2, 2]),
        "stride": _small([], [1, 1, 1]), "padding": _small([0, 0, 0]), "dilation": _small([1, 1, 1])},
    "aten.avg_pool3d.default": {"self": _floats(1, 1, 3, 5, 5), "kernel_size": _small([1, 2, 2]),
        "stride": _small([], [1, 1, 1]), "padding": _small([0, 0, 0]), "divisor_override": _small(None, 2)},
    "aten.reflection_pad2d.default": {"self": _floats(1, 2, 5, 5), "padding": _small([1, 1, 1, 1], [2, 0, 0, 2])},
    "aten.reflection_pad3d.default": {"self": _floats(1, 1, 3, 5, 5), "padding": _small([1, 1, 1, 1, 1, 1])},
    "aten.replication_pad3d.default": {"self": _floats(1, 1, 3, 5, 5), "padding": _small([1, 1, 1, 1, 1, 1])},
    "aten.col2im.default": {"self": _floats(1, 8, 9), "output_size": _small([4, 4]), **_WINDOW,
                            "kernel_size": _small([2, 2]), "stride": _small([1, 1])},
    "aten.avg_pool1d.default": {"self": _floats(1, 2, 8), "kernel_size": _small([2], [3]), "stride": _small([], [1]),
        "padding": _small([0], [1])},
    "aten.avg_pool2d.default": {"self": _floats(1, 2, 5, 5), "kernel_size": _small([2, 2]), "stride": _small([], [1, 1]),
        "padding": _small([0, 0], [1, 1]), "divisor_override": _small(None, 2)},
    "aten.bmm.default": {"self": _floats(2, 3, 4), "mat2": _floats(2, 4, 5)},
    "aten.instance_norm.default": {"input": _floats(2, 3, 4, 4), "weight": _floats(3), "bias": _floats(3),
        "running_mean": _floats(3), "running_var": _floats(3)},
    "aten.native_group_norm.default": {"input": _floats(2, 4, 3, 3), "weight": _floats(4), "bias": _floats(4),
        "N": _small(2), "C": _small(4), "HxW": _small(9), "group": _small(2, 4)},
    "aten.native_layer_norm.default": {"input": _floats(2, 3, 4), "normalized_shape": _small([4], [3, 4]),
        "weight": _floats(4), "bias": _floats(4)},
    "aten.scatter.reduce": {"self": _floats(4, 4), "dim": _small(0, 1),
        "index": lambda rng: torch.tensor([rng.choice(INTEGERS) if rng.random() < 0.5 else rng.randrange(4)
                                           for _ in range(8)]).reshape(4, 2),
        "src": _floats(4, 2), "reduce": lambda rng: rng.choice(("add", "multiply"))},
    "aten.upsample_nearest2d.vec": {"input": _floats(1, 2, 4, 4), "output_size": _small(None, [8, 8]),
        "scale_factors": lambda rng: rng.choice((None, [2.0, 2.0], [rng.choice(FLOATS), 2.0]))},
    "aten.upsample_bilinear2d.vec": {"input": _floats(1, 2, 4, 4), "output_size": _small(None, [8, 8]),
        "scale_factors": lambda rng: rng.choice((None, [2.0, 2.0], [rng.choice(FLOATS), 2.0]))},
    "aten.grid_sampler_2d.default": {"input": _floats(1, 2, 5, 5), "grid": _floats(1, 3, 3, 2),
        "interpolation_mode": _small(0, 1, 2), "padding_mode": _small(0, 1, 2)},
}  # fmt: skip


class _Values:
    """Arguments for one trial: tensors drawn around one shape, values by what their names say."""

    def __init__(self, rng: random.Random, dtypes: tuple[torch.dtype, ...]) -> None:
        self.rng = rng
        self.dtypes = dtypes
        self.shape = rng.choice(SHAPES)

    def tensor(self, dtype: torch.dtype | None = None, hostile: float = 0.5) -> torch.Tensor:
        rng = self.rng
        shape = self.shape if rng.random() < 0.6 else rng.choice(SHAPES)
        if dtype is None:
            dtype = (
                rng.choice(self.dtypes) if rng.random() < 0.5 else rng.choice((torch.float32, torch.int64))
            )
        count = math.prod(shape)
        if dtype == torch.bool:
            return torch.tensor([rng.random() < 0.5 for _ in range(count)], dtype=dtype).reshape(shape)
        if dtype.is_floating_point:
            values = [
                rng.choice(FLOATS) if rng.random() < hostile / 2 else rng.gauss(0, 2) for _ in range(count)
            ]
            return torch.tensor(values, dtype=torch.float64).reshape(shape).to(dtype)
        info = torch.iinfo(dtype)
        values = [
            rng.choice(INTEGERS) if rng.random() < hostile else rng.randrange(-2, 6) for _ in range(count)
        ]
        return torch.tensor([min(max(v, info.min), info.max) for v in values], dtype=dtype).reshape(shape)

    def integer(self, name: str) -> int:
        rng = self.rng
        if name in _DIM_NAMES and rng.random() < 0.8:
            return rng.randrange(-3, 4)
        return rng.randrange(0, 9) if rng.random() < 0.5 else rng.choice(INTEGERS)

    def of(self, kind: Any, name: str) -> Any:
        rng = self.rng
        if isinstance(kind, torch.OptionalType):
            return None if rng.random() < 0.3 else self.of(kind.getElementType(), name)
        if isinstance(kind, torch.ListType):
            return [self.of(kind.getElementType(), name) for _ in range(rng.randint(0, 4))]
        text = str(kind)
        if text == "Tensor":
            if name in _INDEX_NAMES and rng.random() < 0.8:
                return self.tensor(torch.int64, hostile=0.7)
            if name in _MASK_NAMES and rng.random() < 0.8:
                return self.tensor(torch.bool)
            return self.tensor() if rng.random() < 0.9 else rng.choice(INTEGERS + FLOATS)
        if text in ("int", "SymInt"):
            return self.integer(name)
        if text in ("float", "number", "Scalar"):
            return rng.choice(FLOATS + INTEGERS)
        if text in ("bool", "SymBool"):
            return rng.random() < 0.5
        return {
            "ScalarType": lambda: rng.choice(self.dtypes),
            "Layout": lambda: torch.strided,
            "MemoryFormat": lambda: rng.choice(
                (torch.contiguous_format, torch.channels_last, torch.channels_last_3d, torch.preserve_format)
            ),
            "Device": lambda: torch.device("cpu"),
            "str": lambda: rng.choice(
                ("floor", "trunc", "none", "tanh", "sum", "prod", "mean", "amax", "amin", "add", "multiply")
            ),
        }[text]()


def _value(op: Op, argument: Any, values: _Values, rng: random.Random) -> Any:
    hint = _HINTS.get(op.name, {}).get(argument.name)
    return (
        hint(rng) if hint is not None and rng.random() < 0.9 else values.of(argument.real_type, argument.name)
    )


def trials(op: Op, seed: int, count: int) -> Iterator[tuple[tuple[Any, ...], dict[str, Any]]]:
    """`count` seeded candidate argument sets for `op`, positional and keyword as its schema says
    (most fail the loader's check: `probe` draws until enough pass)."""
    rng = random.Random(f"{op.name}/{seed}")
    dtypes = element_dtypes()
    for _ in range(count):
        values = _Values(rng, dtypes)
        args, kwargs = [], {}
        for argument in op.schema.arguments:
            value = _value(op, argument, values, rng)
            if argument.kwarg_only:
                kwargs[argument.name] = value
            else:
                args.append(value)
        yield tuple(args), kwargs


def _passes_the_loader(op: Op, args: tuple[Any, ...], kwargs: dict[str, Any], fake: Any) -> bool:
    """Whether a node with these arguments would pass `io._shapes`: its meta kernel accepts
    them, its dtypes are ones the loader lets it take, and it computes at most `FAKE_BUDGET`
    elements."""
    from coreai_opt.io._shapes import trap_problem

    converted = torch.utils._pytree.tree_map(
        lambda v: fake.from_tensor(v, static_shapes=True) if isinstance(v, torch.Tensor) else v,
        (args, kwargs),
    )
    try:
        with fake:
            out = (op.checked or op.call)(*converted[0], **converted[1])
    except Exception:
        return False
    if trap_problem(op.name, *converted):  # a dtype the loader refuses for this op
        return False
    leaves = [leaf for leaf in torch.utils._pytree.tree_leaves(out) if isinstance(leaf, torch.Tensor)]
    try:
        return all(int(leaf.numel()) <= FAKE_BUDGET for leaf in leaves)
    except Exception:  # a size from data with no bound
        return False


def _child(op: Op, seed: int, count: int, progress: int) -> None:
    """Run `count` trials that pass the loader, of at most `ATTEMPTS` times as many candidates;
    write each one's index before it runs."""
    import logging

    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    logging.disable(logging.CRITICAL)
    pages = int(Path("/proc/self/statm").read_text().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (pages + HEADROOM, pages + HEADROOM))
    torch.set_num_threads(1)
    fake = FakeTensorMode(shape_env=ShapeEnv())
    ran = 0
    for index, (args, kwargs) in enumerate(trials(op, seed, count * ATTEMPTS + EXTRA_ATTEMPTS)):
        if ran == count:
            break
        if not _passes_the_loader(op, args, kwargs, fake):
            continue
        ran += 1
        os.write(progress, f"{index}\n".encode())
        signal.alarm(ALARM_S)
        with contextlib.suppress(Exception):  # refusing a value is what a safe kernel does
            op.call(*args, **kwargs)
        signal.alarm(0)


@functools.cache
def _warm() -> None:
    """What the children share, imported once here: fake tensors' modules, a first conversion."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    fake = FakeTensorMode(shape_env=ShapeEnv())
    with fake:
        torch.ops.aten.add.Tensor(fake.from_tensor(torch.ones(2), static_shapes=True), 1)


@dataclass(frozen=True)
class Outcome:
    op: str
    run: int  # trials that reached the real kernel
    died: str | None  # the signal that ended the child, or None
    trial: int | None  # the trial it died on


def probe(op: Op, seed: int, count: int) -> Outcome:
    """Run `count` trials of `op` that pass the loader's check in a forked child; how it ended."""
    _warm()
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        code = 1
        try:
            os.close(reader)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 2)  # kernels' warnings and malloc's last words
            import faulthandler

            faulthandler.disable()  # its dump of a crash would go to the parent's own stderr
            _child(op, seed, count, writer)
            code = 0
        finally:
            os._exit(code)
    os.close(writer)
    log = b""
    while chunk := os.read(reader, 1 << 16):
        log += chunk
    os.close(reader)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    indices = log.split()
    last = int(indices[-1]) if indices else None
    died = signal.Signals(-code).name if code < 0 else (f"exit code {code}" if code else None)
    return Outcome(op.name, len(indices), died, last if died else None)


def describe(op: Op, seed: int, trial: int) -> str:
    """The arguments of one trial, briefly, for a failure message."""
    args, kwargs = next(item for index, item in enumerate(trials(op, seed, trial + 1)) if index == trial)

    def short(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return (
                f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}{value.flatten()[:4].tolist()}"
            )
        return [short(v) for v in value] if isinstance(value, list) else value

    return (
        f"{op.name}({', '.join(map(str, map(short, args)))}, { ({k: short(v) for k, v in kwargs.items()}) })"
    )
