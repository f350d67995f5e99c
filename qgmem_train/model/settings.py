"""The graph-augmented LM's settings in the groups users think in, and the flat names they had before.

Each group is a frozen dataclass: one key each in YAML and on the command line (``model.encoder.hidden_dim``,
``--model.encoder.hidden_dim``), listed by group in LightningCLI's help. Checkpoints written before the grouping hold
the settings flat (``gnn_hidden``): :func:`grouped_hparams` reads them. Exports and the checkpoints' compatibility
record keep the flat names (:func:`flat_settings`), so their format and hashes are unchanged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from qgmem_train.errors import InputError
from qgmem_train.graph.shuffle_gap import DEFAULT_FLOOR


@dataclass(frozen=True)
class EncoderArgs:
    """Graph encoder: the relation-aware message passing over each question's local graph.

    Args:
        hidden_dim: hidden width of the graph encoder.
        layers: message-passing layers; 0 pools the embedder's frozen node features as they are (no message passing).
        heads: attention heads per TransformerConv layer.
        dropout: attention dropout of the graph encoder.
        reverse_edges: also pass messages object → subject, with an inverse-relation feature.
    """

    hidden_dim: int = 1024
    layers: int = 3
    heads: int = 4
    dropout: float = 0.0
    reverse_edges: bool = True


@dataclass(frozen=True)
class ReadoutArgs:
    """Graph readout: how the encoder's node states become graph tokens (:mod:`qgmem_train.graph.readout`).

    Args:
        tokens: number T of graph tokens (the ``edges`` readout: at most T); 0 runs the same prompt with no graph (the
            paper's ablation).
        kind: ``mean`` (the paper's mean pool), ``edges`` (one token per edge in the text path's fact order, at most T,
            masked in a batch) or ``query`` (T attention pools queried by the question's embedding).
    """

    tokens: int = 1
    kind: Literal["mean", "edges", "query"] = "mean"


@dataclass(frozen=True)
class ProjectorArgs:
    """Projector: the MLP from readout vectors to the LLM's input embeddings, optionally centred on reference graphs.

    Args:
        hidden_dim: hidden width of the projector MLP; 0 makes the projector one linear layer.
        norm: layer-normalise graph tokens to the mean norm of the LLM's input embeddings (learned scale).
        center: ``none`` (the paper's projector) or ``reference``: each graph token is a learned prompt plus the graph's
            deviation from the mean of ``reference_graphs`` training graphs re-encoded at every step, scaled to
            ``center_share`` of the prompt's RMS, so the tokens cannot collapse into a soft prompt
            (:mod:`qgmem_train.graph.centered_projector`).
        reference_graphs: training graphs (with at least one edge, a seeded sample) the centering is computed over.
        center_share: RMS of the graph part relative to the learned prompt's.
    """

    hidden_dim: int = 2048
    norm: bool = True
    center: Literal["none", "reference"] = "none"
    reference_graphs: int = 32
    center_share: float = 1.0


@dataclass(frozen=True)
class LoraArgs:
    """LoRA adapters on the frozen LLM.

    Args:
        r: LoRA rank (0: no LoRA, the LLM is fully frozen).
        alpha: LoRA scaling numerator.
        target_modules: modules LoRA wraps (default ``q_proj``, ``v_proj``).
    """

    r: int = 0
    alpha: int = 16
    target_modules: list[str] | None = None


@dataclass(frozen=True)
class OptimArgs:
    """Optimisation: AdamW with linear warm-up and cosine decay, and the optional graph-contrast loss term.

    Args:
        learning_rate: AdamW peak learning rate.
        weight_decay: AdamW weight decay.
        warmup_fraction: share of the run's optimizer steps spent warming up linearly to the peak rate.
        min_lr_ratio: the cosine decay ends at this fraction of the peak rate.
        contrast: weight of a training term that asks each question's target loss to be ``contrast_margin`` below its
            loss with the previous batch example's graph tokens (a hinge; 0: off, the paper's loss). The shared part of
            the tokens cancels in that difference, so only what differs between graphs can lower it.
        contrast_margin: the hinge's margin in nats.
    """

    learning_rate: float = 1e-4
    weight_decay: float = 0.05
    warmup_fraction: float = 0.05
    min_lr_ratio: float = 0.1
    contrast: float = 0.0
    contrast_margin: float = 0.1


@dataclass(frozen=True)
class PromptArgs:
    """Prompt: what the LLM reads besides the graph tokens.

    Args:
        max_context_tokens: cut the serialized working memory to this many tokens (None: keep all).
        text_path: append the local graph to the prompt as labelled facts (API backbones; use with ``readout.tokens: 0``).
    """

    max_context_tokens: int | None = None
    text_path: bool = False


@dataclass(frozen=True)
class GenerationArgs:
    """Generation: answers in validation, test and predict.

    Args:
        max_new_tokens: generation budget (answers are schema-constrained to fit it).
        val_generate: generate answers in validation/test to report valid-JSON rate, exact match, F1 and BLEU-1.
    """

    max_new_tokens: int = 256
    val_generate: bool = True


@dataclass(frozen=True)
class DiagnosticsArgs:
    """Diagnostics: whether the model reads its graphs (:mod:`qgmem_train.graph.shuffle_gap`).

    Args:
        shuffle_gap: in validation and test, also score each example with another example's graph (another question of
            its conversation where there is one) and log the mean loss difference as ``val/graph_shuffle_gap``; costs one
            more loss pass per batch (false: off).
        shuffle_floor: nats a token that the shuffle gap's whole 95% interval must clear for fit's last line to say the
            model reads its graphs, or stay under to say it reads nothing.
    """

    shuffle_gap: bool = True
    shuffle_floor: float = DEFAULT_FLOOR


GROUPS: dict[str, type] = {
    "encoder": EncoderArgs,
    "readout": ReadoutArgs,
    "projector": ProjectorArgs,
    "lora": LoraArgs,
    "optim": OptimArgs,
    "prompt": PromptArgs,
    "generation": GenerationArgs,
    "diagnostics": DiagnosticsArgs,
}
"""The module's setting groups by argument name."""

FLAT_NAMES: dict[str, tuple[str, str]] = {
    "graph_tokens": ("readout", "tokens"),
    "graph_readout": ("readout", "kind"),
    "graph_contrast": ("optim", "contrast"),
    "graph_contrast_margin": ("optim", "contrast_margin"),
    "graph_center": ("projector", "center"),
    "graph_reference_graphs": ("projector", "reference_graphs"),
    "graph_center_share": ("projector", "center_share"),
    "text_path": ("prompt", "text_path"),
    "gnn_hidden": ("encoder", "hidden_dim"),
    "gnn_layers": ("encoder", "layers"),
    "gnn_heads": ("encoder", "heads"),
    "gnn_dropout": ("encoder", "dropout"),
    "reverse_edges": ("encoder", "reverse_edges"),
    "projector_hidden": ("projector", "hidden_dim"),
    "projector_norm": ("projector", "norm"),
    "lora_r": ("lora", "r"),
    "lora_alpha": ("lora", "alpha"),
    "lora_target_modules": ("lora", "target_modules"),
    "learning_rate": ("optim", "learning_rate"),
    "weight_decay": ("optim", "weight_decay"),
    "warmup_fraction": ("optim", "warmup_fraction"),
    "min_lr_ratio": ("optim", "min_lr_ratio"),
    "max_context_tokens": ("prompt", "max_context_tokens"),
    "max_new_tokens": ("generation", "max_new_tokens"),
    "val_generate": ("generation", "val_generate"),
    "graph_shuffle_gap": ("diagnostics", "shuffle_gap"),
    "graph_shuffle_floor": ("diagnostics", "shuffle_floor"),
}
"""Each grouped setting's flat name (checkpoints before the grouping, exports, the compatibility record) → group, field."""

Group = TypeVar("Group")


def new_key(flat_name: str) -> str:
    """The grouped key (``encoder.hidden_dim``) of a setting's flat name (``gnn_hidden``)."""
    group, field = FLAT_NAMES[flat_name]
    return f"{group}.{field}"


def as_group(cls: type[Group], value: Group | Mapping[str, Any], where: str) -> Group:
    """``value`` as the group dataclass ``cls``: itself, or built from a mapping of its fields (checkpoints hold plain
    mappings); an unknown field is an :class:`InputError` at ``where``."""
    if isinstance(value, cls):
        return value
    if not isinstance(value, Mapping):
        raise InputError(where, f"expected the settings of {cls.__name__}, not {type(value).__name__}")
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    unknown = sorted(set(value) - set(names))
    if unknown:
        raise InputError(f"{where}.{unknown[0]}", f"unknown setting (one of {', '.join(names)})")
    return cls(**value)


def grouped_hparams(saved: Mapping[str, Any]) -> dict[str, Any]:
    """The module's arguments from saved hyperparameters, flat (written before the grouping) or grouped; groups come
    back as mappings of their fields."""
    grouped = {key: (dict(value) if key in GROUPS and isinstance(value, Mapping) else value) for key, value in saved.items() if key not in FLAT_NAMES}
    for flat, (group, field) in FLAT_NAMES.items():
        if flat in saved:
            grouped[group] = {**grouped.get(group, {}), field: saved[flat]}
    return grouped


def flat_settings(hparams: Mapping[str, Any]) -> dict[str, Any]:
    """Every setting of grouped hyperparameters (groups as dataclasses or mappings; a missing one at its defaults)
    under its flat name: the record exports and checkpoints' compatibility hashes are written in."""
    groups = {name: dataclasses.asdict(as_group(cls, hparams.get(name, cls()), f"model.{name}")) for name, cls in GROUPS.items()}
    flat = {key: value for key, value in hparams.items() if key not in GROUPS}
    flat.update({name: groups[group][field] for name, (group, field) in FLAT_NAMES.items()})
    return flat


def merge_settings(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The module arguments ``base`` with ``overrides``; a group given as a mapping in both updates the base's field by
    field (``{"encoder": {"layers": 1}}`` keeps the base's other encoder settings)."""
    merged = dict(base)
    for key, value in overrides.items():
        old = merged.get(key)
        merged[key] = {**old, **value} if key in GROUPS and isinstance(old, Mapping) and isinstance(value, Mapping) else value
    return merged
