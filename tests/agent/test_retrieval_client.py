"""The retrieval client: Search-R1's passage format, HTTP retries/backoff/concurrency, in-process backend."""

import asyncio
import socket

import pytest

from sorl_verl.agent.retrieval_client import (
    HttpOptions,
    RetrievalClient,
    RetrievalError,
    format_passages,
    get_client,
)

FAST = HttpOptions(timeout_s=5.0, max_retries=3, backoff_s=0.01, max_backoff_s=0.05)


def test_format_passages_is_search_r1s_passages2string():
    hits = [
        {"document": {"id": "a", "contents": '"Paris"\nParis is the capital.'}, "score": 2.0},
        {"document": {"id": "b", "contents": '"Seine"\nA river.\nIt flows through Paris.'}, "score": 1.0},
        {"document": {"id": "c", "contents": "No newline at all"}, "score": 0.5},
    ]
    assert format_passages(hits) == (
        'Doc 1(Title: "Paris") Paris is the capital.\n'
        'Doc 2(Title: "Seine") A river.\nIt flows through Paris.\n'
        "Doc 3(Title: No newline at all) \n"
    )
    assert format_passages([]) == ""


def test_http_retries_a_500_then_succeeds(stub_server, fake_retriever):
    with stub_server(fail_first=1) as stub:
        client = RetrievalClient.from_spec(stub.url, FAST)
        result = client.search(["capital France", "river"], topk=2)
    assert result == fake_retriever.search(["capital France", "river"], 2)
    assert len(stub.requests) == 2
    assert stub.requests[-1] == {
        "path": "/retrieve",
        "body": {"queries": ["capital France", "river"], "topk": 2, "return_scores": True},
    }


def test_async_http_retries_and_url_with_retrieve_suffix(stub_server):
    with stub_server(fail_first=2, fail_status=503) as stub:
        client = RetrievalClient.from_spec(stub.url + "/retrieve", FAST)
        result = asyncio.run(client.asearch(["Berlin"], topk=1))
    assert result[0][0]["document"]["contents"].startswith('"Berlin"')
    assert len(stub.requests) == 3 and stub.requests[-1]["path"] == "/retrieve"


@pytest.mark.parametrize("use_async", [False, True])
def test_persistent_5xx_fails_after_all_retries(stub_server, use_async):
    with stub_server(fail_first=100) as stub:
        client = RetrievalClient.from_spec(stub.url, FAST)
        with pytest.raises(RetrievalError, match="failed after 4 attempt"):
            if use_async:
                asyncio.run(client.asearch(["x"]))
            else:
                client.search(["x"])
    assert len(stub.requests) == FAST.max_retries + 1


def test_4xx_is_not_retried(stub_server):
    with stub_server(fail_first=100, fail_status=422) as stub:
        with pytest.raises(RetrievalError, match="HTTP 422"):
            RetrievalClient.from_spec(stub.url, FAST).search(["x"])
    assert len(stub.requests) == 1


def test_connection_refused_is_retried_then_reported():
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = RetrievalClient.from_spec(f"http://127.0.0.1:{port}", FAST)
    with pytest.raises(RetrievalError, match="ConnectError"):
        client.search(["x"])


def test_reply_with_wrong_number_of_hit_lists_is_an_error(stub_server):
    with stub_server(result_count=1) as stub:
        with pytest.raises(RetrievalError, match="expected 'result' with 2 hit lists, got 1"):
            RetrievalClient.from_spec(stub.url, FAST).search(["a", "b"])


def test_async_requests_respect_the_concurrency_limit(stub_server):
    options = HttpOptions(timeout_s=5.0, max_concurrency=2)
    with stub_server(delay_s=0.15) as stub:
        client = RetrievalClient.from_spec(stub.url, options)

        async def main():
            return await asyncio.gather(*(client.asearch([f"q{i}"]) for i in range(8)))

        results = asyncio.run(main())
    assert len(results) == 8 and len(stub.requests) == 8
    assert stub.max_in_flight == 2  # concurrent, but never more than the limit


def test_in_process_backend_and_input_checks(fake_retriever):
    client = RetrievalClient.from_retriever(fake_retriever)
    assert client.search(["Danube"], topk=1)[0][0]["document"]["id"] == "3"
    assert asyncio.run(client.asearch(["Seine river"], topk=2)) == fake_retriever.search(["Seine river"], 2)
    assert client.search([]) == []
    with pytest.raises(TypeError, match="list of strings"):
        client.search("a bare string")
    with pytest.raises(TypeError, match=r"queries\[1\]"):
        client.search(["ok", 3])
    with pytest.raises(ValueError, match="topk"):
        client.search(["ok"], topk=0)
    with pytest.raises(ValueError, match="retriever must be"):
        RetrievalClient.from_spec("")


