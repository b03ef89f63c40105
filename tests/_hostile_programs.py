"""Hostile programs: `.pt2` files whose graph (not a pickle) attacks whoever loads or runs it.

Built from `sample_models/mlp.pt2` by editing `models/model.json`: names that torch.fx pastes into
the Python it executes, operators that read or write files, sizes that hang sympy or allocate
gigabytes, dtypes that abort coreai-torch, names that carry terminal escapes or rich markup,
in-place ops on inputs, foreign namespaces and the training dialect. Every payload only touches a
marker path, so a vector that fires is visible and harmless. Used by tests/test_program_audit.py
and bench/bad_inputs.py; `mutants` makes the seeded graph mutations of the property test.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from _hostile import MODEL_JSON, SAMPLES, WEIGHTS_CONFIG, rewrite_pt2

Document = dict[str, Any]


def _edit_program(source: Path, dest: Path, edit: Callable[[Document], None]) -> Path:
    def change(members: dict[str, bytes]) -> None:
        document = json.loads(members[MODEL_JSON])
        edit(document)
        members[MODEL_JSON] = json.dumps(document).encode()

    return rewrite_pt2(source, dest, change)


def _graph(document: Document) -> Document:
    return document["graph_module"]["graph"]


def _rename(value: Any, old: str, new: str) -> Any:
    """Every occurrence of the name `old` in a JSON value (keys and strings), replaced."""
    if isinstance(value, dict):
        return {(new if k == old else k): _rename(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [_rename(v, old, new) for v in value]
    return new if value == old else value


def _tensor_meta(sizes: list[int], dtype: int = 7) -> Document:
    strides, step = [], 1
    for size in reversed(sizes):
        strides.insert(0, step)
        step *= size
    return {
        "dtype": dtype, "sizes": [{"as_int": s} for s in sizes], "requires_grad": False,
        "device": {"type": "cpu", "index": None}, "strides": [{"as_int": s} for s in strides],
        "storage_offset": {"as_int": 0}, "layout": 7,
    }  # fmt: skip


def _arg(name: str, value: Document, kind: int = 1) -> Document:
    return {"name": name, "arg": value, "kind": kind}


def _node(target: str, name: str, inputs: list[Document], outputs: list[Document]) -> Document:
    return {"target": target, "inputs": inputs, "outputs": outputs, "metadata": {}, "name": name}


def _use_in_output(document: Document, tensor: str) -> None:
    """Make the program return `tensor` too, so nothing can drop the node that makes it."""
    graph = _graph(document)
    graph["outputs"].append({"as_tensor": {"name": tensor}})
    spec = {"user_output": {"arg": {"as_tensor": {"name": tensor}}}}
    document["graph_module"]["signature"]["output_specs"].append(spec)
    out_spec = [1, {"type": "builtins.tuple", "context": "null", "children_spec": [
        {"type": None, "context": None, "children_spec": []},
        {"type": None, "context": None, "children_spec": []},
    ]}]  # fmt: skip
    document["graph_module"]["module_call_graph"][0]["signature"]["out_spec"] = json.dumps(out_spec)


def _append(document: Document, node: Document, metas: dict[str, Document]) -> None:
    graph = _graph(document)
    graph["nodes"].append(node)
    graph["tensor_values"].update(metas)


# ----- the vectors -------------------------------------------------------------------------------


def name_runs_code(dest: Path, marker: Path) -> Path:
    """The user input renamed to Python that FX pastes into code it executes while loading."""
    evil = f"x=__import__('os').system(\"touch '{marker}'\")"
    return _edit_program(SAMPLES / "mlp.pt2", dest, lambda d: d.update(_rename(d, "x", evil)))


def forward_arg_runs_code(dest: Path, marker: Path) -> Path:
    """The same text as a `forward` argument name: it lands in the generated signature and runs
    when the program runs."""

    def edit(document: Document) -> None:
        signature = document["graph_module"]["module_call_graph"][0]["signature"]
        signature["forward_arg_names"] = [f"x=__import__('os').system(\"touch '{marker}'\")"]

    return _edit_program(SAMPLES / "mlp.pt2", dest, edit)


def input_key_runs_code(dest: Path, marker: Path) -> Path:
    """The input spec's keyword key as Python: FX pastes it between quotes into the call that
    flattens `forward`'s arguments, so it runs every time the program runs."""
    key = f"a': __import__('os').system(\"touch '{marker}'\"), 'b"
    spec = [1, {"type": "builtins.tuple", "context": "null", "children_spec": [
        {"type": "builtins.tuple", "context": "null", "children_spec": []},
        {"type": "builtins.dict", "context": json.dumps([key]), "children_spec": [
            {"type": None, "context": None, "children_spec": []}]},
    ]}]  # fmt: skip

    def edit(document: Document) -> None:
        document["graph_module"]["module_call_graph"][0]["signature"]["in_spec"] = json.dumps(spec)

    return _edit_program(SAMPLES / "mlp.pt2", dest, edit)


