"""``serve`` under concurrent clients: asks answered one generate call each (--max-batch 1) against batched.

A uvicorn server on 127.0.0.1 (in a thread of this process) over SmolLM2 and MiniLM (turns-mode units, rules intent,
no reranker); an httpx client adds one session to each of ``--namespaces`` namespaces, then keeps ``--concurrency``
asks (and, after them, searches) in flight across them. The same store and models serve both runs, one after the other,
with ``--torch-threads`` torch threads; the answers of the two runs are compared question by question (greedy decoding:
a batched answer should be the one answered alone), and each run notes the load average before and after it.

    python -m bench.bench_serve [--namespaces 8] [--asks 16] [--concurrency 8] [--max-new-tokens 32] [--torch-threads 1]

Writes bench/results/serve.json and bench/results/serve.md and prints the table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import tempfile
import threading
import time
from pathlib import Path

from qgmem_train.reports import machine_info

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import httpx  # noqa: E402
import torch  # noqa: E402
import uvicorn  # noqa: E402

from qgmem_train.config import BUNDLED_EMBEDDER, BUNDLED_LLM, PipelineConfig  # noqa: E402
from qgmem_train.llm.embedder import Embedder  # noqa: E402
from qgmem_train.llm.local import TransformersLLM  # noqa: E402
from qgmem_train.predictor import QGMemPredictor  # noqa: E402
from qgmem_train.serve.app import create_app  # noqa: E402
from qgmem_train.serve.limits import Limits  # noqa: E402
from qgmem_train.serve.service import MemoryService  # noqa: E402
from qgmem_train.serve.tenants import Tenants  # noqa: E402

TOKEN = "bench-token-0123456789abcdef"
FACTS = [
    ("Alex", "I adopted a beagle called Biscuit last weekend.", "What is Alex's dog called?"),
    ("Sam", "I started cello lessons with a teacher named Ruth.", "Who teaches Sam the cello?"),
    ("Kim", "We moved to Lisbon in June for my new job.", "Where did Kim move?"),
    ("Lee", "My sister Mia is getting married in Porto in October.", "Where is Mia getting married?"),
]
FILLER = ["How was your week?", "Pretty busy, but good.", "Anything new at work?", "We shipped the release on Friday."]


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0-1) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def drive(base: str, jobs: list[tuple[str, str, dict]], concurrency: int, answers: list | None = None) -> tuple[list[float], float]:
    """Run ``jobs`` (method, path, body) with ``concurrency`` in flight; each one's seconds and the wall time (``answers``
    gets each response's ``answer`` in job order)."""
    gate = asyncio.Semaphore(concurrency)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=600) as client:

        async def one(method: str, path: str, body: dict) -> tuple[float, object]:
            async with gate:
                start = time.perf_counter()
                response = await client.request(method, path, json=body)
                response.raise_for_status()
                return time.perf_counter() - start, response.json().get("answer")

        start = time.perf_counter()
        done = await asyncio.gather(*(one(*job) for job in jobs))
        if answers is not None:
            answers.extend(answer for _, answer in done)
        return [seconds for seconds, _ in done], time.perf_counter() - start


def bench_predictor(max_new_tokens: int, batch_size: int) -> QGMemPredictor:
    """SmolLM2 answering (up to ``max_new_tokens``, ``batch_size`` prompts a generate call) over MiniLM, turns-mode
    units without traces, rules intent and no reranker: serve's cheap CPU setup."""
    cfg = PipelineConfig()
    cfg.models.reranker, cfg.models.device = "none", "cpu"
    cfg.construction.units, cfg.construction.traces = "turns", False
    cfg.generation.max_new_tokens = max_new_tokens
    llm = TransformersLLM(BUNDLED_LLM, max_new_tokens=max_new_tokens, batch_size=batch_size)
    return QGMemPredictor(None, cfg, llm=llm, embedder=Embedder(BUNDLED_EMBEDDER, device="cpu"), reranker=None, intent="rules")


