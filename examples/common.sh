# Shared settings of the paper recipes (examples/{search_r1,medical,math}/train.sh). Sourced, not run.
#
# Every knob is an environment variable with a default; a recipe sets its task's defaults
# before sourcing this file and adds its task's overrides. Extra Hydra overrides given to a
# recipe on its command line go last and win, e.g.
#   ALGO=so_grpo MODEL=Qwen/Qwen2.5-7B-Instruct bash examples/search_r1/train.sh trainer.total_training_steps=200
#
# Values marked "Search-R1" are from Search-R1's train_ppo.sh / train_grpo.sh (the paper builds
# on its setup); values marked "ours" are our choice where the paper gives none.
#
# SORL_DRY_RUN=1 prints the command (one argument per line, after a line "ENV NAME=value" per
# exported variable) instead of running it and skips the checks for data, models and the
# retriever: tests/examples uses it to check every override against verl's config.

set -euo pipefail

SORL_REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
SORL_DRY_RUN="${SORL_DRY_RUN:-0}"

# ---- hardware: the paper's scale is one node of 8 x 80 GB GPUs (H100/A100) per run (ours: Search-R1 used 8 H100s).
NNODES="${NNODES:-1}"
N_GPUS_PER_NODE="${N_GPUS_PER_NODE:-8}"
# vLLM tensor parallelism per rollout replica: 1 fits 3B and 7B on 80 GB (Search-R1: 1).
ROLLOUT_TP="${ROLLOUT_TP:-1}"
# Fraction of GPU memory vLLM may take while the trainer sleeps (Search-R1: 0.6).
ROLLOUT_GPU_MEM="${ROLLOUT_GPU_MEM:-0.6}"
# FSDP CPU offload of params and optimizer state: only needed for 7B on 40 GB cards (Search-R1 offloaded; ours: off on 80 GB).
FSDP_OFFLOAD="${FSDP_OFFLOAD:-False}"

# ---- model and algorithm
MODEL="${MODEL:-Qwen/Qwen2.5-3B}"
# One of: ppo grpo turn_ppo s_ppo st_ppo so_ppo st_ppo_turn_gae so_grpo gspo cispo
# (`python -m sorl_verl.recipes`: the table in sorl_verl/recipes.py says what each one sets).
ALGO="${ALGO:-st_ppo}"
# Clipping-bias correction mode for the SORL losses (relative|absolute|none; docs/algorithms.md).
# Empty: each loss name's paper default (sorl_verl.recipes.LOSS_DEFAULTS). For ablations.
SORL_NORMALIZATION="${SORL_NORMALIZATION:-}"
# GSPO's clip range (ALGO=gspo). Empty: the GSPO paper's 3e-4 / 4e-4.
GSPO_CLIP_LOW="${GSPO_CLIP_LOW:-}"
GSPO_CLIP_HIGH="${GSPO_CLIP_HIGH:-}"

# ---- optimisation (Search-R1 values unless marked)
ACTOR_LR="${ACTOR_LR:-1e-6}"
CRITIC_LR="${CRITIC_LR:-1e-5}"
# Search-R1 warms the actor lr up over 28.5% of training and the critic over 1.5%.
ACTOR_WARMUP_RATIO="${ACTOR_WARMUP_RATIO:-0.285}"
CRITIC_WARMUP_RATIO="${CRITIC_WARMUP_RATIO:-0.015}"
TRAIN_BATCH_SIZE="${TRAIN_BATCH_SIZE:-512}"
PPO_MINI_BATCH_SIZE="${PPO_MINI_BATCH_SIZE:-256}"
# Search-R1's global micro batch of 64 over 8 GPUs; 16 per GPU for log-prob passes (128 / 8).
MICRO_BATCH_PER_GPU="${MICRO_BATCH_PER_GPU:-8}"
LOG_PROB_MICRO_BATCH_PER_GPU="${LOG_PROB_MICRO_BATCH_PER_GPU:-16}"
CLIP_RATIO="${CLIP_RATIO:-0.2}"
# KL to the reference policy: in the reward for the PPO family, as a loss for the GRPO family (Search-R1: 0.001 both).
KL_COEF="${KL_COEF:-0.001}"
# Samples per prompt for the critic-free (GRPO) family (Search-R1: 5).
GROUP_SIZE="${GROUP_SIZE:-5}"
GAMMA="${GAMMA:-1.0}"
LAM="${LAM:-1.0}"

# ---- schedule (Search-R1: 1005 steps, checkpoint every 100, validate every 50)
TOTAL_STEPS="${TOTAL_STEPS:-1005}"
TOTAL_EPOCHS="${TOTAL_EPOCHS:-15}"
SAVE_FREQ="${SAVE_FREQ:-100}"
TEST_FREQ="${TEST_FREQ:-50}"