def from_file_writes(dest: Path, marker: Path) -> Path:
    """`aten.from_file(shared=True)` then `copy_` into it: writes the input's bytes to `marker`."""

    def edit(document: Document) -> None:
        _append(document, _node("torch.ops.aten.from_file.default", "mapped", [
            _arg("filename", {"as_string": str(marker)}), _arg("shared", {"as_bool": True}),
            _arg("size", {"as_int": 256}), _arg("dtype", {"as_scalar_type": 7}, 2),
        ], [{"as_tensor": {"name": "mapped"}}]), {"mapped": _tensor_meta([256])})  # fmt: skip
        _append(document, _node("torch.ops.aten.view.default", "flat", [
            _arg("self", {"as_tensor": {"name": "x"}}), _arg("size", {"as_ints": [256]}),
        ], [{"as_tensor": {"name": "flat"}}]), {"flat": _tensor_meta([256])})  # fmt: skip
        _append(document, _node("torch.ops.aten.copy_.default", "written", [
            _arg("self", {"as_tensor": {"name": "mapped"}}), _arg("src", {"as_tensor": {"name": "flat"}}),
        ], [{"as_tensor": {"name": "written"}}]), {"written": _tensor_meta([256])})  # fmt: skip
        _use_in_output(document, "written")

    return _edit_program(SAMPLES / "mlp.pt2", dest, edit)


def from_file_reads(dest: Path, secret: Path) -> Path:
    """`aten.from_file` of a file the user can read, flowing to the outputs."""

    def edit(document: Document) -> None:
        _append(document, _node("torch.ops.aten.from_file.default", "stolen", [
            _arg("filename", {"as_string": str(secret)}), _arg("shared", {"as_bool": False}),
            _arg("size", {"as_int": 4}), _arg("dtype", {"as_scalar_type": 1}, 2),
        ], [{"as_tensor": {"name": "stolen"}}]), {"stolen": _tensor_meta([4], dtype=1)})  # fmt: skip
        _use_in_output(document, "stolen")

    return _edit_program(SAMPLES / "mlp.pt2", dest, edit)


def foreign_callable_writes(dest: Path, marker: Path) -> Path:
    """A node whose target is `torch.save`: the deserializer resolves it and the program calls it."""

    def edit(document: Document) -> None:
        _graph(document)["nodes"].append(_node("torch.save", "saved", [
            _arg("obj", {"as_tensor": {"name": "x"}}), _arg("f", {"as_string": str(marker)}),
        ], [{"as_none": True}]))  # fmt: skip

    return _edit_program(SAMPLES / "mlp.pt2", dest, edit)


def _first_size(document: Document, size: Document) -> None:
    _graph(document)["tensor_values"]["relu"]["sizes"][0] = size


def expression_hangs(dest: Path, marker: Path) -> Path:
    expr = {"as_expr": {"expr_str": "9**9**9", "hint": None}}
    return _edit_program(SAMPLES / "mlp.pt2", dest, lambda d: _first_size(d, expr))


def float_hangs(dest: Path, marker: Path) -> Path:
    expr = {"as_expr": {"expr_str": "Float('1e999999999')", "hint": None}}
    return _edit_program(SAMPLES / "mlp.pt2", dest, lambda d: _first_size(d, expr))


def deep_expression(dest: Path, marker: Path) -> Path:
    """A 990-deep attribute chain: the old check recursed into it and failed untyped."""
    expr = {"as_expr": {"expr_str": "Symbol" + ".a" * 990 + "(1)", "hint": None}}
    return _edit_program(SAMPLES / "mlp.pt2", dest, lambda d: _first_size(d, expr))


