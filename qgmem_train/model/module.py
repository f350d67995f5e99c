"""The LightningModule of graph-augmented generation (paper III-C): a frozen LLM, a trainable graph path.

Trainable: the relational graph encoder and the projector (plus LoRA adapters when ``lora_r > 0``).
The LLM's own weights never change and it stays in eval mode even while Lightning trains the module.
Checkpoints hold the trainable parameters only, with the base model's id, revision and a config hash.
"""

from __future__ import annotations

import os
from typing import Any, Literal

import lightning as L
import torch
from torch_geometric.data import Batch

from qgmem_train.config import BUNDLED_LLM
from qgmem_train.errors import InputError
from qgmem_train.graph.encoder import RelationalGraphEncoder
from qgmem_train.graph.projector import GraphTokenProjector
from qgmem_train.model.answers import exact_match, parse_answer
from qgmem_train.model.checkpoint import METADATA_KEY, check_compatible, config_hash, trainable_state_dict
from qgmem_train.model.fusion import (
    chat_prompt_ids,
    embed_token_ids,
    insert_graph_tokens,
    pad_left,
    pad_right,
    per_example_loss,
    sequence_labels,
    target_ids,
    truncate_to_tokens,
)
from qgmem_train.model.prompt import final_answer_chat
from qgmem_train.model.trajectory import TrajectoryExample

GraphBatch = dict[str, Any]
"""What the data module yields: ``{"examples": list[TrajectoryExample], "graph": torch_geometric Batch}``."""


