"""sweep.py: a study killed mid-run and restarted completes, without rerunning finished runs."""
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import ROOT, write_tiny_dataset

from nlq import checkpoint, preemption, settings
from research import report, sweep
from research.plan import data_status
from research.study import (check_data, due_runs, final_row, is_finished, load_study, plan,
                            quick_option, run_config, run_dir, rungs_of, selection_loss, settings_diff)


def tiny_study(tmp_path, extra=""):
    """A tiny study file (2 arms, grid 1e-2 and 3e-3 on selection seed 1, final seed 2) on a tiny dataset;
    extra: more lines of the study file."""
    write_tiny_dataset(tmp_path / "data" / "tiny")
    config = tmp_path / "tiny_config.py"
    config.write_text(f"data_dir = {str(tmp_path / 'data')!r}\ndataset = 'tiny'\nn_layer = 1\nn_head = 2\n"
                      "n_embd = 32\nblock_size = 16\nbatch_size = 4\ngradient_accumulation_steps = 1\n"
                      "max_iters = 20\nlr_decay_iters = 20\nwarmup_iters = 2\neval_interval = 5\n"
                      "eval_windows = 8\nlog_interval = 5\ndevice = 'cpu'\ncompile = False\n")
    study = tmp_path / "tiny_study.py"
    study.write_text(f"name = 'tiny'\nconfig = {str(config)!r}\noverrides = {{}}\n"
                     f"runs_dir = {str(tmp_path / 'runs')!r}\n"
                     "arms = {'linear': dict(query_mode='linear'), 'nonlinear': dict(query_mode='nonlinear')}\n"
                     "learning_rates = [1e-2, 3e-3]\nselection_seeds = [1]\nseeds = [2]\n" + extra)
    return study


def test_data_too_short_for_the_block_size_stops_the_sweep_before_any_run(tmp_path, capsys):
    """Every run would fail on it, the cause only in each train.log: the dry run says so, the sweep stops."""
    study = tiny_study(tmp_path, "overrides = {'block_size': 1000}\n")  # the tiny val split: 776 tokens
    sweep.main([str(study), "--dry_run"])
    assert (f"data: not ready, so the sweep would stop at once: the study's runs read the dataset "
            f"{tmp_path / 'data' / 'tiny'} (arm linear): {tmp_path / 'data' / 'tiny' / 'val.bin'} holds 776 "
            f"tokens, fewer than block_size + 1 = 1001") in capsys.readouterr().out
    with pytest.raises(ValueError, match="val.bin holds 776 tokens, fewer than block_size"):
        sweep.main([str(study)])
    assert not (tmp_path / "runs").exists()


@pytest.fixture
def study_file(tmp_path):
    """A tiny study: 2 arms x 2 learning rates at selection seed 1, then the chosen rate at seed 2
    (6 runs)."""
    return tiny_study(tmp_path, "half_steps = False\nmax_extensions = 0\n")


# The tests that run a whole study (each run a train.py process, ~3 s of start-up) run one arm of it: what they
# check (restarts, clones, --quick's folders) does not depend on how many arms there are.
ONE_ARM = "arms = {'linear': dict(query_mode='linear')}\n"


@pytest.fixture
def one_arm_study(tmp_path):
    """The tiny study with its linear arm only: 2 learning rates at selection seed 1, the chosen one at seed 2
    (3 runs)."""
    return tiny_study(tmp_path, "half_steps = False\nmax_extensions = 0\n" + ONE_ARM)


def starts(log_path):
    """How many times train.py started in this run directory (it prints this line once per start)."""
    return open(log_path).read().count("tokens per iteration")


