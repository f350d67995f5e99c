"""Activation latency per query without LLM calls, on synthetic namespaces of 10k, 100k and 1M units.

Measures each channel (BM25, dense, attributes) and the fusion, p50 and p95 over random queries, on
one thread (numpy/BLAS, faiss and torch threads set to 1 before import), plus the memory the search
structures take, and our BM25 against rank_bm25's BM25Okapi on the same 100k documents and queries (a
ratio measured side by side). Query parsing, embedding and reranking are model calls and are left out.

The dense channel is also timed three ways side by side on the same queries: the float32 scan of every
vector, the int8 scan with exact float32 rescoring (what ``scan="auto"`` picks from 50k vectors on when it
encodes in memory), and the codes a store writes for the namespace's segments (merged segments of
32,768 units, product-quantised from 20k vectors a segment on, int8 below) with their rescoring, with the
share of the exact top 10 and top 100 each code scan returns. From 50k vectors on, the channel itself
searches the stored codes, as a namespace loaded from a store does.
``--locomo-store`` adds recall@10 on LoCoMo questions with each scan (dense channel alone and fused).
``--baseline REV`` times the attribute channel of git revision REV on the same queries in the same
process, next to this one, and counts the queries where both rank the same units. ``--graph`` adds the graph
channel (its walk from the fused order and the second fusion, timed as ``graph``) over the synthetic units'
entities and locations and a turn a unit (50 a session, each after the one before), with the walk settings of
``RetrievalConfig``; the three channels and the fusion are timed on the same queries without it.

    python bench/bench_activation.py                 # 10k, 100k, 1M (about 3 minutes, ~8 GB RAM)
    python bench/bench_activation.py --sizes 10000   # quick
    python bench/bench_activation.py --sentences-per-unit 0 3 --sizes 10000 100000   # turns-mode-like stores too
    python bench/bench_activation.py --sentences-per-unit 3 --locomo-store out/reranker/locomo_turns
    python bench/bench_activation.py --sizes 100000 --sentences-per-unit 3 --baseline main --name activation_attr_index
    python bench/bench_activation.py --sizes 10000 100000 --graph --name activation_graph

Facts from LLM extraction are one sentence each and have no sentence vectors; turns-mode units (whole
turns) average about three (LoCoMo), which the dense channel searches as well.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
import types  # noqa: E402
from datetime import date, timedelta  # noqa: E402
from pathlib import Path

from qgmem_train.reports import cpu_model  # noqa: E402

import numpy as np  # noqa: E402

from qgmem_train.config import RetrievalConfig  # noqa: E402
from qgmem_train.fileio import write_report_atomic  # noqa: E402
from qgmem_train.memory.segments import MAX_MERGED_ROWS  # noqa: E402
from qgmem_train.memory.store import AttributeIndex, NamespaceMemory  # noqa: E402
from qgmem_train.memory.types import MemoryUnit, TimeSpan  # noqa: E402
from qgmem_train.retrieval.activation import ActivationIndex, fuse_channels, search_channels  # noqa: E402
from qgmem_train.retrieval.dense import DenseIndex  # noqa: E402
from qgmem_train.retrieval.graph import GraphChannel, unit_graph  # noqa: E402
from qgmem_train.retrieval.intent import QueryIntent  # noqa: E402
from qgmem_train.retrieval.ranking import top_positive  # noqa: E402
from qgmem_train.text import tokenize  # noqa: E402
from qgmem_train.vector_codes import encode_blocks  # noqa: E402

VOCAB = 30_000
ENTITIES = 20_000
LOCATIONS = 2_000
DIM = 384
START = date(2022, 1, 1)
ACTIVATION_STEPS = ("bm25", "dense", "attr", "fusion", "channels+fusion")
"""What a query's activation is timed by: each channel, the fusion, and all of them (without the graph channel)."""
SESSION_TURNS = 50
"""Turns a synthetic session holds (a unit per turn), for the graph channel's turn links."""


