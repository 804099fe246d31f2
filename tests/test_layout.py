"""The layout is the architecture (docs/architecture.md): import directions, pure
policies, __all__, and a map that names every part of the package.

Every module under src/surge is parsed with `ast`; each `surge.*` import (at module
level or inside a function, absolute or relative, `importlib.import_module("surge...")`
too) is an edge between two top-level parts of the package, checked against the layers.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "surge"
ROOT = "surge"  # src/surge/__init__.py: the public API, a top-layer module

# Top to bottom. A module may import from its own part and from any lower layer.
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"cli", "serve", "api", "llm", ROOT}),
    frozenset({"controller", "proxy", "router", "replica", "loadtest", "sim"}),
    frozenset({"transport", "codecs", "backends", "weights"}),
    frozenset({"policy"}),
    frozenset({"model", "config", "errors", "clock", "process", "control_auth", "launch",
               "observability"}),
)
MIDDLE = LAYERS[1]  # its parts may not import each other, except ALLOWED edges
TESTING = "testing"  # the public fakes: may use anything below cli; only cli may use them

ALLOWED: dict[tuple[str, str], str] = {
    ("proxy", "router"): "the proxy forwards every request through a Router",
    ("replica", "router"): "deployment handles inside a replica route through a Router",
    ("sim", "loadtest"): "a simulation shares surge pulse's schedule format and report",
}

SIM_FORBIDDEN = frozenset({"proxy", "router", "replica", "transport"})
POLICY_FORBIDDEN_MODULES = frozenset(
    {"asyncio", "socket", "time", "logging", "datetime", "threading"})
# A codec (src/surge/codecs) reads and writes a protocol's bytes: no event loop, no socket,
# no thread, no log; the adapter above it (proxy/) does the I/O and decides.
CODEC_FORBIDDEN_MODULES = frozenset(
    {"asyncio", "socket", "ssl", "selectors", "threading", "logging", "uvloop"})
CODEC_FORBIDDEN_PARTS = frozenset({"proxy", "router", "replica", "controller"})


def rank(part: str) -> int:
    for index, layer in enumerate(LAYERS):
        if part in layer:
            return index
    raise KeyError(part)


# -- parsing ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Module:
    name: str  # dotted, e.g. surge.router.router
    path: Path
    is_package: bool

    @property
    def part(self) -> str:
        return part_of(self.name)

    @property
    def package(self) -> str:
        return self.name if self.is_package else self.name.rpartition(".")[0]

    def tree(self) -> ast.Module:
        return ast.parse(self.path.read_text(), filename=str(self.path))


def part_of(dotted: str) -> str:
    pieces = dotted.split(".")
    return pieces[1] if len(pieces) > 1 else ROOT


def modules() -> list[Module]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        relative = path.relative_to(SRC.parent).with_suffix("")
        pieces = list(relative.parts)
        is_package = pieces[-1] == "__init__"
        if is_package:
            pieces.pop()
        found.append(Module(".".join(pieces), path, is_package))
    return found


def is_surge_module(dotted: str) -> bool:
    if dotted.startswith(f"{ROOT}."):
        path = SRC.joinpath(*dotted.split(".")[1:])
        return path.is_dir() or path.with_suffix(".py").is_file()
    return False


def imported(module: Module) -> Iterator[tuple[str, int]]:
    """(dotted surge module, line) for every surge import anywhere in the module."""
    for node in ast.walk(module.tree()):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == ROOT or alias.name.startswith(f"{ROOT}."):
                    yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            if base != ROOT and not base.startswith(f"{ROOT}."):
                continue
            for alias in node.names:
                # `from surge import serve` imports the subpackage surge.serve
                full = f"{base}.{alias.name}"
                yield (full if is_surge_module(full) else base), node.lineno
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and node.args[0].value.startswith(f"{ROOT}.")
              and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                   or (isinstance(node.func, ast.Name)
                       and node.func.id in ("import_module", "__import__")))):
            yield node.args[0].value, node.lineno


def edges() -> Iterator[tuple[Module, str, int]]:
    """(importing module, imported part, line) for imports across parts."""
    for module in modules():
        for target, line in imported(module):
            if part_of(target) != module.part:
                yield module, part_of(target), line


def edge_problem(source: str, target: str) -> str | None:
    if target == TESTING:
        return None if source in ("cli", TESTING) else "only cli may use surge.testing"
    if source == TESTING:
        return "surge.testing may not use cli" if target == "cli" else None
    if (source, target) in ALLOWED:
        return None
    if rank(target) < rank(source):
        return "imports from a higher layer"
    if rank(target) == rank(source) and source in MIDDLE:
        return "imports from the same middle layer (add it to ALLOWED with a reason?)"
    return None


# -- the rules --------------------------------------------------------------------------


def test_parser_sees_all_kinds_of_import(tmp_path: Path) -> None:
    source = tmp_path / "x.py"
    source.write_text(
        "import surge.model\n"
        "from surge import serve, __version__\n"
        "from surge.policy.routing import choose_replica\n"
        "from . import handle\n"
        "from ..transport import messages\n"
        "def f():\n"
        "    from surge.config import QUEUE_SAFETY_LIMIT\n"
        "    importlib.import_module('surge.errors')\n"
        "import os\n"
    )
    module = Module("surge.router.router", source, is_package=False)
    assert sorted(target for target, _ in imported(module)) == [
        "surge", "surge.config", "surge.errors", "surge.model", "surge.policy.routing",
        "surge.router.handle", "surge.serve", "surge.transport.messages",
    ]


def test_every_part_of_the_package_has_a_layer() -> None:
    parts = {m.part for m in modules()}
    known = set().union(*LAYERS) | {TESTING}
    assert parts - known == set(), "put every new part of src/surge in LAYERS"
    # and the table describes the package: the core parts exist
    assert {"policy", "model", "config", "errors", "router", "transport"} <= parts


def test_imports_point_down_the_layers() -> None:
    problems = [
        f"{module.path.relative_to(SRC.parent)}:{line}: {module.part} -> {target}: {problem}"
        for module, target, line in edges()
        if (problem := edge_problem(module.part, target)) is not None
    ]
    assert problems == [], "\n".join(problems)


def test_allowed_edges_are_real_and_explained() -> None:
    # An exception that no longer exists in the code should go from the table too.
    used = {(module.part, target) for module, target, _ in edges()}
    for edge, reason in ALLOWED.items():
        assert reason, edge
        assert edge in used, f"{edge} is allowed but no longer used: drop it from ALLOWED"


def test_rule_checker_itself() -> None:
    assert edge_problem("router", "policy") is None
    assert edge_problem("controller", "backends") is None
    assert edge_problem("proxy", "router") is None
    assert edge_problem("policy", "router") == "imports from a higher layer"
    assert edge_problem("model", "config") is None  # same bottom layer
    assert edge_problem("controller", "proxy") is not None
    assert edge_problem("router", "proxy") is not None  # ALLOWED is one-way
    assert edge_problem("cli", TESTING) is None
    assert edge_problem("router", TESTING) is not None
    assert edge_problem(TESTING, "serve") is None
    assert edge_problem(TESTING, "cli") is not None


ARCHITECTURE = SRC.parents[1] / "docs" / "architecture.md"


def test_the_architecture_page_names_every_part_and_every_allowed_edge() -> None:
    text = ARCHITECTURE.read_text()
    for part in {m.part for m in modules()} - {ROOT}:
        is_package = (SRC / part).is_dir()
        assert (f"`{part}/`" if is_package else f"`{part}.py`") in text, (
            f"docs/architecture.md does not name src/surge/{part}")
    for source, target in ALLOWED:
        assert f"`{source}` → `{target}`" in text, f"docs/architecture.md: {source} -> {target}"


def test_sim_never_imports_the_data_path() -> None:
    bad = [f"{m.name} -> {target}" for m, target, _ in edges()
           if m.part == "sim" and target in SIM_FORBIDDEN]
    assert bad == []


def codec_modules() -> list[Module]:
    found = [m for m in modules() if m.part == "codecs"]
    assert found
    return found


def test_codecs_import_no_adapter() -> None:
    # The layers say it already (codecs sit below the runtime parts); said here by name
    # because it is the point of the package.
    bad = [f"{m.name}:{line} -> {target}" for m, target, line in edges()
           if m.part == "codecs" and target in CODEC_FORBIDDEN_PARTS]
    assert bad == []
    assert edge_problem("codecs", "proxy") is not None
    assert edge_problem("proxy", "codecs") is None
    assert edge_problem("replica", "codecs") is None


@pytest.mark.parametrize("module", codec_modules(), ids=lambda m: m.name)
def test_codecs_are_sans_io(module: Module) -> None:
    problems = []
    for node in ast.walk(module.tree()):
        names = ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
                 [node.module] if isinstance(node, ast.ImportFrom) and node.module
                 and not node.level else [])
        problems += [f"line {node.lineno}: imports {name}" for name in names
                     if name.split(".")[0] in CODEC_FORBIDDEN_MODULES]
        if isinstance(node, ast.AsyncFunctionDef | ast.Await | ast.AsyncFor | ast.AsyncWith):
            problems.append(f"line {node.lineno}: async code")
    assert problems == []


def import_cycles(parts: frozenset[str]) -> list[list[str]]:
    """Modules of `parts` that import each other round a circle (TYPE_CHECKING imports
    too: a child typed by its owner's class is how back-pointers start)."""
    return circles({m.name: {t for t, _ in imported(m) if part_of(t) in parts and t != m.name}
                    for m in modules() if m.part in parts})


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(name: str) -> None:  # Tarjan's strongly connected components
        order[name] = low[name] = len(order)
        stack.append(name)
        for target in graph[name] & graph.keys():
            if target not in order:
                visit(target)
                low[name] = min(low[name], low[target])
            elif target in stack:
                low[name] = min(low[name], order[target])
        if low[name] == order[name]:
            component = []
            while (member := stack.pop()) != name:
                component.append(member)
            if component:
                found.append(sorted([*component, name]))

    for name in sorted(graph):
        if name not in order:
            visit(name)
    return sorted(found)


def test_codecs_and_adapters_import_in_one_direction() -> None:
    # Owners import their children, never the other way: a child writes its decisions
    # into an outbox it was given (proxy/exchange.py's Outbox) or hands them back, and
    # what it asks of its owner is a Protocol in its own module (exchange.Line,
    # grpc_call.CallSink, head.Routing, host.Host, grpc_ingress.Connection).
    assert import_cycles(frozenset({"proxy", "codecs"})) == []


def test_backends_import_in_one_direction() -> None:
    # A backend uses its helpers (forking.py, early.py, node_cores.py), never the reverse;
    # node_cores.py is the I/O of policy/threads.py's core count and nothing else's.
    assert import_cycles(frozenset({"backends"})) == []
    [node] = [m for m in modules() if m.name == "surge.backends.node_cores"]
    assert {target for target, _ in imported(node)} == {"surge.policy.threads"}


def test_the_cycle_finder_finds_cycles() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}) == [
        ["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": {"x"}, "c": {"d"}, "d": {"c"}}) == [["c", "d"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def policy_modules() -> list[Module]:
    found = [m for m in modules() if m.part == "policy"]
    assert found
    return found


@pytest.mark.parametrize("module", policy_modules(), ids=lambda m: m.name)
def test_policies_are_pure(module: Module) -> None:
    tree = module.tree()
    problems = []
    random_names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                if top in POLICY_FORBIDDEN_MODULES:
                    problems.append(f"line {node.lineno}: import {alias.name}")
                if alias.name == "random":
                    random_names.add(alias.asname or "random")
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            top = node.module.split(".")[0]
            if top in POLICY_FORBIDDEN_MODULES:
                problems.append(f"line {node.lineno}: from {node.module} import ...")
            if node.module == "random":
                problems += [f"line {node.lineno}: from random import {alias.name}"
                             for alias in node.names if alias.name != "Random"]
    for node in ast.walk(tree):
        # random.Random is the type of the `rng` parameter; anything else on the module
        # (random.random(), random.choice(), ...) is the hidden global generator.
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in random_names and node.attr != "Random"):
            problems.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
        # ... and a fresh random.Random() inside a policy is randomness nobody passed in.
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id in random_names and node.func.attr == "Random"):
            problems.append(f"line {node.lineno}: random.Random() created")
    assert problems == []


