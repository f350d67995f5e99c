"""How much longer a search takes when it arrives while the server generates an ask, or writes a 600-turn add.

One uvicorn server (in a thread of this process, as ``bench_serve``) over SmolLM2 and MiniLM (turns-mode units, rules
intent, no reranker, ``--torch-threads`` a thread). Side by side in one run, each ``--repeats`` times: a search alone; a
search sent ``--delay`` s after an ask (``--max-new-tokens`` to generate) of another namespace; a search sent ``--delay``
s after an add of a ``--turns``-turn session to another namespace, and to the search's own namespace. A search's wait is
its latency at the client (its seconds in the server beside it); the goal (issue 67) is under 20 ms more than alone. The
whole run is made once for each ``--background-nice`` (how much nicer the ask and write threads run than the search
workers; 0: the same priority). The load average is noted before and after each arm: on shared cores the ask's or the
add's own CPU use slows the search, besides any queueing.

    python -m bench.bench_serve_behind [--repeats 5] [--turns 600] [--max-new-tokens 64] [--delay 0.3] [--torch-threads 1] [--background-nice 0 5]

Writes bench/results/serve_behind.json and bench/results/serve_behind.md and prints the table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import httpx  # noqa: E402
import torch  # noqa: E402

from bench.bench_serve import FACTS, FILLER, TOKEN, bench_predictor, run_server  # noqa: E402
from qgmem_train.config import BUNDLED_EMBEDDER, BUNDLED_LLM  # noqa: E402
from qgmem_train.reports import machine_info  # noqa: E402

SEARCH = {"question": FACTS[0][2]}


def session(turns: int, tag: str) -> dict:
    """A session of ``turns`` turns (the first holds a fact, the rest small talk), its id ``tag``."""
    lines = [{"speaker": FACTS[0][0], "text": FACTS[0][1]}]
    lines += [{"speaker": "Friend" if n % 2 else FACTS[0][0], "text": f"{FILLER[n % len(FILLER)]} ({tag} {n})"} for n in range(turns - 1)]
    return {"session_id": tag, "time": "2024-06-01", "turns": lines}


async def behind(client: httpx.AsyncClient, slow: tuple[str, dict] | None, delay: float, search_path: str) -> tuple[float, float, float | None]:
    """A search's seconds at the client and in the server, sent ``delay`` s after the ``slow`` request (path, body) when
    given; and the slow one's seconds."""
    started = time.perf_counter()
    task = asyncio.ensure_future(client.post(slow[0], json=slow[1])) if slow else None
    if task is not None:
        await asyncio.sleep(delay)
    sent = time.perf_counter()
    response = await client.post(search_path, json=SEARCH)
    response.raise_for_status()
    seconds, server = time.perf_counter() - sent, response.json()["seconds"]["total"]
    if task is None:
        return seconds, server, None
    (await task).raise_for_status()
    return seconds, server, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--turns", type=int, default=600, help="turns of the added session")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens the ask generates")
    parser.add_argument("--delay", type=float, default=0.3, help="seconds from the slow request to the search")
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--background-nice", type=int, nargs="+", default=[0, 5], help="runs, each with the ask and write threads this much nicer")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "serve_behind.json")
    args = parser.parse_args()
    if min(args.repeats, args.turns, args.max_new_tokens, args.torch_threads) < 1 or args.delay < 0 or not all(0 <= n <= 19 for n in args.background_nice):
        parser.error("--repeats, --turns, --max-new-tokens and --torch-threads must be at least 1, --delay at least 0, --background-nice 0 to 19")
    torch.set_num_threads(args.torch_threads)
    predictor = bench_predictor(args.max_new_tokens, 8)
    search_path = "/v1/namespaces/bench-s/search"

    def body(base: str) -> dict:
        async def run() -> dict:
            async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=600) as client:
                for name in ("bench-s", "bench-a"):
                    (await client.post(f"/v1/namespaces/{name}/sessions", json=session(5, "s0"))).raise_for_status()
                (await client.post("/v1/namespaces/bench-a/ask", json={"question": FACTS[0][2]})).raise_for_status()  # warm: grammar, index
                for _ in range(3):
                    await behind(client, None, 0, search_path)
                arms = {
                    "alone": lambda r: None,
                    "behind an ask": lambda r: ("/v1/namespaces/bench-a/ask", {"question": FACTS[0][2]}),
                    f"behind a {args.turns}-turn add (another namespace)": lambda r: (f"/v1/namespaces/bench-w{r}/sessions", session(args.turns, f"w{r}")),
                    f"behind a {args.turns}-turn add (the same namespace)": lambda r: ("/v1/namespaces/bench-s/sessions", session(args.turns, f"s{r + 1}")),
                }  # fmt: skip
                out = {}
                for name, slow in arms.items():
                    before, seconds, servers, slows = round(os.getloadavg()[0], 2), [], [], []
                    for r in range(args.repeats):
                        search_s, server_s, slow_s = await behind(client, slow(r), args.delay, search_path)
                        seconds.append(search_s)
                        servers.append(server_s)
                        slows.append(slow_s)
                    out[name] = {"search_s": seconds, "median_s": statistics.median(seconds), "max_s": max(seconds), "server_s": servers,
                                 "server_median_s": statistics.median(servers), "slow_s": slows, "load_before": before,
                                 "load_after": round(os.getloadavg()[0], 2)}  # fmt: skip
                return out

        return asyncio.run(run())

    runs = {}
    machine = machine_info()
    for nicer in args.background_nice:
        with tempfile.TemporaryDirectory() as root:
            runs[f"background nice {nicer}"] = run_server(predictor, Path(root) / "store", 8, body, args.torch_threads, nicer)
    result = {"machine": machine, "llm": BUNDLED_LLM, "embedder": BUNDLED_EMBEDDER,
              "args": {k: v for k, v in vars(args).items() if k != "out"}, "runs": runs}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        f"# A search behind an ask or a {args.turns}-turn add ({machine['cpu']}, {machine['cores']} cores shared with other work, load {machine.get('load_average_1m')} at the start)",
        f"One server (uvicorn in the bench's process), SmolLM2-135M-Instruct asks ({args.max_new_tokens} new tokens), MiniLM, turns-mode units, rules intent, "
        f"no reranker, {args.torch_threads} torch thread(s) a worker; each search sent {args.delay} s after the slow request, {args.repeats} times an arm.",
        "",
        "| run | arm | search median ms (in the server) | search max ms | median more than alone, ms | slow request s (median) | load before / after |",
        "|---|---|---|---|---|---|---|",
        *[f"| {run} | {name} | {a['median_s'] * 1000:.0f} ({a['server_median_s'] * 1000:.0f}) | {a['max_s'] * 1000:.0f} | "
          f"{(a['median_s'] - arms['alone']['median_s']) * 1000:+.0f} | "
          f"{statistics.median(a['slow_s']) if a['slow_s'][0] is not None else float('nan'):.1f} | {a['load_before']} / {a['load_after']} |"
          for run, arms in runs.items() for name, a in arms.items()],
    ]  # fmt: skip
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