def rss_mb() -> float:
    """Resident memory of this process in MB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def unit_vectors(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` random L2-normalised float32 rows, generated in chunks to bound peak memory."""
    out = np.empty((n, DIM), np.float32)
    for start in range(0, n, 100_000):
        block = rng.standard_normal((min(100_000, n - start), DIM), dtype=np.float32)
        block /= np.linalg.norm(block, axis=1, keepdims=True)
        out[start : start + len(block)] = block
    return out


def synthetic_memory(n: int, sentences_per_unit: int = 0, seed: int = 0) -> tuple[NamespaceMemory, list[str], np.ndarray, np.ndarray]:
    """A namespace of ``n`` units: Zipf-distributed words, one entity each, a location and a fact time for some,
    and ``sentences_per_unit`` extra dense vectors per unit."""
    rng = np.random.default_rng(seed)
    words = np.array([f"word{i}" for i in range(VOCAB)])
    zipf = 1.0 / np.arange(1, VOCAB + 1) ** 1.1
    zipf /= zipf.sum()
    lengths = rng.integers(8, 25, size=n)
    tokens = words[rng.choice(VOCAB, size=int(lengths.sum()), p=zipf)]
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    entity_of = rng.integers(0, ENTITIES, size=n)
    location_of = np.where(rng.random(n) < 0.3, rng.integers(0, LOCATIONS, size=n), -1)
    day_of = rng.integers(0, 730, size=n)
    dated = rng.random(n) < 0.3
    units = []
    for i in range(n):
        day = (START + timedelta(days=int(day_of[i]))).isoformat()
        units.append(MemoryUnit(
            id=f"u{i}", session_id=f"s{i // 50}", fact_text=" ".join(tokens[bounds[i] : bounds[i + 1]]),
            subject=f"entity{entity_of[i]}", predicate="did", object="something", source_turn_ids=[f"t{i}"],
            source_text="", utterance_time=day, serial=i,
            fact_time=[TimeSpan(day, day)] if dated[i] else [],
            entities=[f"entity{entity_of[i]}"], locations=[f"place{location_of[i]}"] if location_of[i] >= 0 else [],
        ))
    units_with_location = np.flatnonzero(location_of >= 0)
    entity_vectors, location_vectors = unit_vectors(rng, ENTITIES), unit_vectors(rng, LOCATIONS)
    attributes = AttributeIndex(
        unit_index=np.concatenate([np.arange(n), units_with_location]).astype(np.int64),
        kind=np.concatenate([np.zeros(n, np.int8), np.ones(len(units_with_location), np.int8)]),
        texts=[f"entity{e}" for e in range(ENTITIES)] + [f"place{p}" for p in range(LOCATIONS)],
        embeddings=np.concatenate([entity_vectors, location_vectors]),
        text_id=np.concatenate([entity_of, ENTITIES + location_of[units_with_location]]).astype(np.int64),
    )
    memory = NamespaceMemory(
        namespace="bench", units=units, fact_embeddings=unit_vectors(rng, n), attributes=attributes, traces=[],
        trace_of={}, turns={}, turn_time={}, embedder_id="synthetic",
        sentence_embeddings=unit_vectors(rng, n * sentences_per_unit), sentence_unit=np.repeat(np.arange(n, dtype=np.int64), sentences_per_unit),
    )
    query_words = [" ".join(words[rng.choice(2000, size=rng.integers(3, 8))]) for _ in range(1000)]
    return memory, query_words, entity_vectors, location_vectors


class LookupEmbedder:
    """Stands in for the embedder at index build: synthetic subjects ``entityN`` map to entity vector N."""

    def __init__(self, entity_vectors: np.ndarray):
        self.entity_vectors = entity_vectors

    def encode(self, texts: list[str]) -> np.ndarray:
        """The vectors of ``entityN`` texts."""
        return self.entity_vectors[[int(t.removeprefix("entity")) for t in texts]]


def percentiles(values: list[float]) -> dict[str, float]:
    """p50 and p95 in milliseconds."""
    ms = np.array(values) * 1000
    return {"p50_ms": round(float(np.percentile(ms, 50)), 2), "p95_ms": round(float(np.percentile(ms, 95)), 2)}


