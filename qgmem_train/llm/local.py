"""Local transformers backend: greedy batched chat generation, JSON-schema constrained decoding, yes/no scoring."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

from qgmem_train.config import TEMPLATE_BUDGET_S
from qgmem_train.errors import ModelUnavailableError
from qgmem_train.llm.base import Chat, ChatLLM, render_chat, require_chat_template
from qgmem_train.llm.resolver import load_causal_lm

JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
"""Compact JSON with the spacing chat models usually write; free whitespace lets a small model pad forever."""


class JsonSchemaLogitsProcessor(LogitsProcessor):
    """Masks every token that would leave a JSON schema's grammar; one llguidance matcher per batch row.

    Rows that finished (or whose matcher failed) may only emit EOS, which ``generate`` then pads.
    """

    def __init__(self, ll_tokenizer: Any, grammar: str, batch_size: int, vocab_size: int, eos_token_id: int) -> None:
        from llguidance import LLMatcher
        from llguidance.torch import allocate_token_bitmask

        self.matchers = [LLMatcher(ll_tokenizer, grammar, log_level=0) for _ in range(batch_size)]
        errors = {m.get_error() for m in self.matchers if m.is_error()}
        if errors:
            raise ModelUnavailableError(f"JSON schema not supported by llguidance: {sorted(errors)[0]}")
        self.bitmask = allocate_token_bitmask(batch_size, vocab_size)
        self.eos_token_id = eos_token_id
        self.started = False

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        from llguidance.torch import fill_next_token_bitmask

        if self.started:
            for matcher, token in zip(self.matchers, input_ids[:, -1].tolist()):
                if not (matcher.is_stopped() or matcher.is_error()):
                    matcher.consume_token(token)
        self.started = True
        for row, matcher in enumerate(self.matchers):
            if matcher.is_stopped() or matcher.is_error():
                self.bitmask[row].zero_()
                self.bitmask[row, self.eos_token_id // 32] = 1 << (self.eos_token_id % 32)
            else:
                fill_next_token_bitmask(matcher, self.bitmask, row)
        return apply_bitmask(scores, self.bitmask.to(scores.device))


def apply_bitmask(scores: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """Set the logits of tokens whose bit is 0 in the packed int32 ``bitmask`` to -inf.

    Same effect as ``llguidance.torch.apply_token_bitmask_inplace``, without its ``torch.compile``
    step, which needs a C++ toolchain on CPU and recompiles per shape.
    """
    shifts = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    allowed = ((bitmask.unsqueeze(-1) >> shifts) & 1).bool().flatten(1)[:, : scores.shape[-1]]
    if allowed.shape[-1] < scores.shape[-1]:
        allowed = torch.nn.functional.pad(allowed, (0, scores.shape[-1] - allowed.shape[-1]), value=False)
    return scores.masked_fill(~allowed, float("-inf"))


class JsonSchemaConstraint:
    """llguidance grammars for one tokenizer: compiled once per schema, one logits processor per batch."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._ll_tokenizer: Any = None
        self._grammars: dict[str, str] = {}

    def processor(self, json_schema: dict[str, Any], batch_size: int) -> JsonSchemaLogitsProcessor:
        """A fresh processor constraining ``batch_size`` rows to ``json_schema``."""
        return JsonSchemaLogitsProcessor(self._llguidance_tokenizer(), self._grammar(json_schema), batch_size, self.vocab_size, self.tokenizer.eos_token_id)

    def _llguidance_tokenizer(self) -> Any:
        if self._ll_tokenizer is None:
            import llguidance.hf

            self._ll_tokenizer = llguidance.hf.from_tokenizer(self.tokenizer, n_vocab=self.vocab_size)
        return self._ll_tokenizer

    def _grammar(self, json_schema: dict[str, Any]) -> str:
        from llguidance import LLMatcher

        key = json.dumps(json_schema, sort_keys=True)
        if key not in self._grammars:
            self._grammars[key] = LLMatcher.grammar_from_json_schema(json_schema, defaults=JSON_LAYOUT)
        return self._grammars[key]


