"""``serve`` under load and faults: real server processes over one shared store, many HTTP clients, many tenants.

Each arm starts ``python -m qgmem_train serve`` processes (the bundled SmolLM2 and MiniLM, turns-mode units, rules
intent, no reranker) on free loopback ports over one store: ``sqlite`` (one server over a store folder, the baseline)
and ``postgresql`` (two servers over one PostgreSQL database: ``--postgres URI``, else ``QGMEM_TEST_POSTGRES``,
else a local one the ``pgserver`` wheel starts). ``--clients`` httpx clients then add sessions to, search, ask and
list ``--namespaces`` namespaces of ``--tenants`` tenants (bearer tokens, each owning its own set of namespaces) for
``--duration`` seconds, each request to a server picked at random; a share of the requests are reads with another
tenant's token. Afterwards, through every server:

- every acknowledged session is listed with all of its units, and a sample of them is found by a search;
- every read, write and delete with a token not owning the namespace is answered as an absent namespace (404), each
  tenant's listing holds only its own namespaces, and no token appears in a server's log;
- the fault case: sessions are written to one server, which is killed with ``kill -9`` while a long session is being
  stored; no in-flight session may be visible in part (a server started again, or the other one, lists all of its
  units or none), and the clients' retries with the same session ids store each exactly once.

    python bench/bench_serve_load.py [--arms sqlite postgresql] [--duration 300] [--clients 32] [--namespaces 1000]
    python bench/bench_serve_load.py --smoke          # a small run: the invariants, not the figures

Writes bench/results/serve_load.json and .md (``--out``, ``--name``); an arm run again replaces its own entry and
keeps the others'. Latency is per request kind (p50, p95); throughput is requests a second by kind over the load
phase; memory is each server process's peak resident set (VmHWM).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")

from bench.bench_serve import free_port, percentile  # noqa: E402
from qgmem_train.reports import commit_text, git_state, machine_info, machine_text, remake_reports  # noqa: E402

import httpx  # noqa: E402
import yaml  # noqa: E402

from qgmem_train.config import ConstructionConfig  # noqa: E402
from qgmem_train.fileio import write_report_atomic  # noqa: E402
from qgmem_train.memory.store import MemoryStore  # noqa: E402

ARMS = {"sqlite": 1, "postgresql": 2}
"""Each arm's backend and its number of server processes."""
MIX = {"add": 0.35, "search": 0.45, "ask": 0.05, "list": 0.10, "foreign": 0.05}
"""Default shares of the load's requests by kind (``--mix``); ``foreign`` is a read of another tenant's namespace. Asks
are few: each is a generate call that holds the server's one model thread for many seconds on a CPU."""
SERVER_CONFIG = {"pipeline": {"construction": {"units": "turns", "traces": False}, "generation": {"max_new_tokens": 32}}}
THINGS = ["locker", "garage", "bike lock", "safe", "alarm", "wifi", "gate", "mailbox", "gym locker", "office door",
          "storage unit", "suitcase", "laptop", "phone", "tablet", "shed", "boat", "studio", "cabin", "vault"]  # fmt: skip
FILLER = ["How was your week?", "Busy, but good.", "Anything new at work?", "We shipped the release on Friday.",
          "Did you travel anywhere?", "Only to my parents' place.", "How is the garden?", "The tomatoes are finally red."]  # fmt: skip
SMOKE = {"duration": 20.0, "clients": 8, "namespaces": 40, "tenants": 8, "fault_turns": 60, "verify_searches": 10, "mix": {**MIX, "ask": 0.0}}
"""The ``--smoke`` sizes: no asks (a CPU answers one in about a minute), so a test runs in about a minute an arm."""
REQUEST_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class Tenant:
    """One tenant of the benchmark: its token and the namespaces it owns."""

    name: str
    token: str
    namespaces: tuple[str, ...]


def make_tenants(tenants: int, namespaces: int, rng: random.Random) -> list[Tenant]:
    """``tenants`` tenants sharing ``namespaces`` namespaces out between them, each a set of exact names."""
    names = [f"user-{n:05d}" for n in range(namespaces)]
    return [Tenant(f"tenant-{t:03d}", f"bench-{t:03d}-{rng.getrandbits(96):024x}", tuple(names[t::tenants])) for t in range(tenants)]


