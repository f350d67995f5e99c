"""Bulk load of a namespace: version 2's per-row JSON, version 3's vectors in the database and version 4's sidecars, side by side.

Run ``python bench/bench_store_load.py --sizes 10000 100000 --new-only 1000000``, and with ``--baseline-code DIR`` (a
folder holding the ``qgmem_train`` package of before the sidecars, e.g. ``git archive 3904d34 qgmem_train | tar -x -C DIR``)
to load each size also as version 3, with that code, from a copy of the store in version 3's layout (``tests/store_v3.py``). For each size, synthetic turns-like units
(one unit per turn, texts of LoCoMo turn lengths, 0-3 entities out of 5,000 names and 0-1 location out
of 500 places, a fact time on one unit in three, random unit vectors of dim 384 with the same vector for
the same attribute text, and 2 to 4 sentence vectors a unit) are written twice: through the store's
write API (``put_turns``, then ``add_windows`` with ``--write-units`` units a call, merged as a build's
writes are) and with SQL in version 2's row-per-unit format (``tests/store_v2.py``). Each load runs
``--repeats`` times, each in a fresh subprocess reporting its wall seconds, its resident memory before
loading and its peak (VmRSS and VmHWM of /proc/self/status), and its CPU seconds (user + system: on a shared
machine, the wall time also counts the time other processes held the cores). The version-2 loader below is the package's loader before segments;
it lives only here. Version 4 is also loaded without its sentence vectors (``v4-lean``), as trace consolidation and
retrieval with ``retrieval.sentence_vectors`` off read it; ``--new-only`` sizes are not written in version 2. The columnar load decodes units when they are read, so its side also reports the
time to decode them all (``list(memory.units)``), which the version-2 loader does while loading.
With ``--before-code DIR`` (a folder holding an earlier ``qgmem_train`` package) the same version-4 store is also
loaded with that code (``v4-before``), and with ``--dense-index`` every load also makes the dense channel's code scan
(``DenseIndex(..., scan="int8")``: the code before encodes every fact and sentence vector, this code takes each
segment's codes file, int8 mapped or product-quantised read), timed apart and counted in the peak memory, and times
:data:`DENSE_QUERIES` top-100 searches of it near random units (p50 / p95: the scan as a loaded namespace runs it,
its vectors where the load left them). With ``--activation`` the version-4 store is also loaded ``--repeats`` more times (and as many with
``--before-code``'s package, taking turns), each load followed by the activation index a predictor builds after loading (BM25, the dense channel over the stored codes,
attributes; the default retrieval configuration; it decodes the units it reads), timed apart, and
:data:`ACTIVATION_QUERIES` queries near random units are timed through every channel and the fusion (p50 / p95 per
channel), as ``bench_activation.py`` does on namespaces made in memory.
Everything runs on one thread (numpy/BLAS and faiss, children included). Results: bench/results/<--name>.{json,md}; the
stores are written to a temporary folder (``--workdir``).
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"  # one thread, as bench_activation.py: on shared cores small scans lose most to thread hand-offs

import argparse  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from datetime import date, timedelta  # noqa: E402
from pathlib import Path  # noqa: E402

from qgmem_train.reports import machine_info  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

from qgmem_train.fileio import write_report_atomic  # noqa: E402
from qgmem_train.memory import segments  # noqa: E402
from qgmem_train.memory.store import ENTITY, LOCATION, AttributeIndex, EmbeddedUnit, MemoryStore, NamespaceMemory, WindowResult  # noqa: E402
from qgmem_train.memory.types import Conversation, MemoryUnit, Session, TimeSpan, Trace, Turn  # noqa: E402
from tests import store_v2  # noqa: E402

NAMESPACE = "synthetic"
LOADERS = {
    "v2": "v2 per-row JSON", "v3": "v3 columnar, vectors in the database (code before)", "v4": "v4 columnar, mapped vector sidecars",
    "v4-lean": "v4, no sentence vectors", "v4-before": "v4 store, the --before-code package",
}  # fmt: skip
"""Each loader measured: ``v4-lean`` is ``load_namespace(sentences=False)``, as trace consolidation and retrieval
with ``retrieval.sentence_vectors`` off read a namespace."""
DIM = 384
DENSE_QUERIES = 50
"""Top-100 searches timed on each loaded namespace with ``--dense-index``."""
ACTIVATION_QUERIES = 50
"""Queries through every channel and the fusion timed on each loaded version-4 namespace with ``--activation``."""
TURNS_PER_SESSION = 20
UNITS_PER_WINDOW = 4
SPEAKERS = ("Caroline", "Melanie")
WORDS = (
    "I we you the a to and of went saw bought painted visited met talked about my our friend family kids dog park beach lake museum "
    "concert weekend yesterday last week summer really so great fun new old little big support group camping hiking pottery book "
    "class job interview school game dinner trip photo picture sunset garden music guitar race charity festival city home"
).split()


def _unit_vectors(rng: np.random.Generator, rows: int) -> np.ndarray:
    vectors = rng.standard_normal((rows, DIM)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


class Synthetic:
    """Turns-like units, generated a batch at a time from one seed: the same units for both formats."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        names = [f"{w.title()}{k}" for k, w in enumerate(np.random.default_rng(seed + 1).choice(WORDS, 5000))]
        places = [f"{w.title()} Street {k}" for k, w in enumerate(np.random.default_rng(seed + 2).choice(WORDS, 500))]
        self.names, self.places = names, places
        self.text_vector = dict(zip([*names, *places, *SPEAKERS], _unit_vectors(np.random.default_rng(seed + 3), len(names) + len(places) + 2)))

    @staticmethod
    def turn_id(i: int) -> str:
        return f"D{i // TURNS_PER_SESSION + 1}:{i % TURNS_PER_SESSION + 1}"

    @staticmethod
    def session(i: int) -> str:
        return f"session_{i // TURNS_PER_SESSION + 1}"

    @staticmethod
    def session_time(i: int) -> str:
        return f"{2020 + i // TURNS_PER_SESSION // 365 % 8}-{1 + i // TURNS_PER_SESSION % 12:02d}-{1 + i // TURNS_PER_SESSION % 28:02d}"

    def text(self) -> str:
        return " ".join(self.rng.choice(WORDS, int(self.rng.integers(6, 40)))).capitalize() + "."

    def batch(self, lo: int, hi: int) -> tuple[list[EmbeddedUnit], list[int], list[tuple[str, str, str, str, str]]]:
        """Units ``lo`` to ``hi`` (one per turn), each one's index in its window, and the turns as (id, session, speaker, text, time)."""
        items, subs, turns = [], [], []
        facts, relations = _unit_vectors(self.rng, hi - lo), _unit_vectors(self.rng, hi - lo)
        for k, i in enumerate(range(lo, hi)):
            speaker, text, time_ = SPEAKERS[i % 2], self.text(), self.session_time(i)
            entities = list(dict.fromkeys(self.rng.choice(self.names, int(self.rng.integers(0, 4))).tolist()))
            locations = self.rng.choice(self.places, int(self.rng.integers(0, 2))).tolist()
            fact_time = [TimeSpan(time_[:10], time_[:10], "day")] if i % 3 == 0 else []
            unit = MemoryUnit(
                self.turn_id(i), self.session(i), f"{speaker}: {text}", speaker, "says", text[:40], [self.turn_id(i)], f"{speaker}: {text}",
                time_, i, fact_time, entities, locations,
            )  # fmt: skip
            attributes = np.asarray([self.text_vector[t] for t in entities + locations], np.float32).reshape(-1, DIM)
            sentences = _unit_vectors(self.rng, int(self.rng.integers(2, 5)))
            items.append(EmbeddedUnit(unit, facts[k], relations[k], attributes, sentences, self.text_vector[speaker]))
            subs.append(i % TURNS_PER_SESSION % UNITS_PER_WINDOW)
            turns.append((unit.id, unit.session_id, speaker, text, time_))
        return items, subs, turns


