"""Progress bars: unchanged on a terminal, a few whole lines where the output is a log."""

import io

from tqdm.auto import tqdm as auto_tqdm

from sorl_verl.progress import LOG_SECONDS, progress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _lines(text: str) -> list[str]:
    # a log viewer shows a carriage return as a new line too
    return [line for line in text.replace("\r", "\n").split("\n") if line.strip()]


def test_a_log_gets_a_line_every_few_percent_not_one_per_update():
    log = io.StringIO()
    bar = progress(range(1000), desc="sft warm start", file=log)
    for step in bar:
        bar.set_postfix(loss=f"{1.0 / (step + 1):.3f}")  # forced a redraw per step before
    bar.close()
    lines = _lines(log.getvalue())
    assert 10 <= len(lines) <= 25, lines
    assert "\r" not in log.getvalue() and log.getvalue().endswith("\n")  # whole lines
    assert lines[-1].startswith("sft warm start: 100%") and "1000/1000" in lines[-1]
    assert "loss=0.001" in lines[-1]  # the postfix still shows, on the next scheduled line


def test_manual_updates_of_a_known_total():
    log = io.StringIO()
    with progress(total=10_000, desc="index", unit="B", file=log) as bar:
        for _ in range(1000):
            bar.update(10)
    assert len(_lines(log.getvalue())) <= 25


def test_unknown_total_prints_on_time_not_on_count():
    log = io.StringIO()
    for _ in progress((i for i in range(1000)), desc="read", file=log):
        pass
    # 1000 fast updates, far under LOG_SECONDS: the first line and the last one
    assert LOG_SECONDS >= 10 and len(_lines(log.getvalue())) <= 3


def test_a_terminal_keeps_tqdm_as_it_is():
    terminal = _Terminal()
    bar = progress(range(5), file=terminal)
    assert isinstance(bar, auto_tqdm) and bar.miniters == 0  # tqdm's own dynamic schedule
    for _ in bar:
        pass
    assert "\r" in terminal.getvalue()  # redrawn in place
