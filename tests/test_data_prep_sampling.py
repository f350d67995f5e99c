"""Sampling over categories: proportions, determinism, shards and case discovery in both layouts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from data_prep.convomem import discover_cases, load_case
from data_prep.sampling import CaseRef, quotas, sample_cases, shard_of
from qgmem_train.errors import InputError

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "samples" / "convomem_cases"


def test_paper_quotas_are_5_3_4_over_1200() -> None:
    assert quotas({"user_evidence": 5, "assistant_facts_evidence": 3, "changing_evidence": 4}, 1200) == {
        "user_evidence": 500,
        "assistant_facts_evidence": 300,
        "changing_evidence": 400,
    }


def test_quotas_sum_to_total_with_largest_remainders() -> None:
    got = quotas({"a": 5, "b": 3, "c": 4}, 7)
    assert sum(got.values()) == 7
    assert got == {"a": 3, "b": 2, "c": 2}


def _pool(n: int) -> dict[str, list[CaseRef]]:
    return {c: [CaseRef(c, f"{c}/f{i}.json") for i in range(n)] for c in ("a", "b", "c")}


def test_sampling_is_deterministic_and_proportional() -> None:
    first, counts = sample_cases(_pool(50), {"a": 5, "b": 3, "c": 4}, 24, seed=7)
    again, _ = sample_cases(_pool(50), {"a": 5, "b": 3, "c": 4}, 24, seed=7)
    other, _ = sample_cases(_pool(50), {"a": 5, "b": 3, "c": 4}, 24, seed=8)
    assert first == again
    assert first != other
    assert {c: sum(r.category == c for r in first) for c in "abc"} == {"a": 10, "b": 6, "c": 8}
    assert counts["a"] == {"quota": 10, "available": 50, "drawn": 10}
    assert len({r.case_id for r in first}) == 24


def test_short_category_gives_what_it_has() -> None:
    pool = _pool(50)
    pool["b"] = pool["b"][:2]
    drawn, counts = sample_cases(pool, {"a": 1, "b": 1}, 10, seed=0)
    assert counts["b"] == {"quota": 5, "available": 2, "drawn": 2}
    assert len(drawn) == 7


def test_unknown_category_is_refused() -> None:
    with pytest.raises(KeyError, match="zz"):
        sample_cases(_pool(3), {"zz": 1}, 2, seed=0)


def test_shards_partition_the_cases() -> None:
    cases, _ = sample_cases(_pool(20), {"a": 1, "b": 1, "c": 1}, 30, seed=0)
    parts = [shard_of(cases, i, 4) for i in range(4)]
    assert sorted(r.case_id for p in parts for r in p) == sorted(r.case_id for r in cases)
    assert shard_of(cases, 1, 4) == parts[1]
    with pytest.raises(ValueError):
        shard_of(cases, 4, 4)


def test_discovers_test_cases_layout_and_loads_a_case() -> None:
    found = discover_cases(SAMPLE, ["category_1_basic_facts", "category_2_temporal"])
    assert [len(found[c]) for c in ("category_1_basic_facts", "category_2_temporal")] == [2, 2]
    case = load_case(SAMPLE, found["category_2_temporal"][0], max_questions=1, max_sessions=1)
    assert len(case.questions) == 1
    assert [s.id for s in case.conversation.sessions] == case.questions[0].evidence_sessions[:1]
    assert case.questions[0].evidence_texts


def test_discovers_hub_layout_with_batched_files(tmp_path: Path) -> None:
    raw = json.loads((SAMPLE / "category_2_temporal" / "dataset_0.json").read_text())
    folder = tmp_path / "core_benchmark" / "pre_mixed_testcases" / "changing_evidence" / "2_evidence"
    folder.mkdir(parents=True)
    (folder / "batched_000.json").write_text(json.dumps([raw, raw]))
    found = discover_cases(tmp_path, ["changing_evidence"])
    assert [r.index for r in found["changing_evidence"]] == [0, 1]
    assert load_case(tmp_path, found["changing_evidence"][1], max_questions=None, max_sessions=None).questions


def test_malformed_case_names_file_record_and_field(tmp_path: Path) -> None:
    folder = tmp_path / "user_evidence"
    folder.mkdir()
    (folder / "bad.json").write_text(json.dumps({"evidenceItems": [{"question": "Q?"}], "conversations": []}))
    (ref,) = discover_cases(tmp_path, ["user_evidence"])["user_evidence"]
    with pytest.raises(InputError, match=r"bad\.json: evidenceItems\[0\]\.answer: missing or empty"):
        load_case(tmp_path, ref, max_questions=None, max_sessions=None)
    (folder / "bad.json").write_text("{not json")
    from data_prep import convomem

    convomem._read.cache_clear()
    with pytest.raises(InputError, match=r"bad\.json: not valid JSON"):
        discover_cases(tmp_path, ["user_evidence"])


@pytest.mark.parametrize(
    ("second_item", "needle"),
    [
        ({"question": "Q2?", "answer": "A2", "conversations": 5}, r"bad\.json: evidenceItems\[1\]\.conversations: must be a list"),
        ("not an item", r"bad\.json: evidenceItems\[1\]: expected an evidence-item object"),
    ],
)
def test_a_bad_item_past_the_question_cap_is_one_line(tmp_path: Path, second_item: object, needle: str) -> None:
    """Items past ``max_questions`` still lend their conversations to the haystack, so they are checked as well."""
    raw = json.loads((SAMPLE / "category_2_temporal" / "dataset_0.json").read_text())
    first = raw["evidenceItems"][0]
    folder = tmp_path / "user_evidence"
    folder.mkdir()
    (folder / "bad.json").write_text(json.dumps({"evidenceItems": [first, second_item]}))
    (ref,) = discover_cases(tmp_path, ["user_evidence"])["user_evidence"]
    with pytest.raises(InputError, match=needle) as refusal:
        load_case(tmp_path, ref, max_questions=1, max_sessions=None)
    assert "\n" not in str(refusal.value)