def _weight_meta(dest: Path, meta_edit: Callable[[Document], None],
                 program_edit: Callable[[Document], None]) -> Path:  # fmt: skip
    def change(members: dict[str, bytes]) -> None:
        config = json.loads(members[WEIGHTS_CONFIG])
        meta_edit(config["config"]["fc1.weight"]["tensor_meta"])
        members[WEIGHTS_CONFIG] = json.dumps(config).encode()
        document = json.loads(members[MODEL_JSON])
        program_edit(document)
        members[MODEL_JSON] = json.dumps(document).encode()

    return rewrite_pt2(SAMPLES / "mlp.pt2", dest, change)


def expanded_weight(dest: Path, marker: Path) -> Path:
    """A weight stored as one float viewed 2**30 times (strides 0): 4 GiB when a pass copies it."""

    def meta(tensor: Document) -> None:
        tensor["sizes"] = [{"as_int": 1 << 15}, {"as_int": 1 << 15}]
        tensor["strides"] = [{"as_int": 0}, {"as_int": 0}]

    def program(document: Document) -> None:
        value = _graph(document)["tensor_values"]["p_fc1_weight"]
        value["sizes"] = [{"as_int": 1 << 15}, {"as_int": 1 << 15}]
        value["strides"] = [{"as_int": 0}, {"as_int": 0}]

    return _weight_meta(dest, meta, program)


def complex_weight(dest: Path, marker: Path) -> Path:
    """A weight whose dtype code says complex64 (coreai-torch aborts the process converting it)."""

    def meta(tensor: Document) -> None:
        tensor.update(_tensor_meta([128, 32], dtype=10))

    def program(document: Document) -> None:
        _graph(document)["tensor_values"]["p_fc1_weight"] = _tensor_meta([128, 32], dtype=10)

    return _weight_meta(dest, meta, program)


def _renamed_node(text: str) -> Callable[[Path, Path], Path]:
    def make(dest: Path, marker: Path) -> Path:
        return _edit_program(SAMPLES / "mlp.pt2", dest, lambda d: d.update(_rename(d, "relu", text)))

    return make


def huge_allocation(dest: Path, marker: Path) -> Path:
    """`aten.full` of 2**40 elements, declared as one element."""

    def edit(document: Document) -> None:
        _append(document, _node("torch.ops.aten.full.default", "huge", [
            _arg("size", {"as_ints": [1 << 20, 1 << 20]}), _arg("fill_value", {"as_float": 1.0}),
            _arg("dtype", {"as_scalar_type": 7}, 2),
        ], [{"as_tensor": {"name": "huge"}}]), {"huge": _tensor_meta([1])})  # fmt: skip
        _use_in_output(document, "huge")

    return _edit_program(SAMPLES / "mlp.pt2", dest, edit)


def in_place_on_input(dest: Path, marker: Path) -> Path:
    """`aten.add_` on the user input, which the signature does not declare as mutated."""

    def edit(document: Document) -> None:
        _append(document, _node("torch.ops.aten.add_.Tensor", "bumped", [
            _arg("self", {"as_tensor": {"name": "x"}}), _arg("other", {"as_tensor": {"name": "x"}}),
        ], [{"as_tensor": {"name": "bumped"}}]), {"bumped": _tensor_meta([4, 64])})  # fmt: skip

    return _edit_program(SAMPLES / "mlp.pt2", dest, edit)


def foreign_namespace(dest: Path, marker: Path) -> Path:
    def edit(document: Document) -> None:
        _graph(document)["nodes"][2]["target"] = "torch.ops.profiler._record_function_enter.default"

    return _edit_program(SAMPLES / "mlp.pt2", dest, edit)


def training_dialect(dest: Path, marker: Path) -> Path:
    return _edit_program(SAMPLES / "mlp.pt2", dest, lambda d: d.update(verifiers=["TRAINING"]))


def higher_order(dest: Path, marker: Path) -> Path:
    def edit(document: Document) -> None:
        _graph(document)["nodes"][2]["target"] = "torch.ops.higher_order.cond"

    return _edit_program(SAMPLES / "mlp.pt2", dest, edit)


def _full(
    name: str, sizes: list[int], fill: Document, dtype: int = 7
) -> tuple[Document, dict[str, Document]]:
    node = _node("torch.ops.aten.full.default", name, [
        _arg("size", {"as_ints": sizes}), _arg("fill_value", fill), _arg("dtype", {"as_scalar_type": dtype}, 2),
    ], [{"as_tensor": {"name": name}}])  # fmt: skip
    return node, {name: _tensor_meta(sizes, dtype)}


