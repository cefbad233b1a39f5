"""Batched token-in/token-out sampling with HF transformers (the engine of the ``hf`` rollout).

Infrastructure only, not from the SORL paper. Semantics follow what verl's agent loops
expect from vLLM's server (our reading of vLLM's documented behaviour):

- per-request ``temperature`` (``0`` = greedy), ``top_k`` (``<= 0`` or ``-1`` = off),
  ``top_p``; top-k is applied first, top-p on the renormalised remainder;
- ``max_tokens`` (alias ``max_new_tokens``) new tokens at most;
- generation ends at an eos token (unless ``ignore_eos``), a ``stop_token_ids`` token, or
  right after the token that completes the first occurrence of a ``stop`` string in the
  generated text. Returned ids always include the tokens that formed the stop string (the
  text-level ``include_stop_str_in_output`` flag changes nothing in token space);
- log-probs are of the sampled token under ``softmax(logits / temperature)`` on the full
  vocabulary, which is what verl's actor recomputes (vLLM's ``processed_logprobs``).

Rows of a batch are left-padded and decoded together with a KV cache; the only Python
loop is over decoding steps (inherent to autoregressive generation).

Partial rollouts: ``generate_batch(..., abort=event)`` checks the event before every
decoding step (and before the prefill); once it is set, every unfinished row stops with
``finish_reason="abort"`` and keeps the tokens (and log-probs) generated so far, as vLLM's
``pause_generation`` does. The caller continues such a row by sending prompt + partial
tokens again (verl's ``FullyAsyncLLMServerClient``).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

_GREEDY_EPS = 1e-5


@dataclass
class GenerationRequest:
    """One prompt and its sampling parameters (vLLM's names)."""

    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: bool = False

    @classmethod
    def from_sampling_params(cls, prompt_ids: list[int], params: dict[str, Any], default_max_tokens: int):
        """Build from a verl/vLLM ``sampling_params`` dict; rejects what we cannot honour."""
        params = dict(params)
        n = params.pop("n", 1)
        if n != 1:
            raise ValueError(f"hf rollout: sampling_params n={n}; verl repeats prompts for n>1, send n=1")
        max_tokens = params.pop("max_tokens", params.pop("max_new_tokens", None))
        stop = params.pop("stop", None) or []
        if isinstance(stop, str):
            stop = [stop]
        top_k = params.pop("top_k", -1)
        return cls(
            prompt_ids=list(prompt_ids),
            max_tokens=int(default_max_tokens if max_tokens is None else max_tokens),
            temperature=float(params.pop("temperature", 1.0)),
            top_p=float(params.pop("top_p", 1.0)),
            top_k=-1 if top_k is None else int(top_k),
            stop=[s for s in stop if s],
            stop_token_ids=list(params.pop("stop_token_ids", None) or []),
            ignore_eos=bool(params.pop("ignore_eos", False)),
            logprobs=bool(params.pop("logprobs", False)),
        )


@dataclass
class GenerationResult:
    token_ids: list[int]
    log_probs: list[float] | None
    finish_reason: str  # "stop" (eos / stop token / stop string), "length" or "abort"


def sample_next_token(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row.

    Args:
        logits: ``(batch, vocab)`` float.
        temperature: ``(batch,)``; rows ``< 1e-5`` are greedy.
        top_k: ``(batch,)`` int; ``<= 0`` keeps the whole vocabulary.
        top_p: ``(batch,)`` in ``(0, 1]``.

    Returns:
        ``(tokens (batch,), log_probs (batch,))`` with log-probs under
        ``log_softmax(logits / temperature)`` (raw logits for greedy rows).

    Sampling is by inverse CDF (one uniform per row). When no row asks for top-k or top-p
    (the quick start's case) the vocabulary is not sorted: sorting was the largest cost of
    a decoding step of the tiny models (the distribution is the same either way).
    """
    logits = logits.float()
    vocab = logits.shape[-1]
    greedy = temperature < _GREEDY_EPS
    scale = torch.where(greedy, torch.ones_like(temperature), temperature)
    scaled = logits / scale[:, None]
    full_log_probs = torch.log_softmax(scaled, dim=-1)
    filtered = bool(((top_k > 0) & (top_k < vocab)).any() or (top_p < 1.0).any())
    if filtered:
        candidates, order = scaled.sort(dim=-1, descending=True)
        ranks = torch.arange(vocab, device=logits.device)
        k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab))
        candidates = candidates.masked_fill(ranks[None, :] >= k[:, None], float("-inf"))
        sorted_probs = torch.softmax(candidates, dim=-1)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        # the most likely token always survives, so every row keeps a finite logit
        candidates = candidates.masked_fill((mass_before >= top_p[:, None]) & (ranks[None, :] > 0), float("-inf"))
        probs = torch.softmax(candidates, dim=-1)
    else:
        probs = full_log_probs.exp()
    cdf = probs.cumsum(dim=-1)
    u = torch.rand(probs.shape[0], 1, generator=generator, device=logits.device) * cdf[:, -1:]
    # the first index whose cumulative mass exceeds u: a zero-probability token is never chosen
    choice = torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp(max=vocab - 1)
    if filtered:
        choice = torch.where(greedy, torch.zeros_like(choice), choice)
        tokens = order.gather(-1, choice[:, None]).squeeze(-1)
    else:
        tokens = torch.where(greedy, scaled.argmax(dim=-1), choice)
    return tokens, full_log_probs.gather(-1, tokens[:, None]).squeeze(-1)


def _stop_window(stops: list[str]) -> int:
    # a token decodes to >= 1 byte and a character is <= 4 bytes: this many trailing tokens
    # always contain a stop string completed by the newest token.
    return 4 * max(len(s) for s in stops) + 1


# per tokenizer: {(vocab_size, stop strings): flags}
_STOP_CANDIDATES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def stop_candidates(tokenizer: Any, vocab_size: int, stops: Sequence[str]) -> list[bool]:
    """``vocab_size`` flags: the tokens that can complete one of ``stops`` (cached per tokenizer).

    A stop string completed by the newest token ends inside that token's text, so the token's
    own decoding contains the string's last character, unless the token holds only part of a
    multi-byte character (it then decodes to U+FFFD) or decodes to nothing visible. Tokens
    outside these sets cannot complete a stop string, and the decoding loop skips the text
    check for them (it decoded a window of every row at every step before).
    """
    cache = _STOP_CANDIDATES.setdefault(tokenizer, {})
    key = (vocab_size, tuple(stops))
    if key not in cache:
        last_chars = {stop[-1] for stop in stops if stop}
        flags = []
        for token_id in range(vocab_size):
            try:
                text = tokenizer.decode([token_id], skip_special_tokens=False)
            except Exception:  # noqa: BLE001 - ids the tokenizer cannot decode: check them
                text = None
            flags.append(text is None or not text.strip() or "\ufffd" in text or any(c in text for c in last_chars))
        cache[key] = flags
    return cache[key]


@torch.no_grad()
def generate_batch(
    model: torch.nn.Module,
    tokenizer: Any,
    requests: list[GenerationRequest],
    eos_token_ids: list[int],
    pad_token_id: int,
    generator: torch.Generator | None = None,
    abort: threading.Event | None = None,
    min_step_s: float = 0.0,
) -> list[GenerationResult]:
    """Generate for all requests at once (left-padded batch, shared KV cache).

    ``abort``: when set (checked before the prefill and before every decoding step), the
    unfinished rows stop with ``finish_reason="abort"`` and their partial output.
    ``min_step_s``: every decoding step lasts at least this long (sleeps the rest): simulates
    a larger model's generation time, so that asynchronous behaviour (requests still running
    when a trainer aborts them) shows with a tiny model. 0 = as fast as possible.
    """
    from transformers import DynamicCache

    if not requests:
        return []
    if abort is not None and abort.is_set():
        return [GenerationResult([], [] if r.logprobs else None, "abort") for r in requests]
    device = next(model.parameters()).device
    batch = len(requests)
    prompt_len = max(len(r.prompt_ids) for r in requests)
    input_ids = torch.full((batch, prompt_len), pad_token_id, dtype=torch.long, device=device)
    attention_mask = torch.zeros((batch, prompt_len), dtype=torch.long, device=device)
    for row, request in enumerate(requests):
        if not request.prompt_ids:
            raise ValueError(f"hf rollout: request {row} has an empty prompt")
        input_ids[row, prompt_len - len(request.prompt_ids) :] = torch.tensor(request.prompt_ids, device=device)
        attention_mask[row, prompt_len - len(request.prompt_ids) :] = 1

    temperature = torch.tensor([r.temperature for r in requests], device=device)
    top_k = torch.tensor([r.top_k for r in requests], dtype=torch.long, device=device)
    top_p = torch.tensor([r.top_p for r in requests], device=device)
    max_tokens = torch.tensor([max(r.max_tokens, 0) for r in requests], dtype=torch.long, device=device)
    end_ids = torch.zeros((batch, model.config.vocab_size), dtype=torch.bool, device=device)
    for row, request in enumerate(requests):
        ids = list(request.stop_token_ids) + ([] if request.ignore_eos else list(eos_token_ids))
        end_ids[row, [i for i in ids if 0 <= i < end_ids.shape[1]]] = True

    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache()
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        past_key_values=cache,
        use_cache=True,
    )
    logits = out.logits[:, -1, :]
    finished = max_tokens <= 0
    length_capped = max_tokens <= 0
    generated: list[list[int]] = [[] for _ in range(batch)]
    log_probs: list[list[float]] = [[] for _ in range(batch)]
    aborted = torch.zeros_like(finished)
    stop_rows = [row for row, r in enumerate(requests) if r.stop]
    stop_check = {row: stop_candidates(tokenizer, end_ids.shape[1], requests[row].stop) for row in stop_rows}
    steps = int(max_tokens.max().item())
    step_started = time.monotonic()
    for step in range(steps):
        if min_step_s > 0:
            time.sleep(max(0.0, step_started + min_step_s - time.monotonic()))
            step_started = time.monotonic()
        if abort is not None and abort.is_set():
            aborted = ~finished
            break
        tokens, token_log_probs = sample_next_token(logits, temperature, top_k, top_p, generator)
        finished_list = finished.tolist()
        token_list, lp_list = tokens.tolist(), token_log_probs.tolist()
        for row in range(batch):
            if not finished_list[row]:
                generated[row].append(token_list[row])
                log_probs[row].append(lp_list[row])
        newly_done = end_ids.gather(-1, tokens[:, None]).squeeze(-1)
        if stop_rows:
            done_list = newly_done.tolist()
            for row in stop_rows:
                if finished_list[row] or done_list[row] or not stop_check[row][token_list[row]]:
                    continue
                window = generated[row][-_stop_window(requests[row].stop) :]
                text = tokenizer.decode(window, skip_special_tokens=False)
                if any(s in text for s in requests[row].stop):
                    newly_done[row] = True
        hit_length = (max_tokens <= step + 1) & ~newly_done
        length_capped |= hit_length & ~finished
        finished = finished | newly_done | hit_length
        if bool(finished.all()):
            break
        attention_mask = torch.cat([attention_mask, torch.ones((batch, 1), dtype=attention_mask.dtype)], dim=-1)
        position_ids = position_ids[:, -1:] + 1
        step_input = torch.where(finished, torch.full_like(tokens, pad_token_id), tokens)
        out = model(
            input_ids=step_input[:, None],
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
        )
        logits = out.logits[:, -1, :]

    return [
        GenerationResult(
            token_ids=generated[row],
            log_probs=log_probs[row] if requests[row].logprobs else None,
            finish_reason="abort" if bool(aborted[row]) else "length" if bool(length_capped[row]) else "stop",
        )
        for row in range(batch)
    ]
