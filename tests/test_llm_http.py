"""The OpenAI-compatible backend against real HTTP servers on loopback: one that serves SmolLM2, and
scripted ones for retries (Retry-After, jitter, deadline), credentials in the URL and malformed replies."""

from __future__ import annotations

import json
import logging
import threading
import time
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from qgmem_train.errors import ModelUnavailableError
from qgmem_train.llm.http import OpenAICompatibleLLM
from qgmem_train.llm.prompts import QUERY_INTENT
from qgmem_train.llm.schemas import IntentOutput
from tests.openai_server import OpenAICompatibleServer
from qgmem_train.llm.structured import ParseStats, generate_structured

MODEL = "smollm2-loopback"
SAMPLES = Path(__file__).resolve().parents[1] / "samples"
CHATS = [
    [{"role": "user", "content": "What is the capital of France? Answer in one short sentence."}],
    [{"role": "user", "content": "Name one fruit."}],
    [{"role": "user", "content": "Say hello to Caroline."}],
]
YES_NO = [
    [{"role": "user", "content": "Is Paris the capital of France? Answer yes or no."}],
    [{"role": "user", "content": "Is the moon made of cheese? Answer yes or no."}],
]


STALL = "stall"
"""A fault that holds its request unanswered until the test ends: only the client's own timeout ends it."""