def gradient_op_writes_heap(dest: Path, marker: Path) -> Path:
    """`max_pool2d_with_indices_backward` scattering into an 8x8 gradient at indices of 2**33 that
    `aten.full` makes: a heap write at an offset the file chooses (SIGSEGV under plain torch)."""

    def edit(document: Document) -> None:
        _append(document, *_full("where", [1, 1, 4, 4], {"as_int": 1 << 33}, dtype=5))
        _append(document, *_full("grad", [1, 1, 4, 4], {"as_float": 1.0}))
        _append(document, *_full("image", [1, 1, 8, 8], {"as_float": 1.0}))
        _append(document, _node("torch.ops.aten.max_pool2d_with_indices_backward.default", "scattered", [
            _arg("grad_output", {"as_tensor": {"name": "grad"}}), _arg("self", {"as_tensor": {"name": "image"}}),
            _arg("kernel_size", {"as_ints": [2, 2]}), _arg("stride", {"as_ints": [2, 2]}),
            _arg("padding", {"as_ints": [0, 0]}), _arg("dilation", {"as_ints": [1, 1]}),
            _arg("ceil_mode", {"as_bool": False}), _arg("indices", {"as_tensor": {"name": "where"}}),
        ], [{"as_tensor": {"name": "scattered"}}]), {"scattered": _tensor_meta([1, 1, 8, 8])})  # fmt: skip
        _use_in_output(document, "scattered")

    return _edit_program(SAMPLES / "mlp.pt2", dest, edit)


def dtype_as_integer(dest: Path, marker: Path) -> Path:
    """`to.dtype(x, -1)`: torch's dispatcher takes an integer for a dtype and reads its type table
    out of bounds."""

    def edit(document: Document) -> None:
        _append(document, _node("torch.ops.aten.to.dtype", "retyped", [
            _arg("self", {"as_tensor": {"name": "x"}}), _arg("dtype", {"as_int": -1}),
        ], [{"as_tensor": {"name": "retyped"}}]), {"retyped": _tensor_meta([4, 64])})  # fmt: skip
        _use_in_output(document, "retyped")

    return _edit_program(SAMPLES / "mlp.pt2", dest, edit)


def doubling_cats(dest: Path, marker: Path) -> Path:
    """40 chained `cat([t, t])` declared as 4 elements each: 2**40 times the input when run."""

    def edit(document: Document) -> None:
        previous = "x"
        for index in range(40):
            name = f"doubled_{index}"
            _append(document, _node("torch.ops.aten.cat.default", name, [
                _arg("tensors", {"as_tensors": [{"name": previous}, {"name": previous}]}), _arg("dim", {"as_int": 0}),
            ], [{"as_tensor": {"name": name}}]), {name: _tensor_meta([4])})  # fmt: skip
            previous = name
        _use_in_output(document, previous)

    return _edit_program(SAMPLES / "mlp.pt2", dest, edit)


def value_as_size(dest: Path, marker: Path) -> Path:
    """`_local_scalar_dense` of a stored tensor fed to `full` as its size: an allocation the
    weights choose."""

    def edit(document: Document) -> None:
        _append(document, _node("torch.ops.aten._local_scalar_dense.default", "count", [
            _arg("self", {"as_tensor": {"name": "p_fc1_bias"}}),
        ], [{"as_sym_int": {"as_name": "count"}}]), {})  # fmt: skip
        _graph(document)["sym_int_values"] = {"count": {"as_int": 4}}
        _append(document, _node("torch.ops.aten.full.default", "sized", [
            _arg("size", {"as_sym_ints": [{"as_name": "count"}]}), _arg("fill_value", {"as_float": 1.0}),
        ], [{"as_tensor": {"name": "sized"}}]), {"sized": _tensor_meta([4])})  # fmt: skip
        _use_in_output(document, "sized")

    return _edit_program(SAMPLES / "mlp.pt2", dest, edit)


