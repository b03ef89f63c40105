"""Which operators a program from a file may call: tensor arithmetic, nothing else.

torch's deserializer resolves a node's target string by attribute lookups on `torch`, `operator`
and `math`, and a target that resolves to any callable becomes a call when the program runs
(`torch.load`, `torch.ops.aten.from_file`, ... as readily as `aten.add`). A target is allowed only
when it is

- one of the ATen operators below: the core opset (torch's `core` tag), those coreai-torch lowers
  or keeps as composites, and the shape assertions export writes - less every one that mutates an
  argument (a functional program declares each mutation in its signature), takes a file name, a
  storage or a generator, or returns uninitialised memory (`empty`: it would hand the process's
  old heap bytes to the outputs), every gradient op (`*_backward`: its kernels trust the indices
  they are given - a file fed `max_pool2d_with_indices_backward` indices of 2**33 and wrote the
  heap where it chose), `_local_scalar_dense` (a tensor's value become a size or index), the
  complex-number ops, and `_embedding_bag`, whose kernel crashes on values (`WITHHELD`).
  `tests/test_program_audit.py` derives the list again from torch and coreai-torch and fails when
  they disagree;
- one of coreai-torch's own ops (`coreai::lut_to_dense`, `constexpr_blockwise_shift_scale`,
  `sparse_to_dense`, `quantize`, `dequantize`);
- arithmetic on symbolic sizes as export writes it for dynamic shapes (`operator.mul`,
  `torch.sym_max`, ...).

Everything else - other namespaces, higher-order ops, extension ops, anything touching files,
processes or global state - is refused before torch sees the program.

An admitted op must also be safe for any value a file can give it: the loader holds every node to
the shapes its op's meta kernel computes (`_shapes`), so a kernel never meets arguments whose
shapes it would not accept, and `tests/test_op_values.py` runs every admitted op on hostile values
(indices far out of range, NaN, huge counts) that pass that check, in a child process: none may
crash it.
"""

from __future__ import annotations

import re
from typing import Any

