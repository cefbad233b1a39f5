"""Fixtures for the agent tests: a local tokenizer, a fake retriever, a scripted policy, an HTTP stub."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

# Titles stored as Search-R1's wiki corpus stores them: in double quotes on the first line.
CORPUS = [
    {"id": "0", "contents": '"Paris"\nParis is the capital and largest city of France.'},
    {"id": "1", "contents": '"Seine"\nThe Seine is a river in northern France.\nIt flows through Paris.'},
    {"id": "2", "contents": '"Berlin"\nBerlin is the capital of Germany.'},
    {"id": "3", "contents": '"Danube"\nThe Danube flows through ten countries.'},
]


class FakeRetriever:
    """The in-process retriever's interface over :data:`CORPUS`, scoring by shared words."""

    def __init__(self):
        self.calls: list[tuple[list[str], int]] = []

    def search(self, queries: list[str], topk: int = 3) -> list[list[dict]]:
        self.calls.append((list(queries), topk))
        results = []
        for query in queries:
            words = set(query.lower().split())
            scored = [(len(words & set(doc["contents"].lower().replace(".", " ").split())), doc) for doc in CORPUS]
            scored.sort(key=lambda pair: (-pair[0], pair[1]["id"]))
            results.append([{"document": dict(doc), "score": float(score)} for score, doc in scored[:topk]])
        return results


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory):
    """The project's tiny Qwen2-style tokenizer (byte-level BPE trained locally; tags are multi-token)."""
    from transformers import AutoTokenizer

    from sorl_verl.models import build_tiny_model

    folder = build_tiny_model(tmp_path_factory.mktemp("agent") / "tiny", num_layers=1, hidden_size=32)
    return AutoTokenizer.from_pretrained(folder)


class ScriptedServer:
    """A verl ``server_manager`` whose policy replays fixed turns.

    Each turn is a text (tokenized one character at a time, a tokenization the BPE would
    never produce, so any re-tokenization of model tokens shows) or a list of token ids.
    Log-probs are distinct per call and position, so misalignment shows too.
    """

    def __init__(self, tokenizer, turns):
        self.tokenizer = tokenizer
        self.turns = list(turns)
        self.calls: list[dict] = []
        self.returned: list[list[int]] = []

    def char_ids(self, text: str) -> list[int]:
        ids = []
        for char in text:
            ids.extend(self.tokenizer.encode(char, add_special_tokens=False))
        return ids

    async def generate(self, *, request_id, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        self.calls.append(
            {"request_id": request_id, "prompt_ids": list(prompt_ids), "sampling_params": sampling_params}
        )
        turn = self.turns[min(len(self.calls) - 1, len(self.turns) - 1)]
        ids = self.char_ids(turn) if isinstance(turn, str) else list(turn)
        self.returned.append(ids)
        call = len(self.calls)
        return TokenOutput(token_ids=ids, log_probs=[-(call + position / 1000) for position in range(len(ids))])


def instantiate_agent_loop(entry, config, server, tokenizer, tools=()):
    """An agent loop built the way verl's worker builds it: ``hydra.utils.instantiate`` of its registry entry."""
    import hydra
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    return hydra.utils.instantiate(
        config=entry,
        trainer_config=DictConfigWrap(config=config),
        server_manager=server,
        tokenizer=tokenizer,
        processor=None,
        hf_model_type="qwen2",
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(config.data),
        tools=ToolListWrap(list(tools)),
    )


def make_loop(tokenizer, server, response_length: int = 2048, prompt_length: int = 512, **options):
    """Build ``search_r1`` from the registry, with ``options`` merged into its entry."""
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    import sorl_verl.agent  # noqa: F401  registers search_r1

    config = OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {
                    "name": "vllm",
                    "prompt_length": prompt_length,
                    "response_length": response_length,
                    "full_determinism": False,
                }
            },
            "data": {"apply_chat_template_kwargs": {}},
        }
    )
    entry = OmegaConf.merge(OmegaConf.create(dict(_agent_loop_registry["search_r1"])), options)
    return instantiate_agent_loop(entry, config, server, tokenizer)


