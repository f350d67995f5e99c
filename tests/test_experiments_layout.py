"""The lab stays apart from the house: the studies import each other as packages (no ``sys.path`` edits), and the
library (``qgmem_train``, ``data_prep``, ``export``) never imports a study or a benchmark."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LIBRARY = ("qgmem_train", "data_prep", "export")


def imported_roots(file: Path) -> set[str]:
    """The top-level packages ``file`` imports."""
    roots = set()
    for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def sys_path_edits(file: Path) -> list[int]:
    """Lines of ``file`` that touch ``sys.path``."""
    return [node.lineno for node in ast.walk(ast.parse(file.read_text(encoding="utf-8")))
            if isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name) and node.value.id == "sys"]  # fmt: skip


def test_the_checks_see_an_upward_import_and_a_path_edit(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("import sys\nfrom experiments.common import git_state\nsys.path.insert(0, '.')\nimport bench.machine\n")
    assert imported_roots(module) == {"sys", "experiments", "bench"} and sys_path_edits(module) == [3]


def test_the_studies_never_edit_sys_path() -> None:
    edits = {str(f.relative_to(REPO)): sys_path_edits(f) for f in sorted((REPO / "experiments").rglob("*.py"))}
    assert len(edits) >= 20 and {f: lines for f, lines in edits.items() if lines} == {}


def test_the_library_imports_no_study_and_no_benchmark() -> None:
    files = [f for package in LIBRARY for f in sorted((REPO / package).rglob("*.py"))]
    upward = {str(f.relative_to(REPO)): sorted(imported_roots(f) & {"experiments", "bench", "tests"}) for f in files}
    assert len(files) > 50 and {f: roots for f, roots in upward.items() if roots} == {}


def test_the_benchmarks_never_edit_sys_path_nor_import_a_sibling_script_as_a_top_level_module() -> None:
    """A benchmark imports another as ``bench.<script>``: a top-level ``import machine`` works only from bench/ itself."""
    files = sorted((REPO / "bench").glob("*.py"))
    scripts = {f.stem for f in files}
    edits = {str(f.relative_to(REPO)): sys_path_edits(f) for f in files}
    siblings = {str(f.relative_to(REPO)): sorted(imported_roots(f) & scripts) for f in files}
    assert len(files) >= 15 and {f: lines for f, lines in edits.items() if lines} == {}
    assert {f: roots for f, roots in siblings.items() if roots} == {}


def test_benchmarks_and_studies_share_one_module_and_import_each_other_nowhere() -> None:
    """The machine, the commit, intervals and a report's tail are :mod:`qgmem_train.reports`, below both."""
    across = {
        str(f.relative_to(REPO)): sorted(imported_roots(f) & {other})
        for folder, other in (("bench", "experiments"), ("experiments", "bench"))
        for f in sorted((REPO / folder).rglob("*.py"))
    }
    assert {f: roots for f, roots in across.items() if roots} == {}
