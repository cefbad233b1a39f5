"""The Search-R1 agent loop for verl, registered as ``search_r1``.

The model reasons, searches with ``<search> query </search>``, reads the retrieved passages
in ``<information> ... </information>`` and answers with ``<answer> ... </answer>``. Select it
per row with ``agent_name: search_r1`` in the dataset (or
``actor_rollout_ref.rollout.agent.default_agent_loop=search_r1``); options go in an
agent-loop config file (``examples/configs/search_r1_agent.yaml``, passed as
``actor_rollout_ref.rollout.agent.agent_loop_config_path``).

Search-R1's protocol, reproduced from ``search_r1/llm_agent/generation.py`` of
github.com/PeterGriffinJin/Search-R1 (``run_llm_loop``, ``_postprocess_responses``,
``execute_predictions``, ``postprocess_predictions``, ``_process_next_obs``):

- each generation stops after ``</search>`` or ``</answer>``;
- the action is the first ``<(search|answer)>(.*?)</\\1>`` match (DOTALL) of the turn's text,
  its content stripped;
- ``answer`` ends the trajectory; ``search`` appends
  ``"\\n\\n<information>{passages.strip()}</information>\\n\\n"`` (passages from
  ``format_passages``); anything else appends :data:`INVALID_ACTION_MESSAGE`;
- at most ``max_turns`` such steps, then one final generation whose action is recorded but
  never executed (no search, no observation);
- observations are tokenized without special tokens and cut to their first
  ``max_obs_length`` tokens; they are context, not actions: ``response_mask`` 0.

Ours (verl's agent-loop setting differs from Search-R1's batched trainer):

- token in, token out: the model's tokens are kept exactly as the server returned them (ids
  and log-probs); only observations are tokenized. Search-R1 instead decodes each turn and
  re-tokenizes the text, which can change the ids the policy is trained on.
- stop tags: we ask the server to stop (``stop`` + ``include_stop_str_in_output``, or
  SGLang's ``no_stop_trim``) and also cut the returned tokens after the first token that
  completes a stop tag, so any backend works. Search-R1 cuts at ``</search>`` if present
  anywhere, else at ``</answer>``; with real stop strings both rules agree.
- a turn that is followed by an observation loses trailing special tokens (e.g. an EOS the
  model emitted without acting), as Search-R1's ``skip_special_tokens`` decode drops them;
  a turn that ends the trajectory keeps them, so the model is still trained to stop.
- budget: ``rollout.response_length`` caps the whole response (model + observation tokens);
  each generation is further capped at ``max_tokens_per_turn`` (Search-R1's per-generation
  ``max_response_length``). An observation that does not fit is cut and the trajectory ends.
- a retrieval failure (after the client's retries, within its ``http.deadline_s``) raises
  :class:`~sorl_verl.agent.retrieval_client.RetrievalError`, and so does ``SearchTool``: an
  outage is the environment's fault, and an empty or error observation in its place would put
  a state the task never has into the training data (the policy would be trained, and
  rewarded, on it). A failed step is visible and can be resumed from its checkpoint.

Segment mode (``sorl_segment`` trainer, ``docs/segments.md``): a row carrying the field
``sorl_segment`` continues its episode from the carried tokens for at most ``turns`` model turns
and returns only that segment as the trained sample (:meth:`SearchR1AgentLoop._run_segment`);
rows without it run whole episodes, as above.

Defaults are Search-R1's training scripts (``train_ppo.sh`` / ``train_grpo.sh``:
``max_turns=2``, ``retriever.topk=3``, ``data.max_obs_length=500``,
``data.max_response_length=500`` per generation); their ``ppo_trainer.yaml`` default is
``max_turns: 10``.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field, replace
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput
from verl.utils.profiler import simple_timer
from verl.utils.rollout_trace import rollout_trace_op

from sorl_verl.agent.retrieval_client import EMBEDDED, HttpOptions, format_passages, get_client
from sorl_verl.agent.segments import SEGMENT_KEY, STATE_KEY, warmup_turns

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "WARN"))

SEARCH_STOP = "</search>"
ANSWER_STOP = "</answer>"
STOP_TAGS = (SEARCH_STOP, ANSWER_STOP)
ACTION_PATTERN = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)
# Search-R1's corrective observation for a turn without a valid action, verbatim.
INVALID_ACTION_MESSAGE = (
    "\nMy previous action is invalid. "
    "If I want to search, I should put the query between <search> and </search>. "
    "If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again.\n"
)


def information_block(passages: str) -> str:
    """Search-R1's observation for a search: the passages between ``<information>`` tags."""
    return f"\n\n<information>{passages.strip()}</information>\n\n"