def session_body(session_id: str, rng: random.Random, turns: int = 4) -> tuple[dict[str, Any], str]:
    """A session of ``turns`` turns whose first holds a fact of its own; the body and the question that finds it."""
    thing, code = rng.choice(THINGS), rng.randrange(100_000, 1_000_000)
    texts = [f"The code of my {thing} is {code}, do not forget it."] + [FILLER[(k + code) % len(FILLER)] for k in range(turns - 1)]
    body = {"session_id": session_id, "time": "2024-06-01",
            "turns": [{"speaker": "Alex" if k % 2 == 0 else "Sam", "text": text} for k, text in enumerate(texts)]}  # fmt: skip
    return body, f"What is the code of Alex's {thing}?"


class Server:
    """One ``python -m qgmem_train serve`` process on a free loopback port, its output in a log file."""

    def __init__(self, store: str, tenants_file: Path, config: Path, log: Path, max_batch: int, extra: tuple[str, ...] = ()) -> None:
        """``extra``: more options of ``serve`` (a later one overrides the same option given here)."""
        self.port, self.log = free_port(), log
        command = [sys.executable, "-m", "qgmem_train", "serve", "--store", store, "--tenants", str(tenants_file), "--config", str(config),
                   "--reranker", "none", "--intent", "rules", "--host", "127.0.0.1", "--port", str(self.port),
                   "--rate-per-minute", "1000000", "--burst", "100000", "--max-batch", str(max_batch), *extra]  # fmt: skip
        with open(log, "ab") as out:
            self.process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        self.peak_rss_mb: float | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 600.0) -> None:
        """Wait until ``/health`` answers; a server that exits first is an error naming its log."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server on port {self.port} exited with {self.process.returncode}; see {self.log}")
            try:
                if httpx.get(f"{self.base}/health", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"server on port {self.port} not up after {timeout:.0f} s; see {self.log}")

    def read_peak_rss(self) -> float | None:
        """The process's peak resident set so far (VmHWM, MiB), kept for the report."""
        try:
            for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    self.peak_rss_mb = int(line.split()[1]) / 1024
        except OSError:
            pass
        return self.peak_rss_mb

    def kill(self) -> None:
        """``kill -9``: no shutdown, no flush."""
        self.read_peak_rss()
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        self.read_peak_rss()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def auth(tenant: Tenant) -> dict[str, str]:
    return {"Authorization": f"Bearer {tenant.token}"}


def absent(namespace: str) -> dict[str, str]:
    """The body every endpoint answers for a namespace that is absent or not the caller's."""
    return {"error": f"namespace {namespace}: not found"}


@dataclass
class Load:
    """What the clients did: per-kind seconds and statuses, the acknowledged sessions, and reads that were not refused."""

    seconds: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    statuses: dict[str, dict[str, int]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(int)))
    acked: dict[str, dict[str, tuple[int, str]]] = field(default_factory=dict)
    """namespace -> session id -> (turns, the question that finds it), for every session a server acknowledged."""
    filled: list[str] = field(default_factory=list)
    """Namespaces holding an acknowledged session, in the order of their first."""
    leaks: list[str] = field(default_factory=list)

    def record(self, kind: str, status: int, seconds: float) -> None:
        self.statuses[kind][str(status)] += 1
        if 200 <= status < 300 or (kind == "foreign" and status == 404):
            self.seconds[kind].append(seconds)

    def acknowledge(self, namespace: str, body: dict[str, Any], question: str) -> None:
        if namespace not in self.acked:
            self.acked[namespace] = {}
            self.filled.append(namespace)
        self.acked[namespace][body["session_id"]] = (len(body["turns"]), question)

    def sessions(self) -> int:
        return sum(len(s) for s in self.acked.values())


