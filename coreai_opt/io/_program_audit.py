"""The program inside a `.pt2`, checked as data before torch turns any of it into Python.

A `torch.export` program is code: torch.fx pastes node, placeholder and output names, the
`forward` argument names and the keys of the input spec into Python source that it `exec`s, the
deserializer resolves every node's target by attribute lookups, and running the program calls
each target with the arguments the file gives. `program_problem` reads `models/model.json` as
plain JSON and accepts it only when

- every name that can reach generated Python is an identifier (or a dotted path of identifiers
  and indices, for parameter and module paths), and no free text carries a character that ends a
  line of Python (stack traces are pasted into comments);
- every node calls an allowed operator (`_allowlist`) with arguments of plain kinds (no graphs,
  custom objects, operators or nested structures), each of the kind its schema's type takes
  (`_signatures`: no integer where a dtype belongs), and known tensor names;
- the signature declares nothing but inputs, parameters, buffers, constants and outputs, with
  mutations only of declared buffers and inputs (the training dialect, tokens and custom objects
  are refused);
- no declared tensor, and no size an operator is asked to allocate, exceeds a budget derived
  from what the file really stores (`size_budget`); dtypes are ones Core AI has.

Each walk is iterative and linear in the document's size: a 3,000-node program is checked in
a few tens of milliseconds (docs/benchmarks.md).
"""

from __future__ import annotations

import json
import keyword
import math
import re
from collections.abc import Iterable, Iterator
from functools import cache
from typing import Any, NoReturn

from ._allowlist import STRING_ARGUMENTS, is_symbolic, operator_problem
from ._expressions import bare_symbol, sympy_problem
from ._signatures import arguments_problem

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_PATH_PART = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z|[0-9]+\Z")
# Names FX's generated code defines or imports itself: a value of that name would shadow them.
_RESERVED = frozenset({"self", "torch", "device", "inf", "nan", "NoneType", "fx_pytree", "pytree", "wrap"})
MAX_NAME = 256
MAX_TEXT = 1 << 16  # a stack trace or metadata string
MAX_JSON_DEPTH = 64
# Dimensions of any tensor a program declares or stores: programs use 6 or fewer; torch's kernels
# stop at 64, some with an assertion rather than an error.
MAX_RANK = 16
# Whatever a model stores, a program may hold tensors of this many elements (a small model's
# attention scores over a long sequence); beyond it, a tensor may be at most this many times the
# largest stored tensor.
FLOOR_ELEMENTS = 1 << 26
STORED_MULTIPLE = 64
# Argument names whose integer lists are a tensor's shape (their product is its element count)
# or repeat counts (the product times the input's elements).
SHAPE_ARGUMENTS = frozenset({"size", "sizes", "shape", "output_size"})
REPEAT_ARGUMENTS = frozenset({"repeats", "dims"})
REPEATING_OPS = frozenset({"torch.ops.aten.repeat.default", "torch.ops.aten.tile.default"})
# Argument names whose integers are paddings, strides, kernel sizes: each at most the largest
# dimension the program declares.
WINDOW_ARGUMENTS = frozenset({"pad", "padding", "output_padding", "dilation", "stride", "kernel_size"})
# Argument names whose integers index the dimensions of the operator's `self`: each within its
# declared rank (Core AI's compiler crashes the process on a permutation naming dimension 10**18).
DIM_ARGUMENTS = frozenset({"dim", "dims", "dim0", "dim1", "dim2", "start_dim", "end_dim"})
_INSERTING_OPS = frozenset({"torch.ops.aten.unsqueeze.default"})  # a dim may be the new last one
_PERMUTING_OPS = frozenset({"torch.ops.aten.permute.default"})
_COUNTED_OPS = {  # ops that allocate a count given as scalars
    "torch.ops.aten.arange.start_step": ("start", "end", "step"),
    "torch.ops.aten.randperm.default": (None, "n", None),
}
_DEVICES = frozenset({"cpu", "cuda", "mps", "meta"})
_ARGUMENT_KINDS = frozenset(
    {
        "as_none", "as_tensor", "as_tensors", "as_int", "as_ints", "as_float", "as_floats", "as_string",
        "as_sym_int", "as_sym_ints", "as_scalar_type", "as_memory_format", "as_layout", "as_device",
        "as_bool", "as_bools", "as_sym_bool", "as_sym_bools", "as_optional_tensors", "as_sym_float",
        "as_sym_floats", "as_optional_tensor", "as_complex", "as_int_lists", "as_float_lists",
    }
)  # fmt: skip
_REFUSED_KINDS = {
    "as_graph": "a subgraph (control flow)",
    "as_custom_obj": "a custom (pickled) object",
    "as_operator": "an operator passed as a value",
    "as_strings": "a list of strings",
    "as_nested_tensors": "nested tensor lists",
    "as_string_to_argument": "a dictionary argument",
}
_TRAINING_OUTPUTS = ("loss_output", "gradient_to_parameter", "gradient_to_user_input")
_METADATA_KEYS = frozenset(
    {"stack_trace", "nn_module_stack", "source_fn_stack", "torch_fn", "custom", "from_node"}
)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")
_CONTROL_OR_NEWLINE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


