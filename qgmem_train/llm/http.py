"""OpenAI-compatible HTTP backend (vLLM servers, API models) behind :class:`ChatLLM`.

The API key is read from the environment variable named in config and never logged; nor are
credentials written into the URL (``user:pass@host``, query values): errors and logs show the URL with
them masked. Requests run in parallel up to a concurrency limit; 429, 5xx, timeouts and dropped
connections are retried after the server's ``Retry-After`` (seconds or an HTTP date) or else a jittered
exponential backoff, all within an overall deadline per request. Any other 4xx, a reply that is not the
expected JSON, or a deadline passed is one clear :class:`ModelUnavailableError`.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import math
import os
import random
import re
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import httpx

from qgmem_train.errors import InputError, ModelUnavailableError
from qgmem_train.llm.base import Chat, ChatLLM

log = logging.getLogger(__name__)
CHARS_PER_TOKEN = 4
"""Token estimate when neither the server nor a local tokenizer can count: about 4 characters a token (English, BPE)."""
TOP_LOGPROBS = 20
_MAX_BACKOFF_S = 30.0


class _RedactURLs(logging.Filter):
    """Mask credentials in the URLs that httpx itself logs (``HTTP Request: POST <url>`` at INFO)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(redact_url(str(a)) if isinstance(a, httpx.URL) else a for a in record.args)
        return True


logging.getLogger("httpx").addFilter(_RedactURLs())


class OpenAICompatibleLLM(ChatLLM):
    """Chat completions over HTTP; ``response_format`` JSON schema when constrained; yes/no from logprobs."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key_env: str = "OPENAI_API_KEY",
        allow_insecure_http: bool = False,
        max_concurrency: int = 8,
        timeout_s: float = 120.0,
        max_retries: int = 4,
        backoff_s: float = 0.5,
        deadline_s: float = 600.0,
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
        self.timeout_s = timeout_s
        self.deadline_s = deadline_s
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.constrained = constrained
        self.extra_body = dict(extra_body or {})
        key = os.environ.get(api_key_env, "")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        if key:
            check_plain_http(self.base_url, api_key_env, allow_insecure_http)
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

    def _url(self, path: str, *, root: bool = False) -> httpx.URL:
        """``path`` below the base URL (below the server root, without ``/v1``, when ``root``), its query kept."""
        base = httpx.URL(self.base_url)
        prefix = base.path.rstrip("/")
        return base.copy_with(path=f"{prefix.removesuffix('/v1') if root else prefix}/{path}")

    def _backoff(self, attempt: int) -> float:
        """Wait before retry ``attempt`` (1, 2, ...): exponential and capped, drawn from its upper half (jitter)
        so that clients failing together do not retry together.
        """
        ceiling = min(self.backoff_s * 2 ** (attempt - 1), _MAX_BACKOFF_S)
        return random.uniform(ceiling / 2, ceiling)

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST with retries on 429/5xx/timeouts/connection errors within ``deadline_s``; other 4xx fail at once."""
        url = self._url(path)
        shown = redact_url(str(url))
        deadline = time.monotonic() + self.deadline_s
        last, asked = "", None
        for attempt in range(self.max_retries + 1):
            if attempt:
                wait = max(self._backoff(attempt), asked or 0.0)
                if time.monotonic() + wait >= deadline:
                    hint = f" (the server asked to wait {asked:.0f} s)" if asked and asked >= wait else ""
                    raise ModelUnavailableError(f"{shown}: no reply within the {self.deadline_s:g} s deadline after {attempt} attempt(s){hint}: {last}")
                time.sleep(wait)
            timeout = min(self.timeout_s, deadline - time.monotonic())
            try:
                response = self._client.post(url, json=body, timeout=timeout)
            except (httpx.TimeoutException, httpx.TransportError) as exc:
                last, asked = f"{type(exc).__name__}", None
                log.warning("%s: %s (attempt %d of %d)", shown, last, attempt + 1, self.max_retries + 1)
                continue
            if response.status_code == 429 or response.status_code >= 500:
                last, asked = f"HTTP {response.status_code}", retry_after_s(response.headers.get("Retry-After"))
                log.warning("%s: %s (attempt %d of %d)", shown, last, attempt + 1, self.max_retries + 1)
                continue
            if response.status_code >= 400:
                raise ModelUnavailableError(f"{shown} refused the request: HTTP {response.status_code}: {_error_text(response)}")
            return _json_object(response, shown)
        raise ModelUnavailableError(f"{shown} failed after {self.max_retries + 1} attempts: {last}")

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
            with _expect(reply, self._url("chat/completions"), "choices[0].message.content"):
                return (reply["choices"][0]["message"].get("content") or "").strip()

        return self._map(complete, list(chats))

    def score_yes_no(self, chats: Sequence[Chat]) -> list[float]:
        """p(yes) / (p(yes) + p(no)) from the first token's top logprobs (any case, any leading space); 0.5 when neither is among them."""
        body = {"model": self.model_id, "max_tokens": 1, "temperature": 0.0, "logprobs": True, "top_logprobs": TOP_LOGPROBS, **self.extra_body}

        def score(chat: Chat) -> float:
            reply = self._post("chat/completions", {**body, "messages": list(chat)})
            with _expect(reply, self._url("chat/completions"), "choices[0].logprobs.content[0].top_logprobs"):
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
        try:
            response = self._client.post(self._url("tokenize", root=True), json={"model": self.model_id, "prompt": text, "add_special_tokens": False})
        except httpx.HTTPError:
            return None
        if response.status_code != 200:
            if response.status_code < 500:
                self._server_tokenize = False
            return None
        try:
            count = int(response.json()["count"])
        except (ValueError, KeyError, TypeError):
            self._server_tokenize = False
            return None
        self._server_tokenize = True
        return count


