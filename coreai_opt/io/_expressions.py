"""Python text inside a `torch.export` program, checked before torch evaluates any of it.

torch's deserializer hands every symbolic-shape string (`expr_str`) to `sympy.sympify`, which
runs it through `eval`, and `ExportedProgram.module()` `exec`s the program's guard strings. Both
are read from the file. Each string is parsed (`ast`, text of bounded length) and accepted only
when it is built from numbers, symbol names, arithmetic, comparisons and calls of a fixed set of
sympy/torch shape functions (for guards: the input shapes `L['x'].size()[i]`), so nothing it names
can reach a builtin, an import or an attribute chain.

The grammar also bounds what evaluating the text can cost: its nesting depth, and the size of
every value it can compute (a bound on each subexpression's magnitude, in bits, derived bottom-up
with symbols taken as large as any tensor size; a power needs a small constant exponent). Sympy
would otherwise spend forever on `9**9**9` or `Float('1e999999999')`. Every walk is iterative: a
deep expression is refused, never a RecursionError.
"""

from __future__ import annotations

import ast
import functools
import math
import re
from collections.abc import Callable, Iterator
from typing import Any

# What torch's printer (`sympy.srepr`) writes for shape expressions, and the functions the
# deserializer puts in sympify's namespace.
SYMPY_CALLS = frozenset(
    {
        "Symbol", "Dummy", "Integer", "Rational", "Float", "Add", "Mul", "Pow", "Mod", "Min", "Max",
        "Abs", "floor", "ceiling", "sqrt", "Equality", "Unequality", "StrictLessThan", "LessThan",
        "StrictGreaterThan", "GreaterThan", "Eq", "Ne", "Lt", "Le", "Gt", "Ge", "And", "Or", "Not",
        "Xor", "FloorDiv", "ModularIndexing", "PythonMod",
        "CleanDiv", "CeilToInt", "FloorToInt", "CeilDiv", "LShift", "RShift", "PowByNatural", "FloatPow",
        "FloatTrueDiv", "IntTrueDiv", "IsNonOverlappingAndDenseIndicator", "TruncToFloat", "TruncToInt",
        "RoundToInt", "RoundDecimal", "ToFloat", "Identity", "OpaqueUnaryFn_sqrt",
    }
)  # fmt: skip
# No `zoo` (complex infinity), `I` or `nan`: no size is complex or undefined. No `Piecewise`,
# `ITE` or `Where` above: a size chosen by a condition is nothing export writes, and torch's shape
# environment fails on one with an assertion.
SYMPY_CONSTANTS = frozenset({"oo", "pi", "E", "true", "false", "True", "False"})
# Calls that divide by their second argument, and the operators that do.
_DIVIDING_CALLS = frozenset(
    {"FloorDiv", "Mod", "PythonMod", "CleanDiv", "CeilDiv", "IntTrueDiv", "FloatTrueDiv", "ModularIndexing"}
)
_DIVIDING_OPERATORS = (ast.Div, ast.FloorDiv, ast.Mod)
_SYMBOL = re.compile(r"[a-z]+[0-9]+\Z")  # torch's shape symbols: s0, u3, zuf1, ...
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?\Z|[-+]?(?:inf|nan)\Z", re.IGNORECASE)
_STRING_ARGUMENT = {"Symbol": _IDENTIFIER, "Dummy": _IDENTIFIER, "Float": _NUMBER, "Integer": _NUMBER}

# Guards: `L['x'].size()[0] == 2 * L['y'].size()[0]` and `math.isnan(L['z'])`.
GUARD_NAMES = frozenset({"L", "math", "Max", "Min", "Eq", "Ne", "Mod", "FloorDiv", "inf"})
GUARD_ATTRIBUTES = frozenset(
    {"size", "stride", "storage_offset", "dim", "numel", "isnan", "inf", "floor", "ceil"}
)

_OPERATORS = (
    ast.operator, ast.unaryop, ast.boolop, ast.cmpop, ast.expr_context,
)  # fmt: skip
_PLAIN = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.Tuple, ast.List, ast.keyword)
MAX_TEXT = 4096  # torch writes a few hundred characters for the deepest derived dimension
MAX_DEPTH = 48  # nesting of the syntax tree
MAX_BITS = 1024  # no subexpression may be able to reach 2**1024 in magnitude
MAX_EXPONENT = 64  # a power's exponent: a constant integer no larger than this
SYMBOL_BITS = 63  # a shape symbol stands for a size below 2**63
_NUMBER_DIGITS = 40  # a numeric literal's length (int64 and float64 need fewer)


def _parse(text: str) -> ast.Expression | str:
    if not isinstance(text, str):
        return "not a string"
    if len(text) > MAX_TEXT:
        return "longer than any shape expression"
    try:
        return ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return "not a Python expression"


def _constant_ok(node: ast.Constant) -> bool:
    return isinstance(node.value, (int, float, bool)) or node.value is None


