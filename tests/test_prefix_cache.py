"""The frozen-prefix cache: the same losses, gradients and greedy answers as running the whole prompt, for less work."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback

from qgmem_train.model.datamodule import TrajectoryDataModule
from qgmem_train.model.module import GraphAugmentedLM
from qgmem_train.model.settings import merge_settings
from tests.test_model_cluster import CHATS
from tests.tiny_decoder import FIXTURE, fixture_corpus, official_chat, save_tiny_decoder, tiny_module_kwargs


@pytest.fixture(scope="module")
def data() -> TrajectoryDataModule:
    module = TrajectoryDataModule(str(FIXTURE), batch_size=3, shuffle=False)
    module.setup("fit")
    return module


def _pair(data: TrajectoryDataModule, **settings: object) -> tuple[GraphAugmentedLM, GraphAugmentedLM]:
    """The same freshly initialised model twice: prefix cache on, then off."""
    models = []
    for cached in (True, False):
        torch.manual_seed(0)
        model = GraphAugmentedLM(feature_dim=data.feature_dim, prefix_cache=cached, **settings)
        model.load_backbone("cpu")
        models.append(model)
    return models[0], models[1]


def _tiny(llm_dir: Path, data: TrajectoryDataModule, **overrides: object) -> tuple[GraphAugmentedLM, GraphAugmentedLM]:
    settings = merge_settings(tiny_module_kwargs(llm_dir, data.feature_dim, readout={"tokens": 2}), overrides)
    settings.pop("feature_dim")
    return _pair(data, **settings)


def _loss_and_gradients(model: GraphAugmentedLM, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.train()
    model.zero_grad()
    losses = model.example_losses(batch)
    losses.mean().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return losses.detach(), grads


def _assert_same_training(cached: GraphAugmentedLM, plain: GraphAugmentedLM, batch: dict, rtol: float = 1e-5) -> None:
    """Per-example losses within 1e-5 and every gradient within ``rtol`` relative (a gradient by its norm: some are zero up
    to rounding)."""
    cached_losses, cached_grads = _loss_and_gradients(cached, batch)
    plain_losses, plain_grads = _loss_and_gradients(plain, batch)
    assert torch.allclose(cached_losses, plain_losses, rtol=1e-5, atol=1e-7), (cached_losses, plain_losses)
    assert set(cached_grads) == set(plain_grads) and {n.split(".")[0] for n in plain_grads} == {"encoder", "projector"}
    for name, grad in plain_grads.items():
        error = float((cached_grads[name] - grad).norm())
        assert error <= rtol * float(grad.norm()) + 1e-10, f"{name}: {error} against a gradient of norm {float(grad.norm())}"


def test_the_cache_runs_only_the_tokens_after_the_prefix(llm_dir, data) -> None:
    cached, plain = _tiny(llm_dir, data)
    batch = data.collate(data.splits["train"][:3])
    with_cache, without = cached.training_inputs(batch), plain.training_inputs(batch)
    prefix = cached.prompt_ids(batch["examples"][0]).graph_slot
    assert prefix > 10 and with_cache["cache"].get_seq_length() == prefix
    assert with_cache["inputs_embeds"].shape[1] == without["inputs_embeds"].shape[1] - prefix
    assert torch.equal(with_cache["attention_mask"], without["attention_mask"])
    assert torch.equal(with_cache["position_ids"], without["position_ids"][:, prefix:])


def test_the_read_only_cache_holds_the_computed_prefix_itself_not_a_copy(llm_dir, data) -> None:
    """Keys and values of the batch's cache share storage with the prefix computed once; each layer expands them in ``update``."""
    cached, _ = _tiny(llm_dir, data)
    batch = data.collate(data.splits["train"][:3])
    cache = cached.training_inputs(batch)["cache"]
    prefix = cached._prefix
    assert prefix is not None and len(cache.layers) == len(prefix.layers)
    for layer, (keys, values) in zip(cache.layers, prefix.layers):
        assert layer.keys.data_ptr() == keys.data_ptr() and layer.values.data_ptr() == values.data_ptr()
    new = torch.randn(3, *prefix.layers[0][0].shape[1:-2], 5, prefix.layers[0][0].shape[-1])
    keys, values = cache.update(new, new, 0)
    assert keys.shape == (3, *new.shape[1:-2], prefix.length + 5, new.shape[-1])
    assert torch.equal(keys[:, :, : prefix.length], prefix.layers[0][0].expand(3, -1, -1, -1)) and torch.equal(keys[:, :, prefix.length :], new)
    assert cache.get_seq_length() == prefix.length, "update stores nothing"


