"""First passes that could prune the dense channel's int8 scan, measured side by side on the same vectors and queries.

Each design scans every vector with a cheaper code, keeps the best ``K`` and rescores them exactly in float32;
the baseline is the int8 scan (8-bit codes, ``max(512, 8n)`` rescored). Random unit vectors (dim 384, as the
synthetic namespaces of ``bench_activation.py``), queries near random vectors (``0.5`` noise a component, as there),
one thread; or, with ``--embed DIR``, real ones: every distinct sentence and question of the JSON files under ``DIR``
embedded with the default embedder (cached under ``--out``). Reported
per design: p50/p95 milliseconds a query, and the share of the exact top 10 and top 100 found. Also the search of
``DenseIndex`` with int8 codes in one block (encoded in memory), int8 codes in blocks of ``--block-vectors`` (a loaded
store's segments before product quantisation) and the codes a store writes for such blocks now, same queries.

    python bench/bench_dense_prune.py --vectors 400000 --queries 100 --name dense_prune_400k
    python bench/bench_dense_prune.py --embed ../shared/data --queries 300 --pq-k 128 256 512 1024 2048 --name dense_pq_real
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

from qgmem_train.reports import machine_info  # noqa: E402

from qgmem_train.fileio import write_report_atomic  # noqa: E402
from qgmem_train.retrieval.dense import DenseIndex, rescore_count  # noqa: E402
from qgmem_train.vector_codes import CodeBlock, build_int8_codes, build_pq_codes, encode_blocks, faiss_module  # noqa: E402

DIM = 384


def unit_rows(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` random unit rows, made in chunks."""
    out = np.empty((n, DIM), np.float32)
    for lo in range(0, n, 100_000):
        block = rng.standard_normal((min(100_000, n - lo), DIM), dtype=np.float32)
        out[lo : lo + len(block)] = block / np.linalg.norm(block, axis=1, keepdims=True)
    return out


TEXT_KEYS = ("text", "content", "clean_text", "message")
"""JSON keys whose strings are conversation text (split into sentences) in the ``--embed`` folders."""
QUESTION_KEYS = ("question", "query")
"""JSON keys whose strings are questions (the queries) in the ``--embed`` folders."""


def embedded_texts(folder: Path, cache: Path) -> tuple[np.ndarray, np.ndarray, str]:
    """Embeddings of every distinct sentence and question in the JSON files under ``folder`` (cached in ``cache``), and a
    line saying what they are."""
    from qgmem_train.memory.sentences import split_sentences

    texts: set[str] = set()
    questions: set[str] = set()

    def walk(node: object) -> None:
        for key, value in node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ():
            if isinstance(value, str) and key in TEXT_KEYS:
                texts.update(split_sentences(value))
            elif isinstance(value, str) and key in QUESTION_KEYS:
                questions.add(value)
            else:
                walk(value)

    files = sorted(folder.rglob("*.json"))
    for file in files:
        walk(json.loads(file.read_text()))
    sentences, queries = sorted(texts), sorted(questions)
    if cache.exists():
        vectors, query_vectors = np.load(cache / "sentences.npy"), np.load(cache / "questions.npy")
    else:
        from qgmem_train.config import PipelineConfig
        from qgmem_train.llm.factory import build_embedder

        embedder = build_embedder(PipelineConfig())
        vectors, query_vectors = embedder.encode(sentences), embedder.encode(queries)
        cache.mkdir(parents=True)
        np.save(cache / "sentences.npy", vectors)
        np.save(cache / "questions.npy", query_vectors)
    if (len(vectors), len(query_vectors)) != (len(sentences), len(queries)):
        raise SystemExit(f"{cache}: cached embeddings do not match the texts of {folder}; remove the folder")
    what = f"{len(vectors):,} real sentence embeddings (dim {vectors.shape[1]}) of {len(files)} JSON files under {folder.name}/, {{}} of its questions"
    return vectors.astype(np.float32), query_vectors.astype(np.float32), what


def designs(x: np.ndarray, pq_ks: list[int]) -> dict[str, tuple[object, Callable[[np.ndarray], np.ndarray], list[int]]]:
    """Each design: its faiss index over ``x``, how a query is put to it, and the candidate counts ``K`` tried."""
    int8, scale = build_int8_codes([x])
    pq, _ = build_pq_codes([x])
    dim = x.shape[1]
    return {
        "int8": (int8, lambda q: q * scale + 128.0, [rescore_count(100)]),
        f"PQ fast-scan {dim // 2}x4 bit ({dim // 4} B), as the store writes": (pq, lambda q: q, pq_ks),
    }


def int8_blocks(x: np.ndarray, layout: list[tuple[np.ndarray, np.ndarray]]) -> list[CodeBlock]:
    """int8 codes of each block of ``layout`` (how a store wrote every segment before product quantisation)."""
    return [CodeBlock(*build_int8_codes([x[rows]]), rows, sentence_rows) for rows, sentence_rows in layout]


