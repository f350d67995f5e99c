"""``serve`` through a real ASGI client (httpx's ASGITransport) over the bundled models (MiniLM, SmolLM2 for ask):
endpoints, one-line JSON errors, bounds, tenants isolated per endpoint, metrics, OpenAPI, batched asks, searches never
behind an ask and batched with each other, search filters and paged listings."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
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
        "/v1/namespaces/{namespace}/sessions/{session_id}", "/v1/namespaces/{namespace}/sessions/{session_id}/turns",
        "/v1/namespaces/{namespace}/adds/{add_id}",
    }  # fmt: skip
    assert set(schema["paths"]["/v1/namespaces/{namespace}/sessions/{session_id}"]) == {"get", "delete"}
    assert schema["paths"]["/v1/namespaces/{namespace}/sessions"]["post"]["responses"]["202"]["content"]["application/json"]["schema"]["$ref"].endswith("/AddAccepted")
    ask = schema["paths"]["/v1/namespaces/{namespace}/ask"]["post"]
    assert ask["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/AskOut")
    assert {"401", "404", "413", "415", "429"} <= set(ask["responses"])
    assert schema["components"]["securitySchemes"] == {"HTTPBearer": {"type": "http", "scheme": "bearer", "description": "a tenant's token (see docs/serve.md)"}}
    secured = {(path, method) for path, item in schema["paths"].items() for method, op in item.items() if op.get("security") == [{"HTTPBearer": []}]}
    assert secured == {(path, method) for path, item in schema["paths"].items() for method in item if path.startswith("/v1/")}
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
    assert listed["units_total"] == 1 and listed["sessions_total"] == 1 and "Miso" in listed["units"][0]["fact_text"]
    assert call(app, "GET", "/v1/namespaces/acme-bob/sessions").json()["sessions"][0]["session_id"] == first.json()["session_id"]
    assert call(app, "GET", "/v1/namespaces").json() == {"namespaces": ["acme-alice", "acme-bob"], "next": None}
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
        assert listed["units_total"] == 2 and listed["sessions_total"] == 1
        turns = call(app, "GET", "/v1/namespaces/acme-alice/sessions/S1?offset=1").json()
        assert turns["turns_total"] == 2 and [t["speaker"] for t in turns["turns"]] == ["Melanie"]
        found = call(app, "POST", "/v1/namespaces/acme-alice/search", json={**QUESTION, "speaker": "Caroline"}).json()
        assert [u["source_turns"][0]["speaker"] for u in found["units"]] == ["Caroline"]
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
        ("POST", "/v1/namespaces/acme-alice/search", None, {"content": b"{not json", "headers": {"Content-Type": "application/json"}}, 401, "bearer token"),
        ("POST", "/v1/namespaces/acme-alice/sessions", None, {"json": {"turns": []}}, 401, "bearer token"),
        ("POST", "/v1/namespaces/acme-alice/search", ACME, {"content": b"question=hi", "headers": {"Content-Type": "application/x-www-form-urlencoded"}}, 415, "application/json"),
        ("POST", "/v1/namespaces/acme-alice/sessions", ACME, {"content": b'{"turns": []}'}, 415, "content-type: none"),
        ("POST", "/v1/namespaces/acme-alice/search", ACME, {"json": {**QUESTION, "time": "someday"}}, 400, "time: unrecognised date"),
        ("POST", "/v1/namespaces/acme-alice/ask", ACME, {"json": {**QUESTION, "time": "someday"}}, 400, "time: unrecognised date"),
        ("POST", "/v1/namespaces/acme-alice/search", ACME, {"json": {**QUESTION, "since": "last Tuesday-ish"}}, 400, "since: unrecognised date"),
        ("POST", "/v1/namespaces/acme-alice/search", ACME, {"json": {**QUESTION, "since": "2023-06-01", "until": "2023-05-01"}}, 400, "is after until"),
        ("POST", "/v1/namespaces/acme-alice/search", ACME, {"json": {**QUESTION, "top_k": 0}}, 422, "body.top_k"),
        ("POST", "/v1/namespaces/acme-alice/search", ACME, {"json": {**QUESTION, "top_k": 101}}, 422, "body.top_k"),
        ("POST", "/v1/namespaces/acme-alice/search", ACME, {"json": {**QUESTION, "speaker": ""}}, 422, "body.speaker"),
        ("GET", "/v1/namespaces?limit=0", ACME, {}, 422, "query.limit"),
        ("GET", "/v1/namespaces?limit=1001", ACME, {}, 422, "query.limit"),
        ("GET", "/v1/namespaces/acme-alice/memory?offset=-1", ACME, {}, 422, "query.offset"),
        ("GET", "/v1/namespaces/acme-alice/sessions?limit=0", ACME, {}, 422, "query.limit"),
        ("GET", "/v1/namespaces/acme-alice/sessions/S1?offset=-1", ACME, {}, 422, "query.offset"),
        ("GET", "/v1/namespaces/acme-alice/sessions/S9", ACME, {}, 404, "session S9: not found"),
        ("GET", "/v1/namespaces/acme-nobody/sessions", ACME, {}, 404, "namespace acme-nobody: not found"),
        ("GET", "/v1/namespaces/acme-nobody/sessions/S1", ACME, {}, 404, "namespace acme-nobody: not found"),
        ("POST", "/v1/namespaces/acme-alice/sessions/S9/turns", ACME, {"json": {"turns": SESSION["turns"]}}, 404, "session S9: not found"),
        ("POST", "/v1/namespaces/acme-nobody/sessions/S1/turns", ACME, {"json": {"turns": SESSION["turns"]}}, 404, "namespace acme-nobody: not found"),
        ("POST", "/v1/namespaces/acme-alice/sessions/S1/turns", ACME, {"json": {"turns": []}}, 422, "body.turns"),
        ("POST", "/v1/namespaces/acme-alice/sessions/S1/turns", ACME, {"json": {"turns": SESSION["turns"], "time": "2023-05-09"}}, 422, "body.time: Extra inputs"),
        ("POST", "/v1/namespaces/acme-alice/sessions/S1/turns", ACME, {"content": b'{"turns": []}'}, 415, "content-type: none"),
        ("POST", "/v1/namespaces/acme-alice/sessions/S1/turns", None, {"json": {"turns": []}}, 401, "bearer token"),
        ("POST", "/v1/namespaces/acme-alice/sessions/S1/turns", ACME, {"json": {"turns": [{**SESSION["turns"][0], "id": "S1:1", "text": "other"}]}}, 400, "turn S1:1: already stored with other content"),
        ("POST", "/v1/namespaces/acme-alice/sessions?wait=maybe", ACME, {"json": SESSION}, 422, "query.wait"),
        ("DELETE", "/v1/namespaces/acme-alice/sessions/S9", ACME, {}, 404, "session S9: not found"),
        ("DELETE", "/v1/namespaces/acme-nobody/sessions/S1", ACME, {}, 404, "namespace acme-nobody: not found"),
        ("GET", "/v1/namespaces/acme-alice/adds/unknown-id", ACME, {}, 404, "add unknown-id: not found"),
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
    ("GET", "/v1/namespaces/{ns}/sessions", {}),
    ("GET", "/v1/namespaces/{ns}/sessions/S1", {}),
    ("POST", "/v1/namespaces/{ns}/search", {"json": QUESTION}),
    ("POST", "/v1/namespaces/{ns}/ask", {"json": QUESTION}),
    ("GET", "/v1/namespaces/{ns}/memory", {}),
    ("POST", "/v1/namespaces/{ns}/sessions/S1/turns", {"json": {"turns": SESSION["turns"]}}),
    ("POST", "/v1/namespaces/{ns}/sessions?wait=false", {"json": SESSION}),
    ("GET", "/v1/namespaces/{ns}/adds/some-id", {}),
    ("DELETE", "/v1/namespaces/{ns}/sessions/S1", {}),
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
    assert call(app, "GET", "/v1/namespaces", token=GLOBEX).json() == {"namespaces": [], "next": None}
    assert GLOBEX not in caplog.text and ACME not in caplog.text


def test_metrics_count_requests_by_route_without_namespaces(served) -> None:
    app, _ = served
    call(app, "POST", "/v1/namespaces/acme-alice/search", json=QUESTION)
    text = call(app, "GET", "/metrics", token=None).text
    assert 'qgmem_requests_total{route="/v1/namespaces/{namespace}/search",status="200"}' in text
    assert "qgmem_asks_pending 0.0" in text and "qgmem_searches_pending 0.0" in text and "acme-alice" not in text
    assert 'qgmem_request_seconds_bucket{le="300.0",route="/v1/namespaces/{namespace}/search"}' in text


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


def test_a_search_completes_while_an_ask_is_generating(minilm, tmp_path) -> None:
    """The ask's LLM blocks until released: the search sent meanwhile is answered while it still blocks (before the old
    one-model-thread service, it waited behind the ask)."""
    generating, release = threading.Event(), threading.Event()

    def answer(chat: Any) -> str:
        generating.set()
        release.wait(timeout=120)
        return json.dumps({"reasoning_path": "[F1] says it.", "answer": "Miso"})

    predictor = QGMemPredictor(None, pipeline(), llm=ScriptedLLM(answer), embedder=minilm, reranker=None, intent="rules")
    app, service = serve(predictor, tmp_path / "store")
    assert call(app, "POST", "/v1/namespaces/acme-a/sessions", json={"turns": [{"speaker": "U", "text": "I adopted a cat named Miso."}]}).status_code == 200

    async def body(client: httpx.AsyncClient) -> tuple[httpx.Response, bool, httpx.Response]:
        headers = {"Authorization": f"Bearer {ACME}"}
        asking = asyncio.create_task(client.post("/v1/namespaces/acme-a/ask", json={"question": "Which pet?"}, headers=headers))
        while not generating.is_set():
            await asyncio.sleep(0.01)
        try:
            found = await asyncio.wait_for(client.post("/v1/namespaces/acme-a/search", json={"question": "Which pet?"}, headers=headers), 120)
            ask_was_generating = not asking.done() and not release.is_set()
        finally:
            release.set()
        return found, ask_was_generating, await asking

    found, ask_was_generating, asked = run(app, body)
    assert found.status_code == 200 and "Miso" in found.json()["memory_context"] and ask_was_generating
    assert asked.status_code == 200 and asked.json()["answer"] == "Miso"
    service.close()


def test_concurrent_searches_are_embedded_in_one_batch_and_answer_as_each_alone(minilm, tmp_path) -> None:
    """Four searches waiting for the one worker are embedded in one batch; each result is the one that search gets alone."""
    predictor = QGMemPredictor(None, pipeline(), llm=ScriptedLLM([]), embedder=minilm, reranker=None, intent="rules")
    service = MemoryService(predictor, tmp_path / "store", workers=1)
    app = create_app(service, Tenants.from_records(TENANTS, "test"))
    texts = {"acme-a": ["I adopted a cat named Miso.", "Miso sleeps on the piano."], "acme-b": ["I moved to Lisbon in June.", "I play the cello on Sundays."]}
    for name, lines in texts.items():
        assert call(app, "POST", f"/v1/namespaces/{name}/sessions", json={"turns": [{"speaker": "U", "text": t} for t in lines]}).status_code == 200
    searches = [("acme-a", "What is the cat called?"), ("acme-b", "Where did I move?"), ("acme-a", "Where does Miso sleep?"), ("acme-b", "Which instrument?")]
    blocked = threading.Event()
    service._searchers.submit(blocked.wait, 120)

    async def together(client: httpx.AsyncClient) -> list[httpx.Response]:
        headers = {"Authorization": f"Bearer {ACME}"}
        tasks = [asyncio.create_task(client.post(f"/v1/namespaces/{ns}/search", json={"question": q, "top_k": 2}, headers=headers)) for ns, q in searches]
        while service.pending_searches < len(searches):
            await asyncio.sleep(0.01)
        blocked.set()
        return await asyncio.gather(*tasks)

    batched = run(app, together)
    metrics = call(app, "GET", "/metrics", token=None).text
    assert "qgmem_search_batch_size_count 1.0" in metrics and "qgmem_search_batch_size_sum 4.0" in metrics
    alone = [call(app, "POST", f"/v1/namespaces/{ns}/search", json={"question": q, "top_k": 2}) for ns, q in searches]
    without_seconds = lambda response: {key: value for key, value in response.json().items() if key != "seconds"}  # noqa: E731
    assert [without_seconds(r) for r in batched] == [without_seconds(r) for r in alone]
    assert [r.json()["units"][0]["fact_text"] for r in alone[:2]] == ["U: I adopted a cat named Miso.", "U: I moved to Lisbon in June."]
    service.close()


def test_search_takes_top_k_and_filters_by_speaker_session_and_date(minilm, tmp_path) -> None:
    predictor = QGMemPredictor(None, pipeline(), llm=ScriptedLLM([]), embedder=minilm, reranker=None, intent="rules")
    app, service = serve(predictor, tmp_path / "store")
    sessions = [
        {"session_id": "may", "time": "2023-05-08", "turns": [{"speaker": "Ann", "text": "I bought a red kite."}, {"speaker": "Bo", "text": "I bought a blue kite."}]},
        {"session_id": "june", "time": "2023-06-10", "turns": [{"speaker": "Ann", "text": "I flew my green kite."}, {"speaker": "Bo", "text": "My kite broke."}]},
    ]  # fmt: skip
    for session in sessions:
        assert call(app, "POST", "/v1/namespaces/acme-k/sessions", json=session).status_code == 200

    def facts(**extra: Any) -> list[str]:
        response = call(app, "POST", "/v1/namespaces/acme-k/search", json={"question": "Which kite?", **extra})
        assert response.status_code == 200, response.text
        return sorted(unit["fact_text"] for unit in response.json()["units"])

    assert len(facts()) == 3 and len(facts(top_k=4)) == 4 and len(facts(top_k=1)) == 1
    assert facts(speaker="Ann") == ["Ann: I bought a red kite.", "Ann: I flew my green kite."]
    assert facts(session_id="june") == ["Ann: I flew my green kite.", "Bo: My kite broke."]
    assert facts(since="2023-06-01") == facts(session_id="june") and facts(until="31 May, 2023") == facts(session_id="may")
    assert facts(speaker="Bo", since="2023-05-01", until="2023-05-31") == ["Bo: I bought a blue kite."]
    assert facts(speaker="Nobody") == [] and facts(session_id="july") == []
    service.close()


def test_namespaces_sessions_and_turns_are_listed_a_page_at_a_time(minilm, tmp_path, monkeypatch) -> None:
    """Pages come from the store's own paging: the namespace is never loaded whole to list it."""
    predictor = QGMemPredictor(None, pipeline(), llm=ScriptedLLM([]), embedder=minilm, reranker=None, intent="rules")
    app, service = serve(predictor, tmp_path / "store")
    for name in ("acme-a", "acme-b", "acme-c"):
        for session in ("S1", "S2"):
            turns = [{"speaker": "U", "text": f"{name} {session} turn {n}"} for n in range(3)]
            assert call(app, "POST", f"/v1/namespaces/{name}/sessions", json={"session_id": session, "turns": turns}).status_code == 200
    service.store.ensure_namespace("globex-main", "turns", minilm.model_id, minilm.dim)
    monkeypatch.setattr(service.store, "load_namespace", lambda *a, **k: pytest.fail("a listing loaded the namespace"))
    first = call(app, "GET", "/v1/namespaces?limit=2").json()
    assert first == {"namespaces": ["acme-a", "acme-b"], "next": "acme-b"}
    assert call(app, "GET", "/v1/namespaces?limit=2&after=acme-b").json() == {"namespaces": ["acme-c"], "next": None}
    assert call(app, "GET", "/v1/namespaces", token=GLOBEX).json() == {"namespaces": ["globex-main"], "next": None}
    page = call(app, "GET", "/v1/namespaces/acme-b/memory?limit=1&offset=1").json()
    assert page["units_total"] == 6 and page["sessions_total"] == 2 and page["offset"] == 1 and len(page["units"]) == 1
    sessions = call(app, "GET", "/v1/namespaces/acme-b/sessions?offset=1&limit=5").json()
    assert sessions == {"namespace": "acme-b", "sessions_total": 2, "offset": 1, "sessions": [{"session_id": "S2", "turns": 3, "time": None}]}
    turns = call(app, "GET", "/v1/namespaces/acme-b/sessions/S2?offset=1&limit=1").json()
    assert turns == {"namespace": "acme-b", "session_id": "S2", "turns_total": 3, "time": None, "offset": 1,
                     "turns": [{"id": "S2:2", "speaker": "U", "text": "acme-b S2 turn 1"}]}  # fmt: skip
    service.close()


