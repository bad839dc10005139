"""tests/data: every shipped file is the one tests/data/PROVENANCE.md describes (sha256 and size), and nothing
else is shipped there; the tests and the quick start need nothing outside the repository."""
import hashlib
import re

import pytest
from conftest import ROOT, SHIPPED_DATA, SHIPPED_FILES, require_shipped_data
from nlq import tokenizers

ROW = re.compile(r"^\| `([^`]+)` \|(?:.*\|)? `([0-9a-f]{64})` \| (\d+) \|$", re.M)  # | `path` | .. | `sha256` | size |


def test_every_shipped_file_matches_its_provenance(shipped_data):
    provenance = (shipped_data / "PROVENANCE.md").read_text()
    rows = {path: (sha, int(size)) for path, sha, size in ROW.findall(provenance)}
    on_disk = sorted(p.relative_to(shipped_data).as_posix() for p in shipped_data.rglob("*")
                     if p.is_file() and p.name != "PROVENANCE.md")
    assert sorted(rows) == on_disk == sorted(SHIPPED_FILES)
    for path, (sha, size) in rows.items():
        data = (shipped_data / path).read_bytes()
        assert (hashlib.sha256(data).hexdigest(), len(data)) == (sha, size), path


def test_missing_data_fails_naming_the_files(shipped_data, tmp_path):
    """The shipped_data fixture fails (never skips) when a file is missing, and names it."""
    (tmp_path / "PROVENANCE.md").write_text("x")
    for f in SHIPPED_FILES:
        if f != "gpt2/vocab.bpe":
            (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / f).write_text("x")
    with pytest.raises(pytest.fail.Exception, match=f"test data missing from {tmp_path}: gpt2/vocab.bpe; they "
                                                    "are part of the repository: restore them with git checkout"):
        require_shipped_data(tmp_path)
    assert require_shipped_data(shipped_data) == shipped_data


def test_nothing_refers_to_data_outside_the_repository():
    """The tests, the CI script and the quick start's scripts never read ../shared or NLQ_SHARED_DATA."""
    files = [*(ROOT / "tests").glob("*.py"), ROOT / ".ci" / "run", *(ROOT / f for f in (
        "train.py", "prepare_data.py", "sample.py", "eval.py", "interop/convert.py")), *(ROOT / "nlq").glob("*.py")]
    for f in files:
        if f.name != "test_shipped_data.py":
            text = f.read_text()
            assert "NLQ_SHARED_DATA" not in text and "../shared" not in text and "shared/data" not in text, f


def test_shipped_paths_are_the_ones_the_scripts_use():
    import prepare_data
    assert SHIPPED_DATA == prepare_data.SHIPPED_DATA
    assert tokenizers.GPT2_BPE_DIR == SHIPPED_DATA / "gpt2"
    assert prepare_data.SHAKESPEARE_TXT == SHIPPED_DATA / "tinyshakespeare" / "input.txt"