class TransformersLLM(ChatLLM):
    """A local causal LM behind :class:`ChatLLM`: the model's chat template, left-padded batches, greedy at temperature 0."""

    def __init__(
        self,
        ref: str,
        *,
        revision: str | None = None,
        dtype: str = "auto",
        device: str = "auto",
        quantization: str = "none",
        cache_dir: str | os.PathLike | None = None,
        trust_remote_code: bool = False,
        max_new_tokens: int = 512,
        batch_size: int = 4,
        temperature: float = 0.0,
        constrained: bool = True,
        loaded: tuple[Any, Any] | None = None,
        template_budget_s: float = TEMPLATE_BUDGET_S,
    ) -> None:
        self.model_id = ref
        self.revision = revision
        self.model, self.tokenizer = loaded or load_causal_lm(
            ref, revision=revision, dtype=dtype, device=device, quantization=quantization, cache_dir=cache_dir, trust_remote_code=trust_remote_code
        )
        require_chat_template(self.tokenizer, ref)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.max_new_tokens = max_new_tokens
        self.batch_size = batch_size
        self.temperature = temperature
        self.constrained = constrained
        self.template_budget_s = template_budget_s
        self.vocab_size = int(self.model.get_output_embeddings().weight.shape[0])
        self.constraint = JsonSchemaConstraint(self.tokenizer, self.vocab_size)

    @property
    def supports_schema(self) -> bool:
        """Constrained decoding through llguidance, unless switched off in config."""
        return self.constrained

    @property
    def device(self) -> torch.device:
        """Device of the model's weights (where inputs go)."""
        return self.model.device

    def render(self, chat: Chat) -> str:
        """The chat as the model's own template writes it, ready for the assistant turn (Qwen3: thinking off)."""
        return render_chat(self.tokenizer, chat, self.template_budget_s)

    def _encode(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        enc = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        return {k: v.to(self.device) for k, v in enc.items()}

    def _batches(self, n: int, lengths: list[int], desc: str) -> Any:
        """Index batches of similar length (less padding), with a progress bar when there are several."""
        order = sorted(range(n), key=lambda i: lengths[i])
        starts = range(0, n, self.batch_size)
        for start in tqdm(starts, desc=desc, disable=len(starts) < 3, leave=False):
            yield order[start : start + self.batch_size]

    def generate(
        self,
        chats: Sequence[Chat],
        *,
        max_new_tokens: int | None = None,
        json_schema: dict[str, Any] | None = None,
    ) -> list[str]:
        """Greedy completions in batches of ``batch_size``; ``json_schema`` constrains decoding when enabled."""
        prompts = [self.render(chat) for chat in chats]
        schema = json_schema if self.constrained else None
        outputs = [""] * len(prompts)
        for idx in self._batches(len(prompts), [len(p) for p in prompts], "generate"):
            texts = self._generate_batch([prompts[i] for i in idx], max_new_tokens or self.max_new_tokens, schema)
            for i, text in zip(idx, texts):
                outputs[i] = text
        return outputs

    @torch.inference_mode()
    def _generate_batch(self, prompts: list[str], max_new_tokens: int, json_schema: dict[str, Any] | None) -> list[str]:
        enc = self._encode(prompts)
        eos = self.tokenizer.eos_token_id
        config = GenerationConfig(
            max_new_tokens=max_new_tokens,
            do_sample=self.temperature > 0,
            temperature=self.temperature if self.temperature > 0 else None,
            top_p=None,
            top_k=None,
            pad_token_id=self.tokenizer.pad_token_id,
            eos_token_id=self.model.generation_config.eos_token_id or eos,
        )
        processors = LogitsProcessorList()
        if json_schema is not None:
            processors.append(self.constraint.processor(json_schema, len(prompts)))
        out = self.model.generate(**enc, generation_config=config, logits_processor=processors)
        new_tokens = out[:, enc["input_ids"].shape[1] :]
        return [text.strip() for text in self.tokenizer.batch_decode(new_tokens, skip_special_tokens=True)]

    @torch.inference_mode()
    def next_token_logprobs(self, chats: Sequence[Chat]) -> torch.Tensor:
        """Log-probabilities over the vocabulary of the first assistant token of each chat, ``(len(chats), vocab)``."""
        prompts = [self.render(chat) for chat in chats]
        rows = torch.empty(len(prompts), self.vocab_size)
        for idx in self._batches(len(prompts), [len(p) for p in prompts], "score"):
            enc = self._encode([prompts[i] for i in idx])
            positions = (enc["attention_mask"].cumsum(-1) - 1).clamp(min=0)
            logits = self.model(**enc, position_ids=positions, logits_to_keep=1).logits[:, -1].float()
            rows[idx] = torch.log_softmax(logits, dim=-1).cpu()
        return rows

    def score_yes_no(self, chats: Sequence[Chat]) -> list[float]:
        """p(yes) / (p(yes) + p(no)) at the next token (Qwen3-Reranker formulation).

        Each word's probability sums its one-token spellings (``yes``, ``Yes``, with or without a leading
        space), so chat models that capitalise are scored too; for Qwen3-Reranker, trained to answer
        ``yes``/``no``, the other spellings carry negligible mass.
        """
        if not chats:
            return []
        probs = self.next_token_logprobs(chats).exp()
        p_yes = probs[:, self._spellings("yes")].sum(-1)
        p_no = probs[:, self._spellings("no")].sum(-1)
        return (p_yes / (p_yes + p_no).clamp_min(1e-30)).tolist()

    def _spellings(self, word: str) -> list[int]:
        """Ids of the single-token spellings of ``word``: lower/capitalised, bare or after a space."""
        ids = set()
        for variant in (word, word.capitalize(), " " + word, " " + word.capitalize()):
            encoded = self.tokenizer(variant, add_special_tokens=False)["input_ids"]
            if len(encoded) == 1:
                ids.add(int(encoded[0]))
        if not ids:
            raise ModelUnavailableError(f"tokenizer of {self.model_id!r} has no single token for {word!r}; yes/no scoring needs one")
        return sorted(ids)

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` without special tokens."""
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])
