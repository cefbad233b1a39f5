"""Server contract over real HTTP on 127.0.0.1: Search-R1 request/reply shapes, 4xx errors,
concurrency, and the micro-batcher."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time

import httpx
import pytest

from sorl_verl.retrieval.server import MicroBatcher, create_app, uvicorn_config


def post(server, body, **kwargs):
    return httpx.post(server.url + "/retrieve", json=body, timeout=10, **kwargs)


def test_health(live_server):
    reply = httpx.get(live_server.url + "/health", timeout=5).json()
    assert reply == {"status": "ok", "method": "bm25", "num_docs": 6, "default_topk": 2, "max_topk": 5, "max_batch": 8}


def test_retrieve_with_scores(live_server, small_docs):
    reply = post(live_server, {"queries": ["capital of Germany", "venomous snake"], "topk": 1, "return_scores": True})
    assert reply.status_code == 200
    result = reply.json()["result"]
    assert [[hit["document"]["id"] for hit in hits] for hits in result] == [["berlin"], ["cobra"]]
    hit = result[0][0]
    assert set(hit) == {"document", "score"} and isinstance(hit["score"], float)
    assert hit["document"] == small_docs[1]


def test_retrieve_documents_only_and_default_topk(live_server):
    for body in (
        {"queries": ["capital city river France"]},
        {"queries": ["capital city river France"], "topk": None, "return_scores": False},
    ):
        result = post(live_server, body).json()["result"]
        assert len(result) == 1 and len(result[0]) == 2  # the server's default topk
        assert all(set(doc) == {"id", "contents"} for doc in result[0])
        assert result[0][0]["id"] == "paris"
    assert post(live_server, {"queries": []}).json() == {"result": []}
    assert post(live_server, {"queries": ["the"], "topk": 3}).json() == {"result": [[]]}


@pytest.mark.parametrize(
    "body, status, message",
    [
        (b"{not json", 400, "not valid JSON"),
        (b"[1, 2]", 422, "must be a JSON object"),
        (b'{"topk": 3}', 422, "field 'queries' is required"),
        (b'{"queries": "paris"}', 422, "must be a list of strings"),
        (b'{"queries": ["paris", 3]}', 422, "queries[1] must be a string"),
        (b'{"queries": ["paris", null]}', 422, "queries[1] must be a string"),
        (b'{"queries": ["paris"], "topk": 0}', 422, "between 1 and 5"),
        (b'{"queries": ["paris"], "topk": -2}', 422, "between 1 and 5"),
        (b'{"queries": ["paris"], "topk": 6}', 422, "between 1 and 5"),
        (b'{"queries": ["paris"], "topk": "3"}', 422, "'topk' must be an integer"),
        (b'{"queries": ["paris"], "topk": true}', 422, "'topk' must be an integer"),
        (b'{"queries": ["paris"], "return_scores": "yes"}', 422, "'return_scores' must be true or false"),
        (json.dumps({"queries": ["q"] * 9}).encode(), 422, "the cap is 8"),
        (json.dumps({"queries": ["x" * 5000]}).encode(), 413, "exceeds the cap of 4096 bytes"),
    ],
)
def test_bad_input_gets_clear_4xx_and_server_survives(live_server, body, status, message):
    reply = httpx.post(
        live_server.url + "/retrieve", content=body, headers={"content-type": "application/json"}, timeout=10
    )
    assert reply.status_code == status
    assert message in reply.json()["detail"]
    assert post(live_server, {"queries": ["snake"], "topk": 1}).json()["result"][0][0]["id"] == "cobra"


def test_body_cap_without_content_length(live_server):
    def chunks():
        for _ in range(10):
            yield b" " * 1000

    reply = httpx.post(
        live_server.url + "/retrieve", content=chunks(), headers={"content-type": "application/json"}, timeout=10
    )
    assert reply.status_code == 413


def test_unknown_routes_and_methods_get_json_404_and_405(live_server):
    missing = httpx.get(live_server.url + "/search", timeout=10)
    assert missing.status_code == 404 and missing.json() == {"detail": "Not Found"}
    wrong = httpx.get(live_server.url + "/retrieve", timeout=10)
    assert wrong.status_code == 405 and wrong.headers["allow"] == "POST" and wrong.json()["detail"]
    assert httpx.post(live_server.url + "/health", timeout=10).status_code == 405
    head = httpx.head(live_server.url + "/health", timeout=10)
    assert head.status_code == 200 and head.content == b""


def test_served_on_uvloop_and_httptools_without_per_request_extras(small_bm25):
    import uvloop
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    config = uvicorn_config(create_app(small_bm25), "127.0.0.1", 8000)
    config.load()
    assert config.http_protocol_class is HttpToolsProtocol
    assert not config.access_log and not config.proxy_headers
    loop = config.get_loop_factory()()
    try:
        assert isinstance(loop, uvloop.Loop)
    finally:
        loop.close()
    assert uvicorn_config(create_app(small_bm25), "127.0.0.1", 8000, log_level="info").access_log


def read_reply(sock) -> tuple[str, dict[str, str], bytes]:
    """One HTTP/1.1 reply with a Content-Length from ``sock``: (status line, headers, body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed after {data!r}"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    status, *lines = head.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines)
    while len(body) < int(headers["content-length"]):
        body += sock.recv(65536)
    return status, headers, body


def test_keep_alive_answers_many_requests_on_one_connection(live_server):
    """Three requests on one socket, each answered whole (Content-Length, JSON); then a 413 closes it."""
    port = int(live_server.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        for query, want in [("venomous snake", "cobra"), ("capital of Germany", "berlin"), ("fifth planet", "jupiter")]:
            body = json.dumps({"queries": [query], "topk": 1}).encode()
            sock.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            status, headers, reply = read_reply(sock)
            assert status == "HTTP/1.1 200 OK" and headers["content-type"] == "application/json"
            assert "connection" not in headers
            hits = json.loads(reply)["result"]
            assert [[hit["id"] for hit in row] for row in hits] == [[want]] and set(hits[0][0]) == {"id", "contents"}
        sock.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n")
        status, headers, reply = read_reply(sock)
        assert status.startswith("HTTP/1.1 413") and headers["connection"] == "close"
        assert "exceeds the cap" in json.loads(reply)["detail"]
        assert sock.recv(1) == b""  # closed by the server


def test_concurrent_clients_get_their_own_results(live_server):
    cases = [
        ("capital of Germany", "berlin"),
        ("venomous snake", "cobra"),
        ("programming language", "python"),
        ("fifth planet", "jupiter"),
        ("river northern France", "seine"),
    ]

    async def client(session, i):
        query, want = cases[i % len(cases)]
        reply = await session.post(live_server.url + "/retrieve", json={"queries": [query], "topk": 1 + i % 3})
        hits = reply.json()["result"][0]
        return hits[0]["id"] == want and len(hits) <= 1 + i % 3

    async def run():
        async with httpx.AsyncClient(timeout=20) as session:
            return await asyncio.gather(*(client(session, i) for i in range(64)))

    assert all(asyncio.run(run()))


def test_micro_batcher_merges_waiting_requests_and_cuts_topk():
    calls = []

    def slow_search(queries, topk):
        calls.append((list(queries), topk))
        time.sleep(0.05)
        return [[{"document": {"id": f"{q}-{r}", "contents": ""}, "score": -r} for r in range(topk)] for q in queries]

    async def run():
        batcher = MicroBatcher(slow_search, max_batch=5)
        results = await asyncio.gather(*(batcher.search([f"q{i}", f"r{i}"], topk=1 + i % 2) for i in range(6)))
        await batcher.close()
        return results, batcher.batch_sizes

    results, batch_sizes = asyncio.run(run())
    for i, result in enumerate(results):
        assert [[hit["document"]["id"] for hit in hits] for hits in result] == [
            [f"q{i}-{r}" for r in range(1 + i % 2)],
            [f"r{i}-{r}" for r in range(1 + i % 2)],
        ]
    assert sum(batch_sizes) == 12 and max(batch_sizes) <= 5 and len(batch_sizes) < 6


def test_retriever_failure_is_a_500_and_the_server_lives_on():
    class Flaky:
        def search(self, queries, topk=3):
            if "boom" in queries:
                raise RuntimeError("index exploded")
            if "short" in queries:
                return []
            return [[] for _ in queries]

    async def run():
        transport = httpx.ASGITransport(app=create_app(Flaky()))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            failed = await client.post("/retrieve", json={"queries": ["boom"]})
            short = await client.post("/retrieve", json={"queries": ["short"]})
            after = await client.post("/retrieve", json={"queries": ["fine"]})
        return failed, short, after

    failed, short, after = asyncio.run(run())
    assert failed.status_code == 500 and "index exploded" in failed.json()["detail"]
    assert short.status_code == 500 and "0 result lists for 1 queries" in short.json()["detail"]
    assert after.json() == {"result": [[]]}


def test_server_cli_serves_an_index(small_corpus, tmp_path):
    from sorl_verl.retrieval import build_index

    index = build_index(small_corpus, tmp_path / "idx", show_progress=False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "sorl_verl.retrieval.server", "--index", str(index), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                httpx.get(url + "/health", timeout=1)
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.stdout.read()
                time.sleep(0.2)
        reply = httpx.post(
            url + "/retrieve", json={"queries": ["capital of Germany"], "topk": 1, "return_scores": True}
        )
        assert reply.json()["result"][0][0]["document"]["id"] == "berlin"
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_server_cli_reports_missing_index(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "sorl_verl.retrieval.server", "--index", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "meta.json is missing" in proc.stderr


def test_replies_are_the_same_json_with_and_without_orjson(live_server, monkeypatch):
    """encode_json uses orjson when installed and json otherwise: the same parsed reply either way, and
    what orjson refuses (a lone surrogate, an integer beyond 64 bits) still encodes through json."""
    from sorl_verl.retrieval import server

    payload = {"result": [[{"document": {"id": "z", "contents": 'Zürich "東京"\n\\'}, "score": 1e-05}]], "n": 3}
    assert json.loads(server.encode_json(payload)) == payload
    assert json.loads(server.encode_json({"n": 10**30})) == {"n": 10**30}
    with pytest.raises(UnicodeEncodeError):  # neither encoder writes a lone surrogate as UTF-8
        server.encode_json({"s": "\ud800"})
    body = {"queries": ["capital of Germany", "Zürich"], "topk": 2, "return_scores": True}
    with_orjson = post(live_server, body)
    monkeypatch.setattr(server, "orjson", None)
    without = post(live_server, body)
    assert with_orjson.status_code == without.status_code == 200
    assert with_orjson.json() == without.json() and with_orjson.json()["result"][0]
    assert with_orjson.headers["content-length"] == str(len(with_orjson.content))
