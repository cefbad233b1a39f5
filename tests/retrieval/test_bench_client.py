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


def _fail_if_called(*args, **kwargs):
    raise AssertionError("the benchmark built an index after an error it should have stopped at")


def test_required_pyserini_missing_exits_2_before_any_section(bench, monkeypatch, capsys):
    """``--pyserini`` checks the Lucene comparison can run before minutes of other sections: on failure
    it exits with status 2 and the reason (what to install), having built nothing."""
    from sorl_verl.retrieval import lucene

    def missing():
        raise lucene.PyseriniUnavailable("--method pyserini needs pyserini, which is not installed: pip install X")

    monkeypatch.setattr(lucene, "require_pyserini", missing)
    monkeypatch.setattr(bench, "build_index", _fail_if_called)
    monkeypatch.setattr("sys.argv", ["bench_retrieval.py", "--no-server", "--pyserini"])
    with pytest.raises(SystemExit) as exit_info:
        bench.main()
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--pyserini: the comparison cannot run here" in err and "pip install X" in err


def test_pyserini_with_server_only_is_a_usage_error(bench, monkeypatch, capsys):
    monkeypatch.setattr(bench, "build_index", _fail_if_called)
    monkeypatch.setattr("sys.argv", ["bench_retrieval.py", "--server-only", "--pyserini"])
    with pytest.raises(SystemExit) as exit_info:
        bench.main()
    assert exit_info.value.code == 2 and "--server-only" in capsys.readouterr().err


@pytest.mark.parametrize("required", [False, True])
def test_pyserini_section_skips_or_exits_when_the_comparison_cannot_run(bench, monkeypatch, tmp_path, capsys, required):
    """Without ``--pyserini`` a comparison that cannot run is skipped with its reason; with it, exit status 2."""
    from types import SimpleNamespace

    def comparison(passages, work):
        raise ImportError("no Java runtime")

    monkeypatch.setattr(bench, "load_pyserini_compare", lambda: SimpleNamespace(pyserini_comparison=comparison))
    if required:
        with pytest.raises(SystemExit) as exit_info:
            bench.pyserini_section(tmp_path, 1000, required=True)
        assert exit_info.value.code == 2 and "no Java runtime" in capsys.readouterr().err
    else:
        bench.pyserini_section(tmp_path, 1000, required=False)
        assert "skipped: no Java runtime" in capsys.readouterr().out