def short_bias(dest: Path, marker: Path) -> Path:
    """A batch norm over 64 channels given a bias of none: its kernel reads past the bias."""

    def edit(document: Document) -> None:
        _append(document, *_full("stats", [64], {"as_float": 1.0}))
        _append(document, *_full("empty_bias", [0], {"as_float": 0.0}))
        _append(document, _node("torch.ops.aten._native_batch_norm_legit_no_training.default", "batch_norm", [
            _arg("input", {"as_tensor": {"name": "x"}}), _arg("weight", {"as_none": True}),
            _arg("bias", {"as_tensor": {"name": "empty_bias"}}), _arg("running_mean", {"as_tensor": {"name": "stats"}}),
            _arg("running_var", {"as_tensor": {"name": "stats"}}), _arg("momentum", {"as_float": 0.1}),
            _arg("eps", {"as_float": 1e-5}),
        ], [{"as_tensor": {"name": "normed"}}, {"as_tensor": {"name": "kept_mean"}},
            {"as_tensor": {"name": "kept_var"}}]),
            {"normed": _tensor_meta([4, 64]), "kept_mean": _tensor_meta([0]), "kept_var": _tensor_meta([0])})  # fmt: skip
        _use_in_output(document, "normed")

    return _edit_program(SAMPLES / "mlp.pt2", dest, edit)


def sparse_layout(dest: Path, marker: Path) -> Path:
    def edit(document: Document) -> None:
        node, meta = _full("sparse", [4], {"as_float": 1.0})
        node["inputs"].append(_arg("layout", {"as_layout": 1}, 2))
        _append(document, node, meta)
        _use_in_output(document, "sparse")

    return _edit_program(SAMPLES / "mlp.pt2", dest, edit)


def upsampled(dest: Path, marker: Path) -> Path:
    """`upsample_nearest2d.vec` scaled 2**20 both ways, declared at its input's size."""

    def edit(document: Document) -> None:
        _append(document, *_full("picture", [1, 1, 8, 8], {"as_float": 1.0}))
        _append(document, _node("torch.ops.aten.upsample_nearest2d.vec", "enlarged", [
            _arg("input", {"as_tensor": {"name": "picture"}}), _arg("output_size", {"as_none": True}),
            _arg("scale_factors", {"as_floats": [1048576.0, 1048576.0]}),
        ], [{"as_tensor": {"name": "enlarged"}}]), {"enlarged": _tensor_meta([1, 1, 8, 8])})  # fmt: skip
        _use_in_output(document, "enlarged")

    return _edit_program(SAMPLES / "mlp.pt2", dest, edit)


def _size_expression(text: str) -> Callable[[Path, Path], Path]:
    def make(dest: Path, marker: Path) -> Path:
        expr = {"as_expr": {"expr_str": text, "hint": {"as_int": 4}}}
        return _edit_program(SAMPLES / "mlp.pt2", dest, lambda d: _first_size(d, expr))

    return make


def truncating_division(dest: Path, marker: Path) -> Path:
    """The smallest int64 divided by -1, rounding toward zero: x86's idiv traps (SIGFPE)."""

    def edit(document: Document) -> None:
        _append(document, *_full("smallest", [4], {"as_int": -(1 << 63)}, dtype=5))
        _append(document, *_full("minus_one", [4], {"as_int": -1}, dtype=5))
        _append(document, _node("torch.ops.aten.div.Tensor_mode", "quotient", [
            _arg("self", {"as_tensor": {"name": "smallest"}}), _arg("other", {"as_tensor": {"name": "minus_one"}}),
            _arg("rounding_mode", {"as_string": "trunc"}, 2),
        ], [{"as_tensor": {"name": "quotient"}}]), {"quotient": _tensor_meta([4], dtype=5)})  # fmt: skip
        _use_in_output(document, "quotient")

    return _edit_program(SAMPLES / "mlp.pt2", dest, edit)


def deep_weight(dest: Path, marker: Path) -> Path:
    """A weight stored with 65 dimensions of one element."""

    def meta(tensor: Document) -> None:
        tensor.update(_tensor_meta([1] * 63 + [128, 64]))

    def program(document: Document) -> None:
        _graph(document)["tensor_values"]["p_fc1_weight"] = _tensor_meta([1] * 63 + [128, 64])

    return _weight_meta(dest, meta, program)


# ----- admitted ops fed hostile values --------------------------------------------------------------
# Each program is well formed - its shapes are the ones its ops compute - and feeds one admitted op
# that takes indices or sizes from tensor values constants that `aten.full` makes: far out of range,
# negative, NaN. The loader cannot see values, so these load; every command that runs the program
# must end in one line naming the node (its kernel refuses the value) and never in a signal.