class GraphAugmentedLM(L.LightningModule):
    """Frozen causal LM + relation-aware graph encoder + projector to ``graph_tokens`` input embeddings."""

    def __init__(
        self,
        feature_dim: int,
        llm: str = BUNDLED_LLM,
        llm_revision: str | None = None,
        dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto",
        quantization: Literal["none", "4bit", "8bit"] = "none",
        cache_dir: str | None = None,
        trust_remote_code: bool = False,
        graph_tokens: int = 1,
        text_path: bool = False,
        gnn_hidden: int = 1024,
        gnn_layers: int = 3,
        gnn_heads: int = 4,
        gnn_dropout: float = 0.0,
        projector_hidden: int = 2048,
        lora_r: int = 0,
        lora_alpha: int = 16,
        lora_target_modules: list[str] | None = None,
        gradient_checkpointing: bool = False,
        learning_rate: float = 1e-4,
        weight_decay: float = 0.05,
        warmup_steps: int = 0,
        max_context_tokens: int | None = None,
        max_new_tokens: int = 256,
        val_generate: bool = True,
    ) -> None:
        """Build the module and load the frozen LLM.

        Args:
            feature_dim: width of node/edge features, i.e. the retrieval embedder's dimension (linked from the data module).
            llm: causal LM reference (hub id, local path or ``pkg:<package>``); linked from ``pipeline.models.llm``.
            llm_revision: hub revision of the LLM, recorded in checkpoints.
            dtype: LLM weights dtype (auto: bfloat16 on CUDA, float32 on CPU).
            quantization: bitsandbytes quantization of the frozen LLM (``4bit`` is NF4); CUDA only.
            cache_dir: cache of converted bundled models.
            trust_remote_code: allow repository code of the LLM; off by default.
            graph_tokens: number T of graph tokens; 0 runs the same prompt with no graph (the paper's ablation).
            text_path: append the local graph to the prompt as labelled facts (API backbones; use with ``graph_tokens: 0``).
            gnn_hidden: hidden width of the graph encoder.
            gnn_layers: message-passing layers.
            gnn_heads: attention heads per TransformerConv layer.
            gnn_dropout: attention dropout of the graph encoder.
            projector_hidden: hidden width of the projector MLP.
            lora_r: LoRA rank on the LLM (0: no LoRA, the LLM is fully frozen).
            lora_alpha: LoRA scaling numerator.
            lora_target_modules: modules LoRA wraps (default ``q_proj``, ``v_proj``).
            gradient_checkpointing: recompute LLM layer activations in backward to save memory.
            learning_rate: AdamW learning rate.
            weight_decay: AdamW weight decay.
            warmup_steps: linear learning-rate warm-up steps.
            max_context_tokens: cut the serialized working memory to this many tokens (None: keep all).
            max_new_tokens: generation budget of validation, test and predict.
            val_generate: generate answers in validation/test to report valid-JSON rate and exact match.
        """
        super().__init__()
        if graph_tokens < 0:
            raise InputError("model.graph_tokens", "must be 0 (no graph) or more")
        self.save_hyperparameters()
        self.strict_loading = False  # checkpoints hold trainable parameters only; on_load_checkpoint checks them
        self.llm, self.tokenizer = _load_frozen_llm(llm, llm_revision, dtype, quantization, cache_dir, trust_remote_code)
        if lora_r > 0:
            self.llm = _add_lora(self.llm, lora_r, lora_alpha, lora_target_modules or ["q_proj", "v_proj"])
        if gradient_checkpointing:
            self.llm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        hidden_size = self.llm.get_input_embeddings().embedding_dim
        self.encoder: RelationalGraphEncoder | None = None
        self.projector: GraphTokenProjector | None = None
        if graph_tokens > 0:
            self.encoder = RelationalGraphEncoder(feature_dim, gnn_hidden, gnn_layers, gnn_heads, gnn_dropout)
            self.projector = GraphTokenProjector(gnn_hidden, projector_hidden, hidden_size, graph_tokens)

    def train(self, mode: bool = True) -> "GraphAugmentedLM":
        """Switch the trainable parts; the LLM stays in eval mode (no dropout), checkpointed layers excepted.

        Transformers only checkpoints a decoder layer whose own ``training`` flag is set, so with
        gradient checkpointing on, that flag (and nothing below it) follows ``mode``.
        """
        super().train(mode)
        self.llm.eval()
        if self.hparams.gradient_checkpointing:
            for layer in self.llm.modules():
                if getattr(layer, "gradient_checkpointing", False):
                    layer.training = mode
        return self

    def graph_embeddings(self, graph: Batch) -> torch.Tensor | None:
        """``(B, T, H)`` graph tokens of a batch of local graphs, or ``None`` when ``graph_tokens`` is 0."""
        if self.encoder is None or self.projector is None:
            return None
        graph = graph.to(self.device)
        return self.projector(self.encoder(graph))

    def prompt_ids(self, example: TrajectoryExample) -> list[int]:
        """Chat-templated FINAL_ANSWER token ids of one example (context cut to ``max_context_tokens``)."""
        context = truncate_to_tokens(self.tokenizer, example.context, self.hparams.max_context_tokens)
        chat = final_answer_chat(example.question, example.question_time, context, example.graph, text_path=self.hparams.text_path)
        return chat_prompt_ids(self.tokenizer, chat)

    def training_inputs(self, batch: GraphBatch) -> dict[str, torch.Tensor]:
        """Right-padded embeddings, mask, position ids and labels (loss on target JSON + EOS only)."""
        examples = batch["examples"]
        prompts = [self.prompt_ids(ex) for ex in examples]
        targets = [target_ids(self.tokenizer, ex.target_json()) for ex in examples]
        embeds = embed_token_ids(self.llm.get_input_embeddings(), [p + t for p, t in zip(prompts, targets)])
        embeds = insert_graph_tokens(embeds, self.graph_embeddings(batch["graph"]))
        labels = [sequence_labels(len(p), t, self.hparams.graph_tokens, self.device) for p, t in zip(prompts, targets)]
        return pad_right(embeds, labels)

    def hidden_states(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Last hidden states of the LLM's decoder for padded inputs (no vocabulary projection)."""
        decoder = self.llm.get_decoder()
        output = decoder(
            inputs_embeds=inputs["inputs_embeds"],
            attention_mask=inputs["attention_mask"],
            position_ids=inputs["position_ids"],
            use_cache=False,
        )
        return output.last_hidden_state

    def example_losses(self, batch: GraphBatch) -> torch.Tensor:
        """Per-example mean token cross-entropy on the target JSON + EOS: ``(B,)``."""
        inputs = self.training_inputs(batch)
        return per_example_loss(self.hidden_states(inputs), inputs["labels"], self.llm.get_output_embeddings())

    def training_step(self, batch: GraphBatch, batch_idx: int) -> torch.Tensor:
        loss = self.example_losses(batch).mean()
        self.log("train/loss", loss, prog_bar=True, batch_size=len(batch["examples"]))
        return loss

    def validation_step(self, batch: GraphBatch, batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: GraphBatch, batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def _evaluate(self, batch: GraphBatch, stage: str) -> None:
        size = len(batch["examples"])
        self.log(f"{stage}/loss", self.example_losses(batch).mean(), prog_bar=True, batch_size=size, sync_dist=True)
        if not self.hparams.val_generate:
            return
        records = self.predict_step(batch, 0)
        valid = torch.tensor([r["valid_json"] for r in records], dtype=torch.float32).mean()
        match = torch.tensor([r["exact_match"] for r in records], dtype=torch.float32).mean()
        self.log(f"{stage}/json_valid", valid, batch_size=size, sync_dist=True)
        self.log(f"{stage}/exact_match", match, batch_size=size, sync_dist=True)

    @torch.no_grad()
    def generate(self, examples: list[TrajectoryExample], graph: Batch) -> list[str]:
        """Greedy final-answer generations for a batch (left padded), decoded without special tokens."""
        embeds = embed_token_ids(self.llm.get_input_embeddings(), [self.prompt_ids(ex) for ex in examples])
        inputs = pad_left(insert_graph_tokens(embeds, self.graph_embeddings(graph)))
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        output = self.llm.generate(
            inputs_embeds=inputs["inputs_embeds"],
            attention_mask=inputs["attention_mask"],
            max_new_tokens=self.hparams.max_new_tokens,
            do_sample=False,
            pad_token_id=pad_id,
            eos_token_id=self.tokenizer.eos_token_id,
        )
        return self.tokenizer.batch_decode(output, skip_special_tokens=True)

    def predict_step(self, batch: GraphBatch, batch_idx: int, dataloader_idx: int = 0) -> list[dict[str, Any]]:
        """One record per example: ids, question, generated text, parsed answer, validity and exact match."""
        examples = batch["examples"]
        records = []
        for example, text in zip(examples, self.generate(examples, batch["graph"])):
            parsed = parse_answer(text)
            records.append(
                {
                    "case_id": example.case_id,
                    "question_id": example.question_id,
                    "question": example.question,
                    "generated": text,
                    "answer": parsed.answer if parsed else None,
                    "reasoning_path": parsed.reasoning_path if parsed else None,
                    "valid_json": parsed is not None,
                    "exact_match": bool(parsed and exact_match(parsed.answer, example.answer)),
                    "reference_answer": example.answer,
                }
            )
        return records

    def configure_optimizers(self) -> Any:
        params = [p for p in self.parameters() if p.requires_grad]
        if not params:
            raise InputError("model", "nothing to train: graph_tokens is 0 and lora_r is 0 (validate/test/predict still work)")
        optimizer = torch.optim.AdamW(params, lr=self.hparams.learning_rate, weight_decay=self.hparams.weight_decay)
        warmup = max(self.hparams.warmup_steps, 1)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    def checkpoint_metadata(self) -> dict[str, Any]:
        """Base model id and revision plus the hash of every setting that shapes trainable parameters."""
        shape_keys = (
            "llm", "llm_revision", "feature_dim", "graph_tokens", "text_path", "gnn_hidden", "gnn_layers",
            "gnn_heads", "projector_hidden", "lora_r", "lora_alpha", "lora_target_modules",
        )
        settings = {key: self.hparams[key] for key in shape_keys}
        return {"base_model": self.hparams.llm, "revision": self.hparams.llm_revision, "config_hash": config_hash(settings), "settings": settings}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Keep only trainable parameters and record what they belong to."""
        checkpoint["state_dict"] = trainable_state_dict(self)
        checkpoint[METADATA_KEY] = self.checkpoint_metadata()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Refuse a checkpoint of another base model, revision, configuration or parameter set."""
        check_compatible(
            checkpoint.get(METADATA_KEY),
            self.checkpoint_metadata(),
            set(checkpoint.get("state_dict", {})),
            set(trainable_state_dict(self)),
            "checkpoint",
        )


def _load_frozen_llm(ref: str, revision: str | None, dtype: str, quantization: str, cache_dir: str | None, trust_remote_code: bool) -> tuple[Any, Any]:
    """Load the causal LM on this process's device with every weight frozen."""
    from qgmem_train.llm.resolver import load_causal_lm

    if quantization != "none" and not torch.cuda.is_available():
        raise InputError("model.quantization", f"{quantization} (bitsandbytes NF4/int8) needs CUDA; set it to none on CPU")
    device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if torch.cuda.is_available() else "cpu"
    model, tokenizer = load_causal_lm(
        ref, revision=revision, dtype=dtype, device=device, quantization=quantization, cache_dir=cache_dir, trust_remote_code=trust_remote_code
    )
    model.requires_grad_(False)
    model.eval()
    return model, tokenizer


def _add_lora(model: Any, rank: int, alpha: int, target_modules: list[str]) -> Any:
    """Wrap the frozen LLM with peft LoRA adapters (no dropout: the backbone stays in eval mode)."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=target_modules, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM")
    return get_peft_model(model, config)
