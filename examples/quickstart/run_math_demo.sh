#!/usr/bin/env bash
# The CPU math quick start (`make demo TASK=math`): asynchronous SO-GRPO on generated arithmetic in
# DAPO-Math's prompt and answer format, through the paper's math recipe (examples/math/train.sh).
#
#   bash examples/quickstart/run_math_demo.sh [ALGO] [--out RUN_DIR] [hydra overrides...]
#
# ALGO: so_grpo (default) or any of examples/common.sh (grpo, st_ppo, ...).
# 1. task: "What is 23 + 7 - 5?" chains of one to three operations (MAX_OPS) in DAPO-Math-17k's
#    prompt, answered with work lines and a last line "Answer: N", scored by reward_fns.math
# 2. tiny Qwen2 + local BPE tokenizer, warm-started by SFT; a share DEMO_MIX of the multi-step
#    demonstrations' choices answer right after the first step (wrong), so the warm start is right on
#    one-step problems and RL has to teach it to finish the computation (docs/async.md)
# 3. examples/math/train.sh on CPU: verl's single_turn_agent, trainer.v1.trainer_mode=
#    sorl_colocate_async (ASYNC=0: verl's synchronous trainer), old policy = the rollout policy
#    (ASYNC_BYPASS), staleness bound MAX_OFF_POLICY; validation (greedy) before, every TEST_FREQ
#    steps and at the end; STEPS training steps
# 4. run folder: config, metrics-*.jsonl, checkpoints/, plots/curves.png, summary table
#
# Resume: give the same --out again; steps 1-2 are skipped (prepare refuses if its settings
# changed) and verl resumes from the latest checkpoint (trainer.resume_mode=auto).
# Exit: on any exit the shell sees the trainer and the launch's Ray processes are stopped; after a
# SIGKILL run `python -m sorl_verl.quickstart cleanup RUN_DIR` (a resume does it by itself first).
# Settings are environment variables (below); common.sh and examples/math/train.sh document the
# shared ones. Extra arguments are Hydra overrides for the trainer (last wins).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
STARTED_AT="$(date +%s)"
# shellcheck source=launcher.sh
source "$REPO/examples/quickstart/launcher.sh"
sorl_qs_args "$@"
sorl_qs_run_dir "math-$ALGO"

# ---- scale (ours: what fits ~10 minutes on 2 CPU cores): 8 prompts x GROUP_SIZE samples per step,
# two mini-batches (the second is off-policy), one micro-batch per mini-batch (CPU: each extra one is overhead)
STEPS="${STEPS:-20}"
TEST_FREQ="${TEST_FREQ:-5}"
SAVE_FREQ="${SAVE_FREQ:-10}"
TRAIN_BATCH_SIZE="${TRAIN_BATCH_SIZE:-8}"
PPO_MINI_BATCH_SIZE="${PPO_MINI_BATCH_SIZE:-4}"
GROUP_SIZE="${GROUP_SIZE:-8}"
MICRO_BATCH_PER_GPU="${MICRO_BATCH_PER_GPU:-32}"
LOG_PROB_MICRO_BATCH_PER_GPU="${LOG_PROB_MICRO_BATCH_PER_GPU:-64}"
ACTOR_LR="${ACTOR_LR:-1e-4}"
# prompts are 70-75 tokens (DAPO's header and footer are most of them); a three-step answer is
# 30 tokens with its eos. verl pads every row to prompt + response length: these bounds are the cost.
MAX_PROMPT_LENGTH="${MAX_PROMPT_LENGTH:-96}"
MAX_RESPONSE_LENGTH="${MAX_RESPONSE_LENGTH:-32}"
# the task (prepare.json records them; a resume must match)
MAX_OPS="${MAX_OPS:-3}"
# The demonstration mix: the share of the multi-step demonstrations' choices that answer right
# after the first step (wrong; sorl_verl/quickstart/math_task.py). The warm start learns it as a
# coin on multi-step problems: at 0.7 greedy validation answers them early, sampled rollouts finish
# the work about 30% of the time. 0 = every demonstration does the whole computation.
DEMO_MIX="${DEMO_MIX:-0.7}"
# SEED seeds everything random in a run (run_demo.sh's comment; PREPARE_SEED: the warm start alone)
SEED="${SEED:-1}"
PREPARE_SEED="${PREPARE_SEED:-$SEED}"
# torch threads of the SFT warm start: with 2 threads on a busy 2-core machine SFT slowed from
# 0.5 s to 2.5-5.5 s per step (measured); one thread also makes the warm start the same whatever
# the machine's core count (a sum's order depends on the threads)
PREPARE_THREADS="${PREPARE_THREADS:-1}"
# asynchronous by default, with the recipe's settings (examples/math/train.sh: ASYNC,
# ASYNC_WARMUP_BATCHES, MAX_OFF_POLICY, ASYNC_BYPASS)
ASYNC="${ASYNC:-1}"
# the quick start's sampler: verl's replay buffer polled every POLL_INTERVAL s instead of 2 s
# (sorl_verl/quickstart/sampler.py); empty: verl's built-in sampler
POLL_INTERVAL="${POLL_INTERVAL-0.1}"