@pytest.mark.parametrize("module", policy_modules(), ids=lambda m: m.name)
def test_policy_functions_are_exported(module: Module) -> None:
    if module.is_package:
        return
    public = {node.name for node in module.tree().body
              if isinstance(node, ast.FunctionDef) and not node.name.startswith("_")}
    exported = set(importlib.import_module(module.name).__all__)
    assert public - exported == set()


# -- the public API ---------------------------------------------------------------------

PUBLIC = ["surge", "surge.serve", "surge.serve.config", "surge.serve.exceptions",
          "surge.serve.handle", "surge.serve.llm", "surge.serve.metrics"]


@pytest.mark.parametrize("name", PUBLIC)
def test_public_all_is_sorted_and_real(name: str) -> None:
    module = importlib.import_module(name)
    names = list(module.__all__)
    assert names == sorted(names)
    assert len(names) == len(set(names))
    missing = [n for n in names if not hasattr(module, n)]
    assert missing == []


def test_serve_exceptions_export_the_whole_error_tree() -> None:
    errors = importlib.import_module("surge.errors")
    exceptions = importlib.import_module("surge.serve.exceptions")
    assert set(errors.__all__) <= set(exceptions.__all__)
    for name in errors.__all__:
        assert getattr(exceptions, name) is getattr(errors, name)


