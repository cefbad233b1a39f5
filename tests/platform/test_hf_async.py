"""The ``hf`` rollout speaks verl's partial-rollout protocol (what the async V1 trainers call).

No Ray: the server object is driven directly, and verl's own ``FullyAsyncLLMServerClient``
talks to it through a stand-in for Ray actor handles (``.remote`` returns an awaitable).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
import torch

from sorl_verl.models import build_tiny_model

MAX_TOKENS = 400


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("m") / "tiny", seed=0)


def make_server(path, response_length=MAX_TOKENS):
    from verl.workers.config import RolloutConfig

    from sorl_verl.platform.hf_rollout import HFRolloutServer

    return HFRolloutServer(
        RolloutConfig(name="hf", prompt_length=32, response_length=response_length),
        SimpleNamespace(local_path=str(path), path=str(path), trust_remote_code=False),
    )


def count_forwards(server) -> list[int]:
    """A counter of model forward calls (one per decoding step), bumped from the decode thread."""
    calls = [0]
    server.model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


async def wait_for(predicate, timeout_s=60.0):
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.001)


PARAMS = {"temperature": 1.0, "logprobs": True, "ignore_eos": True, "max_tokens": MAX_TOKENS}


def test_abort_returns_partial_output_and_parks_until_resume(tiny_path):
    server = make_server(tiny_path)
    calls = count_forwards(server)

    async def scenario():
        await server.set_global_steps(0)
        running = asyncio.create_task(server.generate([5, 6, 7], dict(PARAMS), request_id="a"))
        await wait_for(lambda: calls[0] >= 5)
        report = await server.abort_all_requests()
        partial = await running
        # paused: a new request waits (does not generate) until resume_generation
        parked = asyncio.create_task(server.generate([5, 6, 7], dict(PARAMS, max_tokens=3), request_id="b"))
        await asyncio.sleep(0.2)
        assert not parked.done()
        # weight update while paused: the parked request will run under version 1
        state = await server.get_state_dict()
        await server.update_weights({k: v + 0.01 for k, v in state.items()}, global_steps=1)
        await server.sleep()
        await server.wake_up()
        await server.resume_generation()
        return report, partial, await parked

    report, partial, resumed = asyncio.run(scenario())
    assert report == {"aborted_count": 1, "request_ids": ["a"]}
    assert partial.stop_reason == "aborted"
    assert 1 <= len(partial.token_ids) < MAX_TOKENS
    assert len(partial.log_probs) == len(partial.token_ids)
    assert partial.extra_fields["global_steps"] == 0
    assert resumed.stop_reason == "completed" and len(resumed.token_ids) == 3
    assert resumed.extra_fields["global_steps"] == 1
    counters = asyncio.run(server.get_counters())
    assert counters["parked_requests"] == 1 and counters["sleeps"] == 1 and counters["wake_ups"] == 1


def test_rejecting_gate_answers_aborted_without_generating(tiny_path):
    server = make_server(tiny_path)
    calls = count_forwards(server)

    async def scenario():
        await server.abort_all_requests(reject_request=True)
        rejected = await server.generate([5, 6], dict(PARAMS), request_id="r")
        await server.resume_generation()
        accepted = await server.generate([5, 6], dict(PARAMS, max_tokens=2), request_id="s")
        return rejected, accepted

    rejected, accepted = asyncio.run(scenario())
    assert rejected.stop_reason == "aborted" and rejected.token_ids == []
    assert accepted.stop_reason == "completed" and len(accepted.token_ids) == 2
    assert calls[0] == 2  # only the accepted request ran the model (prefill + one step)


class _Remote:
    """``handle.method.remote(...)`` -> awaitable, like a Ray actor handle."""

    def __init__(self, target):
        self._target = target

    def __getattr__(self, name):
        method = getattr(self._target, name)
        return SimpleNamespace(remote=lambda *a, **k: asyncio.ensure_future(_call(method, *a, **k)))


async def _call(method, *args, **kwargs):
    result = method(*args, **kwargs)
    return await result if asyncio.iscoroutine(result) else result


class _OneServerBalancer:
    def __init__(self, server):
        self.server = _Remote(server)

    def require_acquire_fields(self):
        return []

    def require_release_fields(self):
        return []

    def acquire_server(self, request_id, **_):
        return ("hf://0", self.server)

    def release_server(self, server_id, **_):
        return None


def test_verl_fully_async_client_continues_partial_rollout_under_new_weights(tiny_path):
    """verl's client resends prompt + partial tokens: nothing lost or duplicated across an abort."""
    from omegaconf import OmegaConf
    from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient

    server = make_server(tiny_path)
    calls = count_forwards(server)
    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"name": "hf", "response_length": MAX_TOKENS}}})
    client = FullyAsyncLLMServerClient(config, load_balancer_handle=_Remote(_OneServerBalancer(server)))
    prompt = [5, 6, 7]
    sent_prompts: list[list[int]] = []
    original_generate = server.generate

    async def recording_generate(prompt_ids, sampling_params, request_id, **kwargs):
        sent_prompts.append(list(prompt_ids))
        return await original_generate(prompt_ids, sampling_params, request_id, **kwargs)

    server.generate = recording_generate

    async def scenario():
        await server.set_global_steps(0)
        params = {"temperature": 1.0, "logprobs": True, "ignore_eos": True}
        task = asyncio.create_task(client.generate("traj-1", prompt_ids=prompt, sampling_params=params))
        await wait_for(lambda: calls[0] >= 5)
        await server.abort_all_requests()  # what colocate_async does at the end of sampling
        await wait_for(lambda: len(sent_prompts) >= 2)  # the client resent prompt + partial tokens (parked)
        state = await server.get_state_dict()
        await server.update_weights({k: v * 0.5 for k, v in state.items()}, global_steps=1)
        await server.resume_generation()
        return await task

    output = asyncio.run(scenario())
    first_part = sent_prompts[1][len(prompt) :]
    assert sent_prompts[0] == prompt and sent_prompts[1][: len(prompt)] == prompt
    assert 1 <= len(first_part) < MAX_TOKENS
    # the final trajectory is the partial output followed by the continuation, budget respected
    assert len(output.token_ids) == MAX_TOKENS and output.token_ids[: len(first_part)] == first_part
    assert len(output.log_probs) == MAX_TOKENS
    assert (output.extra_fields["min_global_steps"], output.extra_fields["max_global_steps"]) == (0, 1)
    assert torch.isfinite(torch.tensor(output.log_probs)).all()


