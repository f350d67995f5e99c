"""The answer field's tokens in a training target, for a loss on the answer alone (the reasoning path is formulaic).

The target is ``{"reasoning_path": ..., "answer": ...}`` (:meth:`TrajectoryExample.target_json`) plus EOS; the answer
span is the tokens whose characters overlap the answer string's value (between its quotes).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import torch

from qgmem_train.model.fusion import IGNORE_INDEX
from qgmem_train.trajectory import TrajectoryExample


def answer_value_span(example: TrajectoryExample) -> tuple[int, int]:
    """Character ``[start, end)`` of the answer's JSON-escaped value inside ``example.target_json()``."""
    head = json.dumps({"reasoning_path": example.reasoning_path, "answer": ""}, ensure_ascii=False)[: -len('""}')]
    value = json.dumps(example.answer, ensure_ascii=False)
    if head + value + "}" != example.target_json():
        raise ValueError("the target JSON's layout changed: the answer is no longer its last field")
    return len(head) + 1, len(head) + len(value) - 1


def answer_token_mask(tokenizer: Any, example: TrajectoryExample) -> list[bool]:
    """One flag per target token (:func:`qgmem_train.model.fusion.target_ids`, EOS last): whether it overlaps the answer value."""
    start, end = answer_value_span(example)
    encoded = tokenizer(example.target_json(), add_special_tokens=False, return_offsets_mapping=True)
    return [a < end and b > start for a, b in encoded["offset_mapping"]] + [False]


def answer_labels(labels: torch.Tensor, masks: Sequence[Sequence[bool]]) -> torch.Tensor:
    """``labels`` with every target token outside the answer span set to :data:`IGNORE_INDEX`.

    A row's labelled positions are its target tokens in order (prompt, graph tokens and padding are ignored already).
    """
    out = labels.clone()
    for row, mask in zip(out, masks):
        positions = (row != IGNORE_INDEX).nonzero()[:, 0]
        if len(positions) != len(mask):
            raise ValueError(f"{len(positions)} labelled positions, {len(mask)} target-token flags")
        keep = torch.tensor(list(mask), dtype=torch.bool, device=row.device)
        row[positions[~keep]] = IGNORE_INDEX
    return out
