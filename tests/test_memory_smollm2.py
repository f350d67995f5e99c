"""The LLM stages with the real CPU model: SmolLM2 extraction into the store, and one trace trajectory."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from qgmem_train.config import PipelineConfig
from qgmem_train.llm.structured import ParseStats
from qgmem_train.memory.construct import build_conversation, embed_units
from qgmem_train.memory.loaders import load_conversations
from qgmem_train.memory.store import MemoryStore, WindowResult
from qgmem_train.memory.traces import consolidate_traces
from qgmem_train.memory.types import Conversation, MemoryUnit, Session
from qgmem_train.memory.windows import session_windows
from qgmem_train.text import tokenize

SAMPLE = Path(__file__).resolve().parents[1] / "samples" / "locomo_sample.json"


@pytest.mark.slow
def test_smollm2_extracts_two_locomo_windows_into_the_store(tmp_path: Path, smollm2, minilm) -> None:
    (conv,) = load_conversations("locomo", SAMPLE)
    session = conv.sessions[0]
    short = Conversation(conv.id, [Session(session.id, session.time, session.turns[:10])])  # two windows: 6 new, then 4 new
    cfg = PipelineConfig()
    cfg.generation.max_new_tokens = 128  # at 64 the second window's reply is cut inside its first unit and lost
    cfg.construction.window_batch_size = 2
    cfg.construction.traces = False

    with MemoryStore.open(tmp_path / "store", create=True) as store:
        report = build_conversation(store, short, cfg, minilm, llm=smollm2)
        memory = store.load_namespace(conv.id)
        assert len(store.done_windows(conv.id)) == 2

    assert memory.units, "SmolLM2 extracted no unit from two windows of dialogue"
    assert report.windows_built == 2 and report.units == len(memory.units)
    parse = report.parse
    assert parse["requested"] >= 2 and parse["valid"] + parse["dropped"] == parse["requested"]
    windows = session_windows(short.sessions[0], 6, 2)
    for unit in memory.units:
        window = next(w for w in windows if unit.id.startswith(w.new[0].id + "#"))
        assert set(unit.source_turn_ids) <= set(window.turn_ids) and set(unit.source_turn_ids) & window.new_ids
        assert unit.utterance_time == "2023-05-08T13:56:00" and unit.fact_text and unit.source_text
    grounded = [u for u in memory.units if len(set(tokenize(u.fact_text)) & set(tokenize(u.source_text))) >= 2]
    assert grounded, "no unit's fact text restates its evidence"
    np.testing.assert_allclose(np.linalg.norm(memory.fact_embeddings, axis=1), 1.0, atol=1e-5)


@pytest.mark.slow
def test_smollm2_writes_a_trace_trajectory(tmp_path: Path, smollm2, minilm) -> None:
    def unit(uid: str, serial: int, city: str, said: str) -> MemoryUnit:
        return MemoryUnit(uid, "s", f"Alex lives in {city}.", "Alex", "lives in", city, [uid], f"Alex: I live in {city}.", said, serial)

    units = [unit("u0", 0, "Lisbon", "2023-01-10"), unit("u1", 1, "Porto", "2023-06-10")]
    cfg = PipelineConfig()
    cfg.generation.max_new_tokens = 48
    stats = ParseStats()
    with MemoryStore.open(tmp_path / "store", create=True) as store:
        store.ensure_namespace("n", "llm", minilm.model_id, minilm.dim)
        store.add_windows("n", [WindowResult("s", 0, embed_units(units, minilm, 8))])
        assert consolidate_traces(store, "n", cfg, smollm2, stats) == 1
        (trace,) = store.load_traces("n")
    assert stats.requested == 1 and stats.valid + stats.dropped == 1
    assert trace.member_ids == ["u0", "u1"] and trace.current_id == "u1" and trace.trajectory.strip()
