"""A minimal OpenAI-compatible HTTP server over a local :class:`TransformersLLM`, on loopback.

It lives with the tests (the server the project ships is ``python -m qgmem_train serve``) and exists to test and
benchmark the HTTP backend against a real server without a GPU: chat completions (with ``response_format`` JSON
schema and first-token ``logprobs``), vLLM's ``/tokenize`` and ``/v1/models``. Concurrent requests are gathered into one batched ``generate`` call, as vLLM
batches them. Not a production server: use vLLM for that.
"""

from __future__ import annotations

import json
import queue
import threading
import time
import uuid
from concurrent.futures import Future
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from qgmem_train.llm.local import TransformersLLM


class HTTPFailure(Exception):
    """An HTTP error status with its message, turned into an OpenAI-style error body."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class OpenAICompatibleServer:
    """Serve ``llm`` as ``model_name`` at ``http://127.0.0.1:<port>/v1`` from a background thread."""

    def __init__(self, llm: TransformersLLM, model_name: str = "local", *, port: int = 0, max_batch: int = 8, batch_wait_s: float = 0.01) -> None:
        self.llm = llm
        self.model_name = model_name
        self.max_batch = max_batch
        self.batch_wait_s = batch_wait_s
        self._jobs: queue.Queue[tuple[tuple, Any, Future]] = queue.Queue()
        self._httpd = _QuietServer(("127.0.0.1", port), _Handler)
        self._httpd.daemon_threads = True
        self._httpd.app = self  # type: ignore[attr-defined]
        self._threads = [threading.Thread(target=self._httpd.serve_forever, daemon=True), threading.Thread(target=self._batch_loop, daemon=True)]

    @property
    def base_url(self) -> str:
        """The ``/v1`` base URL clients are given."""
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def __enter__(self) -> OpenAICompatibleServer:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._jobs.put((("stop",), None, Future()))

    def chat_completion(self, body: dict[str, Any]) -> dict[str, Any]:
        """Answer one ``/v1/chat/completions`` request (batched with concurrent ones)."""
        if body.get("model") != self.model_name:
            raise HTTPFailure(404, f"The model `{body.get('model')}` does not exist.")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise HTTPFailure(400, "messages must be a non-empty list")
        if body.get("logprobs"):
            if body.get("max_tokens") != 1:
                raise HTTPFailure(400, "this server returns logprobs only with max_tokens 1")
            top_k = int(body.get("top_logprobs") or 1)
            return self._completion(*self._submit(("logprobs", top_k), messages))
        schema = (body.get("response_format") or {}).get("json_schema", {}).get("schema")
        key = ("generate", int(body.get("max_tokens") or self.llm.max_new_tokens), json.dumps(schema) if schema else None)
        return self._completion(self._submit(key, messages), None)

    def tokenize(self, body: dict[str, Any]) -> dict[str, Any]:
        """vLLM's ``/tokenize``: the token count of ``prompt``."""
        ids = self.llm.tokenizer(str(body.get("prompt", "")), add_special_tokens=bool(body.get("add_special_tokens", True)))["input_ids"]
        return {"count": len(ids), "tokens": ids, "max_model_len": int(getattr(self.llm.model.config, "max_position_embeddings", 0))}

    def _submit(self, key: tuple, messages: list) -> Any:
        future: Future = Future()
        self._jobs.put((key, messages, future))
        return future.result()

    def _completion(self, content: str, logprobs: dict[str, Any] | None) -> dict[str, Any]:
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "logprobs": logprobs, "finish_reason": "stop"}],
        }

    def _batch_loop(self) -> None:
        """Gather jobs that arrive together and run each group of equal settings as one batch."""
        while True:
            jobs = [self._jobs.get()]
            deadline = time.monotonic() + self.batch_wait_s
            while len(jobs) < self.max_batch and (left := deadline - time.monotonic()) > 0:
                try:
                    jobs.append(self._jobs.get(timeout=left))
                except queue.Empty:
                    break
            if any(key == ("stop",) for key, _, _ in jobs):
                return
            groups: dict[tuple, list[tuple[Any, Future]]] = {}
            for key, messages, future in jobs:
                groups.setdefault(key, []).append((messages, future))
            for key, members in groups.items():
                try:
                    results = self._run(key, [m for m, _ in members])
                except Exception as exc:  # reported to each waiting request as a 500
                    for _, future in members:
                        future.set_exception(exc)
                    continue
                for (_, future), result in zip(members, results):
                    future.set_result(result)

    def _run(self, key: tuple, chats: list) -> list[Any]:
        if key[0] == "logprobs":
            rows = self.llm.next_token_logprobs(chats)
            values, ids = rows.topk(key[1], dim=-1)
            out = []
            for row_values, row_ids in zip(values.tolist(), ids.tolist()):
                tokens = [self.llm.tokenizer.decode([i]) for i in row_ids]
                top = [{"token": t, "logprob": v} for t, v in zip(tokens, row_values)]
                out.append((tokens[0], {"content": [{"token": tokens[0], "logprob": row_values[0], "top_logprobs": top}]}))
            return out
        schema = json.loads(key[2]) if key[2] else None
        return self.llm.generate(chats, max_new_tokens=key[1], json_schema=schema)


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up (e.g. after its own timeout) is not an error of the server."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet: tests and benchmarks only
        return

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        app: OpenAICompatibleServer = self.server.app  # type: ignore[attr-defined]
        if self.path.rstrip("/") == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": app.model_name, "object": "model"}]})
        else:
            self._send(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        app: OpenAICompatibleServer = self.server.app  # type: ignore[attr-defined]
        routes = {"/v1/chat/completions": app.chat_completion, "/tokenize": app.tokenize}
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            if self.path not in routes:
                raise HTTPFailure(404, f"no route {self.path}")
            self._send(200, routes[self.path](body))
        except HTTPFailure as exc:
            self._send(exc.status, {"error": {"message": str(exc), "code": exc.status}})
        except json.JSONDecodeError:
            self._send(400, {"error": {"message": "request body is not JSON", "code": 400}})
        except Exception as exc:  # a failure of the model itself: a 500, as a real server answers
            self._send(500, {"error": {"message": f"{type(exc).__name__}: {exc}", "code": 500}})