def baseline_attributes(revision: str):
    """The attribute channel's module as it was at git ``revision`` (loaded from ``git show``), to time side by side."""
    source = subprocess.run(["git", "show", f"{revision}:qgmem_train/retrieval/attributes.py"], check=True, capture_output=True,
                            text=True, cwd=Path(__file__).resolve().parents[1]).stdout  # fmt: skip
    module = types.ModuleType(f"attributes_at_{revision}")
    exec(compile(source, f"{revision}:qgmem_train/retrieval/attributes.py", "exec"), module.__dict__)
    return module


def synthetic_graph(memory: NamespaceMemory, index: ActivationIndex, links: list[str]) -> GraphChannel:
    """The graph channel over the synthetic units: their entities and locations, and a turn a unit, :data:`SESSION_TURNS` a session."""
    rows = np.arange(len(memory.units), dtype=np.int64)
    previous = np.where(rows % SESSION_TURNS > 0, rows - 1, -1)
    graph = unit_graph(memory.units, memory.attributes, [], {f"u{i}": i for i in rows.tolist()}, {f"t{i}": i for i in rows.tolist()}, previous, links)
    return GraphChannel(graph, index.attributes.texts, len(memory.attributes.texts))


def bench_size(
    n: int, queries: int, cfg: RetrievalConfig, compare_rank_bm25: bool, sentences_per_unit: int = 0, baseline: str | None = None,
    graph: bool = False,
) -> dict:
    """Latencies of every channel and the fusion on a namespace of ``n`` units (and of the attribute channel at ``baseline``)."""
    base = rss_mb()
    started = time.perf_counter()
    memory, query_words, entity_vectors, location_vectors = synthetic_memory(n, sentences_per_unit)
    generated = time.perf_counter()
    with_data = rss_mb()
    index = ActivationIndex(memory, cfg, LookupEmbedder(entity_vectors))
    stored = stored_codes_index(memory)
    if index.dense.scan == "int8":
        index.dense = stored
    if graph:
        index.graph = synthetic_graph(memory, index, cfg.graph_links)
    built = time.perf_counter()
    with_index = rss_mb()
    before = None
    if baseline:
        module = baseline_attributes(baseline)
        attributes = memory.attributes
        if cfg.subject_entities:
            attributes = module.with_subject_entities(attributes, memory.units, LookupEmbedder(entity_vectors))
        before = module.AttributeScorer(memory.units, attributes, sem_threshold=cfg.sem_threshold, utterance_fallback=cfg.utterance_day_fallback)
    same_attr_ranking = []
    rng = np.random.default_rng(1)
    timings: dict[str, list[float]] = {name: [] for name in ("bm25", "dense", "attr", "fusion", "channels+fusion", "dense_float32", "dense_int8", "dense_stored",
                                                              "attr_baseline", "channels+fusion_baseline", "graph", "channels+fusion+graph")}
    scans = dense_scans(memory, stored)
    agreement: dict[str, dict[str, list[float]]] = {scan: {"top10": [], "top100": []} for scan in ("int8", "stored")}
    for q in range(queries):
        target = int(rng.integers(n))
        query_vector = memory.fact_embeddings[target] + 0.5 * rng.standard_normal(DIM, dtype=np.float32)
        query_vector /= np.linalg.norm(query_vector)
        entity = int(memory.units[target].entities[0].removeprefix("entity"))
        day = memory.units[target].utterance_time
        intent = QueryIntent(
            entities=[f"entity{entity}"], locations=["place"] if q % 3 == 0 else [],
            fact_times=[TimeSpan(day, (date.fromisoformat(day) + timedelta(days=6)).isoformat())] if q % 2 == 0 else [],
        )
        locations = location_vectors[rng.integers(LOCATIONS)][None, :] if intent.locations else np.zeros((0, DIM), np.float32)
        ranked, step = timed_activation(index, cfg, query_words[q % len(query_words)], query_vector, intent, entity_vectors[entity][None, :], locations)
        for name in ACTIVATION_STEPS + (("graph", "channels+fusion+graph") if graph else ()):
            timings[name].append(step[name])
        if before is not None:
            lexical = index.bm25.scores(tokenize(query_words[q % len(query_words)]))
            attr_start = time.perf_counter()
            elt = before.scores(intent, entity_vectors[entity][None, :], locations)
            rows = top_positive(elt, cfg.n, tiebreak=lexical.__getitem__)[0]
            timings["attr_baseline"].append(time.perf_counter() - attr_start)
            timings["channels+fusion_baseline"].append(step["channels+fusion"] - step["attr"] + timings["attr_baseline"][-1])
            same_attr_ranking.append(rows.tolist() == ranked.get("attr", np.zeros(0)).tolist())
        found = {}
        for name, dense_index in scans.items():
            scan_start = time.perf_counter()
            found[name] = dense_index.search(query_vector, cfg.n)[0]
            timings[f"dense_{name}"].append(time.perf_counter() - scan_start)
        for scan, shares in agreement.items():
            for size in (10, 100):
                shares[f"top{size}"].append(len(set(found[scan][:size].tolist()) & set(found["float32"][:size].tolist())) / size)
    result = {
        "units": n,
        "sentences_per_unit": sentences_per_unit,
        "queries": queries,
        "latency": {name: percentiles(values) for name, values in timings.items() if values},
        "dense_scan": {"channel_uses": index.dense.scan, "stored_codes": scans["stored"].scan,
                       **{f"{scan}_share_of_exact": {k: round(float(np.mean(v)), 4) for k, v in shares.items()} for scan, shares in agreement.items()}},
        "memory_mb": {
            "units_and_embeddings": round(with_data - base, 1),
            "search_structures": round(with_index - with_data, 1),
            "fact_embeddings": round(memory.fact_embeddings.nbytes / 2**20, 1),
        },
        "seconds": {"generate": round(generated - started, 1), "build_index": round(built - generated, 1)},
    }
    if before is not None:
        result["baseline"] = {"revision": baseline, "identical_attr_rankings": f"{sum(same_attr_ranking)}/{len(same_attr_ranking)}"}
    if compare_rank_bm25:
        result["bm25_vs_rank_bm25"] = compare_bm25(memory, index, query_words[:20])
    del memory, index, scans
    gc.collect()
    return result


