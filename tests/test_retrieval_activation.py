"""Activation end to end on a small crafted namespace with MiniLM; rerankers; serialization."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from qgmem_train.answer.memory_context import cited_unit_ids, serialize_working_memory
from qgmem_train.config import RetrievalConfig
from qgmem_train.llm.prompts import RERANK
from qgmem_train.memory.store import AttributeIndex, NamespaceMemory
from qgmem_train.memory.types import MemoryUnit, TimeSpan, Trace, Turn
from qgmem_train.retrieval.activation import ActivationIndex, activate
from qgmem_train.retrieval.intent import parse_intents
from qgmem_train.retrieval.rerank import CrossEncoderReranker, LLMReranker, rerank_document
from tests.fakes import ScriptedLLM

FACTS = [
    ("D1:1", "Caroline", "went to", "an LGBTQ support group", "Caroline went to an LGBTQ support group yesterday.", ["LGBTQ support group"], [], "2023-05-07"),
    ("D1:2", "Melanie", "painted", "a sunrise", "Melanie painted a sunrise over the lake last year.", ["sunrise"], ["lake"], None),
    ("D2:1", "Caroline", "plans", "to study counseling", "Caroline plans to study counseling and mental health.", ["counseling"], [], None),
    ("D2:2", "Melanie", "took", "her kids camping", "Melanie took her kids camping in the mountains.", ["kids"], ["mountains"], None),
    ("D3:1", "Caroline", "plans", "to adopt children", "Caroline now plans to adopt children as a single parent.", ["adoption"], [], None),
    ("D3:2", "Melanie", "runs", "a pottery class", "Melanie runs a pottery class on Fridays.", ["pottery class"], ["studio"], None),
]


def make_memory(embedder) -> NamespaceMemory:
    """Six units of two speakers over three sessions, two of them in one trace, embedded with ``embedder``."""
    units, turns, turn_time = [], {}, {}
    attr_rows, attr_kind, attr_text = [], [], []
    for row, (tid, subj, pred, obj, text, entities, locations, fact_day) in enumerate(FACTS):
        utterance = f"2023-0{5 + int(tid[1]) - 1}-08"
        turns[tid] = Turn(tid, subj, text)
        turn_time[tid] = utterance
        units.append(MemoryUnit(
            id=f"u{row}", session_id=f"session_{tid[1]}", fact_text=text, subject=subj, predicate=pred, object=obj,
            source_turn_ids=[tid], source_text=f"{subj}: {text}", utterance_time=utterance, serial=row,
            fact_time=[TimeSpan(fact_day, fact_day)] if fact_day else [], entities=entities, locations=locations,
        ))
        for kind, values in ((0, entities), (1, locations)):
            for value in values:
                attr_rows.append(row)
                attr_kind.append(kind)
                attr_text.append(value)
    trace = Trace(id="t0", relation_text="Caroline plans", member_ids=["u2", "u4"],
                  trajectory="Caroline first planned to study counseling; she now plans to adopt children.", current_id="u4")
    return NamespaceMemory(
        namespace="demo", units=units, fact_embeddings=embedder.encode([u.fact_text for u in units]),
        attributes=AttributeIndex(np.array(attr_rows, np.int64), np.array(attr_kind, np.int8), attr_text, embedder.encode(attr_text)),
        traces=[trace], trace_of={"u2": "t0", "u4": "t0"}, turns=turns, turn_time=turn_time, embedder_id=embedder.model_id,
    )


@pytest.fixture(scope="module")
def memory(minilm) -> NamespaceMemory:
    return make_memory(minilm)


def test_activation_without_reranker_finds_the_evidence(memory, minilm) -> None:
    cfg = RetrievalConfig(n=5, k=3)
    wm = activate("What did Melanie paint?", "2023-08-01", memory, cfg=cfg, llm=None, embedder=minilm, reranker=None)
    assert wm.units[0].id == "u1" and len(wm.units) == 3
    assert set(wm.channels) == {"bm25", "dense", "attr"} and wm.channels["bm25"][0] == "u1"
    assert wm.fused[:3] == [u.id for u in wm.units] and wm.reranked == wm.fused
    assert wm.intent.entities == ["Melanie"] and wm.reranker == "none"
    assert {"intent", "embed", "bm25", "dense", "attr", "fusion", "rerank"} <= set(wm.timings)
    dense_only = activate("Who went hiking in the mountains?", None, memory, cfg=RetrievalConfig(n=5, k=2, channels=["dense"]),
                          llm=None, embedder=minilm, reranker=None)
    assert list(dense_only.channels) == ["dense"] and dense_only.units[0].id == "u3"


def test_bm25_document_carries_the_preceding_turn_of_the_same_session(memory, minilm) -> None:
    ordered = replace(memory, previous_turn={"D1:2": "D1:1", "D2:2": "D2:1", "D3:2": "D3:1"})
    question = "Who talked about the support group?"

    def bm25_ids(context_turns: int, namespace: NamespaceMemory) -> list[str]:
        cfg = RetrievalConfig(channels=["bm25"], lexical_context_turns=context_turns)
        return activate(question, None, namespace, cfg=cfg, llm=None, embedder=minilm, reranker=None).channels["bm25"]

    assert bm25_ids(1, ordered) == ["u0", "u1"]
    assert bm25_ids(0, ordered) == bm25_ids(1, memory) == ["u0"]


def joined_document(memory: NamespaceMemory, unit: MemoryUnit, count: int) -> str:
    """What BM25 indexes of ``unit``, written out: its fact, its source text when that differs, then its ``count``
    preceding turns of the same session as ``Speaker: text`` lines."""
    lines, turn_id = [], unit.source_turn_ids[0]
    while len(lines) < count and (turn_id := memory.previous_turn.get(turn_id)) is not None:
        turn = memory.turns[turn_id]
        lines.insert(0, f"{turn.speaker}: {turn.text}")
    parts = [unit.fact_text, *([unit.source_text] if unit.source_text.strip() != unit.fact_text.strip() else []), "\n".join(lines)]
    return " ".join(p for p in parts if p)


def test_bm25_index_tokenizes_each_turn_once_with_the_scores_of_the_joined_documents(memory, minilm, monkeypatch) -> None:
    """A turn is the context of the units after it: tokenized once, not once per unit, with the terms of the joined text."""
    from qgmem_train.memory import search_terms
    from qgmem_train.retrieval.lexical import BM25Index
    from qgmem_train.text import tokenize

    chain = {"D1:2": "D1:1", "D2:1": "D1:2", "D2:2": "D2:1", "D3:1": "D2:2", "D3:2": "D3:1"}  # one long session
    ordered = replace(memory, previous_turn=chain)

    tokenized: list[str] = []
    monkeypatch.setattr(search_terms, "tokenize", lambda text: tokenized.append(text) or tokenize(text))
    query = tokenize("Caroline Melanie support group sunrise counseling kids camping pottery adopt")
    for count in (0, 1, 3):
        tokenized.clear()
        index = ActivationIndex(ordered, RetrievalConfig(channels=["bm25"], lexical_context_turns=count), minilm)
        expected = BM25Index.from_tokens([tokenize(joined_document(ordered, u, count)) for u in ordered.units])
        np.testing.assert_allclose(index.bm25.scores(query), expected.scores(query), rtol=1e-6)
        units_text = sum(len(joined_document(ordered, u, 0)) for u in ordered.units)
        turns_text = sum(len(f"{t.speaker}: {t.text}") for t in ordered.turns.values()) if count else 0
        assert sum(map(len, tokenized)) <= units_text + turns_text, f"a turn tokenized more than once ({count} context turns)"


def _strip_stored_terms(store) -> None:
    """Rewrite every segment of ``store`` as the layout before stored terms wrote it: its columns without ``terms.*``."""
    from qgmem_train.memory.columns import pack_arrays, unpack_arrays

    db = store._db
    keys = db.execute("SELECT DISTINCT namespace, kind, seq FROM segment_parts WHERE part = 'columns'").fetchall()
    with store.transaction():
        for namespace, kind, seq in keys:
            where = "namespace = ? AND kind = ? AND seq = ? AND part = 'columns'"
            blob = b"".join(r[0] for r in db.execute(f"SELECT data FROM segment_parts WHERE {where} ORDER BY piece", (namespace, kind, seq)))
            arrays = {name: a for name, a in unpack_arrays(blob).items() if not name.startswith("terms.")}
            assert len(arrays) < len(unpack_arrays(blob)), "the segment stored terms"
            db.execute(f"DELETE FROM segment_parts WHERE {where}", (namespace, kind, seq))
            db.execute("INSERT INTO segment_parts VALUES (?, ?, ?, 'columns', 0, ?)", (namespace, kind, seq, pack_arrays(arrays)))


@pytest.mark.parametrize("stored", ["current", "absent", "stale"])
def test_a_loaded_namespace_indexes_bm25_from_the_terms_its_segments_store(tmp_path: Path, monkeypatch, stored: str) -> None:
    """Units and turns are tokenized when written and their terms kept through merges and rewrites, so a loaded namespace
    builds its BM25 index without tokenizing; terms a store lacks (older layout) or of another tokenizer are made anew."""
    from qgmem_train.memory import search_terms
    from qgmem_train.memory.store import MemoryStore, WindowResult
    from qgmem_train.memory.types import Conversation, Session
    from qgmem_train.retrieval.lexical import BM25Index
    from qgmem_train.text import tokenize
    from tests.test_store_columns import DIM, _embedded, _unit, _write

    rng = np.random.default_rng(5)
    items = [_embedded(_unit(i), rng) for i in range(70)]  # 35 writes of units: merged segments and newer ones
    speakers = ("Alex", "Sam")
    sessions = [Session(f"s{k}", None, [Turn(f"t{j}", speakers[j % 2], f"Turn {j}: Biscuit ran to place {j % 7}.") for j in range(10 * k, 10 * k + 10)])
                for k in range(8)]  # fmt: skip
    with MemoryStore.open(tmp_path, create=True) as store:
        if stored == "stale":  # written by a tokenizer since changed: its terms are not this code's
            monkeypatch.setattr(search_terms, "tokenize", lambda text: ["stale"])
            monkeypatch.setattr(search_terms, "TERMS_VERSION", "older")
        store.ensure_namespace("n", "llm", "four-d", DIM)
        for k in range(len(sessions)):  # eight writes of turns: one merge
            store.put_turns("n", Conversation("c", sessions[: k + 1]))
        _write(store, items)
        store.add_windows("n", [WindowResult("s", 1, [_embedded(_unit(3, text="Alex met Biscuit at the lighthouse."), rng)])])
        monkeypatch.undo()
        if stored == "absent":
            _strip_stored_terms(store)
        memory = store.load_namespace("n")
    assert any(u.fact_text == "Alex met Biscuit at the lighthouse." for u in memory.units)
    expected = {count: BM25Index.from_tokens([tokenize(joined_document(memory, u, count)) for u in memory.units]) for count in (0, 1, 3)}
    tokenized: list[str] = []
    monkeypatch.setattr(search_terms, "tokenize", lambda text: tokenized.append(text) or tokenize(text))
    for count, joined in expected.items():
        index = ActivationIndex(memory, RetrievalConfig(channels=["bm25"], lexical_context_turns=count), None)
        for query in ("Biscuit lighthouse", "place 3 fun", "turn 12 Sam", "Alex went"):
            np.testing.assert_allclose(index.bm25.scores(tokenize(query)), joined.scores(tokenize(query)), rtol=1e-6, err_msg=f"{count} turns: {query}")
    assert (not tokenized) == (stored == "current"), f"{len(tokenized)} texts tokenized at load ({stored} terms)"


class _ReverseReranker:
    """Scores the pool in reverse of its given order: a reranker that disagrees with the fusion everywhere."""

    name, model_id = "reverse", "reverse"

    def score(self, query: str, documents: list[str]) -> np.ndarray:
        return np.arange(len(documents), dtype=np.float32)


def test_rerank_mode_replace_takes_the_reranker_order_and_rrf_fuses_it_with_the_pool(memory, minilm) -> None:
    def run(mode: str):
        cfg = RetrievalConfig(n=6, k=6, rerank_mode=mode, drop_superseded=False)
        return activate("What did Melanie paint?", None, memory, cfg=cfg, llm=None, embedder=minilm, reranker=_ReverseReranker())

    replaced, fused = run("replace"), run("rrf")
    assert replaced.fused == fused.fused and len(replaced.fused) == 6
    assert replaced.reranked == replaced.fused[::-1]
    expected = {uid: 1 / (60 + i + 1) + 1 / (60 + len(fused.fused) - i) for i, uid in enumerate(fused.fused)}
    assert fused.scores == pytest.approx(sorted(expected.values(), reverse=True))
    assert fused.reranked[0] in (fused.fused[0], fused.fused[-1]) and set(fused.reranked) == set(fused.fused)


def test_rerank_mode_blend_adds_the_fused_rank_prior_to_standardized_scores(memory, minilm) -> None:
    def run(prior: float):
        cfg = RetrievalConfig(n=6, k=6, rerank_mode="blend", rerank_prior=prior, drop_superseded=False)
        return activate("What did Melanie paint?", None, memory, cfg=cfg, llm=None, embedder=minilm, reranker=_ReverseReranker())

    scores = np.arange(6, dtype=np.float64)
    standardized = (scores - scores.mean()) / scores.std()
    blended = run(2.0)
    expected = {uid: standardized[i] - 2.0 * np.log1p(i) for i, uid in enumerate(blended.fused)}
    assert blended.reranked == sorted(expected, key=lambda uid: -expected[uid])
    assert blended.scores == pytest.approx(sorted(expected.values(), reverse=True))
    assert blended.reranked[0] == blended.fused[0]
    alone = run(0.0)
    assert alone.reranked == alone.fused[::-1]


class _RecordingReverse(_ReverseReranker):
    """The reverse reranker, recording how many documents each call scored."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def score(self, query: str, documents: list[str]) -> np.ndarray:
        self.sizes.append(len(documents))
        return super().score(query, documents)


