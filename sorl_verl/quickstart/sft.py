"""Supervised warm start on demonstration trajectories, with the retrieved text masked out.

Not from the SORL paper: RL from a random 1M-parameter model would never emit a well-formed
``<search>`` call, so the quick start first imitates a few hundred Search-R1 demonstrations
(like Search-R1's own models start from an instruction-tuned LLM). As in Search-R1's RL
loss, tokens the environment inserted (``<information> .. </information>``) carry no loss:
the model learns to act on retrieved text, not to predict it.

Plain torch + transformers; one process, a few hundred steps of AdamW.
"""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from sorl_verl.fileio import atomic_dir
from sorl_verl.progress import progress

# the attention kernels SFT can train with: the same function (softmax(QK^T)V over the unmasked
# keys); "sdpa" is torch's fused one, faster at the longer tasks' lengths. Not recorded in the
# checkpoint: RL loads the weights with the CPU platform's own ("eager").
SFT_ATTENTION = ("eager", "sdpa")


def load_causal_lm(model_dir: str | os.PathLike, attention: str = "eager"):
    """The causal LM in ``model_dir``, float32, with ``attention`` (one of :data:`SFT_ATTENTION`)."""
    from transformers import AutoModelForCausalLM

    if attention not in SFT_ATTENTION:
        raise ValueError(f"SFT attention {attention!r}: choose from {', '.join(SFT_ATTENTION)}")
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation=attention)


@dataclass
class SFTExample:
    """One tokenized trajectory: ``input_ids`` and ``loss_mask`` have the same length."""

    input_ids: list[int]
    loss_mask: list[int]  # 1 on the model's own tokens (incl. the final eos), 0 on prompt and retrieved text


def tokenize_trajectory(
    tokenizer, messages: list[dict], segments: Sequence[tuple[str, bool]], max_observation_tokens: int | None = None
) -> SFTExample:
    """Prompt (chat template + generation prompt) followed by response segments.

    Each segment is tokenized on its own and appended, exactly as the multi-turn agent loop
    concatenates the model's tokens and the environment's tokens (no merges across the
    boundary); non-trainable segments (observations) are cut to their first
    ``max_observation_tokens`` tokens, as the ``search_r1`` loop's ``max_obs_length`` does.
    The trajectory ends with the tokenizer's eos, trained like the model's own tokens:
    stopping after the answer is part of the policy.
    """
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    prompt_ids = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    ids, mask = list(prompt_ids), [0] * len(prompt_ids)
    for text, trainable in segments:
        piece = tokenizer.encode(text, add_special_tokens=False)
        if not trainable and max_observation_tokens is not None:
            piece = piece[:max_observation_tokens]
        ids += piece
        mask += [int(trainable)] * len(piece)
    ids.append(tokenizer.eos_token_id)
    mask.append(1)
    return SFTExample(input_ids=ids, loss_mask=mask)


def pad_token_id(tokenizer) -> int:
    """The id that pads a batch: the tokenizer's pad token, else its end-of-sequence token."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def collate(examples: Sequence[SFTExample], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad to the longest example. Returns ``input_ids``, ``attention_mask``, ``loss_mask``, each ``(batch, seq_len)``."""
    seq_len = max(len(e.input_ids) for e in examples)
    input_ids = torch.full((len(examples), seq_len), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(examples), seq_len), dtype=torch.long)
    loss_mask = torch.zeros((len(examples), seq_len), dtype=torch.float32)
    for row, e in enumerate(examples):
        n = len(e.input_ids)
        input_ids[row, :n] = torch.tensor(e.input_ids)
        attention_mask[row, :n] = 1
        loss_mask[row, :n] = torch.tensor(e.loss_mask, dtype=torch.float32)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask}


def masked_lm_loss(logits: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over positions whose *target* token has ``loss_mask`` 1.

    Args:
        logits: ``(batch, seq_len, vocab)``.
        input_ids, loss_mask: ``(batch, seq_len)``.
    Returns a scalar; 0 (with a graph) when nothing is trainable.
    """
    targets = input_ids[:, 1:]
    weights = loss_mask[:, 1:].to(logits.dtype)
    token_loss = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.size(-1)).float(), targets.reshape(-1), reduction="none"
    ).view_as(weights)
    return (token_loss * weights).sum() / weights.sum().clamp(min=1.0)


@torch.no_grad()
def teacher_forced_exact(
    model, examples: Sequence[SFTExample], pad_id: int, ignore_targets: Sequence[int] = (), batch_size: int = 32
) -> float:
    """Share of ``examples`` whose trainable tokens are all predicted exactly, teacher-forced (greedy argmax).

    Targets whose id is in ``ignore_targets`` are not checked (e.g. the ``<search>`` tag: the choice
    to search is a coin the warm start is meant to be unsure of). For searching demonstrations this
    is the share of facts on which the model, once it searches, writes the whole trajectory right:
    the first thought (copying the entity from the question), the query, and the final thought and
    answer (copying the value from the retrieved text).
    """
    was_training = model.training
    model.eval()
    hits = 0
    ignore = torch.tensor(list(ignore_targets), dtype=torch.long)
    for first in range(0, len(examples), batch_size):
        batch = collate(examples[first : first + batch_size], pad_id)
        predicted = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.argmax(-1)
        targets = batch["input_ids"][:, 1:]
        checked = batch["loss_mask"][:, 1:].bool() & ~torch.isin(targets, ignore)
        wrong = (predicted[:, :-1] != targets) & checked
        hits += int((~wrong.any(dim=1)).sum())
    model.train(was_training)
    return hits / max(1, len(examples))


def train_sft(
    model_dir: str | os.PathLike,
    examples: Sequence[SFTExample],
    steps: int = 300,
    batch_size: int = 32,
    lr: float = 3e-3,
    attention: str = "eager",
    warmup_steps: int = 20,
    seed: int = 0,
    out_dir: str | os.PathLike | None = None,
    show_progress: bool = True,
) -> list[float]:
    """Train the causal LM in ``model_dir`` on ``examples``; save it to ``out_dir`` (default: in place).

    AdamW with linear warm-up then cosine decay; batches drawn with a seeded generator; attention
    computed by ``attention`` (:data:`SFT_ATTENTION`).
    The folder is written to a temporary sibling then renamed, so a crash leaves the old
    model intact. Returns the per-step training losses.
    """
    from transformers import AutoTokenizer

    if not examples:
        raise ValueError("train_sft: no examples")
    model_dir = Path(model_dir)
    out = Path(out_dir) if out_dir is not None else model_dir
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    torch.manual_seed(seed)
    model = load_causal_lm(model_dir, attention)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.98))

    def lr_factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        done = (step - warmup_steps) / max(1, steps - warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * done))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    generator = torch.Generator().manual_seed(seed)
    pad_id = pad_token_id(tokenizer)
    losses: list[float] = []
    bar = progress(range(steps), desc="sft warm start", disable=not show_progress)
    for _ in bar:
        pick = torch.randint(len(examples), (min(batch_size, len(examples)),), generator=generator).tolist()
        batch = collate([examples[i] for i in pick], pad_id)
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        loss = masked_lm_loss(logits, batch["input_ids"], batch["loss_mask"])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}")

    with atomic_dir(out, overwrite=True) as tmp:
        # Copy the folder first (tokenizer, chat template, our metadata), then overwrite the weights.
        shutil.copytree(model_dir, tmp, dirs_exist_ok=True)
        model.save_pretrained(tmp)
    return losses
