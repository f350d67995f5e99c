"""The LightningModule of graph-augmented generation (paper III-C): a frozen LLM, a trainable graph path.

Trainable: the relational graph encoder, the graph readout's own parameters (``query``) and the projector (plus
LoRA adapters when ``lora.r > 0``); with ``projector.center: reference`` the projector also keeps its centering statistics.
The LLM's own weights never change and it stays in eval mode (no dropout) even while Lightning trains.
Its weights load in ``configure_model``, on the device the strategy gives this process (every launch
mode: Lightning's launcher, torchrun, srun); ``load_backbone`` does the same outside a Trainer.
Checkpoints hold the trainable parameters (and the graph path's buffers) only, with the base model's id,
revision, a fingerprint of its config, tokenizer and chat template, and a hash of the settings that shape
the parameters.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os
import random
import typing
from typing import Any, Literal

import lightning as L
import torch
from torch_geometric.data import Batch

from qgmem_train.answer.capped import JSON_OVERHEAD_TOKENS, capped_answer_schema
from qgmem_train.answer.parsing import parse_answer
from qgmem_train.config import BUNDLED_LLM
from qgmem_train.errors import InputError
from qgmem_train.graph.centered_projector import ReferenceCenteredProjector
from qgmem_train.graph.diagnostics import graph_token_diagnostics
from qgmem_train.graph.encoder import RelationalGraphEncoder
from qgmem_train.graph.projector import GraphTokenProjector
from qgmem_train.graph.readout import READOUTS, GraphTokens, build_readout
from qgmem_train.graph.shuffle_gap import shuffle_gap_summary
from qgmem_train.metrics.answers import answer_scores
from qgmem_train.model.answer_target import answer_labels, answer_token_mask
from qgmem_train.model.backbone import describe_backbone
from qgmem_train.model.checkpoint import METADATA_KEY, check_compatible, config_hash, trainable_state_dict
from qgmem_train.model.ddp import frozen_backbone_names
from qgmem_train.model.fusion import (
    PromptIds,
    embed_token_ids,
    insert_graph_tokens,
    pad_left,
    pad_right,
    per_example_loss,
    sequence_labels,
)
from qgmem_train.model.init_from import GRAPH_PATH, read_init_checkpoint
from qgmem_train.model.prefix_attention import use_bottom_right
from qgmem_train.model.prefix_cache import (
    PrefixKV,
    attend_to_prefix,
    cache_key,
    compute_prefix,
    generate_after_prefix,
    shared_prefix,
    unsupported_reason,
)
from qgmem_train.model.prompt_tokens import PromptTokens
from qgmem_train.model.settings import (
    FLAT_NAMES,
    GROUPS,
    DiagnosticsArgs,
    EncoderArgs,
    GenerationArgs,
    LoraArgs,
    OptimArgs,
    ProjectorArgs,
    PromptArgs,
    ReadoutArgs,
    as_group,
    flat_settings,
    grouped_hparams,
)
from qgmem_train.schedule import warmup_cosine
from qgmem_train.trajectory import TrajectoryExample

log = logging.getLogger(__name__)

GraphBatch = dict[str, Any]
"""What the data module yields: ``{"examples": list[TrajectoryExample], "graph": torch_geometric Batch}``."""

EVALUATED_SPLITS = {"val": "validation", "test": "test"}
"""The data module's split each evaluation stage runs over (graph donors for the shuffle gap come from all of it)."""

ANSWER_METRICS = {"json_valid": "valid_json", "exact_match": "exact_match", "f1": "f1", "bleu1": "bleu1"}
"""Answer scores that validation and test log (means over the split), by logged name: the prediction record's key."""


