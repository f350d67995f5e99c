"""The README stays true: its diagram names only modules that exist, and its own-chats snippets run as written.

The snippets run over the tiny random decoder: as an export (made as tests/test_predictor.py makes one), and
as the configured LLM of the no-training path.
"""

from __future__ import annotations

import re
from pathlib import Path

import lightning as L
import pytest
import yaml

from qgmem_train.config import load_pipeline_config
from qgmem_train.model.datamodule import TrajectoryDataModule
from qgmem_train.model.module import GraphAugmentedLM
from tests.tiny_decoder import FIXTURE, fixture_corpus, publish_to_hub_cache, save_tiny_decoder, tiny_module_kwargs

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
PROJECT_PATH = re.compile(r"(?<![<\w./])[a-z_]+/[\w./]*")
"""A repository path in the diagram: a lowercase name and a slash onwards (``<br/>`` is not one): a module or a folder."""
OWN_CHATS_HEADING = "## Your own chats in five lines of Python"
DEMO_EXPORT, DEMO_CONFIG, SNIPPET_STORE = "out/demo/export", "configs/demo-cpu.yaml", "out/my_memory"
"""The paths the snippets name, replaced by the tests' own."""


def fenced_blocks(markdown: str, language: str) -> list[str]:
    """The bodies of the ```language fenced blocks of ``markdown``, in order."""
    return re.findall(rf"^```{language}\n(.*?)^```", markdown, flags=re.MULTILINE | re.DOTALL)


def section(markdown: str, heading: str) -> str:
    """The text under ``heading`` up to the next heading of the same or a higher level."""
    start = markdown.index(heading + "\n")
    level = heading.split()[0]
    rest = markdown[start + len(heading) :]
    end = re.search(rf"^#{{1,{len(level)}}} ", rest, flags=re.MULTILINE)
    return rest[: end.start()] if end else rest


def missing_paths(diagram: str) -> list[str]:
    """Paths the diagram names that are not in the repository: a ``.py`` must be a file, anything else a folder."""
    paths = PROJECT_PATH.findall(diagram)
    return [p for p in paths if not ((REPO / p).is_file() if p.endswith(".py") else (REPO / p).is_dir())]


def test_the_path_check_flags_a_wrong_module_or_package() -> None:
    diagram = 'a["qgmem_train/memory/store.py"] --> b["qgmem_train/memory/nostore.py<br/>export/"] --> c["dataprep/<br/>JSON/JSONL"]'
    assert missing_paths(diagram) == ["qgmem_train/memory/nostore.py", "dataprep/"]


MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)\)")
"""A markdown link's target: ``[text](target)``."""
README_MAX_LINES = 250
"""The README is read in ten minutes; depth belongs in ``docs/``."""


def broken_links(page: Path) -> list[str]:
    """Relative link targets of ``page`` (anchors dropped) that name no file or folder beside it."""
    targets = MARKDOWN_LINK.findall(page.read_text(encoding="utf-8"))
    local = [t.split("#")[0] for t in targets if not re.match(r"^(https?:|mailto:|#)", t)]
    return [t for t in local if t and not (page.parent / t).exists()]


def test_the_link_check_flags_a_missing_target(tmp_path) -> None:
    (tmp_path / "here.md").write_text("x")
    page = tmp_path / "page.md"
    page.write_text("[a](here.md) [b](gone.md#part) [c](https://example.org/x) [d](#local)")
    assert broken_links(page) == ["gone.md"]


@pytest.mark.parametrize("page", [README, *sorted((REPO / "docs").glob("*.md"))], ids=lambda p: p.name)
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_the_readme_stays_short_and_names_only_real_make_targets() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    targets = set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(encoding="utf-8"), flags=re.MULTILINE))
    named = set(re.findall(r"`make ([\w-]+)", text))
    assert named and named <= targets, named - targets


