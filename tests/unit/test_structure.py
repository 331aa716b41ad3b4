"""The source tree keeps its shape: no import circles between modules (imports inside functions
count), the engine's process split (engine/client never imports engine/core or runner, and
neither of those imports engine/client), no module much past 400 lines (the C++ kernels too),
every test module marked with its layer, and no `getattr`/`hasattr` probe of a model provider,
an engine client or a runner (what a caller needs is in their protocols, or declared as data:
`EngineCapabilities`)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "modelyard"
MAX_MODULE_LINES = 400
LAYERS = ("pytest.mark.unit", "pytest.mark.integration", "pytest.mark.e2e")
# Known exceptions, each to be removed by the change that fixes it.
KNOWN_LARGE: set[Path] = set()
#: (importer, imported) package pairs that must have no import between them: the engine's API
#: process side (engine/client) and its worker side (engine/core, and the runner it builds)
#: share only the wire types at engine/ top level.
FORBIDDEN_IMPORTS = (
    ("modelyard.engine.client", "modelyard.engine.core"),
    ("modelyard.engine.client", "modelyard.runner"),
    ("modelyard.engine.core", "modelyard.engine.client"),
    ("modelyard.runner", "modelyard.engine.client"),
)


#: A getattr/hasattr whose object's name matches this probes a provider, engine or runner.
PROBED = re.compile(r"provider|llm|client|runner|engine", re.IGNORECASE)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in SRC.rglob("*.py")}

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets.update(known(alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    targets.add(known(f"{node.module}.{alias.name}") or known(node.module))
        graph[name] = {t for t in targets if t is not None and t != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_import_circles() -> None:
    graph = _import_graph()
    assert "modelyard.engine.core.engine_core" in graph  # the walk found the tree
    assert _cycles(graph) == []


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _forbidden_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{importer} -> {imported}"
        for importer, targets in graph.items()
        for imported in targets
        for outer, inner in FORBIDDEN_IMPORTS
        if _inside(importer, outer) and _inside(imported, inner)
    )


def test_the_engine_sides_import_only_the_wire_types_of_each_other() -> None:
    graph = _import_graph()
    assert {"modelyard.engine.client.async_llm", "modelyard.engine.core.worker"} <= set(graph)
    assert _forbidden_imports(graph) == []


def test_forbidden_import_finder_finds_one() -> None:
    graph = {"modelyard.runner.sampler": {"modelyard.engine.client.protocol"}}
    assert _forbidden_imports(graph) == [
        "modelyard.runner.sampler -> modelyard.engine.client.protocol"
    ]


def test_cycle_finder_finds_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_modules_stay_small() -> None:
    sizes = {p.relative_to(SRC): len(p.read_text().splitlines()) for p in SRC.rglob("*.py")}
    too_large = {p: n for p, n in sizes.items() if n > MAX_MODULE_LINES and p not in KNOWN_LARGE}
    assert too_large == {}


def test_kernel_sources_stay_small_and_narrow() -> None:
    """The runner's C++ kernels (runner/csrc) keep the Python modules' limits: files of at most
    MAX_MODULE_LINES lines, lines of at most 100 characters (ruff's line length)."""
    sources = sorted((SRC / "runner" / "csrc").glob("*.[ch]*"))
    assert sources
    too_large: dict[str, int] = {}
    too_wide: list[str] = []
    for path in sources:
        lines = path.read_text().splitlines()
        if len(lines) > MAX_MODULE_LINES:
            too_large[path.name] = len(lines)
        too_wide += [f"{path.name}:{n}" for n, line in enumerate(lines, 1) if len(line) > 100]
    assert too_large == {}
    assert too_wide == []


def test_every_test_module_has_a_layer_marker() -> None:
    unmarked = [
        path.relative_to(ROOT)
        for path in (ROOT / "tests").rglob("test_*.py")
        if not any(layer in path.read_text() for layer in LAYERS)
    ]
    assert unmarked == []


def _probes(source: str) -> list[str]:
    """`getattr(x, ...)`/`hasattr(x, ...)` calls whose object `x` (a name, or the last
    attribute of a dotted one) names a provider, an engine client or a runner."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        if node.func.id not in ("getattr", "hasattr") or not node.args:
            continue
        target = node.args[0]
        name = target.id if isinstance(target, ast.Name) else getattr(target, "attr", "")
        if PROBED.search(name):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_probe_of_providers_engines_or_runners() -> None:
    probes = [
        f"{path.relative_to(SRC.parent)}:{probe}"
        for path in sorted(SRC.rglob("*.py"))
        for probe in _probes(path.read_text())
    ]
    assert probes == []


def test_probe_finder_finds_one() -> None:
    source = (
        "a = getattr(provider, 'state', None)\nb = hasattr(self.runner, 'x')\nc = getattr(x, 'y')"
    )
    assert [p.split(":")[0] for p in _probes(source)] == ["1", "2"]


#: Where no module may read or write the environment: the config layer reads it and passes the
#: values down (the worker's child environment is set up by transport/ and the config layer).
NO_ENV_ZONES = ("runner", "engine/core", "sources.py")
#: What reads or writes the process environment: `os.environ[...]` (read, assignment, `del`,
#: `.get` / `.setdefault` / `.update` / `.pop`), `os.getenv`, `os.putenv`, `os.unsetenv`.
_ENV_NAMES = ("environ", "environb", "getenv", "getenvb", "putenv", "unsetenv")


def _env_uses(path: Path) -> list[int]:
    """Lines that read or write the environment in one module: `os.<name>` for `_ENV_NAMES`
    (`os` under any alias), and those names imported from `os`."""
    tree = ast.parse(path.read_text())
    aliases = {"os"} | {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
        if alias.name == "os"
    }
    lines = {
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in aliases
        and node.attr in _ENV_NAMES
    }
    lines |= {
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        and node.module == "os"
        and any(alias.name in _ENV_NAMES for alias in node.names)
    }
    return sorted(lines)


def test_no_environment_reads_or_writes_below_the_config_layer() -> None:
    paths = [p for zone in NO_ENV_ZONES for p in sorted(SRC.glob(f"{zone}/**/*.py"))]
    paths += [SRC / zone for zone in NO_ENV_ZONES if zone.endswith(".py")]
    found = {f"{path.relative_to(SRC)}:{line}" for path in paths for line in _env_uses(path)}
    assert paths
    assert found == set()


def test_environment_finder_finds_reads_and_writes(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "import os\nimport os as system\nfrom os import putenv\n"
        "A = os.environ.get('X')\nB = os.getenv('Y')\n"
        "os.environ['PATH'] = 'bin'\nsystem.environ.update(Z='1')\nos.unsetenv('Z')\n"
        "C = os.path.join('a', 'b')\n"
    )
    assert _env_uses(module) == [3, 4, 5, 6, 7, 8]
