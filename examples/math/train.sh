#!/usr/bin/env bash
# Math reasoning (paper: DAPO-Math-17k training, AIME24 evaluation), one turn per response
# (rows use verl's single_turn_agent: no tool). With one turn the turn-level ratio of
# turn_ppo / st_ppo / so_ppo is the sequence-level (GSPO-style) ratio.
#
#   bash examples/math/prepare_data.sh
#   ALGO=so_grpo MODEL=Qwen/Qwen2.5-7B bash examples/math/train.sh [hydra overrides...]
#
# Lengths and group size are ours (DAPO used 16 samples per prompt and 20k-token responses on
# larger models); the optimiser settings are the shared Search-R1 ones of examples/common.sh.
#
# Asynchronous by default (the paper's latest version trains math asynchronously; the settings
# below are ours, see docs/async.md). ASYNC=0 runs the synchronous trainer instead.
#   - trainer sorl_colocate_async: verl's colocate_async (rollouts of the next batch keep
#     running during the update; unfinished requests are aborted at the end of sampling and
#     continued under the new weights: partial rollouts) plus turn_gae's critic values and the
#     turn-level staleness metrics actor/sorl/turn_staleness_{mean,max}, mixed_version_share;
#   - ASYNC_WARMUP_BATCHES=1 batch generated ahead (verl's default);
#   - MAX_OFF_POLICY=8: a trajectory spanning more weight versions is dropped
#     (trainer.v1.sampler.max_off_policy_threshold, verl's default; the stability benchmark
#     varies it: 0 = ASYNC=0, 2, 8);
#   - ASYNC_BYPASS=True: the loss's old policy is the policy that generated the tokens
#     (algorithm.rollout_correction.bypass_mode: old_log_probs = rollout_log_probs), so the
#     SORL turn-level ratio is the off-policy ratio itself. ASYNC_BYPASS=False recomputes the old
#     policy with the current weights (the ratio starts at 1) and leaves the staleness to verl's
#     rollout correction (add algorithm.rollout_correction.rollout_is=token for its weights).
set -euo pipefail
MAX_PROMPT_LENGTH="${MAX_PROMPT_LENGTH:-1024}"
MAX_RESPONSE_LENGTH="${MAX_RESPONSE_LENGTH:-8192}"
GROUP_SIZE="${GROUP_SIZE:-8}"
# AIME24 has 30 problems: validate every 20 steps, greedy (examples/common.sh).
TEST_FREQ="${TEST_FREQ:-20}"
ASYNC="${ASYNC:-1}"
ASYNC_WARMUP_BATCHES="${ASYNC_WARMUP_BATCHES:-1}"
MAX_OFF_POLICY="${MAX_OFF_POLICY:-8}"
ASYNC_BYPASS="${ASYNC_BYPASS:-True}"
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

ASYNC_OVERRIDES=()
case "$ASYNC" in
  1)
    ASYNC_OVERRIDES=(
      "trainer.v1.trainer_mode=sorl_colocate_async"
      "trainer.v1.colocate_async.num_warmup_batches=$ASYNC_WARMUP_BATCHES"
      "trainer.v1.sampler.max_off_policy_threshold=$MAX_OFF_POLICY"
      "algorithm.rollout_correction.bypass_mode=$ASYNC_BYPASS"
    )
    ;;
  0) ;;
  *) sorl_die "ASYNC=$ASYNC: use 1 (asynchronous, default) or 0 (synchronous)" ;;
esac

DATA_DIR="${DATA_DIR:-$SORL_REPO/data/math}"
TRAIN_FILES="${TRAIN_FILES:-$DATA_DIR/train.parquet}"
VAL_FILES="${VAL_FILES:-$DATA_DIR/aime2024.parquet}"
RUN_NAME="${RUN_NAME:-math-$(basename "$MODEL")-$ALGO}"
RUN_DIR="${RUN_DIR:-$RUN_ROOT/math/$RUN_NAME}"

sorl_require_file "$TRAIN_FILES" "training data" "run examples/math/prepare_data.sh"
sorl_require_file "$VAL_FILES" "validation data" "run examples/math/prepare_data.sh"

sorl_launch \
  "data.train_files=$TRAIN_FILES" \
  "data.val_files=$VAL_FILES" \
  "actor_rollout_ref.rollout.agent.default_agent_loop=single_turn_agent" \
  `# Long single responses: pack micro-batches by tokens rather than by count.` \
  "actor_rollout_ref.actor.use_dynamic_bsz=True" \
  "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=$(((MAX_PROMPT_LENGTH + MAX_RESPONSE_LENGTH) * 2))" \
  "${ASYNC_OVERRIDES[@]}" \
  -- "$@"
