"""Export of a trained checkpoint and the predictor over it: round trip, checksums, push failures, persistence.

One module fixture trains the graph adapter and LoRA for one step on SmolLM2 (the committed trajectory
fixture) and exports it with a fit config whose pipeline ran against an internal HTTP server; every test
reads that folder or a copy of it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
import yaml

from export.__main__ import main as export_main
from export.hub import PushError, push_folder
from export.package import export_model, read_eval_report, unsafe_files, write_checksums
from qgmem_train.config import BUNDLED_EMBEDDER, BUNDLED_LLM, load_pipeline_config
from qgmem_train.errors import InputError
from qgmem_train.fileio import OUTPUT_MARKER
from qgmem_train.model.checkpoint import trainable_state_dict
from qgmem_train.model.datamodule import TrajectoryDataModule
from qgmem_train.model.module import GraphAugmentedLM
from qgmem_train.predictor import CALLER_MODELS, CHECKSUM_FILE, MACHINE_MODELS, QGMemPredictor, verify_checksums
from tests.tiny_decoder import FIXTURE, fit_to_last_checkpoint

REPO = Path(__file__).resolve().parents[1]
PIPELINE = {
    "models": {"llm": BUNDLED_LLM, "embedder": BUNDLED_EMBEDDER, "reranker": "none", "dtype": "float32", "device": "cpu"},
    "construction": {"units": "turns", "traces": False},
    "retrieval": {"k": 4},
    "generation": {"max_new_tokens": 16},
}
INTERNAL_SERVER = {"backend": "openai", "base_url": "http://10.20.30.40:8000/v1", "api_key_env": "INTERNAL_VLLM_KEY"}
"""How the trajectories were built on the training cluster: nothing of it belongs in an export."""
SESSION = [
    {"speaker": "Caroline", "text": "I went to the LGBTQ support group yesterday and it was so powerful."},
    {"speaker": "Melanie", "text": "That's great! I painted a sunrise over the lake last week."},
    {"speaker": "Caroline", "text": "I'm thinking about studying counseling next year."},
]
QUESTION = "What did Melanie paint?"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(model in memory, checkpoint path, fit YAML path, export folder) after one LoRA + adapter step."""
    root = tmp_path_factory.mktemp("export")
    L.seed_everything(0)
    data = TrajectoryDataModule(str(FIXTURE), batch_size=1, max_examples=1)
    model = GraphAugmentedLM(
        feature_dim=data.feature_dim, llm=BUNDLED_LLM, dtype="float32", encoder={"hidden_dim": 32, "layers": 1, "heads": 2},
        projector={"hidden_dim": 32}, lora={"r": 2}, prompt={"max_context_tokens": 48}, generation={"max_new_tokens": 32},
        optim={"learning_rate": 1e-2, "weight_decay": 0.0},
    )  # fmt: skip
    checkpoint = fit_to_last_checkpoint(model, data, root, steps=1)
    config = root / "fit.yaml"
    config.write_text(yaml.safe_dump({"pipeline": {**PIPELINE, "models": {**PIPELINE["models"], **INTERNAL_SERVER}}}))
    out = root / "model"
    assert export_main(["--checkpoint", str(checkpoint), "--config", str(config), "--out", str(out), "--dry-run", "--push", "me/qgmem"]) == 0
    return model.eval(), checkpoint, config, out


def _copy(folder: Path, target: Path) -> Path:
    shutil.copytree(folder, target)
    return target


