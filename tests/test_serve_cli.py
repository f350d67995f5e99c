"""``python -m qgmem_train serve``: tenants from a file or the environment, bad options as one line and exit 2,
and a real uvicorn server process on 127.0.0.1 answering over HTTP."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from qgmem_train.__main__ import main
from qgmem_train.serve.tenants import TENANTS_ENV, Tenants

TOKEN = "acme-token-0123456789abcdef"
OTHER_TOKEN = "Vq3xN0c8rTz1LmP5yWb7Ke"
ROOT = Path(__file__).parent.parent


def test_tenants_come_from_a_file_or_the_environment_with_tokens_in_variables(tmp_path) -> None:
    document = {"tenants": [{"name": "acme", "token_env": "ACME_TOKEN", "prefixes": ["acme-"]}, {"name": "b", "token": OTHER_TOKEN, "namespaces": ["b1"]}]}
    path = tmp_path / "tenants.yaml"
    path.write_text(yaml.safe_dump(document))
    from_file = Tenants.load(path, {"ACME_TOKEN": TOKEN})
    from_env = Tenants.load(None, {"ACME_TOKEN": TOKEN, TENANTS_ENV: yaml.safe_dump(document)})
    for tenants in (from_file, from_env):
        acme = tenants.authenticate(TOKEN)
        assert acme is not None and acme.name == "acme" and acme.may("acme-x") and not acme.may("b1")
        assert tenants.authenticate(OTHER_TOKEN).may("b1") and tenants.authenticate(OTHER_TOKEN[:-1]) is None and tenants.authenticate(None) is None


@pytest.mark.parametrize(
    "tenants,needle",
    [
        ({"tenants": [{"name": "a", "token": "short-secret", "prefixes": ["a-"]}]}, "tenant 1 (a).token: expected a random string of at least 128 bits"),
        ({"tenants": [{"name": "a", "token": "b" * 64, "prefixes": ["a-"]}]}, "make one with python -c 'import secrets; print(secrets.token_urlsafe(32))'"),
        ({"tenants": [{"name": "a", "token": "0f" * 32, "prefixes": ["a-"]}]}, "tenant 1 (a).token: expected a random string of at least 128 bits"),
        ({"tenants": [{"name": "a", "token": "0123456789abcde", "prefixes": ["a-"]}]}, "tenant 1 (a).token: expected a random string of at least 128 bits"),
        ({"tenants": [{"name": "a", "token": TOKEN, "prefixes": ["a-"]}, {"name": "b", "token": TOKEN, "namespaces": ["b"]}]}, "same token as tenant a"),
        ({"tenants": [{"name": "a", "token_env": "QGMEM_TEST_UNSET_TOKEN", "prefixes": ["a-"]}]}, "variable QGMEM_TEST_UNSET_TOKEN is not set"),
        ({"tenants": [{"name": "a", "token": TOKEN, "prefix": ["a-"]}]}, "tenant 1.prefix: unknown field"),
        ({"tenants": [{"name": "a", "token": TOKEN}]}, "may touch nothing"),
        ({"users": []}, "expected `tenants:`"),
        ({"tenants": [{"name": "acme", "token": TOKEN, "prefixes": ["acme-"]}, {"name": "acme-eu", "token": TOKEN[::-1], "prefixes": ["acme-eu-"]}]},
         "tenants 'acme' and 'acme-eu' overlap (prefix 'acme-' of 'acme' covers prefix 'acme-eu-' of 'acme-eu')"),
        ({"tenants": [{"name": "eu", "token": TOKEN, "prefixes": ["acme-eu-"]}, {"name": "acme", "token": TOKEN[::-1], "prefixes": ["acme-"]}]},
         "tenants 'eu' and 'acme' overlap (prefix 'acme-' of 'acme' covers prefix 'acme-eu-' of 'eu')"),
        ({"tenants": [{"name": "a", "token": TOKEN, "prefixes": ["team-"]}, {"name": "b", "token": TOKEN[::-1], "namespaces": ["team-b"]}]},
         "tenants 'a' and 'b' overlap (prefix 'team-' of 'a' covers namespace 'team-b' of 'b')"),
        ({"tenants": [{"name": "a", "token": TOKEN, "namespaces": ["x", "shared"]}, {"name": "b", "token": TOKEN[::-1], "namespaces": ["shared"]}]},
         "tenants 'a' and 'b' overlap (both list namespace 'shared')"),
        (f"tenants:\n- name: a\n  token: {TOKEN}\n  namespaces: [{'9' * 5000}]\n", "not YAML or JSON: Exceeds the limit (4300 digits)"),
    ],
)
def test_a_bad_tenants_file_is_one_line_without_the_token(tmp_path, capsys, tenants, needle) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text(tenants if isinstance(tenants, str) else yaml.safe_dump(tenants))
    assert main(["serve", "--store", str(tmp_path / "store"), "--tenants", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0] and TOKEN not in err[0] and "short-secret" not in err[0]
    assert not (tmp_path / "store").exists()


def test_no_tenants_and_bad_limits_are_refused(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.delenv(TENANTS_ENV, raising=False)
    assert main(["serve", "--store", str(tmp_path / "store")]) == 2
    assert f"give a tenants file or set {TENANTS_ENV}" in capsys.readouterr().err
    assert main(["serve", "--store", str(tmp_path / "store"), "--burst", "0"]) == 2
    assert "burst must be at least 1" in capsys.readouterr().err


def docs_curl_outputs(port: int, env: dict[str, str]) -> list[str]:
    """Run the curl commands of docs/serve.md's example (against ``port``) and return what each printed."""
    example = (ROOT / "docs" / "serve.md").read_text(encoding="utf-8").split("## Example", 1)[1]
    block = example.split("```bash\n", 1)[1].split("```", 1)[0]
    commands = re.findall(r"^curl .*$", block.replace("\\\n", " "), flags=re.MULTILINE)
    assert len(commands) == 2 and all("127.0.0.1:8000" in c for c in commands)
    outputs = []
    for command in commands:
        done = subprocess.run(["bash", "-c", command.replace("127.0.0.1:8000", f"127.0.0.1:{port}")], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout)
    return outputs


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.slow
def test_a_real_server_process_on_loopback_adds_searches_and_asks(tmp_path) -> None:
    """uvicorn in its own process over the bundled models, tenants from the environment, driven by the curl example of
    docs/serve.md; the token never reaches its log."""
    config = tmp_path / "serve.yaml"
    config.write_text("pipeline:\n  construction:\n    units: turns\n    traces: false\n  generation:\n    max_new_tokens: 32\n")
    tenants = yaml.safe_dump({"tenants": [{"name": "acme", "token_env": "ACME_TOKEN", "prefixes": ["acme-"]}]})
    port = _free_port()
    env = {**os.environ, TENANTS_ENV: tenants, "ACME_TOKEN": TOKEN}
    command = [sys.executable, "-m", "qgmem_train", "serve", "--store", str(tmp_path / "store"), "--config", str(config), "--reranker", "none",
               "--intent", "rules", "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300
        while True:
            assert server.poll() is None, log.read_text()
            try:
                if httpx.get(f"{base}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "server did not come up"
            time.sleep(0.5)
        added, answer = [json.loads(out) for out in docs_curl_outputs(port, env)]
        assert added["units"] == 1 and added["namespace"] == "acme-alex"
        assert answer["question"] == "What is my dog called?" and "Biscuit" in answer["units"][0]["fact_text"] and "cited" in answer
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=300) as client:
            found = client.post("/v1/namespaces/acme-alex/search", json={"question": "What is my dog called?"}).json()
            assert "Biscuit" in found["memory_context"]
            assert client.get("/v1/namespaces/acme-alex/memory", headers={"Authorization": "Bearer wrong-token-0123456789"}).status_code == 401
    finally:
        server.terminate()
        server.wait(timeout=60)
    text = log.read_text()
    assert "Uvicorn running on http://127.0.0.1" in text and '"POST /v1/namespaces/acme-alex/ask HTTP/1.1" 200' in text
    assert TOKEN not in text and "wrong-token" not in text


async def _echo_app(scope, receive, send) -> None:
    """A plain ASGI app: reads the whole body, answers 200 with its length."""
    if scope["type"] != "http":
        return
    size, more = 0, True
    while more:
        message = await receive()
        if message["type"] != "http.request":
            return
        size, more = size + len(message.get("body", b"")), message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": str(size).encode()})


@contextlib.contextmanager
def _guarded_server(guards):
    """serve's uvicorn settings over :func:`_echo_app`, listening on loopback in a thread."""
    import threading

    import uvicorn

    from qgmem_train.serve.cli import server_config

    port = _free_port()
    server = uvicorn.Server(server_config(_echo_app, "127.0.0.1", port, guards))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server did not come up"
        time.sleep(0.05)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def test_silent_connections_past_the_cap_make_room_and_another_client_is_answered(caplog) -> None:
    """Three times the cap of connections that send nothing (their deadline far off): the one waiting longest is closed
    for each new one, another client is answered, and the log holds a few throttled lines, no traceback."""
    from qgmem_train.serve.connections import ConnectionLimits

    caplog.set_level(logging.INFO)
    with _guarded_server(ConnectionLimits(header_timeout_s=600, body_timeout_s=600, max_connections=8)) as port:
        silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(24)]
        try:
            answer = httpx.post(f"http://127.0.0.1:{port}/", content=b"hello", timeout=30)
            assert answer.status_code == 200 and answer.text == "5"
        finally:
            for sock in silent:
                sock.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "qgmem_train.serve"]
    assert lines and len(lines) <= 3 and all("closed the connection waiting longest" in line for line in lines), lines
    assert "Traceback" not in caplog.text and not [r for r in caplog.records if r.exc_info]


