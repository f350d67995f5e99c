"""Hostile exports and inputs: an export (a Hub repo) decides no code, server, secret or file beyond its own; bad input is one line.

The attacker controls every byte of the folder, the checksum file included, so each case rewrites
``sha256sums.txt`` to match its edits. The base export is a tiny random decoder with LoRA, trained
for one step and exported by ``export.package`` under a Hub id that this session's own Hugging Face
cache holds (built once per module); a loopback HTTP server records whatever reaches it.

The attacks, each refused (or one line, exit 2 in the CLI):

- config.json turns on repository code (``module.trust_remote_code``, ``pipeline.models.trust_remote_code``),
  or chooses the backend, server or key variable;
- it names a model the loader would find on this disk or import: an absolute, ``~``, relative or
  Hub-id-shaped local path (embedder, base model, reranker), ``pkg:<name>.<sub>`` (importing ``<name>`` runs
  its code), ``pkg:`` of a package that is not a bundled model;
- it names a repo with its own code (base model or embedder) while the caller passes ``trust_remote_code``
  for the models the caller names; it picks a branch of the base model the caller names and trusts
  (``module.llm_revision``), whose code would run with the caller's trust;
- checksums that leave a file out, list a file in a subfolder, or name an adapter outside the folder;
- a listed file that is not one of the exporter's types (``reranker.modeling_evil.py``, ``reranker.``,
  ``reranker..``, ``reranker..json``, ``notes.pkl``); a verified bundled reranker file, config.json or adapter
  swapped right after the check (the verified bytes are the ones parsed);
- a listed file that is a symlink out of the folder or a hard link (the Hub cache's own layout still loads), a Hub
  blob that is a hard link to a file outside, the checksum file a symlink out of the folder;
- an exported reranker given as a local file (its path would be written into config.json);
- terminal escapes, carriage returns, line separators, bidi controls and C1 controls in stored turns and speakers:
  escaped by ``ask`` (no spoofed ``A:`` line) and by ``ask --json``;
- a replaced graph in the ONNX cache; a planted graph with a matching ``sha256.json``, other weights under the bundled
  SmolLM2's converted-GGUF key, a cached bundled reranker, each in an entry others can write (written again) or a
  cache folder others can write (one line); an exported ``reranker_max_length`` past the cross-encoder's positions;
  a bundled reranker config.json that does not fit its weights; a bundled reranker tokenizer.json whose regex makes the
  tokenizers library panic (a ``BaseException``), with torch or ONNX Runtime;
- malformed config.json (bad JSON or UTF-8, wrong types, unknown settings), or config.json or adapter
  metadata nested 100k deep; a graph adapter or LoRA tensor of the wrong shape; module sizes (``gnn_hidden``,
  ``lora_r``) that would allocate terabytes, or overflow any tensor, before the adapters' shapes are checked;
- a damaged SQLite page in the store; a base model whose chat template Jinja's sandbox refuses, or whose rendering
  runs for minutes (past its time budget); a ``--model`` folder or path that does not exist; a 1 MB question (CLI and
  Python); a JSONL record nested 100k deep;
- Python API misuse: lone surrogates in a namespace or turn text, a NUL in a namespace, ``turns=None``, a non-string
  ``session_id``, ``ask(None)``;
- ``ask`` without ``--namespace`` listing the store's other namespaces; an export recording a local path
  for its base model; tokens in ``;token=`` or ``#access_token=`` of a URL in a log line; a config sending
  the API key over plain http to another machine (one warning);
- a store pointed at a folder of other files (``memory(ns, folder)``, ``build --store``), a user's files in an
  existing store's ``vectors/`` (one of the store's own name form), a store whose ``vectors/`` or ``trace_graphs/``
  links to another folder: nothing but the store's own files is ever removed;
- a handed-over ``memory.sqlite`` with a trigger (one deleting other namespaces' turns, one named as SQLite's
  statistics tables are, ``sqlite_stat9`` or ``SQLITE_STAT1``, put in with ``writable_schema``), a view, an index or a
  table of ours defined otherwise: refused before any write, other namespaces' rows unchanged;
- a store recording a vector sidecar named ``../../victim/x.vec`` or ``/etc/passwd``: refused before any open;
- a FIFO in place of ``memory.sqlite``, a vector sidecar, ``vectors/written.tokens`` or a cached trace graph: refused in
  one line by ``add_session``/``search`` rather than blocking them;
- a cached trace graph that is compressed, a compressed bomb (256 MiB of zeros), a member header claiming 2**40 rows,
  or has an extra member: not read, the graph built anew (``tests/test_traces_scale.py``);
- a checksum file ``sha256sum -c`` accepts (uppercase hex, ``*`` marker, comment, blank line) must load.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import threading
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning as L
import pytest
import torch
import yaml

from qgmem_train.__main__ import main
from qgmem_train.config import BUNDLED_EMBEDDER, PipelineConfig
from qgmem_train.errors import InputError
from qgmem_train.llm.resolver import resolve_model_dir
from qgmem_train.memory.store import MemoryStore
from qgmem_train.model.datamodule import TrajectoryDataModule
from qgmem_train.model.module import GraphAugmentedLM
from qgmem_train.predictor import CHECKSUM_FILE, CONFIG_FILE, QGMemPredictor, file_sha256
from tests.fakes import ScriptedLLM
from tests.tiny_decoder import FIXTURE, TINY_GGUF_VOCAB, fixture_corpus, publish_to_hub_cache, save_tiny_decoder, save_tiny_gguf, tiny_module_kwargs

SESSION = [
    {"speaker": "Caroline", "text": "I went to the LGBTQ support group yesterday and it was so powerful."},
    {"speaker": "Melanie", "text": "That's great! I painted a sunrise over the lake last week."},
]
SECRET_ENV = "QGMEM_TEST_USER_TOKEN"
SECRET = "user-secret-token-4f2a"
EVIL_CODE = """
from pathlib import Path

Path({marker!r}).write_text("repository code ran")

from transformers import Qwen3Config, Qwen3ForCausalLM


class EvilConfig(Qwen3Config):
    pass


class EvilModel(Qwen3ForCausalLM):
    config_class = EvilConfig
"""


@pytest.fixture(scope="module")
def clean_export(tmp_path_factory) -> Path:
    """A complete export of the tiny decoder with a graph adapter and LoRA."""
    from export.package import export_model

    root = tmp_path_factory.mktemp("hostile")
    llm_dir = save_tiny_decoder(root / "tiny", fixture_corpus())
    L.seed_everything(0)
    data = TrajectoryDataModule(str(FIXTURE), batch_size=2, max_examples=2)
    model = GraphAugmentedLM(**tiny_module_kwargs(llm_dir, data.feature_dim, lora={"r": 2}))
    trainer = L.Trainer(
        accelerator="cpu", max_steps=1, limit_val_batches=0, logger=False, enable_progress_bar=False, enable_model_summary=False, default_root_dir=root
    )  # fmt: skip
    trainer.fit(model, datamodule=data)
    trainer.save_checkpoint(root / "tiny.ckpt")
    pipeline = {"models": {"llm": str(llm_dir), "reranker": "none", "device": "cpu"}, "construction": {"units": "turns", "traces": False}, "retrieval": {"k": 3}}
    (root / "fit.yaml").write_text(yaml.safe_dump({"pipeline": pipeline}))
    return export_model(root / "tiny.ckpt", root / "fit.yaml", root / "model", names={"llm": publish_to_hub_cache(llm_dir)})


def _write_sums(folder: Path, names: list[str] | None = None) -> None:
    """The attacker's checksum file: ``names`` (default: every top-level file) with their true digests."""
    if names is None:
        names = sorted(p.name for p in folder.iterdir() if p.is_file() and p.name != CHECKSUM_FILE)
    (folder / CHECKSUM_FILE).write_text("".join(f"{file_sha256(folder / name)}  {name}\n" for name in names))


def _hostile(clean: Path, target: Path, edit: Callable[[dict[str, Any]], None] | None = None) -> Path:
    """A copy of the export with ``edit`` applied to its config.json and matching checksums."""
    folder = Path(shutil.copytree(clean, target))
    if edit is not None:
        config = json.loads((folder / CONFIG_FILE).read_text())
        edit(config)
        (folder / CONFIG_FILE).write_text(json.dumps(config))
    _write_sums(folder)
    return folder


def _base_model_folder(clean: Path) -> Path:
    """The local snapshot of the export's base model (a Hub id in this session's cache)."""
    return resolve_model_dir(json.loads((clean / CONFIG_FILE).read_text())["module"]["llm"])


def _model_with_repository_code(clean: Path, root: Path, marker: Path) -> Path:
    """A copy of the export's base model whose config maps the Auto classes to its own ``evil.py``, which writes ``marker``.

    The folder name is new each time: transformers imports a repository's code once per module name.
    """
    folder = Path(shutil.copytree(_base_model_folder(clean), root / f"remote_code_{uuid.uuid4().hex[:8]}"))
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModel": "evil.EvilModel", "AutoModelForCausalLM": "evil.EvilModel"}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "evil.py").write_text(EVIL_CODE.format(marker=str(marker)))
    return folder