def test_export_is_complete_checksummed_and_free_of_pickles(trained, capsys) -> None:
    model, _, config_path, out = trained
    names = {p.name for p in out.iterdir()}
    assert names == {"graph_adapter.safetensors", "adapter_model.safetensors", "adapter_config.json", "config.json", "prompts.json", "README.md", CHECKSUM_FILE}
    assert unsafe_files(out) == [] and not any(p.suffix in {".bin", ".pt", ".pth", ".ckpt", ".pkl"} for p in out.iterdir())
    assert set(verify_checksums(out)) == names - {CHECKSUM_FILE}
    config = json.loads((out / "config.json").read_text())
    expected = load_pipeline_config(config_path).to_dict()
    expected["models"] = {k: v for k, v in expected["models"].items() if k not in CALLER_MODELS + MACHINE_MODELS}
    assert config["pipeline"] == expected and config["base_model"] == {"id": BUNDLED_LLM, "revision": None}
    assert config["module"]["lora_r"] == 2 and config["feature_dim"] == 384 and config["graph_tokens"] == 1
    assert config["training"]["sources"] == {"locomo-sample": 12}
    lora = json.loads((out / "adapter_config.json").read_text())
    assert lora["base_model_name_or_path"] == BUNDLED_LLM and lora["r"] == 2
    prompts = json.loads((out / "prompts.json").read_text())
    assert {"final_answer", "memory_unit_extraction", "query_intent"} <= set(prompts["templates"])
    card = (out / "README.md").read_text()
    assert "CC BY-NC 4.0" in card and "Apache-2.0" in card and "license: cc-by-nc-4.0" in card and 'from_pretrained("me/qgmem")' in card


def test_an_export_holds_no_machine_details(trained) -> None:
    _, checkpoint, _, out = trained
    config = json.loads((out / "config.json").read_text())
    assert not set(CALLER_MODELS + MACHINE_MODELS) & set(config["pipeline"]["models"])
    assert not {"cache_dir", "trust_remote_code"} & set(config["module"])
    assert config["training"]["data"] == FIXTURE.name
    for name in ("config.json", "README.md", "adapter_config.json"):
        text = (out / name).read_text()
        for detail in ("10.20.30.40", "INTERNAL_VLLM_KEY", str(REPO), str(checkpoint.parents[1])):
            assert detail not in text, f"{name} holds {detail}"


def test_replacing_an_export_always_leaves_a_complete_one_on_disk(trained, tmp_path, monkeypatch) -> None:
    """Every rename during a re-export finds the target complete, and every exported file and folder is fsync'd."""
    _, checkpoint, config, out = trained
    target = _copy(out, tmp_path / "model")
    metrics = tmp_path / "metrics.json"
    metrics.write_text(json.dumps({"recall@10": 0.25}))
    seen: list[str] = []
    synced: set[tuple[int, int]] = set()
    real_replace, real_rename, real_fsync = os.replace, os.rename, os.fsync

    def check_target() -> None:
        try:
            verify_checksums(target)
            seen.append("complete")
        except InputError as exc:
            seen.append(str(exc))

    def replace(src, dst, **kwargs) -> None:
        real_replace(src, dst, **kwargs)
        check_target()

    def rename(src, dst, **kwargs) -> None:
        real_rename(src, dst, **kwargs)
        check_target()

    def fsync(fd: int) -> None:
        stat = os.fstat(fd)
        synced.add((stat.st_dev, stat.st_ino))
        real_fsync(fd)

    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "rename", rename)
    monkeypatch.setattr(os, "fsync", fsync)
    export_model(checkpoint, config, target, eval_report=metrics)
    monkeypatch.undo()
    assert seen and set(seen) == {"complete"}, [s for s in seen if s != "complete"]
    assert "| recall@10 | 0.2500 |" in (target / "README.md").read_text() and set(verify_checksums(target)) == set(verify_checksums(out))
    on_disk = [target, target.parent, *target.iterdir()]
    assert all((os.stat(p).st_dev, os.stat(p).st_ino) in synced for p in on_disk), [p.name for p in on_disk if (os.stat(p).st_dev, os.stat(p).st_ino) not in synced]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json", "model"]


ADD_SESSION = """
from qgmem_train.predictor import QGMemPredictor
predictor = QGMemPredictor.from_pretrained({model!r}, intent="rules")
with predictor.memory("chat", {store!r}) as memory:
    print(memory.add_session({session!r}, time="2023-05-08", session_id="S1").units)
"""


