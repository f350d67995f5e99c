"""``serve`` through a real ASGI client (httpx's ASGITransport) over the bundled models (MiniLM, SmolLM2 for ask):
endpoints, one-line JSON errors, bounds, tenants isolated per endpoint, metrics, OpenAPI, and batched asks."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from qgmem_train.config import PipelineConfig
from qgmem_train.memory.store import MemoryStore
from qgmem_train.predictor import AskResult, QGMemPredictor
from qgmem_train.serve import schemas
from qgmem_train.serve.app import create_app
from qgmem_train.serve.limits import Limits
from qgmem_train.serve.service import MemoryService
from qgmem_train.serve.tenants import Tenants
from tests.fakes import ScriptedLLM

ACME, GLOBEX = "acme-token-0123456789abcdef", "globex-token-0123456789abcdef"
TENANTS = {"tenants": [
    {"name": "acme", "token": ACME, "prefixes": ["acme-"]},
    {"name": "globex", "token": GLOBEX, "namespaces": ["globex-main"]},
]}  # fmt: skip
SESSION = {
    "session_id": "S1",
    "time": "2023-05-08",
    "turns": [
        {"speaker": "Caroline", "text": "I went to the LGBTQ support group yesterday and it was so powerful."},
        {"speaker": "Melanie", "text": "That's great! I painted a sunrise over the lake last week."},
    ],
}
QUESTION = {"question": "What did Melanie paint?", "time": "2023-05-20"}


def pipeline() -> PipelineConfig:
    cfg = PipelineConfig()
    cfg.models.reranker, cfg.models.device = "none", "cpu"
    cfg.construction.units, cfg.construction.traces = "turns", False
    cfg.retrieval.k = 3
    cfg.generation.max_new_tokens = 48
    return cfg


def serve(predictor: QGMemPredictor, store: Path | str, limits: Limits = Limits()) -> tuple[Any, MemoryService]:
    service = MemoryService(predictor, store, max_batch=limits.max_batch)
    return create_app(service, Tenants.from_records(TENANTS, "test"), limits), service


def run(app: Any, body: Callable[[httpx.AsyncClient], Awaitable[Any]]) -> Any:
    """Run ``body`` with a client of ``app`` on an event loop of its own."""

    async def main() -> Any:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as client:
            return await body(client)

    return asyncio.run(main())


def call(app: Any, method: str, url: str, token: str | None = ACME, **kwargs: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return run(app, lambda client: client.request(method, url, headers=headers, **kwargs))


@pytest.fixture(scope="module")
def served(smollm2, minilm, tmp_path_factory):
    """An app over SmolLM2 and MiniLM (rules intent, no reranker) with acme-alice holding one session."""
    predictor = QGMemPredictor(None, pipeline(), llm=smollm2, embedder=minilm, reranker=None, intent="rules")
    app, service = serve(predictor, tmp_path_factory.mktemp("serve") / "store")
    response = call(app, "POST", "/v1/namespaces/acme-alice/sessions", json=SESSION)
    assert response.status_code == 200, response.text
    yield app, service
    service.close()


def test_openapi_schema_names_every_endpoint_and_the_ask_object(served) -> None:
    app, _ = served
    schema = call(app, "GET", "/openapi.json", token=None).json()
    assert set(schema["paths"]) == {
        "/health", "/metrics", "/v1/namespaces", "/v1/namespaces/{namespace}/sessions", "/v1/namespaces/{namespace}/search",
        "/v1/namespaces/{namespace}/ask", "/v1/namespaces/{namespace}/memory", "/v1/namespaces/{namespace}",
    }  # fmt: skip
    ask = schema["paths"]["/v1/namespaces/{namespace}/ask"]["post"]
    assert ask["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/AskOut")
    assert {"401", "404", "413", "429"} <= set(ask["responses"])
    fields = {f.name for f in dataclasses.fields(AskResult)} | {"cited"}
    assert set(schema["components"]["schemas"]["AskOut"]["properties"]) == fields == set(schemas.AskOut.model_fields)


def test_add_search_list_and_delete_a_namespace(served) -> None:
    app, service = served
    first = call(app, "POST", "/v1/namespaces/acme-bob/sessions", json={"turns": [{"speaker": "Bob", "text": "I adopted a cat named Miso."}]})
    assert first.status_code == 200 and first.json()["units"] == 1 and first.json()["session_id"].startswith("s-")
    again = call(app, "POST", "/v1/namespaces/acme-bob/sessions", json={"turns": [{"speaker": "Bob", "text": "I adopted a cat named Miso."}]})
    assert again.json()["session_id"] == first.json()["session_id"] and again.json()["windows_built"] == 0
    found = call(app, "POST", "/v1/namespaces/acme-bob/search", json={"question": "What is the cat called?"}).json()
    assert "Miso" in found["memory_context"] and found["units"][0]["label"] == "F1" and found["units"][0]["source_turns"][0]["speaker"] == "Bob"
    listed = call(app, "GET", "/v1/namespaces/acme-bob/memory").json()
    assert listed["units_total"] == 1 and listed["sessions"] == [first.json()["session_id"]] and "Miso" in listed["units"][0]["fact_text"]
    assert call(app, "GET", "/v1/namespaces").json()["namespaces"] == ["acme-alice", "acme-bob"]
    assert call(app, "DELETE", "/v1/namespaces/acme-bob").status_code == 204
    for method, url in [("GET", "/v1/namespaces/acme-bob/memory"), ("DELETE", "/v1/namespaces/acme-bob")]:
        response = call(app, method, url)
        assert response.status_code == 404 and response.json() == {"error": "namespace acme-bob: not found"}
    gone = call(app, "POST", "/v1/namespaces/acme-bob/search", json={"question": "What is the cat called?"})
    assert gone.status_code == 404 and "acme-bob" not in service.store.namespaces()


@pytest.mark.slow
def test_ask_answers_with_the_ask_json_object(served) -> None:
    app, _ = served
    response = call(app, "POST", "/v1/namespaces/acme-alice/ask", json=QUESTION)
    assert response.status_code == 200, response.text
    record = response.json()
    assert set(record) == {f.name for f in dataclasses.fields(AskResult)} | {"cited"}
    assert record["path"] == "text" and record["question"] == QUESTION["question"] and record["tokens"]["generated"] > 0
    assert record["cited"] == [unit for unit in record["units"] if unit["cited"]] and len(record["units"]) == 2


@pytest.mark.slow
def test_a_postgresql_store_serves_add_search_ask_list_and_delete(smollm2, minilm, new_postgres_store) -> None:
    uri = new_postgres_store()
    predictor = QGMemPredictor(None, pipeline(), llm=smollm2, embedder=minilm, reranker=None, intent="rules")
    app, service = serve(predictor, uri)
    try:
        added = call(app, "POST", "/v1/namespaces/acme-alice/sessions", json=SESSION)
        assert added.status_code == 200 and added.json()["units"] == 2, added.text
        again = call(app, "POST", "/v1/namespaces/acme-alice/sessions", json=SESSION)
        assert again.json()["session_id"] == "S1" and again.json()["windows_built"] == 0
        found = call(app, "POST", "/v1/namespaces/acme-alice/search", json=QUESTION).json()
        assert "sunrise" in found["memory_context"] and found["units"][0]["source_turns"][0]["speaker"] == "Melanie"
        asked = call(app, "POST", "/v1/namespaces/acme-alice/ask", json=QUESTION)
        assert asked.status_code == 200 and asked.json()["path"] == "text" and asked.json()["tokens"]["generated"] > 0
        listed = call(app, "GET", "/v1/namespaces/acme-alice/memory").json()
        assert listed["units_total"] == 2 and listed["sessions"] == ["S1"]
        assert call(app, "GET", "/v1/namespaces", token=GLOBEX).json()["namespaces"] == []
        assert call(app, "POST", "/v1/namespaces/acme-alice/search", token=GLOBEX, json=QUESTION).status_code == 404
        assert call(app, "DELETE", "/v1/namespaces/acme-alice").status_code == 204
        assert call(app, "GET", "/v1/namespaces").json()["namespaces"] == []
    finally:
        service.close()
    with MemoryStore.open(uri) as store:
        assert store.namespaces() == [] and store.deletions == 1


@pytest.mark.parametrize(
    "method,url,token,kwargs,status,needle",
    [
        ("GET", "/v1/namespaces", None, {}, 401, "bearer token"),
        ("GET", "/v1/namespaces", "not-a-known-token-at-all", {}, 401, "bearer token"),
        ("POST", "/v1/namespaces/acme-alice/search", ACME, {"json": {"question": "  "}}, 400, "question: empty"),
        ("POST", "/v1/namespaces/acme-alice/search", ACME, {"json": {"question": "why? " * 500}}, 400, "more than the 2000"),
        ("POST", "/v1/namespaces/acme-alice/search", ACME, {"json": {"question": "q?", "k": 5}}, 422, "body.k: Extra inputs"),
        ("POST", "/v1/namespaces/acme-alice/search", ACME, {"content": b"{not json", "headers": {"Content-Type": "application/json"}}, 422, "JSON"),
        ("POST", "/v1/namespaces/acme alice/search", ACME, {"json": QUESTION}, 422, "path.namespace"),
        ("POST", "/v1/namespaces/acme-alice/sessions", ACME, {"json": {"turns": []}}, 422, "body.turns"),
        ("POST", "/v1/namespaces/acme-alice/sessions", ACME, {"json": {**SESSION, "time": "someday"}}, 400, "unrecognised date"),
        ("POST", "/v1/namespaces/acme-alice/sessions", ACME, {"json": {"turns": [{"speaker": "x", "text": "y" * (1 << 21)}]}}, 413, "bytes"),
        ("GET", "/v1/nowhere", ACME, {}, 404, "Not Found"),
    ],
)
def test_bad_requests_get_one_line_json_errors(served, method, url, token, kwargs, status, needle) -> None:
    app, _ = served
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = run(app, lambda client: client.request(method, url, **{**kwargs, "headers": {**headers, **kwargs.get("headers", {})}}))
    body = response.json()
    assert response.status_code == status and list(body) == ["error"] and "\n" not in body["error"] and needle in body["error"], body
    if status == 401:
        assert response.headers["WWW-Authenticate"] == "Bearer"


def test_a_session_longer_than_the_bound_is_refused(minilm, tmp_path) -> None:
    predictor = QGMemPredictor(None, pipeline(), llm=ScriptedLLM([]), embedder=minilm, reranker=None, intent="rules")
    app, service = serve(predictor, tmp_path / "store", Limits(max_turns=2))
    turns = [{"speaker": "A", "text": f"turn {n}"} for n in range(3)]
    response = call(app, "POST", "/v1/namespaces/acme-a/sessions", json={"turns": turns})
    assert response.status_code == 400 and response.json() == {"error": "turns: 3, more than the 2 a session may have"}
    assert service.store.namespaces() == []
    service.close()


def test_each_tenant_has_its_own_rate(minilm, tmp_path) -> None:
    predictor = QGMemPredictor(None, pipeline(), llm=ScriptedLLM([]), embedder=minilm, reranker=None, intent="rules")
    app, service = serve(predictor, tmp_path / "store", Limits(rate_per_minute=1, burst=2))
    assert [call(app, "GET", "/v1/namespaces").status_code for _ in range(2)] == [200, 200]
    limited = call(app, "GET", "/v1/namespaces")
    assert limited.status_code == 429 and int(limited.headers["Retry-After"]) >= 1 and "tenant acme" in limited.json()["error"]
    assert call(app, "GET", "/v1/namespaces", token=GLOBEX).status_code == 200
    service.close()


ENDPOINTS = [
    ("POST", "/v1/namespaces/{ns}/sessions", {"json": SESSION}),
    ("POST", "/v1/namespaces/{ns}/search", {"json": QUESTION}),
    ("POST", "/v1/namespaces/{ns}/ask", {"json": QUESTION}),
    ("GET", "/v1/namespaces/{ns}/memory", {}),
    ("DELETE", "/v1/namespaces/{ns}", {}),
]


@pytest.mark.parametrize("method,url,kwargs", ENDPOINTS, ids=[f"{m} {u}" for m, u, _ in ENDPOINTS])
def test_a_tenant_cannot_touch_or_detect_another_tenants_namespace(served, caplog, method, url, kwargs) -> None:
    """globex on acme's namespace answers exactly as on one that does not exist; acme's memory is unchanged."""
    app, service = served
    before = call(app, "GET", "/v1/namespaces/acme-alice/memory").json()
    with caplog.at_level("DEBUG"):
        existing = call(app, method, url.format(ns="acme-alice"), token=GLOBEX, **kwargs)
        absent = call(app, method, url.format(ns="acme-nobody"), token=GLOBEX, **kwargs)
    assert existing.status_code == absent.status_code == 404
    assert existing.json() == {"error": "namespace acme-alice: not found"} and absent.json() == {"error": "namespace acme-nobody: not found"}
    assert call(app, "GET", "/v1/namespaces/acme-alice/memory").json() == before
    assert "acme-nobody" not in service.store.namespaces()
    assert call(app, "GET", "/v1/namespaces", token=GLOBEX).json() == {"namespaces": []}
    assert GLOBEX not in caplog.text and ACME not in caplog.text


def test_metrics_count_requests_by_route_without_namespaces(served) -> None:
    app, _ = served
    call(app, "POST", "/v1/namespaces/acme-alice/search", json=QUESTION)
    text = call(app, "GET", "/metrics", token=None).text
    assert 'qgmem_requests_total{route="/v1/namespaces/{namespace}/search",status="200"}' in text
    assert "qgmem_asks_pending 0.0" in text and "acme-alice" not in text


def test_health_needs_no_token(served) -> None:
    app, _ = served
    assert call(app, "GET", "/health", token=None).json() == {"status": "ok", "path": "text"}


def test_concurrent_asks_are_answered_in_one_generate_call(minilm, tmp_path) -> None:
    """While the model answers one ask, three more arrive: they are answered together, each with its own namespace's memory."""
    release = threading.Event()
    reply = json.dumps({"reasoning_path": "[F1] says it.", "answer": "yes"})

    def answer(chat: Any) -> str:
        release.wait(timeout=120)
        return reply

    llm = ScriptedLLM(answer)
    predictor = QGMemPredictor(None, pipeline(), llm=llm, embedder=minilm, reranker=None, intent="rules")
    app, service = serve(predictor, tmp_path / "store")
    for name, text in [("acme-a", "I adopted a cat named Miso."), ("acme-b", "I moved to Lisbon in June."), ("acme-c", "I play the cello.")]:
        assert call(app, "POST", f"/v1/namespaces/{name}/sessions", json={"turns": [{"speaker": "U", "text": text}]}).status_code == 200

    async def body(client: httpx.AsyncClient) -> list[httpx.Response]:
        headers = {"Authorization": f"Bearer {ACME}"}
        first = asyncio.create_task(client.post("/v1/namespaces/acme-a/ask", json={"question": "Which pet?"}, headers=headers))
        while not llm.batches:
            await asyncio.sleep(0.01)
        rest = [asyncio.create_task(client.post(f"/v1/namespaces/{ns}/ask", json={"question": "Where?"}, headers=headers)) for ns in ("acme-b", "acme-c", "acme-a")]
        while service.pending_asks < 3:
            await asyncio.sleep(0.01)
        release.set()
        return await asyncio.gather(first, *rest)

    responses = run(app, body)
    assert [r.status_code for r in responses] == [200] * 4
    assert llm.batches == [1, 3]
    assert [r.json()["units"][0]["fact_text"] for r in responses[1:3]] == ["U: I moved to Lisbon in June.", "U: I play the cello."]
    metrics = call(app, "GET", "/metrics", token=None).text
    assert "qgmem_ask_batch_size_count 2.0" in metrics and "qgmem_ask_batch_size_sum 4.0" in metrics
    service.close()


def test_an_unreachable_model_is_503_with_its_one_line(minilm, tmp_path) -> None:
    from qgmem_train.errors import ModelUnavailableError

    def down(chat: Any) -> str:
        raise ModelUnavailableError("http://127.0.0.1:9/v1: connection refused")

    predictor = QGMemPredictor(None, pipeline(), llm=ScriptedLLM(down), embedder=minilm, reranker=None, intent="rules")
    app, service = serve(predictor, tmp_path / "store")
    assert call(app, "POST", "/v1/namespaces/acme-a/sessions", json={"turns": [{"speaker": "U", "text": "I play the cello."}]}).status_code == 200
    response = call(app, "POST", "/v1/namespaces/acme-a/ask", json={"question": "Which instrument?"})
    assert response.status_code == 503 and response.json() == {"error": "model unavailable: http://127.0.0.1:9/v1: connection refused"}
    service.close()
