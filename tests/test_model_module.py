"""The LightningModule: what trains, what stays frozen, checkpoints of trainable parameters, resume."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from qgmem_train.errors import InputError
from qgmem_train.graph.readout import GraphTokens
from qgmem_train.model.checkpoint import METADATA_KEY, load_adapter, save_adapter, trainable_state_dict
from qgmem_train.model.datamodule import TrajectoryDataModule
from qgmem_train.model.module import GraphAugmentedLM
from tests.tiny_decoder import FIXTURE, tiny_module_kwargs


def _module(llm_dir, data, **overrides) -> GraphAugmentedLM:
    torch.manual_seed(0)
    model = GraphAugmentedLM(**tiny_module_kwargs(llm_dir, data.feature_dim, **overrides))
    model.load_backbone()
    return model


def _grads(model: GraphAugmentedLM, data: TrajectoryDataModule) -> set[str]:
    model.train()
    model.example_losses(data.collate(data.splits["train"][:2])).mean().backward()
    return {name.split(".")[0] for name, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}


def test_gradients_reach_only_encoder_and_projector(llm_dir, data) -> None:
    model = _module(llm_dir, data)
    assert _grads(model, data) == {"encoder", "projector"}
    assert not model.llm.training and all(not m.training for m in model.llm.modules())
    assert not any(p.requires_grad for p in model.llm.parameters())
    assert model.encoder.training and model.projector.training


def test_the_papers_projector_without_layernorm_trains(llm_dir, data) -> None:
    """``projector_norm: false``, the paper's Eq. 7 projector: a few steps on one batch change its weights and lower its loss
    (a little: the tiny decoder's logits barely move, see ``tests/tiny_decoder.py``)."""
    model = _module(llm_dir, data, projector={"norm": False})
    assert not any(isinstance(m, torch.nn.LayerNorm) for m in model.projector.modules())
    assert _grads(model, data) == {"encoder", "projector"}
    before = {name: p.detach().clone() for name, p in model.projector.named_parameters()}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    batch = data.collate(data.splits["train"][:2])
    losses = []
    for _ in range(8):
        optimizer.zero_grad()
        loss = model.example_losses(batch).mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses == sorted(losses, reverse=True) and losses[-1] < losses[0], losses
    assert all(not torch.equal(p, before[name]) for name, p in model.projector.named_parameters())


def test_lora_adds_only_adapter_gradients(llm_dir, data) -> None:
    model = _module(llm_dir, data, lora={"r": 4})
    names = {n for n, p in model.named_parameters() if p.grad is None and p.requires_grad}
    assert names and all(("lora_" in n) or n.startswith(("encoder", "projector")) for n in names)
    _grads(model, data)
    with_grad = {n for n, p in model.llm.named_parameters() if p.grad is not None}
    assert with_grad and all("lora_" in n for n in with_grad)


def test_gradient_checkpointing_keeps_the_same_loss_and_gradients(llm_dir, data) -> None:
    plain, checkpointed = _module(llm_dir, data), _module(llm_dir, data, gradient_checkpointing=True)
    batch = data.collate(data.splits["train"][:2])
    losses = []
    for model in (plain, checkpointed):
        model.train()
        loss = model.example_losses(batch).mean()
        loss.backward()
        losses.append((loss.item(), model.projector.mlp[2].weight.grad.clone()))
    assert losses[0][0] == pytest.approx(losses[1][0], abs=1e-6)
    assert torch.allclose(losses[0][1], losses[1][1], atol=1e-6)


def test_no_graph_ablation_has_nothing_to_train_but_evaluates(llm_dir, data) -> None:
    model = _module(llm_dir, data, readout={"tokens": 0})
    assert model.encoder is None and model.graph_embeddings(data.collate(data.splits["train"][:1])["graph"]) is None
    assert model.example_losses(data.collate(data.splits["train"][:2])).shape == (2,)
    with pytest.raises(InputError, match="nothing to train"):
        model.configure_optimizers()


def test_quantization_needs_cuda(llm_dir, data) -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    with pytest.raises(InputError, match="needs CUDA"):
        _module(llm_dir, data, quantization="4bit")


class _Losses(Callback):
    def __init__(self) -> None:
        self.values: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.values.append(float(outputs["loss"]))


class _StopAt(Callback):
    """Stop the run after ``step`` optimizer steps, as a killed job would (its checkpoint saved every step)."""

    def __init__(self, step: int | None) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.step is not None and trainer.global_step >= self.step:
            trainer.should_stop = True


def _fit(llm_dir, data_path, root, max_steps: int, ckpt_path=None, stop_at: int | None = None, **model_overrides) -> tuple[list[float], GraphAugmentedLM]:
    L.seed_everything(0)
    data = TrajectoryDataModule(str(data_path), batch_size=4)
    data.setup("fit")
    model = _module(llm_dir, data, **model_overrides)
    losses = _Losses()
    trainer = L.Trainer(
        accelerator="cpu", max_steps=max_steps, limit_val_batches=0, logger=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=root,
        callbacks=[losses, _StopAt(stop_at), ModelCheckpoint(dirpath=root / "ckpt", save_last=True, every_n_train_steps=1)],
    )
    trainer.fit(model, datamodule=data, ckpt_path=ckpt_path)
    return losses.values, model


def test_checkpoint_holds_only_trainable_parameters_and_refuses_a_mismatch(llm_dir, data, tmp_path) -> None:
    _, model = _fit(llm_dir, FIXTURE, tmp_path, max_steps=1)
    checkpoint = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False)
    assert set(checkpoint["state_dict"]) == set(trainable_state_dict(model))
    assert all(k.startswith(("encoder.", "projector.")) for k in checkpoint["state_dict"])
    assert checkpoint[METADATA_KEY]["base_model"] == str(llm_dir)
    restored = _module(llm_dir, data, optim={"learning_rate": 0.5})
    restored.on_load_checkpoint(checkpoint)
    restored.load_state_dict(checkpoint["state_dict"], strict=False)
    assert all(torch.equal(v, trainable_state_dict(restored)[k]) for k, v in checkpoint["state_dict"].items())
    other = _module(llm_dir, data, readout={"tokens": 2})
    with pytest.raises(InputError, match="config_hash"):
        L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False).validate(other, datamodule=data, ckpt_path=tmp_path / "ckpt" / "last.ckpt")
    file = save_adapter(checkpoint["state_dict"], model.checkpoint_metadata(), tmp_path / "export")
    tensors, metadata = load_adapter(file)
    assert set(tensors) == set(checkpoint["state_dict"]) and metadata["config_hash"] == model.checkpoint_metadata()["config_hash"]


