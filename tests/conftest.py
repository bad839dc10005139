"""Shared test fixtures.

Tests that need real data read it from ../shared/data (next to the checkout) or from $NLQ_SHARED_DATA.
When it is missing they fail, not skip: a skipped data test is a test that did not run.
"""
import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

# The test models are tiny: one thread per process is faster than several and keeps torchrun's two
# processes from oversubscribing a 2-core machine. Set before torch is imported by the test modules.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Hugging Face libraries (tests/test_hf*.py) never reach the network, and keep their caches (datasets, the
# remote-code modules of exported models) in a folder of this session. Set before they are imported.
os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
if "HF_HOME" not in os.environ:
    os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="nlq_tests_hf_home_")
    atexit.register(shutil.rmtree, os.environ["HF_HOME"], ignore_errors=True)

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