async def load_phase(bases: list[str], tenants: list[Tenant], load: Load, clients: int, duration: float, mix: dict[str, float], seed: int) -> float:
    """``clients`` concurrent clients for ``duration`` seconds, each request to a random server; the phase's wall seconds."""
    owner = {ns: t for t in tenants for ns in t.namespaces}
    kinds, weights = list(mix), list(mix.values())
    deadline = time.monotonic() + duration
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits) as http:

        async def client(number: int) -> None:
            rng = random.Random(seed * 1000 + number)
            sequence = 0
            while time.monotonic() < deadline:
                kind = rng.choices(kinds, weights)[0] if load.filled else "add"
                base, body, question = rng.choice(bases), None, ""
                if kind == "add":
                    tenant = rng.choice(tenants)
                    namespace = rng.choice(tenant.namespaces)
                    sequence += 1
                    body, question = session_body(f"c{number:02d}-{sequence:05d}", rng)
                    method, path = "POST", f"/v1/namespaces/{namespace}/sessions"
                else:
                    namespace = rng.choice(load.filled)
                    tenant = owner[namespace]
                    method, path = "GET", f"/v1/namespaces/{namespace}/memory"
                    if kind == "foreign":
                        tenant = rng.choice([t for t in tenants if t is not owner[namespace]])
                    elif kind in ("search", "ask"):
                        questions = [q for _, q in load.acked[namespace].values()]
                        method, path, body = "POST", f"{path.rsplit('/', 1)[0]}/{kind}", {"question": rng.choice(questions)}
                started = time.perf_counter()
                response = await http.request(method, base + path, json=body, headers=auth(tenant))
                load.record(kind, response.status_code, time.perf_counter() - started)
                if kind == "add" and response.status_code == 200:
                    load.acknowledge(namespace, body, question)
                if kind == "foreign" and (response.status_code != 404 or response.json() != absent(namespace)):
                    load.leaks.append(f"{method} {path} by {tenant.name}: {response.status_code}")

        started = time.perf_counter()
        await asyncio.gather(*(client(n) for n in range(clients)))
        return time.perf_counter() - started


async def listing(http: httpx.AsyncClient, base: str, namespace: str, tenant: Tenant) -> tuple[set[str], dict[str, int], int]:
    """The namespace's listed sessions, its units counted by session (every page of both), and unit ids listed twice."""
    offset, units, seen, twice = 0, defaultdict(int), set(), 0
    sessions: set[str] = set()
    while True:
        response = await http.get(f"{base}/v1/namespaces/{namespace}/sessions", params={"offset": len(sessions), "limit": 1000}, headers=auth(tenant))
        if response.status_code == 404:
            return set(), {}, 0
        response.raise_for_status()
        page = response.json()
        sessions |= {s["session_id"] for s in page["sessions"]}
        if len(sessions) >= page["sessions_total"] or not page["sessions"]:
            break
    while True:
        response = await http.get(f"{base}/v1/namespaces/{namespace}/memory", params={"offset": offset, "limit": 1000}, headers=auth(tenant))
        if response.status_code == 404:
            return set(), {}, 0
        response.raise_for_status()
        page = response.json()
        for unit in page["units"]:
            units[unit["id"].rsplit(":", 1)[0]] += 1
            twice += unit["id"] in seen
            seen.add(unit["id"])
        offset += len(page["units"])
        if offset >= page["units_total"] or not page["units"]:
            return sessions, dict(units), twice


async def gathered(jobs: list, limit: int) -> list:  # noqa: ANN001
    """Await the coroutines ``jobs`` with at most ``limit`` running at once, in order."""
    gate = asyncio.Semaphore(limit)

    async def one(job):  # noqa: ANN001, ANN202
        async with gate:
            return await job

    return await asyncio.gather(*(one(job) for job in jobs))


async def isolation_phase(bases: list[str], tenants: list[Tenant], load: Load, sample: int, clients: int, seed: int) -> dict[str, Any]:
    """Every endpoint on another tenant's namespace (read, write, delete) with a wrong token, each tenant's listing, unknown
    tokens: how many attempts, and every one that was not refused as an absent namespace."""
    rng = random.Random(seed)
    owner = {ns: t for t in tenants for ns in t.namespaces}
    targets = rng.sample(load.filled, min(sample, len(load.filled)))
    leaks: list[str] = []
    attempts = 0
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S) as http:

        async def intrude(namespace: str) -> None:
            nonlocal attempts
            intruder = rng.choice([t for t in tenants if t is not owner[namespace]])
            base, path = rng.choice(bases), f"/v1/namespaces/{namespace}"
            tries = [("GET", f"{path}/memory", None), ("POST", f"{path}/search", {"question": "What is the code?"}),
                     ("POST", f"{path}/ask", {"question": "What is the code?"}), ("DELETE", path, None),
                     ("POST", f"{path}/sessions", session_body(f"intruder-{intruder.name}", rng)[0])]  # fmt: skip
            for method, url, body in tries:
                attempts += 1
                response = await http.request(method, base + url, json=body, headers=auth(intruder))
                if response.status_code != 404 or response.json() != absent(namespace):
                    leaks.append(f"{method} {url} by {intruder.name}: {response.status_code}")

        async def own_listing(tenant: Tenant) -> None:
            nonlocal attempts
            attempts += 1
            listed = (await http.get(rng.choice(bases) + "/v1/namespaces", headers=auth(tenant))).json()["namespaces"]
            leaks.extend(f"GET /v1/namespaces by {tenant.name} lists {ns}" for ns in listed if ns not in tenant.namespaces)

        async def unknown_token(namespace: str) -> None:
            nonlocal attempts
            attempts += 1
            stranger = Tenant("stranger", f"unknown-{rng.getrandbits(96):024x}", ())
            response = await http.get(f"{rng.choice(bases)}/v1/namespaces/{namespace}/memory", headers=auth(stranger))
            if response.status_code != 401:
                leaks.append(f"GET memory of {namespace} with an unknown token: {response.status_code}")

        jobs = [intrude(ns) for ns in targets] + [own_listing(t) for t in tenants] + [unknown_token(ns) for ns in targets[:20]]
        await gathered(jobs, clients)
    return {"namespaces_tried": len(targets), "attempts": attempts, "leaks": leaks}