_HUGE = 1 << 33
_INT64, _FLOAT32, _BOOL = 5, 7, 12


def _tensor(name: str) -> Document:
    return {"as_tensor": {"name": name}}


def _valued_op(target: str, arguments: list[Document], out: list[int],
               constants: list[tuple[str, list[int], Document, int]]) -> Callable[[Path, Path], Path]:  # fmt: skip
    """A program that makes `constants` (name, sizes, fill, dtype) with `full` and calls `target`
    on them and the user input `x` [4, 64], returning its float32 result of sizes `out`."""

    def make(dest: Path, marker: Path) -> Path:
        def edit(document: Document) -> None:
            for name, sizes, fill, dtype in constants:
                _append(document, *_full(name, sizes, fill, dtype))
            _append(document, _node(target, "hostile", arguments, [_tensor("hostile")]),
                    {"hostile": _tensor_meta(out)})  # fmt: skip
            _use_in_output(document, "hostile")

        return _edit_program(SAMPLES / "mlp.pt2", dest, edit)

    return make


_X = _arg("self", _tensor("x"))
VALUED_OPS: dict[str, Callable[[Path, Path], Path]] = {
    "gather-far": _valued_op("torch.ops.aten.gather.default",
        [_X, _arg("dim", {"as_int": 1}), _arg("index", _tensor("far"))], [4, 8],
        [("far", [4, 8], {"as_int": _HUGE}, _INT64)]),
    "index-select-negative": _valued_op("torch.ops.aten.index_select.default",
        [_X, _arg("dim", {"as_int": 0}), _arg("index", _tensor("below"))], [3, 64],
        [("below", [3], {"as_int": -(1 << 40)}, _INT64)]),
    "embedding-far": _valued_op("torch.ops.aten.embedding.default",
        [_arg("weight", _tensor("x")), _arg("indices", _tensor("far"))], [5, 64],
        [("far", [5], {"as_int": 1 << 62}, _INT64)]),
    "index-far": _valued_op("torch.ops.aten.index.Tensor",
        [_X, _arg("indices", {"as_optional_tensors": [_tensor("far")]})], [2, 64],
        [("far", [2], {"as_int": _HUGE}, _INT64)]),
    "index-put-far": _valued_op("torch.ops.aten.index_put.default",
        [_X, _arg("indices", {"as_optional_tensors": [_tensor("far")]}), _arg("values", _tensor("ones"))], [4, 64],
        [("far", [2], {"as_int": _HUGE}, _INT64), ("ones", [2, 64], {"as_float": 1.0}, _FLOAT32)]),
    "scatter-far": _valued_op("torch.ops.aten.scatter.src",
        [_X, _arg("dim", {"as_int": 1}), _arg("index", _tensor("far")), _arg("src", _tensor("ones"))], [4, 64],
        [("far", [4, 8], {"as_int": _HUGE}, _INT64), ("ones", [4, 8], {"as_float": 1.0}, _FLOAT32)]),
    "scatter-add-negative": _valued_op("torch.ops.aten.scatter_add.default",
        [_X, _arg("dim", {"as_int": 0}), _arg("index", _tensor("below")), _arg("src", _tensor("ones"))], [4, 64],
        [("below", [2, 64], {"as_int": -(1 << 40)}, _INT64), ("ones", [2, 64], {"as_float": 1.0}, _FLOAT32)]),
    "scatter-reduce-far": _valued_op("torch.ops.aten.scatter_reduce.two",
        [_X, _arg("dim", {"as_int": 1}), _arg("index", _tensor("far")), _arg("src", _tensor("ones")),
         _arg("reduce", {"as_string": "sum"})], [4, 64],
        [("far", [4, 8], {"as_int": 1 << 62}, _INT64), ("ones", [4, 8], {"as_float": 1.0}, _FLOAT32)]),
    "masked-scatter-short": _valued_op("torch.ops.aten.masked_scatter.default",
        [_X, _arg("mask", _tensor("every")), _arg("source", _tensor("one"))], [4, 64],
        [("every", [4, 64], {"as_bool": True}, _BOOL), ("one", [1], {"as_float": 1.0}, _FLOAT32)]),
    "grid-sampler-nan": _valued_op("torch.ops.aten.grid_sampler_2d.default",
        [_arg("input", _tensor("image")), _arg("grid", _tensor("nowhere")), _arg("interpolation_mode", {"as_int": 1}),
         _arg("padding_mode", {"as_int": 0}), _arg("align_corners", {"as_bool": False})], [1, 1, 4, 4],
        [("image", [1, 1, 8, 8], {"as_float": 1.0}, _FLOAT32), ("nowhere", [1, 4, 4, 2], {"as_float": float("nan")}, _FLOAT32)]),
}  # fmt: skip
# The values the vectors above feed a kernel that checks them: what the command says.
VALUED_REFUSALS = ("out of range", "out of bounds", "index", "number of elements", "masked_scatter")


