"""Suite-wide settings.

``make test`` runs the suite on two pytest-xdist workers, a test file at a time
(``-n 2 --dist loadfile``: a file's module fixtures, e.g. a warm-started model, are built once).
The end-to-end runs (marker ``e2e``, files under ``tests/e2e/``, a minute or more each) form two
work units that go first, one per worker, and the short tests fill in after them
(:func:`pytest_xdist_make_scheduler`). That order reaches the workers only with
``--no-loadscope-reorder``: by default xdist reorders the units by their number of tests. Each
worker, and what it starts, runs torch on its share of the cores (:func:`pytest_configure`).
"""

import os
import sys


def pytest_configure(config):
    # Under pytest-xdist each worker shares the cores with the others: torch's default of one
    # thread per core in every worker oversubscribes them, and OpenMP's spinning threads then slow
    # each op many times over (docs/results.md, Test suite). One share of the cores per worker, for
    # the worker and the subprocesses it starts (the end-to-end runs' trainers); an explicit
    # OMP_NUM_THREADS wins.
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers and "OMP_NUM_THREADS" not in os.environ:
        threads = max(1, len(os.sched_getaffinity(0)) // workers)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        if "torch" in sys.modules:  # imported before this hook: the variable is read at import
            sys.modules["torch"].set_num_threads(threads)


def pytest_collection_modifyitems(config, items):
    # stable: within each class the collection order is kept
    items.sort(key=lambda item: item.get_closest_marker("e2e") is None)


# The asynchronous runs spend most of their time waiting (a rollout slowed to make partial
# rollouts happen, replay-buffer polls); the other launches are CPU-bound start-ups. Two CPU-bound
# launches side by side on 2 cores each take 2-3x their time alone, so each worker gets one unit:
# the waiting runs beside the CPU-bound ones.
E2E_UNITS = {"tests/e2e/test_async_cpu.py": "tests/e2e (asynchronous)"}


def pytest_xdist_make_scheduler(config, log):
    """Under ``--dist loadfile``, the files of ``tests/e2e/`` form two work units (E2E_UNITS), each
    run in turn on one worker."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class EndToEndUnits(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            if path.startswith("tests/e2e/"):
                return E2E_UNITS.get(path, "tests/e2e")
            return super()._split_scope(nodeid)

    return EndToEndUnits(config, log)