# ---- run folder: what `python -m sorl_verl.tables` reads (metrics*.jsonl + .hydra/config.yaml)
PROJECT="${PROJECT:-sorl-verl}"
RUN_ROOT="${RUN_ROOT:-$SORL_REPO/runs}"
# "console,file" always; add wandb with LOGGERS='[console,file,wandb]'.
LOGGERS="${LOGGERS:-[console,file]}"

# ---- reward: the router picks qa_em / mcqa / math by data_source (reward_fns/__init__.py).
REWARD_FN="${REWARD_FN:-$SORL_REPO/reward_fns/__init__.py}"

# ---- Search-R1 agent loop (sorl_verl/agent/search_r1_loop.py; Search-R1 values)
RETRIEVER_URL="${RETRIEVER_URL:-http://127.0.0.1:8000/retrieve}"
MAX_TURNS="${MAX_TURNS:-4}"
TOPK="${TOPK:-3}"
MAX_TOKENS_PER_TURN="${MAX_TOKENS_PER_TURN:-500}"
MAX_OBS_LENGTH="${MAX_OBS_LENGTH:-500}"
# Prompt budget (Search-R1's max_start_length).
MAX_PROMPT_LENGTH="${MAX_PROMPT_LENGTH:-2048}"
# verl's response_length bounds a whole trajectory (model and observation tokens). Ours: room
# for every turn at its cap plus every observation, +16 tokens per observation for the tags.
MAX_RESPONSE_LENGTH="${MAX_RESPONSE_LENGTH:-$(((MAX_TURNS + 1) * MAX_TOKENS_PER_TURN + MAX_TURNS * (MAX_OBS_LENGTH + 16)))}"

sorl_die() {
  echo "error: $*" >&2
  exit 1
}

# Fills ALGO_OVERRIDES for ALGO=$1 from the table of the algorithms, sorl_verl/recipes.py (loss, advantage
# estimator, critic or group sampling, each algorithm's own overrides), with this shell's values of the
# variables the overrides hold. The repository goes first on the module path: the table of this
# checkout, whatever PYTHON has installed (the module needs the standard library only).
sorl_algo_overrides() {
  local out
  out="$(PYTHONPATH="$SORL_REPO${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m sorl_verl.recipes overrides "$1" \
    --set "MODEL=$MODEL" --set "CRITIC_LR=$CRITIC_LR" --set "CRITIC_WARMUP_RATIO=$CRITIC_WARMUP_RATIO" \
    --set "MICRO_BATCH_PER_GPU=$MICRO_BATCH_PER_GPU" --set "FSDP_OFFLOAD=$FSDP_OFFLOAD" --set "KL_COEF=$KL_COEF" \
    --set "GROUP_SIZE=$GROUP_SIZE" --set "SORL_NORMALIZATION=$SORL_NORMALIZATION" \
    --set "GSPO_CLIP_LOW=$GSPO_CLIP_LOW" --set "GSPO_CLIP_HIGH=$GSPO_CLIP_HIGH")" || exit "$?"
  mapfile -t ALGO_OVERRIDES <<<"$out"
}

# Writes the search_r1 agent-loop config for this run (verl's agent_loop_config_path format:
# a list of {name, _target_, constructor kwargs}). Kept in the run folder, so the run records it.
sorl_write_agent_config() {
  local path="$1"
  mkdir -p "$(dirname "$path")"
  cat >"$path.tmp" <<EOF
# Written by examples/common.sh for this run; options of sorl_verl.agent.search_r1_loop.SearchR1AgentLoop.
- name: search_r1
  _target_: sorl_verl.agent.search_r1_loop.SearchR1AgentLoop
  retriever: "$RETRIEVER_URL"
  topk: $TOPK
  max_turns: $MAX_TURNS
  max_obs_length: $MAX_OBS_LENGTH
  max_tokens_per_turn: $MAX_TOKENS_PER_TURN
EOF
  mv "$path.tmp" "$path"
}

sorl_require_file() {
  ((SORL_DRY_RUN)) && return 0
  [[ -e "$1" ]] || sorl_die "$2 not found: $1${3:+ ($3)}"
}

sorl_check_retriever() {
  ((SORL_DRY_RUN)) && return 0
  local health="${RETRIEVER_URL%/retrieve}/health"
  "$PYTHON" - "$health" <<'EOF' || sorl_die "retriever not reachable at $health: start it with examples/search_r1/retriever.sh"
import sys, urllib.request
urllib.request.urlopen(sys.argv[1], timeout=10).read()
EOF
}

# Runs a command, or under SORL_DRY_RUN=1 prints it: a line "--- cmd", then one argument per line.
sorl_run() {
  if ((SORL_DRY_RUN)); then
    echo "--- cmd"
    printf '%s\n' "$@"
    return 0
  fi
  "$@"
}