def _called_name(node: ast.Call) -> str:
    """What a call calls, said briefly without unparsing the (possibly deep) callee."""
    func = node.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return f"….{func.attr}"
    return type(func).__name__


def _depth_problem(tree: ast.AST) -> str | None:
    stack: list[tuple[ast.AST, int]] = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            return f"nesting deeper than {MAX_DEPTH} levels"
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return None


def _post_order(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node after its children, iteratively."""
    stack: list[tuple[ast.AST, bool]] = [(tree, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            yield node
            continue
        stack.append((node, True))
        stack.extend((child, False) for child in reversed(list(ast.iter_child_nodes(node))))


def _literal_bits(value: Any) -> float | str:
    """Bits of magnitude of a numeric literal (an int, a float, or the string sympy is given)."""
    if isinstance(value, str):
        if len(value) > _NUMBER_DIGITS:
            return f"numeric literal of {len(value)} characters"
        try:
            number = float(value)
        except ValueError:
            return f"numeric literal {value!r}"
        if not math.isfinite(number) and value.strip("+-").lower() not in ("inf", "nan", "infinity"):
            return f"numeric literal {value!r} beyond float64"
        value = number
    if isinstance(value, bool) or value is None:
        return 1.0
    if isinstance(value, int):
        return float(value.bit_length())
    if isinstance(value, float):
        if not math.isfinite(value):
            return 1.0  # sympy's oo / nan: no digits to compute
        return max(math.log2(abs(value)), 0.0) + 1.0 if value else 1.0
    return f"literal {type(value).__name__}"


def _exponent(node: ast.AST) -> int | None:
    """A power's exponent if it is a small integer constant (`2`, `-1`, `Integer(2)`), else None."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _exponent(node.operand) if isinstance(node.operand, (ast.Constant, ast.Call)) else None
        return None if inner is None else -inner
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Integer":
        node = node.args[0] if len(node.args) == 1 else node
    if isinstance(node, ast.Constant) and type(node.value) is int and abs(node.value) <= MAX_EXPONENT:
        return node.value
    return None


def _bits_problem(tree: ast.AST, leaf_bits: Callable[[ast.AST], float | None]) -> str | None:
    """Derive a bound on the magnitude of every subexpression (in bits), bottom-up.

    Sums and maxima add a bit, products add their factors' bits, powers multiply their base's bits
    by the constant exponent; anything else (calls of shape functions, comparisons, subscripts)
    is bounded by its largest operand plus one bit. `leaf_bits` bounds names and attributes.
    """
    bits: dict[int, float] = {}
    for node in _post_order(tree):
        children = [bits[id(child)] for child in ast.iter_child_nodes(node) if id(child) in bits]
        if isinstance(node, ast.Constant):
            found = _literal_bits(node.value) if not isinstance(node.value, str) else 0.0
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("Integer", "Float")
        ):
            argument = node.args[0] if node.args else None
            found = (
                _literal_bits(argument.value)
                if isinstance(argument, ast.Constant)
                else max(children, default=1.0)
            )
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("Symbol", "Dummy")
        ):
            found = float(SYMBOL_BITS)
        elif (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow)) or (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in ("Pow", "PowByNatural", "FloatPow") and len(node.args) == 2
        ):  # fmt: skip
            base, power = (node.left, node.right) if isinstance(node, ast.BinOp) else node.args
            exponent = _exponent(power)
            if exponent is None:
                return "power whose exponent is not a small integer constant"
            found = bits[id(base)] * max(abs(exponent), 1)
        elif (isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.LShift))) or (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("Mul", "LShift")
        ):  # fmt: skip
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.LShift):
                shift = _exponent(node.right)
                if shift is None or shift < 0:
                    return "shift by more than a small constant"
                found = bits[id(node.left)] + shift
            else:
                found = sum(children) if children else 1.0
        elif isinstance(node, (ast.Name, ast.Attribute)):
            leaf = leaf_bits(node)
            found = max(children, default=0.0) if leaf is None else leaf
        else:
            found = max(children, default=0.0) + 1.0
        if isinstance(found, str):
            return found
        if found > MAX_BITS:
            return f"value that can exceed 2**{MAX_BITS}"
        bits[id(node)] = found
    return None


def _sympy_leaf_bits(node: ast.AST) -> float | None:
    if isinstance(node, ast.Name):
        return float(SYMBOL_BITS) if _SYMBOL.match(node.id) else 0.0
    return None


def bare_symbol(text: Any) -> str | None:
    """The name of the one shape symbol `text` is (`Symbol('s3', positive=True, integer=True)`), or
    None when it is anything else."""
    tree = _parse(text)
    if isinstance(tree, str):
        return None
    call = tree.body
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "Symbol"):
        return None
    first = call.args[0] if call.args else None
    if isinstance(first, ast.Constant) and isinstance(first.value, str) and _SYMBOL.match(first.value):
        return first.value
    return None