class _CompactReader(_RecordingReverse):
    """The reverse reranker of a model trained on compact documents, recording the documents it is given."""

    document_layout = "compact"

    def __init__(self) -> None:
        super().__init__()
        self.documents: list[str] = []

    def score(self, query: str, documents: list[str]) -> np.ndarray:
        self.documents += documents
        return super().score(query, documents)


def test_the_reranker_is_given_documents_in_the_layout_it_was_trained_on(memory, minilm) -> None:
    cfg = RetrievalConfig(n=6, k=6, rerank_mode="replace", drop_superseded=False)
    compact, fields = _CompactReader(), _RecordingReverse()
    wm = activate("What did Melanie paint?", None, memory, cfg=cfg, llm=None, embedder=minilm, reranker=compact)
    activate("What did Melanie paint?", None, memory, cfg=cfg, llm=None, embedder=minilm, reranker=fields)
    units = {u.id: u for u in memory.units}
    index = ActivationIndex(memory, cfg, minilm)
    assert compact.documents == [index.document(units[uid], "compact") for uid in wm.fused]
    assert compact.documents != [index.document(units[uid]) for uid in wm.fused] and fields.sizes == [6]


def test_a_context_document_carries_the_turn_before_in_the_units_session(memory, minilm) -> None:
    cfg = RetrievalConfig(n=6, k=6)
    index = ActivationIndex(replace(memory, previous_turn={"D1:2": "D1:1", "D2:2": "D2:1"}), cfg, minilm)
    units = {u.id: u for u in memory.units}
    assert index.document(units["u1"], "context") == rerank_document(units["u1"], layout="context", before=memory.turns["D1:1"])
    assert index.document(units["u1"], "context").endswith("Turn before: Caroline: Caroline went to an LGBTQ support group yesterday.")
    assert index.document(units["u0"], "context") == index.document(units["u0"], "compact")
    assert "Turn before" not in index.document(units["u1"], "compact")