def run_loop(tokenizer, turns, retriever=None, question="What is the capital of France?", **options):
    """Run one trajectory on the scripted policy; returns ``(output, server, retriever)``.

    ``retriever``: an object with ``search`` (default: a new :class:`FakeRetriever`) or a spec string.
    """
    from sorl_verl.agent import retrieval_client

    if isinstance(retriever, str):  # a real spec: "embedded", an index folder or a URL
        spec = retriever
    else:
        retriever = retriever or FakeRetriever()
        spec = f"fake-{id(retriever)}"
        client = retrieval_client.RetrievalClient.from_retriever(retriever, spec)
        retrieval_client._clients[(spec, retrieval_client.HttpOptions())] = client
    server = ScriptedServer(tokenizer, turns)

    async def main():
        loop = make_loop(tokenizer, server, retriever=spec, **options)
        return await loop.run({"temperature": 1.0}, raw_prompt=[{"role": "user", "content": question}])

    return asyncio.run(main()), server, retriever


class StubRetrievalServer:
    """Search-R1's ``/retrieve`` on 127.0.0.1, failing its first ``fail_first`` requests with ``fail_status``."""

    def __init__(self, fail_first: int = 0, fail_status: int = 500, delay_s: float = 0.0, result_count=None):
        self.fail_first = fail_first
        self.fail_status = fail_status
        self.delay_s = delay_s
        self.result_count = result_count
        self.requests: list[dict] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()
        self.retriever = FakeRetriever()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with stub.lock:
                    stub.requests.append({"path": self.path, "body": body})
                    number = len(stub.requests)
                    stub.in_flight += 1
                    stub.max_in_flight = max(stub.max_in_flight, stub.in_flight)
                try:
                    time.sleep(stub.delay_s)
                    if number <= stub.fail_first:
                        self._reply(stub.fail_status, {"detail": "boom"})
                    else:
                        result = stub.retriever.search(body["queries"], body["topk"])
                        if stub.result_count is not None:
                            result = result[: stub.result_count]
                        self._reply(200, {"result": result})
                finally:
                    with stub.lock:
                        stub.in_flight -= 1

            def _reply(self, status, payload):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def stub_server():
    """Factory: ``with stub_server(fail_first=1) as stub: ...``."""
    return StubRetrievalServer


# pytest runs in importlib mode: test modules cannot import this file, so helpers are fixtures.
@pytest.fixture
def corpus():
    return CORPUS


@pytest.fixture
def fake_retriever():
    return FakeRetriever()


@pytest.fixture
def scripted_server(tokenizer):
    """Factory: ``scripted_server(turns)``."""
    return lambda turns: ScriptedServer(tokenizer, turns)


@pytest.fixture
def agent_loop_factory():
    return instantiate_agent_loop


@pytest.fixture
def build_search_r1(tokenizer):
    """Factory: ``build_search_r1(server, **options)`` (call inside a running event loop)."""
    return lambda server, **options: make_loop(tokenizer, server, **options)


@pytest.fixture
def run_search_r1(tokenizer):
    """Factory: ``run_search_r1(turns, retriever=None, **options) -> (output, server, retriever)``."""
    return lambda turns, **kwargs: run_loop(tokenizer, turns, **kwargs)


@pytest.fixture
def project_retrieval_server():
    """The project's retrieval server (``sorl_verl.retrieval.server``) over :class:`FakeRetriever`
    on 127.0.0.1, run by uvicorn in a thread; yields its base URL."""
    import socket

    import uvicorn

    from sorl_verl.retrieval.server import create_app

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(FakeRetriever()), host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started:
        if time.time() > deadline or not thread.is_alive():
            raise RuntimeError("retrieval server did not start")
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)
