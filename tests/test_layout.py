"""The layout says what the code does: one Core AI boundary, one numeric core."""

from __future__ import annotations

import ast
import re
import tokenize
from pathlib import Path

from conftest import ROOT

PRODUCT = [p for package in ("coreai_opt", "cli", "tcast") for p in sorted((ROOT / package).rglob("*.py"))]
BOUNDARY = ROOT / "coreai_opt" / "_coreai"
# attributes of coreai-core objects that are not its public API
CORE_PRIVATES = {
    "_module",
    "_mlir_module",
    "_mlir_context",
    "_model_asset",
    "_program_bytecode_path",
    "_mlir_libs",
}


def _outside_boundary() -> list[Path]:
    return [p for p in PRODUCT if BOUNDARY not in p.parents]


def test_only_the_coreai_package_touches_coreai_core_internals() -> None:
    offenders = []
    for path in _outside_boundary():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(name == "coreai._compiler" or name.startswith("coreai._compiler.") for name in names):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {names[0]}")
            if isinstance(node, ast.Attribute) and node.attr in CORE_PRIVATES:
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} reaches .{node.attr}")
    assert offenders == []


def test_the_boundary_test_would_catch_an_offender(tmp_path: Path) -> None:
    """The scan above finds what it looks for (it cannot pass by finding nothing)."""
    source = "from coreai._compiler import ir\nx = program._module._mlir_module\n"
    tree = ast.parse(source)
    imports = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "coreai._compiler"]
    reaches = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr in CORE_PRIVATES]
    assert len(imports) == 1 and len(reaches) == 2


def test_coreai_opt_encodes_no_element_format_itself() -> None:
    """tcast owns every element format and scale rule: coreai_opt holds no exponent limits, no
    power-of-two scale formulas and no code tables of its own."""
    pattern = re.compile(r"\bemax\b|\be2m1|\bfrexp\b|\bldexp\b|\bfloat8_e\w+|\bfloat4_e\w+|\bml_dtypes\b")
    offenders = []
    table = ROOT / "coreai_opt" / "_elements.py"  # the one table of element types: names them all
    for path in (p for p in (ROOT / "coreai_opt").rglob("*.py") if p != table):
        for number, code in _code_lines(path).items():
            if pattern.search(code):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {code}")
    assert offenders == []


def _code_lines(path: Path) -> dict[int, str]:
    """Each line's code, strings and comments left out (docstrings may name what tcast does)."""
    lines: dict[int, list[str]] = {}
    with path.open("rb") as handle:
        for token in tokenize.tokenize(handle.readline):
            if token.type in (
                tokenize.STRING,
                tokenize.COMMENT,
                tokenize.ENCODING,
                tokenize.NL,
                tokenize.NEWLINE,
            ):
                continue
            lines.setdefault(token.start[0], []).append(token.string)
    return {number: " ".join(parts) for number, parts in lines.items()}


def _imported_modules(path: Path) -> set[str]:
    """Every module of ours a file imports, at module level or inside a function, absolute or
    relative (a lazy import is a dependency all the same)."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    if path.name == "__init__.py":
        package = package.rsplit(".", 1)[0] + ".__init__"
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: -node.level]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return {m for m in found if m.split(".")[0] in ("coreai_opt", "cli", "tcast")}


def _folder(module: str) -> str:
    """The folder a module belongs to: `coreai_opt.compression._driver` -> `coreai_opt.compression`;
    a top-level module of a package is a folder of its own (`coreai_opt._elements`)."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else parts[0]