@pytest.mark.parametrize("mode", ["replace", "rrf", "blend"])
def test_rerank_top_scores_only_the_first_m_of_the_pool_and_leaves_the_rest_in_fused_order(memory, minilm, mode: str) -> None:
    def run(top: int | None):
        reranker = _RecordingReverse()
        cfg = RetrievalConfig(n=6, k=6, rerank_mode=mode, rerank_top=top, drop_superseded=False)
        return activate("What did Melanie paint?", None, memory, cfg=cfg, llm=None, embedder=minilm, reranker=reranker), reranker.sizes

    (head, head_sizes), (whole, whole_sizes) = run(3), run(None)
    assert head_sizes == [3] and whole_sizes == [6] and head.fused == whole.fused
    assert head.reranked[3:] == head.fused[3:] and sorted(head.reranked[:3]) == sorted(head.fused[:3])
    assert len(head.scores) == 6 and head.scores[3:] == pytest.approx(whole_scores_of_fused(memory, minilm)[3:])
    if mode == "replace":
        assert head.reranked[:3] == head.fused[2::-1]
    assert run(6)[0].reranked == whole.reranked and run(8)[1] == [6]


def whole_scores_of_fused(memory, minilm) -> list[float]:
    """The RRF scores of the fused pool, no reranker."""
    cfg = RetrievalConfig(n=6, k=6, drop_superseded=False)
    return activate("What did Melanie paint?", None, memory, cfg=cfg, llm=None, embedder=minilm, reranker=None).scores