def test_losses_and_gradients_equal_for_a_right_padded_batch_of_mixed_lengths(llm_dir, data) -> None:
    cached, plain = _tiny(llm_dir, data)
    batch = data.collate(data.splits["train"][:3])
    lengths = {len(cached.prompt_ids(ex).ids) for ex in batch["examples"]}
    assert len(lengths) > 1, "the fixture should give prompts of different lengths"
    _assert_same_training(cached, plain, batch)


@pytest.mark.parametrize("name", CHATS)
def test_losses_and_gradients_equal_under_each_official_chat_template(tmp_path, data, name: str) -> None:
    """A tiny decoder whose tokenizer has the model's own template and special tokens (SmolLM2's from the bundled model).

    The frozen LLM runs in float64: over these prefixes of 250 to 310 tokens float32's summation order alone leaves the
    projector scale's small gradient 1.6e-5 apart (Llama 3.1), while in float64 the two paths agree exactly.
    """
    cached, plain = _tiny(save_tiny_decoder(tmp_path / name, fixture_corpus(), chat=official_chat(name)), data)
    for model in (cached, plain):
        model.llm.double()
    batch = data.collate(data.splits["train"][:2])
    prompt = cached.prompt_ids(batch["examples"][0])
    assert cached.tokenizer.chat_template == official_chat(name).template
    assert cached.training_inputs(batch)["cache"].get_seq_length() == prompt.graph_slot
    _assert_same_training(cached, plain, batch)


def test_gradient_checkpointing_keeps_the_cache_and_the_gradients(llm_dir, data) -> None:
    cached, plain = _tiny(llm_dir, data, gradient_checkpointing=True)
    _assert_same_training(cached, plain, data.collate(data.splits["train"][:3]))


def test_greedy_answers_are_identical_for_a_left_padded_batch(llm_dir, data) -> None:
    cached, plain = _tiny(llm_dir, data)
    examples = data.splits["train"][:3]
    graph = data.collate(examples)["graph"]
    answers = cached.generate(examples, graph)
    assert answers == plain.generate(examples, graph)
    assert cached._prefix is not None and cached._prefix.length == cached.prompt_ids(examples[0]).graph_slot


def test_the_cache_is_off_with_lora_and_says_so(llm_dir, data) -> None:
    cached, _ = _tiny(llm_dir, data, lora={"r": 4})
    enabled, why = cached.prefix_cache_status()
    assert not enabled and "LoRA" in why
    inputs = cached.training_inputs(data.collate(data.splits["train"][:2]))
    assert "cache" not in inputs and cached._prefix is None


def test_a_changed_system_prompt_rebuilds_the_cache(llm_dir, data, monkeypatch) -> None:
    from qgmem_train.answer import prompt as answer_prompt
    from qgmem_train.llm.prompts import PromptTemplate

    cached, plain = _tiny(llm_dir, data)
    batch = data.collate(data.splits["train"][:2])
    cached.example_losses(batch)
    first = cached._prefix
    original = answer_prompt.FINAL_ANSWER
    monkeypatch.setattr(answer_prompt, "FINAL_ANSWER", PromptTemplate(name=original.name, system=original.system + " Be brief.", user=original.user))
    _assert_same_training(cached, plain, batch)
    assert cached._prefix is not first and cached._prefix.length > first.length


