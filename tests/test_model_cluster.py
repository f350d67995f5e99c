"""What a first multi-GPU cluster run depends on, checked on CPU: per-rank devices, NCCL-safe logged values,
gradient checkpointing under ``Trainer.fit``, a schedule that completes, refused sharding, graph-token
scale and slot, and a backbone fingerprint that refuses another tokenizer or chat template."""

from __future__ import annotations

import json
import math
import shutil
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies import FSDPStrategy

from qgmem_train.answer.prompt import final_answer_chat
from qgmem_train.errors import InputError
from qgmem_train.llm.base import render_chat
from qgmem_train.llm.resolver import pick_device
from qgmem_train.model import module as module_file
from qgmem_train.model.datamodule import TrajectoryDataModule
from qgmem_train.model.fusion import chat_prompt_ids
from qgmem_train.model.module import GraphAugmentedLM
from qgmem_train.graph.local_graph import LocalGraph
from tests.test_configs import CONFIGS, _parse
from tests.tiny_decoder import FIXTURE, bundled_tokenizer, fixture_corpus, official_chat, save_tiny_decoder, tiny_module_kwargs, tiny_tokenizer


@pytest.fixture(scope="module")
def data() -> TrajectoryDataModule:
    module = TrajectoryDataModule(str(FIXTURE), batch_size=2, shuffle=False)
    module.setup("fit")
    return module


def _module(llm_dir: Path, data: TrajectoryDataModule, **overrides: object) -> GraphAugmentedLM:
    torch.manual_seed(0)
    return GraphAugmentedLM(**tiny_module_kwargs(llm_dir, data.feature_dim, **overrides))


class _LoadedOn(Exception):
    """Raised by the stand-in loader with the device it was asked for."""


def _record_device(monkeypatch: pytest.MonkeyPatch, visible_gpus: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: visible_gpus)

    def load(*args: object) -> None:
        raise _LoadedOn(args[-1])

    monkeypatch.setattr(module_file, "_load_frozen_llm", load)


def test_srun_ranks_each_load_their_own_gpu(llm_dir, data, monkeypatch) -> None:
    model = _module(llm_dir, data)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setenv("SLURM_PROCID", "9")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    _record_device(monkeypatch, visible_gpus=8)
    assert pick_device("auto") == "cuda:1" and pick_device("cuda") == "cuda:1"
    with pytest.raises(_LoadedOn, match="^cuda:1$"):
        model.configure_model()
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert pick_device("auto") == "cuda:3", "torchrun and Lightning's launcher set LOCAL_RANK, which wins"


def test_under_a_trainer_the_backbone_goes_to_the_strategys_device(llm_dir, data, monkeypatch) -> None:
    model = _module(llm_dir, data)
    _record_device(monkeypatch, visible_gpus=8)
    model._trainer = SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device("cuda", 5)), ckpt_path=None)
    with pytest.raises(_LoadedOn, match="^cuda:5$"):
        model.configure_model()


def test_sharded_strategies_are_refused_with_one_clear_error(llm_dir, data) -> None:
    model = _module(llm_dir, data)
    model._trainer = SimpleNamespace(strategy=FSDPStrategy())
    with pytest.raises(InputError, match="trainer.strategy: FSDPStrategy is not supported.*quantization: 4bit"):
        model.configure_model()
    assert model.llm is None