def test_every_module_and_package_in_the_diagram_exists() -> None:
    diagrams = fenced_blocks(README.read_text(encoding="utf-8"), "mermaid")
    assert len(diagrams) == 1, "the README has one mermaid diagram"
    assert len(PROJECT_PATH.findall(diagrams[0])) >= 20
    assert missing_paths(diagrams[0]) == []


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory) -> Path:
    """A pipeline YAML over the tiny decoder (saved beside it as ``tiny/``): turns mode, no reranker, short answers."""
    root = tmp_path_factory.mktemp("readme")
    llm_dir = save_tiny_decoder(root / "tiny", fixture_corpus())
    pipeline = {
        "models": {"llm": str(llm_dir), "reranker": "none", "device": "cpu"},
        "construction": {"units": "turns", "traces": False},
        "generation": {"max_new_tokens": 16},
    }
    config = root / "pipeline.yaml"
    config.write_text(yaml.safe_dump({"pipeline": pipeline}))
    return config


@pytest.fixture(scope="module")
def tiny_export(tiny_config) -> Path:
    """An export folder of the tiny decoder's module after one training step."""
    from export.package import export_model

    root = tiny_config.parent
    L.seed_everything(0)
    data = TrajectoryDataModule(str(FIXTURE), batch_size=1, max_examples=1)
    model = GraphAugmentedLM(**tiny_module_kwargs(root / "tiny", data.feature_dim))
    trainer = L.Trainer(accelerator="cpu", max_steps=1, limit_val_batches=0, logger=False, enable_progress_bar=False, default_root_dir=root)
    trainer.fit(model, datamodule=data)
    trainer.save_checkpoint(root / "tiny.ckpt")
    return export_model(root / "tiny.ckpt", tiny_config, root / "model", names={"llm": publish_to_hub_cache(root / "tiny")})


def own_chats_snippets() -> tuple[str, str]:
    """The two python blocks of the own-chats section: the full snippet over an export, and its no-training line."""
    blocks = fenced_blocks(section(README.read_text(encoding="utf-8"), OWN_CHATS_HEADING), "python")
    assert len(blocks) == 2, "the own-chats section has the snippet and its no-training variant"
    return blocks[0], blocks[1]


def swap(code: str, path: str, value: Path) -> str:
    """``code`` with its string literal ``"path"`` replaced by ``value``; the snippet must name ``path``."""
    literal = f'"{path}"'
    assert literal in code, f"the snippet no longer names {literal}"
    return code.replace(literal, repr(str(value)))


def run_snippet(code: str, store: Path) -> dict[str, object]:
    """Execute ``code`` with its store folder moved to ``store``; its global names afterwards."""
    names: dict[str, object] = {}
    exec(compile(swap(code, SNIPPET_STORE, store), str(README), "exec"), names)
    return names


def test_the_snippet_answers_over_an_export_with_cited_source_turns(tiny_export, tmp_path, capsys) -> None:
    snippet, _ = own_chats_snippets()
    names = run_snippet(swap(snippet, DEMO_EXPORT, tiny_export), tmp_path / "memory")
    result = names["result"]
    assert result.path == "graph" and result.units and result.units[0].source_turns
    printed = capsys.readouterr().out
    assert printed.startswith("answer: ") and result.units[0].source_turns[0].text in printed


def test_the_no_training_variant_answers_on_the_text_path(tiny_config, tmp_path, capsys) -> None:
    """The variant's config is valid as named; it runs over the tiny decoder (SmolLM2 answers too slowly for a test)."""
    snippet, variant = own_chats_snippets()
    load_pipeline_config(REPO / DEMO_CONFIG)
    load_line = next(line for line in snippet.splitlines() if line.startswith("predictor = "))
    names = run_snippet(snippet.replace(load_line, swap(variant.strip(), DEMO_CONFIG, tiny_config)), tmp_path / "memory")
    assert names["result"].path == "text" and names["result"].units
    assert capsys.readouterr().out.startswith("answer: ")
