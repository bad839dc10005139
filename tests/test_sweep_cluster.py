"""sweep.py on a cluster: --dry_run's plan and GPU-hours, and a study driven through submitit."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import sweep
from conftest import ROOT


def tiny_study(tmp_path, extra=""):
    """A tiny study file (2 arms, grid 1e-2 and 3e-3 on selection seed 1, final seed 2) on a tiny dataset."""
    data = tmp_path / "data" / "tiny"
    data.mkdir(parents=True, exist_ok=True)
    pattern = np.random.default_rng(0).integers(0, 64, 97)
    np.tile(pattern, 60).astype(np.uint16).tofile(data / "train.bin")
    np.tile(pattern, 8).astype(np.uint16).tofile(data / "val.bin")
    (data / "meta.json").write_text(json.dumps(dict(vocab_size=64, dtype="uint16", tokenizer="char")))
    config = tmp_path / "tiny_config.py"
    config.write_text(f"data_dir = {str(tmp_path / 'data')!r}\ndataset = 'tiny'\nn_layer = 1\nn_head = 2\n"
                      "n_embd = 32\nblock_size = 16\nbatch_size = 4\ngradient_accumulation_steps = 1\n"
                      "max_iters = 20\nlr_decay_iters = 20\nwarmup_iters = 2\neval_interval = 5\n"
                      "eval_iters = 2\nlog_interval = 5\ndevice = 'cpu'\ncompile = False\n")
    study = tmp_path / "tiny_study.py"
    study.write_text(f"name = 'tiny'\nconfig = {str(config)!r}\noverrides = {{}}\n"
                     f"runs_dir = {str(tmp_path / 'runs')!r}\n"
                     "arms = {'linear': dict(query_mode='linear'), 'nonlinear': dict(query_mode='nonlinear')}\n"
                     "learning_rates = [1e-2, 3e-3]\nselection_seeds = [1]\nseeds = [2]\n" + extra)
    return study


def test_dry_run_of_the_paper_study_prints_its_runs_and_gpu_hours():
    """The command the README gives, with no data anywhere: 6 arms x (4 rates + 0-2 extensions + 2 half steps
    + 3 final seeds) = 54-66 runs of 60,000 x 491,520 tokens, at bench/RESULTS.md's H200 tokens/s."""
    result = subprocess.run([sys.executable, "sweep.py", "studies/paper_small.py", "--dry_run"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    tokens = 60000 * 40 * 12 * 1024
    assert tokens == 29_491_200_000
    linear_h, nonlinear_h, identity_h = (tokens / s / 3600 for s in (458940.69071129715, 409215.33758262004,
                                                                     471957.539337941))
    assert (round(linear_h, 2), round(nonlinear_h, 2), round(identity_h, 2)) == (17.85, 20.02, 17.36)
    assert f"| linear | linear | 458,941 | 29,491,200,000 | 17.85 | 0 | 4 | 4 | 9 | 11 | 71.4 | 196.3 |" in out
    assert f"| nonlinear | nonlinear | 409,215 | 29,491,200,000 | 20.02 | 0 | 4 | 4 | 9 | 11 | 80.1 | 220.2 |" in out
    most = 11 * (4 * linear_h + 2 * nonlinear_h) + 11 * identity_h - 11 * linear_h
    assert round(most, 1) == 1220.4
    assert ("The study: 54-66 runs, 998.5-1,220.4 GPU-hours (first wave: 24 runs, 443.8 GPU-hours); 0 finished, "
            "24 due now.") in out
    assert not os.path.exists(ROOT / "results" / "paper_small")  # nothing started, no folder made
    short = subprocess.run([sys.executable, "sweep.py", "studies/paper_short.py", "--dry_run", "--tokens_per_s",
                            "1e6"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "| linear | linear | 1,000,000 | 2,949,120,000 | 0.82 |" in short.stdout  # a tenth of the steps


def test_dry_run_counts_finished_and_due_runs_and_names_a_missing_mode(tmp_path, capsys):
    study_file = tiny_study(tmp_path, "max_extensions = 1\n")
    study = sweep.load_study(str(study_file))
    for lr, loss in ((1e-2, 2.0), (3e-3, 1.5)):  # linear's grid is done: 3e-3 is at the lower edge
        out = sweep.run_dir(study, "linear", lr, 1)
        os.makedirs(out)
        with open(os.path.join(out, "metrics.jsonl"), "w") as f:
            f.write(json.dumps(dict(iter=20, val_loss=loss)) + "\n")
    sweep.main([str(study_file), "--dry_run", "--tokens_per_s", "3.6"])  # 20 x 64 tokens = 1280: 0.1 h a run
    out = capsys.readouterr().out
    # linear: 2 finished, the extension 9e-4 due; at most 2 + 1 + 2 half steps + 1 final = 6 runs
    assert "| linear | linear | 4 | 1,280 | 0.10 | 2 | 1 | 2 | 5 | 6 | 0.2 | 0.6 |" in out
    assert "| nonlinear | nonlinear | 4 | 1,280 | 0.10 | 0 | 2 | 2 | 5 | 6 | 0.2 | 0.6 |" in out
    assert "The study: 10-12 runs, 1.0-1.2 GPU-hours (first wave: 4 runs, 0.4 GPU-hours); 2 finished, 3 due now." in out
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps([dict(query_mode="linear", tokens_per_s=1000.0)]))
    with pytest.raises(ValueError, match="has no row for query_mode nonlinear \\(arm nonlinear\\); it has linear"):
        sweep.main([str(study_file), "--dry_run", "--bench_json", str(bench)])
    bench.write_text("{}")
    with pytest.raises(ValueError, match="not bench.py's JSON"):
        sweep.main([str(study_file), "--dry_run", "--bench_json", str(bench)])