class FaultyServer(OpenAICompatibleServer):
    """Counts requests and plays scripted faults first: ``500`` fails at once, :data:`STALL` never answers in time.
    A request it answered before is answered again from memory, so a retry's reply costs no model time."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.faults: list[int | str] = []
        self.bodies: list[dict] = []
        self.answered: dict[str, dict] = {}
        self.released = threading.Event()

    def chat_completion(self, body: dict) -> dict:
        self.bodies.append(body)
        if self.faults:
            if self.faults.pop(0) == STALL:
                self.released.wait()
            raise RuntimeError("injected fault")
        key = json.dumps(body, sort_keys=True)
        if key not in self.answered:
            self.answered[key] = super().chat_completion(body)
        return self.answered[key]


@pytest.fixture(scope="module")
def server(smollm2):
    with FaultyServer(smollm2, MODEL) as running:
        yield running


@pytest.fixture()
def fresh(server):
    server.faults.clear()
    server.bodies.clear()
    server.released.clear()
    yield server
    server.released.set()  # stalled requests end (their clients gave up long ago)


def client(server: OpenAICompatibleServer, **kwargs) -> OpenAICompatibleLLM:
    settings = {"max_retries": 2, "backoff_s": 0.01, "timeout_s": 60.0, "max_concurrency": 4, **kwargs}
    return OpenAICompatibleLLM(server.base_url, MODEL, **settings)


def test_generation_over_http_equals_the_local_backend(fresh, smollm2) -> None:
    assert client(fresh).generate(CHATS, max_new_tokens=8) == smollm2.generate(CHATS, max_new_tokens=8)
    assert all(body["temperature"] == 0.0 and body["max_tokens"] == 8 for body in fresh.bodies)


def test_schema_travels_as_response_format_and_yields_valid_records(fresh) -> None:
    chats = [QUERY_INTENT.render(query="When did Caroline go to the LGBTQ support group?", question_time="2023-05-20")]
    stats = ParseStats()
    records = generate_structured(client(fresh), chats, IntentOutput, max_new_tokens=48, stats=stats)
    assert isinstance(records[0], IntentOutput) and stats.valid == 1
    fmt = fresh.bodies[0]["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["schema"]["additionalProperties"] is False


def test_yes_no_from_logprobs_matches_the_local_score(fresh, smollm2) -> None:
    remote = client(fresh).score_yes_no(YES_NO)
    assert remote == pytest.approx(smollm2.score_yes_no(YES_NO), abs=1e-2)
    assert fresh.bodies[0]["logprobs"] is True and fresh.bodies[0]["max_tokens"] == 1


def test_token_count_from_the_server_then_estimate_without_one(fresh, smollm2) -> None:
    text = "Caroline went to the LGBTQ support group on 7 May 2023."
    assert client(fresh).count_tokens(text) == smollm2.count_tokens(text)
    unreachable = OpenAICompatibleLLM("http://127.0.0.1:9/v1", MODEL, max_retries=0, timeout_s=1.0)
    assert unreachable.count_tokens(text) == -(-len(text) // 4)


def test_a_500_is_retried_then_succeeds(fresh, smollm2) -> None:
    fresh.faults.append(500)
    assert client(fresh, max_concurrency=1).generate(CHATS[:1], max_new_tokens=8) == smollm2.generate(CHATS[:1], max_new_tokens=8)
    assert len(fresh.bodies) == 2


def test_a_timeout_is_retried_and_persistent_timeouts_end_in_one_clear_error(fresh, smollm2) -> None:
    expected = smollm2.generate(CHATS[:1], max_new_tokens=8)
    assert client(fresh).generate(CHATS[:1], max_new_tokens=8) == expected  # answered once: the retry below is answered from memory
    fresh.bodies.clear()
    fresh.faults.append(STALL)
    assert client(fresh, timeout_s=2.0).generate(CHATS[:1], max_new_tokens=8) == expected
    assert len(fresh.bodies) == 2, "the stalled attempt, then its retry"
    fresh.bodies.clear()
    fresh.faults[:] = [STALL, STALL]
    with pytest.raises(ModelUnavailableError, match="failed after 2 attempts: ReadTimeout") as err:
        client(fresh, timeout_s=0.5, max_retries=1).generate(CHATS[:1], max_new_tokens=8)
    assert "\n" not in str(err.value) and len(fresh.bodies) == 2


def test_other_4xx_fails_at_once_with_the_servers_message(fresh) -> None:
    wrong = OpenAICompatibleLLM(fresh.base_url, "no-such-model", max_retries=3, backoff_s=0.01)
    with pytest.raises(ModelUnavailableError, match=r"HTTP 404: The model `no-such-model` does not exist"):
        wrong.generate(CHATS[:1], max_new_tokens=4)
    assert len(fresh.bodies) == 1


def test_api_key_comes_from_the_named_env_var_and_is_never_logged(fresh, monkeypatch, caplog) -> None:
    monkeypatch.setenv("QGMEM_TEST_API_KEY", "sk-test-secret-123")
    keyed = client(fresh, api_key_env="QGMEM_TEST_API_KEY")
    assert keyed._client.headers["Authorization"] == "Bearer sk-test-secret-123"
    fresh.faults.append(500)
    with caplog.at_level(logging.DEBUG):
        keyed.generate(CHATS[:1], max_new_tokens=4)
    assert "HTTP 500" in caplog.text and "sk-test-secret-123" not in caplog.text
    assert "Authorization" not in client(fresh, api_key_env="QGMEM_UNSET_KEY_VAR")._client.headers


class ScriptedServer:
    """A loopback HTTP server that answers every POST from a script of replies and records each request.

    A reply is ``(status, headers, body)``; ``body`` may be a dict (sent as JSON) or text, and a reply
    ``("stall", seconds)`` sleeps that long before answering 200. The last reply repeats once the script runs out.
    """

    def __init__(self, *replies) -> None:
        self.replies = list(replies)
        self.requests: list[tuple[str, dict[str, str]]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                server.requests.append((self.path, dict(self.headers)))
                reply = server.replies.pop(0) if len(server.replies) > 1 else server.replies[0]
                if reply[0] == "stall":
                    time.sleep(reply[1])
                    reply = (200, {}, COMPLETION)
                status, headers, body = reply
                data = (json.dumps(body) if isinstance(body, dict) else body).encode()
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._httpd.handle_error = lambda request, address: None  # a client that gave up closes the socket mid-reply
        self.port = self._httpd.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> ScriptedServer:
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


COMPLETION = {"choices": [{"message": {"role": "assistant", "content": " scripted reply "}}]}
OK = (200, {}, COMPLETION)


def scripted(server: ScriptedServer, base_url: str | None = None, **kwargs) -> OpenAICompatibleLLM:
    settings = {"max_retries": 3, "backoff_s": 0.01, "timeout_s": 30.0, "max_concurrency": 1, "api_key_env": "QGMEM_UNSET_KEY_VAR", **kwargs}
    return OpenAICompatibleLLM(base_url or server.base_url, MODEL, **settings)


@pytest.fixture()
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Record the client's waits instead of sleeping them (no scripted server here sleeps)."""
    waits: list[float] = []
    monkeypatch.setattr(time, "sleep", waits.append)
    return waits


def test_retry_after_in_seconds_is_honoured(sleeps: list[float]) -> None:
    with ScriptedServer((503, {"Retry-After": "7"}, "busy"), OK) as server:
        assert scripted(server).generate(CHATS[:1]) == ["scripted reply"]
    assert sleeps == [7.0] and len(server.requests) == 2


def test_retry_after_as_an_http_date_is_honoured(sleeps: list[float]) -> None:
    when = formatdate(time.time() + 30, usegmt=True)
    with ScriptedServer((429, {"Retry-After": when}, "slow down"), OK) as server:
        assert scripted(server).generate(CHATS[:1]) == ["scripted reply"]
    (wait,) = sleeps
    assert 20 < wait <= 30


def test_backoff_is_exponential_with_jitter(sleeps: list[float]) -> None:
    runs = []
    for _ in range(2):
        with ScriptedServer((500, {}, "down"), (500, {}, "down"), (500, {}, "down"), OK) as server:
            assert scripted(server, backoff_s=1.0).generate(CHATS[:1]) == ["scripted reply"]
        runs.append(sleeps[:])
        sleeps.clear()
    for waits in runs:
        assert len(waits) == 3 and all(ceiling / 2 <= wait <= ceiling for wait, ceiling in zip(waits, [1.0, 2.0, 4.0]))
    assert runs[0] != runs[1]