TARGET = re.compile(r"torch\.ops\.(aten|coreai)\.([A-Za-z_][A-Za-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)\Z")
ATEN_OPS = frozenset(
    {
        "_adaptive_avg_pool2d.default", "_adaptive_avg_pool3d.default", "_assert_async.msg",
        "_assert_scalar.default", "_assert_tensor_metadata.default", "_cdist_forward.default",
        "_log_softmax.default", "_native_batch_norm_legit.no_stats",
        "_native_batch_norm_legit_no_training.default", "_pdist_forward.default", "_softmax.default",
        "_to_copy.default", "_unsafe_view.default", "abs.default", "acos.default", "acosh.default",
        "adaptive_avg_pool1d.default", "add.Scalar", "add.Tensor", "addmm.default", "alias.default",
        "amax.default", "amin.default", "any.default", "any.dim", "any.dims", "arange.start_step",
        "argmax.default", "argmin.default", "as_strided.default", "asin.default", "asinh.default",
        "atan.default", "atan2.default", "atanh.default", "avg_pool1d.default", "avg_pool2d.default",
        "avg_pool3d.default", "bitwise_and.Scalar", "bitwise_and.Tensor", "bitwise_not.default",
        "bitwise_or.Scalar", "bitwise_or.Tensor", "bitwise_xor.Scalar", "bitwise_xor.Tensor", "bmm.default",
        "cat.default", "ceil.default", "clamp.Tensor", "clamp.default", "clone.default", "col2im.default",
        "constant_pad_nd.default", "convolution.default", "copy.default", "cos.default", "cosh.default",
        "cumsum.default", "diagonal.default", "div.Scalar", "div.Scalar_mode", "div.Tensor",
        "div.Tensor_mode", "elu.default", "embedding.default", "eq.Scalar", "eq.Tensor", "erf.default",
        "exp.default", "exp2.default", "expand.default", "expm1.default", "fill.Scalar", "flip.default",
        "floor.default", "floor_divide.default", "fmod.Scalar", "fmod.Tensor", "full.default",
        "full_like.default", "gather.default", "ge.Scalar", "ge.Tensor", "gelu.default",
        "grid_sampler_2d.default", "gt.Scalar", "gt.Tensor", "hardsigmoid.default", "hardswish.default",
        "hardtanh.default", "index.Tensor", "index_put.default", "index_select.default",
        "instance_norm.default", "isinf.default", "isnan.default", "le.Scalar", "le.Tensor",
        "leaky_relu.default", "lift_fresh_copy.default", "linalg_vector_norm.default", "log.default",
        "log10.default", "log1p.default", "log2.default", "logical_and.default", "logical_not.default",
        "logical_or.default", "logical_xor.default", "lt.Scalar", "lt.Tensor", "masked_scatter.default",
        "max.default", "max.dim", "max_pool2d_with_indices.default", "max_pool3d_with_indices.default",
        "maximum.default", "mean.default", "mean.dim", "min.default", "min.dim", "minimum.default",
        "mm.default", "mul.Scalar", "mul.Tensor", "native_dropout.default", "native_group_norm.default",
        "native_layer_norm.default", "ne.Scalar", "ne.Tensor", "neg.default", "nonzero.default",
        "nonzero_numpy.default", "permute.default", "pixel_shuffle.default", "pow.Scalar",
        "pow.Tensor_Scalar", "pow.Tensor_Tensor", "prod.default", "prod.dim_int", "rand.default",
        "randn.default", "randperm.default", "reciprocal.default", "reflection_pad1d.default",
        "reflection_pad2d.default", "reflection_pad3d.default", "relu.default", "remainder.Scalar",
        "remainder.Tensor", "repeat.default", "replication_pad1d.default", "replication_pad2d.default",
        "replication_pad3d.default", "round.decimals", "round.default", "rsqrt.default",
        "scalar_tensor.default", "scaled_dot_product_attention.default", "scatter.reduce", "scatter.src",
        "scatter.value", "scatter.value_reduce", "scatter_add.default", "scatter_reduce.two", "select.int",
        "select_scatter.default", "sigmoid.default", "sign.default", "silu.default", "sin.default",
        "sinh.default", "slice.Tensor", "slice_scatter.default", "sort.default", "split_with_sizes.default",
        "sqrt.default", "squeeze.dim", "squeeze.dims", "sub.Scalar", "sub.Tensor", "sum.dim_IntList",
        "sym_constrain_range.default", "sym_constrain_range_for_size.default", "sym_is_contiguous.default",
        "sym_numel.default", "sym_size.int", "sym_storage_offset.default", "sym_stride.int", "tan.default",
        "tanh.default", "tile.default", "to.dtype", "topk.default", "true_divide.Tensor", "trunc.default",
        "unsqueeze.default", "upsample_bilinear2d.vec", "upsample_nearest2d.vec", "var.correction",
        "var.dim", "view.default", "where.self",
    }
)  # fmt: skip
COREAI_OPS = frozenset(
    {
        "lut_to_dense.default", "constexpr_blockwise_shift_scale.default", "sparse_to_dense.default",
        "quantize.default", "dequantize.default",
    }
)  # fmt: skip
# What export writes for arithmetic on symbolic sizes (torch's serializer: `_SYM_OPS`).
SYMBOLIC_TARGETS = frozenset(
    {f"_operator.{name}" for name in (
        "eq", "ne", "le", "ge", "lt", "gt", "neg", "pos", "mul", "add", "sub", "floordiv", "mod", "pow",
        "truediv", "and_", "or_", "lshift", "rshift",
    )}
    | {f"torch.{name}" for name in ("sym_not", "sym_int", "sym_float", "sym_ite", "sym_max", "sym_min", "_sym_sqrt")}
    | {"math.trunc"}
)  # fmt: skip
# Named here though the rules above exclude them already: files, storages, global state.
DENIED = frozenset({"from_file", "save", "set_", "_set_grad_enabled", "manual_seed"})
# What torch tags core, or coreai-torch lowers, that a program from a file may still not call
# (tests/test_program_audit.py derives the list above again less these).
GRADIENT_SUFFIX = "_backward"
GRADIENT = "a gradient op: no inference program calls it, and its kernels trust the indices and sizes given"
_COMPLEX = "it computes on complex numbers, which Core AI has no element type for"
WITHHELD = {
    "_local_scalar_dense": "it turns a tensor's value into a number the audit cannot bound (a size or index)",
    "_embedding_bag": "its kernel reads out of bounds on values no shape check sees (a padding index of 2**33 over "
    "empty 2-D indices: tests/test_op_values.py)",
    "_fft_c2r": _COMPLEX, "_fft_r2c": _COMPLEX, "complex": _COMPLEX, "polar": _COMPLEX,
    "view_as_complex": _COMPLEX, "view_as_complex_copy": _COMPLEX, "view_as_real": _COMPLEX,
    "view_as_real_copy": _COMPLEX,
}  # fmt: skip
# Admitted ops that crash the process on some dtypes whatever the shapes: `_shapes` refuses a node
# that calls one so (found by tests/test_op_values.py; its filter applies the same rule).
TRUNCATING_DIVISION = frozenset({"div.Tensor_mode", "div.Scalar_mode"})
TRUNCATION_TRAP = (
    "divides integers rounding toward zero, where the smallest integer divided by -1 stops the process "
    "(SIGFPE on x86) and the values are the file's"
)
# The only string arguments the allowed operators take (printed as literals, never run).
STRING_ARGUMENTS = frozenset({"rounding_mode", "approximate", "reduce", "assert_msg"})
REFUSED_ARGUMENT_TYPES = ("Storage", "Generator", "Stream", "Any", "__torch__")


