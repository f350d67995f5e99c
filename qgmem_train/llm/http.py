"""OpenAI-compatible HTTP backend (vLLM servers, API models) behind :class:`ChatLLM`.

The API key is read from the environment variable named in config and never logged. Requests run in
parallel up to a concurrency limit; 429, 5xx, timeouts and dropped connections are retried with
exponential backoff; any other 4xx is one clear :class:`ModelUnavailableError`.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from qgmem_train.errors import ModelUnavailableError
from qgmem_train.llm.base import Chat, ChatLLM

log = logging.getLogger(__name__)
CHARS_PER_TOKEN = 4
"""Token estimate when neither the server nor a local tokenizer can count: about 4 characters a token (English, BPE)."""
TOP_LOGPROBS = 20
_MAX_BACKOFF_S = 30.0


class OpenAICompatibleLLM(ChatLLM):
    """Chat completions over HTTP; ``response_format`` JSON schema when constrained; yes/no from logprobs."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key_env: str = "OPENAI_API_KEY",
        max_concurrency: int = 8,
        timeout_s: float = 120.0,
        max_retries: int = 4,
        backoff_s: float = 0.5,
        max_new_tokens: int = 512,
        temperature: float = 0.0,
        constrained: bool = True,
        tokenizer: str | None = None,
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        self.model_id = model
        self.base_url = base_url.rstrip("/")
        self.max_concurrency = max(1, max_concurrency)
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.constrained = constrained
        self.extra_body = dict(extra_body or {})
        key = os.environ.get(api_key_env, "")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._client = httpx.Client(
            timeout=timeout_s, headers=headers, limits=httpx.Limits(max_connections=self.max_concurrency, max_keepalive_connections=self.max_concurrency)
        )
        self._tokenizer_ref = tokenizer
        self._tokenizer: Any = None
        self._server_tokenize: bool | None = None

    @property
    def supports_schema(self) -> bool:
        """Whether schemas go to the server as ``response_format`` (vLLM and most APIs enforce them)."""
        return self.constrained

    def close(self) -> None:
        """Close the pooled connections."""
        self._client.close()

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST with retries on 429/5xx/timeouts/connection errors; other 4xx fail at once."""
        url = f"{self.base_url}/{path}"
        last = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(min(self.backoff_s * 2 ** (attempt - 1), _MAX_BACKOFF_S))
            try:
                response = self._client.post(url, json=body)
            except (httpx.TimeoutException, httpx.TransportError) as exc:
                last = f"{type(exc).__name__}"
                log.warning("%s: %s (attempt %d of %d)", url, last, attempt + 1, self.max_retries + 1)
                continue
            if response.status_code == 429 or response.status_code >= 500:
                last = f"HTTP {response.status_code}"
                log.warning("%s: %s (attempt %d of %d)", url, last, attempt + 1, self.max_retries + 1)
                continue
            if response.status_code >= 400:
                raise ModelUnavailableError(f"{url} refused the request: HTTP {response.status_code}: {_error_text(response)}")
            return response.json()
        raise ModelUnavailableError(f"{url} failed after {self.max_retries + 1} attempts: {last}")

    def _map(self, fn: Any, items: Sequence[Any]) -> list[Any]:
        if len(items) <= 1 or self.max_concurrency == 1:
            return [fn(item) for item in items]
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(items))) as pool:
            return list(pool.map(fn, items))

    def generate(
        self,
        chats: Sequence[Chat],
        *,
        max_new_tokens: int | None = None,
        json_schema: dict[str, Any] | None = None,
    ) -> list[str]:
        """One chat completion per chat, ``max_concurrency`` in flight at a time."""
        body: dict[str, Any] = {
            "model": self.model_id,
            "max_tokens": max_new_tokens or self.max_new_tokens,
            "temperature": self.temperature,
            **self.extra_body,
        }
        if json_schema is not None and self.constrained:
            name = str(json_schema.get("title") or "output")
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": name, "schema": json_schema, "strict": True}}

        def complete(chat: Chat) -> str:
            reply = self._post("chat/completions", {**body, "messages": list(chat)})
            return (reply["choices"][0]["message"].get("content") or "").strip()

        return self._map(complete, list(chats))

    def score_yes_no(self, chats: Sequence[Chat]) -> list[float]:
        """p(yes) / (p(yes) + p(no)) from the first token's top logprobs (any case, any leading space); 0.5 when neither is among them."""
        body = {"model": self.model_id, "max_tokens": 1, "temperature": 0.0, "logprobs": True, "top_logprobs": TOP_LOGPROBS, **self.extra_body}

        def score(chat: Chat) -> float:
            reply = self._post("chat/completions", {**body, "messages": list(chat)})
            content = (reply["choices"][0].get("logprobs") or {}).get("content") or []
            top = content[0].get("top_logprobs", []) if content else []
            p_yes = sum(math.exp(t["logprob"]) for t in top if t["token"].strip().lower() == "yes")
            p_no = sum(math.exp(t["logprob"]) for t in top if t["token"].strip().lower() == "no")
            return p_yes / (p_yes + p_no) if p_yes + p_no > 0 else 0.5

        return self._map(score, list(chats))

    def count_tokens(self, text: str) -> int:
        """The server's ``/tokenize`` count (vLLM) when it has one, else a local tokenizer, else an estimate."""
        if self._server_tokenize is not False:
            count = self._tokenize_on_server(text)
            if count is not None:
                return count
        if self._tokenizer_ref:
            if self._tokenizer is None:
                from transformers import AutoTokenizer

                from qgmem_train.llm.resolver import resolve_model_dir

                self._tokenizer = AutoTokenizer.from_pretrained(resolve_model_dir(self._tokenizer_ref))
            return len(self._tokenizer(text, add_special_tokens=False)["input_ids"])
        return math.ceil(len(text) / CHARS_PER_TOKEN)

    def _tokenize_on_server(self, text: str) -> int | None:
        root = self.base_url.removesuffix("/v1")
        try:
            response = self._client.post(f"{root}/tokenize", json={"model": self.model_id, "prompt": text, "add_special_tokens": False})
        except httpx.HTTPError:
            return None
        if response.status_code != 200:
            if response.status_code < 500:
                self._server_tokenize = False
            return None
        self._server_tokenize = True
        return int(response.json()["count"])


def _error_text(response: httpx.Response) -> str:
    """The server's error message on one line."""
    try:
        payload = response.json()
        message = payload.get("error", payload)
        message = message.get("message", message) if isinstance(message, dict) else message
    except ValueError:
        message = response.text
    return " ".join(str(message).split())[:300]