async def verify_phase(bases: list[str], tenants: list[Tenant], load: Load, searches: int, clients: int, seed: int) -> dict[str, Any]:
    """Through every server: each acknowledged session listed with all of its units, none twice, no intruder's session;
    then a sample of sessions searched for by their own question."""
    owner = {ns: t for t in tenants for ns in t.namespaces}
    lost: list[str] = []
    strays: list[str] = []
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S) as http:

        async def check(base: str, namespace: str) -> None:
            sessions, units, twice = await listing(http, base, namespace, owner[namespace])
            for session_id, (turns, _) in load.acked[namespace].items():
                if session_id not in sessions or units.get(session_id) != turns:
                    lost.append(f"{base} {namespace}/{session_id}: listed {session_id in sessions}, {units.get(session_id, 0)} of {turns} units")
            strays.extend(f"{base} {namespace}/{s}" for s in sessions if s.startswith("intruder-"))
            if twice:
                lost.append(f"{base} {namespace}: {twice} unit ids listed twice")

        await gathered([check(base, ns) for base in bases for ns in load.acked], clients)
        rng = random.Random(seed)
        every = [(ns, sid, question) for ns, sessions in load.acked.items() for sid, (_, question) in sessions.items()]
        sample = rng.sample(every, min(searches, len(every)))

        async def search(namespace: str, session_id: str, question: str) -> bool:
            response = await http.post(f"{rng.choice(bases)}/v1/namespaces/{namespace}/search", json={"question": question}, headers=auth(owner[namespace]))
            response.raise_for_status()
            return any(unit["id"].startswith(f"{session_id}:") for unit in response.json()["units"])

        found = await gathered([search(*item) for item in sample], clients)
    return {"sessions": len(every), "servers_checked": len(bases), "lost": lost, "intruder_sessions": strays,
            "searched": len(sample), "found_by_search": sum(found)}  # fmt: skip


async def fault_writes(base: str, tenant: Tenant, big_turns: int, small_writers: int, store: str, seed: int, victim: Server) -> dict[str, Any]:
    """Small sessions from ``small_writers`` clients and long sessions one after another into one namespace, all to ``victim``,
    which is killed (``kill -9``) inside the second long session's add: at a random point of the first one's duration (an add
    commits its turns and windows together, so the store shows nothing in between); every session whose request got no
    answer is returned as in flight."""
    rng = random.Random(seed)
    namespace = tenant.namespaces[0]
    in_flight: list[tuple[str, dict[str, Any]]] = []
    acked: list[tuple[str, dict[str, Any]]] = []
    killed = threading.Event()
    observed: dict[str, Any] = {"long_sessions_sent": 0, "windows_at_kill": None}
    kill_at: list[float] = []
    """When to kill: set as the second long session is sent."""
    cc = ConstructionConfig()
    windows = 1 + math.ceil(max(0, big_turns - cc.window) / (cc.window - cc.overlap))

    async def send(http: httpx.AsyncClient, ns: str, body: dict[str, Any]) -> None:
        if killed.is_set():
            return
        try:
            response = await http.post(f"{base}/v1/namespaces/{ns}/sessions", json=body, headers=auth(tenant))
            response.raise_for_status()
            acked.append((ns, body))
        except httpx.HTTPError:  # no answer (the kill), or a refusal: the client retries either
            in_flight.append((ns, body))

    async def small(http: httpx.AsyncClient, number: int) -> None:
        sequence = 0
        while not killed.is_set():
            sequence += 1
            await send(http, rng.choice(tenant.namespaces[1:] or tenant.namespaces), session_body(f"fault-w{number}-{sequence:04d}", rng)[0])

    async def long(http: httpx.AsyncClient) -> None:
        first_s = None
        while not killed.is_set():
            observed["long_sessions_sent"] += 1
            if first_s is not None:
                kill_at.append(time.monotonic() + rng.uniform(0.3, 0.7) * first_s)
            started = time.monotonic()
            await send(http, namespace, session_body(f"fault-long-{observed['long_sessions_sent']:02d}", rng, big_turns)[0])
            first_s = first_s or time.monotonic() - started

    def watch() -> None:
        """Kill the victim when the second long session's add is due to be half done, then count its windows stored."""
        deadline = time.monotonic() + 600
        while not kill_at and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(max(0.0, (kill_at[0] if kill_at else 0.0) - time.monotonic()))
        killed.set()
        victim.kill()
        sid = f"fault-long-{observed['long_sessions_sent']:02d}"
        with MemoryStore.open(store) as reader:
            done = sum(1 for session, _ in reader.done_windows(namespace) if session == sid) if reader.has_namespace(namespace) else 0
        observed["windows_at_kill"] = f"{done} of {windows}"

    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S) as http:
        writers = [asyncio.create_task(small(http, n)) for n in range(small_writers)] + [asyncio.create_task(long(http))]
        await asyncio.to_thread(watch)
        await asyncio.gather(*writers)
    return {"namespace": namespace, "in_flight": in_flight, "acked": acked, **observed}


