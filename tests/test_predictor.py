"""The predictor's memory handle, text path, frozen pipeline under LoRA, and JSONL predictions of ``predict``.

Real MiniLM embeddings throughout; the answering LLM is scripted only where the test is about parsing
and citations, and the tiny random decoder stands in where the test is about the module's wiring.
(SmolLM2 end to end: tests/test_export.py.)
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
import yaml

from qgmem_train.__main__ import main
from qgmem_train.config import BUNDLED_EMBEDDER, PipelineConfig
from qgmem_train.errors import InputError, ModelUnavailableError
from qgmem_train.llm.local import TransformersLLM
from qgmem_train.memory.types import Turn, session_fingerprint
from qgmem_train.model.datamodule import TrajectoryDataModule
from qgmem_train.model.module import GraphAugmentedLM
from qgmem_train.model.prediction_writer import JsonlPredictionWriter
from qgmem_train.predictor import QGMemPredictor, ask_batch, ask_with_model
from tests.fakes import ScriptedLLM
from tests.tiny_decoder import FIXTURE, publish_to_hub_cache, tiny_module_kwargs

SESSION = [
    {"speaker": "Caroline", "text": "I went to the LGBTQ support group yesterday and it was so powerful."},
    {"speaker": "Melanie", "text": "That's great! I painted a sunrise over the lake last week."},
]


def _pipeline(llm: str = "scripted") -> PipelineConfig:
    cfg = PipelineConfig()
    cfg.models.llm, cfg.models.reranker, cfg.models.device = llm, "none", "cpu"
    cfg.construction.units, cfg.construction.traces = "turns", False
    cfg.retrieval.k = 3
    return cfg


def _text_predictor(minilm, replies: list[str]) -> QGMemPredictor:
    return QGMemPredictor(None, _pipeline(), llm=ScriptedLLM(replies), embedder=minilm, reranker=None, intent="rules")


def test_sessions_get_ids_and_persist_and_bad_turns_are_one_clear_error(minilm, tmp_path) -> None:
    predictor = _text_predictor(minilm, [])
    with predictor.memory("alice", tmp_path / "store") as memory:
        assert memory.add_session(SESSION, time="8 May, 2023").units == 2
        memory.add_session([Turn("x-1", "Alice", "I moved to Paris in June.")], session_id="trip")
        memory.add_session([{"id": "late", "speaker": "Bob", "text": "See you soon."}])
        stored = memory.store.load_namespace("alice")
        first = session_fingerprint(SESSION, "8 May, 2023")
        assert list(stored.turns) == [f"{first}:1", f"{first}:2", "x-1", "late"]
        assert stored.turn_time[f"{first}:1"] == "2023-05-08" and stored.turn_time["x-1"] is None
        last = session_fingerprint([{"id": "late", "speaker": "Bob", "text": "See you soon."}], None)
        assert {s for s, _ in memory.store.done_windows("alice")} == {first, "trip", last}
        for turns, time, message in [
            ([{"speaker": "Bob"}], None, "turn 1.text"),
            ([SESSION[0], "hello"], None, "turn 2"),
            (SESSION, "someday", "unrecognised date"),
            ([], None, "no turns"),
        ]:
            with pytest.raises(InputError, match=message):
                memory.add_session(turns, time=time)
        with pytest.raises(InputError, match="question: empty"):
            memory.ask("  ")
    with predictor.memory("alice", tmp_path / "store") as reopened:
        assert reopened.store.count_units("alice") == 4


def test_text_path_answer_cites_units_with_their_source_turns(minilm, tmp_path) -> None:
    reply = json.dumps({"reasoning_path": "[F1] says Melanie painted a sunrise.", "answer": "a sunrise"})
    predictor = _text_predictor(minilm, [reply])
    with predictor.memory("alice", tmp_path / "store") as memory:
        memory.add_session(SESSION, time="2023-05-08", session_id="S1")
        result = memory.ask("What did Melanie paint?", question_time="2023-05-20")
    assert result.path == "text" and result.answer == "a sunrise"
    assert [u.id for u in result.cited] == ["S1:2"] and result.units[0].label == "F1"
    assert result.cited[0].source_turns[0].text == SESSION[1]["text"] and result.cited[0].source_turns[0].time == "2023-05-08"
    assert result.tokens["generated"] == len(result.generated.split()) and result.tokens["prompt"] > result.tokens["context"] > 0
    prompt = predictor.llm.calls[0][-1]["content"]
    assert "What did Melanie paint?" in prompt and "2023-05-20" in prompt and "I painted a sunrise" in prompt
    rendered = result.render()
    assert rendered.startswith("answer: a sunrise") and "cited units (1 of 2 units" in rendered and "S1:2 (2023-05-08) Melanie:" in rendered


def test_search_returns_the_working_memory_and_its_context_without_answering(minilm, tmp_path) -> None:
    predictor = _text_predictor(minilm, [])
    with predictor.memory("alice", tmp_path / "store") as memory:
        memory.add_session(SESSION, time="2023-05-08", session_id="S1")
        result = memory.search("What did Melanie paint?", question_time="2023-05-20")
    assert predictor.llm.calls == []
    assert result.units[0].id == "S1:2" and result.units[0].label == "F1" and not any(u.cited for u in result.units)
    assert "F1" in result.memory_context and "I painted a sunrise" in result.memory_context
    assert result.tokens["context"] > 0 and result.to_dict()["units"][0]["source_turns"][0]["time"] == "2023-05-08"


def test_ask_batch_answers_every_question_in_one_generate_call(minilm, tmp_path) -> None:
    """Questions over two namespaces decode together; each result carries its own question's working memory."""
    reply = json.dumps({"reasoning_path": "[F1] says it.", "answer": "yes"})
    predictor = _text_predictor(minilm, lambda chat: reply)
    with predictor.memory("alice", tmp_path / "store") as alice, predictor.memory("bob", tmp_path / "store") as bob:
        alice.add_session(SESSION, session_id="S1")
        bob.add_session([Turn("b1", "Bob", "I adopted a cat named Miso.")], session_id="B")
        results = ask_batch([(alice, "What did Melanie paint?", None), (bob, "What is the cat's name?", None), (alice, "Who went to a group?", None)])
    assert predictor.llm.batches == [3]
    assert [r.question for r in results] == ["What did Melanie paint?", "What is the cat's name?", "Who went to a group?"]
    assert [u.id for u in results[1].units] == ["b1"] and results[1].cited[0].source_turns[0].text == "I adopted a cat named Miso."
    assert {u.id for u in results[0].units} == {"S1:1", "S1:2"} and all(r.answer == "yes" for r in results)


