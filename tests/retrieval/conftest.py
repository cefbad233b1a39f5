"""Fixtures for the retrieval tests: small corpora, the embedded index, a live HTTP server."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest
import uvicorn

from sorl_verl.retrieval import build_index, embedded_index, load_retriever
from sorl_verl.retrieval.server import create_app

SMALL_DOCS = [
    {"id": "paris", "contents": '"Paris"\nParis is the capital and largest city of France, on the river Seine.'},
    {"id": "berlin", "contents": '"Berlin"\nBerlin is the capital of Germany and its most populous city.'},
    {"id": "seine", "contents": '"Seine"\nThe Seine is a river in northern France that flows through Paris.'},
    {
        "id": "python",
        "contents": '"Python (programming language)"\nPython is a programming language created by Guido van Rossum.',
    },
    {"id": "cobra", "contents": '"King cobra"\nThe king cobra is a venomous snake native to the forests of Asia.'},
    {
        "id": "jupiter",
        "contents": '"Jupiter"\nJupiter is the fifth planet from the Sun and the largest in the Solar System.',
    },
]


def write_jsonl(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


@pytest.fixture(scope="session")
def small_docs():
    """Six short documents in Search-R1 form (a fresh copy per test session)."""
    return [dict(d) for d in SMALL_DOCS]


@pytest.fixture(scope="session")
def jsonl_writer():
    return write_jsonl


@pytest.fixture
def small_corpus(tmp_path):
    path = tmp_path / "corpus.jsonl"
    write_jsonl(path, SMALL_DOCS)
    return path


@pytest.fixture(scope="session")
def small_bm25(tmp_path_factory):
    root = tmp_path_factory.mktemp("small_bm25")
    corpus = root / "corpus.jsonl"
    write_jsonl(corpus, SMALL_DOCS)
    return load_retriever(build_index(corpus, root / "index", show_progress=False))


@pytest.fixture(scope="session")
def wiki_bm25(tmp_path_factory):
    """BM25 of the embedded corpus, built into a per-session cache dir."""
    return embedded_index(tmp_path_factory.mktemp("cache"))


class LiveServer:
    """uvicorn serving an app on 127.0.0.1 in a thread, on a free port."""

    def __init__(self, app):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                time.sleep(0.05)
        raise RuntimeError("server did not start")

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


@pytest.fixture(scope="module")
def live_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("server")
    corpus = root / "corpus.jsonl"
    write_jsonl(corpus, SMALL_DOCS)
    retriever = load_retriever(build_index(corpus, root / "index", show_progress=False))
    app = create_app(retriever, default_topk=2, max_topk=5, max_batch=8, max_body_bytes=4096)
    with LiveServer(app) as server:
        server.app = app
        yield server


@pytest.fixture(scope="session")
def live_server_class():
    """:class:`LiveServer` itself, for modules that serve their own app (test modules cannot import conftest)."""
    return LiveServer