async def fault_check(base: str, tenant: Tenant, writes: dict[str, Any]) -> dict[str, Any]:
    """After the kill, through ``base``: each in-flight session absent or whole (never part), the acknowledged ones whole;
    then each in-flight one retried with its session id and found stored exactly once."""
    states: dict[str, list[str]] = {"absent": [], "whole": [], "partial": []}
    retried_once: list[str] = []
    problems: list[str] = []
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S) as http:

        async def state(namespace: str, body: dict[str, Any]) -> str:
            sessions, units, twice = await listing(http, base, namespace, tenant)
            sid, turns = body["session_id"], len(body["turns"])
            count = units.get(sid, 0)
            if twice:
                problems.append(f"{namespace}: {twice} unit ids listed twice")
            if count == turns and sid in sessions:
                return "whole"
            return "absent" if count == 0 and sid not in sessions else "partial"

        for namespace, body in writes["in_flight"]:
            found = await state(namespace, body)
            states[found].append(f"{body['session_id']} ({len(body['turns'])} turns)")
        for namespace, body in writes["acked"]:
            if await state(namespace, body) != "whole":
                problems.append(f"acknowledged {body['session_id']} not whole after the kill")
        for namespace, body in writes["in_flight"]:
            response = await http.post(f"{base}/v1/namespaces/{namespace}/sessions", json=body, headers=auth(tenant))
            if response.status_code == 200 and await state(namespace, body) == "whole":
                retried_once.append(body["session_id"])
            else:
                problems.append(f"retry of {body['session_id']}: {response.status_code}, not stored whole once")
    return {"in_flight": len(writes["in_flight"]), "acked_before_kill": len(writes["acked"]), **states,
            "retried_stored_once": retried_once, "problems": problems}  # fmt: skip


@contextmanager
def postgres_store(uri: str | None) -> Iterator[str]:
    """The PostgreSQL URI of the arm: ``uri``, else ``QGMEM_TEST_POSTGRES``, else a new local server (``pgserver``) in a
    folder of its own (run as root, pgserver runs PostgreSQL as another user, who must reach the folder)."""
    uri = uri or os.environ.get("QGMEM_TEST_POSTGRES")
    if uri:
        yield uri
        return
    import pgserver

    folder = tempfile.mkdtemp(prefix="qgmem-bench-postgres-")
    server = pgserver.get_server(folder, cleanup_mode="stop")
    try:
        yield server.get_uri()
    finally:
        server.cleanup()
        shutil.rmtree(folder, ignore_errors=True)


def postgres_missing() -> str | None:
    """Why the PostgreSQL arm cannot run here, or None when it can."""
    import importlib.util

    for module in ("psycopg", "pgserver"):
        if importlib.util.find_spec(module) is None:
            return f"the {module} package is not installed"
    return None