@pytest.fixture
def recording_server() -> Iterator[SimpleNamespace]:
    """A loopback HTTP server that records every request (path, headers, body) and answers 401."""
    requests: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def _record(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode(errors="replace")
            requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
            reply = b'{"error": {"message": "unauthorized"}}'
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        do_GET = do_POST = _record

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield SimpleNamespace(url=f"http://127.0.0.1:{server.server_port}/v1", requests=requests)
    finally:
        server.shutdown()
        server.server_close()


def _load_and_ask(folder: Path, store: Path, **kwargs: Any) -> None:
    """Load the export, add a session and ask: everything an accepted export would get to do."""
    predictor = QGMemPredictor.from_pretrained(folder, intent="rules", **kwargs)
    with predictor.memory("alice", store) as memory:
        memory.add_session(SESSION)
        memory.ask("What did Melanie paint?")


@pytest.mark.parametrize("setting", ["module.trust_remote_code", "pipeline.models.trust_remote_code"])
def test_an_export_cannot_turn_on_repository_code(clean_export, tmp_path, setting) -> None:
    marker = tmp_path / "marker"
    evil = str(_model_with_repository_code(clean_export, tmp_path, marker))

    def edit(config: dict[str, Any]) -> None:
        if setting == "module.trust_remote_code":
            config["module"].update(llm=evil, trust_remote_code=True)
        else:
            config["pipeline"]["models"].update(embedder=evil, trust_remote_code=True)

    folder = _hostile(clean_export, tmp_path / "export", edit)
    with pytest.raises(InputError, match=re.escape(setting)):
        _load_and_ask(folder, tmp_path / "store")
    assert not marker.exists()


@pytest.mark.parametrize("field", ["module.llm", "pipeline.models.embedder"])
def test_the_callers_trust_never_extends_to_a_model_the_export_names(clean_export, tmp_path, field) -> None:
    marker = tmp_path / "marker"
    evil = publish_to_hub_cache(_model_with_repository_code(clean_export, tmp_path, marker))
    section, key = ("module", "llm") if field == "module.llm" else ("pipeline", "embedder")
    folder = _hostile(clean_export, tmp_path / "export", lambda c: (c["pipeline"]["models"] if section == "pipeline" else c["module"]).update({key: evil}))
    for trusted in (False, True):
        with pytest.raises(InputError, match="made for a backbone with another config|is 64-d"):
            QGMemPredictor.from_pretrained(folder, intent="rules", trust_remote_code=trusted)
        assert not marker.exists()
    with pytest.raises(InputError, match="made for a backbone with another config|is 64-d"):
        QGMemPredictor.from_pretrained(folder, intent="rules", trust_remote_code=True, models={key: evil})
    assert marker.read_text() == "repository code ran"


def _package_that_marks_its_import(root: Path, marker: Path) -> str:
    """An importable package on ``sys.path`` (with a ``models`` subpackage) whose import writes ``marker``; its name."""
    name = f"evil_{uuid.uuid4().hex[:8]}"
    (root / name / "models").mkdir(parents=True)
    (root / name / "__init__.py").write_text(f"from pathlib import Path\nPath({str(marker)!r}).write_text('imported')\n")
    (root / name / "models" / "__init__.py").write_text("")
    return name


REFERENCES: dict[str, tuple[str, Callable[[SimpleNamespace], str]]] = {
    "an absolute path": ("pipeline.models.embedder", lambda ctx: str(ctx.embedder)),
    "a home path": ("pipeline.models.embedder", lambda ctx: "~/embedder"),
    "a relative path": ("pipeline.models.embedder", lambda ctx: "../work/home/embedder"),
    "a Hub-id-shaped local folder": ("pipeline.models.embedder", lambda ctx: "home/embedder"),
    "pkg: of a dotted name": ("pipeline.models.embedder", lambda ctx: f"pkg:{ctx.package}.models"),
    "pkg: of another package": ("pipeline.models.embedder", lambda ctx: f"pkg:{ctx.package}"),
    "a local base model": ("module.llm", lambda ctx: str(ctx.base)),
    "a local reranker": ("pipeline.models.reranker_model", lambda ctx: str(ctx.embedder)),
}
"""Case → (the config.json field, the reference an export names there)."""


@pytest.mark.parametrize("case", list(REFERENCES))
def test_an_export_names_only_hub_ids_and_bundled_packages(clean_export, tmp_path, monkeypatch, case) -> None:
    field, reference = REFERENCES[case]
    marker = tmp_path / "marker"
    home = tmp_path / "work" / "home"
    embedder = Path(shutil.copytree(resolve_model_dir(BUNDLED_EMBEDDER), home / "embedder"))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path / "work")
    monkeypatch.syspath_prepend(str(tmp_path))
    ctx = SimpleNamespace(embedder=embedder, base=_base_model_folder(clean_export), package=_package_that_marks_its_import(tmp_path, marker))
    ref = reference(ctx)

    def edit(config: dict[str, Any]) -> None:
        section, _, key = field.rpartition(".")
        (config["module"] if section == "module" else config["pipeline"]["models"]).update({key: ref})
        if key == "reranker_model":
            config["pipeline"]["models"]["reranker"] = "cross"

    folder = _hostile(clean_export, tmp_path / "export", edit)
    with pytest.raises(InputError, match=re.escape(field)) as refusal:
        QGMemPredictor.from_pretrained(folder, intent="rules", device="cpu")
    assert "\n" not in str(refusal.value) and not marker.exists()


ENDPOINT_CASES: dict[str, Callable[[str], tuple[dict[str, Any], dict[str, Any] | None]]] = {
    "pipeline.models.backend": lambda url: ({"backend": "openai", "base_url": url, "api_key_env": SECRET_ENV}, None),
    "pipeline.models.base_url": lambda url: ({"base_url": url}, {"backend": "openai"}),
    "pipeline.models.api_key_env": lambda url: ({"api_key_env": SECRET_ENV}, {"backend": "openai", "base_url": url}),
}
"""Setting refused → (what the export sets in pipeline.models, what the caller passes as ``models``)."""


@pytest.mark.parametrize("setting", list(ENDPOINT_CASES))
def test_an_export_cannot_choose_the_backend_endpoint_or_key(clean_export, tmp_path, recording_server, monkeypatch, setting) -> None:
    monkeypatch.setenv(SECRET_ENV, SECRET)
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    exported, caller = ENDPOINT_CASES[setting](recording_server.url)
    folder = _hostile(clean_export, tmp_path / "export", lambda config: config["pipeline"]["models"].update(exported))
    with pytest.raises(InputError, match=re.escape(setting)):
        _load_and_ask(folder, tmp_path / "store", models=caller)
    assert not [r for r in recording_server.requests if SECRET in json.dumps(r)]
    assert recording_server.requests == []


def test_plain_http_to_another_host_needs_the_callers_opt_in(clean_export) -> None:
    def load(url: str, **kwargs: Any) -> QGMemPredictor:
        return QGMemPredictor.from_pretrained(clean_export, models={"backend": "openai", "base_url": url}, intent="rules", **kwargs)

    for url in ("http://192.0.2.7:8000/v1", "http://localhost.example.com/v1"):
        with pytest.raises(InputError, match="allow_insecure_http"):
            load(url)
    for url in ("file:///etc/passwd", "ftp://192.0.2.7/v1", "https:///v1"):
        with pytest.raises(InputError, match="models.base_url"):
            load(url, allow_insecure_http=True)
    with pytest.raises(InputError, match="models.base_url"):
        QGMemPredictor.from_pretrained(clean_export, models={"backend": "openai"}, intent="rules")
    accepted = [
        ("http://192.0.2.7:8000/v1", True),
        ("https://api.example.com/v1", False),
        ("http://127.0.0.1:8000/v1", False),
        ("http://localhost:8000/v1", False),
        ("http://[::1]:8000/v1", False),
    ]
    for url, opt_in in accepted:
        predictor = load(url, allow_insecure_http=opt_in)
        assert predictor.path == "text" and predictor.pipeline.models.base_url == url


def _drop_line(name: str) -> Callable[[Path], None]:
    def tamper(folder: Path) -> None:
        _write_sums(folder, [p.name for p in sorted(folder.iterdir()) if p.name not in {name, CHECKSUM_FILE}])

    return tamper


def _extra_file(folder: Path) -> None:
    (folder / "notes.txt").write_text("not listed")


def _file_in_a_subfolder(folder: Path) -> None:
    (folder / "extra").mkdir()
    (folder / "extra" / "evil.json").write_text("{}")
    _write_sums(folder, [*sorted(p.name for p in folder.iterdir() if p.is_file() and p.name != CHECKSUM_FILE), "extra/evil.json"])


CHECKSUM_CASES: dict[str, tuple[Callable[[Path], None], str]] = {
    "graph adapter unlisted": (_drop_line("graph_adapter.safetensors"), "graph_adapter.safetensors: not listed in the checksum file"),
    "LoRA adapter unlisted": (_drop_line("adapter_model.safetensors"), "adapter_model.safetensors: not listed in the checksum file"),
    "an unlisted extra file": (_extra_file, "notes.txt: not listed in the checksum file"),
    "a file in a subfolder": (_file_in_a_subfolder, "'extra/evil.json' is not a plain file name"),
}


