#!/usr/bin/env bash
# The CPU quick start (`make demo`): verl's real trainer, the search_r1 agent loop, a tiny model.
#
#   [TASK=search|multihop|medical] bash examples/quickstart/run_demo.sh [ALGO] [--out RUN_DIR] [hydra overrides...]
#
# ALGO: so_grpo (default) or any ALGO of the recipes (sorl_verl/recipes.py: ppo grpo turn_ppo s_ppo st_ppo
# so_ppo st_ppo_turn_gae gspo cispo).
# TASK: a task of sorl_verl/quickstart/tasks played through the search_r1 loop (default search; math has
# its own launcher, run_math_demo.sh); the task sets the defaults of the loop's variables below.
# 1. embedded task: made-up facts added to the shipped Wikipedia corpus, BM25 index, parquet rows
# 2. tiny Qwen2 + local BPE tokenizer, warm-started by SFT on Search-R1 demonstrations, a share
#    DEMO_MIX of which answer at once with a wrong guess instead of searching (docs/quickstart.md)
# 3. python -m verl.trainer.main_ppo on CPU: validation, STEPS training steps, validation
# 4. run folder: config, metrics-*.jsonl, checkpoints/, plots/curves.png, summary table
#
# Resume: give the same --out again; steps 1-2 are skipped (prepare refuses if its settings
# changed) and verl resumes from the latest checkpoint in RUN_DIR/checkpoints
# (trainer.resume_mode=auto). Raise STEPS to train further.
# Exit: on any exit the shell sees (end, error, Ctrl-C, SIGTERM, SIGHUP) the trainer and the
# launch's Ray processes are stopped; after a SIGKILL run
#   python -m sorl_verl.quickstart cleanup RUN_DIR
# (a resume does it by itself first).
# Settings are environment variables (below); common.sh documents the shared ones.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
STARTED_AT="$(date +%s)"
# shellcheck source=launcher.sh
source "$REPO/examples/quickstart/launcher.sh"
sorl_qs_args "$@"
TASK="${TASK:-search}"
# run folders of the default task keep their short name (runs/<algo>-<time>)
if [[ "$TASK" == search ]]; then sorl_qs_run_dir "$ALGO"; else sorl_qs_run_dir "$TASK-$ALGO"; fi
export ALGO TASK
# the task's values of the variables it shapes (MAX_TURNS, TOPK, MAX_OBS_LENGTH, MAX_TOKENS_PER_TURN,
# MAX_PROMPT_LENGTH, MAX_RESPONSE_LENGTH, DEMO_MIX), each unless set in the environment; an unknown TASK
# exits 2 naming the tasks
TASK_DEFAULTS="$("$PYTHON" -m sorl_verl.quickstart defaults "$TASK")" || exit 2
TASK_LAUNCHER="$("$PYTHON" -m sorl_verl.quickstart launcher "$TASK")"
if [[ "$(basename "$TASK_LAUNCHER")" != run_demo.sh ]]; then
  echo "error: TASK=$TASK has its own launcher: bash $TASK_LAUNCHER (or make demo TASK=$TASK)" >&2
  exit 2
fi
eval "$TASK_DEFAULTS"

# ---- the demo's scale (ours: what fits ~15 minutes on 2 CPU cores)
STEPS="${STEPS:-20}"
TOTAL_STEPS="$STEPS"
TOTAL_EPOCHS="${TOTAL_EPOCHS:-100}"
SAVE_FREQ="${SAVE_FREQ:-10}"
TEST_FREQ="${TEST_FREQ:-5}"
NNODES=1
N_GPUS_PER_NODE=1
MODEL="$RUN_DIR/model"
# 64 trajectories per step in every variant: 8 prompts x GROUP_SIZE samples for the critic-free
# (GRPO) family, 64 prompts x 1 sample for the critic family (common.sh sets rollout.n=1 there);
# two mini-batches per step: the second one is off-policy, so clipping (what SORL acts on) can happen.
# The family is the ALGO's in the recipes' table (sorl_verl/recipes.py); an unknown ALGO exits 2 naming them.
ALGO_FAMILY="$("$PYTHON" -m sorl_verl.recipes family "$ALGO")" || exit 2
if [[ "$ALGO_FAMILY" == group ]]; then
  TRAIN_BATCH_SIZE="${TRAIN_BATCH_SIZE:-8}" PPO_MINI_BATCH_SIZE="${PPO_MINI_BATCH_SIZE:-4}"
