"""report.py: the report's arithmetic, best-lr choice, missing/unfinished runs, README.md and PNG output."""
import json
import math
import os

import pytest

import common
import report
import sweep

# final val loss per (arm, lr, seed); "unfinished" stops at iter 50 of 100, absent keys are missing runs
FINALS = {("linear", 1e-3, 1): 2.0, ("linear", 2e-3, 1): 1.9, ("linear", 2e-3, 2): 1.8, ("linear", 2e-3, 3): 2.0,
          ("nonlinear", 1e-3, 1): 1.7, ("nonlinear", 2e-3, 1): math.nan,  # diverged: never the best
          ("nonlinear", 1e-3, 2): 1.72, ("nonlinear", 1e-3, 3): 1.68,
          ("identity", 1e-3, 1): 1.95, ("identity", 2e-3, 1): "unfinished", ("identity", 1e-3, 3): 1.93}


def make_study(tmp_path, finals, header="# Toy study.\n#   python sweep.py STUDY --jobs 2\n"):
    """A study file with a 1-layer byte-level config, out_root in tmp_path, and hand-made run dirs."""
    (tmp_path / "data" / "toy").mkdir(parents=True)
    (tmp_path / "data" / "toy" / "meta.json").write_text(json.dumps(dict(tokenizer="byte", vocab_size=256)))
    (tmp_path / "cfg.py").write_text(f"data_dir = {str(tmp_path / 'data')!r}\ndataset = 'toy'\nn_layer = 1\n"
                                     "n_head = 2\nn_embd = 16\nblock_size = 8\nmax_iters = 100\ndevice = 'cpu'\n")
    study_path = tmp_path / "toy_study.py"
    study_path.write_text(header + f"name = 'toy'\nconfig = {str(tmp_path / 'cfg.py')!r}\noverrides = {{}}\n"
                          "arms = {'linear': {}, 'identity': {'query_mode': 'identity'}, "
                          "'nonlinear': {'query_mode': 'nonlinear'}}\nlearning_rates = [1e-3, 2e-3]\n"
                          f"seeds = [1, 2, 3]\nout_root = {str(tmp_path / 'runs')!r}\n")
    study = sweep.load_study(str(study_path))
    for (arm, lr, seed), final in finals.items():
        out = sweep.run_dir(study, arm, lr, seed)
        os.makedirs(out)
        iters = [0, 50] if final == "unfinished" else [0, 50, 100]
        losses = [5.5, 2.5, 2.2] if final == "unfinished" else [5.5, final + 0.3, final]
        rows = [dict(iter=i, tokens=64 * i, val_loss=v) for i, v in zip(iters, losses)]
        if isinstance(final, float) and math.isnan(final):  # as train.py logs a run it stopped at iter 50
            rows = [rows[0], dict(iter=50, tokens=64 * 50, train_loss=None, diverged=True)]
        with open(os.path.join(out, "metrics.jsonl"), "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
        if arm == "linear":  # the other arms' parameter counts come from the study config instead
            cfg = sweep.run_config(study, arm, lr, seed)
            model_args = vars(common.model_config(cfg, 256))
            with open(os.path.join(out, "config.json"), "w") as f:
                json.dump({**cfg, "model_args": model_args}, f)
    return str(study_path)


def test_summary_arithmetic():
    mean, std, n = report.summarize([1.9, 1.8, 2.0])
    assert (mean, std, n) == (pytest.approx(1.9), pytest.approx(0.1), 3)  # sample std, ddof=1
    assert report.summarize([2.0])[2] == 1 and math.isnan(report.summarize([2.0])[1])
    assert math.isnan(report.summarize([])[0])
    assert report.relative_change(1.7, 1.9) == pytest.approx(-10.526315789)
    # |1.9 - 1.7| = 0.2 > 2 sqrt(0.1²/3 + 0.02²/3) = 0.118; |1.94 - 1.9| = 0.04 < 2 sqrt(0.1²/3 + 0.01414²/2) = 0.117
    assert report.exceeds_spread([1.72, 1.7, 1.68], [1.9, 1.8, 2.0]) is True
    assert report.exceeds_spread([1.95, 1.93], [1.9, 1.8, 2.0]) is False
    assert report.exceeds_spread([1.5], [1.9, 1.8, 2.0]) is None  # one seed: no spread to compare with


def test_best_lr_choice():
    assert report.pick_best_lr({1e-3: 2.0, 2e-3: 1.9, 4e-3: 2.1}) == 2e-3
    assert report.pick_best_lr({1e-3: math.nan, 2e-3: 3.0}) == 2e-3
    assert report.pick_best_lr({1e-3: None, 2e-3: 3.0}) == 2e-3
    assert report.pick_best_lr({1e-3: None, 2e-3: None}) is None


def test_report_files_and_numbers(tmp_path, capsys):
    out = tmp_path / "results"
    text = report.main([make_study(tmp_path, FINALS), "--out", str(out)])
    assert (out / "README.md").read_text() == text
    png = (out / "val_loss.png").read_bytes()
    assert len(png) > 1000 and png.startswith(b"\x89PNG\r\n\x1a\n")
    rows = {line.split(" | ")[0][2:]: line for line in text.splitlines() if line.startswith("| ")}
    assert "| 3,120 | 3,072 | 0.002 | 1.9000 ± 0.1000 (n=3) | 6.686 | 2.7411 | — | — |" in rows["linear"]
    assert "| 3,152 | 3,072 | 0.001 | 1.7000 ± 0.0200 (n=3) | 5.474 | 2.4526 | -10.53% | yes |" in rows["nonlinear"]
    assert "| 2,864 | 2,816 | 0.001 (provisional) | 1.9400 ± 0.0141 (n=2) |" in rows["identity"]
    assert rows["identity"].endswith("| +2.11% | no |")
    assert "| 0.002 | **1.9000** | unfinished (50/100) | diverged (iter 50) |" in text  # sweep table: linear, identity, nonlinear
    assert f"- {sweep.run_dir(sweep.load_study(str(tmp_path / 'toy_study.py')), 'identity', 1e-3, 2)}: missing" in text
    assert "python sweep.py STUDY --jobs 2" in text and f"python report.py {tmp_path / 'toy_study.py'}" in text
    assert "2·sqrt(s_arm²/n_arm + s_linear²/n_linear)" in text and "torch " in text


def test_report_with_no_runs(tmp_path):
    """A study that has not started: every run listed as missing, a placeholder plot, no crash."""
    out = tmp_path / "results"
    text = report.main([make_study(tmp_path, {}, header=""), "--out", str(out)])
    assert "0 of 6 runs finished (an arm's other seeds are listed once" in text and text.count(": missing") == 6
    assert "| linear | 3,120 | 3,072 | — | — |" in text
    assert "python sweep.py" in text and (out / "val_loss.png").read_bytes().startswith(b"\x89PNG")
