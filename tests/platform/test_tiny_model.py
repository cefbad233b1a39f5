"""The tiny model folder loads the way verl loads models and behaves like a Qwen2.5 chat model."""

import hashlib
import json

import pytest
import torch
from tokenizers import Tokenizer
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from sorl_verl.models import build_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("m") / "tiny", texts=["Who painted the Mona Lisa? Leonardo."])


def test_loads_with_auto_classes_and_qwen_special_tokens(tiny):
    config = AutoConfig.from_pretrained(tiny)
    tok = AutoTokenizer.from_pretrained(tiny)
    model = AutoModelForCausalLM.from_pretrained(tiny)
    assert config.model_type == "qwen2" and config.tie_word_embeddings
    assert config.vocab_size == len(tok) == model.get_input_embeddings().weight.shape[0]
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert config.eos_token_id == tok.eos_token_id and config.pad_token_id == tok.pad_token_id
    for special in ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_response>"):
        assert len(tok.encode(special, add_special_tokens=False)) == 1, special
    assert set(model.generation_config.eos_token_id) == {tok.eos_token_id, tok.pad_token_id}
    assert model.num_parameters() < 500_000


def test_loaded_tokenizer_matches_trained_one_and_round_trips(tiny):
    tok = AutoTokenizer.from_pretrained(tiny)
    raw = Tokenizer.from_file(str(tiny / "tokenizer.json"))
    text = "Héllo  wörld!\n\n<search> 日本 </search>\t<answer>42</answer> <|im_start|>user\n"
    assert tok.encode(text, add_special_tokens=False) == raw.encode(text).ids
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_chat_template_chatml_and_hermes_tools(tiny):
    tok = AutoTokenizer.from_pretrained(tiny)
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q?"}]
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ?<|im_end|>\n<|im_start|>assistant\n"
    assert not tok.apply_chat_template(msgs, tokenize=False).endswith("assistant\n")
    call = {"type": "function", "function": {"name": "search", "arguments": '{"query": "x"}'}}
    conv = [
        {"role": "user", "content": "Q?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "r1"},
        {"role": "tool", "content": "r2"},
    ]
    tools = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]
    text = tok.apply_chat_template(conv, tools=tools, tokenize=False)
    assert text.startswith("<|im_start|>system\n# Tools") and '"name": "search"' in text
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "search", "arguments": {"query": "x"}}\n</tool_call><|im_end|>'
        in text
    )
    # consecutive tool results share one user turn, the hermes way
    assert text.endswith(
        "<|im_start|>user\n<tool_response>\nr1\n</tool_response>\n<tool_response>\nr2\n</tool_response><|im_end|>\n"
    )


def test_generates(tiny):
    tok = AutoTokenizer.from_pretrained(tiny)
    model = AutoModelForCausalLM.from_pretrained(tiny)
    ids = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, return_tensors="pt")
    ids = ids["input_ids"] if not isinstance(ids, torch.Tensor) else ids
    out = model.generate(ids, max_new_tokens=5, do_sample=True, pad_token_id=tok.pad_token_id)
    assert out.shape[1] > ids.shape[1]


def test_deterministic_with_seed(tmp_path):
    def digest(path):
        return {f: hashlib.sha256((path / f).read_bytes()).hexdigest() for f in ("model.safetensors", "tokenizer.json")}

    a = digest(build_tiny_model(tmp_path / "a", seed=3))
    assert a == digest(build_tiny_model(tmp_path / "b", seed=3))
    assert a["model.safetensors"] != digest(build_tiny_model(tmp_path / "c", seed=4))["model.safetensors"]
    assert json.loads((tmp_path / "a" / "sorl_tiny_model.json").read_text())["seed"] == 3


def test_bad_shape_rejected(tmp_path):
    with pytest.raises(ValueError, match="num_attention_heads"):
        build_tiny_model(tmp_path / "x", hidden_size=64, num_attention_heads=5)
    assert not (tmp_path / "x").exists()
