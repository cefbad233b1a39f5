"""A tiny Qwen2-architecture causal LM with a locally trained tokenizer, built in seconds.

Nothing here is from the SORL paper: it is test and quick-start infrastructure. verl loads
models by folder (``AutoConfig`` / ``AutoModelForCausalLM`` / ``AutoTokenizer``), and no
model hub is reachable from our machines, so we write such a folder ourselves:

- ``config.json`` + ``model.safetensors``: ``Qwen2ForCausalLM`` with random weights (tied
  input/output embeddings, a few layers, grouped-query attention like the real Qwen2.5);
- ``tokenizer.json`` + ``tokenizer_config.json``: a byte-level BPE trained with
  ``tokenizers`` on the given texts plus a small built-in sample, with Qwen's special
  tokens ``<|endoftext|>`` (pad), ``<|im_start|>``, ``<|im_end|>`` (eos) and the hermes
  tool-call tags as added tokens, like Qwen2.5's vocabulary;
- a Qwen2.5-style ChatML chat template (our own Jinja, written for this project): system /
  user / assistant turns, ``add_generation_prompt``, tools listed in the system turn and
  tool calls / tool responses rendered the hermes way (what verl's ``tool_agent`` loop and
  its ``hermes`` parser expect);
- ``generation_config.json`` with eos ``[<|im_end|>, <|endoftext|>]``.

Byte-level BPE means any text round-trips, so rollouts never produce unknown tokens.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from sorl_verl.fileio import atomic_dir

# Qwen2.5's special tokens (ids differ: ours are 0, 1, 2).
ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
# Qwen2's pre-tokenization split (words with one leading non-letter, single digits,
# punctuation runs, newline runs, spaces).
QWEN2_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Non-special added tokens, as in Qwen2.5 (kept in decoded text, so parsers can see them).
TOOL_TAGS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")

# Our ChatML template in Qwen2.5's shape. Consecutive tool messages go into one user turn
# wrapped in <tool_response> tags; assistant tool calls are JSON objects in <tool_call> tags.
CHAT_TEMPLATE = r"""{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\n\n' }}{%- endif %}
{{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>' }}
{%- for tool in tools %}{{- '\n' + (tool | tojson) }}{%- endfor %}
{{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' }}
{%- elif messages[0]['role'] == 'system' %}
{{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message['role'] == 'system' and loop.first %}
{%- elif message['role'] in ['user', 'system'] or (message['role'] == 'assistant' and not message.get('tool_calls')) %}
{{- '<|im_start|>' + message['role'] + '\n' + (message['content'] or '') + '<|im_end|>\n' }}
{%- elif message['role'] == 'assistant' %}
{{- '<|im_start|>assistant' }}
{%- if message['content'] %}{{- '\n' + message['content'] }}{%- endif %}
{%- for tool_call in message['tool_calls'] %}
{%- set call = tool_call['function'] if tool_call.get('function') else tool_call %}
{%- set arguments = call['arguments'] if call['arguments'] is string else (call['arguments'] | tojson) %}
{{- '\n<tool_call>\n{"name": "' + call['name'] + '", "arguments": ' + arguments + '}\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- elif message['role'] == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\n<tool_response>\n' + message['content'] + '\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
"""

# A built-in sample so that the BPE learns the chat scaffolding and common English even
# when no texts are given (our own sentences; short on purpose).
DEFAULT_TEXTS = (
    "You are a helpful assistant. Answer the question. Think step by step.",
    "Question: What is the capital of France? Answer: Paris.",
    "Question: Who wrote the novel? Answer: The author of the book.",
    "<think> I need to search for this. </think> <search> capital of France </search>",
    "<information> Doc 1 (Title: Paris) Paris is the capital and largest city of France. </information>",
    "<answer> Paris </answer>",
    "The quick brown fox jumps over the lazy dog. 0 1 2 3 4 5 6 7 8 9 10 100 1000",
    'The function returned {"name": "search", "arguments": {"query": "river"}} as JSON.',
    "In 1999 the city had a population of about two million people and a large river.",
    "A B C D E F G H I J K L M N O P Q R S T U V W X Y Z a b c d e f g h i j k l m n o p q r s t u v w x y z",
)


def _train_tokenizer(texts: Iterable[str], vocab_size: int, extra_tokens: Sequence[str]):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    # The same pipeline as Qwen2's tokenizer: transformers rebuilds it that way when
    # ``AutoTokenizer`` resolves our folder (model_type qwen2) to ``Qwen2Tokenizer``; training
    # with another pre-tokenizer would make loaded and trained encodings disagree.
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte: no unknown tokens
        show_progress=False,
    )
    tokenizer.train_from_iterator(list(texts), trainer=trainer)
    tokenizer.add_tokens(list(extra_tokens))
    return tokenizer


def build_tiny_model(
    out_dir: str | os.PathLike,
    texts: Iterable[str] | None = None,
    vocab_size: int = 1024,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 4096,
    extra_tokens: Sequence[str] = TOOL_TAGS,
    seed: int = 0,
) -> Path:
    """Write a loadable HF model folder (tiny Qwen2, random weights, local BPE) to ``out_dir``.

    Args:
        out_dir: destination folder; replaced atomically (built in a temporary sibling, then renamed).
        texts: training texts for the BPE, added to :data:`DEFAULT_TEXTS`.
        vocab_size: BPE target size (special and added tokens come on top; the model's
            embedding has exactly ``len(tokenizer)`` rows).
        extra_tokens: non-special added tokens (default: the hermes tool-call tags); pass e.g.
            ``("<search>", "</search>", ...)`` to make such tags single tokens.
        seed: fixes the weights (the BPE training is deterministic by itself).

    Returns:
        The folder path. Loading: ``AutoModelForCausalLM.from_pretrained(path)``,
        ``AutoTokenizer.from_pretrained(path)``.
    """
    import torch
    from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    if hidden_size % num_attention_heads or num_attention_heads % num_key_value_heads:
        raise ValueError(
            f"hidden_size={hidden_size} must be divisible by num_attention_heads={num_attention_heads}, "
            f"which must be divisible by num_key_value_heads={num_key_value_heads}"
        )
    all_texts = list(DEFAULT_TEXTS) + [str(t) for t in (texts or [])]
    # The chat template's own scaffolding is text the model will see in every prompt.
    all_texts += [CHAT_TEMPLATE]
    bpe = _train_tokenizer(all_texts, vocab_size, extra_tokens)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        bos_token=None,
        unk_token=None,
        model_max_length=max_position_embeddings,
    )
    tokenizer.chat_template = CHAT_TEMPLATE

    pad_id, eos_id = bpe.token_to_id(ENDOFTEXT), bpe.token_to_id(IM_END)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=pad_id,  # Qwen2.5 uses <|endoftext|> here and prepends no BOS
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        torch_dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=pad_id, eos_token_id=[eos_id, pad_id], pad_token_id=pad_id, do_sample=True
    )

    out = Path(out_dir)
    with atomic_dir(out, overwrite=True) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        # Some loaders read the template only from this file; write it in both places.
        (tmp / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
        (tmp / "sorl_tiny_model.json").write_text(
            json.dumps({"seed": seed, "vocab_size": len(tokenizer), "n_params": model.num_parameters()}),
            encoding="utf-8",
        )
    return out