def main() -> None:
    """Measure every design, print and write bench/results/<name>.{json,md}."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vectors", type=int, default=400_000, help="random unit vectors (without --embed)")
    p.add_argument("--embed", type=Path, help="search real embeddings: the sentences and questions of the JSON files under this folder")
    p.add_argument("--pq-k", type=int, nargs="+", default=[1024, 2048, 4096], help="candidates K rescored after the PQ scan")
    p.add_argument("--queries", type=int, default=100)
    p.add_argument("--block-vectors", type=int, default=32_000, help="vectors a block (a merged segment of 8,000 units with 3 sentences each)")
    p.add_argument("--name", default="dense_prune")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = p.parse_args()
    faiss_module("this benchmark").omp_set_num_threads(1)
    load_start = os.getloadavg()
    rng = np.random.default_rng(0)
    if args.embed:
        x, queries, what = embedded_texts(args.embed, ROOT / "out" / "dense_prune_embeddings" / args.embed.resolve().name)
        queries = queries[rng.permutation(len(queries))[: args.queries]]
        what = what.format(len(queries))
    else:
        x = unit_rows(rng, args.vectors)
        targets = x[rng.integers(len(x), size=args.queries)]
        queries = targets + 0.5 * rng.standard_normal(targets.shape, dtype=np.float32)
        queries /= np.linalg.norm(queries, axis=1, keepdims=True)
        what = f"{len(x):,} random unit vectors (dim {DIM}), {len(queries)} queries"
    exact = [np.argsort(-(x @ q))[:100] for q in queries]
    rows = []
    for name, (index, put, ks) in designs(x, args.pq_k).items():
        for k in ks:
            times, top10, top100 = [], [], []
            for q, best in zip(queries, exact):
                started = time.perf_counter()
                _, hits = index.search(put(q)[None, :], k)
                candidates = hits[0][hits[0] >= 0]
                found = candidates[np.argsort(-(x[candidates] @ q))[:100]]
                times.append(time.perf_counter() - started)
                top10.append(len(set(found[:10].tolist()) & set(best[:10].tolist())) / 10)
                top100.append(len(set(found.tolist()) & set(best.tolist())) / 100)
            ms = np.asarray(times) * 1000
            rows.append({"design": name, "K": k, "p50_ms": round(float(np.percentile(ms, 50)), 2), "p95_ms": round(float(np.percentile(ms, 95)), 2),
                         "top10_found": round(float(np.mean(top10)), 4), "top100_found": round(float(np.mean(top100)), 4)})  # fmt: skip
            print(rows[-1], flush=True)
    layout = [(np.arange(lo, min(lo + args.block_vectors, len(x))), np.zeros(0, np.int64)) for lo in range(0, len(x), args.block_vectors)]
    stored = DenseIndex(x, scan="int8", code_blocks=encode_blocks(x, None, layout))
    blocks = {
        "int8, one block": DenseIndex(x, scan="int8"),
        f"int8, {len(layout)} blocks": DenseIndex(x, scan="int8", code_blocks=int8_blocks(x, layout)),
        f"as a store writes them ({stored.scan}), {len(layout)} blocks": stored,
    }
    block_rows = []
    for name, index in blocks.items():
        times, top10, top100 = [], [], []
        for q, best in zip(queries, exact):
            started = time.perf_counter()
            found = index.search(q, 100)[0]
            times.append(time.perf_counter() - started)
            top10.append(len(set(found[:10].tolist()) & set(best[:10].tolist())) / 10)
            top100.append(len(set(found.tolist()) & set(best.tolist())) / 100)
        ms = np.asarray(times) * 1000
        block_rows.append({"codes": name, "p50_ms": round(float(np.percentile(ms, 50)), 2), "p95_ms": round(float(np.percentile(ms, 95)), 2),
                           "top10_found": round(float(np.mean(top10)), 4), "top100_found": round(float(np.mean(top100)), 4)})  # fmt: skip
        print(block_rows[-1], flush=True)
    report = {"machine": machine_info(), "load_average": [round(v, 2) for v in (*load_start, *os.getloadavg())],
              "vectors": len(x), "queries": len(queries), "data": what, "rows": rows, "blocks": block_rows}  # fmt: skip
    base = rows[0]["p50_ms"]
    lines = [f"# Dense first passes: {what}, one thread",
             "", f"Load average at start {report['load_average'][0]}, at end {report['load_average'][3]} (2 shared cores): ratios, not absolute times.", "",
             "| design | candidates K rescored in float32 | p50 / p95 ms | p50 vs int8 | exact top 10 found | exact top 100 found |", "|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['design']} | {r['K']:,} | {r['p50_ms']} / {r['p95_ms']} | {base / r['p50_ms']:.2f}x faster | {r['top10_found']:.4f} | {r['top100_found']:.4f} |")
    lines += ["", f"DenseIndex search (top 100; {rescore_count(100)} rescored after int8 codes, {rescore_count(100, pq=True)} after product-quantised "
              f"ones), codes in one block or in blocks of {args.block_vectors:,} vectors:", "",
              "| codes | p50 / p95 ms | p50 vs int8 one block | exact top 10 found | exact top 100 found |", "|---|---|---|---|---|"]  # fmt: skip
    one = block_rows[0]["p50_ms"]
    lines += [f"| {r['codes']} | {r['p50_ms']} / {r['p95_ms']} | {one / r['p50_ms']:.2f}x faster | {r['top10_found']:.4f} | {r['top100_found']:.4f} |" for r in block_rows]
    write_report_atomic(args.out / f"{args.name}.json", report, "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