def timed_activation(
    index: ActivationIndex, cfg: RetrievalConfig, question: str, query_vector: np.ndarray, intent: QueryIntent,
    entity_vectors: np.ndarray, location_vectors: np.ndarray,
) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """Every channel and the fusion for one query: the channels' rankings, and the seconds of each of :data:`ACTIVATION_STEPS`
    (with the graph channel, also ``graph`` and ``channels+fusion+graph``; ``channels+fusion`` leaves the graph out)."""
    step: dict[str, float] = {}
    start = time.perf_counter()
    ranked = search_channels(index, cfg, question, query_vector, intent, entity_vectors, location_vectors, step)
    fuse_channels(index, cfg, ranked, [entity_vectors, location_vectors], step)
    total = time.perf_counter() - start
    graph = step.get("graph", 0.0)
    return ranked, {**step, "channels+fusion": total - graph, **({"channels+fusion+graph": total} if "graph" in step else {})}


def dense_scans(memory: NamespaceMemory, stored: DenseIndex | None = None) -> dict[str, DenseIndex]:
    """The float32 scan, the int8 scan (codes encoded in memory) and the scan of the codes a store writes (``stored``
    when already built) over the namespace's vectors."""
    vectors = (memory.fact_embeddings, memory.sentence_embeddings, memory.sentence_unit)
    return {"float32": DenseIndex(*vectors, scan="float32"), "int8": DenseIndex(*vectors, scan="int8"), "stored": stored or stored_codes_index(memory)}


def stored_codes_index(memory: NamespaceMemory) -> DenseIndex:
    """The dense index over the codes a store writes for this namespace: one block a merged segment of
    :data:`MAX_MERGED_ROWS` units (facts, then their sentences), product-quantised where the block is large enough."""
    owners = memory.sentence_unit if memory.sentence_embeddings is not None else np.zeros(0, np.int64)
    cuts = np.arange(0, len(memory.units) + MAX_MERGED_ROWS, MAX_MERGED_ROWS).clip(max=len(memory.units))
    sentence_cuts = np.searchsorted(owners, cuts)
    layout = [(np.arange(a, b), np.arange(c, d)) for a, b, c, d in zip(cuts[:-1], cuts[1:], sentence_cuts[:-1], sentence_cuts[1:]) if b > a]
    blocks = encode_blocks(memory.fact_embeddings, memory.sentence_embeddings, layout)
    return DenseIndex(memory.fact_embeddings, memory.sentence_embeddings, memory.sentence_unit, scan="int8", code_blocks=blocks)