@pytest.mark.parametrize("case", list(CHECKSUM_CASES))
def test_checksums_must_cover_every_file_by_a_plain_name(clean_export, tmp_path, case) -> None:
    tamper, message = CHECKSUM_CASES[case]
    folder = _hostile(clean_export, tmp_path / "export")
    tamper(folder)
    with pytest.raises(InputError, match=re.escape(message)):
        QGMemPredictor.from_pretrained(folder, intent="rules")


@pytest.mark.parametrize("key", ["graph", "lora"])
@pytest.mark.parametrize("where", ["parent", "absolute", "subfolder", "dot"])
def test_an_adapter_name_cannot_leave_the_folder(clean_export, tmp_path, key, where) -> None:
    file = {"graph": "graph_adapter.safetensors", "lora": "adapter_model.safetensors"}[key]
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copy(clean_export / file, outside / file)
    name = {"parent": f"../outside/{file}", "absolute": str(outside / file), "subfolder": f"outside/{file}", "dot": ".."}[where]
    folder = _hostile(clean_export, tmp_path / "export", lambda config: config["adapter"].update({key: name}))
    with pytest.raises(InputError, match=re.escape(f"adapter.{key}")):
        QGMemPredictor.from_pretrained(folder, intent="rules")


def _raw(text: str) -> Callable[[Path], None]:
    def tamper(folder: Path) -> None:
        (folder / CONFIG_FILE).write_text(text)

    return tamper


def _edited(edit: Callable[[dict[str, Any]], Any]) -> Callable[[Path], None]:
    def tamper(folder: Path) -> None:
        config = json.loads((folder / CONFIG_FILE).read_text())
        edit(config)
        (folder / CONFIG_FILE).write_text(json.dumps(config))

    return tamper