def write_stores(units: int, workdir: Path, write_units: int, *, with_v2: bool = True, with_v3: bool = False) -> dict[str, object]:
    """The same synthetic namespace written through the store (and, ``with_v2``, in version 2's rows; ``with_v3``,
    copied into version 3's layout); returns write times, segment count and folder sizes."""
    new_dir, old_dir = workdir / f"v4-{units}", workdir / f"v2-{units}"
    synthetic = Synthetic()
    old = None
    if with_v2:
        old = store_v2.create_store(old_dir, "synthetic-384", DIM)
        store_v2.add_namespace(old, NAMESPACE, "turns")
    timings = {"v2": 0.0, "v4": 0.0}
    with MemoryStore.open(new_dir, create=True) as store:
        store.ensure_namespace(NAMESPACE, "turns", "synthetic-384", DIM, window=6, overlap=2)
        for lo in range(0, units, write_units):
            items, subs, turns = synthetic.batch(lo, min(units, lo + write_units))
            started = time.perf_counter()
            if old is not None:
                old.execute("BEGIN")
                store_v2.add_units(old, NAMESPACE, items, subs)
                store_v2.add_turns(old, NAMESPACE, turns, first_position=lo)
                old.execute("COMMIT")
            timings["v2"] += time.perf_counter() - started
            started = time.perf_counter()
            sessions: dict[str, Session] = {}
            for turn_id, session, speaker, text, time_ in turns:
                sessions.setdefault(session, Session(session, time_, [])).turns.append(Turn(turn_id, speaker, text))
            store.put_turns(NAMESPACE, Conversation(NAMESPACE, list(sessions.values())))
            windows: dict[tuple[str, int], list[EmbeddedUnit]] = {}
            for item in items:
                windows.setdefault((item.unit.session_id, item.unit.serial % TURNS_PER_SESSION // UNITS_PER_WINDOW), []).append(item)
            store.add_windows(NAMESPACE, [WindowResult(s, w, window) for (s, w), window in windows.items()])
            timings["v4"] += time.perf_counter() - started
        store._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        n_segments = len(segments.listing(store._db, NAMESPACE, segments.UNITS))
    dirs = {"v4": new_dir}
    if with_v3:
        from tests import store_v3  # not at the top: a child loading with the code of before the sidecars imports this file too

        shutil.copytree(new_dir, workdir / f"v3-{units}")
        store_v3.to_version_3(workdir / f"v3-{units}")
        dirs["v3"] = workdir / f"v3-{units}"
    if old is not None:
        old.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        old.close()
        dirs["v2"] = old_dir
    size = lambda d: sum(p.stat().st_size for p in d.rglob("*") if p.is_file())  # noqa: E731
    return {
        "dirs": {k: str(d) for k, d in dirs.items()}, "write_seconds": {k: round(timings[k], 1) for k in timings if k in dirs},
        "segments": n_segments, "bytes": {k: size(d) for k, d in dirs.items()},
    }  # fmt: skip


def load_v2(path: Path, namespace: str) -> NamespaceMemory:
    """Schema version 2's loader: one query over the unit rows, four ``json.loads`` a row, sentences and turns row by row."""
    import sqlite3

    db = sqlite3.connect(Path(path) / "memory.sqlite")
    dim = int(db.execute("SELECT value FROM meta WHERE key = 'dim'").fetchone()[0])
    rows = db.execute(
        "SELECT id, session_id, fact_text, subject, predicate, object, source_turn_ids, source_text, utterance_time, "
        "serial, fact_time, entities, locations, fact_emb, attr_emb FROM units WHERE namespace = ? ORDER BY serial, sub, id",
        (namespace,),
    ).fetchall()
    units, fact_blobs, attr_blobs = [], [], []
    unit_index, kinds, texts = [], [], []
    for i, r in enumerate(rows):
        entities, locations = json.loads(r[11]), json.loads(r[12])
        units.append(MemoryUnit(
            id=r[0], session_id=r[1], fact_text=r[2], subject=r[3], predicate=r[4], object=r[5],
            source_turn_ids=json.loads(r[6]), source_text=r[7], utterance_time=r[8], serial=r[9],
            fact_time=[TimeSpan(**t) for t in json.loads(r[10])], entities=entities, locations=locations,
        ))  # fmt: skip
        fact_blobs.append(r[13])
        attr_blobs.append(r[14])
        unit_index += [i] * (len(entities) + len(locations))
        kinds += [ENTITY] * len(entities) + [LOCATION] * len(locations)
        texts += entities + locations
    facts = np.frombuffer(b"".join(fact_blobs), dtype=np.float32).reshape(len(units), dim)
    attrs = np.frombuffer(b"".join(attr_blobs), dtype=np.float32).reshape(len(texts), dim)
    traces = [Trace(r[0], r[1], json.loads(r[2]), r[3], r[4]) for r in db.execute(
        "SELECT id, relation_text, member_ids, trajectory, current_id FROM traces WHERE namespace = ? ORDER BY id", (namespace,))]  # fmt: skip
    turns, turn_time, previous_turn = {}, {}, {}
    last = None
    for r in db.execute("SELECT id, speaker, text, time, session_id FROM turns WHERE namespace = ? ORDER BY position", (namespace,)):
        turns[r[0]] = Turn(r[0], r[1], r[2])
        turn_time[r[0]] = r[3]
        if last is not None and last[1] == r[4]:
            previous_turn[r[0]] = last[0]
        last = (r[0], r[4])
    row_of = {u.id: i for i, u in enumerate(units)}
    sentence_rows = db.execute("SELECT unit_id, emb FROM sentences WHERE namespace = ? ORDER BY unit_id, idx", (namespace,)).fetchall()
    owners = np.asarray([row_of[r[0]] for r in sentence_rows], np.int64)
    vectors = np.frombuffer(b"".join(r[1] for r in sentence_rows), dtype=np.float32).reshape(len(sentence_rows), dim)
    order = np.argsort(owners, kind="stable")
    db.close()
    return NamespaceMemory(
        namespace, units, facts, AttributeIndex(np.asarray(unit_index, np.int64), np.asarray(kinds, np.int8), texts, attrs), traces,
        {m: t.id for t in traces for m in t.member_ids}, turns, turn_time, "synthetic-384", vectors[order], owners[order], previous_turn,
    )  # fmt: skip


def _status_mb(field: str) -> float:
    """A memory figure of this process from /proc/self/status (VmRSS: now; VmHWM: peak since exec), in MiB."""
    line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith(field + ":"))
    return int(line.split()[1]) / 1024


def dense_scan(memory: NamespaceMemory) -> dict[str, object]:
    """Seconds to make the dense channel's code scan of a loaded namespace (from its stored codes where it has them), the
    scan it runs, and the p50 / p95 milliseconds of :data:`DENSE_QUERIES` top-100 searches near random units."""
    from qgmem_train.retrieval.dense import DenseIndex

    stored = {"code_blocks": memory.code_blocks} if getattr(memory, "code_blocks", None) is not None else {}
    started = time.perf_counter()
    index = DenseIndex(memory.fact_embeddings, memory.sentence_embeddings, memory.sentence_unit, scan="int8", **stored)
    made = time.perf_counter() - started
    rng = np.random.default_rng(1)
    times = []
    for row in rng.integers(len(memory.units), size=DENSE_QUERIES):
        query = np.asarray(memory.fact_embeddings[int(row)]) + 0.5 * rng.standard_normal(DIM).astype(np.float32)
        started = time.perf_counter()
        index.search(query / np.linalg.norm(query), 100)
        times.append(time.perf_counter() - started)
    ms = np.asarray(times) * 1000
    return {"dense_index_seconds": made, "dense_scan": index.scan, "dense_p50_ms": float(np.percentile(ms, 50)), "dense_p95_ms": float(np.percentile(ms, 95))}


class TextVectors:
    """Stands in for the embedder: the vector each synthetic attribute text and speaker was stored with."""

    def __init__(self) -> None:
        self.vectors = Synthetic().text_vector

    def encode(self, texts: list[str]) -> np.ndarray:
        """The stored vectors of ``texts``, one row each."""
        return np.asarray([self.vectors[t] for t in texts], np.float32).reshape(-1, DIM)


def activation(memory: NamespaceMemory) -> dict[str, object]:
    """Seconds to build a loaded namespace's activation index, and p50 / p95 milliseconds of each channel, the fusion
    and all of them over :data:`ACTIVATION_QUERIES` queries near random units (words of the unit's turn, its fact
    vector plus noise, one of its entities, its location on every third query and a week from its day on every second)."""
    from bench.bench_activation import ACTIVATION_STEPS, ActivationIndex, QueryIntent, RetrievalConfig, percentiles, timed_activation

    cfg, embedder = RetrievalConfig(), TextVectors()
    started = time.perf_counter()
    index = ActivationIndex(memory, cfg, embedder)
    result: dict[str, object] = {"activation_index_seconds": time.perf_counter() - started, "activation_dense_scan": index.dense.scan}
    times: dict[str, list[float]] = {step: [] for step in ACTIVATION_STEPS}
    rng = np.random.default_rng(2)
    for q, row in enumerate(rng.integers(len(memory.units), size=ACTIVATION_QUERIES).tolist()):
        unit = memory.units[row]
        query = np.asarray(memory.fact_embeddings[row]) + 0.5 * rng.standard_normal(DIM).astype(np.float32)
        day = date.fromisoformat(unit.utterance_time[:10])
        intent = QueryIntent(
            entities=unit.entities[:1], locations=unit.locations if q % 3 == 0 else [],
            fact_times=[TimeSpan(day.isoformat(), (day + timedelta(days=6)).isoformat())] if q % 2 == 0 else [],
        )  # fmt: skip
        step = timed_activation(index, cfg, " ".join(unit.object.split()[:6]), query / np.linalg.norm(query), intent,
                                embedder.encode(intent.entities), embedder.encode(intent.locations))[1]  # fmt: skip
        for name in ACTIVATION_STEPS:
            times[name].append(step[name])
    for name, values in times.items():
        result.update({f"{name}_{key}": value for key, value in percentiles(values).items()})
    return result


def child(kind: str, path: Path, dense: bool = False, activate: bool = False) -> dict[str, object]:
    """One load in this process: seconds, memory before and at peak, and what was loaded (a checksum of the fact vectors);
    with ``dense``, also the seconds to make the dense int8 scan, and the peak memory after it; with ``activate``, the
    load and then only the timings of :func:`activation` and the peak memory after them."""
    before = _status_mb("VmRSS")
    started, cpu_started = time.perf_counter(), time.process_time()
    if kind == "v2":
        memory = load_v2(path, NAMESPACE)
    else:
        with MemoryStore.open(path) as store:
            memory = store.load_namespace(NAMESPACE, sentences=kind != "v4-lean")
    result: dict[str, object] = {
        "seconds": time.perf_counter() - started, "cpu_seconds": time.process_time() - cpu_started,
        "rss_before_mb": before, "peak_rss_mb": _status_mb("VmHWM"),
        "units": len(memory.units), "sentences": 0 if memory.sentence_unit is None else len(memory.sentence_unit),
        "checksum": float(np.ascontiguousarray(memory.fact_embeddings[::97]).sum()),  # a sample of rows, summed in one layout
        "vector_mb": sum(v.nbytes for v in (memory.fact_embeddings, memory.sentence_embeddings, memory.attributes.embeddings) if v is not None) / 1e6,
    }  # fmt: skip
    if activate:  # as a predictor after its load: the activation index decodes the units it reads itself
        result.update(activation(memory))
        result["peak_rss_activation_mb"] = _status_mb("VmHWM")
        return result
    started = time.perf_counter()
    units = list(memory.units)
    result["decode_all_seconds"] = time.perf_counter() - started if kind != "v2" else 0.0
    result["last_unit"] = units[-1].id
    if dense:
        result.update(dense_scan(memory))
        result["peak_rss_dense_mb"] = _status_mb("VmHWM")
    return result


def fresh_memory_mb_per_s(mb: int = 256) -> float:
    """How fast this machine fills memory just allocated (page faults included): the floor of any load's copies."""
    started = time.perf_counter()
    np.ones(mb << 20, np.uint8)
    return round(mb / (time.perf_counter() - started))


def load_once(kind: str, path: str, code: str | None = None, dense: bool = False, activate: bool = False) -> dict[str, object]:
    """One load in a fresh subprocess (importing the package from ``code`` when given)."""
    options = [*(["--dense-index"] if dense else []), *(["--activation"] if activate else [])]
    command = [sys.executable, "-m", "bench.bench_store_load", "--child", kind, path, *options]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*([code] if code else []), str(ROOT)]))  # the package of ``code`` first
    out = subprocess.run(command, capture_output=True, text=True, check=True, env=env, cwd=code or ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def summarise(runs: list[dict[str, object]], dense: bool = False) -> dict[str, object]:
    """Medians and every run of one loader's loads."""
    median = lambda key: round(statistics.median(float(r[key]) for r in runs), 3)  # noqa: E731
    return {
        "seconds": median("seconds"), "seconds_all": [round(r["seconds"], 3) for r in runs], "cpu_seconds": median("cpu_seconds"),
        "decode_all_seconds": median("decode_all_seconds"),
        "peak_rss_mb": median("peak_rss_mb"), "rss_before_mb": median("rss_before_mb"),
        "load_mb": round(median("peak_rss_mb") - median("rss_before_mb")), "units": runs[0]["units"], "sentences": runs[0]["sentences"],
        "vector_mb": round(runs[0]["vector_mb"]),
        "checksum": runs[0]["checksum"], "last_unit": runs[0]["last_unit"],
        **({"dense_index_seconds": median("dense_index_seconds"), "peak_rss_dense_mb": median("peak_rss_dense_mb"),
            "dense_scan": runs[0]["dense_scan"], "dense_p50_ms": median("dense_p50_ms"), "dense_p95_ms": median("dense_p95_ms"),
            "load_and_dense_seconds": round(statistics.median(r["seconds"] + r["dense_index_seconds"] for r in runs), 3)} if dense else {}),
    }  # fmt: skip


def summarise_activation(runs: list[dict[str, object]]) -> dict[str, object]:
    """Medians of the activation loads (:func:`activation` after a version-4 load)."""
    from bench.bench_activation import ACTIVATION_STEPS  # here, not at the top: a --code child imports an older package
    keys = ("seconds", "activation_index_seconds", "peak_rss_activation_mb", *(f"{s}_p{p}_ms" for s in ACTIVATION_STEPS for p in (50, 95)))
    return {"units": runs[0]["units"], "activation_dense_scan": runs[0]["activation_dense_scan"],
            **{key: round(statistics.median(float(r[key]) for r in runs), 3) for key in keys}}  # fmt: skip


def markdown(results: dict[str, object]) -> str:
    """The results as a short markdown report."""
    m = results["machine"]
    lines = [
        "# Namespace bulk load: version-2 rows, version-3 columnar segments with their vectors in the database, version-4 mapped vector sidecars",
        "",
        f"Machine: {m['cores']} cores (`nproc`), {m['cpu']}; Python {m['python']}; load average {m.get('load_average_1m', 'n/a')} at start; "
        f"fresh memory filled at {results['fresh_memory_mb_per_s']} MB/s (a 256 MB `np.ones`; the fill floor of a load is its vectors' MB at that rate).",
        f"Command: `{results['command']}`. Synthetic turns-like units, {DIM}-d vectors, 2-4 sentence vectors a unit "
        f"(see the script's docstring); each load in a fresh process, the loaders taking turns, median of {results['repeats']}; stores in the page cache (just written).",
        "",
        "| units | sentences | loader | load wall s (runs) | load CPU s | decode all units s | vectors MB (fill floor s) | peak RSS MiB (load's own) "
        "| store MiB | segments | write s |" + (" dense scan made s | load + dense s | peak RSS with dense MiB | dense search p50 / p95 ms (codes) |"
                                                if results.get("dense_index") else ""),
        "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|---|---|" if results.get("dense_index") else ""),
    ]
    for size in results["sizes"]:
        for kind, label in LOADERS.items():
            if kind not in size:
                continue
            r = size[kind]
            decode = "(in load)" if kind == "v2" else r["decode_all_seconds"]
            floor = round(r["vector_mb"] / results["fresh_memory_mb_per_s"], 2)
            lines.append(
                f"| {r['units']:,} | {r['sentences']:,} | {label} | **{r['seconds']}** ({', '.join(map(str, r['seconds_all']))}) | {r['cpu_seconds']} | {decode} | {r['vector_mb']} ({floor}) | "
                f"{r['peak_rss_mb']:.0f} ({r['load_mb']}) | {size['bytes'][kind[:2]] / 2**20:.0f} | {size['segments'] if kind != 'v2' else '-'} | "
                f"{size['write_seconds'].get(kind[:2], '(a copy of v4)')} |"
                + (f" {r['dense_index_seconds']} | **{r['load_and_dense_seconds']}** | {r['peak_rss_dense_mb']:.0f} | "
                   f"{r['dense_p50_ms']} / {r['dense_p95_ms']} ({r['dense_scan']}) |" if "dense_index_seconds" in r else "")
            )
        for before, speedup in size.get("speedups", {}).items():
            dense = f" | | **{speedup['load_and_dense']}x** | | |" if "load_and_dense" in speedup else ""
            lines.append(f"| | | **{before} / v4** | **{speedup['wall']}x** | {speedup['cpu']}x | | | | | | |{dense}")
    if results.get("activation"):
        from bench.bench_activation import ACTIVATION_STEPS

        lines += [
            "", f"Activation on the loaded version-4 namespaces with their sentence vectors: each load in a fresh process followed by the activation index a predictor builds "
            f"(the default retrieval configuration), then {ACTIVATION_QUERIES} queries near random units; median of {results['repeats']} loads:",
            "", "| units | load s | activation index build s | peak RSS MiB | dense scan | " + " | ".join(f"{s} p50 / p95 ms" for s in ACTIVATION_STEPS) + " |",
            "|---|---|---|---|---|" + "---|" * len(ACTIVATION_STEPS),
        ]  # fmt: skip
        for size in results["sizes"]:
            for side, label in (("activation_before", " (before)"), ("activation", "")):
                if side in size:
                    r = size[side]
                    steps = " | ".join(f"{r[f'{s}_p50_ms']:.1f} / {r[f'{s}_p95_ms']:.1f}" for s in ACTIVATION_STEPS)
                    lines.append(f"| {r['units']:,}{label} | {r['seconds']} | {r['activation_index_seconds']} | {r['peak_rss_activation_mb']:.0f} | {r['activation_dense_scan']} | {steps} |")
            if "activation_before" in size:
                ratio = size["activation_before"]["activation_index_seconds"] / size["activation"]["activation_index_seconds"]
                lines.append(f"| | | **before / now: {ratio:.1f}x** | | |" + " |" * len(ACTIVATION_STEPS))
    lines += ["", *results.get("notes", [])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write both stores for each size, load each side by side, write bench/results/store_load.{json,md}."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000], help="units per namespace (default: %(default)s)")
    p.add_argument("--new-only", type=int, nargs="*", default=[], help="sizes not written in version 2 (version 2 needs about 25 MiB a 1,000 units)")
    p.add_argument("--baseline-code", help="folder with the qgmem_train package of before the sidecars: also load version 3 with it")
    p.add_argument("--before-code", help="folder with an earlier qgmem_train package: also load the version-4 store with it (v4-before)")
    p.add_argument("--dense-index", action="store_true", help="every load also makes the dense channel's int8 scan, timed apart")
    p.add_argument("--activation", action="store_true", help="also load each version-4 store --repeats times to build the activation index and time every channel")
    p.add_argument("--name", default="store_load", help="report name: <out>/<name>.{json,md}")
    p.add_argument("--repeats", type=int, default=3, help="loads per loader and size (each in a fresh process)")
    p.add_argument("--write-units", type=int, default=1000, help="units per add_windows call")
    p.add_argument("--workdir", type=Path, help="folder for the stores (default: a temporary folder, removed afterwards)")
    p.add_argument("--note", action="append", default=[], help="a line added under the table")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results", help="results folder")
    p.add_argument("--child", nargs=2, metavar=("KIND", "PATH"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.write_units % TURNS_PER_SESSION:
        p.error(f"--write-units must be a multiple of {TURNS_PER_SESSION} (whole sessions a write)")
    if args.child:
        print(json.dumps(child(args.child[0], Path(args.child[1]), args.dense_index, args.activation)))
        return 0
    command = f"python bench/bench_store_load.py --sizes {' '.join(map(str, args.sizes))} --repeats {args.repeats} --write-units {args.write_units}"
    command += f" --new-only {' '.join(map(str, args.new_only))}" if args.new_only else ""
    command += f" --baseline-code {args.baseline_code}" if args.baseline_code else ""
    command += f" --before-code {args.before_code}" if args.before_code else ""
    command += " --dense-index" if args.dense_index else ""
    command += " --activation" if args.activation else ""
    results: dict[str, object] = {"machine": machine_info(), "command": command,
                                  "repeats": args.repeats, "sizes": [], "notes": args.note, "dense_index": args.dense_index, "activation": args.activation, "fresh_memory_mb_per_s": fresh_memory_mb_per_s()}  # fmt: skip
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="store-load-"))
    try:
        for units in [*args.sizes, *args.new_only]:
            written = write_stores(units, workdir, args.write_units, with_v2=units in args.sizes, with_v3=bool(args.baseline_code))
            size: dict[str, object] = {**written, "speedups": {}}
            code = {"v3": args.baseline_code, "v4-before": args.before_code}
            kinds = [kind for kind in LOADERS if kind[:2] in written["dirs"] and (kind != "v4-before" or args.before_code)]
            runs: dict[str, list[dict[str, object]]] = {kind: [] for kind in kinds}
            for _ in range(args.repeats):  # the loaders take turns, so that a slow spell of a shared machine falls on each
                for kind in kinds:
                    runs[kind].append(load_once(kind, written["dirs"][kind[:2]], code.get(kind), args.dense_index))
            if args.activation:  # with --before-code, the earlier package's index too, the two taking turns
                sides = {"activation": None, **({"activation_before": args.before_code} if args.before_code else {})}
                loads: dict[str, list[dict[str, object]]] = {side: [] for side in sides}
                for _ in range(args.repeats):
                    for side, side_code in sides.items():
                        loads[side].append(load_once("v4", written["dirs"]["v4"], side_code, activate=True))
                for side in sides:
                    size[side] = summarise_activation(loads[side])
                    print(side, units, size[side], flush=True)
            for kind in kinds:
                size[kind] = summarise(runs[kind], args.dense_index)
                print(kind, units, size[kind], flush=True)
            for before in ("v2", "v3", "v4-lean", "v4-before"):
                if before in size:
                    assert size[before]["checksum"] == size["v4"]["checksum"] and size[before]["last_unit"] == size["v4"]["last_unit"]
            for before in ("v2", "v3", "v4-before"):
                if before in size:
                    size["speedups"][before] = {"wall": round(size[before]["seconds"] / size["v4"]["seconds"], 1),
                                                "cpu": round(size[before]["cpu_seconds"] / size["v4"]["cpu_seconds"], 1)}  # fmt: skip
                    if args.dense_index:
                        size["speedups"][before]["load_and_dense"] = round(size[before]["load_and_dense_seconds"] / size["v4"]["load_and_dense_seconds"], 1)
            results["sizes"].append(size)
            for path in written["dirs"].values():
                shutil.rmtree(path)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    write_report_atomic(args.out / f"{args.name}.json", results, markdown(results))
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
