"""Suite-wide settings.

``make test`` runs the suite on two pytest-xdist workers, a test file at a time
(``-n 2 --dist loadfile``: a file's module fixtures, e.g. a warm-started model, are built once).
The files with end-to-end runs (marker ``e2e``, minutes each) go first, so that the long runs
start early and the short tests fill in around them instead of one long run finishing last.
That order reaches the workers only with ``--no-loadscope-reorder``: by default xdist reorders the
files by their number of tests, which puts the few-test e2e files last and on one worker.
"""


def pytest_collection_modifyitems(config, items):
    # stable: within each class the collection order is kept
    items.sort(key=lambda item: item.get_closest_marker("e2e") is None)