def sympy_problem(text: str) -> str | None:
    """Why `text` is not a plain sympy shape expression, or None when it is one."""
    if isinstance(text, str) and len(text) <= MAX_TEXT:
        return _sympy_problem(text)
    return str(_parse(text))  # not a string, or longer than any: refused before parsing


@functools.lru_cache(maxsize=1024)
def _sympy_problem(text: str) -> str | None:
    """sympy_problem of a string of bounded length, remembered: a program repeats a few
    expressions hundreds of times (a stateful decoder's model.json: 299 strings, 7 distinct)."""
    tree = _parse(text)
    if isinstance(tree, str):
        return tree
    problem = _depth_problem(tree)
    if problem:
        return problem
    for node in ast.walk(tree):
        if isinstance(node, (*_PLAIN, *_OPERATORS)):
            continue
        if isinstance(node, ast.Constant):
            if not _constant_ok(node) and not isinstance(node.value, str):
                return f"constant {node.value!r}"
            continue
        if isinstance(node, ast.Name):
            if not (node.id in SYMPY_CALLS or node.id in SYMPY_CONSTANTS or _SYMBOL.match(node.id)):
                return f"name {node.id!r}"
            continue
        if isinstance(node, ast.Call):
            problem = _call_problem(node)
            if problem:
                return problem
            continue
        return f"{type(node).__name__} syntax"
    problem = _zero_divisor(tree)
    if problem:
        return problem
    # strings may only be the first argument of Symbol/Float/...: checked per call; any other
    # string (an operand of arithmetic, say) is refused here
    called_strings = {id(call.args[0]) for call in ast.walk(tree) if isinstance(call, ast.Call) and call.args}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in called_strings:
            return f"string {node.value!r}"
    return _bits_problem(tree, _sympy_leaf_bits)


def _is_zero(node: ast.AST) -> bool:
    """A literal zero: `0`, `0.0`, `Integer(0)`, `Float('0')`."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("Integer", "Float")
    ):
        node = node.args[0] if len(node.args) == 1 else node
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str)):
        try:
            return float(node.value) == 0.0
        except ValueError:
            return False
    return False


def _zero_divisor(tree: ast.AST) -> str | None:
    """A division by a literal zero: sympy makes it complex infinity (or raises), which no size is."""
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, _DIVIDING_OPERATORS) and _is_zero(node.right):
            return "division by zero"
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _DIVIDING_CALLS
            and len(node.args) >= 2
            and _is_zero(node.args[1])
        ):
            return "division by zero"
    return None


def _call_problem(node: ast.Call) -> str | None:
    func = node.func
    if not isinstance(func, ast.Name) or func.id not in SYMPY_CALLS:
        return f"call of {_called_name(node)!r}"
    for keyword in node.keywords:
        if keyword.arg is None or not isinstance(keyword.value, ast.Constant):
            return f"keyword argument of {func.id}"
        if not _constant_ok(keyword.value):
            return f"keyword value of {func.id}"
    for index, arg in enumerate(node.args):
        if isinstance(arg, ast.Starred):
            return f"starred argument of {func.id}"
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            pattern = _STRING_ARGUMENT.get(func.id)
            if index != 0 or pattern is None or not pattern.match(arg.value):
                return f"string argument {arg.value[:40]!r} of {func.id}"
    return None


def _guard_leaf_bits(node: ast.AST) -> float | None:
    if isinstance(node, ast.Name) and node.id == "inf":
        return 1.0
    return float(SYMBOL_BITS)  # an input's size, stride, ...


def guard_problem(text: str) -> str | None:
    """Why a guard string is more than a check of input shapes, or None."""
    tree = _parse(text)
    if isinstance(tree, str):
        return tree
    problem = _depth_problem(tree)
    if problem:
        return problem
    for node in ast.walk(tree):
        if isinstance(node, (*_PLAIN, *_OPERATORS, ast.Subscript, ast.Slice)):
            continue
        if isinstance(node, ast.Constant):
            if not (_constant_ok(node) or isinstance(node.value, str)):
                return f"constant {node.value!r}"
        elif isinstance(node, ast.Name):
            if node.id not in GUARD_NAMES:
                return f"name {node.id!r}"
        elif isinstance(node, ast.Attribute):
            if node.attr not in GUARD_ATTRIBUTES:
                return f"attribute {node.attr!r}"
        elif isinstance(node, ast.Call):
            if node.keywords or not isinstance(node.func, (ast.Name, ast.Attribute)):
                return f"call of {_called_name(node)!r}"
        else:
            return f"{type(node).__name__} syntax"
    return _bits_problem(tree, _guard_leaf_bits)


def guards_problem(document: Any) -> str | None:
    """The first guard of a serialized program that is more than a check of input shapes (the
    shape expressions are checked where torch reads them: `_program_audit`)."""
    guards = document.get("guards_code", []) if isinstance(document, dict) else []
    if not isinstance(guards, list):
        return "guards_code is not a list"
    for guard in guards:
        problem = guard_problem(guard)
        if problem:
            return f"guard {str(guard)[:80]!r} holds a {problem}"
    return None
