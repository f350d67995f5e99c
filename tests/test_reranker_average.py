"""``average-rerankers``: the mean of trained rerankers' weights, in a folder that loads and scores alone, or one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qgmem_train.__main__ import main

RECORD = {"train_conversations": ["conv-a"], "val_conversations": ["conv-b"], "document_layout": "compact", "input_sha256": "0123",
          "store": "out/store", "steps": 3}  # fmt: skip


def trained_folder(path: Path, seed: int, layers: int = 1, **record: object) -> Path:
    """A one-layer reranker whose head (seeded) and first attention layer differ by seed, with its training record."""
    import torch

    from qgmem_train.reranker.module import CrossEncoderModule

    torch.manual_seed(seed)
    module = CrossEncoderModule(num_layers=layers, max_length=32)
    with torch.no_grad():
        module.cross_encoder.model.base_model.encoder.layer[0].attention.self.query.weight.add_(torch.randn(1) * 0.01)
    module.save(path, "compact")
    (path / "training.json").write_text(json.dumps({**RECORD, "seed": seed, "seconds": 10.0 + seed, **record}))
    return path


def test_averaged_folder_holds_the_mean_of_every_weight_records_its_sources_and_scores_alone(tmp_path: Path) -> None:
    from safetensors.torch import load_file
    from sentence_transformers import CrossEncoder

    first, second = trained_folder(tmp_path / "seed0", 0), trained_folder(tmp_path / "seed1", 1)
    out = tmp_path / "soup" / "model"
    assert main(["average-rerankers", str(first), str(second), "--out", str(out)]) == 0

    a, b, mean = (load_file(f / "model.safetensors") for f in (first, second, out))
    assert mean.keys() == a.keys()
    moved = [k for k in a if a[k].is_floating_point() and not a[k].equal(b[k])]
    assert any("classifier" in k for k in moved) and any("query" in k for k in moved), moved
    for key in a:
        expected = (a[key] + b[key]) / 2 if a[key].is_floating_point() else a[key]
        assert mean[key].allclose(expected, atol=1e-7), key
    record = json.loads((out / "training.json").read_text())
    assert record["seed"] == [0, 1] and record["seconds"] == 21.0 and record["train_conversations"] == ["conv-a"]
    assert [s["folder"] for s in record["averaged_from"]] == [str(first), str(second)]
    assert json.loads((out / "config.json").read_text())["qgmem_document_layout"] == "compact"
    assert CrossEncoder(str(out), device="cpu").predict([("What did Melanie paint?", "Melanie: I painted a sunrise.")]).shape == (1,)
    assert [p.name for p in out.parent.iterdir()] == ["model"], "no staging folder is left behind"


@pytest.mark.parametrize(
    ("second", "message"),
    [
        ({"val_conversations": ["conv-c"]}, "val_conversations differ from"),
        ({"document_layout": "fields"}, "document_layout differ from"),
        ({"layers": 2}, "num_hidden_layers differ from"),
    ],
)
def test_models_of_other_data_or_architecture_are_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], second: dict, message: str
) -> None:
    first = trained_folder(tmp_path / "seed0", 0)
    other = trained_folder(tmp_path / "seed1", 1, **second)
    out = tmp_path / "soup"
    assert main(["average-rerankers", str(first), str(other), "--out", str(out)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and error.startswith(f"error: {other}") and message in error, error
    assert not out.exists()


def test_one_folder_or_a_folder_without_weights_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first = trained_folder(tmp_path / "seed0", 0)
    assert main(["average-rerankers", str(first), "--out", str(tmp_path / "soup")]) == 2
    assert "name two or more trained folders" in capsys.readouterr().err
    assert main(["average-rerankers", str(first), str(tmp_path), "--out", str(tmp_path / "soup")]) == 2
    assert f"error: {tmp_path}: no model.safetensors" in capsys.readouterr().err
