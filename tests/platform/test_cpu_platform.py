"""The cpu platform is opt-in, registers what verl looks up, and the hf rollout samples correctly."""

import asyncio
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM, AutoTokenizer

from sorl_verl.models import build_tiny_model
from sorl_verl.platform import config_selects_cpu, cpu_selected
from sorl_verl.platform.cpu_overrides import cpu_overrides
from sorl_verl.platform.hf_generate import GenerationRequest, generate_batch, sample_next_token

# After ``import verl``: the platform, whether ``hf`` resolves, and (for a config device given
# as argv[1]) what verl's ``auto_set_device`` leaves in the config, as verl's entry points call it.
PROBE = """
import os, sys
import verl
from omegaconf import OmegaConf
from verl.plugin.platform import get_platform
from verl.workers.rollout.replica import RolloutReplicaRegistry
from verl.workers.rollout.base import _ROLLOUT_REGISTRY
device = "-"
if len(sys.argv) > 1:
    from verl.utils.device import auto_set_device
    config = OmegaConf.create({"trainer": {"device": sys.argv[1]}})
    auto_set_device(config)
    device = config.trainer.device
print(get_platform().device_name, "hf" in RolloutReplicaRegistry._registry, ("hf", "async") in _ROLLOUT_REGISTRY,
      device, os.environ.get("VERL_PLATFORM"))
"""


def _probe(env_platform, *argv):
    env = {k: v for k, v in os.environ.items() if k != "VERL_PLATFORM"}
    if env_platform:
        env["VERL_PLATFORM"] = env_platform
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    return out.stdout.strip().splitlines()[-1]


def test_selection_rules():
    assert cpu_selected(environ={"VERL_PLATFORM": "cpu"})
    assert cpu_selected(environ={"VERL_PLATFORM": " CPU "})
    assert not cpu_selected(environ={})
    assert not cpu_selected(environ={"VERL_PLATFORM": "nvidia"})
    assert config_selects_cpu(OmegaConf.create({"trainer": {"device": "cpu"}}))
    assert config_selects_cpu(SimpleNamespace(trainer=SimpleNamespace(device=" CPU")))
    assert not config_selects_cpu(OmegaConf.create({"trainer": {"device": "cuda"}}))
    assert not config_selects_cpu(OmegaConf.create({"x": {"trainer": {"device": "cpu"}}}))
    assert not config_selects_cpu(OmegaConf.create({"trainer": {}}))
    assert not config_selects_cpu(None)


@pytest.mark.slow
def test_inactive_by_default_active_when_selected():
    # default: verl's own detection (no GPU here -> its 'nvidia' fallback), nothing of ours registered
    assert _probe(None) == "cuda False False - None"
    assert _probe(None, "cuda") == "cuda False False cuda None"
    assert _probe("cpu") == "cpu True True - cpu"
    # trainer.device=cpu in the config, no accelerator here: selected when verl's entry point reads
    # it, exported to Ray workers
    assert _probe(None, "cpu") == "cpu True True cpu cpu"


SHIM_PROBE = """
import os
import torch
import verl
from transformers import AutoConfig
from verl.workers.engine.base import EngineRegistry
from verl.workers.engine.fsdp import transformer_impl
import verl.utils.model as model_utils
import verl.workers.engine_workers as engine_workers
from sorl_verl.platform.patches import SHIMS

# 1. process group: gloo, through the name engine_workers calls
os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PROBE_PORT"])
engine_workers.initialize_global_process_group_ray(timeout_second=60)
assert torch.distributed.get_backend() == "gloo"
torch.distributed.destroy_process_group()
# 2. engines for device cpu
assert EngineRegistry.get_engine_cls("value_model", "fsdp2") is transformer_impl.FSDPEngineWithValueHead
assert EngineRegistry.get_engine_cls("language_model", "fsdp") is transformer_impl.FSDPEngineWithLMHead
# 4. critic head loads with the configured attention
config = AutoConfig.from_pretrained(os.environ["PROBE_MODEL"], attn_implementation="eager")
config.num_labels = 1
head = model_utils.load_valuehead_model(os.environ["PROBE_MODEL"], torch.float32, config, False)
assert type(head).__name__ == "Qwen2ForTokenClassification" and head.config._attn_implementation == "eager"
for shim in SHIMS.values():
    assert shim.reason and shim.original is not shim.replacement
print(sorted(SHIMS))
"""