def locomo_recall(input_path: Path, store: Path) -> dict:
    """Recall@10 of the dense channel alone and of the fused ranking on LoCoMo, with each dense scan of :func:`dense_scans`."""
    from qgmem_train.benchmarks.question_batches import locomo_question_batches
    from qgmem_train.config import PipelineConfig
    from qgmem_train.llm.factory import build_embedder
    from qgmem_train.memory.store import MemoryStore
    from qgmem_train.metrics.retrieval import recall_at_k
    from qgmem_train.retrieval.activation import activate

    cfg = PipelineConfig()
    embedder = build_embedder(cfg)
    recalls: dict[str, list[float]] = {f"{part} {scan}": [] for part in ("dense", "fused") for scan in ("float32", "int8", "stored")}
    with MemoryStore.open(store) as memory_store:
        for batch in locomo_question_batches(input_path, memory_store, embedder, cfg.retrieval):
            sources = {u.id: u.source_turn_ids for u in batch.memory.units}
            for scan, dense_index in dense_scans(batch.memory).items():
                batch.index.dense = dense_index
                for q, intent, query_vectors in batch.items():
                    wm = activate(q.question, batch.question_time, batch.memory, cfg=cfg.retrieval, llm=None, embedder=embedder,
                                  reranker=None, index=batch.index, intent=intent, query_vectors=query_vectors)
                    for part, ranking in (("dense", wm.channels["dense"]), ("fused", wm.fused)):
                        recalls[f"{part} {scan}"].append(recall_at_k([sources[u] for u in ranking], set(q.evidence), 10))
    means = {name: round(float(np.mean(values)), 4) for name, values in recalls.items()}
    n_questions = len(recalls["dense float32"])
    return {"input": str(input_path), "store": str(store), "n_questions": n_questions, "recall@10": means,
            **{f"{scan}_minus_float32": {part: round(means[f"{part} {scan}"] - means[f"{part} float32"], 4) for part in ("dense", "fused")}
               for scan in ("int8", "stored")}}


def compare_bm25(memory: NamespaceMemory, index: ActivationIndex, query_words: list[str]) -> dict:
    """Full score vectors from our index and from rank_bm25's BM25Okapi for the same queries, side by side."""
    from rank_bm25 import BM25Okapi

    from qgmem_train.memory.search_terms import lexical_text  # here: bench_store_load's --code children import this file with older packages

    corpus = [tokenize(lexical_text(u.fact_text, u.source_text)) for u in memory.units]
    reference = BM25Okapi(corpus)
    ours_t, ref_t, max_diff = [], [], 0.0
    for text in query_words:
        query = tokenize(text)
        start = time.perf_counter()
        ours = index.bm25.scores(query)
        middle = time.perf_counter()
        theirs = reference.get_scores(query)
        end = time.perf_counter()
        ours_t.append(middle - start)
        ref_t.append(end - middle)
        max_diff = max(max_diff, float(np.max(np.abs(ours - theirs) / np.maximum(1.0, np.abs(theirs)))))
    ours_p50, ref_p50 = float(np.median(ours_t)), float(np.median(ref_t))
    return {
        "queries": len(query_words),
        "ours_p50_ms": round(ours_p50 * 1000, 2),
        "rank_bm25_p50_ms": round(ref_p50 * 1000, 2),
        "speedup": round(ref_p50 / ours_p50, 1),
        "max_relative_score_difference": max_diff,
    }


