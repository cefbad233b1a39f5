from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"


@pytest.fixture
def fixtures() -> Path:
    return FIXTURES


@pytest.fixture
def shared_data() -> Path:
    """The full public data sets (``../shared/data``), or a skip when this checkout has none."""
    if not (SHARED / "nq_open").is_dir() or not (SHARED / "mirage").is_dir():
        pytest.skip(f"full data not present at {SHARED}")
    return SHARED
