"""The LoRA adapter of an export is written from the checkpoint's trainable state alone, in peft's format.

Exporting an 8B LoRA run must not load the 16 GB backbone on the CPU: the loaders are patched to fail, the export
still writes ``adapter_model.safetensors`` and ``adapter_config.json`` with exactly the keys, tensors and settings
peft's ``save_pretrained`` gives for the trained model, and the predictor loads the result.
"""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml
from peft import get_peft_model_state_dict
from safetensors.torch import load_file

from export.package import export_model
from qgmem_train.config import BUNDLED_EMBEDDER
from qgmem_train.llm import resolver
from qgmem_train.model import module as module_file
from qgmem_train.model.checkpoint import trainable_state_dict
from qgmem_train.model.datamodule import TrajectoryDataModule
from qgmem_train.model.module import GraphAugmentedLM
from qgmem_train.predictor import QGMemPredictor
from tests.tiny_decoder import FIXTURE, fit_to_last_checkpoint, fixture_corpus, publish_to_hub_cache, save_tiny_decoder, tiny_module_kwargs


class BackboneLoaded(AssertionError):
    """The export loaded the backbone."""


def refuse(*args: object, **kwargs: object) -> None:
    raise BackboneLoaded("the export loaded the backbone")


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[GraphAugmentedLM, Path, Path]:
    """(trained module, last.ckpt, fit YAML) after two LoRA + adapter steps over the tiny decoder."""
    root = tmp_path_factory.mktemp("lora")
    llm_dir = save_tiny_decoder(root / "tiny", fixture_corpus())
    L.seed_everything(0)
    data = TrajectoryDataModule(str(FIXTURE), batch_size=1, max_examples=2)
    data.setup("fit")
    model = GraphAugmentedLM(**tiny_module_kwargs(llm_dir, data.feature_dim, lora={"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj", "o_proj"]}))
    checkpoint = fit_to_last_checkpoint(model, data, root, steps=2)
    config = root / "fit.yaml"
    models = {"llm": str(llm_dir), "embedder": BUNDLED_EMBEDDER, "reranker": "none", "dtype": "float32", "device": "cpu"}
    config.write_text(yaml.safe_dump({"pipeline": {"models": models, "construction": {"units": "turns", "traces": False}}}))
    return model.eval(), checkpoint, config


def test_lora_export_loads_no_backbone_and_matches_peft(trained, tmp_path, monkeypatch) -> None:
    model, checkpoint, config = trained
    monkeypatch.setattr(module_file, "_load_frozen_llm", refuse)
    monkeypatch.setattr(resolver, "load_causal_lm", refuse)
    public = publish_to_hub_cache(Path(model.hparams.llm))  # an export names its base model by a public name
    out = export_model(checkpoint, config, tmp_path / "model", names={"llm": public})
    monkeypatch.undo()

    reference = get_peft_model_state_dict(model.llm)
    written = load_file(str(out / "adapter_model.safetensors"))
    assert written.keys() == reference.keys() and len(written) == 2 * 3 * 2, sorted(written)[:4]
    assert all(torch.equal(written[k], reference[k]) for k in reference)
    assert any("lora_B" in k and written[k].abs().sum() > 0 for k in written), "the LoRA B tensors trained"

    adapter = json.loads((out / "adapter_config.json").read_text())
    expected = model.llm.peft_config["default"].to_dict()
    for key in ("peft_type", "task_type", "r", "lora_alpha", "lora_dropout", "bias", "fan_in_fan_out", "init_lora_weights", "use_rslora", "use_dora"):
        assert adapter[key] == (expected[key].value if hasattr(expected[key], "value") else expected[key]), key
    assert set(adapter["target_modules"]) == {"q_proj", "v_proj", "o_proj"} and adapter["inference_mode"] is True
    assert adapter["base_model_name_or_path"] == public and adapter["revision"] is None

    loaded = QGMemPredictor.from_pretrained(out, device="cpu", intent="rules").model
    restored, original = trainable_state_dict(loaded), trainable_state_dict(model)
    assert restored.keys() == original.keys() and all(torch.equal(restored[k], original[k]) for k in original)
