"""Shared by the reward tests (importlib mode: test modules cannot import each other)."""

import signal
from contextlib import contextmanager

import pytest


@contextmanager
def _hang_guard(seconds):
    """Fails a call that hangs or takes many times its linear cost, not a speed target."""

    def expire(signum, frame):
        raise TimeoutError(f"reward did not return within {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def hang_guard():
    """``with hang_guard(seconds): ...`` raises TimeoutError past ``seconds`` (SIGALRM)."""
    return _hang_guard