def test_every_logged_value_lives_on_the_modules_device(llm_dir, data, monkeypatch) -> None:
    """NCCL all-reduces only CUDA tensors: a CPU tensor logged with sync_dist fails at the first validation."""
    model = _module(llm_dir, data)
    model._device = torch.device("meta")  # stands for cuda:N: anything made on the CPU shows up
    batch = data.collate(data.splits["validation"][:2])
    records = [{"valid_json": True, "exact_match": 1.0, "f1": 1.0, "bleu1": 1.0}, {"valid_json": False, "exact_match": 0.0, "f1": 0.5, "bleu1": 0.0}]
    monkeypatch.setattr(model, "graph_embeddings", lambda graph: None)
    meta_losses = (torch.ones(2, device="meta"), torch.ones(2, device="meta"))
    monkeypatch.setattr(model, "evaluation_losses", lambda batch, graph_embeds=None: meta_losses)
    monkeypatch.setattr(model, "predict_step", lambda batch, batch_idx: records)
    logged: dict[str, object] = {}
    monkeypatch.setattr(model, "log", lambda name, value, **kwargs: logged.__setitem__(name, value))
    model._evaluate(batch, "val")
    assert set(logged) == {"val/loss", "val/answer_loss", "val/json_valid", "val/exact_match", "val/f1", "val/bleu1"}
    for name, value in logged.items():
        assert value.device == model.device, f"{name} is on {value.device}"
    model._device = torch.device("cpu")
    model.__dict__.pop("_split_means")
    monkeypatch.setattr(model, "evaluation_losses", lambda batch, graph_embeds=None: (torch.ones(2), torch.ones(2)))
    model._evaluate(batch, "val")
    assert logged["val/json_valid"].compute() == 0.5 and logged["val/f1"].compute() == 0.75


class _LayerCalls(Callback):
    """Counts decoder-layer forward passes (at their first norm) and checks the backbone's dropout state during each step."""

    def __init__(self) -> None:
        self.calls = 0
        self.dropout_on: list[bool] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.dropout_on.append(any(m.training for m in pl_module.llm.modules() if isinstance(m, torch.nn.Dropout)))
        for layer in pl_module.llm.model.layers:  # the layer's first op: recompute runs forward, not hooks, and stops early
            layer.input_layernorm.register_forward_hook(lambda *args: setattr(self, "calls", self.calls + 1))


def _fit_once(llm_dir: Path, data: TrajectoryDataModule, root: Path, checkpointing: bool) -> tuple[int, int, list[bool]]:
    """Decoder-layer forward calls and bytes of tensors saved for backward outside checkpoints, over one step."""
    L.seed_everything(0)
    model = _module(llm_dir, data, gradient_checkpointing=checkpointing, generation={"val_generate": False})
    calls = _LayerCalls()
    saved = [0]

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved[0] += tensor.numel() * tensor.element_size()
        return tensor

    trainer = L.Trainer(
        accelerator="cpu", max_steps=1, limit_val_batches=0, logger=False, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False, default_root_dir=root, callbacks=[calls],
    )  # fmt: skip
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        trainer.fit(model, datamodule=data)
    return calls.calls, saved[0], calls.dropout_on


def test_gradient_checkpointing_recomputes_under_trainer_fit(llm_dir, data, tmp_path) -> None:
    plain_calls, plain_saved, plain_dropout = _fit_once(llm_dir, data, tmp_path / "plain", checkpointing=False)
    ckpt_calls, ckpt_saved, ckpt_dropout = _fit_once(llm_dir, data, tmp_path / "ckpt", checkpointing=True)
    layers = 2
    assert plain_calls == layers, "one forward per decoder layer without checkpointing"
    assert ckpt_calls == 2 * layers, "each checkpointed layer runs again in backward"
    assert ckpt_saved < 0.8 * plain_saved, f"activations kept for backward: {ckpt_saved} vs {plain_saved} bytes"
    assert plain_dropout == ckpt_dropout == [False], "the frozen backbone's dropout stays off"


def _optimizer_steps(examples: int, batch_size: int, devices: int, accumulate: int, epochs: int) -> int:
    """Optimizer steps Lightning takes: padded DistributedSampler batches, a step on each partial accumulation."""
    batches = math.ceil(math.ceil(examples / devices) / batch_size)
    return math.ceil(batches / accumulate) * epochs