@pytest.mark.parametrize("sent", [b"", b"GET / HTTP/1.1\r\nHost: x\r\n", b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n12"])
def test_a_request_head_or_body_not_sent_in_time_closes_the_connection(caplog, sent: bytes) -> None:
    """Nothing, half a head, or two bytes of a ten-byte body: the server closes the connection at its deadline."""
    from qgmem_train.serve.connections import ConnectionLimits

    caplog.set_level(logging.INFO)
    with _guarded_server(ConnectionLimits(header_timeout_s=0.5, body_timeout_s=0.5)) as port:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(sent)
            sock.settimeout(60)
            assert sock.recv(1024) == b"", "the server closed the connection"
    phase = "body" if b"Content-Length" in sent else "head"
    assert any(f"request {phase} did not arrive within 0.5 s" in r.getMessage() for r in caplog.records), caplog.text


@pytest.mark.parametrize(("client", "public", "shown"), [("127.0.0.1", False, True), ("203.0.113.7", False, False), ("203.0.113.7", True, True)])
def test_metrics_and_docs_answer_another_machine_only_when_switched_on(client: str, public: bool, shown: bool) -> None:
    """The operators' pages need no token: by default only a client on this machine sees them; the API is unaffected."""
    import asyncio

    from fastapi import FastAPI

    from qgmem_train.serve.operations import operators_pages

    api = FastAPI()
    api.get("/metrics")(lambda: {"requests": 1})
    api.get("/health")(lambda: {"status": "ok"})
    app = operators_pages(api, public_metrics=public, public_docs=public)

    async def statuses() -> dict[str, int]:
        transport = httpx.ASGITransport(app=app, client=(client, 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://serve") as http:
            return {path: (await http.get(path)).status_code for path in ("/metrics", "/docs", "/openapi.json", "/health")}

    expected = 200 if shown else 404
    assert asyncio.run(statuses()) == {"/metrics": expected, "/docs": expected, "/openapi.json": expected, "/health": 200}


def test_bad_worker_settings_are_one_line_and_exit_2(tmp_path, capsys) -> None:
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(yaml.safe_dump({"tenants": [{"name": "a", "token": TOKEN, "prefixes": ["a-"]}]}))
    for option in ("--workers", "--torch-threads", "--rerank-top", "--turns-per-request"):
        assert main(["serve", "--store", str(tmp_path / "store"), "--tenants", str(tenants), option, "0"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and ("must be at least 1" in err[0]) and (option in err[0] or option.strip("-").replace("-", "_") in err[0]), err
    for value in ("-1", "20"):
        assert main(["serve", "--store", str(tmp_path / "store"), "--tenants", str(tenants), "--background-nice", value]) == 2
        assert capsys.readouterr().err.strip() == f"error: --background-nice: must be 0 to 19, got {value}"
    assert not (tmp_path / "store").exists()


def test_on_a_cpu_the_defaults_are_rule_intents_and_no_llm_reranker() -> None:
    from qgmem_train.serve.cli import build_parser, default_reranker

    assert build_parser().parse_args(["--store", "s"]).intent == "rules"
    assert default_reranker(None, None) == "none" and default_reranker(None, "llm") == "llm" and default_reranker(None, "cross") == "cross"


def test_an_llm_stage_on_a_cpu_is_warned_about_in_one_line_with_its_measured_cost(smollm2, minilm) -> None:
    from qgmem_train.config import PipelineConfig
    from qgmem_train.predictor import QGMemPredictor
    from qgmem_train.retrieval.rerank import LLMReranker
    from qgmem_train.serve.costs import cpu_llm_warning

    cfg = PipelineConfig()
    cfg.retrieval.rerank_top = 20
    cheap = QGMemPredictor(None, cfg, llm=smollm2, embedder=minilm, reranker=None, intent="rules")
    assert cpu_llm_warning(cheap) is None
    costly = QGMemPredictor(None, cfg, llm=smollm2, embedder=minilm, reranker=LLMReranker(smollm2), intent="llm")
    line = cpu_llm_warning(costly)
    assert line is not None and "\n" not in line
    assert re.search(r"the LLM intent parser \(\d+\.\d s\) and the LLM reranker \(about \d+ s: 20 pairs at \d+\.\d\d s\)", line), line