def run_server(predictor: QGMemPredictor, store: Path, max_batch: int, body, torch_threads: int = 1, background_nice: int = 5) -> object:  # noqa: ANN001
    """Serve on a free loopback port with ``max_batch`` while ``body(base_url)`` runs; return its result."""
    tenants = Tenants.from_records({"tenants": [{"name": "bench", "token": TOKEN, "prefixes": ["bench-"]}]}, "bench")
    limits = Limits(rate_per_minute=1e9, burst=1_000_000, max_batch=max_batch)
    service = MemoryService(predictor, store, max_batch=max_batch, torch_threads=torch_threads, background_nice=background_nice)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(service, tenants, limits), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    try:
        return body(f"http://127.0.0.1:{port}")
    finally:
        server.should_exit = True
        thread.join()
        service.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--namespaces", type=int, default=8)
    parser.add_argument("--asks", type=int, default=16, help="asks per run (as many searches)")
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight; also the batched run's --max-batch")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--torch-threads", type=int, default=1, help="torch intra-op threads of the server's threads (serve's CPU default)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "serve.json")
    args = parser.parse_args()
    if min(args.namespaces, args.asks, args.concurrency, args.max_new_tokens, args.torch_threads) < 1:
        parser.error("--namespaces, --asks, --concurrency, --max-new-tokens and --torch-threads must be at least 1")
    torch.set_num_threads(args.torch_threads)
    predictor = bench_predictor(args.max_new_tokens, args.concurrency)
    names = [f"bench-{n}" for n in range(args.namespaces)]
    sessions = [
        ("POST", f"/v1/namespaces/{name}/sessions",
         {"session_id": "s1", "time": "2024-06-01", "turns": [{"speaker": FACTS[n % 4][0], "text": FACTS[n % 4][1]}]
          + [{"speaker": FACTS[n % 4][0] if k % 2 else "Friend", "text": text} for k, text in enumerate(FILLER)]})
        for n, name in enumerate(names)
    ]  # fmt: skip
    asks = [("POST", f"/v1/namespaces/{names[n % len(names)]}/ask", {"question": FACTS[n % len(names) % 4][2]}) for n in range(args.asks)]
    searches = [(method, path.replace("/ask", "/search"), body) for method, path, body in asks]
    rows: dict[str, dict] = {}
    answers: dict[str, list] = {}
    with tempfile.TemporaryDirectory() as root:
        store = Path(root) / "store"
        for max_batch in (1, args.concurrency):

            def body(base: str) -> dict:
                asyncio.run(drive(base, sessions, args.concurrency))  # stored once: the second run's are acknowledged retries
                asyncio.run(drive(base, asks[:1], 1))  # warm-up: grammar compile, first load of each index
                before = os.getloadavg()[0]
                ask_seconds, ask_wall = asyncio.run(drive(base, asks, args.concurrency, answers.setdefault(f"max_batch_{max_batch}", [])))
                search_seconds, search_wall = asyncio.run(drive(base, searches, args.concurrency))
                return {
                    "load_before": round(before, 2), "load_after": round(os.getloadavg()[0], 2),
                    "ask_p50_s": percentile(ask_seconds, 0.5), "ask_p95_s": percentile(ask_seconds, 0.95), "asks_per_s": len(asks) / ask_wall,
                    "search_p50_s": percentile(search_seconds, 0.5), "search_p95_s": percentile(search_seconds, 0.95),
                    "searches_per_s": len(searches) / search_wall,
                }  # fmt: skip

            rows[f"max_batch_{max_batch}"] = run_server(predictor, store, max_batch, body, args.torch_threads)
    batched, single = rows[f"max_batch_{args.concurrency}"], rows["max_batch_1"]
    ratio = batched["asks_per_s"] / single["asks_per_s"]
    same = sum(a == b for a, b in zip(answers["max_batch_1"], answers[f"max_batch_{args.concurrency}"]))
    result = {"machine": machine_info(), "llm": BUNDLED_LLM, "embedder": BUNDLED_EMBEDDER, "args": {k: v for k, v in vars(args).items() if k != "out"},
              "rows": rows, "asks_per_s_batched_over_single": ratio, "answers": answers, "answers_identical": same}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    machine = result["machine"]
    lines = [
        f"# serve under {args.concurrency} concurrent clients ({machine['cpu']}, {machine['cores']} cores, load {machine.get('load_average_1m')} at the start: shared with other work)",
        f"SmolLM2-135M-Instruct answering (text path, up to {args.max_new_tokens} new tokens), MiniLM, turns-mode units, rules intent, no reranker;",
        f"{args.asks} asks then {args.asks} searches over {args.namespaces} namespaces, through uvicorn on 127.0.0.1 and httpx; {args.torch_threads} torch thread(s).",
        "",
        "| run | ask p50 s | ask p95 s | asks/s | search p50 s | search p95 s | searches/s | load before / after |",
        "|---|---|---|---|---|---|---|---|",
        *[f"| {name} | {r['ask_p50_s']:.2f} | {r['ask_p95_s']:.2f} | {r['asks_per_s']:.2f} | {r['search_p50_s']:.3f} | {r['search_p95_s']:.3f} | "
          f"{r['searches_per_s']:.1f} | {r['load_before']} / {r['load_after']} |" for name, r in rows.items()],
        "",
        f"- asks/s, batched over one generate call per ask: **{ratio:.2f}x**",
        f"- answers the same batched as one at a time: {same} of {len(asks)}",
    ]  # fmt: skip
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
