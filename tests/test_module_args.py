"""The module's settings in groups: the CLI lists them by group, old flat keys are refused in one line, and a checkpoint
written with flat hyperparameters (``tests/data/legacy_flat_hparams.ckpt``) still parses, loads and exports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from qgmem_train.__main__ import main
from qgmem_train.lightning_cli import QGMemCLI
from qgmem_train.model.datamodule import TrajectoryDataModule
from qgmem_train.model.module import GraphAugmentedLM

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "configs" / "demo-cpu.yaml"
LEGACY = REPO / "tests" / "data" / "legacy_flat_hparams.ckpt"
"""One fit step of the code before the grouping: flat hyperparameters (gnn_hidden 8, graph_tokens 2, projector_hidden 8)."""


class _ParseOnly(QGMemCLI):
    """Parses like the real CLI (the checkpoint's hyperparameters included), instantiates and runs nothing."""

    def instantiate_classes(self) -> None:
        pass

    def _run_subcommand(self, subcommand: str) -> None:
        pass


def _run(capsys, *args: str) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of the command in this process."""
    try:
        code = main(list(args))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_fit_help_lists_the_module_settings_by_group(capsys) -> None:
    code, out, _ = _run(capsys, "fit", "--help")
    assert code == 0
    for option in (
        "--model.encoder.hidden_dim", "--model.encoder.layers", "--model.readout.tokens", "--model.readout.kind",
        "--model.projector.hidden_dim", "--model.projector.center", "--model.lora.r", "--model.optim.learning_rate",
        "--model.optim.contrast", "--model.prompt.max_context_tokens", "--model.generation.max_new_tokens",
        "--model.diagnostics.shuffle_gap",
    ):  # fmt: skip
        assert option in out, option
    assert "--model.gnn_hidden" not in out and "--model.learning_rate" not in out
    titles = [line for line in out.splitlines() if line.endswith(":") and "--model." not in line]
    assert any("graph encoder" in t.lower() for t in titles) and any("optimi" in t.lower() for t in titles), titles


@pytest.mark.parametrize(
    ("flag", "new"), [("--model.gnn_hidden", "--model.encoder.hidden_dim"), ("--model.graph_tokens=0", "--model.readout.tokens")]
)
def test_a_flat_flag_is_refused_in_one_line_naming_the_new_one(capsys, flag: str, new: str) -> None:
    code, _, err = _run(capsys, "fit", "--config", str(DEMO), *([flag, "64"] if "=" not in flag else [flag]), "--print_config")
    assert code == 2
    assert err.strip().count("\n") == 0 and new in err, err


def test_a_config_with_a_flat_key_is_refused_in_one_line_naming_the_new_key(capsys, tmp_path) -> None:
    old = tmp_path / "old.yaml"
    old.write_text(yaml.safe_dump({"model": {"gnn_hidden": 64, "learning_rate": 0.001}}))
    code, _, err = _run(capsys, "fit", "--config", str(DEMO), "--config", str(old), "--print_config")
    assert code == 2
    assert err.strip().count("\n") == 0, err
    assert str(old) in err and "model.gnn_hidden" in err and "model.encoder.hidden_dim" in err


def test_a_checkpoint_with_flat_hyperparameters_gives_the_cli_its_grouped_settings() -> None:
    cli = _ParseOnly(GraphAugmentedLM, TrajectoryDataModule, args=["validate", "--config", str(DEMO), "--ckpt_path", str(LEGACY)])
    model = cli.config["validate"].model
    assert model.encoder.hidden_dim == 8 and model.encoder.layers == 1 and model.readout.tokens == 2
    assert model.projector.hidden_dim == 8 and model.optim.learning_rate == 0.01 and model.diagnostics.shuffle_gap is False


def test_a_checkpoint_with_flat_hyperparameters_loads_with_its_parameters() -> None:
    saved = torch.load(LEGACY, weights_only=True)
    model = GraphAugmentedLM.load_from_checkpoint(LEGACY, map_location="cpu")
    assert model.encoder_args.hidden_dim == 8 and model.readout_args.tokens == 2 and model.generation_args.val_generate is False
    state = model.state_dict()
    for name, value in saved["state_dict"].items():
        assert torch.equal(state[name], value), name
    assert model.checkpoint_metadata()["config_hash"] == saved["qgmem"]["config_hash"]


@pytest.mark.slow
def test_a_checkpoint_with_flat_hyperparameters_exports_and_loads(tmp_path) -> None:
    from export.package import export_model
    from qgmem_train.predictor.artifact import read_export
    from qgmem_train.predictor.loading import load_exported_module

    config = tmp_path / "fit.yaml"
    config.write_text(yaml.safe_dump({"pipeline": {"models": {"dtype": "float32", "reranker": "none"}}}))
    out = export_model(LEGACY, config, tmp_path / "export")
    module = json.loads((out / "config.json").read_text())["module"]
    assert module["gnn_hidden"] == 8 and module["graph_tokens"] == 2, "an export keeps its flat module record"
    model = load_exported_module(read_export(out), device="cpu")
    assert model.encoder_args.hidden_dim == 8 and model.readout_args.tokens == 2
    saved = torch.load(LEGACY, weights_only=True)["state_dict"]
    assert all(torch.equal(model.state_dict()[name], value) for name, value in saved.items())
