"""The quick-start launchers' argument parsing (examples/quickstart/launcher.sh: sorl_qs_args)."""

import subprocess
from pathlib import Path

import pytest

LAUNCHER = Path(__file__).resolve().parents[2] / "examples" / "quickstart" / "launcher.sh"


def _sorl_qs_args(*args: str, then: str = "") -> subprocess.CompletedProcess:
    """``sorl_qs_args ARGS...`` in a bash that sourced the launcher, then the commands ``then``."""
    script = f'source "{LAUNCHER}"; sorl_qs_args "$@"; {then}'
    return subprocess.run(["bash", "-c", script, "sorl_qs_args", *args], capture_output=True, text=True)


def _parse(*args: str) -> list[str]:
    done = _sorl_qs_args(*args, then='printf "%s\\n" "$ALGO" "$OUT" "${SORL_QS_REST[@]}"')
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.mark.parametrize(
    "args, expected",
    [
        ((), ["so_grpo", ""]),
        (("st_ppo",), ["st_ppo", ""]),
        (("st_ppo", "--out", "runs/x", "trainer.a=1"), ["st_ppo", "runs/x", "trainer.a=1"]),
        # the usage is [ALGO] [--out RUN_DIR]: without ALGO, --out is not taken for one
        (("--out", "runs/x"), ["so_grpo", "runs/x"]),
        (("--out", "runs/x", "trainer.a=1", "trainer.b=2"), ["so_grpo", "runs/x", "trainer.a=1", "trainer.b=2"]),
    ],
)
def test_algo_is_optional_before_out(args, expected):
    assert _parse(*args) == expected


@pytest.mark.parametrize("args", [("st_ppo", "--out"), ("--out",)])
def test_out_without_a_folder_is_an_error(args):
    done = _sorl_qs_args(*args)
    assert done.returncode == 1 and "--out needs a folder" in done.stderr