class _Refused(Exception):
    """Raised inside the walk; `program_problem` returns its text."""


def _refuse(text: str) -> NoReturn:
    raise _Refused(text)


def _shown(value: Any, limit: int = 60) -> str:
    """A value from the file as it may appear in a one-line message (repr: no raw escapes)."""
    text = value if isinstance(value, str) else str(type(value).__name__)
    return repr(text[:limit] + ("…" if len(text) > limit else ""))


def name_problem(name: Any) -> str | None:
    """Why `name` cannot be a Python identifier of generated code, or None."""
    if not isinstance(name, str) or not name:
        return "is not a name"
    if len(name) > MAX_NAME:
        return "is longer than any name"
    if not _IDENTIFIER.match(name):
        return "is not a Python identifier"
    if keyword.iskeyword(name) or name in _RESERVED or name.startswith("__"):
        return "is a name Python or torch.fx reserves"
    return None


def path_problem(path: Any, *, empty: bool = False) -> str | None:
    """Why `path` is not a dotted path of identifiers and indices (`layers.0.weight`), or None."""
    if path == "" and empty:
        return None
    if not isinstance(path, str) or not path or len(path) > 4 * MAX_NAME:
        return "is not a module path"
    for part in path.split("."):
        if not _PATH_PART.match(part) or part.startswith("__") or keyword.iskeyword(part):
            return "is not a dotted path of identifiers"
    return None


_GOOD_NAMES: set[str] = set()  # names already found to be identifiers (programs repeat them)


def _check_name(name: Any, what: str) -> str:
    if isinstance(name, str) and name in _GOOD_NAMES:
        return name
    problem = name_problem(name)
    if problem:
        _refuse(f"{what} {_shown(name)} {problem}")
    if len(_GOOD_NAMES) < 1 << 16:
        _GOOD_NAMES.add(name)
    return name


def _check_path(path: Any, what: str, *, empty: bool = False) -> None:
    problem = path_problem(path, empty=empty)
    if problem:
        _refuse(f"{what} {_shown(path)} {problem}")


def _json_depth(value: Any) -> int:
    depth, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        depth = max(depth, level)
        if isinstance(item, dict):
            stack.extend((v, level + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, level + 1) for v in item)
    return depth


def _embedded_json(text: Any, what: str) -> Any:
    """A JSON document stored as a string inside the program (metadata, pytree specs)."""
    if not isinstance(text, str) or len(text) > MAX_TEXT:
        _refuse(f"{what} is not a bounded string")
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        _refuse(f"{what} is not valid JSON")
    if _json_depth(value) > MAX_JSON_DEPTH:
        _refuse(f"{what} nests deeper than {MAX_JSON_DEPTH} levels")
    return value


def _strings(value: Any) -> Iterator[str]:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


@cache
def _core_ai_dtype_codes() -> frozenset[int]:
    """The serialized dtype codes of element types Core AI has (`_elements`): no complex, no
    quantized, no fnuz floats - coreai-torch aborts the process on some of them."""
    from torch._export.serde.schema import ScalarType
    from torch._export.serde.serialize import _SERIALIZE_TO_TORCH_DTYPE

    from coreai_opt._elements import of_torch

    codes = set()
    for code, dtype in _SERIALIZE_TO_TORCH_DTYPE.items():
        try:
            of_torch(dtype)
        except ValueError:
            continue
        codes.add(int(ScalarType(code)))
    return frozenset(codes)


def dtype_problem(code: Any) -> str | None:
    """Why a serialized dtype code is not one of Core AI's element types, or None."""
    if type(code) is not int or code not in _core_ai_dtype_codes():
        return f"has dtype code {code!r}, which is not a Core AI element type (complex, quantized, unknown)"
    return None