class _DecoderLengths(Callback):
    """Sequence lengths each decoder layer's first op sees during training steps (a recomputation runs forward again)."""

    def __init__(self) -> None:
        self.lengths: list[int] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        for layer in pl_module.llm.model.layers:
            layer.input_layernorm.register_forward_hook(lambda module, args, out: self.lengths.append(int(args[0].shape[1])))


@pytest.mark.parametrize("checkpointing", [False, True])
def test_fit_runs_the_prefix_once_and_checkpointed_layers_still_recompute(llm_dir, data, tmp_path, caplog, checkpointing: bool) -> None:
    caplog.set_level("INFO", logger="qgmem_train.model.module")
    lengths = {}
    for cached in (True, False):
        L.seed_everything(0)
        settings = tiny_module_kwargs(llm_dir, data.feature_dim, gradient_checkpointing=checkpointing, generation={"val_generate": False}, prefix_cache=cached)
        model = GraphAugmentedLM(**settings)
        calls = _DecoderLengths()
        trainer = L.Trainer(
            accelerator="cpu", max_steps=1, limit_val_batches=0, logger=False, enable_progress_bar=False,
            enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path / str(cached), callbacks=[calls],
        )  # fmt: skip
        trainer.fit(model, datamodule=data)
        lengths[cached] = calls.lengths
    layers = 2
    assert len(lengths[True]) == len(lengths[False]) == (2 if checkpointing else 1) * layers
    prefix = model.prompt_ids(data.splits["train"][0]).graph_slot
    assert all(c == p - prefix for c, p in zip(lengths[True], lengths[False])), lengths
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("prefix cache:")]
    assert said == ["prefix cache: on: the tokens before the graph slot run through the frozen LLM once, not in every step",
                    "prefix cache: off (model.prefix_cache: false)"]  # fmt: skip


def test_under_bf16_autocast_the_prefix_computed_at_fit_start_serves_the_steps(llm_dir, data, tmp_path) -> None:
    model = GraphAugmentedLM(**tiny_module_kwargs(llm_dir, data.feature_dim, generation={"val_generate": False}))
    calls = _DecoderLengths()
    trainer = L.Trainer(
        accelerator="cpu", precision="bf16-mixed", max_steps=1, limit_val_batches=0, logger=False, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path, callbacks=[calls],
    )  # fmt: skip
    trainer.fit(model, datamodule=data)
    prefix = model.prompt_ids(data.splits["train"][0]).graph_slot
    assert model._prefix.key[4] == torch.bfloat16, "computed under the steps' autocast"
    assert len(calls.lengths) == 2 and prefix not in calls.lengths, "no step ran the prefix again"


@pytest.mark.slow
def test_smollm2_losses_gradients_and_answers_equal_with_and_without_the_cache(data) -> None:
    from qgmem_train.config import BUNDLED_LLM

    cached, plain = _pair(
        data, llm=BUNDLED_LLM, dtype="float32", encoder={"hidden_dim": 32, "layers": 1, "heads": 2}, projector={"hidden_dim": 32},
        prompt={"max_context_tokens": 64}, generation={"max_new_tokens": 32},
    )  # fmt: skip
    examples = data.splits["train"][:2]
    assert len({len(cached.prompt_ids(ex).ids) for ex in examples}) > 1, "prompts of different lengths"
    batch = data.collate(examples)
    # Through 30 layers float32 rounding reaches 2e-5 of the projector's scale gradient: against the same step in float64,
    # the cache off, the cache with transformers' repeated keys and the cache with grouped keys were 1.1e-5, 1.7e-5 and
    # 1.8e-5 from it, so two float32 paths may differ by up to twice that.
    _assert_same_training(cached, plain, batch, rtol=4e-5)
    assert cached.generate(examples, batch["graph"]) == plain.generate(examples, batch["graph"])


