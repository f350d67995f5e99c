"""The bundled predictor on a LoCoMo conversation: graph-token path vs text path, side by side.

Loads an export (timing the checksum verification and the model load), builds a turns-mode memory of
the first sessions of one LoCoMo conversation through ``add_session``, then asks the questions whose
evidence lies in those sessions twice over the same working memory: through the graph token(s) (the
exported module) and through the text path (the same frozen LLM, the local graph written as facts in
the prompt, as for API backbones). Reports per-path medians of prompt tokens, generation seconds and
process CPU seconds per question, their text/graph ratios, and the evidence hit rate of activation.

    python bench/bench_predictor.py --model EXPORT_DIR              # 2 sessions, 4 questions
    python bench/bench_predictor.py --model EXPORT_DIR --data /path/to/locomo10.json --questions 8

``--data`` defaults to ../shared/data/locomo/locomo_dev.json next to the project; pass the LoCoMo
``locomo10.json`` (github.com/snap-research/LoCoMo, CC BY-NC 4.0) when that folder is not there.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

from qgmem_train.reports import cpu_model

from qgmem_train.memory.loaders import load_conversations
from qgmem_train.predictor import QGMemPredictor, verify_checksums

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "locomo" / "locomo_dev.json"


def cpu_seconds() -> float:
    """User + system CPU seconds of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def questions_in_sessions(path: Path, sample: int, sessions: int, limit: int) -> list[dict]:
    """LoCoMo QA items of ``sample`` (with an answer) whose evidence turns all lie in the first ``sessions``."""
    qa = json.loads(path.read_text(encoding="utf-8"))[sample]["qa"]
    allowed = {f"D{n}:" for n in range(1, sessions + 1)}
    keep = [q for q in qa if "answer" in q and q.get("evidence") and all(e.split(":")[0] + ":" in allowed for e in q["evidence"])]
    return keep[:limit]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, type=Path, help="export folder written by python -m export")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="LoCoMo JSON (locomo10.json or locomo_dev.json)")
    parser.add_argument("--sample", type=int, default=0, help="index of the conversation in the file")
    parser.add_argument("--sessions", type=int, default=2, help="sessions added to the memory")
    parser.add_argument("--questions", type=int, default=4, help="questions asked on each path")
    parser.add_argument("--max-new-tokens", type=int, default=48, help="answer budget of both paths")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "predictor", help="results path without suffix")
    args = parser.parse_args()
    if not args.data.exists():
        parser.error(f"{args.data} not found: pass --data with LoCoMo's locomo10.json")

    started = time.perf_counter()
    verify_checksums(args.model)
    verify_s = time.perf_counter() - started
    started, cpu = time.perf_counter(), cpu_seconds()
    graph = QGMemPredictor.from_pretrained(args.model, intent="rules", max_new_tokens=args.max_new_tokens)
    load_s, load_cpu = time.perf_counter() - started, cpu_seconds() - cpu
    graph.pipeline.generation.max_new_tokens = args.max_new_tokens
    text = QGMemPredictor(None, graph.pipeline, llm=graph.llm, embedder=graph.embedder, reranker=graph.reranker, intent="rules")

    conversation = load_conversations("locomo", args.data)[args.sample]
    questions = questions_in_sessions(args.data, args.sample, args.sessions, args.questions)
    rows: dict[str, list[dict]] = {"graph": [], "text": []}
    hits = []
    with tempfile.TemporaryDirectory() as store_dir:
        memory = graph.memory(conversation.id, store_dir)
        started = time.perf_counter()
        units = sum(memory.add_session(s.turns, time=s.time, session_id=s.id).units for s in conversation.sessions[: args.sessions])
        build_s = time.perf_counter() - started
        text_memory = text.memory(conversation.id, store_dir)
        for q in questions:
            for name, handle in (("graph", memory), ("text", text_memory)):
                cpu = cpu_seconds()
                result = handle.ask(q["question"])
                rows[name].append({
                    "question": q["question"], "answer": result.answer, "valid_json": result.answer is not None,
                    "prompt_tokens": result.tokens["prompt"], "generated_tokens": result.tokens["generated"],
                    "generate_s": result.seconds["generate"], "total_s": result.seconds["total"], "cpu_s": cpu_seconds() - cpu,
                })  # fmt: skip
            turns = {t.id for u in result.units for t in u.source_turns}
            hits.append(bool(set(q["evidence"]) & turns))
        memory.close()
        text_memory.close()

    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in rows[name])

    summary = {
        path: {key: median(path, key) for key in ("prompt_tokens", "generated_tokens", "generate_s", "total_s", "cpu_s")} | {"valid_json": sum(r["valid_json"] for r in rows[path])}
        for path in rows
    }
    ratios = {key: summary["text"][key] / summary["graph"][key] for key in ("prompt_tokens", "generate_s", "cpu_s") if summary["graph"][key]}
    report = {
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "load_avg_1m": os.getloadavg()[0]},
        "model": str(args.model),
        "data": f"{args.data.name} sample {args.sample} ({conversation.id}), {args.sessions} sessions, {units} units, {len(questions)} questions",
        "export": {"verify_checksums_s": verify_s, "from_pretrained_s": load_s, "from_pretrained_cpu_s": load_cpu, "add_sessions_s": build_s},
        "evidence_hit_rate": sum(hits) / len(hits) if hits else None,
        "median_per_question": summary,
        "ratio_text_over_graph": ratios,
        "questions": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        "# Predictor: graph-token path vs text path",
        "",
        f"Machine: {report['machine']['cpu']}, {report['machine']['cores']} cores, 1-min load {report['machine']['load_avg_1m']:.1f}. Data: {report['data']}.",
        f"Export: checksums {verify_s:.2f} s, from_pretrained {load_s:.1f} s ({load_cpu:.1f} CPU s), add_session × {args.sessions} {build_s:.1f} s.",
        f"Evidence turn in the working memory: {report['evidence_hit_rate']:.2f} of questions." if hits else "No questions.",
        "",
        "| median per question | graph | text | text / graph |",
        "|---|---|---|---|",
    ]
    for key in ("prompt_tokens", "generated_tokens", "generate_s", "total_s", "cpu_s"):
        ratio = f"{ratios[key]:.2f}" if key in ratios else ""
        lines.append(f"| {key} | {summary['graph'][key]:.2f} | {summary['text'][key]:.2f} | {ratio} |")
    lines.append(f"| valid JSON answers | {summary['graph']['valid_json']}/{len(questions)} | {summary['text']['valid_json']}/{len(questions)} | |")
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
