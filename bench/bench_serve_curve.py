"""``serve``'s throughput and latency as a curve: service time, closed loops, and latency against an offered rate.

Each arm starts one ``python -m qgmem_train serve`` process (the bundled MiniLM, turns-mode units, rule intents,
``--workers`` search threads of ``--torch-threads`` torch threads each) over a store of its backend (``sqlite``: a
folder; ``postgresql``: ``--postgres URI``, else ``QGMEM_TEST_POSTGRES``, else a local ``pgserver``), with no
reranker or with the cross-encoder (``cross``: ONNX Runtime int8 over the first ``--rerank-top`` units of the pool;
``--cross-encoder`` names a trained model, else one is made from MiniLM-L6's weights with an untrained head, which
costs what a MiniLM-L6 cross-encoder costs, its order meaning nothing). It fills ``--namespaces`` namespaces with a
session of ``--turns`` turns each, then measures, from httpx clients on the same machine:

- service time: ``--sequential`` searches one at a time (client seconds, and the server's own seconds by stage);
- closed loop: ``--clients`` clients sending searches only, then the mixed load (searches, adds of 4 turns, listings),
  each for ``--closed-s`` seconds;
- open loop: searches arriving at random (Poisson) at each of ``--rates`` per second for ``--open-s`` seconds, until
  the server falls behind (a p95 over 2 s, or a search not answered).

    python bench/bench_serve_curve.py [--arms sqlite postgresql] [--rerankers none cross] [--closed-s 20] [--open-s 10]

The client runs on the machine it measures: on 2 cores it takes a share of them. Every phase notes the load average
(1 min) before and after it. Writes bench/results/serve_curve.json and .md (``--out``, ``--name``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")

import httpx  # noqa: E402
import yaml  # noqa: E402

from bench.bench_serve import percentile  # noqa: E402
from bench.bench_serve_load import SERVER_CONFIG, Server, postgres_missing, postgres_store, session_body, sqlite_store  # noqa: E402
from qgmem_train.fileio import write_report_atomic  # noqa: E402
from qgmem_train.reports import commit_text, git_state, machine_info, machine_text, remake_reports  # noqa: E402

TOKEN = "bench-curve-token-0123456789abcdef"
MIXED = {"search": 0.8, "add": 0.1, "list": 0.1}
"""Shares of the mixed closed loop."""
SATURATED_P95_S = 2.0
"""An open-loop rate whose p95 is over this is past what the server holds: the curve stops there."""


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


def cross_encoder(work: Path) -> str:
    """A cross-encoder folder of MiniLM-L6's size: its BERT body with a new one-logit head (for cost, not for order)."""
    from sentence_transformers import CrossEncoder

    from qgmem_train.config import BUNDLED_EMBEDDER
    from qgmem_train.llm.resolver import resolve_model_dir

    folder = work / "cross-encoder"
    CrossEncoder(str(resolve_model_dir(BUNDLED_EMBEDDER, None)), num_labels=1, device="cpu").save(str(folder))
    return str(folder)


def summary(seconds: list[float], wall: float) -> dict[str, Any]:
    return {"n": len(seconds), "per_s": len(seconds) / wall if wall else None, "p50": percentile(seconds, 0.5) if seconds else None,
            "p95": percentile(seconds, 0.95) if seconds else None}  # fmt: skip


async def fill(http: httpx.AsyncClient, base: str, namespaces: int, turns: int, seed: int) -> list[tuple[str, str]]:
    """A session of ``turns`` turns in each namespace; (namespace, the question finding its fact) of each."""
    rng, found = random.Random(seed), []
    for n in range(namespaces):
        body, question = session_body(f"fill-{n}", rng, turns)
        (await http.post(f"{base}/v1/namespaces/bench-{n:04d}/sessions", json=body)).raise_for_status()
        found.append((f"bench-{n:04d}", question))
    return found


async def service_time(http: httpx.AsyncClient, base: str, questions: list[tuple[str, str]], count: int) -> dict[str, Any]:
    """Searches one at a time: client seconds, and the median of each stage the server timed."""
    client, stages = [], {}
    for n in range(count):
        namespace, question = questions[n % len(questions)]
        started = time.perf_counter()
        response = await http.post(f"{base}/v1/namespaces/{namespace}/search", json={"question": question})
        client.append(time.perf_counter() - started)
        response.raise_for_status()
        for stage, seconds in response.json()["seconds"].items():
            stages.setdefault(stage, []).append(seconds)
    return {"client_p50_s": percentile(client, 0.5), "client_p95_s": percentile(client, 0.95), "n": count,
            "server_median_s": {stage: statistics.median(values) for stage, values in stages.items()}}  # fmt: skip