# name -> (builder, the text the refusal must contain)
VECTORS: dict[str, tuple[Callable[[Path, Path], Path], str]] = {
    "name-runs-code": (name_runs_code, "is not a Python identifier"),
    "forward-arg-runs-code": (forward_arg_runs_code, "forward argument"),
    "input-key-runs-code": (input_key_runs_code, "in_spec key"),
    "from-file-writes": (from_file_writes, "torch.ops.aten.from_file.default"),
    "from-file-reads": (from_file_reads, "torch.ops.aten.from_file.default"),
    "foreign-callable-writes": (foreign_callable_writes, "'torch.save'"),
    "expression-hangs": (expression_hangs, "power whose exponent is not a small integer constant"),
    "float-hangs": (float_hangs, "beyond float64"),
    "deep-expression": (deep_expression, "nesting deeper than"),
    "expanded-weight": (expanded_weight, "an expanded or lying layout"),
    "complex-weight": (complex_weight, "not a Core AI element type"),
    "markup-name": (_renamed_node("[bold red]relu[/]"), "is not a Python identifier"),
    "escape-name": (_renamed_node("\x1b[31mrelu\x1b]0;pwned\x07"), "is not a Python identifier"),
    "surrogate-name": (_renamed_node("relu\ud800"), "is not a Python identifier"),
    "huge-allocation": (huge_allocation, "asks for a tensor of 1,099,511,627,776 elements"),
    "in-place-on-input": (in_place_on_input, "mutates its arguments in place"),
    "foreign-namespace": (foreign_namespace, "not an ATen or coreai-torch operator"),
    "training-dialect": (training_dialect, "training-dialect program"),
    "higher-order": (higher_order, "higher-order operator"),
    "gradient-op-writes-heap": (gradient_op_writes_heap, "a gradient op"),
    "dtype-as-integer": (dtype_as_integer, "passes 'dtype' as int, where the operator takes ScalarType"),
    "doubling-cats": (
        doubling_cats,
        "node doubled_0 (aten.cat.default) computes float32[8, 64] but declares float32[4]",
    ),
    "value-as-size": (value_as_size, "into a number the audit cannot bound"),
    "short-bias": (
        short_bias,
        "node batch_norm (aten._native_batch_norm_legit_no_training.default) fails on the shapes",
    ),
    "sparse-layout": (sparse_layout, "layout other than strided"),
    "upsampled": (upsampled, "computes float32[1, 1, 8388608, 8388608] but declares float32[1, 1, 8, 8]"),
    "size-divides-by-zero": (_size_expression("FloorDiv(Symbol('s0'), Integer(0))"), "division by zero"),
    "size-by-condition": (_size_expression("Piecewise((s0, Eq(s0, 4)), (8, True))"), "call of 'Piecewise'"),
    "size-complex-infinity": (_size_expression("s0 + zoo"), "name 'zoo'"),
    "deep-weight": (deep_weight, "65 dimensions (at most 16)"),
    "truncating-division": (truncating_division, "divides integers rounding toward zero"),
}
# Vectors that crash a process that loads and runs them with plain torch (a signal, not an error).
NATIVE_CRASHES = ("gradient-op-writes-heap", "truncating-division")
# Vectors that fire under plain `torch.export.load` and a run of the program (of the others, some
# hang, abort or allocate gigabytes there and are not run live; torch itself stops some before
# they run - the forward argument name fails to compile in torch 2.13, its verifier refuses the
# in-place `copy_` and a `torch.save` target - but a file must not depend on either).
LIVE = ("name-runs-code", "input-key-runs-code", "from-file-reads")


# ----- seeded graph mutations (the property test) ------------------------------------------------