def test_an_invalid_answer_cites_nothing_and_shows_the_working_memory(minilm, tmp_path) -> None:
    predictor = _text_predictor(minilm, ["no json here", "still none"])
    with predictor.memory("alice", tmp_path / "store") as memory:
        memory.add_session(SESSION)
        result = memory.ask("What did Melanie paint?")
    assert result.answer is None and result.cited == [] and len(result.units) == 2
    assert "working memory (nothing cited) (2 of 2 units" in result.render()


def test_graph_path_wiring_and_lora_off_in_the_frozen_pipeline(llm_dir, minilm, tmp_path) -> None:
    torch.manual_seed(0)
    model = GraphAugmentedLM(**tiny_module_kwargs(llm_dir, minilm.dim, lora={"r": 2}))
    model.load_backbone()
    for name, param in model.llm.named_parameters():
        if "lora_B" in name:
            param.data.fill_(0.05)
    predictor = QGMemPredictor.from_module(model, _pipeline(str(llm_dir)), intent="rules")
    chat = [{"role": "user", "content": "What did Melanie paint?"}]
    with predictor.frozen_pipeline():
        frozen = predictor.llm.next_token_logprobs([chat])
    adapted = predictor.llm.next_token_logprobs([chat])
    base = TransformersLLM(str(llm_dir)).next_token_logprobs([chat])
    assert torch.allclose(frozen, base, atol=1e-5) and not torch.allclose(adapted, base, atol=1e-3)
    with predictor.memory("alice", tmp_path / "store") as memory:
        memory.add_session(SESSION, session_id="S1")
        result = memory.ask("What did Melanie paint?")
        calls = []
        generate = model.generate
        model.generate = lambda examples, graph: calls.append(len(examples)) or generate(examples, graph)
        batch = ask_batch([(memory, "What did Melanie paint?", None), (memory, "Who went to a support group?", None)])
    assert calls == [2] and [r.path for r in batch] == ["graph", "graph"] and batch[0].units[0].id == "S1:2"
    assert batch[0].generated == result.generated and batch[1].question == "Who went to a support group?"
    assert result.path == "graph" and len(result.units) == 2 and result.units[0].id == "S1:2"
    assert result.tokens["prompt"] > result.tokens["context"] and {"graph", "generate"} <= set(result.seconds)