def run_arm(arm: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """One arm: its servers over one store, the load, isolation and verification phases, then the fault case."""
    started_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    machine, git = machine_info(), git_state()
    rng = random.Random(args.seed)
    tenants = make_tenants(args.tenants, args.namespaces, rng)
    tenants_file = work / "tenants.yaml"
    tenants_file.write_text(yaml.safe_dump({"tenants": [{"name": t.name, "token": t.token, "namespaces": list(t.namespaces)} for t in tenants]}))
    tenants_file.chmod(0o600)
    config = work / "serve.yaml"
    config.write_text(yaml.safe_dump(SERVER_CONFIG))
    with postgres_store(args.postgres) if arm == "postgresql" else sqlite_store(work) as store:
        clock = time.perf_counter()
        servers = [Server(store, tenants_file, config, work / f"server-{n}.log", args.max_batch) for n in range(ARMS[arm])]
        try:
            for server in servers:
                server.wait_ready()
            startup_s = time.perf_counter() - clock
            bases = [s.base for s in servers]
            load = Load()
            asyncio.run(warm_up(bases, tenants[0], load, args.mix["ask"] > 0, args.seed))
            wall = asyncio.run(load_phase(bases, tenants, load, args.clients, args.duration, args.mix, args.seed))
            isolation = asyncio.run(isolation_phase(bases, tenants, load, args.isolation_namespaces, args.clients, args.seed))
            verified = asyncio.run(verify_phase(bases, tenants, load, args.verify_searches, args.clients, args.seed))
            for server in servers:
                server.read_peak_rss()
            victim = servers[-1]
            writes = asyncio.run(fault_writes(victim.base, tenants[-1], args.fault_turns, args.fault_writers, store, args.seed, victim))
            checker = servers[0] if len(servers) > 1 else Server(store, tenants_file, config, work / "server-restarted.log", args.max_batch)
            checker.wait_ready()
            fault = {"killed": "the only server, started again on the same store" if checker is not servers[0] else "server 2 of 2; checked through server 1",
                     "long_session_turns": args.fault_turns, "long_sessions_sent": writes["long_sessions_sent"],
                     "windows_of_long_session_stored_at_kill": writes["windows_at_kill"],
                     **asyncio.run(fault_check(checker.base, tenants[-1], writes))}  # fmt: skip
            if checker is not servers[0]:
                checker.stop()
        finally:
            for server in servers:
                server.stop()
    logs = "".join(log.read_text(errors="replace") for log in sorted(work.glob("server-*.log")))
    return {
        "started_at": started_at, "machine": machine, "git": git, "servers": ARMS[arm], "startup_s": startup_s,
        "clients": args.clients, "namespaces": args.namespaces, "tenants": args.tenants, "mix": args.mix, "duration_s": wall,
        "requests": {kind: dict(codes) for kind, codes in load.statuses.items()},
        "latency_s": {kind: {"p50": percentile(v, 0.5), "p95": percentile(v, 0.95), "n": len(v)} for kind, v in load.seconds.items() if v},
        "per_s": {kind: len(v) / wall for kind, v in load.seconds.items()},
        "sessions_acked": load.sessions(), "namespaces_filled": len(load.filled), "load_cross_tenant_reads": len(load.seconds["foreign"]),
        "load_leaks": load.leaks, "isolation": isolation, "verified": verified, "fault": fault,
        "peak_rss_mib": [s.peak_rss_mb for s in servers], "tokens_in_logs": sum(t.token in logs for t in tenants),
    }  # fmt: skip


@contextmanager
def sqlite_store(work: Path) -> Iterator[str]:
    """The SQLite arm's store: a folder in ``work``."""
    yield str(work / "store")


async def warm_up(bases: list[str], tenant: Tenant, load: Load, ask: bool, seed: int) -> None:
    """One session (and with ``ask`` one ask) through each server before the clock starts (first loads, grammar compile)."""
    rng = random.Random(seed)
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S) as http:
        for n, base in enumerate(bases):
            namespace = tenant.namespaces[0]
            body, question = session_body(f"warm-{n}", rng)
            (await http.post(f"{base}/v1/namespaces/{namespace}/sessions", json=body, headers=auth(tenant))).raise_for_status()
            load.acknowledge(namespace, body, question)
            if ask:
                (await http.post(f"{base}/v1/namespaces/{namespace}/ask", json={"question": question}, headers=auth(tenant))).raise_for_status()