def test_an_added_session_is_charged_to_its_tenant_by_its_turns(minilm, tmp_path) -> None:
    """One request a 2 turns: a 6-turn add spends the burst of 3; the next request waits, another tenant's does not."""
    predictor = QGMemPredictor(None, pipeline(), llm=ScriptedLLM([]), embedder=minilm, reranker=None, intent="rules")
    app, service = serve(predictor, tmp_path / "store", Limits(rate_per_minute=1, burst=3, turns_per_request=2))
    turns = [{"speaker": "U", "text": f"turn {n}"} for n in range(6)]
    assert call(app, "POST", "/v1/namespaces/acme-a/sessions", json={"turns": turns}).status_code == 200
    limited = call(app, "GET", "/v1/namespaces")
    assert limited.status_code == 429 and int(limited.headers["Retry-After"]) >= 1
    assert call(app, "GET", "/v1/namespaces", token=GLOBEX).status_code == 200
    service.close()


class _BlockingEmbedder:
    """MiniLM, except that encoding a text with ``SLOW`` in it waits for ``release`` (a long add, made long on purpose)."""

    def __init__(self, embedder: Any) -> None:
        self.embedder, self.model_id, self.dim = embedder, embedder.model_id, embedder.dim
        self.blocked, self.release = threading.Event(), threading.Event()

    def encode(self, texts: list[str], batch_size: int = 64) -> Any:
        if any("SLOW" in text for text in texts):
            self.blocked.set()
            self.release.wait(timeout=120)
        return self.embedder.encode(texts, batch_size)