def test_adapter_finds_a_suffixed_server(monkeypatch):
    """The replica names its server with ``name_suffix``; its workers' adapters must look it up so."""
    from verl.workers.config import RolloutConfig

    from sorl_verl.platform import hf_rollout

    replica = hf_rollout.get_hf_replica_class()(
        replica_rank=1, config=RolloutConfig(name="hf"), model_config=None, gpus_per_node=1, name_suffix="teacher"
    )
    init = replica.get_ray_class_with_init_args()
    looked_up = []
    monkeypatch.setattr(hf_rollout.ray, "get_actor", lambda name: looked_up.append(name) or object())
    # what verl's CheckpointEngineWorker does with these arguments
    extra = {k: v for k, v in init.kwargs.items() if k not in ("rollout_config", "model_config")}
    adapter = hf_rollout.HFServerAdapter(
        config=init.kwargs["rollout_config"], model_config=None, device_mesh=None, **extra
    )
    adapter._server_handle()
    assert looked_up == [hf_rollout.server_actor_name(1, "_teacher")] == ["sorl_hf_server_1_teacher"]


def test_batches_hold_at_most_max_num_seqs_first_come_first_served(tiny_path, monkeypatch):
    from sorl_verl.platform import hf_rollout

    server = make_server(tiny_path)
    server.config.max_num_seqs = 2
    sizes, real = [], hf_rollout.generate_batch
    monkeypatch.setattr(
        hf_rollout, "generate_batch", lambda model, tok, reqs, *a: sizes.append(len(reqs)) or real(model, tok, reqs, *a)
    )

    async def scenario():
        return await asyncio.gather(
            *[server.generate([5, 6, i + 7], dict(PARAMS, max_tokens=2), request_id=str(i)) for i in range(5)]
        )

    outputs = asyncio.run(scenario())
    assert sizes == [2, 2, 1]
    assert all(len(o.token_ids) == 2 for o in outputs)


def test_min_step_s_slows_every_decoding_step_and_options_are_checked(tiny_path):
    import time

    server = make_server(tiny_path)
    server.min_step_s = 0.05
    start = time.monotonic()
    out = asyncio.run(server.generate([5, 6], dict(PARAMS, max_tokens=5), request_id="t"))
    assert len(out.token_ids) == 5 and time.monotonic() - start >= 5 * 0.05
    with pytest.raises(ValueError, match="min_stp_s"):
        from verl.workers.config import RolloutConfig

        from sorl_verl.platform.hf_rollout import HFRolloutServer

        HFRolloutServer(
            RolloutConfig(name="hf", prompt_length=8, response_length=8, engine_kwargs={"hf": {"min_stp_s": 1}}),
            SimpleNamespace(local_path=str(tiny_path), path=str(tiny_path), trust_remote_code=False),
        )
