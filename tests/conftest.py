"""Shared test fixtures.

Tests that need real data read it from tests/data, shipped with the repository (provenance and licences in
tests/data/PROVENANCE.md), so a fresh clone runs the whole suite with no network and nothing outside it.
A missing file fails the tests that need it, naming the file: a skipped data test is a test that did not run.
"""
import atexit
import os
import shutil
import subprocess
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

SHIPPED_DATA = ROOT / "tests" / "data"
OFFICIAL_MODES = ("original", "identity", "residual", "residual_gelu")
# every file in tests/data besides PROVENANCE.md (tests/test_shipped_data.py checks their hashes there)
SHIPPED_FILES = ("tinyshakespeare/input.txt", "gpt2/encoder.json", "gpt2/vocab.bpe", "enwiki2015/AA/wiki_00",
                 "official_ckpt/expected.pt", *(f"official_ckpt/{m}/ckpt.pt" for m in OFFICIAL_MODES),
                 "nanogpt/reference_logits.pt", "nanogpt/data/shakespeare_char/meta.pkl", "nanogpt/out-tiny/ckpt.pt",
                 "nanogpt/out-tiny-nobias/ckpt.pt",
                 *(f"nanogpt/config/{c}.py" for c in ("eval_gpt2", "finetune_shakespeare", "train_gpt2",
                                                       "train_shakespeare_char")))


# The README's command runs the suite on 2 workers, `pytest -n 2 --dist loadgroup`: tests that share a costly
# module-scoped setup (2-rank torchrun launches) carry one xdist_group mark, so one worker sets it up once, and
# the longest tests (whole training runs in subprocesses; docs/tests.md) start first, longest first, so
# that the two workers end together instead of one running a long test alone at the end.
LONGEST_FIRST = ("test_study_through_submitit_jobs", "test_study_continues_on_a_fresh_clone",
                 "test_sigkill_at_random_moments", "test_killed_sweep_restarts", "test_quick_writes_only_under",
                 "test_sweep_with_a_diverging_learning_rate", "test_quick_start_offline",
                 "test_compile_ddp_bf16_together", "test_saved_activation_bytes_under_torch_compile",
                 "test_lm_eval_equals_eval_py", "test_hf_dataset_path_with_spawn_workers",
                 "test_first_use_under_torchrun", "test_ddp_matches_single_process",
                 "test_a_signalled_process_exits", "test_a_sigterm_to_the_sweep", "test_ddp_rejects_indivisible")


def pytest_collection_modifyitems(items):
    """Reorder the collected tests: those named in LONGEST_FIRST first, in its order (the rest keep theirs)."""
    rank = lambda item: next((i for i, name in enumerate(LONGEST_FIRST) if item.name.startswith(name)),
                             len(LONGEST_FIRST))
    items.sort(key=rank)


def require_shipped_data(root=SHIPPED_DATA) -> Path:
    """root if it holds PROVENANCE.md and every file of SHIPPED_FILES; else the test fails, naming them."""
    missing = [f for f in ("PROVENANCE.md", *SHIPPED_FILES) if not (root / f).is_file()]
    if missing:
        pytest.fail(f"test data missing from {root}: {', '.join(missing)}; they are part of the repository: "
                    f"restore them with git checkout -- tests/data", pytrace=False)
    return root


@pytest.fixture(scope="session")
def shipped_data() -> Path:
    """Path to tests/data (Tiny Shakespeare, one enwiki2015 file, GPT-2 BPE files, official checkpoints);
    fails, naming the files, if any is missing."""
    return require_shipped_data()


def write_tiny_dataset(folder, train_repeats=60, val_repeats=8):
    """A tiny prepared dataset in folder (created): a fixed random pattern of 97 token ids (vocab 64, uint16)
    repeated, so a small model learns it quickly; meta.json as prepare_data.py writes it for char data."""
    import json

    import numpy as np
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    pattern = np.random.default_rng(0).integers(0, 64, 97)
    np.tile(pattern, train_repeats).astype(np.uint16).tofile(folder / "train.bin")
    np.tile(pattern, val_repeats).astype(np.uint16).tofile(folder / "val.bin")
    (folder / "meta.json").write_text(json.dumps(dict(vocab_size=64, dtype="uint16", tokenizer="char")))
    return folder


def run_offline(*args, cwd, **env):
    """Run `python tests/no_network.py SCRIPT ARGS...` (a script of the repository with the network cut) in cwd
    with an empty tiktoken cache (cwd/tiktoken_cache, created), one thread, and env added -> CompletedProcess."""
    cache = Path(cwd) / "tiktoken_cache"
    cache.mkdir(exist_ok=True)
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(cache), "OMP_NUM_THREADS": "1", **env}
    return subprocess.run([sys.executable, str(ROOT / "tests" / "no_network.py"), *args], capture_output=True,
                          text=True, timeout=300, cwd=cwd, env=env)