def test_a_search_completes_while_an_add_of_the_same_namespace_is_writing(minilm, tmp_path) -> None:
    embedder = _BlockingEmbedder(minilm)
    predictor = QGMemPredictor(None, pipeline(), llm=ScriptedLLM([]), embedder=embedder, reranker=None, intent="rules")
    app, service = serve(predictor, tmp_path / "store")
    assert call(app, "POST", "/v1/namespaces/acme-a/sessions", json={"turns": [{"speaker": "U", "text": "I adopted a cat named Miso."}]}).status_code == 200

    async def body(client: httpx.AsyncClient) -> tuple[httpx.Response, bool, httpx.Response]:
        headers = {"Authorization": f"Bearer {ACME}"}
        slow = {"turns": [{"speaker": "U", "text": f"SLOW turn {n}"} for n in range(60)]}
        adding = asyncio.create_task(client.post("/v1/namespaces/acme-a/sessions", json=slow, headers=headers))
        while not embedder.blocked.is_set():
            await asyncio.sleep(0.01)
        try:
            found = await asyncio.wait_for(client.post("/v1/namespaces/acme-a/search", json={"question": "Which pet?"}, headers=headers), 120)
            add_was_writing = not adding.done() and not embedder.release.is_set()
        finally:
            embedder.release.set()
        return found, add_was_writing, await adding

    found, add_was_writing, added = run(app, body)
    assert found.status_code == 200 and "Miso" in found.json()["memory_context"] and add_was_writing
    assert added.status_code == 200 and added.json()["units"] == 60
    service.close()