async def closed_loop(base: str, questions: list[tuple[str, str]], clients: int, duration: float, mix: dict[str, float], seed: int) -> dict[str, Any]:
    """``clients`` clients each sending its next request when the last is answered, for ``duration`` seconds."""
    seconds: dict[str, list[float]] = {kind: [] for kind in mix}
    errors: dict[str, int] = {}
    deadline = time.monotonic() + duration
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=900, limits=limits) as http:

        async def client(number: int) -> None:
            rng, sequence = random.Random(seed * 1000 + number), 0
            while time.monotonic() < deadline:
                kind = rng.choices(list(mix), list(mix.values()))[0]
                namespace, question = rng.choice(questions)
                if kind == "add":
                    sequence += 1
                    request = http.post(f"/v1/namespaces/{namespace}/sessions", json=session_body(f"c{number}-{sequence}", rng)[0])
                elif kind == "list":
                    request = http.get(f"/v1/namespaces/{namespace}/memory", params={"limit": 10})
                else:
                    request = http.post(f"/v1/namespaces/{namespace}/search", json={"question": question})
                started = time.perf_counter()
                response = await request
                if response.status_code == 200:
                    seconds[kind].append(time.perf_counter() - started)
                else:
                    errors[f"{kind} {response.status_code}"] = errors.get(f"{kind} {response.status_code}", 0) + 1

        started = time.perf_counter()
        await asyncio.gather(*(client(n) for n in range(clients)))
        wall = time.perf_counter() - started
    return {"clients": clients, "seconds": wall, "errors": errors, **{kind: summary(v, wall) for kind, v in seconds.items()}}


async def open_loop(base: str, questions: list[tuple[str, str]], rate: float, duration: float, seed: int) -> dict[str, Any]:
    """Searches arriving at random at ``rate`` a second for ``duration`` seconds, each on its own; answered ones timed."""
    rng, seconds, failed = random.Random(seed), [], 0
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=200)
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120, limits=limits) as http:

        async def one(namespace: str, question: str) -> None:
            nonlocal failed
            started = time.perf_counter()
            try:
                response = await http.post(f"/v1/namespaces/{namespace}/search", json={"question": question})
                if response.status_code == 200:
                    seconds.append(time.perf_counter() - started)
                    return
            except httpx.HTTPError:
                pass
            failed += 1

        tasks, started, offered = [], time.perf_counter(), 0
        at = started
        while at - started < duration:
            at += rng.expovariate(rate)
            await asyncio.sleep(max(0.0, at - time.perf_counter()))
            tasks.append(asyncio.create_task(one(*rng.choice(questions))))
            offered += 1
        await asyncio.gather(*tasks)
        wall = time.perf_counter() - started
    return {"offered_per_s": rate, "sent": offered, "sent_per_s": offered / duration, "answered_per_s": len(seconds) / wall, "failed": failed,
            "p50": percentile(seconds, 0.5) if seconds else None, "p95": percentile(seconds, 0.95) if seconds else None}  # fmt: skip


def timed(phase: dict[str, Any], before: float) -> dict[str, Any]:
    return {**phase, "load_before": before, "load_after": load_average()}


def search_batches(base: str) -> tuple[float, float]:
    """(sum, count) of the server's search batch sizes so far, from its metrics."""
    values = {}
    for line in httpx.get(f"{base}/metrics", timeout=60).text.splitlines():
        if line.startswith(("qgmem_search_batch_size_sum ", "qgmem_search_batch_size_count ")):
            name, value = line.split()
            values[name.rsplit("_", 1)[1]] = float(value)
    return values.get("sum", 0.0), values.get("count", 0.0)


def with_batches(phase: dict[str, Any], base: str, before: tuple[float, float]) -> dict[str, Any]:
    """``phase`` with the mean number of searches embedded together during it."""
    total, count = search_batches(base)
    return {**phase, "mean_search_batch": (total - before[0]) / (count - before[1]) if count > before[1] else None}