class GraphAugmentedLM(L.LightningModule):
    """Frozen causal LM + relation-aware graph encoder + projector to ``readout.tokens`` input embeddings."""

    def __init__(
        self,
        feature_dim: int,
        llm: str = BUNDLED_LLM,
        llm_revision: str | None = None,
        dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto",
        quantization: Literal["none", "4bit", "8bit"] = "none",
        cache_dir: str | None = None,
        trust_remote_code: bool = False,
        gradient_checkpointing: bool = False,
        prefix_cache: bool = True,
        init_from: str | None = None,
        encoder: EncoderArgs = EncoderArgs(),
        readout: ReadoutArgs = ReadoutArgs(),
        projector: ProjectorArgs = ProjectorArgs(),
        lora: LoraArgs = LoraArgs(),
        optim: OptimArgs = OptimArgs(),
        prompt: PromptArgs = PromptArgs(),
        generation: GenerationArgs = GenerationArgs(),
        diagnostics: DiagnosticsArgs = DiagnosticsArgs(),
    ) -> None:
        """Build the trainable graph path; the frozen LLM's weights load later (``configure_model``).

        Args:
            feature_dim: width of node/edge features, i.e. the retrieval embedder's dimension (linked from the data module).
            llm: causal LM reference (hub id, local path or ``pkg:<package>``); linked from ``pipeline.models.llm``.
            llm_revision: hub revision of the LLM, recorded in checkpoints.
            dtype: LLM weights dtype (auto: bfloat16 on CUDA, float32 on CPU).
            quantization: bitsandbytes quantization of the frozen LLM (``4bit`` is NF4); CUDA only.
            cache_dir: cache of converted bundled models.
            trust_remote_code: allow repository code of the LLM; off by default.
            gradient_checkpointing: recompute LLM decoder-layer activations in backward to save memory.
            prefix_cache: compute the frozen prompt prefix (every token before the graph slot) once and reuse its
                keys and values in every step and generation; applies without LoRA (see ``prefix_cache_status``).
            init_from: a fit checkpoint (``.ckpt``), export folder or graph adapter file whose encoder, readout and projector
                weights a Trainer run starts from (an aligned checkpoint, docs/alignment.md); refused in one line when its base
                model or graph-path settings differ; recorded in this run's checkpoints and export. A resumed run ignores it.
            encoder: graph encoder: relation-aware message passing over each question's local graph.
            readout: graph readout: how node states become graph tokens, and how many.
            projector: projector: readout vectors to the LLM's input embeddings, optionally centred on reference graphs.
            lora: LoRA adapters on the frozen LLM.
            optim: optimisation: AdamW with warm-up and cosine decay, and the graph-contrast loss term.
            prompt: prompt: the working memory's token budget and the text path.
            generation: generation: answers in validation, test and predict.
            diagnostics: diagnostics: the shuffle gap, whether the model reads its graphs.

        Each group is a dataclass of :mod:`qgmem_train.model.settings`, or a mapping of its fields (checkpoints hold plain mappings).
        """
        super().__init__()
        self.encoder_args = as_group(EncoderArgs, encoder, "model.encoder")
        self.readout_args = as_group(ReadoutArgs, readout, "model.readout")
        self.projector_args = as_group(ProjectorArgs, projector, "model.projector")
        self.lora_args = as_group(LoraArgs, lora, "model.lora")
        self.optim_args = as_group(OptimArgs, optim, "model.optim")
        self.prompt_args = as_group(PromptArgs, prompt, "model.prompt")
        self.generation_args = as_group(GenerationArgs, generation, "model.generation")
        self.diagnostics_args = as_group(DiagnosticsArgs, diagnostics, "model.diagnostics")
        tokens, kind = self.readout_args.tokens, self.readout_args.kind
        if tokens < 0:
            raise InputError("model.readout.tokens", "must be 0 (no graph) or more")
        if kind not in READOUTS:
            raise InputError("model.readout.kind", f"{kind!r} is not one of {', '.join(READOUTS)}")
        nonnegative = {
            "optim.contrast": self.optim_args.contrast,
            "optim.contrast_margin": self.optim_args.contrast_margin,
            "diagnostics.shuffle_floor": self.diagnostics_args.shuffle_floor,
            "encoder.layers": self.encoder_args.layers,
            "projector.hidden_dim": self.projector_args.hidden_dim,
        }
        for name, value in nonnegative.items():
            if value < 0:
                raise InputError(f"model.{name}", f"must be 0 or more, not {value}")
        enc, proj = self.encoder_args, self.projector_args
        if proj.center not in ("none", "reference"):
            raise InputError("model.projector.center", f"{proj.center!r} is not one of none, reference")
        if proj.reference_graphs < 2:
            raise InputError("model.projector.reference_graphs", f"must be at least 2 to have a spread, not {proj.reference_graphs}")
        if self.generation_args.max_new_tokens <= JSON_OVERHEAD_TOKENS:
            raise InputError("model.generation.max_new_tokens", f"must be more than {JSON_OVERHEAD_TOKENS} to hold an answer JSON")
        backbone_settings = dict(llm=llm, llm_revision=llm_revision, dtype=dtype, quantization=quantization, cache_dir=cache_dir, trust_remote_code=trust_remote_code)
        self.save_hyperparameters(
            {
                "feature_dim": feature_dim, **backbone_settings, "gradient_checkpointing": gradient_checkpointing, "prefix_cache": prefix_cache, "init_from": init_from,
                **{name: dataclasses.asdict(getattr(self, f"{name}_args")) for name in GROUPS},
            }
        )  # fmt: skip  # plain mappings: a checkpoint loads with torch.load(weights_only=True)
        self.strict_loading = False  # checkpoints hold trainable parameters only; on_load_checkpoint checks them
        backbone = describe_backbone(llm, llm_revision, cache_dir, trust_remote_code)
        self.tokenizer = backbone.tokenizer
        self.prompt_tokens = PromptTokens(backbone.tokenizer, self.prompt_args.max_context_tokens, self.prompt_args.text_path)
        self.backbone_fingerprint = backbone.fingerprint
        self.llm: Any = None
        self.embedding_norm: float | None = None
        self._constraint: Any = None
        self._prefix: PrefixKV | None = None
        self._eval_tokens: list[torch.Tensor] = []
        self._eval_gaps: list[tuple[str, float, float]] = []
        self._gap_skipped: str | None = None
        self.init_record: dict[str, Any] | None = None
        """Where the graph path started (``init_from``: path, SHA-256, the source's graph reading), or None; saved in checkpoints."""
        self.graph_reading: dict[str, Any] | None = None
        """The last validation's shuffle gap and token cosine (:func:`~qgmem_train.graph.shuffle_gap.graph_reading_line` says
        what they mean), or why it was not measured; saved in checkpoints' metadata."""
        self.encoder: RelationalGraphEncoder | None = None
        self.projector: GraphTokenProjector | ReferenceCenteredProjector | None = None
        self.readout: torch.nn.Module | None = None
        self._reference_graph: Batch | None = None
        if tokens > 0:
            self.encoder = RelationalGraphEncoder(feature_dim, enc.hidden_dim, enc.layers, enc.heads, enc.dropout, reverse_edges=enc.reverse_edges)
            self.readout = build_readout(kind, self.encoder.out_dim, feature_dim, tokens)
            per_vector = self.readout.tokens_per_vector
            if proj.center == "reference":
                self.projector = ReferenceCenteredProjector(self.readout.out_dim, proj.hidden_dim, backbone.hidden_size, per_vector, proj.center_share)
            else:
                self.projector = GraphTokenProjector(self.readout.out_dim, proj.hidden_dim, backbone.hidden_size, per_vector, normalize=proj.norm)

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path: str | os.PathLike, *args: Any, **kwargs: Any) -> GraphAugmentedLM:  # type: ignore[override]
        """Lightning's loader, reading the flat hyperparameters of a checkpoint written before the grouping as groups
        (Lightning would drop them as unknown arguments, or hand them to LightningCLI's parser, which refuses them).

        ``init_from`` is dropped: the checkpoint's own weights are the model's, and its metadata keeps where they started."""
        saved = torch.load(checkpoint_path, map_location="cpu", weights_only=True).get("hyper_parameters", {})
        grouped = {**grouped_hparams(saved), "init_from": None, "_instantiator": None}  # None: built here from these arguments
        return super().load_from_checkpoint(checkpoint_path, *args, **{**grouped, **kwargs})

    def configure_model(self) -> None:
        """Lightning hook: load the frozen LLM once, on the device the strategy gives this process."""
        trainer = self._trainer
        if trainer is not None:
            _refuse_sharding(trainer.strategy)
        start = self._init_state() if trainer is None or trainer.ckpt_path is None else None
        self.load_backbone(trainer.strategy.root_device if trainer is not None else None)
        if start is not None:
            self.load_state_dict(start, strict=False)  # after load_backbone, which sets the projector's scale

    def _init_state(self) -> dict[str, torch.Tensor] | None:
        """The ``init_from`` checkpoint's graph-path tensors, checked before the LLM loads (None without ``init_from``)."""
        if not self.hparams.get("init_from"):
            return None
        graph_keys = {name for name in trainable_state_dict(self) if name.startswith(GRAPH_PATH)}
        state, self.init_record = read_init_checkpoint(self.hparams.init_from, self.checkpoint_metadata(), graph_keys)
        log.info("graph path starts from %s (sha256 %s)", self.init_record["path"], self.init_record["sha256"][:16])
        return state

    def load_backbone(self, device: str | torch.device | None = None, *, quantized: bool = True) -> None:
        """Load the frozen LLM on ``device`` (default: this process's GPU, ``cuda:<local rank>``, else CPU); once.

        Moves the graph path there too, adds LoRA when asked, turns on gradient checkpointing of the
        decoder layers, and sets the projector's scale to the mean input-embedding norm (a checkpoint
        loaded afterwards overrides it). ``quantized=False`` loads the weights without bitsandbytes whatever ``quantization`` says (export
        reads LoRA tensors, which do not depend on it, on a machine without CUDA).
        """
        if self.llm is not None:
            return
        from qgmem_train.llm.resolver import pick_device

        hp = self.hparams
        target = str(device) if device is not None else pick_device("auto")
        quantization = hp.quantization if quantized else "none"
        llm = _load_frozen_llm(hp.llm, hp.llm_revision, hp.dtype, quantization, hp.cache_dir, hp.trust_remote_code, target)
        if self.lora_args.r > 0:
            llm = _add_lora(llm, self.lora_args)
        if hp.gradient_checkpointing:
            llm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.llm = llm
        if self.prefix_cache_status()[0]:
            use_bottom_right(llm)  # padding-free batches after the prefix: a kernel without a mask tensor
            if hp.gradient_checkpointing:
                _keep_read_only_cache_when_checkpointing(llm)
        self._ddp_params_and_buffers_to_ignore = frozen_backbone_names(self)
        self.to(torch.device(target))
        self.embedding_norm = float(llm.get_input_embeddings().weight.detach().float().norm(dim=-1).mean())
        if self.projector is not None:
            self.projector.set_scale(self.embedding_norm)
        self.train(self.training)

    def _backbone(self) -> Any:
        """The loaded LLM, or one clear error when it has not been loaded yet."""
        if self.llm is None:
            raise RuntimeError("the frozen LLM is not loaded: Lightning loads it in configure_model(); outside a Trainer call load_backbone()")
        return self.llm

    def train(self, mode: bool = True) -> "GraphAugmentedLM":
        """Switch the trainable parts; the LLM stays in eval mode (no dropout), checkpointed layers excepted.

        Transformers checkpoints a decoder layer only while the layer's own ``training`` flag is set
        (and gradients are on), so with gradient checkpointing that flag, and nothing below it, stays
        set whatever ``mode`` is: Lightning never calls ``train()`` during fit, and a layer's flag
        alone switches no dropout on.
        """
        super().train(mode)
        if self.llm is not None:
            self.llm.eval()
            if self.hparams.gradient_checkpointing:
                for layer in self.llm.modules():
                    if getattr(layer, "gradient_checkpointing", False):
                        layer.training = True
        return self

    def graph_embeddings(self, graph: Batch) -> GraphTokens | None:
        """Graph tokens ``(B, T_max, H)`` of a batch of local graphs from the configured readout, with their mask when the
        count varies per graph (``edges``); ``None`` when ``readout.tokens`` is 0."""
        if self.encoder is None or self.projector is None or self.readout is None:
            return None
        graph = graph.to(self.device)
        vectors, mask = self.readout(self.encoder.node_states(graph), graph)
        size, count = vectors.shape[0], vectors.shape[1] * self.readout.tokens_per_vector
        if isinstance(self.projector, ReferenceCenteredProjector):
            projected = self.projector(vectors.flatten(0, 1), self._reference_vectors() if self.training else None)
        else:
            projected = self.projector(vectors.flatten(0, 1))
        return GraphTokens(projected.reshape(size, count, self.projector.llm_hidden_size), mask)

    def set_reference_graphs(self, graph: Batch) -> None:
        """The batch of training graphs that ``projector.center: reference`` centers on (:meth:`on_fit_start` picks them from the
        data module's train split; callers training outside a Trainer set them here)."""
        self._reference_graph = graph

    def _reference_vectors(self) -> torch.Tensor:
        """The reference graphs' real readout vectors ``(R, in_dim)`` under the current encoder."""
        if self._reference_graph is None or self.encoder is None or self.readout is None:
            raise RuntimeError("projector.center is reference but no reference graphs are set: fit with the trajectory data module or call set_reference_graphs()")
        graph = self._reference_graph.to(self.device)
        vectors, mask = self.readout(self.encoder.node_states(graph), graph)
        return vectors.flatten(0, 1) if mask is None else vectors[mask.bool()]

    def prompt_ids(self, example: TrajectoryExample) -> PromptIds:
        """Chat-templated FINAL_ANSWER token ids of one example (context cut to ``max_context_tokens``) and its graph slot."""
        return self.prompt_tokens.prompt(example)

    def prefix_cache_status(self) -> tuple[bool, str]:
        """Whether the frozen-prefix cache applies to this model, and why: the line fit prints at its start."""
        if not self.hparams.prefix_cache:
            return False, "off (model.prefix_cache: false)"
        reason = unsupported_reason(self._backbone(), self.lora_args.r)
        if reason is not None:
            return False, f"off: {reason}"
        return True, "on: the tokens before the graph slot run through the frozen LLM once, not in every step"

    def cached_prefix(self, prompts: list[PromptIds]) -> PrefixKV | None:
        """The keys and values of the batch's shared prefix (computed on first use and whenever what they depend on changes).

        ``None`` when the cache is off or the prompts do not share the tokens before their slot.
        """
        if not self.prefix_cache_status()[0]:
            return None
        ids = shared_prefix(prompts)
        if ids is None:
            return None
        llm = self._backbone()
        key = cache_key(llm, ids)
        if self._prefix is None or self._prefix.key != key:
            self._prefix = compute_prefix(llm, ids, key)
        return self._prefix

    def on_fit_start(self) -> None:
        """Say whether the prefix cache is on and why, and compute it before the first step."""
        enabled, why = self.prefix_cache_status()
        if self.trainer.is_global_zero:
            log.info("prefix cache: %s", why)
        if isinstance(self.projector, ReferenceCenteredProjector) and self._reference_graph is None:
            self.set_reference_graphs(reference_graphs(self.trainer.datamodule, self.projector_args.reference_graphs))
        if enabled:  # under the steps' autocast, so the first step finds the prefix it would compute
            with self.trainer.precision_plugin.forward_context():
                self.cached_prefix([self.prompt_ids(_probe_example())])

    def training_inputs(self, batch: GraphBatch, graph_embeds: GraphTokens | None = None) -> dict[str, Any]:
        """Right-padded embeddings, mask, position ids and labels (loss on target JSON + EOS only).

        ``graph_embeds`` are the batch's graph tokens when the caller has them already (else computed).
        With the prefix cache the embeddings start after the shared prefix, and the inputs carry the
        read-only cache that holds it (``cache``), a mask covering it and position ids continuing it.
        """
        examples = batch["examples"]
        ids = batch if "prompts" in batch else self.prompt_tokens.batch(examples)  # the data module's loader tokenises
        prompts, targets = ids["prompts"], ids["targets"]
        prefix = self.cached_prefix(prompts)
        skip = prefix.length if prefix is not None else 0
        embeds = embed_token_ids(self._backbone().get_input_embeddings(), [p.ids[skip:] + t for p, t in zip(prompts, targets)])
        if graph_embeds is None:
            graph_embeds = self.graph_embeddings(batch["graph"])
        counts = graph_embeds.counts() if graph_embeds is not None else [0] * len(examples)
        tokens, mask = graph_embeds if graph_embeds is not None else (None, None)
        embeds = insert_graph_tokens(embeds, tokens, [p.graph_slot - skip for p in prompts], mask)
        labels = [sequence_labels(len(p.ids) - skip, t, n, self.device) for p, t, n in zip(prompts, targets, counts)]
        inputs = pad_right(embeds, labels)
        return inputs if prefix is None else attend_to_prefix(inputs, prefix)

    def hidden_states(self, inputs: dict[str, Any]) -> torch.Tensor:
        """Last hidden states of the LLM's decoder for padded inputs (no vocabulary projection)."""
        decoder = self._backbone().get_decoder()
        output = decoder(
            inputs_embeds=inputs["inputs_embeds"],
            attention_mask=inputs["attention_mask"],
            position_ids=inputs["position_ids"],
            cache=inputs.get("cache"),
            use_cache=False,
        )
        return output.last_hidden_state

    def example_losses(self, batch: GraphBatch, graph_embeds: GraphTokens | None = None) -> torch.Tensor:
        """Per-example mean token cross-entropy on the target JSON + EOS: ``(B,)``."""
        inputs = self.training_inputs(batch, graph_embeds)
        return per_example_loss(self.hidden_states(inputs), inputs["labels"], self._backbone().get_output_embeddings())

    def evaluation_losses(self, batch: GraphBatch, graph_embeds: GraphTokens | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-example losses ``(B,)`` on the whole target and on the answer field's tokens alone, from one LLM pass."""
        inputs = self.training_inputs(batch, graph_embeds)
        hidden, head = self.hidden_states(inputs), self._backbone().get_output_embeddings()
        masks = batch["answer_masks"] if "answer_masks" in batch else [answer_token_mask(self.tokenizer, ex) for ex in batch["examples"]]
        return per_example_loss(hidden, inputs["labels"], head), per_example_loss(hidden, answer_labels(inputs["labels"], masks), head)

    def training_step(self, batch: GraphBatch, batch_idx: int) -> torch.Tensor:
        size = len(batch["examples"])
        graph_embeds = self.graph_embeddings(batch["graph"])
        own = self.example_losses(batch, graph_embeds)
        loss = own.mean()
        self.log("train/loss", loss, prog_bar=True, batch_size=size)
        weight, margin = self.optim_args.contrast, self.optim_args.contrast_margin
        if weight > 0 and graph_embeds is not None and size > 1:
            other = self.example_losses(batch, graph_embeds.rolled())
            contrast = torch.relu(margin + own - other).mean()
            self.log("train/graph_contrast", contrast, batch_size=size)
            loss = loss + weight * contrast
        real = torch.cat(graph_embeds.per_example()) if graph_embeds is not None else None
        if real is not None and real.shape[0] and self.embedding_norm:
            ratio = real.detach().float().norm(dim=-1).mean() / self.embedding_norm
            self.log("train/graph_token_norm_ratio", ratio, batch_size=size)
        return loss

    def validation_step(self, batch: GraphBatch, batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: GraphBatch, batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def on_validation_epoch_start(self) -> None:
        self._start_evaluation("val")

    def on_test_epoch_start(self) -> None:
        self._start_evaluation("test")

    def on_validation_epoch_end(self) -> None:
        self._log_graph_reading("val")

    def on_test_epoch_end(self) -> None:
        self._log_graph_reading("test")

    def _start_evaluation(self, stage: str) -> None:
        """Empty the pass's graph tokens and shuffle-gap differences, and say why the gap will not be measured where it will not."""
        self._eval_tokens, self._eval_gaps = [], []
        self._gap_skipped = None
        datamodule = self._trainer.datamodule if self._trainer is not None else None
        examples = getattr(datamodule, "splits", {}).get(EVALUATED_SPLITS[stage], [])
        if not self.diagnostics_args.shuffle_gap:
            self._gap_skipped = "off: model.diagnostics.shuffle_gap: false"
        elif self.encoder is None:
            self._gap_skipped = "readout.tokens is 0: no graph to shuffle"
        elif len(examples) < 2 or not getattr(datamodule, "shuffled_graphs", False):
            self._gap_skipped = f"no data module split of two or more {EVALUATED_SPLITS[stage]} examples to draw other graphs from"

    @property
    def wants_shuffled_graphs(self) -> bool:
        """Whether evaluation batches should also carry their examples with other examples' graphs (``shuffled``, built by
        the data module's loader, :meth:`~qgmem_train.model.datamodule.TrajectoryDataModule.collate`) for the shuffle gap."""
        return bool(self.diagnostics_args.shuffle_gap) and self.encoder is not None

    def _shuffle_differences(self, batch: GraphBatch, whole: torch.Tensor, answer: torch.Tensor) -> list[tuple[str, float, float]]:
        """Each example's conversation and its losses on the whole target and on the answer span with its donor's graph
        (``batch["shuffled"]``) minus those with its own (``whole``, ``answer``), from one more loss pass."""
        shuffled_whole, shuffled_answer = self.evaluation_losses(batch["shuffled"])
        cases = [ex.case_id for ex in batch["examples"]]
        return list(zip(cases, (shuffled_whole - whole).float().tolist(), (shuffled_answer - answer).float().tolist()))

    def _log_graph_reading(self, stage: str) -> None:
        """Log whether the pass's graphs are read: the shuffle gap and how much the graph tokens vary with the question
        (:mod:`qgmem_train.graph.shuffle_gap`, :mod:`qgmem_train.graph.diagnostics`); keep a validation's as :attr:`graph_reading`.

        On several ranks the tokens and differences of all ranks are gathered first: the figures are the split's, and every
        rank logs the same names (a rank with fewer than two questions would otherwise log none, and the ranks' syncs would
        not pair).
        """
        tokens, gaps = self._eval_tokens, self._eval_gaps
        if self._trainer is not None and self._trainer.world_size > 1:
            gathered: list[Any] = [None] * self._trainer.world_size
            torch.distributed.all_gather_object(gathered, (tokens, gaps))
            tokens = [t for part, _ in gathered for t in part]
            gaps = [d for _, part in gathered for d in part]
        diagnostics = graph_token_diagnostics(tokens)
        for name, value in diagnostics.items():
            self.log(f"{stage}/graph_token_{name}", value, sync_dist=True)
        tokens_read = {f"token_{name}": value for name, value in diagnostics.items()} | {"step": self.global_step}
        reading = {"skipped": self._gap_skipped, **tokens_read} if self._gap_skipped else None
        if gaps:
            cases, whole, answer = (list(column) for column in zip(*gaps))
            reading = {**shuffle_gap_summary(cases, whole, answer), **tokens_read, "floor": self.diagnostics_args.shuffle_floor}
            self.log(f"{stage}/graph_shuffle_gap", reading["shuffle_gap"], sync_dist=True)
            if reading["answer_shuffle_gap"] is not None:
                self.log(f"{stage}/graph_shuffle_gap_answer", reading["answer_shuffle_gap"], sync_dist=True)
        if stage == "val" and reading is not None and not self.trainer.sanity_checking:
            self.graph_reading = reading
        self._eval_tokens, self._eval_gaps = [], []

    def _evaluate(self, batch: GraphBatch, stage: str) -> None:
        """Log the split's loss on the whole target and on the answer field alone and, with ``val_generate``, its answer scores.

        The graph tokens, and each example's shuffle gap, are kept for the pass's diagnostics. Every logged value is a mean over the split's examples, each
        counted once (see :meth:`_log_split_mean`), kept in tensors on the module's device so that NCCL can reduce them.
        """
        graph_embeds = self.graph_embeddings(batch["graph"])
        if graph_embeds is not None:
            self._eval_tokens += [t.detach().cpu() for t in graph_embeds.per_example()]
        whole, answer = self.evaluation_losses(batch, graph_embeds)
        if "shuffled" in batch:
            self._eval_gaps += self._shuffle_differences(batch, whole.detach(), answer.detach())
        self._log_split_mean(f"{stage}/loss", whole.detach(), prog_bar=True)
        self._log_split_mean(f"{stage}/answer_loss", answer.detach())
        if not self.generation_args.val_generate:
            return
        records = self.predict_step(batch, 0)
        for name, key in ANSWER_METRICS.items():
            self._log_split_mean(f"{stage}/{name}", torch.tensor([float(r[key]) for r in records], device=self.device))

    def _log_split_mean(self, name: str, values: torch.Tensor, prog_bar: bool = False) -> None:
        """Log the mean of ``values`` over the split, each example once whatever the ranks' shares.

        A torchmetrics mean sums values and counts across ranks at the epoch's end; Lightning's own ``sync_dist``
        mean divides an integer count by the ranks, which is wrong as soon as the ranks validate unequal shares.
        """
        from torchmetrics import MeanMetric

        means = self.__dict__.setdefault("_split_means", {})
        if name not in means:
            means[name] = MeanMetric(nan_strategy="disable").to(self.device)  # a NaN loss shows; no host sync a step
        means[name].update(values.float())
        self.log(name, means[name], prog_bar=prog_bar, on_step=False, on_epoch=True, batch_size=len(values), metric_attribute=f"_split_means.{name}")

    def answer_schema(self) -> dict[str, Any]:
        """The answer JSON schema under the text path's string cap for ``max_new_tokens`` (:mod:`qgmem_train.answer.capped`)."""
        return capped_answer_schema(self.generation_args.max_new_tokens)

    @torch.no_grad()
    def generate(self, examples: list[TrajectoryExample], graph: Batch, prompts: list[PromptIds] | None = None) -> list[str]:
        """Greedy final-answer generations for a batch (left padded) under the answer JSON schema.

        Decoding starts from ``inputs_embeds`` (the graph tokens have no token ids) and every step is
        masked by the same llguidance JSON-schema constraint as the text path's answers. With the prefix
        cache, decoding starts from the cached prefix and only the rest of each prompt is prefilled. ``prompts``: the
        examples' prompt ids when the batch carries them (else tokenised here).
        """
        from qgmem_train.llm.local import JsonSchemaConstraint

        llm = self._backbone()
        prompts = prompts or [self.prompt_ids(ex) for ex in examples]
        prefix = self.cached_prefix(prompts)
        skip = prefix.length if prefix is not None else 0
        embeds = embed_token_ids(llm.get_input_embeddings(), [p.ids[skip:] for p in prompts])
        tokens, mask = self.graph_embeddings(graph) or (None, None)
        inputs = pad_left(insert_graph_tokens(embeds, tokens, [p.graph_slot - skip for p in prompts], mask))
        cache = {}
        if prefix is not None:
            inputs = generate_after_prefix(inputs, prefix)
            cache = {"cache": prefix.for_generation(len(examples))}
        if self._constraint is None:
            self._constraint = JsonSchemaConstraint(self.tokenizer, int(llm.get_output_embeddings().weight.shape[0]))
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        output = llm.generate(
            inputs_embeds=inputs["inputs_embeds"],
            attention_mask=inputs["attention_mask"],
            **cache,
            max_new_tokens=self.generation_args.max_new_tokens,
            do_sample=False,
            pad_token_id=pad_id,
            eos_token_id=self.tokenizer.eos_token_id,
            logits_processor=[self._constraint.processor(self.answer_schema(), len(examples))],
        )
        return [text.strip() for text in self.tokenizer.batch_decode(output, skip_special_tokens=True)]

    def predict_step(self, batch: GraphBatch, batch_idx: int, dataloader_idx: int = 0) -> list[dict[str, Any]]:
        """One record per example: ids, question, generated text, parsed answer, validity, EM, F1 and BLEU-1.

        An output that is not a valid answer JSON scores 0 on every answer metric.
        """
        examples = batch["examples"]
        records = []
        for example, text in zip(examples, self.generate(examples, batch["graph"], batch.get("prompts"))):
            parsed = parse_answer(text)
            scores = answer_scores(parsed.answer, example.answer) if parsed else {"exact_match": 0.0, "f1": 0.0, "bleu1": 0.0}
            records.append(
                {
                    "case_id": example.case_id,
                    "question_id": example.question_id,
                    "question": example.question,
                    "generated": text,
                    "answer": parsed.answer if parsed else None,
                    "reasoning_path": parsed.reasoning_path if parsed else None,
                    "valid_json": parsed is not None,
                    **scores,
                    "reference_answer": example.answer,
                }
            )
        return records

    def configure_optimizers(self) -> Any:
        """AdamW over the trainable parameters with warm-up and cosine decay sized from the run's optimizer steps."""
        params = [p for p in self.parameters() if p.requires_grad]
        if not params:
            raise InputError("model", "nothing to train: readout.tokens is 0 and lora.r is 0 (validate/test/predict still work)")
        hp = self.optim_args
        optimizer = torch.optim.AdamW(params, lr=hp.learning_rate, weight_decay=hp.weight_decay)
        try:
            multiplier = warmup_cosine(self.trainer.estimated_stepping_batches, hp.warmup_fraction, hp.min_lr_ratio)
        except ValueError as exc:
            raise InputError("model.optim.warmup_fraction", str(exc)) from None
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, multiplier)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    def checkpoint_metadata(self) -> dict[str, Any]:
        """Base model id, revision and fingerprint, plus the hash of every setting that shapes or feeds the trainable parameters
        (under their flat names, :func:`~qgmem_train.model.settings.flat_settings`: checkpoints of any version hash alike)."""
        shape_keys = (
            "llm", "llm_revision", "dtype", "quantization", "feature_dim", "graph_tokens", "graph_readout", "graph_center", "text_path", "gnn_hidden",
            "gnn_layers", "gnn_heads", "reverse_edges", "projector_hidden", "projector_norm", "lora_r", "lora_alpha",
            "lora_target_modules",
        )  # fmt: skip
        flat = flat_settings(self.hparams)
        settings = {key: flat[key] for key in shape_keys}
        return {
            "base_model": self.hparams.llm,
            "revision": self.hparams.llm_revision,
            "backbone": self.backbone_fingerprint,
            "config_hash": config_hash(settings),
            "settings": settings,
        }

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Keep only trainable parameters and record what they belong to, and whether the last validation found them read."""
        checkpoint["state_dict"] = trainable_state_dict(self)
        checkpoint[METADATA_KEY] = {**self.checkpoint_metadata(), "graph_reading": self.graph_reading, "init_from": self.init_record}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Refuse a checkpoint of another base model, revision, backbone files, configuration or parameter set; take its
        graph reading (a resumed fit that ends before its next validation still says it) and where its graph path started."""
        check_compatible(
            checkpoint.get(METADATA_KEY),
            self.checkpoint_metadata(),
            set(checkpoint.get("state_dict", {})),
            set(trainable_state_dict(self)),
            "checkpoint",
        )
        self.graph_reading = checkpoint[METADATA_KEY].get("graph_reading")
        self.init_record = checkpoint[METADATA_KEY].get("init_from")


def flat_parameters() -> list[tuple[str, Any, Any]]:
    """``(flat name, type, default)`` of every :class:`GraphAugmentedLM` setting, the default ``inspect.Parameter.empty``
    when required: the record an export's ``module`` section (and a checkpoint of before the grouping) holds."""
    hints = typing.get_type_hints(GraphAugmentedLM.__init__)
    parameters = []
    for p in inspect.signature(GraphAugmentedLM.__init__).parameters.values():
        if p.name in GROUPS:
            fields = {f.name: f for f in dataclasses.fields(GROUPS[p.name])}
            field_hints = typing.get_type_hints(GROUPS[p.name])
            parameters += [(flat, field_hints[f], fields[f].default) for flat, (g, f) in FLAT_NAMES.items() if g == p.name]
        elif p.name != "self":
            parameters.append((p.name, hints[p.name], p.default))
    return parameters


def reference_graphs(datamodule: Any, count: int) -> Batch:
    """A seeded sample of ``count`` training examples' local graphs that have an edge, collated (same on every rank)."""
    examples = [ex for ex in getattr(datamodule, "splits", {}).get("train", []) if ex.graph.edge_labels]
    if len(examples) < 2:
        raise InputError("model.projector.center", "reference centering needs the trajectory data module and two training graphs with an edge")
    picked = random.Random(0).sample(examples, min(count, len(examples)))
    return datamodule.collate(picked)["graph"]


def _refuse_sharding(strategy: Any) -> None:
    """Sharded strategies are not supported: the backbone is frozen whole on each GPU (use DDP, 4-bit for large ones)."""
    from lightning.pytorch.strategies import DeepSpeedStrategy, FSDPStrategy, ModelParallelStrategy

    if isinstance(strategy, (FSDPStrategy, DeepSpeedStrategy, ModelParallelStrategy)):
        raise InputError(
            "trainer.strategy",
            f"{type(strategy).__name__} is not supported: the frozen LLM is loaded whole on every GPU; use ddp, and "
            "pipeline.models.quantization: 4bit for a backbone larger than one GPU",
        )


def _load_frozen_llm(ref: str, revision: str | None, dtype: str, quantization: str, cache_dir: str | None, trust_remote_code: bool, device: str) -> Any:
    """Load the causal LM on ``device`` with every weight frozen."""
    from qgmem_train.llm.resolver import load_causal_lm

    if quantization != "none" and not device.startswith("cuda"):
        raise InputError("model.quantization", f"{quantization} (bitsandbytes NF4/int8) needs CUDA; this process runs on {device}: set it to none")
    model, _ = load_causal_lm(
        ref, revision=revision, dtype=dtype, device=device, quantization=quantization, cache_dir=cache_dir, trust_remote_code=trust_remote_code
    )
    model.requires_grad_(False)
    model.eval()
    return model


def _probe_example() -> TrajectoryExample:
    """A question with nothing around it: its prompt has the same prefix as every example's (the prefix ends before the user content)."""
    return TrajectoryExample(
        case_id="", question_id="", source_dataset="", namespace="", question="?", question_time="", context="", answer="", reasoning_path=""
    )


def _keep_read_only_cache_when_checkpointing(llm: Any) -> None:
    """Let checkpointed decoder layers keep the prefix cache in training (transformers drops a layer's cache there by default).

    The prefix cache is read-only (:class:`~qgmem_train.model.prefix_cache.ReadOnlyPrefixCache`), so a
    layer that runs again in backward reads the same keys and values: the case transformers'
    ``_can_checkpoint_with_cache`` flag is for.
    """
    for layer in llm.get_decoder().layers:
        layer._can_checkpoint_with_cache = True


def lora_config(rank: int, alpha: int, target_modules: list[str] | None) -> Any:
    """peft's LoRA settings of the module (no dropout: the backbone stays in eval mode; default ``q_proj``, ``v_proj``)."""
    from peft import LoraConfig

    targets = target_modules or ["q_proj", "v_proj"]
    return LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM")


def _add_lora(model: Any, settings: LoraArgs) -> Any:
    """Wrap the frozen LLM with peft LoRA adapters (:func:`lora_config`)."""
    from peft import get_peft_model

    return get_peft_model(model, lora_config(settings.r, settings.alpha, settings.target_modules))