def test_a_session_is_appended_to_read_back_and_deleted_alone(minilm, tmp_path) -> None:
    predictor = QGMemPredictor(None, pipeline(), llm=ScriptedLLM([]), embedder=minilm, reranker=None, intent="rules")
    app, service = serve(predictor, tmp_path / "store", Limits(max_turns=5))
    other = {"session_id": "S2", "turns": [{"speaker": "Bo", "text": "I bought a blue kite."}]}
    assert call(app, "POST", "/v1/namespaces/acme-a/sessions", json=SESSION).json()["turns_total"] == 2
    assert call(app, "POST", "/v1/namespaces/acme-a/sessions", json=other).status_code == 200
    more = [{"id": "S1:3", "speaker": "Caroline", "text": "I adopted a tabby cat called Zorblatt."}, {"id": "S1:4", "speaker": "Melanie", "text": "Lovely!"}]
    appended = call(app, "POST", "/v1/namespaces/acme-a/sessions/S1/turns", json={"turns": more})
    assert appended.status_code == 200 and appended.json()["turns_total"] == 4, appended.text
    assert (appended.json()["windows_built"], appended.json()["units"]) == (1, 4)  # the session's one window, built again over 4 turns
    assert call(app, "POST", "/v1/namespaces/acme-a/sessions/S1/turns", json={"turns": more}).json()["turns_total"] == 4  # a retry: once
    too_many = call(app, "POST", "/v1/namespaces/acme-a/sessions/S1/turns", json={"turns": SESSION["turns"]})
    assert too_many.status_code == 400 and too_many.json() == {"error": "turns: 4 stored and 2 appended, more than the 5 a session may have"}
    read = call(app, "GET", "/v1/namespaces/acme-a/sessions/S1").json()
    assert [t["text"] for t in read["turns"]] == [t["text"] for t in SESSION["turns"] + more] and read["time"] == "2023-05-08"

    def search() -> str:
        return call(app, "POST", "/v1/namespaces/acme-a/search", json={"question": "What is the cat called?", "top_k": 10}).json()["memory_context"]

    assert "Zorblatt" in search()
    assert call(app, "DELETE", "/v1/namespaces/acme-a/sessions/S1").status_code == 204
    assert call(app, "GET", "/v1/namespaces/acme-a/sessions/S1").json() == {"error": "session S1: not found"}
    assert call(app, "DELETE", "/v1/namespaces/acme-a/sessions/S1").status_code == 404
    assert "Zorblatt" not in search() and "blue kite" in search()
    listed = call(app, "GET", "/v1/namespaces/acme-a/memory").json()
    assert (listed["units_total"], listed["sessions_total"]) == (1, 1) and call(app, "GET", "/v1/namespaces").json()["namespaces"] == ["acme-a"]
    service.close()


