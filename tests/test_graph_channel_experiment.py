"""The graph channel's study (``python -m experiments.retrieval.graph_channel``) with and without a cross-encoder.

With ``--reranker`` every row (the fused order and each graph setting) is also reranked as the demo config reranks
(ONNX Runtime int8, blend mode): here by a one-layer MiniLM cross-encoder with a fresh, seeded head, over the
LoCoMo sample's turns-mode store.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.retrieval.graph_channel import main
from qgmem_train.config import BUNDLED_EMBEDDER
from qgmem_train.retrieval.cross_encoder import TRAINING_RECORD
from qgmem_train.reranker.data import ensure_turns_store

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "samples" / "locomo_sample.json"
CONVERSATION = "conv-26"
SETTING = ["--weight", "1", "--seeds", "3"]
GRAPH = "graph w1.0 seeds 3 attribute+trace+turn it4 restart 0.5"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample's turns-mode store."""
    folder = tmp_path_factory.mktemp("graph_channel") / "store"
    ensure_turns_store(SAMPLE, folder)
    return folder


@pytest.fixture(scope="module")
def random_cross_encoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CrossEncoder folder as fit-reranker writes it (MiniLM's first layer, a fresh seeded head, compact documents), recorded
    as trained on the sample's conversation."""
    import torch

    from qgmem_train.reranker.module import load_cross_encoder, save_cross_encoder

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("reranker") / "model"
    save_cross_encoder(load_cross_encoder(BUNDLED_EMBEDDER, max_length=64, num_layers=1), folder, "compact")
    (folder / TRAINING_RECORD).write_text(json.dumps({"train_conversations": [CONVERSATION], "val_conversations": []}))
    return folder


def _run(store: Path, out: Path, *extra: str) -> dict:
    code = main(["--conversation", CONVERSATION, "--input", str(SAMPLE), "--store", str(store), *SETTING, "--out", str(out), "--report", "r", *extra])
    assert code == 0
    return json.loads((out / "r.json").read_text())


def test_without_a_reranker_the_rows_are_the_fused_order_and_the_graph_setting(store: Path, tmp_path: Path) -> None:
    report = _run(store, tmp_path)
    assert list(report["summary"]["all"]["means"]) == ["fused", GRAPH]
    assert report["reranker"] is None and "+ reranker" not in (tmp_path / "r.md").read_text()


def test_a_reranker_folder_without_its_training_record_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["--conversation", CONVERSATION, "--input", str(SAMPLE), "--store", str(tmp_path / "store"), "--reranker", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{tmp_path}: no {TRAINING_RECORD}" in err and not (tmp_path / "store").exists()


@pytest.mark.slow
def test_with_a_reranker_every_row_is_also_reranked_and_compared_with_the_fused_order_reranked(
    store: Path, random_cross_encoder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QGMEM_CACHE", str(tmp_path / "cache"))  # the ONNX graph is exported into this run's own cache
    report = _run(store, tmp_path / "results", "--reranker", str(random_cross_encoder))
    fused, graph = "fused + reranker", f"{GRAPH} + reranker"
    summary = report["summary"]
    assert list(summary["all"]["means"]) == ["fused", fused, GRAPH, graph]
    assert report["reranker"]["runtime"] == "onnxruntime" and report["reranker"]["quantization"] == "int8"
    assert report["reranker"]["rerank_mode"] == "blend" and report["reranker"]["trained_on_evaluated"] == [CONVERSATION]
    # a random head reorders the pool: the reranked fused order is not the fused order
    assert summary["against"][fused] == "fused" and summary["all"]["gains"][fused]["ndcg@10"]["mean_difference"] != 0
    # the graph setting reranked is compared with the fused order reranked, overall and per category
    assert summary["against"] == {fused: "fused", GRAPH: "fused", graph: fused}
    for part in summary["per_category"].values():
        assert set(part["means"]) == {"fused", fused, GRAPH, graph} and set(part["gains"]) == {fused, GRAPH, graph}
    text = (tmp_path / "results" / "r.md").read_text()
    assert f"| {fused} |" in text and f"| {graph} |" in text
    assert f"trained on {CONVERSATION}" in text
