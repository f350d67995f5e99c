"""The answer-span loss: only the answer field's tokens count (checked on a hand-built target)."""

from __future__ import annotations

import torch

from qgmem_train.config import BUNDLED_LLM
from qgmem_train.model.answer_target import answer_labels, answer_token_mask
from qgmem_train.model.backbone import describe_backbone
from qgmem_train.model.fusion import IGNORE_INDEX, per_example_loss, sequence_labels, target_ids
from qgmem_train.trajectory import TrajectoryExample


def example(answer: str, reasoning: str) -> TrajectoryExample:
    return TrajectoryExample(
        case_id="c", question_id="q", source_dataset="test", namespace="n", question="Where did Alice move?", question_time="",
        context="", answer=answer, reasoning_path=reasoning,
    )


def test_answer_span_holds_the_answer_value_only() -> None:
    tokenizer = describe_backbone(BUNDLED_LLM, None, None, False).tokenizer
    # the answer's words also occur in the reasoning path: only the answer field's copy counts
    ex = example("Paris, in 2021", 'Alice moved to Paris, in 2021 [F1]; "answer" is Paris')
    ids = target_ids(tokenizer, ex.target_json())
    mask = answer_token_mask(tokenizer, ex)
    assert len(mask) == len(ids) and mask[-1] is False, "EOS is not the answer"
    picked = [i for i, m in zip(ids, mask) if m]
    assert tokenizer.decode(picked).strip().strip('"') == "Paris, in 2021"
    first = mask.index(True)
    assert tokenizer.decode(ids[:first]).rstrip(' "').endswith('"answer":'), "the span starts at the answer's value"
    assert all(mask[first : first + len(picked)]) and not any(mask[first + len(picked) :]), "one contiguous span"


def test_answer_loss_averages_only_the_answer_tokens() -> None:
    tokenizer = describe_backbone(BUNDLED_LLM, None, None, False).tokenizer
    examples = [example("Paris", "Alice moved to Paris [F1]"), example("the bakery on Main Street", "[F2] says so")]
    targets = [target_ids(tokenizer, ex.target_json()) for ex in examples]
    prompt = 5
    rows = [sequence_labels(prompt, t, 2, torch.device("cpu")) for t in targets]
    labels = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=IGNORE_INDEX)
    masks = [answer_token_mask(tokenizer, ex) for ex in examples]
    only = answer_labels(labels, masks)
    assert [int((r != IGNORE_INDEX).sum()) for r in only] == [sum(m) for m in masks] and 0 < sum(masks[0]) < len(targets[0])

    torch.manual_seed(0)
    vocab, width = len(tokenizer), 8
    head = torch.nn.Linear(width, vocab, bias=False)
    hidden = torch.randn(labels.shape[0], labels.shape[1], width)
    got = per_example_loss(hidden, only, head)
    for b, (target, mask) in enumerate(zip(targets, masks)):
        # position p predicts label p + 1: the target's token j sits at prompt + 2 graph tokens + j
        losses = [
            torch.nn.functional.cross_entropy(head(hidden[b, prompt + 2 + j - 1])[None], torch.tensor([tok]))
            for j, (tok, m) in enumerate(zip(target, mask)) if m
        ]  # fmt: skip
        assert torch.allclose(got[b], torch.stack(losses).mean(), atol=1e-5)
    assert not torch.allclose(got, per_example_loss(hidden, labels, head)), "the whole-target loss differs"