def failures(arm: dict[str, Any]) -> list[str]:
    """The invariants an arm broke: sessions lost, cross-tenant reads, tokens logged, sessions partly visible after the
    kill or not stored once on retry."""
    verified, fault = arm["verified"], arm["fault"]
    found = [f"lost: {x}" for x in verified["lost"]] + [f"intruder session stored: {x}" for x in verified["intruder_sessions"]]
    found += [f"cross-tenant: {x}" for x in arm["load_leaks"] + arm["isolation"]["leaks"]]
    found += [f"partly visible after kill -9: {x}" for x in fault["partial"]] + [f"fault: {x}" for x in fault["problems"]]
    if len(fault["retried_stored_once"]) != fault["in_flight"]:
        found.append(f"fault: {fault['in_flight'] - len(fault['retried_stored_once'])} retries not stored once")
    if arm["tokens_in_logs"]:
        found.append(f"{arm['tokens_in_logs']} tokens in the servers' logs")
    return found


def fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown(report: dict[str, Any]) -> str:
    """The report's tables, made from its JSON alone."""
    lines = ["# serve under load: clients, tenants and namespaces over one shared store, and a server killed mid-write", "",
             "Server processes of `python -m qgmem_train serve` (SmolLM2-135M-Instruct answering up to 32 new tokens, MiniLM, "
             "turns-mode units, rules intent, no reranker) on loopback; httpx clients send each request to a random server. "
             "`bench/bench_serve_load.py`; each arm's machine and load average are below, the machine being shared with other work. "
             "Latency is measured at the client, from send to answer: with the clients in a closed loop it includes the wait behind "
             "the server's one model thread, which runs adds, searches and asks in arrival order. Seconds are the load phase's, until "
             "its last request was answered; requests a second are answered requests of the kind over those seconds.", "",
             "| arm | servers | clients | tenants / namespaces | seconds | add/s | search/s | ask/s | list/s | search p50 / p95 s | ask p50 / p95 s "
             "| add p50 / p95 s | sessions acked | lost | cross-tenant tries / leaks | peak RSS MiB per server |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    notes = []
    for name, arm in report["arms"].items():
        if "not_run" in arm:
            lines.append(f"| {name} | {arm['servers']} | not run: {arm['not_run']} |" + " |" * 13)
            continue
        lat, rate, ver, iso = arm["latency_s"], arm["per_s"], arm["verified"], arm["isolation"]
        pair = lambda kind: f"{fmt(lat.get(kind, {}).get('p50'))} / {fmt(lat.get(kind, {}).get('p95'))}"  # noqa: E731
        tries = iso["attempts"] + arm["load_cross_tenant_reads"]
        leaks = len(iso["leaks"]) + len(arm["load_leaks"])
        lines.append(
            f"| {name} | {arm['servers']} | {arm['clients']} | {arm['tenants']} / {arm['namespaces']} | {arm['duration_s']:.0f} | "
            f"{fmt(rate.get('add'))} | {fmt(rate.get('search'))} | {fmt(rate.get('ask'))} | {fmt(rate.get('list'))} | {pair('search')} | {pair('ask')} | "
            f"{pair('add')} | {ver['sessions']} | {len(ver['lost'])} | {tries} / {leaks} | {', '.join(fmt(m, 0) for m in arm['peak_rss_mib'])} |"
        )
        errors = {kind: {c: n for c, n in codes.items() if not c.startswith("2") and not (kind == "foreign" and c == "404")} for kind, codes in arm["requests"].items()}
        errors = {kind: codes for kind, codes in errors.items() if codes}
        notes.append(f"- {name}: {machine_text(arm['machine'])}, started {arm['started_at']}, commit {commit_text(arm['git'])}; "
                     f"servers up in {arm['startup_s']:.0f} s; request shares {arm['mix']}; {arm['namespaces_filled']} namespaces filled; "
                     f"{ver['found_by_search']} of {ver['searched']} sampled sessions found by a search of their own question; "
                     f"requests other than 2xx: {errors or 'none'}; tokens in the servers' logs: {arm['tokens_in_logs']}")  # fmt: skip
    lines += ["", "Kill -9 in the middle of writes (small sessions from several clients and one long session at a time, to one server, "
              "killed inside a long session's add: before adds committed whole, on the first sight of its turns in the store before all "
              "its windows; since, at a random 30-70 % of the first long add's duration into the second):", "",
              "| arm | killed | long session turns | its windows stored at the kill | in flight | absent / whole / partly visible | retries stored once | problems |",
              "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, arm in report["arms"].items():
        if "not_run" in arm:
            continue
        f = arm["fault"]
        lines.append(f"| {name} | {f['killed']} | {f['long_session_turns']} | {f['windows_of_long_session_stored_at_kill']} | {f['in_flight']} | "
                     f"{len(f['absent'])} / {len(f['whole'])} / {len(f['partial'])} | {len(f['retried_stored_once'])} of {f['in_flight']} | "
                     f"{len(f['problems'])} |")  # fmt: skip
    lines += ["", *notes]
    for name, arm in report["arms"].items():
        if "not_run" not in arm:
            broken = failures(arm)
            lines.append(f"- {name} invariants: " + ("all held" if not broken else f"{len(broken)} broken, first: {broken[0]}"))
    return "\n".join(lines) + "\n"


def share(text: str) -> tuple[str, float]:
    """One ``KIND=SHARE`` of ``--mix``."""
    kind, _, value = text.partition("=")
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if kind not in MIX or number < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected KIND=SHARE with KIND one of {', '.join(MIX)} and SHARE >= 0")
    return kind, number


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS), help="sqlite: one server over a folder; postgresql: two over one database")
    parser.add_argument("--duration", type=float, default=300.0, help="seconds of load")
    parser.add_argument("--clients", type=int, default=32, help="concurrent HTTP clients")
    parser.add_argument("--namespaces", type=int, default=1000)
    parser.add_argument("--tenants", type=int, default=100, help="tokens, the namespaces dealt out between them")
    parser.add_argument("--max-batch", type=int, default=8, help="the servers' --max-batch")
    parser.add_argument("--isolation-namespaces", type=int, default=200, help="namespaces tried with a wrong token after the load")
    parser.add_argument("--verify-searches", type=int, default=100, help="acknowledged sessions searched for after the load")
    parser.add_argument("--fault-turns", type=int, default=120, help="turns of the long sessions of the fault case")
    parser.add_argument("--fault-writers", type=int, default=4, help="clients writing small sessions in the fault case")
    parser.add_argument("--postgres", help="PostgreSQL URI of an empty database (default: QGMEM_TEST_POSTGRES, else a local pgserver)")
    parser.add_argument("--mix", nargs="+", type=share, default=[], metavar="KIND=SHARE", help=f"request shares changed from {MIX}")
    parser.add_argument("--smoke", action="store_true", help=f"small sizes for tests: {SMOKE}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results", help="results folder")
    parser.add_argument("--name", default="serve_load", help="writes <out>/<name>.json and .md")
    parser.add_argument("--report-only", nargs="+", type=Path, metavar="JSON", help="remake the markdown of these saved reports; nothing runs")
    args = parser.parse_args(argv)
    args.mix = {**MIX, **dict(args.mix)}
    if args.smoke:
        for key, value in SMOKE.items():
            setattr(args, key, value)
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the arms, write the report (keeping the arms not run now), print it; 1 when an invariant broke, 2 for bad options."""
    args = parse_args(argv)
    if args.report_only:
        return remake_reports(args.report_only, markdown)
    small = {k: getattr(args, k) for k in ("clients", "namespaces", "tenants", "max_batch", "fault_turns", "fault_writers")}
    bad = next((k for k, v in small.items() if v < 1), None) or ("duration" if args.duration <= 0 else None)
    if bad or args.tenants < 2 or args.tenants > args.namespaces:
        print(f"error: --{(bad or 'tenants').replace('_', '-')}: sizes must be positive, with 2 <= tenants <= namespaces", file=sys.stderr)
        return 2
    if args.mix["add"] <= 0:
        print("error: --mix: the share of add must be positive (the other kinds read what adds stored)", file=sys.stderr)
        return 2
    path = args.out / f"{args.name}.json"
    report = json.loads(path.read_text()) if path.is_file() else {"arms": {}}
    for arm in args.arms:
        missing = postgres_missing() if arm == "postgresql" and not (args.postgres or os.environ.get("QGMEM_TEST_POSTGRES")) else None
        if missing:
            report["arms"][arm] = {"servers": ARMS[arm], "not_run": missing}
            continue
        with tempfile.TemporaryDirectory(prefix=f"serve-load-{arm}-") as work:
            report["arms"][arm] = run_arm(arm, args, Path(work))
    args.out.mkdir(parents=True, exist_ok=True)
    text = markdown(report)
    write_report_atomic(path, report, text)
    print(text)
    return 1 if any(failures(arm) for arm in report["arms"].values() if "not_run" not in arm) else 0


if __name__ == "__main__":
    sys.exit(main())