def test_prediction_writer_is_atomic(tmp_path) -> None:
    trainer = SimpleNamespace(default_root_dir=str(tmp_path), global_rank=0, world_size=1)
    writer = JsonlPredictionWriter()
    writer.on_predict_start(trainer, None)
    writer.write_on_batch_end(trainer, None, [{"answer": "a"}], None, None, 0, 0)
    writer.on_exception(trainer, None, RuntimeError("killed"))
    assert list(tmp_path.iterdir()) == []
    writer.on_predict_start(trainer, None)
    writer.write_on_batch_end(trainer, None, [{"answer": "a"}, {"answer": "b"}], None, None, 0, 0)
    assert list(tmp_path.iterdir())[0].name.startswith(".predictions.jsonl.")
    writer.on_predict_end(trainer, None)
    assert [p.name for p in tmp_path.iterdir()] == ["predictions.jsonl"]
    assert [json.loads(line) for line in (tmp_path / "predictions.jsonl").read_text().splitlines()] == [{"answer": "a"}, {"answer": "b"}]
    assert writer.target(SimpleNamespace(default_root_dir=str(tmp_path), global_rank=1, world_size=2)).name == "predictions.rank1.jsonl"


def test_lightning_cli_predict_writes_jsonl(llm_dir, tmp_path) -> None:
    from qgmem_train.lightning_cli import main

    out = tmp_path / "predictions.jsonl"
    config = {
        "trainer": {
            "accelerator": "cpu", "devices": 1, "logger": False, "enable_progress_bar": False, "default_root_dir": str(tmp_path),
            "callbacks": [{"class_path": "qgmem_train.model.prediction_writer.JsonlPredictionWriter", "init_args": {"path": str(out)}}],
        },
        "checkpoint": {"dirpath": str(tmp_path / "ckpt")},
        "model": {k: v for k, v in tiny_module_kwargs(llm_dir, 0).items() if k not in {"feature_dim", "llm"}},
        "data": {"path": str(FIXTURE), "batch_size": 2},
        "pipeline": {"models": {"llm": str(llm_dir), "embedder": BUNDLED_EMBEDDER}},
    }  # fmt: skip
    path = tmp_path / "predict.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["predict", "--config", str(path)]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 2 and {"question_id", "generated", "answer", "valid_json", "exact_match", "reference_answer"} <= set(records[0])