def test_killed_sweep_restarts_without_rerunning_finished_runs(one_arm_study):
    study_file = one_arm_study
    study = load_study(str(study_file))
    first = run_dir(study, "linear", 3e-3, 1)  # the search runs its grid in ascending order
    second = run_dir(study, "linear", 1e-2, 1)
    proc = subprocess.Popen([sys.executable, "-m", "research.sweep", str(study_file)], start_new_session=True,
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    try:  # kill once the first run is done and the second has a checkpoint but has not finished
        while time.time() < deadline:
            row = final_row(second)
            if is_finished(study, "linear", 3e-3, 1) and row and 0 < row["iter"] < 20:
                break
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    row = final_row(second)
    assert row is not None and row["iter"] < 20, "the sweep was not caught mid-run"
    deadline = time.time() + 30  # its train.py got the SIGKILL too, but may hold its run's lock a moment longer
    while checkpoint.is_locked(os.path.join(second, ".lock")) and time.time() < deadline:  # (a loaded machine)
        time.sleep(0.05)
    first_mtime = os.path.getmtime(os.path.join(first, "metrics.jsonl"))

    sweep.main([str(study_file)])
    runs = [(a, lr, 1) for a in study["arms"] for lr in study["learning_rates"]]
    runs += [(a, plan(study, a)["chosen"], 2) for a in study["arms"]]
    assert all(is_finished(study, *run) for run in runs)
    assert starts(os.path.join(first, "train.log")) == 1  # not rerun
    assert os.path.getmtime(os.path.join(first, "metrics.jsonl")) == first_mtime
    assert "resumed from" in open(os.path.join(second, "train.log")).read()
    rows = [(r["iter"], "val_loss" in r) for r in checkpoint.read_metrics(second, train_rows=True)]
    assert rows == sorted(set(rows)) and rows[-1] == (20, True)  # no duplicated lines from the killed attempt


def test_chosen_lr_and_the_runs_on_several_processes(study_file, capsys):
    study = load_study(str(study_file))
    for lr, loss in ((1e-2, 2.0), (3e-3, 1.5)):
        write_run(study, "linear", lr, 1, [dict(iter=20, val_loss=loss)])
    assert plan(study, "linear")["chosen"] == 3e-3
    assert plan(study, "nonlinear")["chosen"] is None  # not swept yet
    # seed by seed: nonlinear's search runs (selection seed 1) come before linear's final run (seed 2)
    assert due_runs(study) == [("nonlinear", 3e-3, 1), ("nonlinear", 1e-2, 1), ("linear", 3e-3, 2)]
    # the study's 1 micro-batch of 4 cannot be shared by 2 processes (a SLURM job's --gpus_per_run 2): 2
    # micro-batches of 2, same global batch (the eval windows do not depend on the batch): the same experiment
    args = sweep.nproc_run_args(study, "linear", 3e-3, 2, 2)
    assert args[-2:] == ["--batch_size=2", "--gradient_accumulation_steps=2"]
    assert "--min_lr=0.0003" in args and "--seed=2" in args
    out = run_dir(study, "linear", 3e-3, 2)
    os.makedirs(out)
    with open(os.path.join(out, "config.json"), "w") as f:  # as that command's run saves it
        json.dump(dict(run_config(study, "linear", 3e-3, 2), batch_size=2, gradient_accumulation_steps=2,
                       eval_windows=8), f)
    assert settings_diff(study, "linear", 3e-3, 2) == {}
    with open(os.path.join(out, "config.json"), "w") as f:  # the official code's name of the mode: the same run
        json.dump(dict(run_config(study, "linear", 3e-3, 2), query_mode="original"), f)
    assert settings_diff(study, "linear", 3e-3, 2) == {}
    with open(os.path.join(out, "config.json"), "w") as f:  # the other official name: another mode
        json.dump(dict(run_config(study, "linear", 3e-3, 2), query_mode="residual_gelu"), f)
    assert settings_diff(study, "linear", 3e-3, 2) == {"query_mode": ("residual_gelu", "linear")}
    shutil.rmtree(out)
    with pytest.raises(ValueError,
                       match="neither gradient_accumulation_steps=1 nor batch_size=4 divides among 3"):
        sweep.nproc_run_args(study, "linear", 3e-3, 2, 3)
    for arm, lr, seed in ((a, lr, s) for a in study["arms"] for lr in (1e-2, 3e-3) for s in (1, 2)):
        if not is_finished(study, arm, lr, seed):
            finished_run(study, arm, lr, seed)
    spaced = study_file.parent / "my studies" / "tiny study.py"  # the report's command is quoted for a shell
    spaced.parent.mkdir()
    shutil.copy(study_file, spaced)
    # a finished study needs no data: a clone without it (or with other data) hears that nothing is left to run
    shutil.rmtree(study_file.parent / "data")
    sweep.main([str(study_file)])
    assert capsys.readouterr().out == (f"nothing to run: every run of the study has finished "
                                       f"({study['runs_dir']}); its report: python -m research.report {study_file}\n")
    sweep.main([str(spaced)])
    assert capsys.readouterr().out.endswith(f"its report: python -m research.report '{spaced}'\n")

def write_run(study, arm, lr, seed, rows):
    """A run folder as train.py leaves it, without training: config.json (the study's settings) and
    metrics.jsonl with the given rows."""
    out = run_dir(study, arm, lr, seed)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(run_config(study, arm, lr, seed), f)
    with open(os.path.join(out, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)


def fake_run(study, arm, lr, seed, loss):
    """A finished run with the given final loss (no training)."""
    write_run(study, arm, lr, seed, [dict(iter=20, val_loss=loss + 0.1, val_loss_full=loss)])


def test_search_extends_at_the_edge_then_takes_half_steps(study_file):
    """Grid 1e-3, 2e-3, 4e-3: best at the top edge -> 8e-3 is due; 4e-3 then interior -> half steps 2.83e-3
    and 5.66e-3; the best of all 6 is chosen and only then are the final seeds due."""
    text = study_file.read_text().replace("learning_rates = [1e-2, 3e-3]",
                                          "learning_rates = [4e-3, 1e-3, 2e-3]")
    study_file.write_text(text.replace("half_steps = False\nmax_extensions = 0\n", "seeds = [2, 3]\n"))
    study = load_study(str(study_file))
    assert study["grids"]["linear"] == [1e-3, 2e-3, 4e-3]
    for lr, loss in ((1e-3, 2.5), (2e-3, 2.3), (4e-3, 2.2)):
        fake_run(study, "linear", lr, 1, loss)
    p = plan(study, "linear")
    assert p["due"] == [("linear", 8e-3, 1)] and p["chosen"] is None
    assert p["notes"] == ["best rate 0.004 was at the upper edge: added 0.008"]
    fake_run(study, "linear", 8e-3, 1, 2.4)
    p = plan(study, "linear")
    assert p["due"] == [("linear", 0.00283, 1), ("linear", 0.00566, 1)]
    fake_run(study, "linear", 0.00283, 1, 2.25)
    fake_run(study, "linear", 0.00566, 1, 2.15)
    p = plan(study, "linear")
    assert p["chosen"] == 0.00566 and p["swept"] == [1e-3, 2e-3, 0.00283, 4e-3, 0.00566, 8e-3]
    assert p["due"] == [("linear", 0.00566, 2), ("linear", 0.00566, 3)]  # never seed 1, the selection seed
    assert p["losses"][0.00566] == pytest.approx(2.15)


def test_search_stops_extending_after_max_extensions_and_skips_diverged(study_file):
    text = study_file.read_text().replace("max_extensions = 0", "max_extensions = 1")
    study_file.write_text(text)
    study = load_study(str(study_file))
    fake_run(study, "nonlinear", 3e-3, 1, 2.0)
    out = run_dir(study, "nonlinear", 1e-2, 1)
    os.makedirs(out)
    with open(os.path.join(out, "metrics.jsonl"), "w") as f:  # a diverged run: +inf for the search
        f.write(json.dumps(dict(iter=7, train_loss=None, diverged=True)) + "\n")
    assert (is_finished(study, "nonlinear", 1e-2, 1)
            and selection_loss(study, "nonlinear", 1e-2) == math.inf)
    p = plan(study, "nonlinear")
    assert p["due"] == [("nonlinear", 0.0009, 1)]  # 3e-3 is the lower edge: one grid step (1e-2 / 3e-3) down
    fake_run(study, "nonlinear", 0.0009, 1, 1.9)
    p = plan(study, "nonlinear")
    assert (p["chosen"] == 0.0009
            and p["notes"][-1] == "best rate 0.0009 is still at the edge after 1 extensions")


def test_study_continues_on_a_fresh_clone_without_rerunning_finished_runs(one_arm_study, tmp_path):
    """Part of a study runs in clone A; clone B gets what git holds (each run's metrics.jsonl and config.json,
    no checkpoints, no logs) and finishes the study without rerunning any run that A finished."""
    study_file = one_arm_study
    study = load_study(str(study_file))
    first = due_runs(study)[:1]  # clone A runs 1 of the 2 search runs, then stops
    for run in first:
        assert sweep.launch(study, *run, threads=1) is None
    clone = tmp_path / "clone_b"
    for run in first:
        src = run_dir(study, *run)
        dst = clone / os.path.relpath(src, tmp_path / "runs")
        dst.mkdir(parents=True)
        for name in ("metrics.jsonl", "config.json"):
            (dst / name).write_bytes(open(os.path.join(src, name), "rb").read())
    study_b = study_file.parent / "study_b.py"
    study_b.write_text(study_file.read_text().replace(repr(str(tmp_path / "runs")), repr(str(clone))))
    sweep.main([str(study_b), "--threads", "1"])
    b = load_study(str(study_b))
    for run in first:
        assert not os.path.exists(os.path.join(run_dir(b, *run), "train.log"))  # never launched in B
    assert all(plan(b, arm)["chosen"] is not None and not plan(b, arm)["due"]
               for arm in b["arms"])


def test_study_typos_fail_before_any_run(tmp_path, study_file):
    bad = tmp_path / "bad_study.py"
    bad.write_text(study_file.read_text().replace("query_mode='nonlinear'", "query_mod='nonlinear'"))
    with pytest.raises(ValueError, match="unknown config key 'query_mod'"):
        load_study(str(bad))
    with pytest.raises(FileNotFoundError, match=r"nope\.py not found$"):
        load_study(str(tmp_path / "nope.py"))
    (tmp_path / "incomplete.py").write_text("name = 'x'\n")
    with pytest.raises(ValueError,
                       match="does not set config, overrides, arms, learning_rates, selection_seeds, seeds"):
        load_study(str(tmp_path / "incomplete.py"))


def test_edited_study_does_not_reuse_old_runs(study_file, tmp_path):
    study = load_study(str(study_file))
    out = run_dir(study, "linear", 1e-2, 1)
    os.makedirs(out)
    saved = {**run_config(study, "linear", 1e-2, 1), "n_embd": 64, "device": "cuda"}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(saved, f)
    with pytest.raises(ValueError, match="hold runs made with other settings.*lr0.01_seed1: n_embd 64 \\(study: 32\\)"):
        load_study(str(study_file))
    saved["n_embd"] = 32  # device, dtype, compile, logging: not part of the experiment
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(saved, f)
    load_study(str(study_file))
    saved.update(init_from="resume", initialised_from="gpt2")  # resumed, but it started from GPT-2's weights
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(saved, f)
    with pytest.raises(ValueError, match="initialised_from 'gpt2' \\(study: 'scratch'\\)"):
        load_study(str(study_file))


def test_arms_that_differ_in_precision_and_a_copy_of_a_committed_study_are_accepted(study_file, tmp_path):
    """Two arms that differ only in dtype (or compile) are two experiments, not one; a study file that is a
    byte-for-byte copy of a committed one is that study (an edited copy that keeps its name is not)."""
    both = tmp_path / "precision.py"
    both.write_text(study_file.read_text().replace("'nonlinear': dict(query_mode='nonlinear')",
                                                   "'linear_bf16': dict(query_mode='linear', dtype='bfloat16')"))
    assert list(load_study(str(both))["arms"]) == ["linear", "linear_bf16"]
    committed = ROOT / "studies" / "controls_cpu_long.py"
    copy = tmp_path / "controls_cpu_long.py"
    copy.write_text(committed.read_text())
    assert load_study(str(copy))["name"] == "controls_cpu_long"
    copy.write_text(committed.read_text() + "seeds = [1]\n")
    with pytest.raises(ValueError, match="its name 'controls_cpu_long' is the study studies/controls_cpu_long.py's"):
        load_study(str(copy))


@pytest.mark.parametrize("edit,message", [
    (("arms = {", "arms = {}\n_unused = {"), "arms must be a non-empty dict"),
    (("learning_rates = [1e-2, 3e-3]", "learning_rates = 1e-3"), "learning_rates must be a non-empty list"),
    # wrong shapes that raised TypeErrors inside the checks (an adversarial trial), each named by its check
    (("seeds = [2]", "seeds = 5"), "seeds must be a non-empty list of ints"),
    (("seeds = [2]", "seeds = [[1], [2]]"), "seeds must be a non-empty list of ints"),
    (("learning_rates = [1e-2, 3e-3]\nselection_seeds = [1]", "learning_rates = None\nselection_seeds = []"),
     "learning_rates must be a non-empty list"),
    (("learning_rates = [1e-2, 3e-3]\nselection_seeds = [1]",
      "learning_rates = {'linear': [1e-3], 'nonlinear': 1e-3}\nselection_seeds = []"),
     "learning_rates must be a non-empty list"),
    (("learning_rates = [1e-2, 3e-3]", "learning_rates = [[1e-3], [2e-3]]"),
     r"learning_rates must be a non-empty list of positive numbers"),
    (("learning_rates = [1e-2, 3e-3]", "learning_rates = {'linear': [1e-2]}"),
     r"learning_rates must be .* or a dict arm -> such a list for every arm"),
    (("seeds = [2]", "seeds = ['1']"), "seeds must be a non-empty list of ints"),
    (("seeds = [2]", "seeds = [1, 2]"), r"seeds \[1\] are both selection and final seeds"),
    (("selection_seeds = [1]\n", ""), "does not set selection_seeds"),
    (("overrides = {}\n", ""), r"does not set overrides"),
    (("max_extensions = 0", "out_root = 'x'"), "sets unknown keys \\['out_root'\\]"),
    (("max_extensions = 0", "seeds_per_arm = {'identity': 1}"), "seeds_per_arm must be a dict: arm of this study"),
    (("query_mode='nonlinear'", "query_mode='nonlinaer'"), "unknown query_mode 'nonlinaer'"),
    (("seeds = [2]", "seeds = = [2]"), "bad.py failed: SyntaxError"),
    (("query_mode='nonlinear'", "query_mode='nonlinear', init_from='resume'"),
     "arm nonlinear sets init_from='resume'; a study's runs train from scratch"),
    (("query_mode='nonlinear'", "query_mode='nonlinear', min_lr=1.0"),
     "arm nonlinear at learning rate 0.003: min_lr=1 is above learning_rate=0.003: the schedule would rise"),
    (("max_extensions = 0", "reference = ['linear']"),
     r"reference must be the name of one of the arms \(linear, nonlinear\)"),
    (("max_extensions = 0", "contrasts = [('nonlinear', 'lowrnak', 'x')]"),
     r"contrasts must be a list of \(arm, other arm, .*two different arms of linear, nonlinear"),
    # a study that imports (or copies) a committed one and keeps its name would write that study's report
    (("name = 'tiny'", "from studies.enwiki_cpu import name"),
     r"its name 'enwiki_cpu' is the study studies/enwiki_cpu\.py's \(taken over by an import or a copy\?\): set "
     r"name = '\.\.\.' to a name of its own"),
])
def test_bad_study_values(study_file, tmp_path, edit, message):
    bad = tmp_path / "bad.py"
    bad.write_text(study_file.read_text().replace(*edit))
    with pytest.raises(ValueError, match=message):
        load_study(str(bad))


def command_lines():
    """{pid: command line} of the processes running now (those that end while being read are left out)."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                found[int(pid)] = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            pass
    return found


def test_a_run_killed_by_sigint_during_start_up_is_interrupted_too(study_file, monkeypatch, capsys):
    """Ctrl-C while train.py still imports: Python dies of the signal (status -2), not through train.py's
    handler (130); the sweep calls that interrupted as well."""
    class DiesOfSigint:  # a train.py killed by SIGINT before its handler was installed
        def __init__(self, cmd, **kw):
            pass
        def wait(self):
            return -signal.SIGINT
    monkeypatch.setattr(sweep.subprocess, "Popen", DiesOfSigint)
    study = load_study(str(study_file))
    failure = sweep.launch(study, "linear", 1e-2, 1, threads=1)
    # stopped before its first checkpoint, it starts again (not 'resumes'); -15, a SIGTERM then, is 'stopped'
    assert "was interrupted (Ctrl-C); it had no checkpoint yet, so it starts again when the sweep" in failure
    assert "interrupted: linear lr=0.01 seed=1 (it had no checkpoint yet" in capsys.readouterr().out
    DiesOfSigint.wait = lambda self: -signal.SIGTERM
    open(os.path.join(run_dir(study, "linear", 1e-2, 1), "ckpt.pt"), "w").close()  # one from before
    failure = sweep.launch(study, "linear", 1e-2, 1, threads=1)
    assert "was stopped by a signal; it resumes from its last checkpoint when the sweep runs again" in failure
    assert "stopped: linear lr=0.01 seed=1 (it resumes" in capsys.readouterr().out

    class FinishesThenSigint(DiesOfSigint):  # Ctrl-C as the run ended: its last row was written
        def wait(self):
            shutil.rmtree(run_dir(study, "linear", 3e-3, 1), ignore_errors=True)
            finished_run(study, "linear", 3e-3, 1)
            return 130
    monkeypatch.setattr(sweep.subprocess, "Popen", FinishesThenSigint)
    assert sweep.launch(study, "linear", 3e-3, 1, threads=1) is None
    assert "finished: linear lr=0.003 seed=1: val loss 2.0000" in capsys.readouterr().out


def sweep_of_one_long_run(tmp_path):
    """A sweep (its own process, in a new session) of one run of 100,000 steps, once that run has written its
    first checkpoint -> (the sweep's Popen, the run's folder)."""
    study_file = tiny_study(tmp_path, ONE_ARM + "learning_rates = [3e-3]\nselection_seeds = []\n"
                                      "overrides = {'max_iters': 100000, 'lr_decay_iters': 100000}\n")
    out = run_dir(load_study(str(study_file)), "linear", 3e-3, 2)
    proc = subprocess.Popen([sys.executable, "-m", "research.sweep", str(study_file), "--threads", "1"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.time() + 120
    while not os.path.exists(os.path.join(out, "ckpt.pt")) and time.time() < deadline:
        time.sleep(0.05)
    return proc, out


def test_a_run_stopped_by_ctrl_c_is_reported_as_interrupted_not_failed(tmp_path):
    """SIGINT to a sweep's train.py: it exits 130 after its checkpoint, and the sweep says 'interrupted' (it
    resumes when the sweep runs again), not FAILED."""
    proc, out = sweep_of_one_long_run(tmp_path)
    try:
        train = [pid for pid, cmd in command_lines().items() if out in cmd and "train.py" in cmd]
        assert len(train) == 1, "train.py did not start"
        os.kill(train[0], signal.SIGINT)  # the run's process only, as a Ctrl-C would reach it
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert "interrupted: linear lr=0.003 seed=2 (it resumes from its last checkpoint" in stdout
    assert "FAILED" not in stdout and proc.returncode == 1
    assert "1 run(s) did not finish; the others did" in stderr and "was interrupted (Ctrl-C)" in stderr
    assert "is intact: continue with --init_from=resume" in open(os.path.join(out, "train.log")).read()


def test_a_sigterm_to_the_sweep_stops_its_runs_at_a_checkpoint(tmp_path):
    """SIGTERM to the sweep (kill PID, a job's end) reaches the train.py it runs, which checkpoints and exits
    (no orphan goes on training, so a restarted sweep never runs a run twice at once); the sweep says
    'stopped' and starts nothing more; the run's checkpoint is at the step it stopped after (a resume from it
    is tested in test_preemption.py). SIGINT to the sweep alone (kill -INT PID) takes the same handler
    (test_any_stop_signal_reaches_the_runs_as_sigterm): the sweep does not wait for runs that never heard
    of it."""
    proc, out = sweep_of_one_long_run(tmp_path)
    try:
        assert [cmd for cmd in command_lines().values() if out in cmd and "train.py" in cmd], "no train.py"
        proc.send_signal(signal.SIGTERM)  # the sweep only
        stdout, stderr = proc.communicate(timeout=120)  # the sweep waits for its train.py to end
        orphans = [pid for pid, cmd in command_lines().items() if out in cmd and "train.py" in cmd]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for pid, cmd in command_lines().items():
            if out in cmd and "train.py" in cmd:
                os.kill(pid, signal.SIGKILL)
    assert not orphans
    assert "stopped: linear lr=0.003 seed=2 (it resumes from its last checkpoint" in stdout
    assert "FAILED" not in stdout and proc.returncode == preemption.EXIT_PREEMPTED  # as train.py's for a SIGTERM
    assert "the sweep was stopped by SIGTERM: 1 running run(s) stopped, none started after it" in stderr
    # after a step, or during an eval (the run evaluates often): either way it checkpointed where it stopped
    assert re.search(r"stopped by SIGTERM (after|during the eval of) iter \d+: checkpoint",
                     open(os.path.join(out, "train.log")).read())


def test_any_stop_signal_reaches_the_runs_as_sigterm(monkeypatch):
    """SIGHUP (a closed terminal) as SIGTERM: train.py checkpoints on SIGTERM, and would die of SIGHUP."""
    class Run:
        def __init__(self):
            self.signals = []
        def send_signal(self, sig):
            self.signals.append(sig)
    runs = [Run(), Run()]
    monkeypatch.setattr(sweep, "RUNNING", set(runs))
    monkeypatch.setattr(sweep, "STOPPED_BY", [])
    sweep.stop_runs(signal.SIGHUP)
    sweep.stop_runs(signal.SIGTERM)
    assert [r.signals for r in runs] == [[signal.SIGTERM] * 2] * 2
    assert sweep.STOPPED_BY == ["SIGHUP", "SIGTERM"]  # the first is the one the sweep reports
    # every signal that ends a sweep run by hand or by a scheduler, SIGINT included (kill -INT PID reaches
    # the sweep alone; without a handler it would wait on its runs for hours)
    assert set(sweep.STOP_SIGNALS) == {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1,
                                       signal.SIGUSR2}


def test_per_arm_given_learning_rates_skip_the_search(study_file, capsys):
    """learning_rates as a dict arm -> [lr] with no selection seeds: each arm's rate is given (e.g. chosen by
    an earlier study) and only the final seeds are due."""
    text = study_file.read_text().replace("learning_rates = [1e-2, 3e-3]",
                                          "learning_rates = {'linear': [3e-3], 'nonlinear': [5e-3]}")
    study_file.write_text(text.replace("selection_seeds = [1]", "selection_seeds = []"))
    study = load_study(str(study_file))
    assert due_runs(study) == [("linear", 3e-3, 2), ("nonlinear", 5e-3, 2)]
    assert plan(study, "nonlinear")["chosen"] == 5e-3
    sweep.main([str(study_file), "--dry_run", "--tokens_per_s=100"])  # no search: one count of runs, not "2-2"
    assert "The study: 2 runs, 0.0 CPU-hours; 0 finished, 2 due now." \
        in capsys.readouterr().out
    bad = study_file.read_text().replace("'nonlinear': [5e-3]", "'nonlinear': [5e-3, 1e-2]")
    study_file.write_text(bad)
    with pytest.raises(ValueError, match="selection_seeds must be a non-empty list of ints"):
        load_study(str(study_file))


def finished_run(study, arm, lr, seed):
    """A finished run of the study, as a committed one is: metrics.jsonl and config.json only."""
    write_run(study, arm, lr, seed, [dict(iter=run_config(study, arm, lr, seed)["max_iters"], tokens=0,
                                          val_loss=2.0, val_loss_full=2.0, ms_per_iter=10.0)])


def test_a_clashing_study_is_refused_before_any_run_starts(study_file, tmp_path, monkeypatch):
    """A study that shares a runs folder holding other experiments (here: the same arms cut to 10 steps by its
    overrides) is refused by sweep.py before anything launches, and by report.py alike, with a fix that
    deletes nothing; the study that made those runs is accepted."""
    study = load_study(str(study_file))
    finished_run(study, "linear", 1e-2, 1)
    finished_run(study, "nonlinear", 3e-3, 1)
    clash = tmp_path / "short_study.py"
    clash.write_text(study_file.read_text().replace("overrides = {}", "overrides = {'max_iters': 10}"))
    launched = []
    monkeypatch.setattr(sweep.subprocess, "Popen", lambda *a, **k: launched.append(a))
    for main in (sweep.main, report.main):
        with pytest.raises(ValueError) as e:
            main([str(clash)])
        message = str(e.value)
        assert "2 run folder(s) in " in message and "hold runs made with other settings" in message
        assert "lr0.01_seed1: max_iters 20 (study: 10)" in message
        assert "give this study its own runs folder" in message and "--quick" in message
        assert "delet" not in message.lower()
    assert launched == [] and not os.path.exists(tmp_path / "results")
    load_study(str(study_file))  # the runs' own study
    shutil.rmtree(run_dir(study, "nonlinear", 3e-3, 1))
    with pytest.raises(ValueError, match="1 run folder"):
        load_study(str(clash))


def test_runs_made_by_another_model_py_are_refused(study_file, tmp_path):
    """The same settings, another model: config.json records the parameter counts train.py built. A run whose
    counts differ from what this clone's model.py builds for its arm (model.py changed since, e.g. a query mode
    edited) is refused by the sweep and the report, naming both counts, the commit and a fix."""
    study = load_study(str(study_file))
    finished_run(study, "nonlinear", 1e-2, 1)
    path = os.path.join(run_dir(study, "nonlinear", 1e-2, 1), "config.json")
    saved = json.loads(open(path).read())
    built = settings.param_counts(settings.model_config(saved))
    for counts, refused in ((built, False), ({**built, "non_embedding": built["non_embedding"] - 1024}, True)):
        with open(path, "w") as f:
            json.dump({**saved, "param_counts": counts, "code": dict(commit="0123abc" * 5 + "01234", edited=False)},
                      f)
        if not refused:
            load_study(str(study_file))  # the counts this model.py builds: the run is the study's
            continue
        for main in (sweep.main, report.main):
            with pytest.raises(ValueError) as e:
                main([str(study_file)])
            message = str(e.value)
            assert (f"lr0.01_seed1: non-embedding parameters {built['non_embedding'] - 1024} (study: "
                    f"{built['non_embedding']})") in message
            assert "this clone's model.py builds another model from them" in message
            assert "config.json names its commit under 'code'" in message and "new name" in message


def test_runs_on_other_data_are_refused_before_any_run(study_file, tmp_path, monkeypatch, capsys):
    """The runs already in a study's folder recorded their data (config.json's dataset_meta, with the bins'
    sha256). A dataset prepared again from other text under the same name is refused by the sweep and named
    by its dry run (new runs would be compared with runs on other data); a folder whose runs read one dataset
    name as two datasets is refused by sweep.py and report.py alike."""
    folder = tmp_path / "data" / "tiny"
    meta = lambda source, sha: dict(json.loads((folder / "meta.json").read_text()), source=source,
                                    sha256={"train.bin": sha, "val.bin": "b" * 64})
    (folder / "meta.json").write_text(json.dumps(meta("wiki/AA", "a" * 64)))
    study = load_study(str(study_file))
    finished_run(study, "linear", 1e-2, 1)
    record = os.path.join(run_dir(study, "linear", 1e-2, 1), "config.json")
    saved = json.load(open(record))
    json.dump(dict(saved, dataset_meta=meta("wiki/AA", "a" * 64)), open(record, "w"))
    assert check_data(study) == [str(folder)]  # the same data: fine
    assert data_status(study) == f"data: {folder} prepared"
    (folder / "meta.json").write_text(json.dumps(meta("tests/data/enwiki2015/AA", "c" * 64)))
    monkeypatch.setattr(sweep.subprocess, "Popen", lambda *a, **k: pytest.fail("a run was launched"))
    with pytest.raises(ValueError) as e:
        sweep.main([str(study_file)])
    other_data = (f"the dataset {folder} is the data prepared from tests/data/enwiki2015/AA (train.bin sha256 "
                  f"cccccccccccc…), but {tmp_path / 'runs'} holds 1 run(s) on the data prepared from wiki/AA "
                  f"(train.bin sha256 aaaaaaaaaaaa…), e.g. {run_dir(study, 'linear', 1e-2, 1)}: prepare it again as "
                  f"they were")
    assert other_data in str(e.value) and "give this study its own runs folder" in str(e.value)
    # prepared again while a sweep runs: each run checks the data again before it starts (local and submitit)
    failure = sweep.launch(study, "nonlinear", 1e-2, 1, threads=1)
    assert failure.startswith(f"{run_dir(study, 'nonlinear', 1e-2, 1)} was not started: the dataset {folder}")
    with pytest.raises(ValueError, match="the dataset .* is the data prepared from tests/data/enwiki2015/AA"):
        sweep.submit(study, "nonlinear", 1e-2, 1, "local_submitit", 1, None, 1)
    sweep.main([str(study_file), "--dry_run"])
    assert "data: not ready, so the sweep would stop at once: the dataset" in capsys.readouterr().out
    assert data_status(study, complete=True).startswith(  # a complete study: only --quick would run
        f"data: not ready for a sweep (the report does not need it): {other_data}")
    shutil.rmtree(run_dir(study, "linear", 1e-2, 1))  # a study of its own on the trial file: a note
    assert data_status(study) == (f"data: {folder} prepared ({folder}: from a small file shipped in tests/data: "
                                  f"fine for --quick, not for a study's results)")
    finished_run(study, "linear", 1e-2, 1)
    json.dump(dict(saved, dataset_meta=meta("wiki/AA", "a" * 64)), open(record, "w"))
    finished_run(study, "nonlinear", 1e-2, 1)  # a run on the other data, in the same folder
    record = os.path.join(run_dir(study, "nonlinear", 1e-2, 1), "config.json")
    json.dump(dict(json.load(open(record)), dataset_meta=meta("tests/data/enwiki2015/AA", "c" * 64)),
              open(record, "w"))
    for main in (sweep.main, report.main):
        with pytest.raises(ValueError, match="the runs read 'tiny' as different data: 1 run\\(s\\) on the data "
                                             "prepared from wiki/AA .*; 1 run\\(s\\) on the data prepared from "
                                             "tests/data/enwiki2015/AA"):
            main([str(study_file)])


@pytest.mark.parametrize("keys,message", [
    ("dataset='other'", "its arms differ in data (linear: "),
    ("init_from='gpt2'", "sets init_from='gpt2'; a study's runs train from scratch"),
    ("max_iters=40", "its arms differ in max_iters (linear: 20, nonlinear: 40); the arms of a study get the same "
                     "data, training tokens and eval set"),
    ("batch_size=8", "its arms differ in tokens_per_step (linear: 64, nonlinear: 128)"),
    ("eval_windows=12", "its arms differ in eval_windows (linear: 8, nonlinear: 12)"),
])
def test_arms_on_other_data_or_budgets_or_from_gpt2_are_refused(study_file, tmp_path, keys, message):
    """Paired by seed, a study's arms must read one dataset (an arm's own dataset or data_dir made the report
    pair runs on different tokens), train as long on as many tokens and be evaluated on the same windows;
    init_from a GPT-2 replaces the model keys, so its runs never match."""
    edit = "'nonlinear': dict(query_mode='nonlinear')"
    bad = tmp_path / "bad.py"
    bad.write_text(study_file.read_text().replace(edit, edit[:-1] + f", {keys})"))
    with pytest.raises(ValueError, match=message.replace("(", "\\(").replace(")", "\\)")):
        load_study(str(bad))


@pytest.mark.parametrize("runs_dir", ["results/enwiki_cpu/runs/linear", "results/enwiki_cpu", "results"])
def test_a_runs_dir_inside_another_studys_report_folder_is_refused(study_file, tmp_path, runs_dir):
    """Runs inside results/<other study>/ (but not its runs/ folder itself, which is how studies share runs)
    would be untracked files in a committed report's tree."""
    bad = tmp_path / "bad.py"
    bad.write_text(study_file.read_text().replace(f"runs_dir = {str(tmp_path / 'runs')!r}",
                                                  f"runs_dir = {runs_dir!r}"))
    with pytest.raises(ValueError, match=f"runs_dir {runs_dir} is inside results/(enwiki_cpu|<name>)/, another "
                                         f"study's report folder; leave runs_dir out"):
        load_study(str(bad))


