"""Graph-text fusion helpers (paper III-C3): token ids, embedding lookup, graph-token splicing, padding.

Layout of one sequence: ``[template header .. first user header][g_1..g_T][user content .. assistant
header][target + EOS]``: the T graph tokens ``g`` open the first user message's content, so no chat
template (ChatML for Qwen3 and SmolLM2, Llama 3.1's header tokens) ever has a role header split by
them, and every prompt token keeps its relative order. The slot is found per prompt, because system
prompts and templates differ in length. Training pads on the right, generation on the left; position
ids always count real tokens only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.utils.rnn import pad_sequence

from qgmem_train.config import TEMPLATE_BUDGET_S
from qgmem_train.llm.base import Chat, render_chat

IGNORE_INDEX = -100
"""Label of positions that carry no loss (prompt, graph tokens, padding)."""


@dataclass
class PromptIds:
    """A templated prompt's token ids and the index where graph tokens go (the first user content token).

    Not frozen: collated batches carry it, and Lightning rebuilds every dataclass of a batch it moves to the device.
    """

    ids: list[int]
    graph_slot: int


def chat_prompt_ids(tokenizer: Any, chat: Chat, template_budget_s: float = TEMPLATE_BUDGET_S) -> PromptIds:
    """Token ids of ``chat`` under the model's chat template, ending with the assistant header.

    The rendered text is tokenized in two pieces, split where the first user message's content
    starts, so that a token boundary (the graph slot) always falls there, in training and generation
    alike. ``enable_thinking=False`` asks Qwen3's template for an answer without a thinking block;
    templates that do not know the flag ignore it. The template's own special tokens (BOS included)
    are kept, and the tokenizer adds none on top. The template renders within ``template_budget_s`` seconds.
    """
    text = render_chat(tokenizer, chat, template_budget_s)
    split = user_content_start(text, chat)
    head = tokenizer(text[:split], add_special_tokens=False)["input_ids"]
    tail = tokenizer(text[split:], add_special_tokens=False)["input_ids"]
    return PromptIds(ids=head + tail, graph_slot=len(head))


def user_content_start(text: str, chat: Chat) -> int:
    """Character offset in the rendered ``text`` where the first user message's content begins.

    Messages are located in order (templates such as Llama 3.1's trim surrounding whitespace, so the
    stripped content is searched); a template that rewrites the content itself is refused.
    """
    position = 0
    for message in chat:
        content = message["content"].strip()
        found = text.find(content, position)
        if found < 0:
            raise ValueError(f"the chat template does not keep the {message['role']} message verbatim; cannot place graph tokens")
        if message["role"] == "user":
            return found
        position = found + len(content)
    raise ValueError("the chat has no user message; graph tokens open the first user message")


def target_ids(tokenizer: Any, target: str) -> list[int]:
    """Token ids of the target text followed by the model's EOS (end-of-turn for chat models)."""
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer defines no eos_token; the target needs one to learn to stop")
    return tokenizer(target, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]


def truncate_to_tokens(tokenizer: Any, text: str, max_tokens: int | None) -> str:
    """``text`` cut to its first ``max_tokens`` tokens (unchanged when ``None`` or already short enough)."""
    if max_tokens is None:
        return text
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return text if len(ids) <= max_tokens else tokenizer.decode(ids[:max_tokens])


def embed_token_ids(embedding: torch.nn.Module, sequences: Sequence[Sequence[int]]) -> list[torch.Tensor]:
    """Look up every sequence with one call of the LLM's input embedding; one ``(len_i, H)`` tensor each."""
    weight = next(embedding.parameters())
    flat = torch.tensor([t for seq in sequences for t in seq], dtype=torch.long, device=weight.device)
    return list(torch.split(embedding(flat), [len(seq) for seq in sequences]))


