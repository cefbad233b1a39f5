"""The project's one progress bar: tqdm on a terminal, a few whole lines in a log.

tqdm redraws its bar in place with carriage returns, up to ten times a second. Where the output
is not a terminal (CI, ``nohup``, a ``train.log``) every redraw becomes a line of the log: a
thousand SFT steps gave a thousand lines. :func:`progress` keeps tqdm as it is on a terminal or
in a notebook; elsewhere it prints a whole line every :data:`LOG_EVERY` of the total (every
:data:`LOG_SECONDS` when the total is unknown), and ``set_postfix``/``set_description`` wait
for the next of those lines instead of printing one each.
"""

from __future__ import annotations

import math
import sys
from typing import Any

from tqdm.auto import tqdm as auto_tqdm
from tqdm.std import tqdm as std_tqdm

__all__ = ["LOG_EVERY", "LOG_SECONDS", "progress"]

LOG_EVERY = 0.05  # a line every 5% of the total: at most ~22 lines per bar
LOG_SECONDS = 30.0  # a line at most this often when the total is unknown

# tqdm.auto is a notebook widget inside Jupyter, whose output streams are no terminals either
_NOTEBOOK = any(cls.__module__ == "tqdm.notebook" for cls in auto_tqdm.__mro__)


class _Lines:
    """Text stream for a log: each tqdm redraw (``"\\r" + bar``) becomes one line, repeats dropped."""

    def __init__(self, stream) -> None:
        self._stream = stream
        self._last = ""

    def write(self, text: str) -> None:
        line = text.replace("\r", "").rstrip()
        if line and line != self._last:  # blank: tqdm clearing or ending its bar
            self._stream.write(line + "\n")
            self._last = line

    def flush(self) -> None:
        self._stream.flush()


class _LogBar(std_tqdm):
    """tqdm that prints only on its own schedule: postfix and description changes never force a line."""

    def set_postfix(self, ordered_dict=None, refresh=True, **kwargs) -> None:
        super().set_postfix(ordered_dict, refresh=False, **kwargs)

    def set_postfix_str(self, s="", refresh=True) -> None:
        super().set_postfix_str(s, refresh=False)

    def set_description(self, desc=None, refresh=True) -> None:
        super().set_description(desc, refresh=False)

    def set_description_str(self, desc=None, refresh=True) -> None:
        super().set_description_str(desc, refresh=False)


def _is_terminal(stream) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except (OSError, ValueError):  # a closed or detached stream
        return False


def progress(iterable=None, *, total: float | None = None, file=None, **kwargs: Any) -> std_tqdm:
    """A tqdm bar (same arguments) suited to where ``file`` (default ``sys.stderr``) goes.

    On a terminal or in a notebook: ``tqdm.auto.tqdm`` unchanged. Elsewhere: one line per
    :data:`LOG_EVERY` of ``total`` (or of ``len(iterable)``), or one per :data:`LOG_SECONDS`
    when neither is known; ``miniters``/``mininterval`` given by the caller still win.
    """
    stream = sys.stderr if file is None else file
    if _NOTEBOOK or _is_terminal(stream):
        return auto_tqdm(iterable, total=total, file=file, **kwargs)
    if total is None and iterable is not None:
        try:
            total = len(iterable)
        except (TypeError, AttributeError):
            total = None
    if total:  # every LOG_EVERY of the total, however fast it comes
        schedule = {"miniters": max(1, math.ceil(total * LOG_EVERY)), "mininterval": 0.0}
    else:
        schedule = {"miniters": 1, "mininterval": LOG_SECONDS}
    # maxinterval: tqdm's monitor thread would otherwise drop miniters to 1 after 10 s without a line
    settings = {**schedule, "maxinterval": math.inf, **kwargs}
    return _LogBar(iterable, total=total, file=_Lines(stream), **settings)