def parse_action(text: str) -> tuple[str | None, str]:
    """``("search" | "answer", content)`` for the first complete tag pair, else ``(None, "")``."""
    match = ACTION_PATTERN.search(text)
    if match is None:
        return None, ""
    return match.group(1), match.group(2).strip()


def stop_prefix_length(decode, token_ids: list[int], stop_tags=STOP_TAGS) -> int:
    """Number of leading tokens up to and including the token that completes the first stop tag.

    ``decode(ids) -> str``. Returns ``len(token_ids)`` when no stop tag is complete. A tag that
    ends inside a token keeps that whole token (a token cannot be split). Binary search over
    prefixes: whether a prefix's text contains an (ASCII) tag only grows with the prefix.
    """
    if not any(tag in decode(token_ids) for tag in stop_tags):
        return len(token_ids)
    low, high = 1, len(token_ids)  # the answer lies in [low, high]
    while low < high:
        middle = (low + high) // 2
        if any(tag in decode(token_ids[:middle]) for tag in stop_tags):
            high = middle
        else:
            low = middle + 1
    return low


@dataclass
class _Trajectory:
    """Per-trajectory state; ``response_*`` lists are aligned token by token."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    response_logprobs: list[float] | None = None
    model_turns: int = 0
    observations: int = 0
    searches: int = 0
    invalid_actions: int = 0
    answered: bool = False
    truncated: bool = False
    actions: list[str] = field(default_factory=list)
    turn_starts: list[int] = field(default_factory=list)  # response offset of each model turn generated here

    def append(self, token_ids: list[int], mask_value: int, logprobs: list[float] | None) -> None:
        if logprobs is not None and self.response_logprobs is None:
            self.response_logprobs = [0.0] * len(self.response_ids)
        self.response_ids.extend(token_ids)
        self.response_mask.extend([mask_value] * len(token_ids))
        if self.response_logprobs is not None:
            self.response_logprobs.extend(logprobs if logprobs is not None else [0.0] * len(token_ids))


# Registered by ``sorl_verl/agent/__init__.py`` (which must not import this module), not with
# ``@register`` here: verl's worker loads an agent-loop config file into the registry before
# hydra first imports this module, and ``@register`` would then overwrite that entry and drop
# its options for every later trajectory.
class SearchR1AgentLoop(AgentLoopBase):
    """Search-R1's multi-turn search protocol as a verl agent loop (see the module docstring).

    Args (all keyword, from the agent-loop config file or ``hydra`` overrides):
        retriever: ``"embedded"`` (BM25 over the shipped Wikipedia summaries), an index
            folder, or the URL of a Search-R1 retrieval server (``http://host:port[/retrieve]``).
        topk: passages per search (Search-R1: 3).
        max_turns: search/act steps before the final answer turn (Search-R1 scripts: 2).
        max_obs_length: observation cap in tokens (Search-R1: 500).
        max_tokens_per_turn: cap per generation, within ``rollout.response_length``
            (Search-R1's ``max_response_length``: 500).
        http: ``HttpOptions`` fields for a URL retriever (timeout_s, deadline_s, max_retries, ...);
            the same mapping as ``SearchTool``'s ``http``.
    """

    def __init__(
        self,
        *args,
        retriever: str = EMBEDDED,
        topk: int = 3,
        max_turns: int = 2,
        max_obs_length: int = 500,
        max_tokens_per_turn: int = 500,
        http: dict | None = None,
        tools: Any = None,  # passed to every agent loop by verl's worker; unused here
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        for name, value, minimum in (
            ("topk", topk, 1),
            ("max_turns", max_turns, 0),
            ("max_obs_length", max_obs_length, 1),
            ("max_tokens_per_turn", max_tokens_per_turn, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ValueError(f"search_r1 agent loop: {name} must be an integer >= {minimum}, got {value!r}")
        self.retriever_spec = str(retriever)
        self.topk = topk
        self.max_turns = max_turns
        self.max_obs_length = max_obs_length
        self.max_tokens_per_turn = max_tokens_per_turn
        self.http_options = HttpOptions.from_config(http, "search_r1 agent loop: http")
        self.response_length = self.rollout_config.response_length
        self.special_ids = set(self.tokenizer.all_special_ids)
        if getattr(self.rollout_config, "name", None) == "sglang":
            self.stop_params = {"stop": list(STOP_TAGS), "no_stop_trim": True}
        else:
            self.stop_params = {"stop": list(STOP_TAGS), "include_stop_str_in_output": True}

    def _decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def _sampling_params(self, sampling_params: dict[str, Any], max_tokens: int) -> dict[str, Any]:
        params = dict(sampling_params)
        stops = list(params.get("stop") or [])
        params.update(self.stop_params)
        params["stop"] = stops + [tag for tag in STOP_TAGS if tag not in stops]
        params["max_tokens"] = max_tokens
        return params

    @rollout_trace_op
    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        segment = kwargs.get(SEGMENT_KEY)
        if segment is not None:  # a row of the segment trainer: continue an episode for a few turns
            return await self._run_segment(sampling_params, segment, kwargs)
        trajectory = _Trajectory(prompt_ids=await self.ct_build_initial_tokens(list(kwargs["raw_prompt"])))
        metrics: dict[str, Any] = {}
        extra_fields: dict[str, Any] = {}
        await self._advance(trajectory, sampling_params, self._request_id(kwargs), metrics, extra_fields)
        return self._output(trajectory, metrics, extra_fields)

    def _request_id(self, kwargs: dict[str, Any]) -> str:
        if getattr(self.rollout_config, "full_determinism", False):
            return f"det-{int(kwargs.get('priority', 0))}"
        return uuid4().hex

    async def _advance(
        self,
        trajectory: _Trajectory,
        sampling_params: dict[str, Any],
        request_id: str,
        metrics: dict[str, Any],
        extra_fields: dict[str, Any],
        max_new_turns: int | None = None,
    ) -> bool:
        """Run the protocol from ``trajectory``'s turn ``model_turns`` on; True when the episode ended.

        ``max_new_turns``: stop (episode not ended) after that many model turns and their
        observations; ``None``: run to the end of the episode.
        """
        first_turn = trajectory.model_turns
        for turn in range(first_turn, self.max_turns + 1):
            if max_new_turns is not None and turn - first_turn >= max_new_turns:
                return False
            final_turn = turn == self.max_turns
            budget = self.response_length - len(trajectory.response_ids)
            if budget <= 0:
                trajectory.truncated = True
                return True
            with simple_timer("generate_sequences", metrics):
                output = await self.server_manager.generate(
                    request_id=request_id,
                    prompt_ids=trajectory.prompt_ids + trajectory.response_ids,
                    sampling_params=self._sampling_params(sampling_params, min(budget, self.max_tokens_per_turn)),
                )
            if output.num_preempted is not None:
                metrics["num_preempted"] = metrics.get("num_preempted", 0) + output.num_preempted
            self._merge_server_fields(extra_fields, output.extra_fields)
            # weight versions [oldest, newest] that generated this turn (turn-level staleness
            # under partial rollouts: sorl_verl.algos.async_trainers)
            extra_fields.setdefault("turn_global_steps", []).append(
                [output.extra_fields.get("min_global_steps"), output.extra_fields.get("max_global_steps")]
            )

            token_ids = list(output.token_ids)[:budget]
            token_ids = token_ids[: stop_prefix_length(self._decode, token_ids)]
            logprobs = list(output.log_probs[: len(token_ids)]) if output.log_probs else None
            action, content = parse_action(self._decode(token_ids))
            trajectory.actions.append(action or "invalid")
            trajectory.model_turns += 1
            trajectory.turn_starts.append(len(trajectory.response_ids))
            trajectory.answered = action == "answer"
            if action is None:
                trajectory.invalid_actions += 1

            out_of_budget = len(trajectory.response_ids) + len(token_ids) >= self.response_length
            if final_turn or action == "answer" or out_of_budget:
                trajectory.append(token_ids, 1, logprobs)
                trajectory.truncated = out_of_budget and action != "answer"
                return True

            while token_ids and token_ids[-1] in self.special_ids:
                token_ids.pop()
                if logprobs:
                    logprobs.pop()
            trajectory.append(token_ids, 1, logprobs)

            if action == "search":
                with simple_timer("tool_calls", metrics):
                    hit_lists = await get_client(self.retriever_spec, self.http_options).asearch(
                        [content], topk=self.topk
                    )
                observation = information_block(format_passages(hit_lists[0]))
                trajectory.searches += 1
            else:
                observation = INVALID_ACTION_MESSAGE
            observation_ids = self.tokenizer.encode(observation, add_special_tokens=False)[: self.max_obs_length]
            room = self.response_length - len(trajectory.response_ids)
            trajectory.append(observation_ids[:room], 0, None)
            trajectory.observations += 1
            if len(observation_ids) >= room:
                trajectory.truncated = True
                return True
        return True

    async def _run_segment(
        self, sampling_params: dict[str, Any], segment: dict[str, Any], kwargs: dict[str, Any]
    ) -> AgentLoopOutput:
        """Advance one episode of the segment trainer's pool by at most ``segment["turns"]`` model turns.

        ``segment``: ``episode_id``, ``turns``, ``start_fraction`` and ``state`` (this method's
        previous ``state`` output; ``None`` for a fresh episode). A fresh episode first generates
        :func:`~sorl_verl.agent.segments.warmup_turns` turns as context (staggered placement).
        The output is the segment: prompt = question + carried context, response = the segment's
        tokens; when the episode goes on, one extra mask-0 token ends the response, so the
        critic's value at that position is the value of the state after the segment (the
        bootstrap). Rewards: 0 for a segment whose episode goes on (the reward function is not
        called), the reward function's score for the last one. ``extra_fields[STATE_KEY]``
        carries ``done``, ``first_turn`` and ``turns`` (the trained turns' positions in the
        episode), ``context_turn_versions`` and the new ``state``.
        """
        state = segment.get("state")
        if state is None:
            trajectory = _Trajectory(prompt_ids=await self.ct_build_initial_tokens(list(kwargs["raw_prompt"])))
            warmup = warmup_turns(float(segment.get("start_fraction") or 0.0), self.max_turns + 1)
            context_versions: list = []
        else:
            trajectory = _Trajectory(
                prompt_ids=list(state["prompt_ids"]),
                response_ids=list(state["context_ids"]),
                response_mask=list(state["context_mask"]),
                model_turns=int(state["model_turns"]),
                observations=int(state["observations"]),
                searches=int(state["searches"]),
                invalid_actions=int(state["invalid_actions"]),
                actions=list(state["actions"]),
            )
            warmup = 0
            context_versions = [list(pair) for pair in state["turn_versions"]]
        start_turn = trajectory.model_turns
        metrics: dict[str, Any] = {}
        extra_fields: dict[str, Any] = {}
        ended = await self._advance(
            trajectory,
            sampling_params,
            self._request_id(kwargs),
            metrics,
            extra_fields,
            max_new_turns=warmup + int(segment["turns"]),
        )
        versions = extra_fields.pop("turn_global_steps", [])
        new_turns = trajectory.model_turns - start_turn
        # the first trained turn: after the warm-up, or the last turn when the episode ended in it
        first = min(warmup, max(new_turns - 1, 0))
        split = trajectory.turn_starts[first] if new_turns else len(trajectory.response_ids)
        ended = ended or new_turns == 0

        next_state = None
        if not ended:
            next_state = {
                "prompt_ids": list(trajectory.prompt_ids),
                "context_ids": list(trajectory.response_ids),
                "context_mask": list(trajectory.response_mask),
                "model_turns": trajectory.model_turns,
                "observations": trajectory.observations,
                "searches": trajectory.searches,
                "invalid_actions": trajectory.invalid_actions,
                "actions": list(trajectory.actions),
                "turn_versions": context_versions + versions,
            }
        logprobs = trajectory.response_logprobs
        view = replace(
            trajectory,
            prompt_ids=trajectory.prompt_ids + trajectory.response_ids[:split],
            response_ids=trajectory.response_ids[split:],
            response_mask=trajectory.response_mask[split:],
            response_logprobs=logprobs[split:] if logprobs is not None else None,
        )
        if not ended or not view.response_ids:
            # the bootstrap position (never an empty response either)
            view.append([self._bootstrap_token_id()], 0, None)
        extra_fields["turn_global_steps"] = versions[first:]
        extra_fields[STATE_KEY] = {
            "episode_id": int(segment["episode_id"]),
            "done": ended,
            "first_turn": start_turn + first,
            "turns": new_turns - first,
            "context_turn_versions": context_versions + versions[:first],
            "state": next_state,
        }
        return self._output(view, metrics, extra_fields, reward_score=None if ended else 0.0)

    def _bootstrap_token_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad if pad is not None else self.tokenizer.eos_token_id)

    @staticmethod
    def _merge_server_fields(extra_fields: dict[str, Any], server_fields: dict[str, Any]) -> None:
        """Keep the first generation's server fields; later ones only raise ``max_global_steps`` (as ``tool_agent``)."""
        if not extra_fields:
            extra_fields.update(server_fields or {})
        elif (server_fields or {}).get("max_global_steps") is not None:
            extra_fields["max_global_steps"] = server_fields["max_global_steps"]

    def _output(
        self, trajectory: _Trajectory, metrics: dict, extra_fields: dict, reward_score: float | None = None
    ) -> AgentLoopOutput:
        length = self.response_length
        extra_fields.update(
            {
                # Same keys as verl's own loops, so batches mixing agent loops concatenate.
                "turn_scores": [],
                "tool_rewards": [],
                "search_r1_model_turns": trajectory.model_turns,
                "search_r1_searches": trajectory.searches,
                "search_r1_invalid_actions": trajectory.invalid_actions,
                "search_r1_answered": trajectory.answered,
                "search_r1_truncated": trajectory.truncated,
                "search_r1_actions": list(trajectory.actions),
            }
        )
        metrics.setdefault("num_preempted", -1)  # verl's "not available"
        return AgentLoopOutput(
            prompt_ids=trajectory.prompt_ids,
            response_ids=trajectory.response_ids[:length],
            response_mask=trajectory.response_mask[:length],
            response_logprobs=trajectory.response_logprobs[:length] if trajectory.response_logprobs else None,
            # verl counts the user turn, every assistant turn and every tool turn.
            num_turns=1 + trajectory.model_turns + trajectory.observations,
            metrics=metrics,
            extra_fields=extra_fields,
            # unset unless given: verl's worker then calls the reward function
            **({"reward_score": reward_score} if reward_score is not None else {}),
        )
