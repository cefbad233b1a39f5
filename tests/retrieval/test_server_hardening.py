"""The retrieval server under hostile input and faults: every malformed body is a 4xx (fuzzed), caps on
query and request size, a server-side read timeout, validated CLI values, and a graceful drain on
SIGTERM under load (every request answered, exit 0, no traceback)."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sorl_verl.retrieval.server import create_app, main


@pytest.fixture(scope="module")
def hard_server(small_bm25, live_server_class):
    app = create_app(
        small_bm25,
        default_topk=2,
        max_topk=5,
        max_batch=8,
        max_body_bytes=1 << 16,
        max_query_chars=100,
        max_request_chars=300,
        read_timeout_s=0.5,
    )
    with live_server_class(app) as server:
        yield server


def post_raw(server, body: bytes, client=None):
    return (client or httpx).post(
        server.url + "/retrieve", content=body, headers={"content-type": "application/json"}, timeout=10
    )


def healthy(server) -> bool:
    reply = httpx.post(server.url + "/retrieve", json={"queries": ["venomous snake"], "topk": 1}, timeout=10)
    return reply.status_code == 200 and reply.json()["result"][0][0]["id"] == "cobra"


@pytest.mark.parametrize(
    "body, status, message",
    [
        (b"[" * 3000 + b"]" * 3000, 400, "nested too deeply"),
        (b'{"queries": ' + b"[" * 3000 + b"]" * 3000 + b"}", 400, "nested too deeply"),
        (b'{"queries": ["a"], "topk": ' + b"9" * 5000 + b"}", 400, "not valid JSON"),
        (b'{"queries": ["\xff\xfe"]}', 400, "not valid JSON"),
        (b'{"queries": ["\\ud800"]}', 422, "lone surrogate"),
        (json.dumps({"queries": ["x" * 101]}).encode(), 422, "queries[0] has 101 characters; the cap is 100"),
        (json.dumps({"queries": ["x" * 100] * 4}).encode(), 422, "400 query characters in one request; the cap is 300"),
        (b'{"queries": ["a"], "topk": 1e400}', 422, "'topk' must be an integer"),
        (b'{"queries": ["a"], "topk": NaN}', 422, "'topk' must be an integer"),
    ],
)
def test_malformed_bodies_are_4xx(hard_server, body, status, message):
    reply = post_raw(hard_server, body)
    assert reply.status_code == status, reply.text
    assert message in reply.json()["detail"]
    assert healthy(hard_server)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=20,
)
request_like = st.fixed_dictionaries(
    {"queries": st.lists(st.text(max_size=40), max_size=10) | json_values},
    optional={"topk": st.integers(-3, 8) | json_values, "return_scores": st.booleans() | json_values},
)
bodies = (
    st.binary(max_size=300)
    | json_values.map(lambda v: json.dumps(v).encode())
    | request_like.map(lambda v: json.dumps(v).encode())
    | request_like.map(lambda v: json.dumps(v, ensure_ascii=False).encode("utf-8", "surrogatepass"))
)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(body=bodies)
def test_fuzzed_bodies_never_get_a_5xx(hard_server, body):
    reply = post_raw(hard_server, body)
    assert reply.status_code < 500, (body, reply.text)
    if reply.status_code == 200:
        assert isinstance(reply.json()["result"], list)
    else:
        assert 400 <= reply.status_code < 500 and reply.json()["detail"]


def test_fuzzing_leaves_the_server_healthy(hard_server):
    assert httpx.get(hard_server.url + "/health", timeout=5).json()["status"] == "ok"
    assert healthy(hard_server)


def raw_request(server, head: bytes, body: bytes) -> socket.socket:
    port = int(server.url.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(head + body)
    return sock


def test_short_body_times_out_with_408(hard_server):
    head = b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    start = time.monotonic()
    with raw_request(hard_server, head, b'{"queries": [') as sock:
        reply = sock.recv(65536).decode()
    assert reply.startswith("HTTP/1.1 408") and "read_timeout_s" in reply
    assert time.monotonic() - start < 4  # read_timeout_s is 0.5 s
    assert healthy(hard_server)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--embedded", "--port", "99999"], "between 1 and 65535"),
        (["--embedded", "--max-batch", "0"], "must be >= 1"),
        (["--embedded", "--max-body-bytes", "-1"], "must be >= 1"),
        (["--embedded", "--topk", "0"], "must be >= 1"),
        (["--embedded", "--topk", "7", "--max-topk", "5"], "--topk 7 exceeds --max-topk 5"),
        (["--embedded", "--read-timeout-s", "0"], "finite number > 0"),
        (["--embedded", "--grace-s", "nan"], "finite number"),
    ],
)
def test_cli_values_are_validated_by_argparse(argv, message, capsys):
    with pytest.raises(SystemExit) as caught:
        main(argv)
    assert caught.value.code == 2
    assert message in capsys.readouterr().err


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


CLIENTS, BEFORE_SIGNAL = 200, 1000


@pytest.mark.slow
def test_sigterm_under_load_answers_every_request_and_exits_0(small_corpus, tmp_path):
    """200 clients in a loop; SIGTERM mid-load; a client disconnects mid-body first. Every request sent
    gets an HTTP answer (200, or 503 once the drain began), the server exits 0, and logs no traceback."""
    import aiohttp

    from sorl_verl.retrieval import build_index

    index = build_index(small_corpus, tmp_path / "idx", show_progress=False)
    port = free_port()
    log_file = open(tmp_path / "server.log", "w+")  # a file, not a pipe: a full pipe would block the server
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sorl_verl.retrieval.server",
            "--index",
            str(index),
            "--port",
            str(port),
            "--grace-s",
            "20",
            "--log-level",
            "warning",
        ],
        stdout=log_file,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.time() < deadline, "server did not start"
            time.sleep(0.2)
        with socket.create_connection(("127.0.0.1", port)) as sock:  # disconnect mid-body
            sock.sendall(b'POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{"que')

        statuses: list[int] = []
        failures: list[str] = []
        signalled = asyncio.Event()

        async def client(session, worker):
            while True:
                try:
                    async with session.post(url + "/retrieve", json={"queries": [f"capital {worker}"], "topk": 1}) as r:
                        await r.read()
                        statuses.append(r.status)
                        if r.status != 200 or len(statuses) > 50 * BEFORE_SIGNAL:
                            return
                except aiohttp.ClientConnectorError:
                    assert signalled.is_set()  # refused only once the server has closed its socket
                    return
                except (aiohttp.ClientError, asyncio.TimeoutError) as error:
                    failures.append(f"{type(error).__name__}: {error}")
                    return

        async def run():
            timeout = aiohttp.ClientTimeout(total=30)
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
                tasks = [asyncio.create_task(client(session, w)) for w in range(CLIENTS)]
                give_up = time.monotonic() + 60
                while len(statuses) < BEFORE_SIGNAL and not failures and time.monotonic() < give_up:
                    await asyncio.sleep(0.05)
                proc.send_signal(signal.SIGTERM)
                signalled.set()
                await asyncio.gather(*tasks)

        asyncio.run(run())
        exit_code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    log = (tmp_path / "server.log").read_text()
    log_file.close()
    assert failures == []
    assert exit_code == 0, log
    assert "Traceback" not in log, log
    assert statuses.count(200) >= BEFORE_SIGNAL and set(statuses) <= {200, 503}


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--embedded", "idx", "--k1", "-1"], "finite number >= 0"),
        (["--embedded", "idx", "--b", "2"], "finite number >= 0 and <= 1"),
        (["--embedded", "idx", "--method", "dense", "--batch-size", "0"], "must be >= 1"),
        (["--embedded", "idx", "--hnsw-m", "x"], "expected an integer"),
    ],
)
def test_index_cli_values_are_validated_by_argparse(argv, message, capsys, tmp_path):
    from sorl_verl.retrieval.build import main as build_main

    with pytest.raises(SystemExit) as caught:
        build_main([str(tmp_path / a) if a == "idx" else a for a in argv])
    assert caught.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "idx").exists()