def test_stop_and_resume_continue_the_same_loss_curve(llm_dir, tmp_path) -> None:
    straight, _ = _fit(llm_dir, FIXTURE, tmp_path / "straight", max_steps=5)
    first, _ = _fit(llm_dir, FIXTURE, tmp_path / "resumed", max_steps=5, stop_at=3)
    second, _ = _fit(llm_dir, FIXTURE, tmp_path / "resumed", max_steps=5, ckpt_path="last")
    assert len(straight) == 5 and len(first) == 3 and len(second) == 2, "stopped mid-epoch (2 batches an epoch)"
    assert first + second == pytest.approx(straight, abs=1e-5)
    assert straight[-1] < straight[0]


@pytest.mark.parametrize("readout", ["mean", "edges"])
def test_training_loss_adds_the_hinge_on_own_against_another_questions_graph(llm_dir, data, readout) -> None:
    model = _module(llm_dir, data, readout={"kind": readout, "tokens": 3}, optim={"contrast": 0.5, "contrast_margin": 0.2}).train()
    batch = data.collate(data.splits["train"][:3])
    tokens = model.graph_embeddings(batch["graph"])
    own = model.example_losses(batch, tokens)
    rolled = GraphTokens(tokens.embeds.roll(1, 0), None if tokens.mask is None else tokens.mask.roll(1, 0))
    other = model.example_losses(batch, rolled)
    assert not torch.equal(own, other)
    expected = own.mean() + 0.5 * torch.relu(0.2 + own - other).mean()
    assert model.training_step(batch, 0).item() == pytest.approx(expected.item(), rel=1e-6)


def test_without_the_term_the_loss_is_the_target_loss(llm_dir, data) -> None:
    model = _module(llm_dir, data).train()
    batch = data.collate(data.splits["train"][:2])
    assert model.training_step(batch, 0).item() == pytest.approx(model.example_losses(batch).mean().item(), rel=1e-6)


def test_a_batch_of_one_has_no_other_graph_and_trains_on_its_target_loss_alone(llm_dir, data) -> None:
    model = _module(llm_dir, data, optim={"contrast": 1.0}).train()
    batch = data.collate(data.splits["train"][:1])
    assert model.training_step(batch, 0).item() == pytest.approx(model.example_losses(batch).mean().item(), rel=1e-6)


def test_the_term_reaches_the_graph_path(llm_dir, data) -> None:
    model = _module(llm_dir, data, optim={"contrast": 1.0, "contrast_margin": 10.0}).train()
    batch = data.collate(data.splits["train"][:2])
    plain = _module(llm_dir, data).train()
    model.training_step(batch, 0).backward()
    plain.training_step(batch, 0).backward()
    mine, theirs = next(model.encoder.parameters()).grad, next(plain.encoder.parameters()).grad
    assert mine is not None and not torch.allclose(mine, theirs)


@pytest.mark.parametrize("field,value", [("contrast", -0.1), ("contrast_margin", -1.0)])
def test_negative_settings_are_refused(llm_dir, data, field, value) -> None:
    with pytest.raises(InputError, match=f"model.optim.{field}"):
        GraphAugmentedLM(**tiny_module_kwargs(llm_dir, data.feature_dim, optim={field: value}))


def test_frozen_features_with_one_linear_projector_train_only_the_projector(llm_dir, data) -> None:
    """The alignment study's first arm: ``encoder.layers: 0`` (the embedder's node features pooled as they are),
    ``projector.hidden_dim: 0`` (one linear layer) and ``projector.norm: false`` (no LayerNorm)."""
    model = _module(llm_dir, data, encoder={"layers": 0}, projector={"hidden_dim": 0, "norm": False})
    assert not list(model.encoder.parameters())
    assert [type(m) for m in model.projector.mlp] == [torch.nn.Linear] and model.projector.mlp[0].in_features == data.feature_dim
    assert not any(isinstance(m, torch.nn.LayerNorm) for m in model.projector.modules())
    assert _grads(model, data) == {"projector"}
    assert set(trainable_state_dict(model)) == {"projector.mlp.0.weight", "projector.mlp.0.bias"}


@pytest.mark.parametrize("group,field", [("encoder", "layers"), ("projector", "hidden_dim")])
def test_negative_sizes_are_refused(llm_dir, data, group, field) -> None:
    with pytest.raises(InputError, match=f"model.{group}.{field}"):
        GraphAugmentedLM(**tiny_module_kwargs(llm_dir, data.feature_dim, **{group: {field: -1}}))