def test_an_add_sent_without_waiting_is_202_and_its_status_url_reports_it_done_or_failed(minilm, tmp_path) -> None:
    predictor = QGMemPredictor(None, pipeline(), llm=ScriptedLLM([]), embedder=minilm, reranker=None, intent="rules")
    app, service = serve(predictor, tmp_path / "store")
    headers = {"Authorization": f"Bearer {ACME}"}

    async def until_settled(client: httpx.AsyncClient, url: str) -> dict[str, Any]:
        seen = set()
        while True:
            status = (await client.get(url, headers=headers)).json()
            seen.add(status["state"])
            if status["state"] in ("done", "failed"):
                return {**status, "seen": seen}
            await asyncio.sleep(0.01)

    async def body(client: httpx.AsyncClient) -> list[Any]:
        sent = [
            await client.post("/v1/namespaces/acme-q/sessions?wait=false", json=SESSION, headers=headers),
            await client.post("/v1/namespaces/acme-q/sessions?wait=false", json={**SESSION, "session_id": "S2", "time": "someday"}, headers=headers),
            await client.post("/v1/namespaces/acme-q/sessions/S9/turns?wait=false", json={"turns": SESSION["turns"]}, headers=headers),
        ]
        statuses = [await until_settled(client, response.json()["status_url"]) for response in sent]
        other = await client.get(sent[0].json()["status_url"].replace("acme-q", "acme-r"), headers=headers)
        return [sent, statuses, other]

    sent, (done, bad_time, no_session), other = run(app, body)
    assert [r.status_code for r in sent] == [202] * 3 and sent[0].headers["Location"] == sent[0].json()["status_url"]
    assert done["state"] == "done" and done["result"]["session_id"] == "S1" and done["result"]["turns_total"] == 2 and done["status"] is None
    assert call(app, "GET", "/v1/namespaces/acme-q/sessions/S1").json()["turns_total"] == 2
    assert (bad_time["state"], bad_time["status"], bad_time["result"]) == ("failed", 400, None) and "unrecognised date" in bad_time["error"]
    assert (no_session["state"], no_session["status"], no_session["error"]) == ("failed", 404, "session S9: not found")
    assert other.status_code == 404 and other.json() == {"error": f"add {sent[0].json()['add_id']}: not found"}
    service.close()


