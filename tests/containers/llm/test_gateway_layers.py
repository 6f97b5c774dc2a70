"""The gateway's layers, read from its imports: no import runs back up (issue 41).

From the bottom: the settings (and the package's version), the engine interface and its
adapters (``engines/``), admission and the start cache (over the engines), the runtime's parts
at the top of the package (breaker, lifecycle, routing, supervisor ...), the HTTP layer
(``api/``: routes, protocol, errors, edge, serving handler), and last the wiring (``app.py``) and
the process (``main.py``). A module imports only its own unit or a unit below it; the units are
the folders, and the top-level modules of the runtime's layer, which may import each other
without a cycle. Lazy and type-only imports count: a cycle hidden inside a function is still a
cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

GATEWAY = Path(__file__).resolve().parents[3] / "containers" / "llm" / "gateway"

LAYERS: tuple[tuple[str, ...], ...] = (
    ("gateway", "gateway.settings"),
    ("gateway.engines",),
    ("gateway.admission", "gateway.start_cache"),
    ("gateway.*",),
    ("gateway.api",),
    ("gateway.app",),
    ("gateway.main",),
)
"""Bottom first. ``gateway.*`` is every top-level module not named elsewhere."""


def module_names() -> dict[str, Path]:
    names = {}
    for path in sorted(GATEWAY.rglob("*.py")):
        parts = path.relative_to(GATEWAY.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def gateway_imports(path: Path, known: set[str]) -> set[str]:
    """The gateway modules ``path`` imports, anywhere in it (functions, TYPE_CHECKING too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found & known


def unit(module: str) -> str:
    """The folder a module belongs to: ``gateway.<folder>``, or for a top-level module the
    runtime's layer (``gateway.*``) or its own name when :data:`LAYERS` names it."""
    named = {name for names in LAYERS for name in names}
    if module in named:
        return module
    folder = ".".join(module.split(".")[:2])
    return folder if folder in named else "gateway.*"


def layer(module: str) -> int:
    return next(index for index, names in enumerate(LAYERS) if unit(module) in names)


def test_the_layers_cover_every_folder_of_the_gateway() -> None:
    folders = {f"gateway.{path.name}" for path in GATEWAY.iterdir()
               if (path / "__init__.py").exists()}
    named = {name for names in LAYERS for name in names}
    assert folders and folders <= named, f"give {sorted(folders - named)} a layer"


def test_no_import_runs_back_up() -> None:
    names = module_names()
    assert len(names) > 30, "not vacuous"
    upward = sorted(f"{module} imports {target}" for module, path in names.items()
                    for target in gateway_imports(path, set(names))
                    if unit(target) != unit(module) and layer(target) >= layer(module)
                    and target != "gateway")
    assert upward == [], f"imports that run sideways or back up: {upward}"


def test_the_http_layer_is_one_package() -> None:
    """Routes, protocol models, errors and the body-size edge live in gateway/api/ only."""
    top = sorted(path.stem for path in GATEWAY.glob("*.py"))
    gone = {"api_schema", "openai_fields", "request_errors", "http_edge", "responses",
            "chat_types", "service"}
    assert not gone & set(top), f"HTTP modules outside gateway/api/: {sorted(gone & set(top))}"
    app = (GATEWAY / "app.py").read_text(encoding="utf-8")
    assert "@app." not in app and "add_api_route" not in app, "app.py only wires: no routes"


def test_no_module_cycle() -> None:
    names = module_names()
    graph = {module: gateway_imports(path, set(names)) - {module, "gateway"}
             for module, path in names.items()}
    # A package's __init__ re-exports its modules: its edges into its own folder are not cycles.
    graph = {module: {target for target in targets if not target.startswith(module + ".")}
             for module, targets in graph.items()}
    state: dict[str, int] = {}
    cycles: list[str] = []

    def visit(module: str, trail: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycles.append(" -> ".join([*trail[trail.index(target):], target]))
            elif target not in state:
                visit(target, [*trail, target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == [], f"import cycles in the gateway: {cycles}"
