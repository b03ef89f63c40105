"""Python text inside a `torch.export` program, checked before torch evaluates any of it.

torch's deserializer hands every symbolic-shape string (`expr_str`) to `sympy.sympify`, which
runs it through `eval`, and `ExportedProgram.module()` `exec`s the program's guard strings. Both
are read from the file. Each string is parsed with `ast` and accepted only when it is built from
numbers, symbol names, arithmetic, comparisons and calls of a fixed set of sympy/torch shape
functions (for guards: the input shapes `L['x'].size()[i]`), so nothing it names can reach a
builtin, an import or an attribute chain.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from typing import Any

# What torch's printer (`sympy.srepr`) writes for shape expressions, and the functions the
# deserializer puts in sympify's namespace.
SYMPY_CALLS = frozenset(
    {
        "Symbol", "Dummy", "Integer", "Rational", "Float", "Add", "Mul", "Pow", "Mod", "Min", "Max",
        "Abs", "floor", "ceiling", "sqrt", "Equality", "Unequality", "StrictLessThan", "LessThan",
        "StrictGreaterThan", "GreaterThan", "Eq", "Ne", "Lt", "Le", "Gt", "Ge", "And", "Or", "Not",
        "Xor", "Piecewise", "ExprCondPair", "ITE", "FloorDiv", "ModularIndexing", "Where", "PythonMod",
        "CleanDiv", "CeilToInt", "FloorToInt", "CeilDiv", "LShift", "RShift", "PowByNatural", "FloatPow",
        "FloatTrueDiv", "IntTrueDiv", "IsNonOverlappingAndDenseIndicator", "TruncToFloat", "TruncToInt",
        "RoundToInt", "RoundDecimal", "ToFloat", "Identity", "OpaqueUnaryFn_sqrt",
    }
)  # fmt: skip
SYMPY_CONSTANTS = frozenset({"oo", "zoo", "nan", "pi", "E", "I", "true", "false", "True", "False"})
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
MAX_TEXT = 1 << 16


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


def sympy_problem(text: str) -> str | None:
    """Why `text` is not a plain sympy shape expression, or None when it is one."""
    tree = _parse(text)
    if isinstance(tree, str):
        return tree
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
    # strings may only be the first argument of Symbol/Float/...: checked per call; any other
    # string (an operand of arithmetic, say) is refused here
    called_strings = {id(call.args[0]) for call in ast.walk(tree) if isinstance(call, ast.Call) and call.args}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in called_strings:
            return f"string {node.value!r}"
    return None


def _call_problem(node: ast.Call) -> str | None:
    func = node.func
    if not isinstance(func, ast.Name) or func.id not in SYMPY_CALLS:
        return f"call of {ast.unparse(func)!r}"
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
                return f"string argument {arg.value!r} of {func.id}"
    return None


def guard_problem(text: str) -> str | None:
    """Why a guard string is more than a check of input shapes, or None."""
    tree = _parse(text)
    if isinstance(tree, str):
        return tree
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
                return f"call of {ast.unparse(node.func)!r}"
        else:
            return f"{type(node).__name__} syntax"
    return None


def _walk_json(document: Any) -> Iterator[tuple[str, Any]]:
    """(key, value) of every dict entry in a JSON document, iteratively (files can nest deep)."""
    stack = [document]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, value in item.items():
                yield key, value
                if isinstance(value, (dict, list)):
                    stack.append(value)
        elif isinstance(item, list):
            stack.extend(v for v in item if isinstance(v, (dict, list)))


def program_text_problem(document: Any) -> str | None:
    """The first symbolic expression or guard in a serialized program that is more than shape math."""
    for key, value in _walk_json(document):
        if key == "expr_str":
            problem = sympy_problem(value)
            if problem:
                return f"symbolic shape {str(value)[:80]!r} holds a {problem}"
    guards = document.get("guards_code", []) if isinstance(document, dict) else []
    if not isinstance(guards, list):
        return "guards_code is not a list"
    for guard in guards:
        problem = guard_problem(guard)
        if problem:
            return f"guard {str(guard)[:80]!r} holds a {problem}"
    return None