@pytest.mark.parametrize("devices", [8, 16])
@pytest.mark.parametrize("name", ["qwen3-8b.yaml", "llama31-8b.yaml"])
def test_schedule_of_the_cluster_configs_peaks_and_decays(llm_dir, data, name: str, devices: int) -> None:
    config = _parse("fit", "--config", str(next(p for p in CONFIGS if p.name == name)))
    total = _optimizer_steps(1300, config.data.batch_size, devices, config.trainer.accumulate_grad_batches, config.trainer.max_epochs)
    assert total >= 50, f"{total} optimizer steps is too few to train anything"
    schedule = {key: config.model.optim[key] for key in ("learning_rate", "warmup_fraction", "min_lr_ratio")}
    model = _module(llm_dir, data, optim=schedule)
    model._trainer = SimpleNamespace(estimated_stepping_batches=total)
    setup = model.configure_optimizers()
    optimizer, scheduler = setup["optimizer"], setup["lr_scheduler"]["scheduler"]
    rates = []
    for _ in range(total):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    peak = config.model.optim.learning_rate
    assert max(rates) == pytest.approx(peak) and rates[0] < 0.5 * peak
    top = rates.index(max(rates))
    assert 0 < top < total // 4, "warm-up is a short first part of the run"
    assert all(a >= b for a, b in zip(rates[top:], rates[top + 1 :])), "decays monotonically after the peak"
    assert rates[-1] == pytest.approx(peak * config.model.optim.min_lr_ratio)


@pytest.mark.parametrize("hidden_size", [64, 512])
def test_fresh_graph_tokens_have_the_norm_of_a_word_embedding(tmp_path, data, hidden_size: int) -> None:
    llm_dir = save_tiny_decoder(tmp_path / "tiny", fixture_corpus(), hidden_size=hidden_size)
    model = _module(llm_dir, data)
    model.load_backbone("cpu")
    with torch.no_grad():
        tokens = model.graph_embeddings(data.collate(data.splits["train"][:4])["graph"])
    ratio = float(tokens.embeds.norm(dim=-1).mean()) / model.embedding_norm
    assert ratio == pytest.approx(1.0, rel=0.05)


def test_training_logs_the_graph_token_norm_ratio(llm_dir, data, monkeypatch) -> None:
    model = _module(llm_dir, data)
    model.load_backbone("cpu")
    logged: dict[str, float] = {}
    monkeypatch.setattr(model, "log", lambda name, value, **kwargs: logged.__setitem__(name, float(value)))
    model.training_step(data.collate(data.splits["train"][:2]), 0)
    assert logged["train/graph_token_norm_ratio"] == pytest.approx(1.0, rel=0.05)


CHATS = ("llama31", "qwen3", "smollm2")
USER_HEADERS = {"llama31": "<|start_header_id|>user<|end_header_id|>\n\n", "qwen3": "<|im_start|>user\n", "smollm2": "<|im_start|>user\n"}


@pytest.fixture(scope="module")
def chat_tokenizers() -> dict[str, Any]:
    """The bundled SmolLM2's own tokenizer, and tokenizers with the official Qwen3 and Llama 3.1 templates and tokens."""
    corpus = fixture_corpus()
    return {"smollm2": bundled_tokenizer(), **{name: tiny_tokenizer(corpus, official_chat(name)) for name in ("llama31", "qwen3")}}


@pytest.mark.parametrize("name", CHATS)
def test_graph_slot_opens_the_user_content_never_a_role_header(chat_tokenizers, name: str) -> None:
    tokenizer = chat_tokenizers[name]
    graph = LocalGraph(node_labels=["Alice", "Paris"], edge_src=[0], edge_dst=[1], edge_labels=["moved to"], edge_unit_labels=["F1"])
    chat = final_answer_chat("Where does Alice live?", "2023-06-01", "[F1] Alice | moved to | Paris", graph, text_path=False)
    prompt = chat_prompt_ids(tokenizer, chat)
    decode = partial(tokenizer.decode, clean_up_tokenization_spaces=False)
    before, after = decode(prompt.ids[: prompt.graph_slot]), decode(prompt.ids[prompt.graph_slot :])
    assert before + after == render_chat(tokenizer, chat), "the ids write exactly the model's rendered prompt"
    assert before.endswith(USER_HEADERS[name]), before[-60:]
    assert after.startswith("Question: Where does Alice live?") and decode(prompt.ids[prompt.graph_slot]) == "Question"
    assert before.count(USER_HEADERS[name]) == 1 and "You answer questions using only the provided memory context." in before
    assert prompt.ids == tokenizer(before + after, add_special_tokens=False)["input_ids"], "the slot is a boundary the tokenizer makes itself"