# what examples/math/train.sh (and the common.sh it sources) reads
export ALGO RUN_DIR RUN_NAME STEPS TEST_FREQ SAVE_FREQ TRAIN_BATCH_SIZE PPO_MINI_BATCH_SIZE GROUP_SIZE \
  MICRO_BATCH_PER_GPU LOG_PROB_MICRO_BATCH_PER_GPU ACTOR_LR MAX_PROMPT_LENGTH MAX_RESPONSE_LENGTH ASYNC
export TOTAL_STEPS="$STEPS" TOTAL_EPOCHS="${TOTAL_EPOCHS:-100}" NNODES=1 N_GPUS_PER_NODE=1 MODEL="$RUN_DIR/model"
export ACTOR_WARMUP_RATIO="${ACTOR_WARMUP_RATIO:-0}" CRITIC_LR="${CRITIC_LR:-1e-3}" CRITIC_WARMUP_RATIO="${CRITIC_WARMUP_RATIO:-0}"
export PROJECT="${PROJECT:-sorl-quickstart-math}"
export TRAIN_FILES="$RUN_DIR/task/train.parquet" VAL_FILES="$RUN_DIR/task/val.parquet"

sorl_qs_begin
echo "== [1-2/4] task, tiny model, SFT warm start -> $RUN_DIR" >&2
OMP_NUM_THREADS="$PREPARE_THREADS" sorl_qs_wait "$PYTHON" -m sorl_verl.quickstart prepare "$RUN_DIR" --task math --seed "$PREPARE_SEED" \
  --max-ops "$MAX_OPS" --early-answer-fraction "$DEMO_MIX" ${PREPARE_ARGS:-} >"$RUN_DIR/prepare.log"

read -r -a CPU_OVERRIDES <<<"$("$PYTHON" -m sorl_verl.platform.cpu_overrides 1)"
sorl_qs_seed_overrides
sorl_qs_sampler_overrides

echo "== [3/4] verl trainer (examples/math/train.sh): $ALGO, ASYNC=$ASYNC, $STEPS steps (log: $RUN_DIR/train.log)" >&2
sorl_qs_train_and_report bash "$REPO/examples/math/train.sh" \
  "${CPU_OVERRIDES[@]}" \
  `# the recipe packs micro-batches by tokens for long responses; here one micro-batch holds a mini-batch` \
  "actor_rollout_ref.actor.use_dynamic_bsz=False" \
  `# no reference model on CPU: KL terms off (the demo is short; the SFT policy is the anchor)` \
  "actor_rollout_ref.actor.use_kl_loss=False" \
  "algorithm.use_kl_in_reward=False" \
  "actor_rollout_ref.actor.entropy_coeff=0" \
  "trainer.resume_mode=auto" \
  "trainer.log_val_generations=0" \
  "${SORL_QS_SEED_OVERRIDES[@]}" \
  "${SORL_QS_SAMPLER_OVERRIDES[@]}" \
  "${SORL_QS_REST[@]}"