def test_a_study_run_from_another_folder_is_told_where_to_run(tmp_path, monkeypatch):
    """The committed studies name their config relative to the repository root: from elsewhere, the error
    names the folder it looked in."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=f"enwiki_cpu.py: its config file config/enwiki_bytes.py not found "
                                                f"in {tmp_path}"):
        load_study(str(ROOT / "studies" / "enwiki_cpu.py"))


def test_a_missing_dataset_stops_the_sweep_before_any_run(study_file, tmp_path, monkeypatch):
    config = tmp_path / "tiny_config.py"
    config.write_text(config.read_text().replace("dataset = 'tiny'", "dataset = 'not_prepared'"))
    monkeypatch.setattr(sweep.subprocess, "Popen", lambda *a, **k: pytest.fail("a run was launched"))
    with pytest.raises(FileNotFoundError, match=r"the study's runs read the dataset .*not_prepared "
                                                r"\(arm linear\).*shows the command that prepares it"):
        sweep.main([str(study_file)])


def test_a_second_sweep_and_a_run_trained_elsewhere_are_named(one_arm_study, tmp_path, monkeypatch, capsys):
    """Two sweeps of one study (or one beside the train.py left running by a killed sweep) reported runs that
    finished as FAILED, both appending to their train.log: a second sweep is refused, and a run that another
    train.py holds is named as busy, not started, and not failed once it has finished."""
    monkeypatch.chdir(tmp_path)
    study = load_study(str(one_arm_study), quick=0.1)
    os.makedirs(study["runs_dir"])
    other_sweep = checkpoint.lock_file(os.path.join(study["runs_dir"], ".sweep.lock"))
    with pytest.raises(ValueError, match=r"another sweep.py is running the runs in out/quick/tiny/runs \(it holds "
                                         r"out/quick/tiny/runs/.sweep.lock\): two sweeps would start the same runs"):
        sweep.main([str(one_arm_study), "--quick", "0.1", "--threads", "1"])
    other_sweep.close()
    busy = run_dir(study, "linear", 3e-3, 1)
    os.makedirs(busy)
    orphan = checkpoint.lock_file(os.path.join(busy, ".lock"))  # a train.py still running it
    with pytest.raises(RuntimeError, match=r"1 run\(s\) did not finish; the others did:\n.*lr0.003_seed1 is being "
                                           r"trained by another train.py"):
        sweep.main([str(one_arm_study), "--quick", "0.1", "--threads", "1"])
    assert "busy: linear lr=0.003 seed=1: another train.py is training it; not started" in capsys.readouterr().out
    assert not os.path.exists(os.path.join(busy, "train.log"))  # nothing of this sweep's in its folder
    orphan.close()
    sweep.main([str(one_arm_study), "--quick", "0.1", "--threads", "1"])  # it ended: run now, and the rest
    assert capsys.readouterr().out.splitlines()[-1].startswith("3 of the study's 3 runs finished")


def test_quick_writes_only_under_the_scratch_folder(one_arm_study, tmp_path, monkeypatch, capsys):
    """--quick 0.1: every run at a tenth of its steps (schedule scaled alike), in out/quick/<name>/runs under
    the working folder; the study's runs_dir is never made. report.py --quick reads those runs."""
    study_file = one_arm_study
    monkeypatch.chdir(tmp_path)
    before = {p for p in tmp_path.rglob("*")}
    sweep.main([str(study_file), "--quick", "0.1", "--threads", "1"])
    printed = capsys.readouterr().out
    assert "quick: every run at 0.1 of its steps, in out/quick/tiny/runs (scratch" in printed
    assert f"report: python -m research.report {study_file} --quick 0.1" in printed
    assert (quick_option(None), quick_option(0.05)) == ("", " --quick")  # the default as typed
    assert "running (1 of 2 due now): linear lr=0.003 seed=1 -> out/quick/tiny/runs/linear/" in printed
    # each wave (the arms' search decides the next from the finished runs) says where the whole study stands
    assert [line for line in printed.splitlines() if line.startswith("wave ")] == [
        "wave 1: 2 run(s) due now; 0 of the study's 3 runs finished",
        "wave 2: 1 run(s) due now; 2 of the study's 3 runs finished"]
    assert printed.splitlines()[-1] == (f"3 of the study's 3 runs finished; its report: python -m research.report "
                                        f"{shlex.quote(str(study_file))} --quick 0.1")  # quoted for a shell
    row = final_row(os.path.join("out", "quick", "tiny", "runs", "linear", "lr0.01_seed1"))
    assert (f"finished: linear lr=0.01 seed=1: val loss {row['val_loss']:.4f} in "
            f"{row['elapsed_s'] / 60:.1f} min\n") in printed
    new = {p.relative_to(tmp_path) for p in tmp_path.rglob("*")} - {p.relative_to(tmp_path) for p in before}
    assert new and all(str(p) == "out" or str(p).startswith(os.path.join("out", "quick")) for p in new)
    assert not (tmp_path / "runs").exists()  # the study's own runs_dir
    quick = load_study(str(study_file), quick=0.1)
    cfg = run_config(quick, "linear", 1e-2, 1)
    assert (cfg["max_iters"], cfg["lr_decay_iters"], cfg["warmup_iters"], cfg["eval_interval"]) == (2, 2, 0, 1)
    assert cfg["eval_full_at_end"] is False and cfg["eval_windows"] == 1  # the config's 8, scaled
    assert final_row(run_dir(quick, "linear", 1e-2, 1))["iter"] == 2
    assert all(plan(quick, arm)["chosen"] is not None and not plan(quick, arm)["due"]
               for arm in quick["arms"])
    text = report.main([str(study_file), "--quick", "0.1"])
    assert "A --quick try of this study" in text and os.path.isfile("out/quick/tiny/README.md")
    assert "this try has the last fixed-window val loss (Method)" in text  # the study's own text may say whole
    assert "its last fixed-window val loss (`val_loss`" in text and "`val_loss_full`" not in text
    # a report (or sweep) at another fraction finds these runs: other settings, in scratch space
    with pytest.raises(ValueError, match=r"out/quick/tiny/runs is scratch space for --quick: delete it and run "
                                         r"again"):
        report.main([str(study_file), "--quick", "0.2"])