def test_the_official_templates_write_their_own_headers_around_the_slot(chat_tokenizers) -> None:
    """Llama 3.1 opens with one BOS and its dated system block; Qwen3 closes with the empty thinking block; SmolLM2 drops its default system turn."""
    graph = LocalGraph(node_labels=["Alice"], edge_src=[], edge_dst=[], edge_labels=[])
    chat = final_answer_chat("Where does Alice live?", None, "", graph, text_path=False)
    prompts = {name: chat_prompt_ids(tokenizer, chat) for name, tokenizer in chat_tokenizers.items()}
    llama, qwen, smol = (chat_tokenizers[name] for name in ("llama31", "qwen3", "smollm2"))
    ids = prompts["llama31"].ids
    assert ids[0] == llama.bos_token_id and ids.count(llama.bos_token_id) == 1
    assert "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nYou answer" in llama.decode(ids[: prompts["llama31"].graph_slot])
    ids = prompts["qwen3"].ids
    opening = qwen("<|im_start|>assistant\n<think>\n\n</think>\n\n", add_special_tokens=False)["input_ids"]
    assert ids[-len(opening) :] == opening
    assert qwen.convert_tokens_to_ids("<think>") in ids
    assert "named SmolLM" not in smol.decode(prompts["smollm2"].ids) and "named SmolLM" in smol.chat_template


def _change_in_place(folder: Path, change: str) -> None:
    """Edit the chat template, or add a token to the tokenizer, of the model saved in ``folder``."""
    if change == "chat_template":
        template = folder / "chat_template.jinja"
        if template.exists():
            template.write_text(template.read_text().replace("<|im_start|>", "<|im_start|> "))
        else:
            path = folder / "tokenizer_config.json"
            config = json.loads(path.read_text())
            config["chat_template"] = config["chat_template"].replace("<|im_start|>", "<|im_start|> ")
            path.write_text(json.dumps(config))
        return
    path = folder / "tokenizer.json"
    tokenizer = json.loads(path.read_text())
    tokenizer["added_tokens"].append({**tokenizer["added_tokens"][-1], "id": len(tokenizer["model"]["vocab"]), "content": "<|extra|>"})
    path.write_text(json.dumps(tokenizer))


@pytest.mark.parametrize("change", ["chat_template", "tokenizer"])
def test_a_checkpoint_of_another_tokenizer_or_chat_template_is_refused(llm_dir, data, tmp_path, change: str) -> None:
    """The same model reference (a path, or a hub id whose files changed) with other tokenizer files is another backbone."""
    folder = shutil.copytree(llm_dir, tmp_path / "model")
    trained = _module(folder, data)
    trained.load_backbone("cpu")
    checkpoint: dict[str, object] = {}
    trained.on_save_checkpoint(checkpoint)
    same = _module(folder, data)
    same.load_backbone("cpu")
    same.on_load_checkpoint(checkpoint)
    _change_in_place(folder, change)
    changed = _module(folder, data)
    changed.load_backbone("cpu")
    with pytest.raises(InputError, match="another config, tokenizer or chat template"):
        changed.on_load_checkpoint(checkpoint)


def test_dtype_and_quantization_are_part_of_the_config_hash(llm_dir, data) -> None:
    base = _module(llm_dir, data).checkpoint_metadata()["config_hash"]
    assert _module(llm_dir, data, dtype="bfloat16").checkpoint_metadata()["config_hash"] != base
    assert _module(llm_dir, data, quantization="4bit").checkpoint_metadata()["config_hash"] != base


def test_each_rank_loads_the_frozen_llm_straight_onto_its_device(llm_dir, monkeypatch) -> None:
    """No CPU copy first: the weights go where the rank runs (the meta device stands in for its GPU here)."""
    from transformers import AutoModelForCausalLM

    from qgmem_train.llm.resolver import load_causal_lm

    asked: list[object] = []
    real = AutoModelForCausalLM.from_pretrained

    def spy(*args: object, **kwargs: object) -> object:
        asked.append(kwargs.get("device_map"))
        return real(*args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", spy)
    model, _ = load_causal_lm(str(llm_dir), device="meta", dtype="float32")
    assert asked == ["meta"] and {p.device.type for p in model.parameters()} == {"meta"}
    model, _ = load_causal_lm(str(llm_dir), device="cpu", dtype="float32")
    assert asked[-1] is None and {p.device.type for p in model.parameters()} == {"cpu"}
