"""The verl versions whose internals sorl_verl's few patches were written against.

Every patch of verl's internals (the cpu platform's shims and its ``trainer.device=cpu``
selection, the batch-level correction's engine hook) asks :func:`verl_patchable` first: those
internals may change in any minor release, so on another one a patch is refused (with a message
saying so) rather than applied to code it was not written for. Registrations through verl's
public calls need no check.
"""

from __future__ import annotations

from packaging.specifiers import SpecifierSet

__all__ = ["PATCHABLE_VERL", "TESTED_VERL", "installed_verl", "verl_patchable"]

TESTED_VERL = "0.9.1"
PATCHABLE_VERL = SpecifierSet("~=0.9.1")  # 0.9.x from 0.9.1, the range setup.py accepts


def installed_verl() -> str:
    """The installed verl's version string."""
    import verl

    return verl.__version__


def verl_patchable(version: str | None = None) -> bool:
    """Whether ``version`` (default: the installed verl) is one our patches were written for."""
    return PATCHABLE_VERL.contains(installed_verl() if version is None else version)
