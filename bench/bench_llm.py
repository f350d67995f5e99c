"""LLM layer speed on this machine, side by side in one run.

1. batched vs one-by-one greedy generation with SmolLM2 (tokens/s, ratio);
2. JSON-schema constrained (llguidance) vs unconstrained decoding (tokens/s, ratio);
3. the OpenAI-compatible HTTP backend at concurrency 1 vs N against the loopback server (ratio).

    python -m bench.bench_llm [--prompts 8] [--max-new-tokens 32] [--concurrency 8]

Writes bench/results/llm.json and bench/results/llm.md and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from qgmem_train.reports import machine_info

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]


from qgmem_train.config import BUNDLED_LLM  # noqa: E402
from qgmem_train.llm.http import OpenAICompatibleLLM  # noqa: E402
from qgmem_train.llm.local import TransformersLLM  # noqa: E402
from qgmem_train.llm.schemas import AnswerOutput  # noqa: E402
from qgmem_train.llm.structured import strict_json_schema  # noqa: E402
from tests.openai_server import OpenAICompatibleServer  # noqa: E402

QUESTIONS = [
    "Where did Caroline go yesterday, and how did it feel?",
    "What does Melanie like to paint?",
    "Name three fruits that are red.",
    "Why do people keep journals?",
    "What is a good way to spend a rainy weekend?",
    "Describe a lake at sunset in one sentence.",
    "What should I pack for a camping trip?",
    "How do support groups help people?",
    "Which city is the capital of Italy?",
    "Give one tip for learning to paint.",
    "What is adoption?",
    "Suggest a name for a dog.",
]


def timed_generate(llm, chats, **kwargs) -> tuple[list[str], float]:
    start = time.perf_counter()
    texts = llm.generate(chats, **kwargs)
    return texts, time.perf_counter() - start


def tokens(llm: TransformersLLM, texts: list[str]) -> int:
    return sum(llm.count_tokens(t) + 1 for t in texts)  # +1: the EOS (or the last cut token)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=8, help="chats per measurement")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=8, help="HTTP requests in flight (compared against 1)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "llm.json")
    args = parser.parse_args()
    chats = [[{"role": "user", "content": q}] for q in (QUESTIONS * 4)[: args.prompts]]
    n = args.max_new_tokens
    llm = TransformersLLM(BUNDLED_LLM, batch_size=args.prompts, max_new_tokens=n)
    llm.generate(chats[:2], max_new_tokens=4)  # warm-up

    rows: dict[str, dict] = {}
    texts, seconds = timed_generate(llm, chats, max_new_tokens=n)
    rows["batched"] = {"seconds": seconds, "tokens": tokens(llm, texts)}
    start = time.perf_counter()
    single = [llm.chat(chat, max_new_tokens=n) for chat in chats]
    rows["one_by_one"] = {"seconds": time.perf_counter() - start, "tokens": tokens(llm, single)}

    schema = strict_json_schema(AnswerOutput)
    llm.generate(chats[:1], max_new_tokens=4, json_schema=schema)  # grammar compile + llguidance tokenizer, once
    texts, seconds = timed_generate(llm, chats, max_new_tokens=n, json_schema=schema)
    rows["constrained"] = {"seconds": seconds, "tokens": tokens(llm, texts)}
    rows["unconstrained"] = rows["batched"]

    with OpenAICompatibleServer(llm, "smollm2", max_batch=args.concurrency) as server:
        for width in (1, args.concurrency):
            remote = OpenAICompatibleLLM(server.base_url, "smollm2", max_concurrency=width, max_new_tokens=n)
            texts, seconds = timed_generate(remote, chats, max_new_tokens=n)
            rows[f"http_concurrency_{width}"] = {"seconds": seconds, "tokens": tokens(llm, texts)}
            remote.close()

    for row in rows.values():
        row["tokens_per_s"] = row["tokens"] / row["seconds"]
    ratios = {
        "batched_over_one_by_one": rows["batched"]["tokens_per_s"] / rows["one_by_one"]["tokens_per_s"],
        "constrained_over_unconstrained": rows["constrained"]["tokens_per_s"] / rows["unconstrained"]["tokens_per_s"],
        f"http_concurrency_{args.concurrency}_over_1": rows[f"http_concurrency_{args.concurrency}"]["tokens_per_s"] / rows["http_concurrency_1"]["tokens_per_s"],
    }
    result = {"machine": machine_info(), "model": BUNDLED_LLM, "prompts": args.prompts, "max_new_tokens": n, "rows": rows, "ratios": ratios}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        f"# LLM layer speed ({result['machine']['cpu']}, {result['machine']['cores']} cores, torch {result['machine']['torch']})",
        f"SmolLM2-135M-Instruct, {args.prompts} chats, up to {n} new tokens, greedy.",
        "",
        "| run | seconds | tokens | tokens/s |",
        "|---|---|---|---|",
        *[f"| {name} | {r['seconds']:.2f} | {r['tokens']} | {r['tokens_per_s']:.1f} |" for name, r in rows.items()],
        "",
        *[f"- {name}: **{value:.2f}x**" for name, value in ratios.items()],
    ]
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