def test_ask_with_model_answers_from_an_export_folder_with_metrics_in_its_card(llm_dir, tmp_path) -> None:
    from export.package import export_model

    L.seed_everything(0)
    data = TrajectoryDataModule(str(FIXTURE), batch_size=2, max_examples=2)
    model = GraphAugmentedLM(**tiny_module_kwargs(llm_dir, data.feature_dim))
    trainer = L.Trainer(accelerator="cpu", max_steps=1, limit_val_batches=0, logger=False, enable_progress_bar=False, default_root_dir=tmp_path)
    trainer.fit(model, datamodule=data)
    trainer.save_checkpoint(tmp_path / "tiny.ckpt")
    config = tmp_path / "fit.yaml"
    config.write_text(yaml.safe_dump({"pipeline": _pipeline(str(llm_dir)).to_dict()}))
    metrics = tmp_path / "metrics.json"
    metrics.write_text(json.dumps({"recall@10": 0.5, "n_questions": 3, "per_category": {"1": 0.4}}))
    out = export_model(tmp_path / "tiny.ckpt", config, tmp_path / "model", eval_report=metrics, names={"llm": publish_to_hub_cache(llm_dir)})
    card = (out / "README.md").read_text()
    assert "| recall@10 | 0.5000 |" in card and "| n_questions | 3 |" in card and "per_category" not in card
    predictor = QGMemPredictor.from_pretrained(out, intent="rules")
    with predictor.memory("alice", tmp_path / "store") as memory:
        memory.add_session(SESSION, session_id="S1")
        assert memory.ask("What did Melanie paint?").path == "graph"
    assert predictor.model.prefix_cache_status()[0] and predictor.model._prefix is not None, "the export answers from the cached prefix"
    result = ask_with_model(out, tmp_path / "store", "alice", "What did Melanie paint?", intent="rules")
    assert result.path == "graph" and [u.id for u in result.units] == ["S1:2", "S1:1"]

    locomo = tmp_path / "locomo.json"
    turns = [{"speaker": t["speaker"], "dia_id": f"D1:{i}", "text": t["text"]} for i, t in enumerate(SESSION, start=1)]
    locomo.write_text(json.dumps([{"sample_id": "conv-x", "conversation": {
        "speaker_a": "Caroline", "speaker_b": "Melanie", "session_1_date_time": "1:56 pm on 8 May, 2023", "session_1": turns},
        "qa": [{"question": "What did Melanie paint?", "answer": "a sunrise", "evidence": ["D1:2"], "category": 4},
               {"question": "Where did Caroline go?", "answer": "a support group", "evidence": ["D1:1"], "category": 4}]}]))  # fmt: skip
    assert main(["build", "--dataset", "locomo", "--input", str(locomo), "--store", str(tmp_path / "eval_store"), "--config", str(config)]) == 0
    report = tmp_path / "eval"
    assert main(["eval", "answers", "--benchmark", "locomo", "--input", str(locomo), "--store", str(tmp_path / "eval_store"), "--out", str(report),
                 "--model", str(out), "--judge-config", str(config), "--intent", "rules"]) == 0  # fmt: skip
    metrics = json.loads((report / "metrics.json").read_text())
    assert metrics["n_questions"] == 2 and metrics["models"]["answer_model"] == str(out)
    records = [json.loads(line) for line in (report / "questions.jsonl").read_text().splitlines()]
    assert [r["path"] for r in records] == ["graph", "graph"] and all(r["online_tokens"] > r["context_tokens"] > 0 for r in records)


def test_a_missing_folder_or_an_unreachable_hub_repo_is_one_clear_error(tmp_path) -> None:
    with pytest.raises(InputError, match="missing: no such folder"):
        QGMemPredictor.from_pretrained(tmp_path / "missing")
    with pytest.raises(ModelUnavailableError, match="export 'me/not-cached' unavailable") as failure:
        QGMemPredictor.from_pretrained("me/not-cached")
    assert "\n" not in str(failure.value)


def test_the_predictor_package_reads_top_down() -> None:
    """No module of qgmem_train.predictor imports one that imports it back (type-checking imports included)."""
    import qgmem_train.predictor as package

    folder = Path(package.__file__).parent
    imports = {
        path.stem: {
            node.module.rpartition(".")[2]
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("qgmem_train.predictor.")
        }
        for path in folder.glob("*.py")
        if path.stem != "__init__"
    }

    def reaches(start: str, goal: str, seen: frozenset[str] = frozenset()) -> bool:
        return any(nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt})) for nxt in imports.get(start, ()))

    assert [name for name in imports if reaches(name, name)] == []