def size_budget(stored_elements: Iterable[int]) -> int:
    """The most elements any tensor of a program may declare or ask an operator to allocate."""
    return max(FLOOR_ELEMENTS, STORED_MULTIPLE * max(stored_elements, default=0))


def _union(value: Any, what: str) -> tuple[str, Any]:
    """The one (kind, value) of a serialized union (`{"as_tensor": {...}}`)."""
    if not isinstance(value, dict) or len(value) != 1:
        _refuse(f"{what} is not a serialized value")
    return next(iter(value.items()))


def _symbolic(value: Any, what: str, plain: str) -> None:
    """A serialized SymInt/SymFloat/SymBool: a plain number, or an expression torch hands to
    sympy (checked by `_expressions.sympy_problem`, with a hint of the plain kind)."""
    kind, inner = _union(value, what)
    if kind == plain:
        if plain == "as_int" and type(inner) is not int:
            _refuse(f"{what} is not an integer")
        return
    if kind != "as_expr" or not isinstance(inner, dict):
        _refuse(f"{what} is neither a number nor an expression")
    problem = sympy_problem(inner.get("expr_str"))
    if problem:
        _refuse(f"{what}: symbolic shape {_shown(inner.get('expr_str'), 80)} holds a {problem}")
    hint = inner.get("hint")
    if hint is not None:
        hint_kind, hint_value = _union(hint, f"the hint of {what}")
        if hint_kind not in ("as_int", "as_bool", "as_float") or isinstance(hint_value, (dict, list, str)):
            _refuse(f"the hint of {what} is not a number")


def _int(value: Any, what: str) -> int:
    if type(value) is not int:
        _refuse(f"{what} is not an integer")
    return value