else
  TRAIN_BATCH_SIZE="${TRAIN_BATCH_SIZE:-64}" PPO_MINI_BATCH_SIZE="${PPO_MINI_BATCH_SIZE:-32}"
fi
# One micro-batch per mini-batch and one log-prob pass per step: on CPU each extra micro-batch
# is mostly fixed overhead (the model is 0.54M parameters; the batch fits many times over).
MICRO_BATCH_PER_GPU="${MICRO_BATCH_PER_GPU:-32}"
LOG_PROB_MICRO_BATCH_PER_GPU="${LOG_PROB_MICRO_BATCH_PER_GPU:-64}"
GROUP_SIZE="${GROUP_SIZE:-8}"
ACTOR_LR="${ACTOR_LR:-1e-4}"
CRITIC_LR="${CRITIC_LR:-1e-3}"
ACTOR_WARMUP_RATIO="${ACTOR_WARMUP_RATIO:-0}"
CRITIC_WARMUP_RATIO="${CRITIC_WARMUP_RATIO:-0}"
# search_r1 loop (MAX_TURNS, TOPK, MAX_OBS_LENGTH, MAX_TOKENS_PER_TURN): the task's defaults above;
# TOPK and MAX_OBS_LENGTH also shape the SFT demonstrations. MAX_PROMPT_LENGTH / MAX_RESPONSE_LENGTH:
# verl pads every row to prompt + response length, so these bounds are the cost of every log-prob and
# update pass; each task's are its longest prompt and a bit more than its longest demonstration (search:
# prompts of 88 tokens, a searching trajectory of ~70 response tokens, 96 + 160 leaving room for two
# searches; multihop: 72 + up to 192 tokens for three hops; medical: 99 + up to 132).
# SEED seeds everything random in a run: the task and the SFT warm start (prepare --seed; PREPARE_SEED
# overrides it for the warm start alone, e.g. to reuse one warm start across RL seeds), verl's
# data shuffle (data.seed; verl's default null shuffles unseeded), the actor/critic engines and
# data loaders, and the rollout's sampling generator (rollout.seed).
SEED="${SEED:-1}"
PREPARE_SEED="${PREPARE_SEED:-$SEED}"
# The demonstration mix (DEMO_MIX, the task's default above): the share of the SFT demonstrations'
# choices that stop early (search: answer at once with a wrong guess, the entity's name; multihop:
# answer after the first hop; medical: a wrong letter at once); RL then has to teach *when to search*. The
# warm start learns the choice as a coin of about that weight whatever the question (measured:
# log-odds spread 0.06-0.27 over questions, a seed's offset up to 0.18), so at 0.7 greedy
# validation guesses everywhere while sampled rollouts still search about a quarter of the time.
# At 0.5 greedy validation searched on all, some or none of the questions depending on the seed.
# At least half of the demonstrations search whatever the mix (they teach copying; 1000 SFT steps
# learn it, 600 did not reliably); above 0.5 some carry no loss on <search>
# (task.plan_demonstrations). 0 = every demonstration searches. docs/quickstart.md has the runs.
# torch threads of the SFT warm start: with 2 threads on a busy 2-core machine SFT slowed from
# ~0.4 to 1.5-3.5 s per step (measured); one thread also makes the warm start the same whatever the
# machine's core count (a sum's order depends on the threads). The documented seeds' warm starts
# were made with one thread (docs/quickstart.md).
PREPARE_THREADS="${PREPARE_THREADS:-1}"
# verl's replay buffer polls for finished rollouts every 2 s, so a ~1 s rollout cost 4 s per step
# and per validation; the quick start's sampler (sorl_verl/quickstart/sampler.py) is verl's own
# with this poll interval. Empty: verl's built-in sampler (needed for DAPO's filter_groups).
POLL_INTERVAL="${POLL_INTERVAL-0.1}"
# the in-process BM25 index of the task (the loop's `retriever` accepts an index folder)
RETRIEVER_URL="$RUN_DIR/task/index"
PROJECT="${PROJECT:-sorl-quickstart}"

