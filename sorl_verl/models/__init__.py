"""Model builders for tests and the quick start (no downloads)."""

from sorl_verl.models.tiny import build_tiny_model

__all__ = ["build_tiny_model"]