@pytest.mark.slow
def test_round_trip_over_a_memory_written_by_another_process(trained, tmp_path) -> None:
    """A process adds a session and exits; here the model in memory and the loaded export answer alike from it."""
    model, _, config_path, out = trained
    store = tmp_path / "store"
    code = textwrap.dedent(ADD_SESSION).format(model=str(out), store=str(store), session=SESSION)
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and run.stdout.split()[-1] == str(len(SESSION)), run.stderr[-2000:]

    in_memory = QGMemPredictor.from_module(model, load_pipeline_config(config_path), intent="rules")
    with in_memory.memory("chat", store) as memory:
        expected = memory.ask(QUESTION)
    loaded = QGMemPredictor.from_pretrained(out, intent="rules", device="cpu")
    reference, restored = trainable_state_dict(model), trainable_state_dict(loaded.model)
    assert reference.keys() == restored.keys() and all(torch.equal(reference[k], restored[k]) for k in reference)
    assert any("lora_B" in k and reference[k].abs().sum() > 0 for k in reference)
    with loaded.memory("chat", store) as memory:
        got = memory.ask(QUESTION)
    assert got.generated == expected.generated and got.answer == expected.answer and got.tokens == expected.tokens
    assert [u.id for u in got.units] == [u.id for u in expected.units] and [u.cited for u in got.units] == [u.cited for u in expected.units]
    assert got.path == "graph" and got.tokens["prompt"] > got.tokens["context"] > 0
    assert {"memory", "embed", "rerank", "serialize", "graph", "generate", "total"} <= set(got.seconds)
    assert {u.id for u in got.units} == {"S1:1", "S1:2", "S1:3"}
    paint = got.units[0]
    assert paint.id == "S1:2" and paint.source_turns[0].text == SESSION[1]["text"] and paint.source_turns[0].time == "2023-05-08"


@pytest.mark.slow
def test_an_api_backbone_answers_on_the_text_path(trained, smollm2, tmp_path) -> None:
    from tests.openai_server import OpenAICompatibleServer

    with OpenAICompatibleServer(smollm2, model_name=BUNDLED_LLM) as server:
        predictor = QGMemPredictor.from_pretrained(trained[3], models={"backend": "openai", "base_url": server.base_url, "max_retries": 0}, intent="rules")
        with predictor.memory("chat", tmp_path / "store") as memory:
            memory.add_session(SESSION, time="2023-05-08", session_id="S1")
            result = memory.ask(QUESTION)
    assert predictor.model is None and result.path == "text"
    assert result.units[0].id == "S1:2" and result.tokens["prompt"] > result.tokens["context"] > 0 and "generate" in result.seconds


def test_a_tampered_or_incomplete_export_is_refused(trained, tmp_path) -> None:
    out = trained[3]
    for name in ("graph_adapter.safetensors", "adapter_model.safetensors", "config.json"):
        copy = _copy(out, tmp_path / name)
        raw = bytearray((copy / name).read_bytes())
        raw[len(raw) // 2] ^= 0x01
        (copy / name).write_bytes(bytes(raw))
        with pytest.raises(InputError, match=f"{name}: SHA-256 differs"):
            QGMemPredictor.from_pretrained(copy)
    unlisted = _copy(out, tmp_path / "unlisted")
    (unlisted / CHECKSUM_FILE).unlink()
    with pytest.raises(InputError, match="checksum file missing"):
        QGMemPredictor.from_pretrained(unlisted)


def test_an_adapter_for_other_settings_is_refused_even_with_fresh_checksums(trained, tmp_path) -> None:
    changed = _copy(trained[3], tmp_path / "changed")
    config = json.loads((changed / "config.json").read_text())
    config["module"]["gnn_hidden"] = 16
    (changed / "config.json").write_text(json.dumps(config))
    write_checksums(changed)
    with pytest.raises(InputError, match="graph_adapter.safetensors: encoder.*, but config.json's module settings make it"):
        QGMemPredictor.from_pretrained(changed)  # refused on the meta device, before any parameter is allocated


def _forbid_network(monkeypatch) -> None:
    import huggingface_hub

    def refuse(*args, **kwargs):
        raise AssertionError("the Hub client was called")

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", refuse)
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", refuse)


def test_push_in_offline_mode_stops_after_the_folder_with_one_line(trained, tmp_path, monkeypatch, capsys) -> None:
    _, checkpoint, config, _ = trained
    _forbid_network(monkeypatch)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "offline"
    code = export_main(["--checkpoint", str(checkpoint), "--config", str(config), "--out", str(out), "--push", "me/qgmem"])
    captured = capsys.readouterr()
    assert code == 2 and (out / CHECKSUM_FILE).exists()
    last = captured.err.strip().splitlines()[-1]
    assert last.startswith("error: ") and "offline mode is on" in last and str(out) in last and "Traceback" not in captured.err


def test_push_without_a_token_or_network_fails_with_one_line(trained, monkeypatch) -> None:
    import huggingface_hub

    out = trained[3]
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    _forbid_network(monkeypatch)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    with pytest.raises(PushError, match="no Hugging Face token"):
        push_folder(out, "me/qgmem")
    secret = "hf_secret_test_token"
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: secret)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(PushError, match="failed to reach the Hub at http://127.0.0.1:9: ConnectError") as failure:
        push_folder(out, "me/qgmem", private=True)
    assert secret not in str(failure.value) and "\n" not in str(failure.value)