# The PPO ratio's old policy: "rollout" takes the log-probs the rollout sampled with (verl's
# algorithm.rollout_correction.bypass_mode=True) instead of recomputing them in an actor pass after
# the rollout. The synchronous trainer samples with the current weights, so they are the same numbers
# (measured: at most 1.4e-6 apart, fp32 on both sides) and each step saves that pass (0.6 of 3.5 s;
# docs/quickstart.md). "recompute": verl's default, what the stability sweep uses except for its
# stale-rollout pressures. (v1 trainer only, as here: verl's legacy trainer would swap the policy
# loss for its own bypass loss.)
OLD_LOG_PROBS="${OLD_LOG_PROBS:-rollout}"

# shellcheck source=../common.sh
source "$REPO/examples/common.sh"

case "$OLD_LOG_PROBS" in
  rollout) OLD_LOG_PROB_OVERRIDES=("algorithm.rollout_correction.bypass_mode=True") ;;
  recompute) OLD_LOG_PROB_OVERRIDES=() ;;
  *) sorl_die "OLD_LOG_PROBS must be rollout or recompute, got '$OLD_LOG_PROBS'" ;;
esac

sorl_qs_begin
echo "== [1-2/4] task, index, tiny model, SFT warm start -> $RUN_DIR" >&2
OMP_NUM_THREADS="$PREPARE_THREADS" sorl_qs_wait "$PYTHON" -m sorl_verl.quickstart prepare "$RUN_DIR" --task "$TASK" --seed "$PREPARE_SEED" \
  --topk "$TOPK" --max-obs-length "$MAX_OBS_LENGTH" --demo-mix "$DEMO_MIX" ${PREPARE_ARGS:-} >"$RUN_DIR/prepare.log"

sorl_write_agent_config "$RUN_DIR/search_r1_agent.yaml"
read -r -a CPU_OVERRIDES <<<"$("$PYTHON" -m sorl_verl.platform.cpu_overrides 1)"
sorl_qs_seed_overrides
sorl_qs_sampler_overrides

echo "== [3/4] verl trainer: $TASK, $ALGO, $STEPS steps (log: $RUN_DIR/train.log)" >&2
sorl_qs_train_and_report sorl_launch \
  "data.train_files=$RUN_DIR/task/train.parquet" \
  "data.val_files=$RUN_DIR/task/val.parquet" \
  "actor_rollout_ref.rollout.agent.default_agent_loop=search_r1" \
  "actor_rollout_ref.rollout.agent.agent_loop_config_path=$RUN_DIR/search_r1_agent.yaml" \
  "${CPU_OVERRIDES[@]}" \
  `# no reference model on CPU: KL terms off (the demo is short; the SFT policy is the anchor)` \
  "actor_rollout_ref.actor.use_kl_loss=False" \
  "algorithm.use_kl_in_reward=False" \
  "actor_rollout_ref.actor.entropy_coeff=0" \
  "trainer.resume_mode=auto" \
  "trainer.log_val_generations=0" \
  "${SORL_QS_SEED_OVERRIDES[@]}" \
  "${SORL_QS_SAMPLER_OVERRIDES[@]}" \
  "${OLD_LOG_PROB_OVERRIDES[@]}" \
  -- "${SORL_QS_REST[@]}"
