"""``python -m qgmem_train ask``: answer one question over a memory store and show the evidence it cites.

Activation (intent, three channels, RRF, reranker) selects the working memory; the final-answer
prompt answers from its serialization (text path). The cited units are the MU#/F# labels of the
reasoning path, or the whole working memory when it cites none; each is printed with its source turns.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from qgmem_train.errors import InputError


def build_parser() -> argparse.ArgumentParser:
    """Options of ``ask``."""
    parser = argparse.ArgumentParser(prog="python -m qgmem_train ask", description=__doc__.split("\n\n")[0])
    parser.add_argument("question", help="the question to answer")
    parser.add_argument("--store", required=True, type=Path, help="memory store folder")
    parser.add_argument("--namespace", help="namespace (user or conversation) to search; needed when the store has several")
    parser.add_argument("--config", type=Path, help="YAML with a pipeline: section (models, retrieval settings)")
    parser.add_argument("--time", help="when the question is asked (ISO date); resolves relative expressions only")
    parser.add_argument("--reranker", choices=["llm", "cross", "none"], help="reranker (default: models.reranker)")
    parser.add_argument("--model", help="exported QGMem model (folder or Hub repo id): answer with it; its config replaces --config/--reranker")
    return parser


def pick_namespace(available: list[str], wanted: str | None, store: Path) -> str:
    """The namespace to search: ``wanted`` if present, else the only one."""
    if wanted is not None:
        if wanted not in available:
            raise InputError(f"{store}: --namespace {wanted}", f"no such namespace (known: {', '.join(available[:10]) or 'none'})")
        return wanted
    if len(available) != 1:
        raise InputError(f"{store}", f"holds {len(available)} namespaces; pick one with --namespace ({', '.join(available[:10])})")
    return available[0]


def main(argv: list[str]) -> int:
    """Answer the question and print the answer, the reasoning path and the cited units with their source turns."""
    args = build_parser().parse_args(argv)
    if not args.question.strip():
        raise InputError("question", "empty question")
    if args.time is not None:
        from qgmem_train.memory.timeparse import utterance_date

        if utterance_date(args.time) is None:
            raise InputError("--time", f"not an ISO date: {args.time!r}")

    if args.model is not None:
        from qgmem_train.memory.store import MemoryStore
        from qgmem_train.predictor import ask_with_model

        with MemoryStore.open(args.store) as store:
            namespace = pick_namespace(store.namespaces(), args.namespace, args.store)
        print(ask_with_model(args.model, args.store, namespace, args.question, args.time).render())
        return 0

    from qgmem_train.config import load_pipeline_config
    from qgmem_train.llm.factory import build_embedder, build_llm
    from qgmem_train.llm.structured import ParseStats
    from qgmem_train.memory.store import MemoryStore
    from qgmem_train.retrieval.activation import activate
    from qgmem_train.retrieval.answer import answer_questions
    from qgmem_train.retrieval.intent import INTENT_MAX_NEW_TOKENS, parse_intents
    from qgmem_train.retrieval.rerank import build_reranker
    from qgmem_train.retrieval.serialization import cited_unit_ids, serialize_working_memory

    cfg = load_pipeline_config(args.config)
    with MemoryStore.open(args.store) as store:
        namespace = pick_namespace(store.namespaces(), args.namespace, args.store)
        embedder = build_embedder(cfg)
        memory = store.load_namespace(namespace, embedder_id=embedder.model_id)
    llm = build_llm(cfg)
    kind = args.reranker or cfg.models.reranker
    reranker = build_reranker(cfg, kind, llm=llm if kind == "llm" and not cfg.models.reranker_model else None)

    stats = ParseStats()
    budget = min(INTENT_MAX_NEW_TOKENS, cfg.generation.max_new_tokens)
    intent = parse_intents([(args.question, args.time)], llm, max_new_tokens=budget, stats=stats)[0]
    wm = activate(args.question, args.time, memory, cfg=cfg.retrieval, llm=llm, embedder=embedder, reranker=reranker, intent=intent)
    context = serialize_working_memory(wm.units, memory, llm)
    output = answer_questions(llm, [(args.question, args.time, context)], max_new_tokens=cfg.generation.max_new_tokens, stats=stats)[0]

    by_id = {u.id: u for u in wm.units}
    if output is None:
        print("answer: (the model gave no valid answer)")
        cited = [u.id for u in wm.units]
    else:
        print(f"answer: {output.answer}")
        print(f"reasoning: {output.reasoning_path}")
        cited = cited_unit_ids(output.reasoning_path, context.labels) or [u.id for u in wm.units]
    label_of = {uid: label for label, uid in context.labels.items()}
    print(f"\ncited units ({len(cited)} of {len(wm.units)} in working memory, {context.n_tokens} context tokens):")
    for uid in cited:
        unit = by_id[uid]
        print(f"[{label_of[uid]}] {unit.fact_text}")
        for turn_id in unit.source_turn_ids:
            turn = memory.turns.get(turn_id)
            when = memory.turn_time.get(turn_id) or "time unknown"
            text = f"{turn.speaker}: {turn.text}" if turn else "(turn not in store)"
            print(f"    {turn_id} ({when}) {text}")
    return 0