_TARGETS = (
    "torch.ops.aten.add.Tensor", "torch.ops.aten.relu.default", "torch.ops.aten.from_file.default",
    "torch.ops.aten.copy_.default", "torch.ops.aten.add_.Tensor", "torch.ops.aten.empty.memory_format",
    "torch.ops.aten.full.default", "torch.save", "torch.load", "builtins.eval", "_operator.getitem",
    "torch.ops.higher_order.cond", "torch.ops.coreai.lut_to_dense.default", "#extension", "",
    "torch.ops.aten.nonexistent.default", "torch.ops.aten.linear.default", "math.trunc",
)  # fmt: skip
_NAMES = (
    "x", "relu", "a b", "x=1", "__class__", "self", "torch", "for", "[bold]x", "\x1b[2J", "x\ud800", "ok_1",
    "layers.0", "0", "", "é",
)  # fmt: skip


def _values(secret: Path, marker: Path) -> tuple[Document, ...]:
    """Argument values a mutation puts in: lies, refused kinds, and paths a payload would touch."""
    return (
        {"as_int": 1 << 40}, {"as_int": -1}, {"as_ints": [1 << 20, 1 << 20]}, {"as_string": str(secret)},
        {"as_string": str(marker)}, {"as_string": "a\nb"}, {"as_graph": {"name": "g", "graph": {}}},
        {"as_custom_obj": {"name": "c", "class_fqn": "os.system"}}, {"as_operator": "torch.save"},
        {"as_tensor": {"name": "missing"}}, {"as_float": 1e308}, {"as_sym_int": {"as_expr": {"expr_str": "9**9**9"}}},
        {"as_scalar_type": 10}, {"as_device": {"type": "xla"}}, {"as_none": True}, {"as_bool": True}, {"as_ints": []},
    )  # fmt: skip


_SIZES = (
    {"as_int": 1 << 40}, {"as_int": -5}, {"as_int": 0}, {"as_expr": {"expr_str": "s0**s0", "hint": None}},
    {"as_expr": {"expr_str": "__import__('os')", "hint": None}}, {"as_expr": {"expr_str": "Integer(7)", "hint": {"as_int": 7}}},
    {"as_int": 3},
)  # fmt: skip


def _nodes_and_values(document: Document) -> Iterator[tuple[Document, str]]:
    graph = _graph(document)
    for node in graph["nodes"]:
        yield node, "node"
    for name in graph["tensor_values"]:
        yield graph["tensor_values"][name], "tensor"


def mutate(document: Document, rng: random.Random, values: tuple[Document, ...]) -> Document:
    """One to three random edits of a program: an op name, an argument, a size, a name."""
    mutant = copy.deepcopy(document)
    graph = _graph(mutant)
    for _ in range(rng.randint(1, 3)):
        choice = rng.randrange(5)
        node = rng.choice(graph["nodes"])
        if choice == 0:
            node["target"] = rng.choice(_TARGETS)
        elif choice == 1 and node["inputs"]:
            rng.choice(node["inputs"])["arg"] = copy.deepcopy(rng.choice(values))
        elif choice == 2:
            meta = rng.choice(list(graph["tensor_values"].values()))
            if meta["sizes"]:
                meta[rng.choice(["sizes", "strides"])][0] = copy.deepcopy(rng.choice(_SIZES))
        elif choice == 3:
            old = node["name"]
            mutant.update(_rename(mutant, old, rng.choice(_NAMES)))
            graph = _graph(mutant)
        else:
            meta = rng.choice(list(graph["tensor_values"].values()))
            meta["dtype"] = rng.choice([0, 7, 9, 10, 12, 31, 99, "7"])
    return mutant


def mutants(directory: Path, count: int, seed: int, *, secret: Path, marker: Path) -> list[Path]:
    """`count` seeded mutants of the small sample programs, written under `directory`; arguments
    they rewrite may name `secret` (a file to read) or `marker` (a file to write)."""
    rng = random.Random(seed)
    values = _values(secret, marker)
    paths = []
    sources = [SAMPLES / f"{name}.pt2" for name in ("mlp", "wide_range", "int_arith", "cnn")]
    for index in range(count):
        source, state = rng.choice(sources), rng.getrandbits(32)

        def edit(document: Document, state: int = state) -> None:
            document.update(mutate(document, random.Random(state), values))

        paths.append(_edit_program(source, directory / f"mutant-{index}.pt2", edit))
    return paths