def test_committed_studies_load_and_a_shared_runs_folder_means_one_experiment_per_arm():
    """Every study in studies/ passes sweep.py's checks and is named after its file; studies that share a runs
    folder (runs_dir) give each arm name there the same config, overrides and settings, so a run made for one
    study is the same experiment in the others."""
    arms_by_folder = {}
    for path in sorted((ROOT / "studies").glob("*.py")):
        loaded = load_study(str(path))
        assert loaded["name"] == path.stem
        for study in rungs_of(loaded):  # a ladder: each rung is a study
            for arm, arm_settings in study["arms"].items():
                experiment = (study["config"], study["overrides"], arm_settings)
                arms_by_folder.setdefault((study["runs_dir"], arm), {})[path.stem] = experiment
    shared = {key: by_study for key, by_study in arms_by_folder.items() if len(by_study) > 1}
    assert ("results/enwiki_cpu/runs", "nonlinear") in shared  # the CPU studies share their runs
    for (folder, arm), by_study in shared.items():
        assert len({repr(experiment) for experiment in by_study.values()}) == 1, (folder, arm, by_study)


def test_runs_reporting_from_parallel_threads_print_whole_lines(monkeypatch):
    """--jobs 2: a trial saw '... -> out/quick/my_tiny/runs/linear/lr0.001_seed1running (2 of 4 due now): ...'
    (print writes its text and its newline separately, and two threads interleaved them). sweep.say writes each
    line whole."""
    import threading
    writes = []

    class Stdout:
        def write(self, text):
            writes.append(text)
            time.sleep(0.001)  # a slow terminal: the other threads run meanwhile

        def flush(self):
            pass
    monkeypatch.setattr(sys, "stdout", Stdout())
    threads = [threading.Thread(target=lambda i=i: [sweep.say(f"run {i} line {k}") for k in range(5)])
               for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(writes) == sorted(f"run {i} line {k}\n" for i in range(4) for k in range(5))


def test_runs_for_a_device_this_machine_lacks_are_not_started(study_file, tmp_path, monkeypatch):
    """A local sweep of runs on device=cuda on a CPU machine started every run, each failing with its reason
    only in its train.log (an adversarial trial): it stops before any."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # (a GPU machine too)
    study = tmp_path / "cuda.py"
    study.write_text(study_file.read_text().replace("overrides = {}", "overrides = {'device': 'cuda'}"))
    with pytest.raises(ValueError, match=r"the study's runs cannot train on this machine \(arm linear: device=cuda "
                                         r"but CUDA is not available here.*\); run the sweep where their device is"
                                         r".*nothing was started"):
        sweep.main([str(study), "--threads", "1"])
    assert not (tmp_path / "runs").exists()


def curve_run(study, arm, lr, seed, final, stalled=False):
    """A finished selection run (20 steps, evals at 5, 10, 20) that left the early plateau by step 10, or not."""
    write_run(study, arm, lr, seed, [dict(iter=5, val_loss=3.0), dict(iter=10, val_loss=2.95 if stalled else 2.5),
                                     dict(iter=20, val_loss=final, val_loss_full=final)])


def test_the_stall_rule_keeps_the_chosen_rate_a_margin_below_a_stall(study_file):
    """Two selection seeds, stall_margin 2. 8e-3 has the lowest mean loss, but seed 3 stalled there: no rate
    within a x2 step below it (+1%) may be chosen, so 4e-3 wins, and of its half steps only the lower one runs
    (5.66e-3 is ruled out). Without the rule the search would extend to 1.6e-2."""
    text = study_file.read_text().replace("learning_rates = [1e-2, 3e-3]", "learning_rates = [2e-3, 4e-3, 8e-3]")
    text = text.replace("selection_seeds = [1]", "selection_seeds = [1, 3]")
    study_file.write_text(text.replace("half_steps = False\nmax_extensions = 0\n", "stall_margin = 2\n"))
    study = load_study(str(study_file))
    for lr, loss in ((2e-3, 2.3), (4e-3, 2.2), (8e-3, 2.1)):
        curve_run(study, "linear", lr, 1, loss)
        curve_run(study, "linear", lr, 3, loss + 0.02, stalled=lr == 8e-3)
    p = plan(study, "linear")
    assert p["due"] == [("linear", 0.00283, 1), ("linear", 0.00283, 3)]
    for seed in (1, 3):
        curve_run(study, "linear", 0.00283, seed, 2.25)
    p = plan(study, "linear")
    assert p["chosen"] == 4e-3 and p["due"] == [("linear", 4e-3, 2)]
    assert p["notes"] == ["stall rule: 0.008 ruled out (a selection run stalled or diverged at 0.008)"]
    no_rule = load_study(str(study_file.rename(study_file.with_name("no_rule.py"))))  # the same runs, no rule:
    no_rule["stall_margin"] = None
    assert plan(no_rule, "linear")["due"] == [("linear", 0.016, 1), ("linear", 0.016, 3)]  # the edge: extend up


def test_a_stall_below_a_rate_does_not_count_against_it(study_file):
    """A rate too low to leave the plateau by half-way reads as stalled: it is ruled out, the rates above it are
    not (the search extends upward from 4e-3). Where every swept rate is ruled out, the search looks lower."""
    text = study_file.read_text().replace("learning_rates = [1e-2, 3e-3]", "learning_rates = [2e-3, 4e-3]")
    study_file.write_text(text.replace("max_extensions = 0\n", "max_extensions = 1\nstall_margin = 2\n"))
    study = load_study(str(study_file))
    curve_run(study, "nonlinear", 2e-3, 1, 2.6, stalled=True)
    curve_run(study, "nonlinear", 4e-3, 1, 2.3)
    assert plan(study, "nonlinear")["due"] == [("nonlinear", 8e-3, 1)]
    curve_run(study, "linear", 2e-3, 1, 2.4, stalled=True)
    curve_run(study, "linear", 4e-3, 1, 2.3, stalled=True)
    p = plan(study, "linear")
    assert p["due"] == [("linear", 1e-3, 1)] and p["notes"][0] == "the stall rule rules out every swept rate"
    curve_run(study, "linear", 1e-3, 1, 2.6)
    assert plan(study, "linear")["chosen"] == 1e-3  # 2e-3 and 4e-3 stalled; 1e-3 is half of the lowest of them


def test_selection_over_two_seeds_through_the_sweep_and_the_report(tmp_path):
    """One arm, 2 rates x selection seeds 1 and 3 with the stall rule, then the final seed: real runs through
    sweep.py, and report.py's learning-rate curves, search table (each rate's mean over both seeds) and the
    probe's plot from the runs' metrics."""
    study_file = tiny_study(tmp_path, "half_steps = False\nmax_extensions = 0\nstall_margin = 2\n" + ONE_ARM
                            + "selection_seeds = [1, 3]\n")
    sweep.main([str(study_file), "--jobs", "2", "--threads", "1"])
    study = load_study(str(study_file))
    final = lambda lr, seed: final_row(run_dir(study, "linear", lr, seed))["val_loss_full"]
    means = {lr: (final(lr, 1) + final(lr, 3)) / 2 for lr in (3e-3, 1e-2)}
    p = plan(study, "linear")
    # (the rule allows the best: a slow low rate may read as stalled, and a failure below counts against no rate)
    assert p["losses"] == pytest.approx(means) and p["chosen"] == min(means, key=means.get)
    assert is_finished(study, "linear", p["chosen"], 2) and due_runs(study) == []
    text = report.main([str(study_file), "--out", str(tmp_path / "report")])
    assert "## Learning-rate curves (final loss over selection seeds [1, 3])" in text
    assert f"| {p['chosen']:g} | **{means[p['chosen']]:.4f}** |" in text  # the search table: the 2 seeds' mean
    assert "The stall rule (stall_margin 2)" in text and "![probe](probe.png)" in text
    for png in ("lr_curves.png", "probe.png"):
        assert (tmp_path / "report" / png).read_bytes().startswith(b"\x89PNG")
