"""Hostile exports: an export (a Hub repo) never decides what code runs or where secrets go, and hides no file.

The attacker controls every byte of the folder, the checksum file included, so each case rewrites
``sha256sums.txt`` to match its edits. The base export is a tiny random decoder with LoRA, trained
for one step and exported by ``export.package``; a loopback HTTP server records whatever reaches it.
"""

from __future__ import annotations

import json
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
import yaml

from qgmem_train.__main__ import main
from qgmem_train.config import BUNDLED_EMBEDDER, PipelineConfig
from qgmem_train.errors import InputError
from qgmem_train.llm.resolver import resolve_model_dir
from qgmem_train.model.datamodule import TrajectoryDataModule
from qgmem_train.model.module import GraphAugmentedLM
from qgmem_train.predictor import CHECKSUM_FILE, CONFIG_FILE, QGMemPredictor, file_sha256
from tests.fakes import ScriptedLLM
from tests.tiny_decoder import FIXTURE, fixture_corpus, publish_to_hub_cache, save_tiny_decoder, tiny_module_kwargs

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
    model = GraphAugmentedLM(**tiny_module_kwargs(llm_dir, data.feature_dim, lora_r=2))
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