def insert_graph_tokens(
    token_embeds: Sequence[torch.Tensor], graph_embeds: torch.Tensor | None, slots: Sequence[int], graph_mask: torch.Tensor | None = None
) -> list[torch.Tensor]:
    """Splice each sample's ``(T, H)`` graph tokens in at its slot; unchanged when ``None``.

    With ``graph_mask`` ``(B, T)`` (a readout whose token count varies per sample) only a sample's real tokens
    (mask 1) are spliced in: a masked graph token never reaches the LLM, so the padding of :func:`pad_right` and
    :func:`pad_left` masks it from attention and position ids count real tokens only, as in a one-sample pass.
    Graph tokens are cast to the LLM embedding dtype (bf16 backbones) so the concatenation is uniform.
    """
    if graph_embeds is None or graph_embeds.shape[1] == 0:
        return list(token_embeds)
    rows = list(graph_embeds) if graph_mask is None else [graph[keep.bool()] for graph, keep in zip(graph_embeds, graph_mask)]
    return [torch.cat([seq[:slot], graph.to(seq.dtype), seq[slot:]]) for seq, graph, slot in zip(token_embeds, rows, slots)]


def pad_right(embeds: Sequence[torch.Tensor], labels: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Right-padded ``inputs_embeds``, ``attention_mask``, ``position_ids`` and ``labels`` for training.

    Padding rows are zeros with mask 0 and label :data:`IGNORE_INDEX`; position ids are ``0..len-1``
    for every sample, which equals a one-sample forward pass.
    """
    inputs = pad_sequence(list(embeds), batch_first=True)
    lengths = torch.tensor([len(e) for e in embeds], device=inputs.device)
    positions = torch.arange(inputs.shape[1], device=inputs.device).expand(len(embeds), -1)
    mask = (positions < lengths[:, None]).long()
    padded_labels = pad_sequence(list(labels), batch_first=True, padding_value=IGNORE_INDEX)
    return {"inputs_embeds": inputs, "attention_mask": mask, "position_ids": positions.clone(), "labels": padded_labels}


def pad_left(embeds: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Left-padded ``inputs_embeds``, ``attention_mask`` and ``position_ids`` for batched generation.

    Real tokens end at the last column so every sample's next token is generated in the same step;
    position ids start at 0 on each sample's first real token (padding gets 0 too, and is masked).
    """
    inputs = pad_sequence(list(embeds), batch_first=True, padding_side="left")
    lengths = torch.tensor([len(e) for e in embeds], device=inputs.device)
    columns = torch.arange(inputs.shape[1], device=inputs.device).expand(len(embeds), -1)
    mask = (columns >= (inputs.shape[1] - lengths)[:, None]).long()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return {"inputs_embeds": inputs, "attention_mask": mask, "position_ids": positions}


def sequence_labels(prompt_length: int, target: Sequence[int], graph_tokens: int, device: torch.device) -> torch.Tensor:
    """Labels of one spliced sequence: :data:`IGNORE_INDEX` over prompt and graph tokens, then the target ids."""
    ignored = torch.full((prompt_length + graph_tokens,), IGNORE_INDEX, dtype=torch.long, device=device)
    return torch.cat([ignored, torch.tensor(list(target), dtype=torch.long, device=device)])


def per_example_loss(hidden: torch.Tensor, labels: torch.Tensor, output_head: torch.nn.Module) -> torch.Tensor:
    """Mean next-token cross-entropy per example over labelled positions: ``(B,)``.

    Only labelled positions go through ``output_head`` (the LLM's ``lm_head``), so the vocabulary-wide
    logits of long prompts are never materialised. Model-dependent: backbones that post-process logits
    inside their causal-LM forward (e.g. soft-capping) would need that step here too; Llama, Qwen and
    SmolLM2 do not. Each example weighs the same whatever its target length, so the mean over a batch
    split across DDP processes equals the mean over the whole batch.
    """
    shifted = labels[:, 1:]
    picked = shifted != IGNORE_INDEX
    logits = output_head(hidden[:, :-1][picked]).float()
    token_loss = torch.nn.functional.cross_entropy(logits, shifted[picked], reduction="none")
    rows = picked.nonzero()[:, 0]
    totals = torch.zeros(labels.shape[0], dtype=token_loss.dtype, device=token_loss.device).index_add(0, rows, token_loss)
    return totals / picked.sum(-1).clamp(min=1)