def run_arm(backend: str, reranker: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """One server of ``backend`` with ``reranker``: fill, service time, the closed loops, the open-loop curve."""
    started_at, machine, git = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), machine_info(), git_state()
    tenants_file = work / "tenants.yaml"
    tenants_file.write_text(yaml.safe_dump({"tenants": [{"name": "bench", "token": TOKEN, "prefixes": ["bench-"]}]}))
    config = {"pipeline": {**SERVER_CONFIG["pipeline"]}}
    extra = ["--torch-threads", str(args.torch_threads), "--reranker", reranker, "--rerank-top", str(args.rerank_top)]
    extra += ["--workers", str(args.workers)] if args.workers else []
    if reranker == "cross":
        model = args.cross_encoder or cross_encoder(work)
        config["pipeline"]["models"] = {"reranker_model": model, "reranker_runtime": "onnxruntime", "reranker_quantization": "int8"}
    (work / "serve.yaml").write_text(yaml.safe_dump(config))
    with postgres_store(args.postgres) if backend == "postgresql" else sqlite_store(work) as store:
        server = Server(store, tenants_file, work / "serve.yaml", work / "server.log", 8, tuple(extra))
        try:
            server.wait_ready()
            report: dict[str, Any] = {"started_at": started_at, "machine": machine, "git": git, "backend": backend, "reranker": reranker,
                                      "torch_threads": args.torch_threads, "workers": args.workers or "default (cores / torch threads)",
                                      "rerank_top": args.rerank_top, "namespaces": args.namespaces, "turns": args.turns,
                                      "cross_encoder": "given" if args.cross_encoder else ("MiniLM-L6 body, untrained head" if reranker == "cross" else None)}  # fmt: skip

            async def prepare() -> tuple[list[tuple[str, str]], dict[str, Any]]:
                async with httpx.AsyncClient(base_url="", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=900) as http:
                    questions = await fill(http, server.base, args.namespaces, args.turns, args.seed)
                    await service_time(http, server.base, questions, min(5, args.sequential))  # warm: indexes loaded, first calls made
                    before = load_average()
                    return questions, timed(await service_time(http, server.base, questions, args.sequential), before)

            questions, report["service_time"] = asyncio.run(prepare())
            for phase, mix in (("closed_searches", {"search": 1.0}), ("closed_mixed", MIXED)):
                before, batches = load_average(), search_batches(server.base)
                measured = asyncio.run(closed_loop(server.base, questions, args.clients, args.closed_s, mix, args.seed))
                report[phase] = with_batches(timed(measured, before), server.base, batches)
            report["open"] = []
            for rate in args.rates:
                before = load_average()
                point = timed(asyncio.run(open_loop(server.base, questions, rate, args.open_s, args.seed)), before)
                report["open"].append(point)
                if point["failed"] or (point["p95"] or 0) > SATURATED_P95_S:
                    break
            server.read_peak_rss()
            report["peak_rss_mib"] = server.peak_rss_mb
        finally:
            server.stop()
    return report


def fmt(value: float | None, scale: float = 1.0, digits: int = 1) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