def test_bad_export_input_is_one_line_and_exit_code_2(trained, tmp_path, capsys) -> None:
    _, checkpoint, config, _ = trained
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({"pipeline": {**PIPELINE, "models": {**PIPELINE["models"], "embedder": "some/other-embedder"}}}))
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("not an export")
    cases = [
        (["--checkpoint", str(tmp_path / "missing.ckpt"), "--config", str(config)], "checkpoint not found"),
        (["--checkpoint", str(checkpoint), "--config", str(other)], "pipeline.models.embedder"),
        (["--checkpoint", str(checkpoint), "--config", str(config), "--push", "no-owner"], "--push"),
    ]
    for args, message in cases:
        assert export_main([*args, "--out", str(tmp_path / "never")]) == 2
        err = capsys.readouterr().err
        assert message in err.strip().splitlines()[-1] and "Traceback" not in err
    assert not (tmp_path / "never").exists()
    assert export_main(["--checkpoint", str(checkpoint), "--config", str(config), "--out", str(taken)]) == 2
    assert "is not a QGMem export" in capsys.readouterr().err and (taken / "notes.txt").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


class _WritesMarker:
    """Unpickling this object calls ``open(marker, "w")``: code that runs when the file is read with weights_only=False."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_pickled_checkpoint_that_runs_code_is_refused_without_running_it(trained, tmp_path, capsys) -> None:
    config = trained[2]
    marker = tmp_path / "marker"
    malicious = tmp_path / "last.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {}, "qgmem": _WritesMarker(marker)}, malicious)
    assert export_main(["--checkpoint", str(malicious), "--config", str(config), "--out", str(tmp_path / "never")]) == 2
    err = capsys.readouterr().err
    assert "weights_only=True" in err.strip().splitlines()[-1] and "Traceback" not in err
    assert not marker.exists() and not (tmp_path / "never").exists()
    torch.load(malicious, weights_only=False)  # the same file read unsafely does run its code: the case above is real
    assert marker.exists()


@pytest.fixture(scope="module")
def cross_encoder_dir(tmp_path_factory) -> Path:
    """A CrossEncoder folder as fit-reranker writes it: the bundled MiniLM with a fresh scoring head (seeded), trained on
    context documents."""
    from qgmem_train.reranker.module import load_cross_encoder, save_cross_encoder

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("reranker") / "model"
    save_cross_encoder(load_cross_encoder(BUNDLED_EMBEDDER, max_length=64), folder, "context")
    (folder / OUTPUT_MARKER).write_text("written by fit-reranker\n")
    return folder


def _fit_config(trained, tmp_path: Path, **models) -> Path:
    config = tmp_path / "fit.yaml"
    config.write_text(yaml.safe_dump({"pipeline": {**PIPELINE, "models": {**PIPELINE["models"], **models}}}))
    return config


def test_export_bundles_a_local_cross_encoder_and_the_predictor_reranks_with_it(trained, cross_encoder_dir, tmp_path) -> None:
    """The trained reranker travels inside the export (flat, checksummed files) and scores as the original folder does."""
    from qgmem_train.retrieval.rerank import CrossEncoderReranker

    config = _fit_config(trained, tmp_path, reranker="cross", reranker_model=str(cross_encoder_dir))
    out = export_model(trained[1], config, tmp_path / "model")
    bundled = sorted(p.name for p in out.iterdir() if p.name.startswith("reranker."))
    assert "reranker.model.safetensors" in bundled and "reranker.config.json" in bundled and unsafe_files(out) == []
    assert set(bundled) <= set(verify_checksums(out))
    exported = json.loads((out / "config.json").read_text())
    assert exported["reranker"]["kind"] == "cross" and exported["reranker"]["bundled"] is True
    assert str(cross_encoder_dir) not in (out / "config.json").read_text() and str(tmp_path) not in (out / "README.md").read_text()

    predictor = QGMemPredictor.from_pretrained(out, intent="rules", device="cpu")
    assert isinstance(predictor.reranker, CrossEncoderReranker) and predictor.reranker.document_layout == "context"
    pairs = [(QUESTION, "Fact: Melanie painted a sunrise over the lake."), (QUESTION, "Fact: Caroline went to a support group.")]
    original = CrossEncoderReranker(str(cross_encoder_dir), device="cpu")
    assert np.allclose(predictor.reranker.cross_encoder.predict(pairs), original.cross_encoder.predict(pairs), atol=1e-5)


def test_a_reranker_folder_not_built_yet_exports_without_a_reranker_and_says_so(trained, tmp_path, caplog) -> None:
    """The warning names the make target that builds that folder, as every other step's warning does (the demo's: reranker-small)."""
    config = _fit_config(trained, tmp_path, reranker="cross", reranker_model=str(tmp_path / "reranker-cpu-small" / "model"))
    out = export_model(trained[1], config, tmp_path / "model")
    exported = json.loads((out / "config.json").read_text())
    assert exported["reranker"] == {"kind": "none", "model": None, "bundled": False}
    assert exported["pipeline"]["models"]["reranker"] == "none" and exported["pipeline"]["models"]["reranker_model"] is None
    assert not any(p.name.startswith("reranker.") for p in out.iterdir())
    assert any("reranker-cpu-small" in r.getMessage() and "`make reranker-small`" in r.getMessage() and "no reranker" in r.getMessage()
               for r in caplog.records)


def test_an_export_whose_bundled_reranker_files_are_missing_is_refused(trained, cross_encoder_dir, tmp_path) -> None:
    config = _fit_config(trained, tmp_path, reranker="cross", reranker_model=str(cross_encoder_dir))
    out = export_model(trained[1], config, tmp_path / "model")
    (out / "reranker.model.safetensors").unlink()
    sums = [line for line in (out / CHECKSUM_FILE).read_text().splitlines() if not line.endswith("reranker.model.safetensors")]
    (out / CHECKSUM_FILE).write_text("\n".join(sums) + "\n")
    with pytest.raises(InputError, match="reranker.model.safetensors"):
        QGMemPredictor.from_pretrained(out, intent="rules", device="cpu")


@pytest.mark.slow
def test_a_model_cache_without_the_converted_llm_converts_it_before_the_size_check(trained, tmp_path, monkeypatch) -> None:
    """The bundled SmolLM2 is converted into the cache before the module's sizes are checked on the meta device, where a
    conversion cannot run (a group-writable entry is converted again by the same path)."""
    cache = tmp_path / "fresh-cache"
    monkeypatch.setenv("QGMEM_CACHE", str(cache))
    QGMemPredictor.from_pretrained(trained[3], intent="rules", device="cpu")
    [entry] = (cache / "converted").iterdir()
    assert (entry / "config.json").is_file() and not entry.stat().st_mode & 0o022


def test_the_model_card_shows_no_input_file_or_store_of_the_machine_the_evaluation_ran_on(tmp_path) -> None:
    report = tmp_path / "metrics.json"
    report.write_text(json.dumps({"recall@10": 0.25, "dataset": "locomo", "input": "/home/alice/private/locomo10.json", "store": "/home/alice/stores/s"}))
    assert read_eval_report(report) == {"recall@10": 0.25, "dataset": "locomo"}
