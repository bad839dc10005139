"""A query mode added the way the README shows passes every mode-generic test, registered from this file
alone.

The mode's code is read from README.md ("Add your own query mode"), so the documented example is what is
tested.
"""
import re

import pytest
import test_kv_cache
import test_model
import test_train
import torch
import torch.nn as nn
from conftest import ROOT
from test_train import data_dir  # noqa: F401  (a fixture used by test_train.test_exact_resume)

import bench
import model
from nlq import settings

MODE = "lowrank"


def readme_block(heading):
    """The first python block of the README's section under heading."""
    section = (ROOT / "README.md").read_text().split(f"\n## {heading}", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)[0]


def readme_example():
    """The class of the README's 'Add your own query mode'."""
    return readme_block("Add your own query mode")


@pytest.fixture(autouse=True)
def registered_mode(monkeypatch):
    """Run the README's code in model.py's namespace (as pasting it there would), for one test at a time."""
    namespace = {**vars(model), "QUERY_MODES": {}}
    exec(readme_example(), namespace)
    monkeypatch.setitem(model.QUERY_MODES, MODE, namespace["QUERY_MODES"][MODE])  # removed after the test
    yield model.QUERY_MODES[MODE]


def test_the_example_is_short_and_default_scale_is_its_own():
    assert len([line for line in readme_example().splitlines() if line.strip()]) <= 15
    cfg = model.GPTConfig(n_embd=64, n_head=4, query_mode=MODE)
    assert cfg.attn_scale == pytest.approx(0.5 / 4)  # scale_factor 0.5 / sqrt(16)


def test_overfits_a_batch():
    test_model.test_each_mode_overfits_a_batch(MODE)


def test_parameter_accounting():
    d, r, L = 64, 32, 2
    counts = test_model.build(query_mode=MODE).param_breakdown()
    identity = test_model.build(query_mode="identity").param_breakdown()
    assert counts["attn_q"] == L * 2 * d * r  # A and B
    assert counts["total"] - identity["total"] == L * 2 * d * r
    parts = ("embedding", "lm_head", "attn_q", "attn_kv", "attn_out", "mlp", "norms")
    assert sum(counts[k] for k in parts) == counts["total"]


def test_exact_resume(data_dir, tmp_path):  # noqa: F811
    test_train.test_exact_resume(MODE, data_dir, tmp_path)


def test_bench_runs_it(capsys):
    opts, rest = bench.split_args([f"--query_modes=linear,{MODE}", "--warmup=1", "--steps=2", "--rounds=1"])
    cfg = settings.parse_config(rest + ["--n_layer=1", "--n_head=2", "--n_embd=32", "--block_size=16",
                                      "--batch_size=2", "--device=cpu", "--vocab_size=64", "--compile=False"])
    rows, _ = bench.bench(cfg, opts)
    assert [r["query_mode"] for r in rows] == ["linear", MODE] and all(r["ms_per_iter"] > 0 for r in rows)
    lines = bench.table(rows, "cpu").splitlines()  # on the CPU the memory column is a running maximum: said so
    assert lines[1].endswith("| MFU | process peak RSS MB so far |") and "does not rank the modes" in lines[-1]
    progress = capsys.readouterr().err.splitlines()  # on stderr, so that a long bench is seen to move
    assert progress[-3:-1] == ["linear: built, 1 warm-up step: " + progress[-3].rsplit(": ", 1)[1],
                               f"{MODE}: built, 1 warm-up step: " + progress[-2].rsplit(": ", 1)[1]]
    assert progress[-1] == (f"round 1 of 1: linear {rows[0]['ms_per_iter']:.1f}, {MODE} {rows[1]['ms_per_iter']:.1f} "
                            f"ms/iter (medians so far)")


def test_a_checkpoint_of_the_mode_names_its_modules(tmp_path):
    m = test_model.build(query_mode=MODE)
    names = [k for k in m.state_dict() if ".attn.query." in k]
    assert names == ["transformer.h.0.attn.query.down.weight", "transformer.h.0.attn.query.up.weight",
                     "transformer.h.1.attn.query.down.weight", "transformer.h.1.attn.query.up.weight"]
    assert isinstance(m.transformer.h[0].attn.query, nn.Module) and torch.is_grad_enabled()


def test_kv_cache_gives_the_same_tokens():
    """The mode needs no cache of its own: generate gives the same tokens with and without the KV cache."""
    test_kv_cache.test_cached_forward_equals_full_forward(MODE, qk_norm=False, flash=True)
    test_kv_cache.test_greedy_same_tokens_with_and_without_cache(MODE, qk_norm=True, flash=False)


def test_the_readme_study_file_runs_the_fair_study(tmp_path):
    """The README's studies/lowrank_cpu.py loads with its own runs folder, its linear and nonlinear arms are
    the CPU study's experiments (so sharing that study's committed runs, opt-in, is accepted), and its sweep
    starts with the same learning-rate search for every arm."""
    from research.study import final_seeds, load_study, run_args
    study_text = readme_block("One study")
    assert study_text.startswith("# studies/lowrank_cpu.py\n")
    path = tmp_path / "lowrank_cpu.py"
    path.write_text(study_text)
    study = load_study(str(path))
    cpu = load_study(str(ROOT / "studies" / "enwiki_cpu.py"))
    assert study["runs_dir"] == "results/lowrank_cpu/runs"
    assert list(study["arms"]) == ["linear", "nonlinear", MODE]
    assert study["contrasts"][0][:2] == (MODE, "nonlinear") and study["precision"] == 0.003
    assert study["grids"][MODE] == cpu["grids"]["linear"] and study["seeds"] == cpu["seeds"]
    for arm in ("linear", "nonlinear"):  # the same experiments as the CPU study's, in another folder
        ours, theirs = run_args(study, arm, 8e-3, 2001), run_args(cpu, arm, 8e-3, 2001)
        assert ours[:-1] == theirs[:-1] and ours[-1] == theirs[-1].replace("enwiki_cpu", "lowrank_cpu")
    assert final_seeds(study, MODE) == cpu["seeds"]
    # sharing, opted into, is accepted (under a name of its own: a reader's saved studies/lowrank_cpu.py owns that one)
    path.write_text(study_text.replace('name = "lowrank_cpu"', 'name = "lowrank_shared"')
                    + 'runs_dir = "results/enwiki_cpu/runs"\n')
    shared = load_study(str(path))
    assert run_args(shared, "linear", 8e-3, 2001) == run_args(cpu, "linear", 8e-3, 2001)