def _masks_and_logits(model: GraphAugmentedLM, batch: dict) -> tuple[list[type], torch.Tensor]:
    """The type of the mask the first decoder layer gets, and the fp32 logits at the labelled positions, for one batch."""
    from qgmem_train.model.fusion import IGNORE_INDEX

    seen: list[object] = []
    with torch.no_grad():
        inputs = model.training_inputs(batch)  # computes the prefix first (one pass of its own)
        hook = model.llm.model.layers[0].register_forward_pre_hook(lambda _, args, kwargs: seen.append(kwargs.get("attention_mask")), with_kwargs=True)
        try:
            hidden = model.hidden_states(inputs)
        finally:
            hook.remove()
    picked = inputs["labels"][:, 1:] != IGNORE_INDEX
    return seen, model.llm.get_output_embeddings()(hidden[:, :-1][picked]).float()


def test_a_padding_free_batch_attends_through_the_bottom_right_bias_with_the_same_logits(llm_dir, data) -> None:
    """Without padding the queries after the prefix get PyTorch's bottom-right causal bias (a kernel path with no mask
    tensor); with padding, the explicit mask. Either way the logits are those of the explicit mask and of no cache."""
    from torch.nn.attention.bias import CausalBias, CausalVariant

    cached, plain = _tiny(llm_dir, data)
    for examples, padded in ((data.splits["train"][:1], False), (data.splits["train"][:3], True)):
        batch = data.collate(examples)
        (mask,), logits = _masks_and_logits(cached, batch)
        if padded:
            assert type(mask) is torch.Tensor and mask.dtype == torch.bool, type(mask)
        else:
            assert isinstance(mask, CausalBias) and mask.variant == CausalVariant.LOWER_RIGHT, type(mask)
        assert cached.llm.config._attn_implementation == "sdpa_bottom_right"
        cached.llm.set_attn_implementation("sdpa")
        try:
            (explicit_mask,), explicit = _masks_and_logits(cached, batch)
        finally:
            cached.llm.set_attn_implementation("sdpa_bottom_right")
        assert type(explicit_mask) is torch.Tensor
        _, whole = _masks_and_logits(plain, batch)
        scale = float(explicit.abs().max())
        assert float((logits - explicit).abs().max()) <= 1e-4 * scale and float((logits - whole).abs().max()) <= 1e-4 * scale


def test_gradient_checkpointing_recomputes_through_the_bottom_right_bias(llm_dir, data) -> None:
    cached, plain = _tiny(llm_dir, data, gradient_checkpointing=True)
    batch = data.collate(data.splits["train"][:1])
    (mask,), _ = _masks_and_logits(cached, batch)
    assert type(mask).__name__ == "CausalBias"
    _assert_same_training(cached, plain, batch)


def test_grouped_keys_and_values_reach_attention_unrepeated_under_a_mask_with_the_same_logits(llm_dir, data) -> None:
    """Under the bottom-right bias (no padding) and under a mask tensor (padding), each layer's SDPA call gets the keys and
    values of the key-value heads themselves, not transformers' copy repeated to every query head; the logits are those of
    transformers' SDPA attention (which repeats them)."""
    from torch.overrides import TorchFunctionMode

    cached, _ = _tiny(llm_dir, data)
    config = cached.llm.config
    assert config.num_key_value_heads < config.num_attention_heads, "the tiny decoder must group its queries"
    heads: list[tuple[int, int, bool]] = []

    class Heads(TorchFunctionMode):
        """Records the query and key head counts of every SDPA call (a mode: the bias's own dispatch still applies)."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is torch.nn.functional.scaled_dot_product_attention:
                heads.append((args[0].shape[1], args[1].shape[1], bool(kwargs.get("enable_gqa"))))
            return func(*args, **kwargs)

    layers = config.num_hidden_layers
    for examples in (data.splits["train"][:1], data.splits["train"][:3]):
        batch = data.collate(examples)
        heads.clear()
        with Heads():
            _, logits = _masks_and_logits(cached, batch)
        assert heads[-layers:] == [(config.num_attention_heads, config.num_key_value_heads, True)] * layers, heads
        cached.llm.set_attn_implementation("sdpa")
        try:
            _, repeated = _masks_and_logits(cached, batch)
        finally:
            cached.llm.set_attn_implementation("sdpa_bottom_right")
        assert float((logits - repeated).abs().max()) <= 1e-5 * float(repeated.abs().max())
