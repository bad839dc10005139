"""Shared test fixtures.

Tests that need real data read it from ../shared/data (next to the checkout) or from $NLQ_SHARED_DATA.
When it is missing they fail, not skip: a skipped data test is a test that did not run.
"""
import os
import sys
from pathlib import Path

import pytest

# The test models are tiny: one thread per process is faster than several and keeps torchrun's two
# processes from oversubscribing a 2-core machine. Set before torch is imported by the test modules.
os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # import model, train, prepare_data as top-level modules

SHARED_DATA = Path(os.environ.get("NLQ_SHARED_DATA", ROOT.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """Path to the real test data (Tiny Shakespeare, enwiki2015, GPT-2 BPE files); fails if absent."""
    if not (SHARED_DATA / "PROVENANCE.md").is_file():
        pytest.fail(f"real test data not found at {SHARED_DATA}; put shared/data next to the checkout "
                    f"or set NLQ_SHARED_DATA=/path/to/shared/data")
    return SHARED_DATA