MALFORMED: dict[str, tuple[Callable[[Path], None], str]] = {
    "not JSON": (_raw('{"format": '), "config.json: not valid JSON"),
    "bytes that are not UTF-8": (lambda folder: (folder / CONFIG_FILE).write_bytes(b'{"format": "\xff"}'), "not valid UTF-8"),
    "not an object": (_raw("[]"), "config.json: format"),
    "an integer of 5,000 digits": (_raw('{"format": ' + "9" * 5000 + "}"), "config.json: not readable JSON: a number longer than 4300 digits"),
    "module not a mapping": (_edited(lambda c: c.update(module="big")), "config.json: module"),
    "an unknown module setting": (_edited(lambda c: c["module"].update(dropout_everywhere=0.5)), "module.dropout_everywhere"),
    "a module setting of the wrong type": (_edited(lambda c: c["module"].update(gnn_hidden="wide")), "module.gnn_hidden"),
    "a required module setting missing": (_edited(lambda c: c["module"].pop("feature_dim")), "module.feature_dim"),
    "no adapter section": (_edited(lambda c: c.pop("adapter")), "config.json: adapter"),
    "an adapter name that is not a string": (_edited(lambda c: c["adapter"].update(graph=3)), "adapter.graph"),
    "an adapter that is not safetensors": (_edited(lambda c: c["adapter"].update(graph="prompts.json")), "prompts.json: not a safetensors adapter"),
    "an unknown pipeline setting": (_edited(lambda c: c["pipeline"]["models"].update(colour="blue")), "pipeline.models.colour"),
    "a pipeline setting of the wrong type": (_edited(lambda c: c["pipeline"]["retrieval"].update(k="ten")), "pipeline.retrieval.k"),
    "pipeline not a mapping": (_edited(lambda c: c.update(pipeline=[])), "config.json: pipeline"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_config_whose_checksums_match_is_one_clear_error(clean_export, tmp_path, case) -> None:
    tamper, message = MALFORMED[case]
    folder = _hostile(clean_export, tmp_path / "export")
    tamper(folder)
    _write_sums(folder)
    with pytest.raises(InputError, match=re.escape(message)) as refusal:
        QGMemPredictor.from_pretrained(folder, intent="rules")
    assert "\n" not in str(refusal.value)


def test_ask_with_a_malformed_export_exits_2_with_one_line(clean_export, minilm, tmp_path, capsys) -> None:
    cfg = PipelineConfig()
    cfg.construction.units, cfg.construction.traces = "turns", False
    with QGMemPredictor(None, cfg, llm=ScriptedLLM([]), embedder=minilm, reranker=None, intent="rules").memory("alice", tmp_path / "store") as memory:
        memory.add_session(SESSION)
    folder = _hostile(clean_export, tmp_path / "export", lambda config: config["module"].update(gnn_hidden="wide"))
    assert main(["ask", "--model", str(folder), "--store", str(tmp_path / "store"), "What did Melanie paint?"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "module.gnn_hidden" in err and "Traceback" not in err


def _resave(path: Path, edit: Callable[[dict[str, Any], dict[str, str]], None]) -> None:
    """Rewrite the safetensors file ``path`` after ``edit(tensors, metadata)``."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(path), framework="pt") as handle:
        tensors = {k: handle.get_tensor(k) for k in handle.keys()}  # noqa: SIM118
        metadata = dict(handle.metadata() or {})
    edit(tensors, metadata)
    save_file(tensors, str(path), metadata=metadata)


def _misshapen(file: str) -> Callable[[Path], None]:
    def tamper(folder: Path) -> None:
        def grow(tensors: dict[str, Any], metadata: dict[str, str]) -> None:
            import torch

            name = sorted(tensors)[0]
            tensors[name] = torch.zeros(*(n + 1 for n in tensors[name].shape))

        _resave(folder / file, grow)

    return tamper


def _deep_metadata(folder: Path) -> None:
    _resave(folder / "graph_adapter.safetensors", lambda tensors, metadata: metadata.update(qgmem="[" * 100_000 + "]" * 100_000))


ADAPTER_CASES: dict[str, tuple[Callable[[Path], None], str]] = {
    "config.json nested 100k deep": (_raw('{"a": ' * 100_000 + "1" + "}" * 100_000), "config.json: not readable JSON: nested too deeply"),
    "adapter metadata nested 100k deep": (_deep_metadata, "graph_adapter.safetensors: its qgmem metadata is not readable JSON"),
    "a graph adapter tensor of the wrong shape": (_misshapen("graph_adapter.safetensors"), "graph_adapter.safetensors: encoder."),
    "a LoRA tensor of the wrong shape": (_misshapen("adapter_model.safetensors"), "adapter_model.safetensors: base_model."),
    "module sizes of terabytes": (_edited(lambda c: c["module"].update(gnn_hidden=1 << 20)), "but config.json's module settings make it ["),
    "module sizes past any tensor's": (_edited(lambda c: c["module"].update(gnn_hidden=1 << 40)), "config.json: module: its sizes make a module no adapter fits"),
    "a LoRA rank of terabytes": (_edited(lambda c: c["module"].update(lora_r=1 << 40)), f"module.lora_r: is {1 << 40}, but the LoRA adapter's rank is 2"),
}


@pytest.mark.parametrize("case", list(ADAPTER_CASES))
def test_a_hostile_config_or_adapter_is_one_line(clean_export, tmp_path, case) -> None:
    tamper, message = ADAPTER_CASES[case]
    folder = _hostile(clean_export, tmp_path / "export")
    tamper(folder)
    _write_sums(folder)
    with pytest.raises(InputError, match=re.escape(message)) as refusal:
        QGMemPredictor.from_pretrained(folder, intent="rules", device="cpu")
    assert "\n" not in str(refusal.value)


@pytest.fixture(scope="module")
def loaded(clean_export) -> QGMemPredictor:
    """The clean export, loaded once for the cases that misuse the Python API."""
    return QGMemPredictor.from_pretrained(clean_export, intent="rules", device="cpu")


MISUSE: dict[str, tuple[Callable[[QGMemPredictor, Path], Any], str]] = {
    "a lone surrogate in the namespace": (lambda p, store: p.memory("al\ud800ice", store), "namespace: not valid text"),
    "a NUL in the namespace": (lambda p, store: p.memory("al\x00ice", store), "namespace: not valid text: NUL at character 2"),
    "a lone surrogate in a turn's text": (lambda p, store: p.memory("alice", store).add_session([{"speaker": "A", "text": "hi \udc00"}]), "turn 1.text: not valid text"),
    "turns=None": (lambda p, store: p.memory("alice", store).add_session(None), "turns: expected a list of turns"),  # type: ignore[arg-type]
    "a session_id that is not a string": (lambda p, store: p.memory("alice", store).add_session(SESSION, session_id=7), "session_id: expected a string"),  # type: ignore[arg-type]
    "ask(None)": (lambda p, store: p.memory("alice", store).ask(None), "question: expected a string"),  # type: ignore[arg-type]
    "a 1 MB question": (lambda p, store: p.memory("alice", store).ask("What did Melanie paint? " * 45_000), "more than the 4000 a question may have"),
}


@pytest.mark.parametrize("case", list(MISUSE))
def test_python_api_misuse_is_an_input_error_naming_the_field(loaded, tmp_path, case) -> None:
    misuse, message = MISUSE[case]
    with loaded.memory("alice", tmp_path / "store") as memory:
        memory.add_session(SESSION, session_id="S1")
    with pytest.raises(InputError, match=re.escape(message)):
        misuse(loaded, tmp_path / "store")


def test_the_question_bound_is_the_callers_to_set(clean_export, tmp_path) -> None:
    predictor = QGMemPredictor.from_pretrained(clean_export, intent="rules", device="cpu", max_question_chars=30)
    with predictor.memory("alice", tmp_path / "store") as memory:
        memory.add_session(SESSION, session_id="S1")
        assert memory.ask("What did Melanie paint?").units
        with pytest.raises(InputError, match="question: 34 characters, more than the 30"):
            memory.ask("What did Melanie paint last week??")


def _store(tmp_path: Path, minilm) -> Path:
    """A store with one session for ``alice``, built without an LLM."""
    cfg = PipelineConfig()
    cfg.construction.units, cfg.construction.traces = "turns", False
    with QGMemPredictor(None, cfg, llm=ScriptedLLM([]), embedder=minilm, reranker=None, intent="rules").memory("alice", tmp_path / "store") as memory:
        memory.add_session(SESSION)
    return tmp_path / "store"


def _damage_last_page(store: Path) -> None:
    from qgmem_train.memory.store_file import PAGE_SIZE

    file = store / "memory.sqlite"
    data = bytearray(file.read_bytes())
    start = len(data) - PAGE_SIZE
    data[start : start + 64] = b"\xa5" * 64
    file.write_bytes(bytes(data))


SANDBOX_ESCAPE = "{{ messages[0]['content'].__class__.__mro__ }}"
"""A chat template that reads ``__class__``: Jinja's sandbox refuses it."""
RUNAWAY_LOOP = "{% for a in range(99999) %}{% for b in range(99999) %}{% endfor %}{% endfor %}"
"""A chat template that loops 10**10 times (each loop within the sandbox's range cap) before writing anything: minutes."""


def _over_chat_template(clean: Path, tmp_path: Path, template: str) -> Path:
    """The clean export over a copy of its base model whose chat template is ``template``, adapter metadata forged to match."""
    from export.package import rename_base_model
    from qgmem_train.model.backbone import describe_backbone

    base = Path(shutil.copytree(_base_model_folder(clean), tmp_path / "templated"))
    (base / "chat_template.jinja").write_text(template)
    evil = publish_to_hub_cache(base)
    folder = _hostile(clean, tmp_path / "export", lambda c: c["module"].update(llm=evil))
    fingerprint = describe_backbone(evil, None, None, False).fingerprint

    def forge(tensors: dict[str, Any], metadata: dict[str, str]) -> None:
        metadata["qgmem"] = json.dumps({**rename_base_model(json.loads(metadata["qgmem"]), evil), "backbone": fingerprint})

    _resave(folder / "graph_adapter.safetensors", forge)
    _write_sums(folder)
    return folder


def _sidecar_named(store: Path, name: str) -> None:
    """Record ``name`` for the store's first vector sidecar; a name inside the store's parent gets a copy of the genuine file."""
    import sqlite3

    with sqlite3.connect(store / "memory.sqlite") as db:
        (real,) = db.execute("SELECT name FROM segment_files ORDER BY namespace, seq").fetchone()
        db.execute("UPDATE segment_files SET name = ? WHERE name = ?", (name, real))
    copy = store / "vectors" / name
    if not Path(name).is_absolute() and not copy.exists():
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(store / "vectors" / real, copy)


QUESTION = "What did Melanie paint?"
CLI_CASES: dict[str, tuple[Callable[[Path, Path, Path], tuple[str, str]], str]] = {
    "a damaged SQLite page": (lambda clean, store, tmp: (_damage_last_page(store), (str(clean), QUESTION))[1], "the store is damaged"),
    "a chat template the sandbox refuses": (lambda clean, store, tmp: (str(_over_chat_template(clean, tmp, SANDBOX_ESCAPE)), QUESTION), "chat_template: the sandbox refuses"),
    "a chat template rendering for minutes": (
        lambda clean, store, tmp: (str(_over_chat_template(clean, tmp, RUNAWAY_LOOP)), QUESTION), "chat_template: rendering takes more than its 10 s budget"
    ),
    "a sidecar name leaving the store": (
        lambda clean, store, tmp: (_sidecar_named(store, "../../victim/x.vec"), (str(clean), QUESTION))[1], "named '../../victim/x.vec', not one of the store's own"
    ),
    "an absolute sidecar name": (lambda clean, store, tmp: (_sidecar_named(store, "/etc/passwd"), (str(clean), QUESTION))[1], "named '/etc/passwd', not one of the store's own"),
    "a --model folder that does not exist": (lambda clean, store, tmp: ("exports/missing", QUESTION), "exports/missing: no such folder"),
    "a --model path that does not exist": (lambda clean, store, tmp: (str(tmp / "missing"), QUESTION), "missing: no such folder"),
    "a 1 MB question": (lambda clean, store, tmp: (str(clean), "x" * 1_000_000), "more than the 4000 a question may have"),
}
"""Case → (``--model`` and the question, given the clean export, the store and a scratch folder; what the one line says)."""


@pytest.mark.parametrize("case", list(CLI_CASES))
def test_a_hostile_input_to_ask_exits_2_with_one_line(clean_export, minilm, tmp_path, monkeypatch, capsys, case) -> None:
    arguments, message = CLI_CASES[case]
    store = _store(tmp_path, minilm)
    monkeypatch.chdir(tmp_path)
    model, question = arguments(clean_export, store, tmp_path)
    capsys.readouterr()
    assert main(["ask", "--intent", "rules", "--store", str(store), "--model", model, question]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err and "Traceback" not in err


def test_the_template_budget_is_the_callers_not_the_exports(clean_export, minilm, tmp_path) -> None:
    """An export raising ``template_budget_s`` is ignored; the caller's own budget stops a runaway template."""
    lifted = _hostile(clean_export, tmp_path / "lifted", lambda c: c["pipeline"]["models"].update(template_budget_s=1e9))
    predictor = QGMemPredictor.from_pretrained(lifted, intent="rules", device="cpu")
    assert predictor.llm.template_budget_s == predictor.model.prompt_tokens.template_budget_s == 10.0
    runaway = _over_chat_template(clean_export, tmp_path, RUNAWAY_LOOP)
    with pytest.raises(InputError, match=re.escape("chat_template: rendering takes more than its 0.5 s budget")) as refusal:
        predictor = QGMemPredictor.from_pretrained(runaway, intent="rules", device="cpu", models={"template_budget_s": 0.5})
        with predictor.memory("alice", _store(tmp_path, minilm)) as memory:
            memory.ask(QUESTION)
    assert "\n" not in str(refusal.value)


def test_a_jsonl_record_nested_100k_deep_is_one_line(tmp_path, capsys) -> None:
    deep = tmp_path / "chats.jsonl"
    deep.write_text('{"id": "c1", "sessions": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    assert main(["build", "--dataset", "jsonl", "--input", str(deep), "--store", str(tmp_path / "store"), "--units", "turns"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "chats.jsonl: line 1: not readable JSON: nested too deeply" in err


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory) -> Path:
    """A CrossEncoder folder as fit-reranker writes it: the bundled MiniLM's first layer with a fresh scoring head (seeded)."""
    import torch

    from qgmem_train.reranker.module import load_cross_encoder, save_cross_encoder

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("reranker") / "model"
    save_cross_encoder(load_cross_encoder(BUNDLED_EMBEDDER, max_length=64, num_layers=1), folder)
    return folder


def _bundle(folder: Path, cross_encoder: Path, extra: dict[str, bytes] | None = None) -> Path:
    """The export with ``cross_encoder`` bundled as the exporter bundles it (flat ``reranker.*`` files), plus ``extra`` files."""
    for path in cross_encoder.iterdir():
        shutil.copyfile(path, folder / f"reranker.{path.name}")
    for name, data in (extra or {}).items():
        (folder / name).write_bytes(data)
    config = json.loads((folder / CONFIG_FILE).read_text())
    config["reranker"] = {"kind": "cross", "model": None, "bundled": True}
    config["pipeline"]["models"].update(reranker="cross", reranker_model=None)
    (folder / CONFIG_FILE).write_text(json.dumps(config))
    _write_sums(folder)
    return folder


@pytest.mark.parametrize("name", ["reranker.modeling_evil.py", "reranker.", "reranker..", "reranker..json", "notes.pkl"])
def test_a_bundled_file_must_be_one_of_the_exporters_types(clean_export, cross_encoder, tmp_path, name) -> None:
    folder = _bundle(_hostile(clean_export, tmp_path / "export"), cross_encoder, {name: b"import os\n"})
    with pytest.raises(InputError, match=re.escape(f"{name!r} is not a file the exporter writes")) as refusal:
        QGMemPredictor.from_pretrained(folder, intent="rules", device="cpu", cache_dir=str(tmp_path / "cache"))
    assert "\n" not in str(refusal.value) and not (tmp_path / "cache").exists()


def test_the_bundled_reranker_is_written_from_the_bytes_that_were_verified(clean_export, cross_encoder, tmp_path, monkeypatch) -> None:
    """An attacker who swaps a verified file (and its checksum line) right after the check does not get it loaded."""
    from qgmem_train.predictor import loading

    folder = _bundle(_hostile(clean_export, tmp_path / "export"), cross_encoder)
    original = (folder / "reranker.config.json").read_bytes()
    verify = loading.read_export

    def swapped_after_the_check(path: Path):
        export = verify(path)
        (folder / "reranker.config.json").write_text(json.dumps({**json.loads(original), "swapped": True}))
        _write_sums(folder)
        return export

    monkeypatch.setattr(loading, "read_export", swapped_after_the_check)
    predictor = QGMemPredictor.from_pretrained(folder, intent="rules", device="cpu", cache_dir=str(tmp_path / "cache"))
    [cached] = (tmp_path / "cache" / "rerankers").iterdir()
    assert (cached / "config.json").read_bytes() == original and predictor.reranker is not None


def test_config_and_adapters_are_read_from_the_bytes_that_were_verified(clean_export, tmp_path, monkeypatch) -> None:
    """config.json and both adapters swapped (checksums too) right after the check: the verified bytes are the ones used."""
    from safetensors.torch import load_file

    from qgmem_train.predictor import artifact

    folder = _hostile(clean_export, tmp_path / "export")
    graph, lora = load_file(folder / "graph_adapter.safetensors"), load_file(folder / "adapter_model.safetensors")
    verify = artifact._verify_files

    def swapped_after_the_check(*args: Any, **kwargs: Any) -> Any:
        verified = verify(*args, **kwargs)
        if "graph_adapter.safetensors" not in args[1]:  # config.json is verified (and parsed) before the files it names
            return verified
        config = json.loads((folder / CONFIG_FILE).read_text())
        config["pipeline"]["retrieval"]["k"] = 7
        (folder / CONFIG_FILE).write_text(json.dumps(config))
        for name in ("graph_adapter.safetensors", "adapter_model.safetensors"):
            _resave(folder / name, lambda tensors, metadata: tensors.update({k: v + 1.0 for k, v in tensors.items()}))
        _write_sums(folder)
        return verified

    monkeypatch.setattr(artifact, "_verify_files", swapped_after_the_check)
    predictor = QGMemPredictor.from_pretrained(folder, intent="rules", device="cpu")
    assert predictor.pipeline.retrieval.k == 3
    state = predictor.model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in graph.items())
    from peft import get_peft_model_state_dict

    loaded_lora = get_peft_model_state_dict(predictor.model.llm)
    assert set(loaded_lora) == set(lora) and all(torch.equal(loaded_lora[k], v) for k, v in lora.items())


def test_an_exported_reranker_length_past_the_models_positions_is_one_line(clean_export, cross_encoder, tmp_path) -> None:
    folder = _bundle(_hostile(clean_export, tmp_path / "export"), cross_encoder)
    config = json.loads((folder / CONFIG_FILE).read_text())
    config["pipeline"]["models"]["reranker_max_length"] = 4096
    (folder / CONFIG_FILE).write_text(json.dumps(config))
    _write_sums(folder)
    with pytest.raises(InputError, match="reranker_max_length: is 4096, more than the 512 positions of the cross-encoder") as refusal:
        QGMemPredictor.from_pretrained(folder, intent="rules", device="cpu", cache_dir=str(tmp_path / "cache"))
    assert "\n" not in str(refusal.value)


def test_a_bundled_reranker_config_that_does_not_fit_its_weights_is_one_line(clean_export, cross_encoder, tmp_path) -> None:
    folder = _bundle(_hostile(clean_export, tmp_path / "export"), cross_encoder)
    config = json.loads((folder / "reranker.config.json").read_text())
    config["intermediate_size"] *= 2
    (folder / "reranker.config.json").write_text(json.dumps(config))
    _write_sums(folder)
    with pytest.raises(InputError, match="the cross-encoder does not load: .*ignore_mismatched_sizes") as refusal:
        QGMemPredictor.from_pretrained(folder, intent="rules", device="cpu", cache_dir=str(tmp_path / "cache"))
    assert "\n" not in str(refusal.value)


def test_a_bundled_reranker_config_of_another_architecture_than_its_weights_is_refused(clean_export, cross_encoder, tmp_path) -> None:
    """``model_type: gpt2`` over BERT weights: transformers would initialise every parameter anew and the reranker rank at random."""
    folder = _bundle(_hostile(clean_export, tmp_path / "export"), cross_encoder)
    config = json.loads((folder / "reranker.config.json").read_text())
    config.update(model_type="gpt2", architectures=["GPT2ForSequenceClassification"])
    (folder / "reranker.config.json").write_text(json.dumps(config))
    _write_sums(folder)
    with pytest.raises(InputError, match=r"config.json: builds a model its weights do not fit: \d+ parameter\(s\) not in model.safetensors") as refusal:
        QGMemPredictor.from_pretrained(folder, intent="rules", device="cpu", cache_dir=str(tmp_path / "cache"))
    assert "\n" not in str(refusal.value)


PANICKING_REGEX = r"(?:.|.)*\b\B"
"""A pre-tokenizer pattern that never matches and backtracks past Oniguruma's retry limit on a question: the tokenizers
library panics (pyo3's ``PanicException``, a ``BaseException`` that ``except Exception`` misses)."""


@pytest.mark.parametrize("runtime", ["torch", "onnxruntime"])
def test_a_bundled_reranker_tokenizer_that_panics_is_one_line(clean_export, cross_encoder, minilm, tmp_path, monkeypatch, capsys, runtime) -> None:
    folder = _bundle(_hostile(clean_export, tmp_path / "export"), cross_encoder)
    tokenizer = json.loads((folder / "reranker.tokenizer.json").read_text())
    tokenizer["pre_tokenizer"] = {"type": "Split", "pattern": {"Regex": PANICKING_REGEX}, "behavior": "Isolated", "invert": False}
    (folder / "reranker.tokenizer.json").write_text(json.dumps(tokenizer))
    settings = json.loads((folder / "reranker.tokenizer_config.json").read_text())
    (folder / "reranker.tokenizer_config.json").write_text(json.dumps({**settings, "tokenizer_class": "PreTrainedTokenizerFast"}))  # tokenizer.json as written
    config = json.loads((folder / CONFIG_FILE).read_text())
    config["pipeline"]["models"]["reranker_runtime"] = runtime
    (folder / CONFIG_FILE).write_text(json.dumps(config))
    _write_sums(folder)
    store = _store(tmp_path, minilm)
    monkeypatch.setenv("QGMEM_CACHE", str(tmp_path / "cache"))
    capsys.readouterr()
    assert main(["ask", "--intent", "rules", "--store", str(store), "--model", str(folder), QUESTION]) == 2
    *progress, error = capsys.readouterr().err.splitlines()  # with ONNX Runtime, one line says the graph is exported first
    assert error.startswith("error: ") and "tokenizer.json: the tokenizer fails: Onig: Regex search error: retry-limit-in-match over" in error
    assert len(progress) == (runtime == "onnxruntime") and not any(line.startswith(("error", "Traceback")) for line in progress)


def _link_outside(kind: str) -> Callable[[Path, Path], None]:
    def tamper(folder: Path, outside: Path) -> None:
        target = outside / "adapter_model.safetensors"
        shutil.move(folder / "adapter_model.safetensors", target)
        (os.symlink if kind == "symlink" else os.link)(target, folder / "adapter_model.safetensors")

    return tamper


@pytest.mark.parametrize("kind", ["symlink", "hard link"])
def test_a_listed_file_linked_from_outside_the_folder_is_refused(clean_export, tmp_path, kind) -> None:
    folder = _hostile(clean_export, tmp_path / "export")
    (tmp_path / "outside").mkdir()
    _link_outside(kind)(folder, tmp_path / "outside")
    with pytest.raises(InputError, match="adapter_model.safetensors: a (link to .*, outside the export folder|hard link)"):
        QGMemPredictor.from_pretrained(folder, intent="rules", device="cpu")


def test_an_export_in_the_hub_cache_layout_still_loads(clean_export) -> None:
    """The Hub cache's snapshot files are links into the same repo's blobs/: that layout is the one exception."""
    repo_id = publish_to_hub_cache(clean_export)
    predictor = QGMemPredictor.from_pretrained(repo_id, intent="rules", device="cpu")
    assert predictor.path == "graph"


def test_a_replaced_onnx_graph_in_the_cache_is_exported_again_not_run(clean_export, cross_encoder, tmp_path) -> None:
    import numpy as np
    import onnx

    from qgmem_train.retrieval.rerank import CrossEncoderReranker

    models = {"reranker": "cross", "reranker_model": str(cross_encoder), "reranker_runtime": "onnxruntime"}
    pairs = ["Melanie painted a sunrise over the lake.", "Caroline went to a support group."]
    expected = CrossEncoderReranker(str(cross_encoder), device="cpu").score("What did Melanie paint?", pairs)
    first = QGMemPredictor.from_pretrained(clean_export, intent="rules", device="cpu", models=models, cache_dir=str(tmp_path / "cache"))
    assert np.allclose(first.reranker.score("What did Melanie paint?", pairs), expected, atol=1e-4)
    [graph] = (tmp_path / "cache" / "onnx").glob("*/model.onnx")
    model = onnx.load(str(graph))
    head = next(t for t in model.graph.initializer if t.name == "classifier.weight")
    head.CopyFrom(onnx.numpy_helper.from_array(-3.0 * onnx.numpy_helper.to_array(head), head.name))
    onnx.save(model, str(graph))
    again = QGMemPredictor.from_pretrained(clean_export, intent="rules", device="cpu", models=models, cache_dir=str(tmp_path / "cache"))
    assert np.allclose(again.reranker.score("What did Melanie paint?", pairs), expected, atol=1e-4)


def test_ask_without_a_namespace_names_no_namespace_of_the_store(clean_export, minilm, tmp_path, capsys) -> None:
    cfg = PipelineConfig()
    cfg.construction.units, cfg.construction.traces = "turns", False
    predictor = QGMemPredictor(None, cfg, llm=ScriptedLLM([]), embedder=minilm, reranker=None, intent="rules")
    for user in ("alice-private-id", "bob-private-id"):
        with predictor.memory(user, tmp_path / "store") as memory:
            memory.add_session(SESSION)
    assert main(["ask", "--intent", "rules", "--store", str(tmp_path / "store"), "--model", str(clean_export), QUESTION]) == 2
    err = capsys.readouterr().err
    assert "holds 2 namespaces; pick one with --namespace" in err and "private-id" not in err


def test_export_records_no_local_path_for_the_base_model(clean_export, tmp_path, capsys) -> None:
    from export.__main__ import main as export_main

    root = clean_export.parent
    arguments = ["--checkpoint", str(root / "tiny.ckpt"), "--config", str(root / "fit.yaml"), "--out", str(tmp_path / "out"), "--dry-run"]
    assert export_main(arguments) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pipeline.models.llm" in err and "--llm-id" in err and not (tmp_path / "out").exists()
    assert export_main([*arguments, "--llm-id", "someone/tiny-qwen3"]) == 0
    config = (tmp_path / "out" / CONFIG_FILE).read_text()
    assert str(root) not in config and str(root) not in (tmp_path / "out" / "adapter_config.json").read_text()
    exported = json.loads(config)
    assert exported["module"]["llm"] == exported["base_model"]["id"] == "someone/tiny-qwen3"
    assert exported["pipeline"]["models"]["llm"] == "someone/tiny-qwen3" and exported["pipeline"]["models"]["embedder"] == BUNDLED_EMBEDDER


def test_a_checksum_file_is_read_as_sha256sum_reads_it(clean_export, tmp_path) -> None:
    """Uppercase hex, a binary-mode ``*`` marker, a comment and a trailing blank line: ``sha256sum -c`` accepts all four."""
    folder = _hostile(clean_export, tmp_path / "export")
    lines = (folder / CHECKSUM_FILE).read_text().splitlines()
    rewritten = ["# written by hand", lines[0][:64].upper() + lines[0][64:], lines[1][:64] + " *" + lines[1][66:], *lines[2:], ""]
    (folder / CHECKSUM_FILE).write_text("\n".join(rewritten) + "\n")
    assert QGMemPredictor.from_pretrained(folder, intent="rules", device="cpu").path == "graph"


@pytest.mark.parametrize(
    "url, secret",
    [
        ("https://api.example.com/v1;token=s3cr3t-path/chat", "s3cr3t-path"),
        ("https://api.example.com/v1#access_token=s3cr3t-fragment", "s3cr3t-fragment"),
        ("https://user:s3cr3t-password@api.example.com/v1?key=s3cr3t-query", "s3cr3t-"),
    ],
)
def test_redact_url_masks_every_place_a_url_carries_a_token(url, secret) -> None:
    from qgmem_train.llm.http import redact_url

    shown = redact_url(url)
    assert secret not in shown and "api.example.com" in shown


def test_the_cli_refuses_a_config_sending_the_key_over_plain_http_unless_it_allows_it(tmp_path, monkeypatch, capsys, minilm) -> None:
    """Refused in one line, no request sent; with ``allow_insecure_http: true`` one warning line per host."""
    monkeypatch.setenv(SECRET_ENV, SECRET)
    config = tmp_path / "api.yaml"
    models = {"backend": "openai", "base_url": "http://192.0.2.7:9/v1", "api_key_env": SECRET_ENV, "reranker": "none", "timeout_s": 0.2, "max_retries": 0}
    config.write_text(yaml.safe_dump({"pipeline": {"models": models, "construction": {"units": "turns", "traces": False}}}))
    _store(tmp_path, minilm)
    ask = ["ask", "--intent", "rules", "--store", str(tmp_path / "store"), "--config", str(config), QUESTION]
    assert main(ask) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "plain http to another machine" in err and "allow_insecure_http: true" in err and SECRET not in err
    config.write_text(yaml.safe_dump({"pipeline": {"models": {**models, "allow_insecure_http": True}, "construction": {"units": "turns", "traces": False}}}))
    for _ in range(2):
        main(ask)
    err = capsys.readouterr().err
    assert err.count("plain http to another machine") == 1 and SECRET not in err


def _rules_predictor(minilm, traces: bool = False) -> QGMemPredictor:
    """A predictor building turn units without an LLM (``traces``: consolidating traces too, the scripted LLM restating none)."""
    cfg = PipelineConfig()
    cfg.construction.units, cfg.construction.traces = "turns", traces
    return QGMemPredictor(None, cfg, llm=ScriptedLLM([]), embedder=minilm, reranker=None, intent="rules")


def _victim_files(folder: Path) -> dict[str, bytes]:
    """A user's files in ``folder`` (one of them in its own ``vectors/``); returns name → content, to check them afterwards."""
    files = {"notes.txt": b"my notes", "vectors/photo.jpg": b"\xff\xd8 a photo", f"vectors/{'ab' * 16}.vec": b"not the store's"}
    for name, content in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(content)
    return files


def _intact(folder: Path, files: dict[str, bytes]) -> bool:
    return all((folder / name).is_file() and (folder / name).read_bytes() == content for name, content in files.items())


def test_a_store_is_not_made_in_a_folder_of_other_files(minilm, tmp_path, capsys) -> None:
    folder = tmp_path / "documents"
    files = _victim_files(folder)
    with pytest.raises(InputError, match="documents: not a memory store, and not empty"):
        with _rules_predictor(minilm).memory("alice", folder) as memory:
            memory.add_session(SESSION)
    samples = Path(__file__).resolve().parents[1] / "samples" / "plain_chat.jsonl"
    (tmp_path / "cfg.yaml").write_text("pipeline:\n  construction:\n    traces: false\n")
    capsys.readouterr()
    arguments = ["build", "--dataset", "jsonl", "--input", str(samples), "--store", str(folder), "--units", "turns", "--config", str(tmp_path / "cfg.yaml")]
    assert main(arguments) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a memory store, and not empty" in err
    assert _intact(folder, files) and sorted(p.name for p in folder.iterdir()) == ["notes.txt", "vectors"]


def test_a_write_deletes_only_files_the_store_wrote(minilm, tmp_path) -> None:
    store = _store(tmp_path, minilm)
    files = _victim_files(store)
    predictor = _rules_predictor(minilm)
    with predictor.memory("alice", store) as memory:
        memory.add_session([{"speaker": "Caroline", "text": "I adopted a puppy named Oscar."}], session_id="S2")
        memory.add_session([{"speaker": "Melanie", "text": "We went camping in the mountains."}], session_id="S3")
    with MemoryStore.open(store) as opened:
        assert len(opened.load_namespace("alice").units) == 4
    assert _intact(store, files)


@pytest.mark.parametrize("folder", ["vectors", "trace_graphs"])
def test_a_symlinked_store_subfolder_is_refused(minilm, tmp_path, folder) -> None:
    store = _store(tmp_path, minilm)
    victim = tmp_path / "victim"
    (store / folder).mkdir(exist_ok=True)
    shutil.move(store / folder, victim)
    files = _victim_files(victim)
    (store / folder).symlink_to(victim, target_is_directory=True)
    with pytest.raises(InputError, match=f"{folder}: a link to .*; a store's folders must be its own"):
        with _rules_predictor(minilm, traces=True).memory("alice", store) as memory:
            memory.add_session([{"speaker": "Caroline", "text": "I adopted a puppy named Oscar."}], session_id="S2")
    assert _intact(victim, files)


SCHEMA_CASES = {
    "a trigger wiping other namespaces": ("CREATE TRIGGER wipe AFTER INSERT ON turns BEGIN DELETE FROM turns WHERE namespace <> NEW.namespace; END", "trigger wipe"),
    "a view": ("CREATE VIEW everyone AS SELECT * FROM turns", "view everyone"),
    "an index": ("CREATE INDEX turns_text ON turns (text)", "index turns_text"),
    "a table of the store's defined otherwise": ("ALTER TABLE turns ADD COLUMN note TEXT DEFAULT 'x'", "table turns"),
    **{
        f"a trigger named {name} as SQLite's statistics are": (
            "PRAGMA writable_schema=ON; INSERT INTO sqlite_master (type, name, tbl_name, rootpage, sql) VALUES ('trigger', "
            f"'{name}', 'turns', 0, 'CREATE TRIGGER {name} AFTER INSERT ON turns BEGIN DELETE FROM turns WHERE namespace <> NEW.namespace; END')",
            f"trigger {name}",
        )
        for name in ("sqlite_stat9", "SQLITE_STAT1")
    },
}
"""Case → (the statement a handed-over ``memory.sqlite`` was given, the entry the one line names)."""


@pytest.mark.parametrize("case", list(SCHEMA_CASES))
def test_a_store_whose_schema_is_not_ours_is_refused_and_left_as_it_was(minilm, tmp_path, case) -> None:
    import sqlite3

    statement, entry = SCHEMA_CASES[case]
    predictor = _rules_predictor(minilm)
    for user in ("alice", "bob"):
        with predictor.memory(user, tmp_path / "store") as memory:
            memory.add_session(SESSION)
    file = tmp_path / "store" / "memory.sqlite"
    queries = ["SELECT namespace, id, session_id, position, speaker, text, time FROM turns ORDER BY namespace, id", "SELECT * FROM segment_parts ORDER BY namespace, kind, seq, part, piece"]

    def others_rows() -> list[list[tuple]]:
        with sqlite3.connect(file) as db:
            return [db.execute(query).fetchall() for query in queries]

    before = others_rows()
    with sqlite3.connect(file) as db:
        db.executescript(statement)
    with pytest.raises(InputError, match=f"memory.sqlite: not a memory store: {entry} .*not in a memory store's schema"):
        with predictor.memory("mallory", tmp_path / "store") as memory:
            memory.add_session([{"speaker": "Caroline", "text": "I adopted a puppy named Oscar."}], session_id="S2")
    assert others_rows() == before and {row[0] for row in before[0]} == {"alice", "bob"} and before[1]


def test_a_store_with_sqlites_own_statistics_still_opens(tmp_path) -> None:
    import sqlite3

    with MemoryStore.open(tmp_path / "store", create=True) as store:
        store.ensure_namespace("alice", "turns", "four-d", 4)
    with sqlite3.connect(tmp_path / "store" / "memory.sqlite") as db:
        db.execute("ANALYZE")
        assert db.execute("SELECT COUNT(*) FROM sqlite_master WHERE name = 'sqlite_stat1'").fetchone() == (1,)
    with MemoryStore.open(tmp_path / "store") as store:
        assert store.namespaces() == ["alice"]


def _returns_within(seconds: float, call: Callable[[], object]) -> BaseException | None:
    """What ``call()`` raised (None when it returned), failing the test when it is still running after ``seconds``: a
    guard against an open of a FIFO that blocks for ever (it is left blocked, in a daemon thread)."""
    raised: list[BaseException] = []

    def target() -> None:
        try:
            call()
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still blocked after {seconds} s"
    return raised[0] if raised else None


FIFO_POSITIONS = {
    "the SQLite file": lambda store: store / "memory.sqlite",
    "a vector sidecar": lambda store: next((store / "vectors").glob("*.vec")),
    "the record of written sidecars": lambda store: store / "vectors" / "written.tokens",
    "the trace-graph cache": lambda store: next((store / "trace_graphs").glob("*.npz")),
}
"""Each file of a store's folder a handed-over store can make a FIFO, whose open (or read) would block."""


@pytest.mark.parametrize("position", list(FIFO_POSITIONS))
def test_a_fifo_in_a_store_file_position_is_refused_in_one_line(minilm, tmp_path, position) -> None:
    predictor = _rules_predictor(minilm, traces=True)
    with predictor.memory("alice", tmp_path / "store") as memory:
        memory.add_session(SESSION, session_id="S1")
        memory.add_session([{"speaker": "Caroline", "text": "I adopted a puppy named Oscar."}], session_id="S2")
    path = FIFO_POSITIONS[position](tmp_path / "store")
    path.unlink()
    os.mkfifo(path)

    def add_and_ask() -> None:
        with predictor.memory("alice", tmp_path / "store") as memory:
            memory.add_session([{"speaker": "Melanie", "text": "We went camping in the mountains."}], session_id="S3")
            memory.search("Where did Melanie go?")

    raised = _returns_within(120, add_and_ask)
    assert isinstance(raised, InputError), raised
    assert str(raised).startswith(str(path)) and "not a regular file" in str(raised) and "\n" not in str(raised)


def _hub_blob_hard_linked(clean: Path, tmp_path: Path) -> str:
    """The export published to the Hub cache layout, its adapter's blob a hard link to a file outside the cache."""
    from huggingface_hub import constants

    repo_id = publish_to_hub_cache(clean, owner="qgmem-hard-linked")
    [link] = (Path(constants.HF_HUB_CACHE) / f"models--{repo_id.replace('/', '--')}" / "snapshots").glob("*/adapter_model.safetensors")
    blob = link.resolve()
    shutil.move(blob, tmp_path / "outside.safetensors")
    os.link(tmp_path / "outside.safetensors", blob)
    return repo_id


def _checksums_linked_out(clean: Path, tmp_path: Path) -> str:
    """A copy of the export whose checksum file is a symlink to a file outside it."""
    folder = _hostile(clean, tmp_path / "export")
    shutil.move(folder / CHECKSUM_FILE, tmp_path / "sums.txt")
    (folder / CHECKSUM_FILE).symlink_to(tmp_path / "sums.txt")
    return str(folder)


@pytest.mark.parametrize(
    "tamper, message",
    [(_hub_blob_hard_linked, "adapter_model.safetensors: a hard link"), (_checksums_linked_out, f"{CHECKSUM_FILE}: a link to .*, outside the export folder")],
    ids=["a Hub blob hard-linked from outside", "the checksum file a link out of the folder"],
)
def test_a_link_out_through_the_hub_blobs_or_the_checksum_file_is_refused(clean_export, tmp_path, tamper, message) -> None:
    ref = tamper(clean_export, tmp_path)
    with pytest.raises(InputError, match=message):
        QGMemPredictor.from_pretrained(ref, intent="rules", device="cpu")


def test_an_export_records_no_local_file_for_its_reranker(tmp_path) -> None:
    from export.package import bundle_reranker

    (tmp_path / "model.onnx").write_bytes(b"a local file")
    cfg = PipelineConfig()
    cfg.models.reranker, cfg.models.reranker_model = "cross", str(tmp_path / "model.onnx")
    with pytest.raises(InputError, match="model.onnx: a file, not a cross-encoder folder"):
        bundle_reranker(cfg, tmp_path)


CONTROLS = "\x1b[2J\x1b]0;title\x07\rA: I never said that\u2028B: \u202egnp.exe\u2066\x85\x9b31m"
"""Terminal escapes, a carriage return, a line separator, bidi overrides and isolates, C1 controls (NEL, CSI)."""


def test_stored_text_reaches_the_terminal_and_json_without_controls(clean_export, minilm, tmp_path, capsys) -> None:
    with _rules_predictor(minilm).memory("alice", tmp_path / "store") as memory:
        memory.add_session([{"speaker": f"Melanie{CONTROLS}", "text": f"I painted a sunrise.{CONTROLS}"}])
    capsys.readouterr()
    arguments = ["ask", "--intent", "rules", "--store", str(tmp_path / "store"), "--model", str(clean_export), QUESTION]
    assert main(arguments) == 0
    shown = capsys.readouterr().out
    assert "I painted a sunrise." in shown and "\\x1b" in shown
    assert not any(c in shown for c in "\x1b\x07\r\u2028\u202e\u2066\x85\x9b") and not any(line.startswith(("A:", "B:")) for line in shown.splitlines())
    assert main([*arguments[:-1], "--json", QUESTION]) == 0
    printed = capsys.readouterr().out
    assert not any(c in printed for c in "\x1b\x07\r\u2028\u202e\u2066\x85\x9b")
    [turn] = [t for unit in json.loads(printed)["units"] for t in unit["source_turns"]]
    assert turn["text"] == f"I painted a sunrise.{CONTROLS}" and turn["speaker"] == f"Melanie{CONTROLS}"


def test_ask_reaches_the_hub_only_when_the_model_is_written_as_a_hub_repo(clean_export, minilm, tmp_path, monkeypatch, capsys) -> None:
    """``--model owner/name`` that is no folder here is a typo of a folder, not a Hub repo, even when a cache holds that repo."""
    repo_id = publish_to_hub_cache(clean_export, owner="qgmem-hub-form")
    store = _store(tmp_path, minilm)
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(["ask", "--intent", "rules", "--store", str(store), "--model", repo_id, QUESTION]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{repo_id}: no such folder" in err and f"hf://{repo_id}" in err
    assert main(["ask", "--intent", "rules", "--store", str(store), "--model", f"hf://{repo_id}", QUESTION]) == 0


@pytest.mark.parametrize("cap, length", [(None, 2_000_000), (40, 41)], ids=["a 2 MB turn under the default cap", "a turn over a configured cap"])
def test_a_turn_longer_than_the_cap_is_one_line_and_nothing_is_stored(tmp_path, capsys, cap, length) -> None:
    turns = [{"id": "t1", "speaker": "Alex", "text": "I adopted a beagle."}, {"id": "t2", "speaker": "Sam", "text": "x" * length}]
    (tmp_path / "chats.jsonl").write_text(json.dumps({"id": "alex", "sessions": [{"id": "s1", "turns": turns}]}) + "\n")
    construction = {"traces": False, **({"max_turn_chars": cap} if cap else {})}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump({"pipeline": {"construction": construction}}))
    capsys.readouterr()
    arguments = ["build", "--dataset", "jsonl", "--input", str(tmp_path / "chats.jsonl"), "--store", str(tmp_path / "store"), "--units", "turns"]
    assert main([*arguments, "--config", str(tmp_path / "cfg.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"session s1, turn t2: {length} characters, more than the {cap or 100_000} a turn may have" in err
    assert not (tmp_path / "store").exists()


def _add_revision(repo_id: str, folder: Path, branch: str) -> None:
    """Add ``folder``'s files to the cached Hub repo ``repo_id`` as the head of ``branch`` (as a push to a branch or PR would)."""
    from huggingface_hub import constants

    repo = Path(constants.HF_HUB_CACHE) / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / uuid.uuid4().hex
    snapshot.mkdir(parents=True)
    for path in sorted(folder.iterdir()):
        digest = file_sha256(path)
        shutil.copyfile(path, repo / "blobs" / digest)
        (snapshot / path.name).symlink_to(os.path.relpath(repo / "blobs" / digest, snapshot))
    (repo / "refs" / branch).write_text(snapshot.name)


def test_the_callers_trust_applies_only_at_the_revision_the_caller_names(clean_export, tmp_path) -> None:
    """The caller names (and trusts) the base model; the export picks a branch of that repo holding code: it never runs."""
    marker = tmp_path / "marker"
    trusted, branch = json.loads((clean_export / CONFIG_FILE).read_text())["module"]["llm"], f"evil-{uuid.uuid4().hex[:8]}"
    _add_revision(trusted, _model_with_repository_code(clean_export, tmp_path, marker), branch)
    folder = _hostile(clean_export, tmp_path / "export", lambda c: c["module"].update(llm_revision=branch))
    loaded = None
    with contextlib.suppress(InputError):  # today's code loads the branch, runs its code, then refuses its fingerprint
        loaded = QGMemPredictor.from_pretrained(folder, intent="rules", device="cpu", trust_remote_code=True, models={"llm": trusted})
    assert not marker.exists()
    assert loaded is not None and loaded.path == "graph"


def test_a_store_its_owner_ran_analyze_on_still_opens(minilm, tmp_path) -> None:
    """SQLite's own statistics tables (``ANALYZE``, ``PRAGMA optimize``) steer only the query planner: not a foreign entry."""
    import sqlite3

    predictor = _rules_predictor(minilm)
    with predictor.memory("alice", tmp_path / "store") as memory:
        memory.add_session(SESSION)
    with sqlite3.connect(tmp_path / "store" / "memory.sqlite") as db:
        db.execute("ANALYZE")
    with predictor.memory("alice", tmp_path / "store") as memory:
        memory.add_session([{"speaker": "Caroline", "text": "I adopted a puppy named Oscar."}], session_id="S2")
        assert "Oscar" in memory.search("Who adopted a puppy?").memory_context


def _plant_onnx_graph(cache: Path, writable: str) -> None:
    """The attacker's graph (the scoring head negated) in the cached ONNX entry, ``sha256.json`` rewritten to match,
    in an entry (or a cache folder) that others can write."""
    import onnx

    from qgmem_train.retrieval.onnx_rerank import DIGESTS_FILE, GRAPH_FILE

    [entry] = (cache / "onnx").iterdir()
    model = onnx.load(str(entry / GRAPH_FILE))
    head = next(t for t in model.graph.initializer if t.name == "classifier.weight")
    head.CopyFrom(onnx.numpy_helper.from_array(-3.0 * onnx.numpy_helper.to_array(head), head.name))
    onnx.save(model, str(entry / GRAPH_FILE))
    (entry / DIGESTS_FILE).write_text(json.dumps({GRAPH_FILE: file_sha256(entry / GRAPH_FILE)}))
    os.chmod(entry if writable == "entry" else entry.parent, 0o777)


@pytest.mark.parametrize("writable", ["entry", "cache folder"])
def test_a_planted_onnx_graph_with_matching_digests_is_never_run(clean_export, cross_encoder, tmp_path, writable) -> None:
    """Digests beside a graph prove nothing to whoever can write both: an entry others can write is exported again,
    a cache folder others can write is refused in one line."""
    import numpy as np

    from qgmem_train.errors import ModelUnavailableError
    from qgmem_train.retrieval.rerank import CrossEncoderReranker

    models = {"reranker": "cross", "reranker_model": str(cross_encoder), "reranker_runtime": "onnxruntime"}
    pairs = ["Melanie painted a sunrise over the lake.", "Caroline went to a support group."]
    expected = CrossEncoderReranker(str(cross_encoder), device="cpu").score("What did Melanie paint?", pairs)
    cache = tmp_path / "cache"
    QGMemPredictor.from_pretrained(clean_export, intent="rules", device="cpu", models=models, cache_dir=str(cache))
    _plant_onnx_graph(cache, writable)
    if writable == "cache folder":
        with pytest.raises(ModelUnavailableError, match=re.escape(f"{cache / 'onnx'}: writable by others")) as refusal:
            QGMemPredictor.from_pretrained(clean_export, intent="rules", device="cpu", models=models, cache_dir=str(cache))
        assert "\n" not in str(refusal.value)
        return
    again = QGMemPredictor.from_pretrained(clean_export, intent="rules", device="cpu", models=models, cache_dir=str(cache))
    assert np.allclose(again.reranker.score("What did Melanie paint?", pairs), expected, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("writable", ["entry", "cache folder"])
def test_planted_weights_in_the_converted_gguf_folder_are_not_loaded(llm_dir, tmp_path, writable) -> None:
    """Other weights (the tiny decoder) under a GGUF's converted key, in an entry (or a cache folder) others can write: the
    entry is converted again, the cache folder refused in one line. The GGUF is the tiny one (SmolLM2's conversion takes
    half a minute; tests/test_llm_models.py converts it); the bundled model's key is the same function of its file."""
    from qgmem_train.errors import ModelUnavailableError

    gguf = save_tiny_gguf(tmp_path / "tiny.gguf")
    entry = tmp_path / "cache" / "converted" / f"{gguf.stem}-{file_sha256(gguf)[:16]}"
    shutil.copytree(llm_dir, entry)
    assert json.loads((entry / "config.json").read_text())["vocab_size"] != TINY_GGUF_VOCAB, "the planted weights are another model's"
    os.chmod(entry if writable == "entry" else entry.parent, 0o777)
    if writable == "cache folder":
        with pytest.raises(ModelUnavailableError, match=re.escape(f"{entry.parent}: writable by others")) as refusal:
            resolve_model_dir(str(gguf), tmp_path / "cache")
        assert "\n" not in str(refusal.value)
        return
    assert resolve_model_dir(str(gguf), tmp_path / "cache") == entry
    assert json.loads((entry / "config.json").read_text())["vocab_size"] == TINY_GGUF_VOCAB


@pytest.mark.parametrize("writable", ["entry", "cache folder"])
def test_a_cached_bundled_reranker_others_can_write_is_not_used(clean_export, cross_encoder, tmp_path, writable) -> None:
    """Its files match the verified checksums, but whoever can write the entry can swap them after that check:
    the entry is written again; a cache folder others can write is refused in one line."""
    from qgmem_train.errors import ModelUnavailableError

    folder = _bundle(_hostile(clean_export, tmp_path / "export"), cross_encoder)
    cache = tmp_path / "cache"
    QGMemPredictor.from_pretrained(folder, intent="rules", device="cpu", cache_dir=str(cache))
    [entry] = (cache / "rerankers").iterdir()
    os.chmod(entry if writable == "entry" else entry.parent, 0o777)
    if writable == "cache folder":
        with pytest.raises(ModelUnavailableError, match=re.escape(f"{entry.parent}: writable by others")) as refusal:
            QGMemPredictor.from_pretrained(folder, intent="rules", device="cpu", cache_dir=str(cache))
        assert "\n" not in str(refusal.value)
        return
    QGMemPredictor.from_pretrained(folder, intent="rules", device="cpu", cache_dir=str(cache))
    assert all(not path.stat().st_mode & 0o022 for path in [entry, *entry.iterdir()])


@pytest.mark.parametrize(("name", "refusal"), [("notes.txt", None), ("extra.json", "more than the 16777216 a JSON file of an export may hold"),
                                               (CONFIG_FILE, "more than the 16777216 a JSON file of an export may hold")])
def test_a_large_listed_file_is_hashed_in_blocks_and_a_large_json_refused_unread(clean_export, tmp_path, name, refusal) -> None:
    """A listed file of 256 MiB (sparse) never sits in memory: peak Python allocations stay a few MiB while it is checked."""
    import tracemalloc

    from qgmem_train.predictor import read_export

    folder = _hostile(clean_export, tmp_path / "export")
    with (folder / name).open("ab") as handle:
        handle.truncate(256 << 20)
    _write_sums(folder)
    tracemalloc.start()
    try:
        if refusal is None:
            read_export(folder)
        else:
            with pytest.raises(InputError, match=re.escape(refusal)):
                read_export(folder)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"peak {peak >> 20} MiB while checking a 256 MiB file"
