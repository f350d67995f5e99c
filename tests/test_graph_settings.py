"""The ``graph.*`` settings travel with a fit: config → data module → checkpoint → export → predictor; a checkpoint whose
graph settings differ from the config it meets is refused in one line, as one of other models is."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml

from export.__main__ import main as export_main
from qgmem_train.config import BUNDLED_EMBEDDER, GraphConfig
from qgmem_train.errors import InputError
from qgmem_train.model.datamodule import TrajectoryDataModule
from qgmem_train.model.module import GraphAugmentedLM
from tests.tiny_decoder import FIXTURE, fit_to_last_checkpoint, fixture_corpus, publish_to_hub_cache, save_tiny_decoder, tiny_module_kwargs

SETTINGS = {"attribute_edges": True, "time_edges": True, "object": "turn", "object_words": 30, "attribute_cap": 2}
"""Every ``graph.*`` switch away from its default."""
DEMO = Path(__file__).resolve().parents[1] / "configs" / "demo-cpu.yaml"


def test_the_settings_above_move_every_graph_switch_off_its_default() -> None:
    defaults = dataclasses.asdict(GraphConfig())
    assert set(SETTINGS) == set(defaults), "a new graph.* switch needs a value here, so it is carried end to end below"
    assert all(SETTINGS[name] != defaults[name] for name in SETTINGS)


def test_the_fit_config_gives_the_data_module_its_graph_settings() -> None:
    from tests.test_configs import _parse

    config = _parse("fit", "--config", str(DEMO), *(f"--pipeline.graph.{name}={value}" for name, value in SETTINGS.items()))
    assert config.data.graph == SETTINGS
    assert _parse("fit", "--config", str(DEMO)).data.graph == dataclasses.asdict(GraphConfig())


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """(last.ckpt of one step over the tiny decoder with data built under :data:`SETTINGS`, the decoder, its public name)."""
    root = tmp_path_factory.mktemp("graph-settings")
    llm_dir = save_tiny_decoder(root / "tiny", fixture_corpus())
    L.seed_everything(0)
    data = TrajectoryDataModule(str(FIXTURE), batch_size=1, max_examples=1, graph=SETTINGS)
    model = GraphAugmentedLM(**tiny_module_kwargs(llm_dir, data.feature_dim))
    return fit_to_last_checkpoint(model, data, root, steps=1), llm_dir, publish_to_hub_cache(llm_dir)


def fit_config(folder: Path, llm: str, graph: dict) -> Path:
    config = folder / "fit.yaml"
    models = {"llm": llm, "embedder": BUNDLED_EMBEDDER, "reranker": "none", "dtype": "float32", "device": "cpu"}
    config.write_text(yaml.safe_dump({"pipeline": {"models": models, "construction": {"units": "turns", "traces": False}, "graph": graph}}))
    return config


def test_each_graph_switch_goes_from_the_checkpoint_through_the_export_to_the_predictor(fitted, tmp_path) -> None:
    from qgmem_train.predictor import QGMemPredictor

    checkpoint, llm_dir, public = fitted
    assert torch.load(checkpoint, weights_only=True, map_location="cpu")["datamodule_hyper_parameters"]["graph"] == SETTINGS
    out = tmp_path / "model"
    code = export_main(["--checkpoint", str(checkpoint), "--config", str(fit_config(tmp_path, str(llm_dir), SETTINGS)), "--out", str(out),
                        "--llm-id", public])  # fmt: skip
    assert code == 0
    assert json.loads((out / "config.json").read_text())["pipeline"]["graph"] == SETTINGS
    predictor = QGMemPredictor.from_pretrained(out, device="cpu", intent="rules")
    assert dataclasses.asdict(predictor.pipeline.graph) == SETTINGS


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_an_export_config_with_another_graph_setting_is_refused_in_one_line(fitted, tmp_path, capsys, name: str) -> None:
    checkpoint, llm_dir, public = fitted
    other = {**SETTINGS, name: dataclasses.asdict(GraphConfig())[name]}
    config = fit_config(tmp_path, str(llm_dir), other)
    code = export_main(["--checkpoint", str(checkpoint), "--config", str(config), "--out", str(tmp_path / "model"), "--llm-id", public])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert f"pipeline.graph.{name}" in err and repr(SETTINGS[name]) in err and not (tmp_path / "model").exists()


def test_a_fit_resumed_under_other_graph_settings_is_refused_in_one_line(fitted, tmp_path) -> None:
    checkpoint, llm_dir, _ = fitted
    data = TrajectoryDataModule(str(FIXTURE), batch_size=1, max_examples=1, graph={**SETTINGS, "object": "gist"})
    model = GraphAugmentedLM(**tiny_module_kwargs(llm_dir, data.feature_dim))
    trainer = L.Trainer(accelerator="cpu", max_steps=2, limit_val_batches=0, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path)  # fmt: skip
    with pytest.raises(InputError, match=r"graph\.object.*'turn'") as refused:
        trainer.fit(model, datamodule=data, ckpt_path=str(checkpoint))
    assert "\n" not in str(refused.value)


def test_trajectories_record_the_graph_settings_they_were_built_with_and_a_fit_under_others_is_refused(tmp_path) -> None:
    from qgmem_train.trajectory import read_trajectory_dataset, trajectory_graph_settings, write_trajectory_dataset

    examples = read_trajectory_dataset(FIXTURE)
    folder = write_trajectory_dataset(examples, tmp_path / "dataset", graph=SETTINGS)
    assert trajectory_graph_settings(folder) == SETTINGS
    TrajectoryDataModule(str(folder), batch_size=1, max_examples=1, graph=SETTINGS).setup("fit")
    other = {**SETTINGS, "object": "gist"}
    with pytest.raises(InputError, match=r"pipeline\.graph\.object: is 'gist' but the trajectories .* were built with 'turn'"):
        TrajectoryDataModule(str(folder), batch_size=1, max_examples=1, graph=other).setup("fit")
    assert trajectory_graph_settings(FIXTURE) is None  # a folder from before the record: nothing to compare
    TrajectoryDataModule(str(FIXTURE), batch_size=1, max_examples=1, graph=other).setup("fit")