def _folder_graph() -> dict[str, set[str]]:
    known = {_folder(".".join(p.relative_to(ROOT).with_suffix("").parts)) for p in PRODUCT}
    graph: dict[str, set[str]] = {}
    for path in PRODUCT:
        source = _folder(".".join(path.relative_to(ROOT).with_suffix("").parts))
        for module in _imported_modules(path):
            target = _folder(module)
            if target in known and target != source and target.count(".") >= 1:
                graph.setdefault(source, set()).add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Pairs of folders each of which reaches the other."""

    def reach(start: str) -> set[str]:
        seen, stack = set(), [start]
        while stack:
            for nxt in graph.get(stack.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        return seen

    closure = {folder: reach(folder) for folder in graph}
    return sorted((a, b) for a in closure for b in closure[a] if a < b and a in closure.get(b, set()))


def test_no_folder_imports_one_that_imports_it_back() -> None:
    assert [pair for pair in _cycles(_folder_graph()) if not pair[0].startswith("tcast")] == []


def test_the_cycle_check_finds_a_cycle() -> None:
    assert _cycles({"a.x": {"a.y"}, "a.y": {"a.z"}, "a.z": {"a.x"}, "a.w": {"a.x"}}) == [
        ("a.x", "a.y"), ("a.x", "a.z"), ("a.y", "a.z"),
    ]  # fmt: skip


MAX_FUNCTION_LINES = 60


def _long_functions(paths: list[Path]) -> list[str]:
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_no_function_in_the_product_is_over_the_limit() -> None:
    assert _long_functions(PRODUCT) == []


def _runtime_imports(path: Path, name: str) -> set[str]:
    """The modules a file imports when it runs (imports under `if TYPE_CHECKING:` left out)."""
    tree = ast.parse(path.read_text())
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING"
        for inner in ast.walk(node)
    }
    found = set()
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(tree):
        if id(node) in typing_only or not isinstance(node, ast.ImportFrom):
            continue
        base = package[: len(package) - node.level + 1] if node.level else []
        module = ".".join([*base, node.module]) if node.module else ".".join(base)
        found.add(module)
        found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def test_no_tcast_module_imports_one_that_imports_it_back() -> None:
    """tcast's modules form no circle: the rounding primitives and scale rules (`_primitives`) sit
    below both engines, `number()` above NumberSpec and Codebook; only the `tcast` facade, which
    dispatches to the engines, imports them (and nothing imports it back but the CLI helpers)."""
    files = {
        ".".join(p.relative_to(ROOT).with_suffix("").parts): p for p in sorted((ROOT / "tcast").rglob("*.py"))
    }
    names = {name.removesuffix(".__init__"): path for name, path in files.items()}
    graph = {
        name: {m for m in _runtime_imports(path, name) if m in names and m != name}
        for name, path in names.items()
        if name != "tcast"
    }
    assert _cycles(graph) == []


def _modules() -> dict[str, Path]:
    """Every module of the product by its dotted name (a package by its own name)."""
    names = {}
    for path in PRODUCT:
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def _imports_of(name: str, path: Path) -> list[tuple[str, str | None, int]]:
    """(module, name imported from it or None, line) for each runtime import of ours in a file:
    at module level or inside a function, never under `if TYPE_CHECKING:`."""
    tree = ast.parse(path.read_text())
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING"
        for inner in ast.walk(node)
    }
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: list[tuple[str, str | None, int]] = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found.extend((alias.name, None, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, node.module] if node.module else base)
            found.extend((module, alias.name, node.lineno) for alias in node.names)
    return [(m, n, line) for m, n, line in found if m.split(".")[0] in ("coreai_opt", "cli", "tcast")]


def _target(module: str, imported: str | None, modules: dict[str, Path]) -> str:
    """The file an import reaches: `from pkg import sub` reaches the module `pkg.sub`."""
    if imported is not None and f"{module}.{imported}" in modules:
        return f"{module}.{imported}"
    return module


def _private_imports(modules: dict[str, Path]) -> list[str]:
    """Imports of another folder's private module or private name (`coreai_opt.weights._decode`,
    `from coreai_opt.io import _zip`): a folder is used through its package's names. A
    top-level `_module` of a package (`coreai_opt._elements`) is a folder of its own to that package,
    but another package (the CLI) uses only public names."""
    found = []
    for name, path in modules.items():
        for module, imported, line in _imports_of(name, path):
            target = _target(module, imported, modules)
            if _folder(target) == _folder(name):
                continue
            if target.split(".")[0] != name.split(".")[0]:  # another package: every part public
                inside = target.split(".")[1:]
            else:
                inside = target.split(".")[_folder(target).count(".") + 1 :]
            named = [imported] if imported is not None and target == module else []
            if any(part.startswith("_") and not part.startswith("__") for part in inside + named):
                found.append(f"{name}:{line} imports {'.'.join([target, *named])}")
    return found


def test_no_folder_imports_another_folders_private_module() -> None:
    assert _private_imports(_modules()) == []


def test_the_private_import_check_would_catch_an_offender(tmp_path: Path) -> None:
    """The scan finds what it looks for (it cannot pass by finding nothing)."""
    (tmp_path / "x.py").write_text(
        "from coreai_opt.weights._decode import lut_to_dense\nfrom coreai_opt.weights import decode, _decode\n"
        "from coreai_opt.io import load_pt2\nfrom . import _y\nfrom coreai_opt._elements import element\n"
    )
    (tmp_path / "z.py").write_text(
        "from coreai_opt._elements import element\nfrom coreai_opt.io import load_pt2\n"
    )
    modules = {"coreai_opt.comparison._x": tmp_path / "x.py", "cli.commands._z": tmp_path / "z.py"} | {
        name: tmp_path / "empty.py" for name in ("coreai_opt.weights", "coreai_opt.weights._decode", "coreai_opt.io",
                                                 "coreai_opt.comparison._y", "coreai_opt._elements")
    }  # fmt: skip
    (tmp_path / "empty.py").write_text("")
    assert _private_imports(modules) == [  # the library's own top-level `_elements` is fine, the CLI's is not
        "coreai_opt.comparison._x:1 imports coreai_opt.weights._decode.lut_to_dense",
        "coreai_opt.comparison._x:2 imports coreai_opt.weights._decode",
        "cli.commands._z:1 imports coreai_opt._elements.element",
    ]


def _file_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {
        name: {t for m, n, _ in _imports_of(name, path) if (t := _target(m, n, modules)) in modules} - {name}
        for name, path in modules.items()
    }


def test_no_file_imports_one_that_imports_it_back() -> None:
    """Runtime imports, lazy ones inside functions included, form no circle between any two files
    of coreai_opt, cli and tcast (a package's `__init__` is a file like any other)."""
    assert _cycles(_file_graph()) == []