def test_rerank_document_holds_every_field(memory, minilm) -> None:
    index = ActivationIndex(memory, RetrievalConfig(), minilm)
    doc = rerank_document(memory.units[4], index.trajectory_of(memory.units[4]))
    for part in ("Fact: Caroline now plans", "Source dialogue: Caroline:", "Entities: adoption", "Locations: none",
                 "Fact time: unknown", "Utterance time: 2023-07-08", "Trajectory: Caroline first planned"):
        assert part in doc
    assert "Fact time: 2023-05-07" in rerank_document(memory.units[0]) and "Trajectory" not in rerank_document(memory.units[0])


def test_llm_reranker_scores_a_small_pool_with_smollm2(memory, minilm, smollm2) -> None:
    reranker = LLMReranker(smollm2, batch_size=4)
    docs = [rerank_document(u) for u in memory.units[:2]]
    scores = reranker.score("What did Melanie paint?", docs)
    assert scores.shape == (2,) and np.all((scores > 0) & (scores < 1))
    wm = activate("What did Melanie paint?", None, memory, cfg=RetrievalConfig(n=3, k=2), llm=None, embedder=minilm, reranker=reranker)
    assert wm.reranker == "llm" and sorted(wm.reranked) == sorted(wm.fused) and len(wm.units) == 2
    assert wm.scores == sorted(wm.scores, reverse=True)


