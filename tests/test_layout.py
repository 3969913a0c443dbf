"""The package layout holds (docs/ARCHITECTURE.md, "Packages"): imports only go down the layers,
no module cycles, scripts never import scripts, and files and functions stay within their sizes."""
import ast
from pathlib import Path

import pytest

from utils.core.config import ROOT

# lowest first: a package may import its own modules and the packages before it, never one after it
LAYERS = ("core", "agent", "reward", "data", "train", "eval", "deploy", "tinyarith", "run")
SCRIPT_LINES, FILE_LINES, FUNCTION_LINES = 150, 400, 60


def _python_files():
    return sorted(p for p in ROOT.rglob("*.py") if not {".venv", "outputs", ".git"} & set(p.relative_to(ROOT).parts))


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1]  # utils.<package>[.module] or utils.run.driver


def _all_imports(path: Path) -> set[str]:
    """Every module `path` imports by absolute name, at any depth (function-level imports count too)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
    return out


def _imports(path: Path) -> set[str]:
    """Every utils.* module `path` imports."""
    return {m for m in _all_imports(path) if m.startswith("utils.")}


def _modules() -> dict[str, Path]:
    return {".".join(p.relative_to(ROOT).with_suffix("").parts): p
            for p in (ROOT / "utils").rglob("*.py") if p.name != "__init__.py"}


def test_every_library_package_has_a_layer():
    assert {_package(m) for m in _modules()} == set(LAYERS)


def test_imports_only_go_down_the_layers():
    upward = []
    for module, path in _modules().items():
        rank = LAYERS.index(_package(module))
        for target in _imports(path):
            if LAYERS.index(_package(target)) > rank:
                upward.append(f"{module} imports {target}")
    assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(sorted(upward))


def test_no_import_cycles():
    graph = {m: {t for t in _imports(p) if t in _modules() and t != m} for m, p in _modules().items()}
    state: dict[str, int] = {}

    def visit(m, stack):
        if state.get(m) == 1:
            raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(m):] + [m]))
        if state.get(m) == 2:
            return
        state[m] = 1
        for t in sorted(graph[m]):
            visit(t, stack + [m])
        state[m] = 2

    for m in sorted(graph):
        visit(m, [])


def test_the_layout_check_catches_an_upward_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from utils.eval.compare import fmt\n")
    assert "utils.eval.compare" in _imports(bad)
    assert LAYERS.index(_package("utils.eval.compare")) > LAYERS.index("train")


def test_scripts_do_not_import_scripts():
    for script in sorted(ROOT.glob("[0-9][0-9]_*.py")):
        text = script.read_text()
        assert "import_module" not in text and "importlib" not in text, f"{script.name} loads another script"


def _top_modules(path: Path) -> set[str]:
    """The first component of every module `path` imports."""
    return {m.split(".")[0] for m in _all_imports(path)}


def test_benchmarks_and_the_library_never_import_tests():
    tests_modules = {"tests", "conftest", *(p.stem for p in (ROOT / "tests").glob("*.py"))}
    users = sorted([*(ROOT / "benchmarks").glob("*.py"), *(ROOT / "utils").rglob("*.py"), *ROOT.glob("[0-9][0-9]_*.py")])
    offenders = [f"{p.relative_to(ROOT)} imports {sorted(_top_modules(p) & tests_modules)}"
                 for p in users if _top_modules(p) & tests_modules]
    assert not offenders, offenders


def test_no_test_module_imports_another():
    """What two test modules share lives in tests/helpers.py (functions, settings) or conftest.py
    (fixtures): a test module imported by another runs its import-time code twice and couples
    two files' private names."""
    test_modules = {p.stem for p in (ROOT / "tests").glob("test_*.py")} | {"tests"}
    offenders = [f"{p.name} imports {sorted(_top_modules(p) & test_modules)}"
                 for p in sorted((ROOT / "tests").glob("*.py")) if _top_modules(p) & test_modules]
    assert not offenders, offenders


@pytest.mark.parametrize("path", _python_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_sizes(path):
    lines = path.read_text().splitlines()
    limit = SCRIPT_LINES if path.parent == ROOT and path.name[:2].isdigit() else FILE_LINES
    assert len(lines) <= limit, f"{path.name}: {len(lines)} lines (limit {limit})"
    long = [f"{n.name} ({n.end_lineno - n.lineno + 1} lines)" for n in ast.walk(ast.parse("\n".join(lines)))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > FUNCTION_LINES]
    assert not long, f"{path.name}: functions over {FUNCTION_LINES} lines: {', '.join(long)}"


def test_docs_cite_only_files_in_the_repository():
    import re

    missing = []
    texts = [*ROOT.glob("*.md"), *(ROOT / "docs").glob("*.md"), *ROOT.glob("*.sh"), *(ROOT / "configs").rglob("*.yaml")]
    for path in _python_files() + sorted(texts):
        for cited in re.findall(r"(?<![\w/.])((?:docs|utils|tests|benchmarks|configs)/[\w/.-]+\.(?:py|md|yaml))",
                                path.read_text()):
            if not (ROOT / cited).exists():
                missing.append(f"{path.relative_to(ROOT)} cites {cited}")
    assert not missing, "\n".join(missing)
    outside = [p.name for p in _python_files() if p != Path(__file__) and "DESIGN.md" in p.read_text()]
    assert not outside, f"cite a design doc outside the repository: {outside}"