def test_a_filtered_search_returns_top_k_units_when_that_many_match_beyond_the_fused_pool(minilm, tmp_path) -> None:
    """The pool of ``retrieval.n`` holds the question's best units, none of Bo's: the filter still finds top_k of his."""
    cfg = pipeline()
    cfg.retrieval.n = 4
    predictor = QGMemPredictor(None, cfg, llm=ScriptedLLM([]), embedder=minilm, reranker=None, intent="rules")
    app, service = serve(predictor, tmp_path / "store")
    turns = [{"speaker": "Ann", "text": f"My kite number {n} flew over the beach."} for n in range(6)]
    turns += [{"speaker": "Bo", "text": f"I cooked soup with {food}."} for food in ("lentils", "carrots", "onions", "leeks", "beans")]
    assert call(app, "POST", "/v1/namespaces/acme-f/sessions", json={"session_id": "S1", "turns": turns}).status_code == 200

    def speakers(**extra: Any) -> list[str]:
        response = call(app, "POST", "/v1/namespaces/acme-f/search", json={"question": "Where did my kite fly?", **extra})
        return [unit["source_turns"][0]["speaker"] for unit in response.json()["units"]]

    assert speakers(top_k=4) == ["Ann"] * 4
    assert speakers(top_k=3, speaker="Bo") == ["Bo"] * 3 and speakers(top_k=10, speaker="Bo") == ["Bo"] * 5
    assert speakers(top_k=10, speaker="Nobody") == []
    service.close()


@pytest.mark.skipif(not hasattr(os, "getpriority"), reason="thread priorities are Linux's")
def test_ask_and_write_threads_run_nicer_than_search_workers(minilm, tmp_path) -> None:
    """On busy cores the scheduler gives a search's thread the CPU before a generating ask's or a writing add's."""
    predictor = QGMemPredictor(None, pipeline(), llm=ScriptedLLM([]), embedder=minilm, reranker=None, intent="rules")
    service = MemoryService(predictor, tmp_path / "store", background_nice=3)

    def nice() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    search, ask, write = (pool.submit(nice).result() for pool in (service._searchers, service._asker, service._writers))
    service.close()
    assert search == os.getpriority(os.PRIO_PROCESS, 0) and ask == write == min(19, search + 3)
