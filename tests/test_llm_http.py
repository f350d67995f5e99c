"""The OpenAI-compatible backend against a real HTTP server on loopback that serves SmolLM2."""

from __future__ import annotations

import logging
import time

import pytest

from qgmem_train.errors import ModelUnavailableError
from qgmem_train.llm.http import OpenAICompatibleLLM
from qgmem_train.llm.prompts import QUERY_INTENT
from qgmem_train.llm.schemas import IntentOutput
from qgmem_train.llm.serve import OpenAICompatibleServer
from qgmem_train.llm.structured import ParseStats, generate_structured

MODEL = "smollm2-loopback"
CHATS = [
    [{"role": "user", "content": "What is the capital of France? Answer in one short sentence."}],
    [{"role": "user", "content": "Name one fruit."}],
    [{"role": "user", "content": "Say hello to Caroline."}],
]
YES_NO = [
    [{"role": "user", "content": "Is Paris the capital of France? Answer yes or no."}],
    [{"role": "user", "content": "Is the moon made of cheese? Answer yes or no."}],
]


class FaultyServer(OpenAICompatibleServer):
    """Counts requests and plays scripted faults first: ``500`` fails at once, a float stalls that many seconds."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.faults: list[float | int] = []
        self.bodies: list[dict] = []

    def chat_completion(self, body: dict) -> dict:
        self.bodies.append(body)
        if self.faults:
            fault = self.faults.pop(0)
            if fault != 500:
                time.sleep(fault)
            raise RuntimeError("injected fault")
        return super().chat_completion(body)


@pytest.fixture(scope="module")
def server(smollm2):
    with FaultyServer(smollm2, MODEL) as running:
        yield running


@pytest.fixture()
def fresh(server):
    server.faults.clear()
    server.bodies.clear()
    return server


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
    fresh.faults.append(8.0)
    assert client(fresh, timeout_s=4.0).generate(CHATS[:1], max_new_tokens=8) == smollm2.generate(CHATS[:1], max_new_tokens=8)
    fresh.faults[:] = [1.5, 1.5]
    with pytest.raises(ModelUnavailableError, match="failed after 2 attempts: ReadTimeout") as err:
        client(fresh, timeout_s=0.5, max_retries=1).generate(CHATS[:1], max_new_tokens=8)
    assert "\n" not in str(err.value)


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