def schema_problem(schema: Any) -> str | None:
    """Why an operator schema is outside what a program from a file may call, or None."""
    if schema.is_mutable:
        return "it mutates its arguments in place"
    for argument in schema.arguments:
        kind = str(argument.type)
        if any(word in kind for word in REFUSED_ARGUMENT_TYPES):
            return f"it takes a {kind} ({argument.name})"
        if "str" in kind and argument.name not in STRING_ARGUMENTS:
            return f"it takes a string ({argument.name})"
    return None


def is_symbolic(target: str) -> bool:
    return target in SYMBOLIC_TARGETS


def operator_problem(target: Any) -> str | None:
    """Why a node's target string is not an allowed operator, or None."""
    if not isinstance(target, str) or len(target) > 200:
        return "a target that is not an operator name"
    if target in SYMBOLIC_TARGETS:
        return None
    match = TARGET.match(target)
    if match is None:
        if target.startswith("torch.ops.higher_order."):
            return "a higher-order operator (control flow or a wrapped subgraph), which coreopt does not run"
        return "not an ATen or coreai-torch operator"
    namespace, name, overload = match.groups()
    if f"{name}.{overload}" in (ATEN_OPS if namespace == "aten" else COREAI_OPS):
        return None
    if namespace == "coreai":
        return "not one of coreai-torch's decompression, quantize or dequantize ops"
    return f"an ATen operator coreopt does not run from a file ({_why_not(name, overload)})"


def _why_not(name: str, overload: str) -> str:
    """What puts an ATen operator outside the list, said from its schema where torch has one."""
    import torch

    packet = getattr(torch.ops.aten, name, None)
    op = getattr(packet, overload, None) if packet is not None else None
    if op is None:
        return "this torch does not define it"
    problem = schema_problem(op._schema)
    if problem:
        return problem
    if name.startswith(("empty", "new_empty")):
        return "it returns uninitialised memory"
    if name.endswith(GRADIENT_SUFFIX):
        return GRADIENT
    if name in WITHHELD:
        return WITHHELD[name]
    if name in DENIED:
        return "it touches files or global state"
    return "outside the core opset coreai-torch converts: export with coreai-torch's decompositions"