def test_serve_only_reexports() -> None:
    problems = []
    for module in (m for m in modules() if m.part == "serve"):
        for node in module.tree().body:
            if isinstance(node, ast.Import | ast.ImportFrom):
                continue
            if (isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
                    and all(isinstance(n, ast.Import | ast.ImportFrom) for n in node.body)
                    and not node.orelse):
                continue  # the names surge.serve loads on first use, for type checkers
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                continue  # docstring
            if (isinstance(node, ast.Assign) and len(node.targets) == 1
                    and isinstance(node.targets[0], ast.Name)
                    and node.targets[0].id == "__all__"):
                continue
            problems.append(f"{module.name}:{node.lineno}: {type(node).__name__}")
    assert problems == [], "surge.serve re-exports only; put the logic in its own module"


# The control-plane redesign's bound (#14, #32): a controller class over ~25 methods is
# doing two jobs; every def counts (dunder and private too), as the issues counted them.
CONTROLLER_CLASS_MAX_METHODS = 25


def test_no_controller_class_grows_past_its_bound() -> None:
    over = []
    for module in (m for m in modules() if m.part == "controller"):
        for node in ast.walk(module.tree()):
            if isinstance(node, ast.ClassDef):
                count = sum(isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
                            for f in node.body)
                if count > CONTROLLER_CLASS_MAX_METHODS:
                    over.append(f"{module.name}.{node.name}: {count} methods")
    assert over == [], "merge methods that are one concept, or split the class"
