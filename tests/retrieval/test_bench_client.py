"""The load generator of ``benchmarks/bench_retrieval.py`` is an honest HTTP client: real sockets, keep-alive,
answers parsed and checked, errors counted (its figures are only as good as this)."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def bench():
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_retrieval.py"
    spec = importlib.util.spec_from_file_location("bench_retrieval", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_connection_keeps_alive_and_closes_when_told(bench, live_server):
    host, port = live_server.url.removeprefix("http://").rsplit(":", 1)

    async def run():
        connection = await bench.HttpConnection.open(host, int(port))
        answers = [
            await connection.post_json("/retrieve", {"queries": [q], "topk": 1, "return_scores": True})
            for q in ("venomous snake", "capital of Germany")
        ]
        transport = connection.transport
        refused = await connection.post_json("/retrieve", {"queries": ["x" * 5000]})  # over max_body_bytes
        return answers, transport, refused, connection.closed

    answers, transport, refused, closed = asyncio.run(run())
    assert [status for status, _ in answers] == [200, 200]
    assert [answer["result"][0][0]["document"]["id"] for _, answer in answers] == ["cobra", "berlin"]
    assert all(bench.is_search_r1_answer(answer, queries=1, topk=1) for _, answer in answers)
    assert transport is not None and refused[0] == 413 and "exceeds the cap" in refused[1]["detail"] and closed


@pytest.mark.parametrize(
    "answer",
    [
        {"result": []},
        {"result": [[{"id": "a", "contents": "x"}]]},  # documents without scores
        {"result": [[{"document": {"id": "a"}, "score": 1.0}]]},  # no contents
        {"result": [[{"document": {"id": "a", "contents": "x"}, "score": "1"}]]},
        {"result": [[{"document": {"id": str(i), "contents": ""}, "score": 1.0} for i in range(4)]]},  # over topk
        {"detail": "nope"},
        [1, 2],
    ],
)
def test_wrong_answer_shapes_are_errors(bench, answer):
    assert not bench.is_search_r1_answer(answer, queries=1, topk=3)


def test_load_run_counts_answers_and_errors(bench, live_server):
    run = bench.load_run(
        live_server.url, ["capital of Germany", "venomous snake", "fifth planet"], clients=8, requests_per_client=3
    )
    assert run["requests"] == 24 and run["errors"] == 0
    dead = bench.load_run("http://127.0.0.1:9", ["q"], clients=2, requests_per_client=1)  # nothing listens there
    assert dead["requests"] == 0 and dead["errors"] == 2 * 3 and dead["error_kinds"] == ["ConnectionRefusedError"]
