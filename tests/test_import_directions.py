"""Imports point one way: memory below retrieval below answering, shared pieces in homes their users reach from below,
no package reaching sideways into another consumer's folder and no import circle in the library."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LIBRARY = REPO / "qgmem_train"
FORBIDDEN_BELOW_RETRIEVAL = ("qgmem_train.model", "qgmem_train.graph")
SIDEWAYS = {
    "qgmem_train.eval": ("qgmem_train.model", "qgmem_train.reranker"),
    "qgmem_train.model": ("qgmem_train.eval", "qgmem_train.reranker"),
    "qgmem_train.reranker": ("qgmem_train.eval", "qgmem_train.model"),
    "data_prep": ("qgmem_train.model",),
}
"""Packages that consume shared pieces and the consumers they never import: the two trainers, evaluation and data prep."""
MOVED = {
    "qgmem_train.retrieval.serialization": "qgmem_train.answer.memory_context",
    "qgmem_train.model.answers": "qgmem_train.metrics.answers",
    "qgmem_train.eval.retrieval_metrics": "qgmem_train.metrics.retrieval",
    "qgmem_train.model.schedule": "qgmem_train.schedule",
    "qgmem_train.eval.question_batches": "qgmem_train.benchmarks.question_batches",
    "qgmem_train.eval.benchmarks": "qgmem_train.benchmarks.loaders",
    "qgmem_train.model.trajectory": "qgmem_train.trajectory",
    "qgmem_train.model.answer_span": "qgmem_train.model.answer_target",
    "qgmem_train.eval.answers": "qgmem_train.eval.answer_quality",
    "qgmem_train.predictor.results": "qgmem_train.pipeline.results",
}
"""Old path → the module's home; the old path is gone (nothing saved names a module path, so no shim is kept)."""


def imported_modules(path: Path) -> list[str]:
    """Every module an ``import`` or ``from ... import`` of ``path`` names, nested imports included."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names += [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
    return names


def module_name(path: Path) -> str:
    """``qgmem_train/retrieval/rerank.py`` → ``qgmem_train.retrieval.rerank`` (a package's ``__init__`` → the package)."""
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(f"{package}.")


def import_graph(folder: Path) -> dict[str, set[str]]:
    """Module → the modules of ``folder`` it imports (lazy imports included)."""
    files = {module_name(path): path for path in sorted(folder.rglob("*.py"))}
    return {name: {other for other in imported_modules(path) if other in files and other != name} for name, path in files.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph``: its strongly connected components of more than one module (Tarjan)."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        order[module] = low[module] = len(order)
        stack.append(module)
        for other in graph[module]:
            if other not in order:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], order[other])
        if low[module] == order[module]:
            component = stack[stack.index(module) :]
            del stack[stack.index(module) :]
            if len(component) > 1:
                found.append(sorted(component))

    for module in graph:
        if module not in order:
            visit(module)
    return found


def offending_imports(folder: Path, banned: tuple[str, ...]) -> set[str]:
    """``file: module`` for every import under ``folder`` of a module within one of ``banned``."""
    return {
        f"{path.relative_to(folder)}: {name}"
        for path in sorted(folder.rglob("*.py"))
        for name in imported_modules(path)
        if any(within(name, package) for package in banned)
    }


def test_the_checks_see_a_sideways_import_and_a_circle(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("def f():\n    from qgmem_train.model.answers import answer_scores\n")
    assert offending_imports(tmp_path, ("qgmem_train.model",)) == {"a.py: qgmem_train.model.answers", "a.py: qgmem_train.model.answers.answer_scores"}
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]] and circles({"a": {"b"}, "b": set()}) == []


def test_retrieval_imports_neither_the_model_nor_the_graph() -> None:
    assert not offending_imports(LIBRARY / "retrieval", FORBIDDEN_BELOW_RETRIEVAL)


def test_the_memory_layer_imports_nothing_from_retrieval() -> None:
    """Data flows one way: memory below retrieval; text normalisation both use lives below both."""
    assert not offending_imports(LIBRARY / "memory", ("qgmem_train.retrieval",))


def test_retrieval_imports_nothing_from_the_answering_layer() -> None:
    """The question's walk is retrieval → answer: MEMORY_CONTEXT is written where it is read."""
    assert not offending_imports(LIBRARY / "retrieval", ("qgmem_train.answer",))


@pytest.mark.parametrize("consumer", sorted(SIDEWAYS))
def test_no_consumer_imports_another_consumers_folder(consumer: str) -> None:
    """Metrics, the learning-rate schedule, benchmark questions and the trajectory format sit below all their users."""
    assert not offending_imports(REPO.joinpath(*consumer.split(".")), SIDEWAYS[consumer])


def test_the_library_has_no_import_circle() -> None:
    graph = import_graph(LIBRARY)
    assert len(graph) > 100 and circles(graph) == []


def command_modules() -> set[str]:
    """The modules of ``python -m qgmem_train``'s and ``python -m data_prep``'s commands: entry points, never libraries."""
    from qgmem_train.__main__ import COMMANDS

    return {module for module, _ in COMMANDS.values()} | {"qgmem_train.__main__", "data_prep.__main__"}


def command_imports(folders: list[Path], allowed: frozenset[str] = frozenset()) -> set[str]:
    """``file: module`` for every import of a command module but ``allowed`` by a module under ``folders`` (a ``__main__``
    entry, which dispatches to commands, aside)."""
    commands = command_modules() - allowed
    return {
        f"{path.relative_to(folder.parent)}: {name}"
        for folder in folders
        for path in sorted(folder.rglob("*.py"))
        if path.name != "__main__.py"
        for name in imported_modules(path)
        if name in commands
    }


def test_no_module_imports_a_command_module() -> None:
    """Commands are thin entries over the library (:mod:`qgmem_train.pipeline`): what two of them share lives below both.
    Studies and benchmarks are scripts: they may run a command through ``python -m qgmem_train``'s entry, never import one."""
    assert {"qgmem_train.ask", "qgmem_train.build", "qgmem_train.serve.cli", "qgmem_train.eval.cli"} <= command_modules()
    assert command_imports([LIBRARY, REPO / "data_prep", REPO / "export"]) == set()
    assert command_imports([REPO / "bench", REPO / "experiments"], allowed=frozenset({"qgmem_train.__main__"})) == set()


def test_the_command_check_sees_a_command_imported_as_a_library(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("def f():\n    from qgmem_train.ask import pick_namespace\n")
    (tmp_path / "b.py").write_text("from qgmem_train import build\n")
    assert command_imports([tmp_path]) == {f"{tmp_path.name}/a.py: qgmem_train.ask", f"{tmp_path.name}/b.py: qgmem_train.build"}


def importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # its package is missing
        return False


@pytest.mark.parametrize(("old", "new"), sorted(MOVED.items()))
def test_a_moved_module_lives_in_its_home_only(old: str, new: str) -> None:
    assert importable(new), new
    assert not importable(old), f"{old} is still there beside {new}"


def test_every_package_says_what_it_is() -> None:
    """Each package's ``__init__.py`` names its job and its public names (a docstring; nothing is imported for it)."""
    folders = [LIBRARY, REPO / "data_prep", REPO / "bench", REPO / "experiments", REPO / "export"]
    bare = [str(path.relative_to(REPO)) for folder in folders for path in sorted(folder.rglob("__init__.py")) if not ast.get_docstring(ast.parse(path.read_text()))]
    assert bare == []