@pytest.mark.slow
def test_cpu_shims_in_a_fresh_process(tmp_path):
    path = build_tiny_model(tmp_path / "tiny")
    env = {
        **os.environ,
        "VERL_PLATFORM": "cpu",
        "PROBE_MODEL": str(path),
        "PROBE_PORT": str(29500 + os.getpid() % 1000),
    }
    out = subprocess.run([sys.executable, "-c", SHIM_PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == str(
        sorted(
            [
                "verl.utils.model.load_valuehead_model",
                "verl.workers.engine.fsdp.transformer_impl.apply_fsdp2",
                "verl.workers.engine_workers.initialize_global_process_group_ray",
                "verl.workers.rollout.base._ROLLOUT_REGISTRY[('hf', 'async')]",
            ]
        )
    )


def test_apply_shim_records_the_original_once():
    from sorl_verl.platform.patches import MISSING, SHIMS, apply_shim

    owner = SimpleNamespace(__name__="fake_module", f=lambda x: x)
    original = owner.f
    try:
        shim = apply_shim(owner, "f", lambda f: lambda x: f(x) + 1, "test")
        assert (shim.target, shim.original, shim.reason) == ("fake_module.f", original, "test")
        assert owner.f(1) == 2
        again = apply_shim(owner, "f", lambda f: lambda x: f(x) + 10, "test")
        assert again is shim and owner.f(1) == 2  # applied once
        registry = {"a": 1}
        entry = apply_shim(registry, "b", lambda old: 2, "test", label="fake_registry[b]")
        assert entry.original is MISSING and registry == {"a": 1, "b": 2}
    finally:
        SHIMS.pop("fake_module.f", None)
        SHIMS.pop("fake_registry[b]", None)


def test_unpin_offload_policy_only_changes_pinning():
    from torch.distributed.fsdp import CPUOffloadPolicy

    from sorl_verl.platform.patches import unpin_offload_policy

    pinned = {"mesh": "m", "offload_policy": CPUOffloadPolicy(pin_memory=True)}
    unpinned = unpin_offload_policy(pinned)
    assert type(unpinned["offload_policy"]) is CPUOffloadPolicy and not unpinned["offload_policy"].pin_memory
    assert unpinned["mesh"] == "m" and pinned["offload_policy"].pin_memory  # the caller's dict is untouched
    assert unpin_offload_policy({"offload_policy": None}) == {"offload_policy": None}


def test_platform_never_auto_detected_and_answers_cpu_questions():
    from sorl_verl.platform.cpu import CPU_DEVICE_MODULE, PlatformCPU

    platform = PlatformCPU()
    assert not platform.is_platform_available(use_smi_check=True)
    assert platform.current_device() == torch.device("cpu")
    assert platform.communication_backend_name() == "gloo"
    assert platform.ray_resource_name() == "GPU"
    free, total = CPU_DEVICE_MODULE.mem_get_info()
    assert 0 < free <= total
    state = CPU_DEVICE_MODULE.get_rng_state()
    first = torch.rand(3)
    CPU_DEVICE_MODULE.set_rng_state(state)
    assert torch.equal(first, torch.rand(3))
    assert CPU_DEVICE_MODULE.get_device_name() == "CPU"


def test_version_check(monkeypatch):
    import verl

    from sorl_verl._verl_version import verl_patchable
    from sorl_verl.platform import patches

    assert verl_patchable("0.9.1") and verl_patchable("0.9.4")
    assert not verl_patchable("0.9.0") and not verl_patchable("0.10.0") and not verl_patchable("0.8.5")
    monkeypatch.setattr(verl, "__version__", "0.7.0")
    with pytest.raises(RuntimeError, match="tested with verl 0.9.1"):
        patches.check_verl_version()


@pytest.mark.parametrize(
    ("cuda", "npu", "version", "shimmed"),
    [
        (False, False, "0.9.1", True),
        (True, False, "0.9.1", False),
        (False, True, "0.9.1", False),
        (False, False, "0.10.0", False),
    ],
)
def test_auto_set_device_shim_only_without_accelerator_on_patchable_verl(monkeypatch, cuda, npu, version, shimmed):
    # verl's own auto_set_device keeps trainer.device=cpu only where the detected platform is cpu
    import verl

    from sorl_verl.platform import _shim_auto_set_device
    from sorl_verl.platform.patches import SHIMS

    monkeypatch.setattr(verl, "__version__", version)
    activated = []
    monkeypatch.setattr("sorl_verl.platform.activate", lambda: activated.append(True))

    def auto_set_device(config):
        config.trainer.device = "cuda"  # what verl does without an accelerator: its fallback platform

    fake = SimpleNamespace(
        __name__="fake_device_module", is_cuda_available=cuda, is_npu_available=npu, auto_set_device=auto_set_device
    )
    try:
        _shim_auto_set_device(fake)
        assert ("fake_device_module.auto_set_device" in SHIMS) is shimmed
        assert (fake.auto_set_device is not auto_set_device) is shimmed
        config = OmegaConf.create({"trainer": {"device": "cpu"}})
        fake.auto_set_device(config)
        assert activated == ([True] if shimmed else [])
        fake.auto_set_device(OmegaConf.create({"trainer": {"device": "cuda"}}))
        assert len(activated) == (1 if shimmed else 0)  # a cuda config never selects the cpu platform
    finally:
        SHIMS.pop("fake_device_module.auto_set_device", None)


def test_overrides_cover_the_cpu_facts():
    overrides = cpu_overrides(num_workers=2)
    for needed in (
        "trainer.device=cpu",
        "trainer.n_gpus_per_node=2",
        "++ray_kwargs.ray_init.num_gpus=2",
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.model.use_remove_padding=False",
        "+actor_rollout_ref.model.override_config.attn_implementation=eager",
    ):
        assert needed in overrides
    keys = [o.lstrip("+").split("=", 1)[0] for o in overrides]
    assert len(keys) == len(set(keys)), "an override is given twice"


# -- sampling --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = build_tiny_model(tmp_path_factory.mktemp("m") / "tiny", extra_tokens=("</search>", "</answer>"))
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    return path, model, AutoTokenizer.from_pretrained(path)


def test_sample_next_token_filters():
    logits = torch.tensor([[0.0, 5.0, 4.0, -1.0]] * 3)
    generator = torch.Generator().manual_seed(0)
    # greedy, top_k=1, and a tiny top_p all pick the argmax
    for temperature, top_k, top_p in ((0.0, -1, 1.0), (1.0, 1, 1.0), (1.0, -1, 1e-3)):
        tokens, log_probs = sample_next_token(
            logits, torch.full((3,), temperature), torch.full((3,), top_k), torch.full((3,), top_p), generator
        )
        assert tokens.tolist() == [1, 1, 1]
        assert torch.isfinite(log_probs).all()
    # top_k=2 never leaves the two best tokens
    tokens, _ = sample_next_token(
        logits.repeat(100, 1), torch.full((300,), 5.0), torch.full((300,), 2), torch.ones(300), generator
    )
    assert set(tokens.tolist()) <= {1, 2} and len(set(tokens.tolist())) == 2


def test_log_probs_are_the_models(tiny):
    _, model, tok = tiny
    requests = [
        GenerationRequest(prompt_ids=tok.encode("hello world"), max_tokens=12, temperature=0.8, logprobs=True),
        GenerationRequest(prompt_ids=tok.encode("a"), max_tokens=12, temperature=1.0, logprobs=True),
    ]
    results = generate_batch(
        model, tok, requests, [tok.eos_token_id], tok.pad_token_id, torch.Generator().manual_seed(1)
    )
    for request, result in zip(requests, results, strict=True):
        ids = torch.tensor([request.prompt_ids + result.token_ids])
        logits = model(ids).logits[0, len(request.prompt_ids) - 1 : -1] / request.temperature
        expected = torch.log_softmax(logits, -1).gather(-1, ids[0, len(request.prompt_ids) :, None]).squeeze(-1)
        torch.testing.assert_close(torch.tensor(result.log_probs), expected, atol=1e-4, rtol=1e-4)


def test_greedy_matches_hf_generate(tiny):
    _, model, tok = tiny
    prompt = tok.encode("The quick brown fox")
    ours = generate_batch(
        model, tok, [GenerationRequest(prompt_ids=prompt, max_tokens=10, temperature=0.0, ignore_eos=True)], [], 0
    )[0]
    reference = model.generate(torch.tensor([prompt]), max_new_tokens=10, do_sample=False, eos_token_id=None)
    assert ours.token_ids == reference[0, len(prompt) :].tolist()
    assert ours.finish_reason == "length"


def test_stop_strings_stop_right_after_completion(tiny):
    _, model, tok = tiny
    prompt = tok.encode("Question")
    free = generate_batch(
        model, tok, [GenerationRequest(prompt_ids=prompt, max_tokens=40, temperature=0.0, ignore_eos=True)], [], 0
    )[0]
    text = tok.decode(free.token_ids)
    stop = text[len(text) // 2 : len(text) // 2 + 2]  # a stop string the greedy text contains
    assert stop and stop in text
    stopped = generate_batch(
        model,
        tok,
        [GenerationRequest(prompt_ids=prompt, max_tokens=40, temperature=0.0, ignore_eos=True, stop=[stop])],
        [],
        0,
    )[0]
    out = tok.decode(stopped.token_ids)
    assert stop in out and stop not in tok.decode(stopped.token_ids[:-1])
    assert stopped.token_ids == free.token_ids[: len(stopped.token_ids)]
    assert stopped.finish_reason == "stop"


def test_eos_and_max_tokens(tiny):
    _, model, tok = tiny
    prompt = tok.encode("hi")
    forced_eos = generate_batch(
        model, tok, [GenerationRequest(prompt_ids=prompt, max_tokens=5, temperature=0.0)], list(range(len(tok))), 0
    )[0]
    assert len(forced_eos.token_ids) == 1 and forced_eos.finish_reason == "stop"
    capped = generate_batch(
        model, tok, [GenerationRequest(prompt_ids=prompt, max_tokens=3, temperature=1.0, ignore_eos=True)], [], 0
    )[0]
    assert len(capped.token_ids) == 3 and capped.finish_reason == "length"


def test_request_parsing():
    request = GenerationRequest.from_sampling_params(
        [1, 2],
        {"temperature": 0.5, "top_p": 0.9, "top_k": None, "logprobs": True, "stop": "</a>", "max_new_tokens": 7},
        default_max_tokens=99,
    )
    assert (request.max_tokens, request.top_k, request.stop, request.logprobs) == (7, -1, ["</a>"], True)
    assert GenerationRequest.from_sampling_params([1], {}, default_max_tokens=99).max_tokens == 99
    with pytest.raises(ValueError, match="n=2"):
        GenerationRequest.from_sampling_params([1], {"n": 2}, default_max_tokens=9)


def test_server_batches_concurrent_requests_and_swaps_weights(tiny):
    from verl.workers.config import RolloutConfig

    from sorl_verl.platform.hf_rollout import HFRolloutServer

    path, _, tok = tiny
    server = HFRolloutServer(
        RolloutConfig(name="hf", prompt_length=32, response_length=8),
        SimpleNamespace(local_path=str(path), path=str(path), trust_remote_code=False),
    )

    async def scenario():
        params = {"temperature": 1.0, "logprobs": True}
        outs = await asyncio.gather(
            *[server.generate(tok.encode(f"q{i}"), dict(params), request_id=str(i)) for i in range(4)]
        )
        state = await server.get_state_dict()
        zeros = {name: torch.zeros_like(t) for name, t in state.items()}
        assert await server.update_weights(zeros, global_steps=3) == len(zeros)
        after = await server.generate(tok.encode("q"), {"temperature": 1.0, "logprobs": True}, request_id="x")
        with pytest.raises(KeyError, match="does not have"):
            await server.update_weights({"not.a.weight": torch.zeros(1)})
        return outs, after

    outs, after = asyncio.run(scenario())
    assert all(1 <= len(o.token_ids) <= 8 and len(o.log_probs) == len(o.token_ids) for o in outs)
    # all-zero weights: uniform next-token distribution, so every log-prob is -log(vocab)
    vocab = server.model.config.vocab_size
    torch.testing.assert_close(
        torch.tensor(after.log_probs), torch.full((len(after.token_ids),), -torch.log(torch.tensor(float(vocab))))
    )
    assert after.extra_fields["global_steps"] == 3


def test_unfiltered_sampling_follows_the_softmax_and_never_picks_a_masked_token():
    logits = torch.tensor([[0.0, 1.0, 2.0, float("-inf")]]).repeat(20000, 1)
    n = logits.shape[0]
    tokens, log_probs = sample_next_token(
        logits, torch.ones(n), torch.full((n,), -1), torch.ones(n), torch.Generator().manual_seed(0)
    )
    expected = torch.softmax(logits[0], -1)
    counts = torch.bincount(tokens, minlength=4).float() / n
    assert counts[3] == 0
    # 20000 draws: the standard error of a share is at most 0.0036
    torch.testing.assert_close(counts, expected, atol=0.015, rtol=0)
    torch.testing.assert_close(log_probs, expected.log()[tokens])
    # the filtered (sorted) path agrees in distribution: top_p just below 1 keeps all three
    tokens_sorted, _ = sample_next_token(
        logits, torch.ones(n), torch.full((n,), -1), torch.full((n,), 0.9999), torch.Generator().manual_seed(1)
    )
    torch.testing.assert_close(torch.bincount(tokens_sorted, minlength=4).float() / n, expected, atol=0.015, rtol=0)


def test_stop_strings_end_sampled_text_where_a_full_decode_first_contains_them(tiny):
    # the stop check runs only for tokens that can complete a stop: on sampled text, the output
    # must still end exactly at the first token whose prefix decodes to a text holding the stop
    _, model, tok = tiny
    free = generate_batch(
        model,
        tok,
        [GenerationRequest(prompt_ids=tok.encode("Question"), max_tokens=60, ignore_eos=True)],
        [],
        0,
        torch.Generator().manual_seed(3),
    )[0]
    text = tok.decode(free.token_ids)
    checked = 0
    for start in range(0, len(text) - 3, 5):
        stop = text[start : start + 3]
        if not stop.strip():
            continue
        expected = next(i for i in range(1, len(free.token_ids) + 1) if stop in tok.decode(free.token_ids[:i]))
        stopped = generate_batch(
            model,
            tok,
            [GenerationRequest(prompt_ids=tok.encode("Question"), max_tokens=60, ignore_eos=True, stop=[stop])],
            [],
            0,
            torch.Generator().manual_seed(3),
        )[0]
        assert stopped.token_ids == free.token_ids[:expected], stop
        checked += 1
    assert checked >= 5
