"""Layering: every module imports on its own, the module-level imports form no cycle, and the runtime
(qoq.runtime_cuda, qoq.executor) does not import the compiler (qoq.passes)."""

import ast
import importlib.util
import json
import os
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "qoq"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


# One interpreter imports torch (every module's heavy dependency) and no qoq module, then forks a child
# per module that imports just that module: each child is a fresh interpreter as far as qoq goes, and the
# test costs one torch import instead of one per module.
FORKED_IMPORTS = r"""
import json, os, sys, traceback
import torch  # noqa: F401
assert not [m for m in sys.modules if m == "qoq" or m.startswith("qoq.")]
results = {}
for name in sys.argv[1:]:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            __import__(name)
            message = ""
        except BaseException:
            message = traceback.format_exc() or "failed"
        os.write(write, message.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        message = pipe.read()
    _, status = os.waitpid(pid, 0)
    results[name] = message or ("" if status == 0 else f"exit status {status}")
print(json.dumps(results))
"""


@lru_cache(maxsize=None)
def _fresh_imports() -> dict[str, str]:
    """Module name -> the traceback of importing it alone ("" where it imported)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-c", FORKED_IMPORTS, *MODULES], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


# modules that import the `serve` extra (FastAPI, uvicorn, pydantic) at module level
SERVE_EXTRA = {"qoq.serve.app", "qoq.serve.protocol", "qoq.serve.server", "qoq.serve.serving"}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_every_module_imports_in_a_fresh_interpreter(name):
    if name in SERVE_EXTRA and importlib.util.find_spec("fastapi") is None:
        pytest.skip("the serve extra is not installed")
    assert _fresh_imports()[name] == "", _fresh_imports()[name][-4000:]


def _module_level_imports(name: str, path: Path, everywhere: bool = False) -> set[str]:
    """The qoq modules `name` imports when it is loaded: its top-level statements (and those under
    top-level if / try / with), not the bodies of its functions and classes (`everywhere`: those too).
    `from a import b` counts as an import of a.b where that is a module, else of a; every import also
    loads the packages above."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()

    def visit(statements):
        for node in statements:
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module
                found.add(module)
                found.update(f"{module}.{alias.name}" for alias in node.names)
            elif isinstance(node, (ast.If, ast.Try, ast.With)) and not everywhere:
                for field in ("body", "orelse", "finalbody"):
                    visit(getattr(node, field, []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)

    visit(list(ast.walk(tree)) if everywhere else tree.body)
    edges = set()
    for module in found:
        parts = module.split(".")
        for i in range(1, len(parts) + 1):
            target = ".".join(parts[:i])
            if target in MODULES and target != name and not name.startswith(target + "."):
                edges.add(target)
    return edges


def _graph(everywhere: bool = False) -> dict[str, set[str]]:
    return {name: _module_level_imports(name, path, everywhere) for name, path in MODULES.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state = {}  # name -> 1 on the stack, 2 done

    def visit(name, stack):
        state[name] = 1
        for target in sorted(graph[name]):
            if state.get(target) == 1:
                return stack[stack.index(target):] + [target]
            if target not in state and (found := visit(target, stack + [target])):
                return found
        state[name] = 2
        return None

    for name in sorted(graph):
        if name not in state and (found := visit(name, [name])):
            return found
    return None


def test_the_static_import_graph_sees_every_module():
    graph = _graph()
    assert set(graph) == set(MODULES) and "qoq.runtime_cuda.gemm" in graph
    assert "qoq.passes.base" in graph["qoq.passes.clip"]  # the graph does see imports


def test_module_level_imports_have_no_cycle():
    assert _cycle(_graph()) is None, " -> ".join(_cycle(_graph()))


def test_no_cycle_even_through_imports_inside_functions():
    # a function's deferred import only hides a cycle (recipe <-> passes, models.loader <-> smollm2 were)
    assert _cycle(_graph(everywhere=True)) is None, " -> ".join(_cycle(_graph(everywhere=True)))


def test_the_runtime_does_not_import_the_compiler():
    for name, targets in _graph(everywhere=True).items():  # not even inside a function
        if name.startswith(("qoq.runtime_cuda", "qoq.executor")):
            compiler = sorted(t for t in targets if t == "qoq.passes" or t.startswith("qoq.passes."))
            assert not compiler, f"{name} imports {compiler}"


def test_the_cycle_finder_finds_cycles():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