def test_llm_reranker_renders_the_qwen3_reranker_prompt() -> None:
    llm = ScriptedLLM([], yes_scores=lambda chat: 0.9 if "sunrise" in chat[-1]["content"] else 0.1)
    scores = LLMReranker(llm, batch_size=2).score("q?", ["a sunrise", "b", "c"])
    assert scores.tolist() == pytest.approx([0.9, 0.1, 0.1])
    assert llm.calls == [] and RERANK.render(instruction="i", query="q", document="d")[1]["content"].startswith("<Instruct>: i\n<Query>: q")


def tiny_cross_encoder(folder: Path) -> Path:
    """A one-layer, 16-wide BERT cross-encoder with a 13-word vocabulary, saved into ``folder``."""
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "melanie", "paint", "sunrise", "caroline", "group", "?", "what", "did"]
    (folder / "vocab.txt").write_text("\n".join(vocab))
    BertTokenizerFast(str(folder / "vocab.txt")).save_pretrained(folder)
    config = BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, num_labels=1)
    BertForSequenceClassification(config).save_pretrained(folder)
    return folder


def test_cross_encoder_reranker_runs_a_local_model(tmp_path) -> None:
    from sentence_transformers import CrossEncoder

    tiny_cross_encoder(tmp_path)
    assert isinstance(CrossEncoder(str(tmp_path)), CrossEncoder)
    scores = CrossEncoderReranker(str(tmp_path), device="cpu").score("what did melanie paint?", ["melanie paint sunrise", "caroline group"])
    assert scores.shape == (2,) and np.isfinite(scores).all()