def markdown(report: dict) -> str:
    """The results as a Markdown table."""
    lines = [
        f"# Activation latency (one thread; {report['machine']['cpu']}, {report['machine']['cores']} cores, load average "
        f"{report['machine'].get('load_average_1m')} at start; dense search {'faiss HNSW' if report['settings']['approximate'] else 'scan'})",
        "",
        "| units | sentence vectors a unit | bm25 p50/p95 | dense p50/p95 (scan) | attr p50/p95 | fusion p50/p95 | 3 channels + fusion p50/p95 | index MB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    cell = lambda r, name: f"{r['latency'][name]['p50_ms']} / {r['latency'][name]['p95_ms']} ms"  # noqa: E731
    for r in report["results"]:
        lines.append(
            f"| {r['units']:,} | {r.get('sentences_per_unit', 0)} | {cell(r, 'bm25')} | {cell(r, 'dense')} ({r['dense_scan']['channel_uses']}) | "
            f"{cell(r, 'attr')} | {cell(r, 'fusion')} | {cell(r, 'channels+fusion')} | "
            f"{r['memory_mb']['search_structures']} (+{r['memory_mb']['units_and_embeddings']} data) |"
        )
    lines += ["", "Dense scans side by side, same queries: float32 scan of every vector; int8 codes (one block) with the best "
              "max(512, 8n) vectors rescored exactly in float32; the codes a store writes (blocks of 32,768 units, product-quantised "
              "from 20,000 vectors a block) with max(2048, 20n) rescored when some are product-quantised (n = 100).", "",
              "| units | sentence vectors a unit | float32 scan p50/p95 | int8 scan p50/p95 | stored codes p50/p95 (kind) | stored vs int8 (p50) | "
              "exact top 10 found, int8 / stored | exact top 100 found, int8 / stored |", "|---|---|---|---|---|---|---|---|"]
    for r in report["results"]:
        int8, stored = r["dense_scan"]["int8_share_of_exact"], r["dense_scan"]["stored_share_of_exact"]
        speedup = r["latency"]["dense_int8"]["p50_ms"] / max(r["latency"]["dense_stored"]["p50_ms"], 1e-9)
        lines.append(f"| {r['units']:,} | {r.get('sentences_per_unit', 0)} | {cell(r, 'dense_float32')} | {cell(r, 'dense_int8')} | "
                     f"{cell(r, 'dense_stored')} ({r['dense_scan']['stored_codes']}) | {speedup:.2f}x faster | "
                     f"{int8['top10']:.4f} / {stored['top10']:.4f} | {int8['top100']:.4f} / {stored['top100']:.4f} |")
    compared = [r for r in report["results"] if "baseline" in r]
    if compared:
        lines += ["", f"Attribute channel before ({compared[0]['baseline']['revision']}: a pass over every attribute row and every unit's "
                  "times) and after (posting lists and sorted intervals), same process, same queries; all channels + fusion with "
                  "each (bm25, dense and fusion as timed above).", "",
                  "| units | sentence vectors a unit | attr before p50/p95 | attr after p50/p95 | speed-up (p50) | identical attr rankings | "
                  "all channels + fusion before p50/p95 | after p50/p95 |", "|---|---|---|---|---|---|---|---|"]
        for r in compared:
            speedup = r["latency"]["attr_baseline"]["p50_ms"] / max(r["latency"]["attr"]["p50_ms"], 1e-9)
            lines.append(f"| {r['units']:,} | {r.get('sentences_per_unit', 0)} | {cell(r, 'attr_baseline')} | {cell(r, 'attr')} | "
                         f"{speedup:.1f}x | {r['baseline']['identical_attr_rankings']} | {cell(r, 'channels+fusion_baseline')} | "
                         f"{cell(r, 'channels+fusion')} |")
    if "locomo" in report:
        loc = report["locomo"]
        rec = loc["recall@10"]
        lines += ["", f"LoCoMo ({loc['n_questions']} questions of {Path(loc['input']).name}, turns mode), recall@10 with the float32 / "
                  f"int8 / stored-codes scan: dense channel {rec['dense float32']:.4f} / {rec['dense int8']:.4f} / {rec['dense stored']:.4f}, "
                  f"fused {rec['fused float32']:.4f} / {rec['fused int8']:.4f} / {rec['fused stored']:.4f}."]
    walked = [r for r in report["results"] if "graph" in r["latency"]]
    if walked:
        g = report["settings"]["graph"]
        lines += ["", f"Graph channel (walk and second fusion; {', '.join(g['links'])} links, {g['seeds']} seed units, {g['iterations']} "
                  f"steps, restart {g['restart']}) on the same queries, one thread: its time beside the three channels and the fusion.", "",
                  "| units | sentence vectors a unit | graph p50/p95 | 3 channels + fusion p50/p95 | with the graph p50/p95 | graph / (3 channels + fusion), p50 |",
                  "|---|---|---|---|---|---|"]
        for r in walked:
            share = r["latency"]["graph"]["p50_ms"] / max(r["latency"]["channels+fusion"]["p50_ms"], 1e-9)
            lines.append(f"| {r['units']:,} | {r.get('sentences_per_unit', 0)} | {cell(r, 'graph')} | {cell(r, 'channels+fusion')} | "
                         f"{cell(r, 'channels+fusion+graph')} | {share:.3f} |")
    for r in report["results"]:
        if "bm25_vs_rank_bm25" in r:
            c = r["bm25_vs_rank_bm25"]
            lines += ["", f"BM25 at {r['units']:,} units: ours {c['ours_p50_ms']} ms vs rank_bm25 {c['rank_bm25_p50_ms']} ms "
                      f"per query (p50, full score vector): **{c['speedup']}x**; max relative score difference "
                      f"{c['max_relative_score_difference']:.1e}."]
    lines += ["", "Targets (three channels together, p50): < 50 ms at 100k units, < 300 ms at 1M units. Dense scan (one thread, "
              "3 sentence vectors a unit): p50 < 20 ms at 100k and < 200 ms at 1M units, LoCoMo recall@10 within 0.005 of exact."]
    return "\n".join(lines) + "\n"


def main() -> None:
    """Run the sizes, print and write bench/results/<name>.{json,md}."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000], help="namespace sizes in units")
    parser.add_argument("--queries", type=int, default=200, help="queries per size (1M runs a quarter as many)")
    parser.add_argument("--sentences-per-unit", type=int, nargs="+", default=[0], help="extra dense vectors per unit (turns mode: about 3)")
    parser.add_argument("--approximate", action="store_true", help="search the dense channel through faiss HNSW")
    parser.add_argument("--locomo-store", type=Path, help="turns-mode LoCoMo store: also measure recall@10 with each dense scan")
    parser.add_argument("--locomo-input", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo" / "locomo_dev.json",
                        help="LoCoMo file of --locomo-store (default: ../shared/data/locomo/locomo_dev.json)")
    parser.add_argument("--baseline", help="git revision whose attribute channel is timed side by side with this one (e.g. main)")
    parser.add_argument("--graph", action="store_true", help="also time the graph channel (retrieval.graph_* defaults)")
    parser.add_argument("--name", default="activation", help="report name: <out>/<name>.{json,md}")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results", help="results folder")
    args = parser.parse_args()
    cfg = RetrievalConfig(approximate=args.approximate)
    started_load = os.getloadavg()[0]
    results = []
    for spu in args.sentences_per_unit:
        for n in args.sizes:
            queries = args.queries if n < 1_000_000 else max(20, args.queries // 4)
            print(f"{n:,} units, {spu} sentence vectors each ...", flush=True)
            results.append(bench_size(n, queries, cfg, compare_rank_bm25=(n == 100_000 and spu == 0), sentences_per_unit=spu,
                                   baseline=args.baseline, graph=args.graph))
            print(json.dumps(results[-1], indent=1), flush=True)
    report = {
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "threads_used": 1, "numpy": np.__version__,
                    "load_average_1m": round(started_load, 2)},
        "settings": {"n": cfg.n, "kappa": cfg.kappa, "sem_threshold": cfg.sem_threshold, "dim": DIM, "approximate": cfg.approximate,
                     "graph": {"links": cfg.graph_links, "seeds": cfg.graph_seeds, "iterations": cfg.graph_iterations,
                               "restart": cfg.graph_restart, "weight": cfg.graph_weight}},
        "results": results,
    }
    if args.locomo_store:
        print("LoCoMo recall@10 with each dense scan ...", flush=True)
        report["locomo"] = locomo_recall(args.locomo_input, args.locomo_store)
    write_report_atomic(args.out / f"{args.name}.json", report, markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
