# The CPU quick starts' launcher steps, as functions. Sourced (it sets nothing by itself), first
# thing, by examples/quickstart/run_demo.sh and run_math_demo.sh.
#
# Order of use:
#   sorl_qs_args "$@"          ALGO, OUT, SORL_QS_REST (the Hydra overrides)
#   sorl_qs_run_dir PREFIX     PYTHON, RUN_DIR, RUN_NAME
#   ... the launcher's settings ...
#   sorl_qs_begin              cleanup of a killed launch, private Ray temp dir, exit traps
#   sorl_qs_wait CMD...        a long step that a signal can interrupt
#   sorl_qs_seed_overrides     SORL_QS_SEED_OVERRIDES from SEED
#   sorl_qs_sampler_overrides  SORL_QS_SAMPLER_OVERRIDES from POLL_INTERVAL
#   sorl_qs_train_and_report CMD...

# sorl_qs_args [ALGO] [--out RUN_DIR] [overrides...]: ALGO (default so_grpo), OUT ("" = a new
# folder), SORL_QS_REST (the rest: Hydra overrides for the trainer).
sorl_qs_args() {
  ALGO=so_grpo
  if (($#)) && [[ "$1" != --out ]]; then
    ALGO="$1"
    shift
  fi
  OUT=""
  if [[ "${1:-}" == "--out" ]]; then
    [[ -n "${2:-}" ]] || { echo "error: --out needs a folder" >&2; exit 1; }
    OUT="$2"
    shift 2
  fi
  SORL_QS_REST=("$@")
}

# sorl_qs_run_dir PREFIX: PYTHON (the repository's .venv if there is one, unless set), RUN_DIR
# (OUT, or runs/PREFIX-<time>; made absolute), RUN_NAME; the environment every launch needs.
sorl_qs_run_dir() {
  local repo
  repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
  if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$repo/.venv/bin/python" ]]; then PYTHON="$repo/.venv/bin/python"; else PYTHON=python3; fi
  fi
  RUN_DIR="${OUT:-$repo/runs/$1-$(date +%Y%m%d-%H%M%S)}"
  mkdir -p "$RUN_DIR"
  RUN_DIR="$(cd "$RUN_DIR" && pwd)"
  RUN_NAME="$(basename "$RUN_DIR")"
  export PYTHON RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}" TOKENIZERS_PARALLELISM=false
}

# sorl_qs_begin: the launch of a quick start into RUN_DIR (STARTED_AT: epoch seconds). Stops what a
# launch killed with SIGKILL left (no exit trap ran), gives this launch a private Ray temp dir
# (RAY_TMPDIR, inherited by every process of the launch: how the cleanup finds them; Ray picks
# free ports), records it in RUN_DIR/launch.json, and installs the exit traps: on any exit the
# shell sees (end, error, Ctrl-C, SIGTERM, SIGHUP) `python -m sorl_verl.quickstart cleanup`
# stops the launch's processes, removes the temp dir and appends the launch to launches.jsonl.
sorl_qs_begin() {
  if [[ -f "$RUN_DIR/launch.json" ]]; then
    "$PYTHON" -m sorl_verl.quickstart cleanup "$RUN_DIR" >&2
  fi
  unset RAY_ADDRESS
  RAY_TMPDIR="$(mktemp -d /tmp/ray_qs.XXXXXX)"
  export RAY_TMPDIR
  local -a stat
  read -r -a stat </proc/$$/stat # field 22: start time, so a recycled pid is not taken for this launcher
  printf '{"started_at": %s, "launcher_pid": %s, "launcher_start": %s, "ray_tmpdir": "%s"}\n' \
    "$STARTED_AT" "$$" "${stat[21]}" "$RAY_TMPDIR" >"$RUN_DIR/launch.json.tmp"
  mv "$RUN_DIR/launch.json.tmp" "$RUN_DIR/launch.json"
  trap sorl_qs_on_exit EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  trap 'exit 129' HUP
}

sorl_qs_on_exit() {
  local rc=$?
  trap - EXIT INT TERM HUP
  "$PYTHON" -m sorl_verl.quickstart cleanup "$RUN_DIR" --from-launcher >/dev/null || rm -rf "$RAY_TMPDIR"
  exit "$rc"
}

# sorl_qs_wait CMD...: runs CMD in the background and waits: a trapped signal interrupts `wait` at
# once, while bash would delay the trap until a foreground command ends by itself.
sorl_qs_wait() {
  "$@" &
  wait $!
}

# sorl_qs_seed_overrides: the trainer overrides that seed everything random in a run from SEED
# (verl's data shuffle, whose default null shuffles unseeded; the actor, reference and critic
# engines and data loaders; the rollout's sampling generator). Sets SORL_QS_SEED_OVERRIDES.
sorl_qs_seed_overrides() {
  SORL_QS_SEED_OVERRIDES=()
  local key
  for key in data.seed actor_rollout_ref.actor.data_loader_seed actor_rollout_ref.actor.fsdp_config.seed \
    actor_rollout_ref.ref.fsdp_config.seed actor_rollout_ref.rollout.seed critic.data_loader_seed critic.fsdp.seed; do
    SORL_QS_SEED_OVERRIDES+=("$key=$SEED")
  done
}

# sorl_qs_sampler_overrides: SORL_QS_SAMPLER_OVERRIDES, the trainer overrides of the quick start's
# sampler (sorl_verl/quickstart/sampler.py: verl's replay buffer polled every POLL_INTERVAL s instead
# of 2 s); none when POLL_INTERVAL is empty (verl's built-in sampler, e.g. for DAPO's filter_groups).
sorl_qs_sampler_overrides() {
  SORL_QS_SAMPLER_OVERRIDES=()
  [[ -n "$POLL_INTERVAL" ]] || return 0
  SORL_QS_SAMPLER_OVERRIDES=(
    "trainer.v1.sampler.custom_sampler.path=pkg://sorl_verl.quickstart.sampler"
    "trainer.v1.sampler.custom_sampler.name=QuickPollSampler"
    "+trainer.v1.sampler.sampler_kwargs.poll_interval=$POLL_INTERVAL"
  )
}

# sorl_qs_train_and_report CMD...: runs the trainer command, its output through the progress filter
# (one line per step on the terminal, everything in RUN_DIR/train.log), then the report
# (`python -m sorl_verl.quickstart report`); exits with the trainer's status if it failed.
sorl_qs_train_and_report() {
  local rc
  set +e
  "$@" 2>&1 | "$PYTHON" -m sorl_verl.quickstart progress "$RUN_DIR/train.log" --started-at "$STARTED_AT" &
  wait $!
  rc=$? # pipefail: the trainer's status unless it succeeded and the filter failed
  set -e
  echo "== [4/4] report" >&2
  "$PYTHON" -m sorl_verl.quickstart report "$RUN_DIR" --algo "$ALGO" --started-at "$STARTED_AT"
  if ((rc != 0)); then
    echo "error: the trainer exited with status $rc; see $RUN_DIR/train.log" >&2
    exit "$rc"
  fi
}