@pytest.mark.slow
def test_onnxruntime_reranker_threads_sleep_between_operators_instead_of_spinning(tmp_path) -> None:
    """Spinning threads burn a core between operators and batches; on a shared CPU that is time taken from the next batch."""
    import torch

    from qgmem_train.retrieval.onnx_rerank import OnnxCrossEncoderReranker

    (tmp_path / "model").mkdir()
    folder = tiny_cross_encoder(tmp_path / "model")
    reranker = OnnxCrossEncoderReranker(str(folder), cache_dir=str(tmp_path / "cache"))
    options = reranker.session.get_session_options()
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert options.intra_op_num_threads == 1 and reranker.workers == torch.get_num_threads(), "one thread a batch, batches side by side"
    documents = ["melanie paint sunrise", "caroline group", "what did caroline paint"]
    np.testing.assert_allclose(reranker.score("what did melanie paint?", documents),
                               CrossEncoderReranker(str(folder), device="cpu").score("what did melanie paint?", documents), atol=1e-5)


@pytest.mark.slow
def test_onnxruntime_reranker_scores_batches_side_by_side_with_the_scores_of_one_at_a_time(tmp_path) -> None:
    """Small batches use one core each better than two cores together; each pair keeps the score its batch gives it."""
    import threading
    import time

    from qgmem_train.retrieval.onnx_rerank import OnnxCrossEncoderReranker

    (tmp_path / "model").mkdir()
    folder = tiny_cross_encoder(tmp_path / "model")
    documents = [" ".join(["melanie paint sunrise caroline group"] * (i % 5 + 1)) for i in range(20)]
    alone = OnnxCrossEncoderReranker(str(folder), batch_size=4, cache_dir=str(tmp_path / "cache"), workers=1)
    together = OnnxCrossEncoderReranker(str(folder), batch_size=4, cache_dir=str(tmp_path / "cache"), workers=2)
    session, lock, running, most = together.session, threading.Lock(), [0], [0]

    class Overlapping:
        def run(self, outputs: object, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
            time.sleep(0.05)
            try:
                return session.run(outputs, feed)
            finally:
                with lock:
                    running[0] -= 1

    together.session = Overlapping()
    assert together.score("what did melanie paint?", documents).tolist() == alone.score("what did melanie paint?", documents).tolist()
    assert most[0] == 2, "two batches ran at once"


@pytest.mark.parametrize("runtime", ["torch", "onnxruntime"])
def test_reranker_max_length_cuts_every_pair_at_inference(tmp_path, runtime: str) -> None:
    """``models.reranker_max_length`` sets the token budget of a pair in either runtime, below the one the model was saved with."""
    from qgmem_train.config import PipelineConfig
    from qgmem_train.retrieval.rerank import build_reranker

    (tmp_path / "model").mkdir()
    cfg = PipelineConfig()
    cfg.models.reranker, cfg.models.reranker_model, cfg.models.device = "cross", str(tiny_cross_encoder(tmp_path / "model")), "cpu"
    cfg.models.reranker_runtime, cfg.models.cache_dir, cfg.models.reranker_max_length = runtime, str(tmp_path / "cache"), 16
    documents = [" ".join(["melanie paint sunrise"] * 12), "caroline group"]
    cut = build_reranker(cfg)
    assert cut.cross_encoder.max_seq_length == 16
    assert int(cut.cross_encoder.preprocess([("what did melanie paint?", documents[0])])["attention_mask"].sum()) == 16
    cfg.models.reranker_max_length = None
    whole = build_reranker(cfg)
    assert whole.cross_encoder.max_seq_length > 16
    scores = cut.score("what did melanie paint?", documents)
    assert scores.shape == (2,) and scores[1] == pytest.approx(whole.score("what did melanie paint?", documents)[1], abs=1e-5)


def test_serialization_clusters_then_facts_with_labels(memory) -> None:
    units = [memory.units[i] for i in (4, 1, 2, 0)]
    context = serialize_working_memory(units, memory, ScriptedLLM([]))
    lines = context.text.splitlines()
    assert lines[0] == "Evidence Clusters:" and lines[1] == "Cluster 1 (relation: Caroline plans)"
    assert lines[2].startswith("trajectory: Caroline first planned")
    assert lines[3].startswith("[MU1] (utterance_time: 2023-06-08; fact_time: unknown) Caroline plans to study")
    assert lines[4].startswith("[MU2] (utterance_time: 2023-07-08")
    assert lines[5] == "Facts:"
    assert lines[6] == ("[F1] Melanie | painted | a sunrise (utterance_time: 2023-05-08; fact_time: unknown) "
                        "Melanie painted a sunrise over the lake last year.")
    assert lines[7].startswith("[F2] Caroline | went to | an LGBTQ support group (utterance_time: 2023-05-08; fact_time: 2023-05-07)")
    assert context.labels == {"MU1": "u2", "MU2": "u4", "F1": "u1", "F2": "u0"}
    assert context.n_tokens == len(context.text.split())
    assert cited_unit_ids("F2 and MU2 say so; F2 again; F9 unknown", context.labels) == ["u0", "u4"]
    none = serialize_working_memory([memory.units[1]], memory)
    assert none.text.splitlines()[:2] == ["Evidence Clusters:", "(none)"]


def test_intent_parsing_paths() -> None:
    llm = ScriptedLLM(['{"entities": ["Melanie"], "locations": ["lake"], "time": {"fact": ["2022"], "utterance": []}}', "no json", "still none"])
    good, dropped = parse_intents([("What did Melanie paint at the lake in 2022?", "2023-08-01"), ("Where is Caroline?", None)], llm)
    assert good.entities == ["Melanie"] and good.locations == ["lake"] and good.parser == "llm"
    assert (good.fact_times[0].start, good.fact_times[0].end) == ("2022-01-01", "2022-12-31")
    assert dropped.parser == "rules-fallback" and dropped.entities == ["Caroline"]


def test_an_activation_index_over_a_loaded_namespace_builds_no_unit_and_scores_as_over_the_units(tmp_path: Path) -> None:
    """The index reads ids, texts, fact times and utterance days from the loaded columns: building every unit object
    took most of the index's build time at 100k units, and a question reads only the few it activates."""
    from qgmem_train.memory.store import MemoryStore
    from qgmem_train.retrieval.intent import QueryIntent
    from tests.test_store_columns import DIM, _embedded, _text_vector, _unit, _write

    rng = np.random.default_rng(7)
    items = [_embedded(_unit(i), rng) for i in range(24)]
    with MemoryStore.open(tmp_path, create=True) as store:
        store.ensure_namespace("n", "llm", "four-d", DIM)
        _write(store, items)
        loaded = store.load_namespace("n")
    cfg = RetrievalConfig(lexical_context_turns=0)
    index = ActivationIndex(loaded, cfg, None)
    assert all(unit is None for unit in loaded.units._units), "a unit was built"
    in_memory = ActivationIndex(replace(loaded, units=list(loaded.units)), cfg, None)
    entity = _text_vector("Biscuit")[None, :]
    for intent in (QueryIntent(fact_times=[TimeSpan("2024-04-01", "2024-04-30", "month")]), QueryIntent(utterance_times=[TimeSpan("2024-05-01", "2024-05-01")]),
                   QueryIntent(entities=["Biscuit"], fact_times=[TimeSpan("2024-04-02", "2024-04-02")])):  # fmt: skip
        entities = entity if intent.entities else np.zeros((0, DIM), np.float32)
        ours, theirs = (i.attributes.scores(intent, entities, np.zeros((0, DIM), np.float32)) for i in (index, in_memory))
        assert ours.any(), intent
        np.testing.assert_array_equal(ours, theirs)
    assert [index.current_of(u) for u in loaded.units] == [in_memory.current_of(u) for u in loaded.units]