class _Audit:
    def __init__(self, document: dict[str, Any], budget: int) -> None:
        self.document = document
        self.budget = budget
        self.tensors: dict[str, int | None] = {}  # declared tensor name -> elements (None: symbolic)
        self.ranks: dict[str, int] = {}  # declared tensor name -> number of dimensions
        self.largest_dim = 1
        self.symbols: set[str] = set()
        self.ranges: dict[str, int] = {}  # shape symbol -> the largest value the program declares for it
        self.bounds: dict[str, int] = {}  # symbolic value that is one such symbol -> that largest value

    # ----- the whole document --------------------------------------------------------------------

    def run(self) -> None:
        verifiers = self.document.get("verifiers", [])
        if not isinstance(verifiers, list) or any(v not in ("ATEN", "") for v in verifiers):
            if isinstance(verifiers, list) and "TRAINING" in verifiers:
                _refuse(
                    "a training-dialect program (torch.export.export without run_decompositions); "
                    "re-export it with .run_decompositions(coreai_torch.get_decomp_table())"
                )
            _refuse(f"verifier dialect {_shown(str(verifiers))} is not the ATen dialect")
        module = self.document.get("graph_module")
        if not isinstance(module, dict) or not isinstance(module.get("graph"), dict):
            _refuse("has no graph")
        graph = module["graph"]
        self._ranges(self.document.get("range_constraints", {}))
        self._values(graph)
        self._graph(graph)
        self._signature(module.get("signature"))
        self._module_call_graph(module.get("module_call_graph", []))
        self._namedtuples(module.get("treespec_namedtuple_fields", {}))
        self._metadata(module.get("metadata", {}), "the program's metadata")

    # ----- declared values -----------------------------------------------------------------------

    def _values(self, graph: dict[str, Any]) -> None:
        tensors = graph.get("tensor_values", {})
        if not isinstance(tensors, dict):
            _refuse("tensor_values is not a mapping")
        for name, meta in tensors.items():
            _check_name(name, "tensor")
            if not isinstance(meta, dict):
                _refuse(f"tensor {name} has no metadata")
            problem = dtype_problem(meta.get("dtype"))
            if problem:
                _refuse(f"tensor {name} {problem}")
            self.tensors[name] = self._declared_elements(meta.get("sizes"), f"tensor {name}")
            self.ranks[name] = len(meta["sizes"])
            strides = meta.get("strides")
            if not isinstance(strides, list) or len(strides) != len(meta["sizes"]):
                _refuse(f"tensor {name} has no strides for its sizes")
            for stride in strides:
                _symbolic(stride, f"a stride of tensor {name}", "as_int")
        for key, plain in (
            ("sym_int_values", "as_int"),
            ("sym_bool_values", "as_bool"),
            ("sym_float_values", "as_float"),
        ):
            values = graph.get(key, {})
            if not isinstance(values, dict):
                _refuse(f"{key} is not a mapping")
            for name, value in values.items():
                self.symbols.add(_check_name(name, "symbolic value"))
                _symbolic(value, f"symbolic value {name}", plain)
                symbol = (
                    bare_symbol(value.get("as_expr", {}).get("expr_str")) if key == "sym_int_values" else None
                )
                if symbol in self.ranges:
                    self.bounds[name] = self.ranges[symbol]
        if graph.get("custom_obj_values"):
            _refuse("the graph holds custom (pickled) objects")

    def _ranges(self, ranges: Any) -> None:
        """The declared range of each shape symbol or derived dimension (`range_constraints`: min_val /
        max_val, None for unbounded), a symbol's largest value kept where it is finite: what bounds a
        count given by the symbol (`torch.export.Dim(max=...)`; the loaded program checks every input against it)."""
        if not isinstance(ranges, dict):
            _refuse("range_constraints is not a mapping")
        for symbol, bounds in ranges.items():
            if not isinstance(symbol, str) or sympy_problem(symbol) is not None:
                _refuse(f"range_constraints names {_shown(symbol)}, which is not a shape expression")
            if not isinstance(bounds, dict) or set(bounds) - {"min_val", "max_val"}:
                _refuse(f"the range of {symbol} is not a min_val / max_val pair")
            low, high = bounds.get("min_val"), bounds.get("max_val")
            if any(v is not None and type(v) is not int for v in (low, high)):
                _refuse(f"the range of {symbol} is not made of integers")
            if low is not None and high is not None and low > high:
                _refuse(f"the range of {symbol} is empty ({low} > {high})")
            if high is not None and bare_symbol(f"Symbol({symbol!r})") == symbol:
                self.ranges[symbol] = high  # a derived dimension's range (2*s0) bounds no count here

    def _declared_elements(self, sizes: Any, what: str) -> int | None:
        if not isinstance(sizes, list):
            _refuse(f"{what} has no list of sizes")
        if len(sizes) > MAX_RANK:
            _refuse(f"{what} has {len(sizes)} dimensions (at most {MAX_RANK})")
        count: int | None = 1
        for size in sizes:
            kind, value = _union(size, f"a size of {what}")
            if kind == "as_int":
                dim = _int(value, f"a size of {what}")
            elif kind == "as_expr":
                _symbolic(size, f"a size of {what}", "as_int")
                hint = value.get("hint")
                dim = hint.get("as_int") if isinstance(hint, dict) else None
                if type(dim) is not int:
                    count = None
                    continue
            else:
                _refuse(f"a size of {what} is neither a number nor an expression")
            if dim < 0 or dim > self.budget:
                _refuse(f"{what} declares a dimension of {dim} (at most {self.budget:,} here)")
            self.largest_dim = max(self.largest_dim, dim)
            if count is not None:
                count *= dim
                if count > self.budget:
                    _refuse(f"{what} declares more than {self.budget:,} elements (the most this model's stored "
                            "tensors allow)")  # fmt: skip
        return count

    # ----- graph ---------------------------------------------------------------------------------

    def _graph(self, graph: dict[str, Any]) -> None:
        for index, argument in enumerate(graph.get("inputs", [])):
            self._argument(argument, f"graph input {index}")
        nodes = graph.get("nodes")
        if not isinstance(nodes, list):
            _refuse("the graph has no node list")
        for node in nodes:
            self._node(node)
        for index, argument in enumerate(graph.get("outputs", [])):
            self._argument(argument, f"graph output {index}")

    def _node(self, node: Any) -> None:
        if not isinstance(node, dict):
            _refuse("a node is not an object")
        target, name = node.get("target"), node.get("name")
        label = f"node {_shown(name)}" if isinstance(name, str) and name else "a node"
        if name not in (None, ""):
            _check_name(name, "node")
        problem = operator_problem(target)
        if problem:
            _refuse(f"{label} calls {_shown(target, 80)}: {problem}")
        inputs, outputs = node.get("inputs"), node.get("outputs")
        if not isinstance(inputs, list) or not isinstance(outputs, list):
            _refuse(f"{label} has no inputs or outputs")
        given: dict[str, tuple[str, Any]] = {}
        for named in inputs:
            if not isinstance(named, dict):
                _refuse(f"{label}: an argument is not an object")
            argument = named.get("name")  # matched against the schema's names, never pasted
            if not isinstance(argument, str) or not _IDENTIFIER.match(argument):
                _refuse(f"{label} has an argument named {_shown(argument)}")
            given[argument] = self._argument(named.get("arg"), f"{label} argument {argument}")
            if given[argument][0] == "as_string" and argument not in STRING_ARGUMENTS:
                _refuse(f"{label} argument {argument} is a string the operator does not take")
        problem = None if is_symbolic(target) else arguments_problem(target, given)
        if problem:
            _refuse(f"{label} ({_shown(target, 80)}) {problem}")
        self._sizes(target, given, label)
        self._dims(target, given, label)
        for index, output in enumerate(outputs):
            self._argument(output, f"{label} output {index}")
        metadata = node.get("metadata", {})
        self._metadata(metadata, label)

    def _argument(self, argument: Any, what: str) -> tuple[str, Any]:
        kind, value = _union(argument, what)
        if kind in _REFUSED_KINDS:
            _refuse(f"{what} is {_REFUSED_KINDS[kind]}")
        if kind not in _ARGUMENT_KINDS:
            _refuse(f"{what} is of unknown kind {_shown(kind)}")
        if kind in ("as_tensor", "as_optional_tensor", "as_tensors", "as_optional_tensors"):
            items = value if isinstance(value, list) else [value]
            for item in items:
                if kind.startswith("as_optional") and isinstance(item, dict) and "as_none" in item:
                    continue
                if kind.startswith("as_optional"):
                    _, item = _union(item, what)
                tensor = item.get("name") if isinstance(item, dict) else None
                _check_name(tensor, f"{what}: tensor")
                if tensor not in self.tensors:
                    _refuse(f"{what} names tensor {_shown(tensor)}, which the program does not declare")
        elif kind in (
            "as_sym_int",
            "as_sym_ints",
            "as_sym_bool",
            "as_sym_bools",
            "as_sym_float",
            "as_sym_floats",
        ):
            for item in value if isinstance(value, list) else [value]:
                inner_kind, inner = _union(item, what)
                if inner_kind == "as_name":
                    _check_name(inner, f"{what}: symbolic value")
                elif inner_kind not in ("as_int", "as_bool", "as_float"):
                    _refuse(f"{what} is not a symbolic value")
        elif kind == "as_string":
            if not isinstance(value, str) or len(value) > MAX_NAME or _CONTROL_OR_NEWLINE.search(value):
                _refuse(f"{what} is not a short one-line string")
        elif kind == "as_device":
            if not isinstance(value, dict) or value.get("type") not in _DEVICES:
                _refuse(f"{what} names a device coreopt does not run on")
        elif kind == "as_scalar_type":
            problem = dtype_problem(value)
            if problem:
                _refuse(f"{what} {problem}")
        elif kind in ("as_ints", "as_int_lists"):
            flat = (
                value
                if kind == "as_ints"
                else [v for row in value for v in row]
                if isinstance(value, list)
                else None
            )
            if not isinstance(flat, list) or any(type(v) is not int for v in flat):
                _refuse(f"{what} is not a list of integers")
        elif kind == "as_int" and type(value) is not int:
            _refuse(f"{what} is not an integer")
        return kind, value

    def _ints(self, given: tuple[str, Any]) -> list[int] | None:
        kind, value = given
        if kind == "as_ints":
            return value
        if kind == "as_sym_ints":
            values = [item.get("as_int") for item in value if isinstance(item, dict)]
            return [v for v in values if type(v) is int]
        return None

    def _sizes(self, target: str, given: dict[str, tuple[str, Any]], label: str) -> None:
        """Sizes an operator is asked to allocate, against the budget (and the largest declared
        dimension, for paddings, strides and windows)."""
        for argument, value in given.items():
            ints = self._ints(value)
            if ints is None:
                continue
            product = math.prod(max(abs(v), 1) for v in ints)
            if argument in SHAPE_ARGUMENTS and product > self.budget:
                _refuse(f"{label} ({target}) asks for a tensor of {product:,} elements (at most "
                        f"{self.budget:,} here)")  # fmt: skip
            if target in REPEATING_OPS and argument in REPEAT_ARGUMENTS:
                source = given.get("self", ("", None))[1]
                elements = self.tensors.get(source.get("name")) if isinstance(source, dict) else None
                if product * (elements or 1) > self.budget:
                    _refuse(f"{label} ({target}) repeats a tensor into more than {self.budget:,} elements")
            if argument in WINDOW_ARGUMENTS and any(abs(v) > self.largest_dim for v in ints):
                _refuse(f"{label} ({target}) asks for a {argument} larger than any dimension the program "
                        "declares")  # fmt: skip
        counted = _COUNTED_OPS.get(target)
        if counted:
            start, end, step = (
                self._scalar(given.get(a), default) for a, default in zip(counted, (0, None, 1), strict=True)
            )
            end = self._largest(given.get(counted[1])) if end is None else end
            if end is None or not step or not all(map(math.isfinite, (start, end, step))):
                _refuse(f"{label} ({target}) asks for a count it does not bound")
            if (end - start) / step > self.budget:
                _refuse(f"{label} ({target}) asks for more than {self.budget:,} elements")

    def _dims(self, target: str, given: dict[str, tuple[str, Any]], label: str) -> None:
        """Dimension arguments within the declared rank of `self` (a permutation of all of them
        for a permute)."""
        source = given.get("self", ("", None))[1]
        rank = self.ranks.get(source.get("name")) if isinstance(source, dict) else None
        if rank is None or target in REPEATING_OPS:
            return
        span = max(rank, 1) + (target in _INSERTING_OPS)  # torch wraps a scalar's dim as a vector's
        for argument, value in given.items():
            kind, raw = value
            ints = [raw] if kind == "as_int" else self._ints(value)
            if argument not in DIM_ARGUMENTS or not ints:
                continue
            if any(not -span <= d < span for d in ints):
                _refuse(
                    f"{label} ({target}) names dimensions {_shown(str(ints))} of a {rank}-dimensional tensor"
                )
            if target in _PERMUTING_OPS and sorted(d % span for d in ints) != list(range(rank)):
                _refuse(f"{label} ({target}) is not a permutation of the {rank} dimensions")

    @staticmethod
    def _scalar(value: tuple[str, Any] | None, default: float | None) -> float | None:
        if value is None:
            return default
        kind, number = value
        if (
            kind in ("as_int", "as_float")
            and isinstance(number, (int, float))
            and not isinstance(number, bool)
        ):
            return float(number)
        if kind == "as_sym_int" and isinstance(number, dict) and type(number.get("as_int")) is int:
            return float(number["as_int"])
        return None

    def _largest(self, value: tuple[str, Any] | None) -> float | None:
        """The largest value a symbolic integer argument can take (a declared symbol's range), or None."""
        if value is None or value[0] != "as_sym_int" or not isinstance(value[1], dict):
            return None
        bound = self.bounds.get(value[1].get("as_name"))  # type: ignore[arg-type]
        return None if bound is None else float(bound)

    def _metadata(self, metadata: Any, label: str) -> None:
        if not isinstance(metadata, dict):
            _refuse(f"{label} has metadata that is not a mapping")
        for key, text in metadata.items():
            if key not in _METADATA_KEYS:
                continue  # torch ignores what it does not know
            if not isinstance(text, str) or len(text) > MAX_TEXT:
                _refuse(f"{label} has {key} metadata that is not a bounded string")
            if _CONTROL.search(text) if key == "stack_trace" else _CONTROL_OR_NEWLINE.search(text):
                _refuse(f"{label} has {key} metadata holding control characters")
            if key == "custom":  # pasted into generated code's comments via str(): a bounded depth
                _embedded_json(text, f"{label}'s custom metadata")
            elif key == "source_fn_stack":
                for item in text.split(";"):
                    parts = item.split(",")
                    if len(parts) != 2 or not re.fullmatch(r"[A-Za-z_][\w.]*", parts[1]):
                        _refuse(f"{label} has a source_fn_stack entry {_shown(item)} that names no function")

    # ----- signature and module structure --------------------------------------------------------

    def _signature(self, signature: Any) -> None:
        if not isinstance(signature, dict):
            _refuse("has no graph signature")
        buffers: set[str] = set()
        inputs: set[str] = set()
        parameters: set[str] = set()
        for spec in signature.get("input_specs", []):
            kind, value = _union(spec, "an input spec")
            if not isinstance(value, dict):
                _refuse("an input spec is malformed")
            if kind == "user_input":
                kind_, arg = self._argument(value.get("arg"), "a user input")
                if kind_ == "as_tensor":
                    inputs.add(arg["name"])
            elif kind in ("parameter", "buffer", "tensor_constant"):
                self._argument({"as_tensor": value.get("arg")}, f"a {kind} input")
                path = value.get(f"{kind}_name")
                _check_path(path, kind)
                (parameters if kind == "parameter" else buffers).add(path)
            elif kind == "constant_input":
                _check_name(value.get("name"), "constant input")
                self._argument(value.get("value"), "a constant input")
            elif kind in ("custom_obj", "token"):
                _refuse(f"the signature takes a {kind.replace('_', ' ')} input, which coreopt does not run")
            else:
                _refuse(f"the signature holds an input of unknown kind {_shown(kind)}")
        for spec in signature.get("output_specs", []):
            kind, value = _union(spec, "an output spec")
            if not isinstance(value, dict):
                _refuse("an output spec is malformed")
            if kind in _TRAINING_OUTPUTS:
                _refuse("a training program (it outputs losses or gradients)")
            if kind == "token":
                _refuse("the signature returns an effect token, which coreopt does not run")
            declared = {"buffer_mutation": ("buffer_name", buffers), "parameter_mutation": ("parameter_name", parameters),
                        "user_input_mutation": ("user_input_name", inputs)}  # fmt: skip
            if kind in declared:
                field, known = declared[kind]
                if value.get(field) not in known:
                    _refuse(f"the signature mutates {_shown(value.get(field))}, which it does not take")
                self._argument({"as_tensor": value.get("arg")}, f"a {kind.replace('_', ' ')}")
            elif kind == "user_output":
                self._argument(value.get("arg"), "a user output")
            else:
                _refuse(f"the signature holds an output of unknown kind {_shown(kind)}")

    def _module_call_graph(self, entries: Any) -> None:
        if not isinstance(entries, list):
            _refuse("module_call_graph is not a list")
        for entry in entries:
            if not isinstance(entry, dict):
                _refuse("a module_call_graph entry is not an object")
            _check_path(entry.get("fqn"), "module path", empty=True)
            signature = entry.get("signature")
            if signature is None:
                continue
            if not isinstance(signature, dict):
                _refuse("a module signature is not an object")
            for name in signature.get("forward_arg_names") or []:
                _check_name(name, "forward argument")
            for key in ("inputs", "outputs"):
                for index, argument in enumerate(signature.get(key, [])):
                    _kind, value = _union(argument, f"module {key} {index}")
                    for text in _strings(value):
                        _check_name(text, f"module {key} {index}")
            for key in ("in_spec", "out_spec"):
                self._tree_spec(signature.get(key), key)

    def _tree_spec(self, text: Any, what: str) -> None:
        """A pytree spec: its container types are names, and its keys (pasted into the generated
        `forward` as dict keys) identifiers."""
        stack = [_embedded_json(text, what)]
        while stack:
            item = stack.pop()
            if isinstance(item, list):
                stack.extend(item)
            elif isinstance(item, dict):
                kind = item.get("type")
                if kind is not None and path_problem(kind):
                    _refuse(f"{what} names container type {_shown(kind)}, which is not a dotted name")
                context = item.get("context")
                if isinstance(context, str):
                    for key in _strings(_embedded_json(context, f"{what} context")):
                        _check_path(key, f"{what} key")
                stack.extend(item.get("children_spec") or [])

    def _namedtuples(self, fields: Any) -> None:
        if not isinstance(fields, dict):
            _refuse("treespec_namedtuple_fields is not a mapping")
        for name, value in fields.items():
            _check_path(name, "named tuple")
            names = value.get("field_names") if isinstance(value, dict) else None
            if not isinstance(names, list):
                _refuse(f"named tuple {_shown(name)} has no field names")
            for field in names:
                _check_name(field, f"a field of {name}")


def program_problem(document: Any, stored_elements: Iterable[int] = ()) -> str | None:
    """Why a serialized program (`models/model.json`, parsed) must not be handed to torch, as one
    line naming the node or field at fault; None when it passes every check."""
    if not isinstance(document, dict):
        return "is not a torch.export program"
    try:
        _Audit(document, size_budget(stored_elements)).run()
    except _Refused as refused:
        return str(refused)
    return None