def markdown(report: dict[str, Any]) -> str:
    """The report's tables, made from its JSON alone."""
    lines = ["# serve as a curve: service time, closed loops and latency against the offered rate", "",
             "One `python -m qgmem_train serve` process (MiniLM, turns-mode units, rule intents) and httpx clients on the same machine "
             "(`bench/bench_serve_curve.py`); latency is the client's, from send to answer, in milliseconds. The machine is shared: "
             "each phase's load average (1 min) before and after it is given.", "",
             "| arm | torch threads / workers | service time p50 ms (client / server) | server stages (median ms) | closed 32 clients, searches/s | p50 / p95 ms | "
             "searches a batch | load | mixed: searches/s, adds/s, lists/s | mixed search p50 / p95 ms | load |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    curves, notes = [], []
    for name, arm in report["arms"].items():
        if "not_run" in arm:
            lines.append(f"| {name} | not run: {arm['not_run']} |" + " |" * 9)
            continue
        st, cs, cm = arm["service_time"], arm["closed_searches"], arm["closed_mixed"]
        stages = ", ".join(f"{k} {v * 1000:.1f}" for k, v in st["server_median_s"].items() if k != "total")
        lines.append(
            f"| {name} | {arm['torch_threads']} / {arm['workers']} | {fmt(st['client_p50_s'], 1000)} / {fmt(st['server_median_s'].get('total'), 1000)} | "
            f"{stages} | {fmt(cs['search']['per_s'])} | {fmt(cs['search']['p50'], 1000, 0)} / {fmt(cs['search']['p95'], 1000, 0)} | "
            f"{fmt(cs.get('mean_search_batch'))} | {cs['load_before']} to {cs['load_after']} | {fmt(cm['search']['per_s'])}, {fmt(cm['add']['per_s'])}, {fmt(cm['list']['per_s'])} | "
            f"{fmt(cm['search']['p50'], 1000, 0)} / {fmt(cm['search']['p95'], 1000, 0)} | {cm['load_before']} to {cm['load_after']} |"
        )
        curves.append(f"| {name} | " + " ; ".join(
            f"{p['offered_per_s']:g} ({fmt(p.get('sent_per_s'))} sent): {fmt(p['answered_per_s'])} at {fmt(p['p50'], 1000, 0)} / {fmt(p['p95'], 1000, 0)} (load {p['load_before']})"
            for p in arm["open"]
        ) + " |")  # fmt: skip
        errors = {**cs["errors"], **cm["errors"]}
        notes.append(f"- {name}: {machine_text(arm['machine'])}, started {arm['started_at']}, commit {commit_text(arm['git'])}; {arm['namespaces']} "
                     f"namespaces of {arm['turns']} turns; reranker {arm['reranker']}" + (f" over the first {arm['rerank_top']} units ({arm['cross_encoder']})" if arm["reranker"] == "cross" else "")
                     + f"; requests other than 200: {errors or 'none'}; peak RSS {fmt(arm['peak_rss_mib'], 1, 0)} MiB")  # fmt: skip
    lines += ["", "Open loop (offered searches/s (sent/s): answered/s at p50 / p95 ms), until the server falls behind (p95 over 2 s):", "", "| arm | curve |", "|---|---|", *curves, "", *notes]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arms", nargs="+", choices=["sqlite", "postgresql"], default=["sqlite", "postgresql"])
    parser.add_argument("--rerankers", nargs="+", choices=["none", "cross"], default=["none", "cross"])
    parser.add_argument("--cross-encoder", help="a cross-encoder folder (default: one of MiniLM-L6's size with an untrained head)")
    parser.add_argument("--rerank-top", type=int, default=20, help="units the cross-encoder scores a search")
    parser.add_argument("--torch-threads", type=int, default=1, help="the server's --torch-threads")
    parser.add_argument("--workers", type=int, help="the server's --workers (default: its own)")
    parser.add_argument("--namespaces", type=int, default=20)
    parser.add_argument("--turns", type=int, default=20, help="turns of each namespace's session")
    parser.add_argument("--sequential", type=int, default=30, help="searches one at a time for the service time")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--closed-s", type=float, default=20.0, help="seconds of each closed loop")
    parser.add_argument("--open-s", type=float, default=10.0, help="seconds of each open-loop rate")
    parser.add_argument("--rates", nargs="+", type=float, default=[1, 5, 10, 25, 50, 100, 150, 200, 300])
    parser.add_argument("--postgres", help="PostgreSQL URI of an empty database (default: QGMEM_TEST_POSTGRES, else a local pgserver)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results", help="results folder")
    parser.add_argument("--name", default="serve_curve", help="writes <out>/<name>.json and .md")
    parser.add_argument("--report-only", nargs="+", type=Path, metavar="JSON", help="remake the markdown of these saved reports; nothing runs")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the arms, write the report (keeping arms not run now), print it; 2 for bad sizes."""
    import json

    args = parse_args(argv)
    if args.report_only:
        return remake_reports(args.report_only, markdown)
    sizes = {"clients": args.clients, "namespaces": args.namespaces, "turns": args.turns, "sequential": args.sequential, "torch-threads": args.torch_threads,
             "rerank-top": args.rerank_top, "closed-s": args.closed_s, "open-s": args.open_s, "rates": min(args.rates)}  # fmt: skip
    bad = next((k for k, v in sizes.items() if v <= 0), None)
    if bad:
        print(f"error: --{bad}: must be positive", file=sys.stderr)
        return 2
    path = args.out / f"{args.name}.json"
    report = json.loads(path.read_text()) if path.is_file() else {"arms": {}}
    for backend in args.arms:
        for reranker in args.rerankers:
            name = f"{backend}, reranker {reranker}"
            missing = postgres_missing() if backend == "postgresql" and not (args.postgres or os.environ.get("QGMEM_TEST_POSTGRES")) else None
            if missing:
                report["arms"][name] = {"not_run": missing}
                continue
            with tempfile.TemporaryDirectory(prefix="serve-curve-") as work:
                report["arms"][name] = run_arm(backend, reranker, args, Path(work))
    args.out.mkdir(parents=True, exist_ok=True)
    text = markdown(report)
    write_report_atomic(path, report, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