# sorl_launch TASK_OVERRIDE... -- USER_OVERRIDE...
# Runs verl's trainer with the shared settings, then the task's overrides, then the user's
# (last wins). Needs RUN_NAME and RUN_DIR, set by the recipe.
sorl_launch() {
  local -a task_overrides=()
  while (($#)) && [[ "$1" != "--" ]]; do
    task_overrides+=("$1")
    shift
  done
  (($#)) && shift

  sorl_algo_overrides "$ALGO"
  mkdir -p "$RUN_DIR"
  RUN_DIR="$(cd "$RUN_DIR" && pwd)" # absolute: Ray workers and Hydra run elsewhere
  # verl's FileLogger truncates its file on open: one file per launch keeps a resumed run's history.
  local metrics="$RUN_DIR/metrics-$(date +%Y%m%d-%H%M%S).jsonl"
  export VERL_FILE_LOGGER_PATH="$metrics"
  ((SORL_DRY_RUN)) && echo "ENV VERL_FILE_LOGGER_PATH=$VERL_FILE_LOGGER_PATH"
  ((SORL_DRY_RUN)) || echo "run folder: $RUN_DIR" >&2

  sorl_run "$PYTHON" -m verl.trainer.main_ppo \
    `# Hydra writes the composed config to RUN_DIR/.hydra/config.yaml: the table tool reads it.` \
    "hydra.run.dir=$RUN_DIR" \
    "actor_rollout_ref.model.path=$MODEL" \
    "actor_rollout_ref.model.use_remove_padding=True" \
    "actor_rollout_ref.model.enable_gradient_checkpointing=True" \
    "actor_rollout_ref.actor.optim.lr=$ACTOR_LR" \
    "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=$ACTOR_WARMUP_RATIO" \
    "actor_rollout_ref.actor.ppo_mini_batch_size=$PPO_MINI_BATCH_SIZE" \
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=$MICRO_BATCH_PER_GPU" \
    "actor_rollout_ref.actor.clip_ratio_low=$CLIP_RATIO" \
    "actor_rollout_ref.actor.clip_ratio_high=$CLIP_RATIO" \
    "actor_rollout_ref.actor.loss_agg_mode=token-mean" \
    "actor_rollout_ref.actor.fsdp_config.param_offload=$FSDP_OFFLOAD" \
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=$FSDP_OFFLOAD" \
    "actor_rollout_ref.ref.fsdp_config.param_offload=$FSDP_OFFLOAD" \
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=$LOG_PROB_MICRO_BATCH_PER_GPU" \
    `# vLLM in server mode: verl's agent loops (search_r1 included) talk to it asynchronously.` \
    "actor_rollout_ref.rollout.name=vllm" \
    "actor_rollout_ref.rollout.mode=async" \
    "actor_rollout_ref.rollout.tensor_model_parallel_size=$ROLLOUT_TP" \
    "actor_rollout_ref.rollout.gpu_memory_utilization=$ROLLOUT_GPU_MEM" \
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=$LOG_PROB_MICRO_BATCH_PER_GPU" \
    "actor_rollout_ref.rollout.temperature=1.0" \
    "actor_rollout_ref.rollout.top_p=1.0" \
    `# Greedy validation, one sample per prompt (Search-R1 reports greedy exact match).` \
    "actor_rollout_ref.rollout.val_kwargs.do_sample=False" \
    "actor_rollout_ref.rollout.val_kwargs.n=1" \
    "data.train_batch_size=$TRAIN_BATCH_SIZE" \
    "data.max_prompt_length=$MAX_PROMPT_LENGTH" \
    "data.max_response_length=$MAX_RESPONSE_LENGTH" \
    "data.filter_overlong_prompts=True" \
    "algorithm.gamma=$GAMMA" \
    "algorithm.lam=$LAM" \
    "reward.custom_reward_function.path=$REWARD_FN" \
    "reward.custom_reward_function.name=compute_score" \
    "trainer.project_name=$PROJECT" \
    "trainer.experiment_name=$RUN_NAME" \
    "trainer.logger=$LOGGERS" \
    "trainer.nnodes=$NNODES" \
    "trainer.n_gpus_per_node=$N_GPUS_PER_NODE" \
    "trainer.total_training_steps=$TOTAL_STEPS" \
    "trainer.total_epochs=$TOTAL_EPOCHS" \
    "trainer.save_freq=$SAVE_FREQ" \
    "trainer.test_freq=$TEST_FREQ" \
    "trainer.val_before_train=True" \
    "trainer.default_local_dir=$RUN_DIR/checkpoints" \
    `# Ray workers on other nodes do not inherit this shell's environment: pass the log path explicitly.` \
    "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH=$metrics" \
    "${ALGO_OVERRIDES[@]}" \
    "${task_overrides[@]}" \
    "$@"
}