def _error_text(response: httpx.Response) -> str:
    """The server's error message on one line."""
    try:
        payload = response.json()
        message = payload.get("error", payload)
        message = message.get("message", message) if isinstance(message, dict) else message
    except ValueError:
        message = response.text
    return " ".join(str(message).split())[:300]


def redact_url(url: str) -> str:
    """``url`` fit for errors and logs: user and password (``user:pass@``), every query value, every ``;name=value``
    path parameter's value and the fragment's values (``#access_token=``; a fragment without names whole) masked."""
    parts = urlsplit(url)
    netloc = f"***@{parts.netloc.rpartition('@')[2]}" if "@" in parts.netloc else parts.netloc
    path = re.sub(r";([^;/=]*)=[^;/]*", r";\1=***", parts.path)
    query, fragment = (_masked_values(part) for part in (parts.query, parts.fragment))
    return urlunsplit((parts.scheme, netloc, path, query, fragment))


def _masked_values(part: str) -> str:
    """A query string (or fragment) with every value masked; a non-empty one holding no ``name=value`` masked whole."""
    if part and "=" not in part:
        return "***"
    return urlencode([(name, "***") for name, _ in parse_qsl(part, keep_blank_values=True)], safe="*")


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` is this machine: ``localhost`` or a loopback address."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


_WARNED_HOSTS: set[str] = set()


def check_plain_http(base_url: str, api_key_env: str, allowed: bool) -> None:
    """Refuse to send the API key over plain http to another machine unless ``allowed``; then one warning line per
    process and host."""
    parts = urlsplit(base_url)
    host = parts.hostname or ""
    if parts.scheme != "http" or is_loopback_host(host) or host in _WARNED_HOSTS:
        return
    if not allowed:
        raise InputError("pipeline.models.base_url", f"{redact_url(base_url)} is plain http to another machine: the API key in ${api_key_env} "
                         "would travel unencrypted; use https, or set pipeline.models.allow_insecure_http: true")
    _WARNED_HOSTS.add(host)
    log.warning("warning: models.base_url %s is plain http to another machine: the API key in $%s travels unencrypted; use https", redact_url(base_url), api_key_env)


def retry_after_s(value: str | None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delay in seconds, or an HTTP date); None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


def _json_object(response: httpx.Response, shown: str) -> dict[str, Any]:
    """The JSON object of a 2xx reply; anything else (an HTML page from a proxy, a list) is one clear error."""
    try:
        reply = response.json()
    except ValueError:
        reply = None
    if not isinstance(reply, dict):
        raise ModelUnavailableError(f"{shown} answered HTTP {response.status_code} with a body that is not a JSON object: {_snippet(response.text)}")
    return reply


@contextmanager
def _expect(reply: dict[str, Any], url: httpx.URL, fields: str) -> Iterator[None]:
    """Turn a reply without the expected fields (KeyError, IndexError, ...) into one clear error naming them."""
    try:
        yield
    except (KeyError, IndexError, TypeError, AttributeError, ValueError):
        raise ModelUnavailableError(f"{redact_url(str(url))} answered without {fields}: {_snippet(json.dumps(reply))}") from None


def _snippet(text: str) -> str:
    """The start of a body on one line."""
    return " ".join(text.split())[:200]