def test_a_retry_after_past_the_deadline_fails_at_once(sleeps: list[float]) -> None:
    with ScriptedServer((429, {"Retry-After": "120"}, "later"), OK) as server:
        with pytest.raises(ModelUnavailableError, match=r"no reply within the 10 s deadline after 1 attempt\(s\) \(the server asked to wait 120 s\): HTTP 429"):
            scripted(server, deadline_s=10.0).generate(CHATS[:1])
    assert sleeps == [] and len(server.requests) == 1


def test_the_deadline_bounds_a_request_over_all_attempts() -> None:
    with ScriptedServer(("stall", 3.0)) as server:
        with pytest.raises(ModelUnavailableError, match="deadline") as err:
            scripted(server, timeout_s=60.0, max_retries=5, backoff_s=0.5, deadline_s=1.0).generate(CHATS[:1])
    assert "1 s deadline" in str(err.value) and "ReadTimeout" in str(err.value)
    assert len(server.requests) == 1


def test_credentials_in_the_url_are_never_shown(sleeps: list[float], caplog) -> None:
    with ScriptedServer((500, {}, "down")) as server:
        url = f"http://alice:s3cret-pw@127.0.0.1:{server.port}/v1?api_key=tok-123"
        with caplog.at_level(logging.DEBUG), pytest.raises(ModelUnavailableError) as err:
            scripted(server, base_url=url, max_retries=1).generate(CHATS[:1])
    message = str(err.value)
    assert message == f"http://***@127.0.0.1:{server.port}/v1/chat/completions?api_key=*** failed after 2 attempts: HTTP 500"
    for secret in ("s3cret-pw", "tok-123", "alice"):
        assert secret not in message and secret not in caplog.text
    path, headers = server.requests[0]
    assert path == "/v1/chat/completions?api_key=tok-123" and headers["Authorization"].startswith("Basic ")
    with ScriptedServer((401, {}, {"error": {"message": "bad key"}})) as server:
        url = f"http://alice:s3cret-pw@127.0.0.1:{server.port}/v1?api_key=tok-123"
        with pytest.raises(ModelUnavailableError, match=r"\?api_key=\*\*\* refused the request: HTTP 401: bad key") as err:
            scripted(server, base_url=url).generate(CHATS[:1])
    assert "s3cret-pw" not in str(err.value) and "tok-123" not in str(err.value)


@pytest.mark.parametrize(
    ("body", "call", "message"),
    [
        ("<html><body>Welcome to the proxy</body></html>", "generate", "answered HTTP 200 with a body that is not a JSON object: <html><body>Welcome"),
        ("[1, 2]", "generate", "answered HTTP 200 with a body that is not a JSON object: [1, 2]"),
        ({"id": "x", "object": "error"}, "generate", 'answered without choices[0].message.content: {"id": "x", "object": "error"}'),
        ({"choices": [{"message": {"content": ["a"]}}]}, "generate", "answered without choices[0].message.content"),
        ({"choices": [{"logprobs": {"content": [{"top_logprobs": [{"token": 1}]}]}}]}, "score_yes_no", "answered without choices[0].logprobs"),
    ],
)
def test_a_2xx_reply_that_is_not_the_expected_json_is_one_clear_error(body, call: str, message: str) -> None:
    with ScriptedServer((200, {}, body)) as server:
        with pytest.raises(ModelUnavailableError) as err:
            getattr(scripted(server), call)(CHATS[:1])
    assert message in str(err.value) and "\n" not in str(err.value)
    assert len(server.requests) == 1


def test_a_tokenize_reply_that_is_not_json_falls_back_to_the_estimate() -> None:
    with ScriptedServer((200, {}, "<html>not here</html>")) as server:
        assert scripted(server).count_tokens("Caroline went to the support group.") == -(-len("Caroline went to the support group.") // 4)
    assert server.requests[0][0] == "/tokenize"


def test_the_build_cli_reports_a_non_json_reply_in_one_line(tmp_path, capsys) -> None:
    from qgmem_train.__main__ import main

    with ScriptedServer((200, {"Content-Type": "text/html"}, "<html>Sign in to continue</html>")) as server:
        config = tmp_path / "cfg.yaml"
        config.write_text(
            "pipeline:\n  models:\n    backend: openai\n"
            f"    base_url: {server.base_url}\n    api_key_env: QGMEM_UNSET_KEY_VAR\n    max_retries: 0\n    device: cpu\n"
        )
        args = ["build", "--dataset", "jsonl", "--input", str(SAMPLES / "plain_chat.jsonl"), "--store", str(tmp_path / "store"), "--units", "llm", "--config", str(config)]
        assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == f"error: {server.base_url}/chat/completions answered HTTP 200 with a body that is not a JSON object: <html>Sign in to continue</html>"