def test_index_folder_spec_uses_the_real_in_process_retriever(tmp_path, corpus):
    import json

    from sorl_verl.retrieval import build_index

    corpus_file = tmp_path / "corpus.jsonl"
    corpus_file.write_text("".join(json.dumps(doc) + "\n" for doc in corpus))
    build_index(str(corpus_file), str(tmp_path / "index"), method="bm25", show_progress=False)
    client = get_client(str(tmp_path / "index"))
    assert get_client(str(tmp_path / "index")) is client  # loaded once per process
    hits = client.search(["capital of Germany"], topk=2)[0]
    assert hits[0]["document"]["contents"] == corpus[2]["contents"]
    assert format_passages(hits).startswith('Doc 1(Title: "Berlin") Berlin is the capital of Germany.\n')


class SlowServer:
    """A raw TCP server on 127.0.0.1 that reads a request, then replies as slowly as told (or never)."""

    def __init__(self, byte_interval_s: float | None):
        import threading

        self.byte_interval_s = byte_interval_s
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.stop = threading.Event()
        self.connections = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self):
        import threading

        self.sock.settimeout(0.1)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            threading.Thread(target=self._reply, args=(conn,), daemon=True).start()

    def _reply(self, conn):
        import time

        with conn:
            conn.recv(65536)
            if self.byte_interval_s is None:  # silent: hold the connection, say nothing
                self.stop.wait(30)
                return
            body = b'{"result": [[]]}'
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body))
            for byte in body:
                if self.stop.wait(self.byte_interval_s):
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return
            time.sleep(0.01)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(timeout=5)
        self.sock.close()


@pytest.mark.parametrize("use_async", [False, True])
@pytest.mark.parametrize("byte_interval_s", [None, 0.3])  # silent server; one byte every 0.3 s
def test_deadline_bounds_the_whole_call(byte_interval_s, use_async):
    """Per-operation timeouts never fire on a trickle; the total deadline does, naming URL, attempts and time."""
    import time

    options = HttpOptions(timeout_s=2.0, deadline_s=1.0, max_retries=3, backoff_s=0.01)
    with SlowServer(byte_interval_s) as server:
        client = RetrievalClient.from_spec(server.url, options)
        start = time.monotonic()
        with pytest.raises(RetrievalError) as caught:
            if use_async:
                asyncio.run(client.asearch(["x"]))
            else:
                client.search(["x"])
        elapsed = time.monotonic() - start
    message = str(caught.value)
    assert server.url + "/retrieve" in message and "deadline of 1 s" in message
    assert "1 attempt(s)" in message and "s elapsed" in message
    assert elapsed < 1.9  # the trickle alone would take 16 x 0.3 s; a silent server timeout_s x 4 attempts


def test_deadline_cuts_retries_short(stub_server):
    options = HttpOptions(timeout_s=5.0, deadline_s=0.5, max_retries=50, backoff_s=0.1, max_backoff_s=0.1)
    with stub_server(fail_first=1000) as stub:
        with pytest.raises(RetrievalError, match=r"deadline of 0.5 s \(\d+ attempt\(s\).*last error: HTTP 500"):
            RetrievalClient.from_spec(stub.url, options).search(["x"])
    assert 2 <= len(stub.requests) < 10


def test_one_retry_loop_for_sync_and_async():
    from sorl_verl.agent import retrieval_client

    source = open(retrieval_client.__file__).read()
    assert source.count("for attempt in range(") == 1
    assert source.count("httpx.Client(") == 0  # the blocking call runs the async loop


def test_http_options_from_config():
    assert HttpOptions.from_config(None) == HttpOptions()
    assert HttpOptions.from_config({"timeout_s": "5", "max_retries": 1}) == HttpOptions(timeout_s=5.0, max_retries=1)
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['timeout'\]"):
        HttpOptions.from_config({"timeout": 5})
    with pytest.raises(ValueError, match="deadline_s must be a finite number"):
        HttpOptions.from_config({"deadline_s": "inf"})
    with pytest.raises(ValueError, match="max_concurrency must be an integer >= 1"):
        HttpOptions(max_concurrency=0)
    with pytest.raises(ValueError, match="must be a mapping"):
        HttpOptions.from_config([1, 2])


def test_long_queries_are_cut_before_they_are_sent(fake_retriever):
    from sorl_verl.agent.retrieval_client import MAX_QUERY_CHARS

    client = RetrievalClient.from_retriever(fake_retriever)
    client.search(["Danube " * 2000])
    assert len(fake_retriever.calls[-1][0][0]) == MAX_QUERY_CHARS
