"""sweep.py on a cluster: --dry_run's plan and GPU-hours, and a study driven through submitit."""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import pytest
from conftest import ROOT
from test_sweep import ONE_ARM, command_lines, tiny_study, write_run

from nlq import checkpoint, settings
from research import sweep
from research.study import (arm_config, final_row, is_finished, load_study, plan, read_saved_config, run_dir, run_list,
                            settings_diff, study_progress)


def test_dry_run_of_the_paper_study_prints_its_runs_and_gpu_hours():
    """The command docs/cluster.md gives, with no data anywhere: 3 arms x 2 horizons x 2 selection seeds x (3 rates
    + 0-2 extensions + 2 half steps) + 3 final seeds = 69-93 runs, at bench/RESULTS.md's H200 tokens/s; a ladder's
    smaller model runs faster by its FLOPs per token (the same MFU)."""
    result = subprocess.run([sys.executable, "-m", "research.sweep", "studies/paper_claim_gpu.py", "--dry_run"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    tokens = 60000 * 40 * 12 * 1024
    assert tokens == 29_491_200_000
    linear_h, nonlinear_h = (tokens / s / 3600 for s in (458940.69071129715, 409215.33758262004))
    assert (round(linear_h, 2), round(nonlinear_h, 2)) == (17.85, 20.02)
    # a selection run: the mean of its 3,000- and 6,000-step runs (1/20 and 1/10 of the final run's tokens)
    assert f"| linear | linear | 458,941 | 29,491,200,000 | {linear_h * 0.075:.2f} / 17.85 | 0 | 12 | 23 | 31 |" in out
    assert f"| nonlinear | nonlinear | 409,215 | 29,491,200,000 | {nonlinear_h * 0.075:.2f} / 20.02 | 0 | 12 |" in out
    assert round(3 * (2 * linear_h + nonlinear_h) + 28 * 0.075 * (2 * linear_h + nonlinear_h), 1) == 284.2
    assert "The study: 69-93 runs, 250.7-284.2 GPU-hours; 0 finished, 36 due now." in out
    if not os.path.exists(ROOT / "data" / "openwebtext"):  # the usual case: not prepared here
        assert "data: not ready, so the sweep would stop at once: the study's runs read the dataset " \
               "data/openwebtext" in out
    assert not os.path.exists(ROOT / "results" / "paper_claim_gpu")  # nothing started, no folder made
    ladder = subprocess.run([sys.executable, "-m", "research.sweep", "studies/ladder_gpu.py", "--dry_run"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120).stdout
    flops = lambda args: settings.flops_per_token(settings.model_config(settings.parse_config(args)))
    small = flops([str(ROOT / "config" / "nlq_small.py"), "--query_mode=linear"])
    rung = load_study(str(ROOT / "studies" / "ladder_gpu.py"))["rungs"]["4x192"]
    speed = 458940.69071129715 * small / settings.flops_per_token(settings.model_config(arm_config(rung, "linear")))
    assert f"| linear | linear | {speed:,.0f} | 232,521,728 |" in ladder


def test_dry_run_counts_finished_and_due_runs_and_names_a_missing_mode(tmp_path, capsys):
    study_file = tiny_study(tmp_path, "max_extensions = 1\n")
    study = load_study(str(study_file))
    for lr, loss in ((1e-2, 2.0), (3e-3, 1.5)):  # linear's grid is done: 3e-3 is at the lower edge
        write_run(study, "linear", lr, 1, [dict(iter=20, val_loss=loss)])
    sweep.main([str(study_file), "--dry_run", "--tokens_per_s", "3.6"])  # 20 x 64 tokens = 1280: 0.1 h a run
    out = capsys.readouterr().out
    # linear: 2 finished, the extension 9e-4 due; at most 2 + 1 + 2 half steps + 1 final = 6 runs
    assert "| linear | linear | 4 | 1,280 | 0.10 | 2 | 1 | 5 | 6 | 0.6 |" in out
    assert "| nonlinear | nonlinear | 4 | 1,280 | 0.10 | 0 | 2 | 5 | 6 | 0.6 |" in out
    # the study's config runs on the CPU: CPU-hours of one process at the given tokens/s
    assert "The study: 10-12 runs, 1.0-1.2 CPU-hours; 2 finished, 3 due now.\n" \
           f"data: {tmp_path / 'data' / 'tiny'} prepared" in out
    assert "fewest / most: the whole study without / with every grid extension" in out  # the columns' legend
    assert "Complete" not in out
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps([dict(query_mode="linear", tokens_per_s=1000.0)]))
    with pytest.raises(ValueError, match="has no row for query_mode nonlinear \\(arm nonlinear\\); it has linear"):
        sweep.main([str(study_file), "--dry_run", "--bench_json", str(bench)])
    bench.write_text("not JSON")
    with pytest.raises(ValueError, match="not bench.py's JSON"):
        sweep.main([str(study_file), "--dry_run", "--bench_json", str(bench)])


def test_dry_run_of_a_complete_study_says_there_is_nothing_to_run(tmp_path, capsys):
    study_file = tiny_study(tmp_path, "half_steps = False\nmax_extensions = 0\n")  # 3 runs an arm
    study = load_study(str(study_file))
    for arm in study["arms"]:  # 3e-3 wins on seed 1 (no extension: the edge stays), then final seed 2
        for lr, seed, loss in ((1e-2, 1, 2.0), (3e-3, 1, 1.5), (3e-3, 2, 1.4)):
            write_run(study, arm, lr, seed, [dict(iter=20, val_loss=loss, val_loss_full=loss)])
    sweep.main([str(study_file), "--dry_run", "--tokens_per_s", "3.6"])
    assert "6 finished, 0 due now. Complete: the sweep has nothing to run" in capsys.readouterr().out
    shutil.rmtree(tmp_path / "data")  # a clone with the committed runs but not the data: the report needs none
    sweep.main([str(study_file), "--dry_run", "--tokens_per_s", "3.6"])
    assert "data: not ready for a sweep (the report does not need it): the study's runs " \
           "read the dataset" in capsys.readouterr().out


def test_dry_run_of_a_cpu_study_is_timed_on_its_own_finished_runs(tmp_path, capsys):
    """A study whose config runs on the CPU, with no --tokens_per_s: CPU-hours from its finished runs' step
    times and the rest of their elapsed time; '?' for an arm with no finished run."""
    study_file = tiny_study(tmp_path, "max_extensions = 1\n")  # device = 'cpu'; 20 steps of 4 x 16 tokens
    study = load_study(str(study_file))
    sweep.main([str(study_file), "--dry_run"])
    assert (f"CPU-hours: unknown, no finished run of this study to time yet; measure a run's speed with python "
            f"bench.py {tmp_path / 'tiny_config.py'} --threads=1 --query_modes=linear,nonlinear and pass its "
            f"tokens/s as --tokens_per_s") in capsys.readouterr().out
    for lr, loss in ((1e-2, 2.0), (3e-3, 1.5)):  # linear: 20 steps of 18 s, 720 s in all (360 s of evals)
        write_run(study, "linear", lr, 1, [dict(iter=0, val_loss=4.0, elapsed_s=1.0),
                                           dict(iter=20, val_loss=loss, ms_per_iter=18000.0, elapsed_s=720.0)])
    sweep.main([str(study_file), "--dry_run"])
    out = capsys.readouterr().out
    # 64 tokens / 18 s = 3.6 tokens/s; 720 s = 0.20 h a run; at most 6 (as above)
    assert "| linear | linear | 4 | 1,280 | 0.20 | 2 | 1 | 5 | 6 | 1.2 |" in out
    assert "| nonlinear | nonlinear | ? | 1,280 | ? | 0 | 2 | 5 | 6 | ? |" in out
    assert "CPU-hours unknown until nonlinear has a finished run to time; 2 finished" in out
    assert ("(evals and start-up included; each arm's speed as its runs met the machine's load, so tokens/s does "
            "not rank the arms: bench.py does)") in out
    assert study_progress(study) == "2 of the study's 10-12 runs finished"  # sweep.py's line at each wave
    sweep.main([str(study_file), "--quick", "--dry_run"])  # a --quick try: 1 step, at the study's runs' speed
    out = capsys.readouterr().out
    assert "| linear | linear | 4 | 64 | 0.01 | 0 |" in out and "(the steps alone: evals and start-up not" in out
    # a run without step times cannot time its arm
    write_run(study, "nonlinear", 1e-2, 1, [dict(iter=0, val_loss=4.0), dict(iter=20, val_loss=2.0)])
    sweep.main([str(study_file), "--dry_run"])
    assert "| nonlinear | nonlinear | ? | 1,280 | ? | 1 |" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------ through submitit
def processes_under(path):
    """{pid: command line} of the processes (but this one) whose command line names path (this test's jobs)."""
    return {pid: cmd for pid, cmd in command_lines().items() if str(path) in cmd and pid != os.getpid()}


def kill_all_under(path):
    for pid in processes_under(path):
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass


def starts(out_dir):
    """How many times train.py started in a run folder (it prints this line once per start)."""
    return open(os.path.join(out_dir, "train.log")).read().count("tokens per iteration")


def test_study_through_submitit_jobs_survives_a_killed_job_and_a_restarted_driver(tmp_path):
    """A tiny study driven through submitit's LocalExecutor (real subprocess jobs, no SLURM): the search extends
    at an edge and takes half steps across waves of jobs; one train.py is SIGKILLed mid-run (its job fails,
    is resubmitted and resumes from its checkpoint); the driver itself is SIGKILLed mid-study and started
    again (it waits for the jobs still running, submits nothing that finished); every job ran the local
    executor's experiment, and the killed one ends where an uninterrupted local run ends."""
    extra = "max_extensions = 1\n" + ONE_ARM  # 6 runs in 4 waves of jobs
    config_edit = ("max_iters = 20\nlr_decay_iters = 20", "max_iters = 40\nlr_decay_iters = 40")
    study_file = tiny_study(tmp_path / "jobs", extra)
    study_file.with_name("tiny_config.py").write_text(
        study_file.with_name("tiny_config.py").read_text().replace(*config_edit))
    study = load_study(str(study_file))
    driver = subprocess.Popen([sys.executable, "-m", "research.sweep", str(study_file), "--executor",
                               "local_submitit", "--threads", "1", "--poll_s", "0.2"], cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})
    killed = None
    try:
        deadline = time.time() + 300
        while killed is None and time.time() < deadline:  # a train.py between two evals: SIGKILL it
            for pid, cmd in processes_under(tmp_path / "jobs" / "runs").items():
                if "train.py" not in cmd or "--out_dir=" not in cmd:
                    continue
                out = cmd.split("--out_dir=")[1].split()[0]
                row = final_row(out)
                if row and 5 <= row["iter"] < 40:
                    os.kill(pid, 9)
                    killed = out
                    break
            time.sleep(0.01)
        assert killed, "no run was caught between two evals"
        while time.time() < deadline:  # the driver sees the failed job, or more runs finish: kill the driver
            if sum(is_finished(study, *r) for a in study["arms"] for r in run_list(study, a)) >= 3:
                break
            time.sleep(0.05)
        driver.kill()
        log = driver.communicate()[0]
        assert "submitted:" in log
        sweep.main([str(study_file), "--executor", "local_submitit", "--threads", "1", "--poll_s", "0.2"])
    finally:
        driver.kill()
        kill_all_under(tmp_path)
    for arm in study["arms"]:
        p = plan(study, arm)
        assert p["chosen"] is not None and not p["due"]
    notes = [n for arm in study["arms"] for n in plan(study, arm)["notes"]]
    assert any("edge: added" in n for n in notes), notes  # an extension, in a wave of its own
    assert all(len(plan(study, arm)["swept"]) >= 4 for arm in study["arms"])  # grid + half steps
    for arm in study["arms"]:
        for run in run_list(study, arm):
            out = run_dir(study, *run)
            record = sweep.read_job_record(study, *run)
            assert record["executor"] == "local"
            if out == killed:
                assert len(record["job_ids"]) == 2 and starts(out) == 2
                assert "resumed from" in open(os.path.join(out, "train.log")).read()
            else:  # submitted once, started once: the restarted driver resubmitted nothing
                assert len(record["job_ids"]) == 1 and starts(out) == 1, out
    # every job ran the experiment the local executor runs: its saved settings are the study's, and the killed
    # and resumed run equals the same run made here uninterrupted, row for row (the other runs ran once each)
    runs = [run for arm in study["arms"] for run in run_list(study, arm)]
    assert all(read_saved_config(os.path.join(run_dir(study, *run), "config.json"))
               and settings_diff(study, *run) == {} for run in runs)
    local_file = tiny_study(tmp_path / "local", extra)
    local_file.with_name("tiny_config.py").write_text(
        local_file.with_name("tiny_config.py").read_text().replace(*config_edit))
    local = load_study(str(local_file))
    run = next(r for r in runs if run_dir(study, *r) == killed)
    assert sweep.launch(local, *run, threads=1) is None
    losses = lambda out: [(r["iter"], r["train_loss"], r["val_loss"]) for r in checkpoint.read_metrics(out)]
    assert losses(killed) == losses(run_dir(local, *run)) and len(losses(killed)) == 9  # iters 0..40
    assert not processes_under(tmp_path)


def test_slurm_jobs_get_the_partition_time_gpus_and_extra_flags(tmp_path, monkeypatch):
    """The sbatch file submitit writes for a run (a stand-in srun on PATH: no SLURM here): one node, one task,
    the GPUs, partition and time asked for, submitit's USR2 90 s before the time limit, extra flags."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    study_file = tiny_study(tmp_path, "slurm = dict(partition='gpu', time=480, gpus_per_run=8, "
                                      "extra=dict(account='lab'))\n")
    study = load_study(str(study_file))
    args = sweep.main.__globals__["argparse"].Namespace(slurm_extra=["exclusive=true", "cpus_per_task=32"],
                                                         slurm_partition=None, slurm_time=None, gpus_per_run=None)
    gpus, slurm = sweep.slurm_settings(study, args)
    assert gpus == 8 and slurm == dict(partition="gpu", time=480, extra=dict(account="lab", exclusive=True,
                                                                            cpus_per_task=32))
    assert sweep.slurm_settings(study, argparse.Namespace(**{**vars(args), "gpus_per_run": 2}))[0] == 2
    text = sweep.make_executor("slurm", tmp_path / "jobs", gpus, slurm)._make_submission_file_text("CMD", "u")
    for flag in ("--partition=gpu", "--time=480", "--gpus-per-node=8", "--nodes=1", "--ntasks-per-node=1",
                 "--signal=USR2@90", "--account=lab", "--exclusive", "--cpus-per-task=32"):
        assert f"#SBATCH {flag}\n" in text, flag
    assert f"export PYTHONPATH={ROOT}" in text
    # a study on the CPU (device = 'cpu', no gpus_per_run): CPU jobs of --threads CPUs, no GPU asked for
    cpu_study = load_study(str(tiny_study(tmp_path / "cpu")))
    gpus, slurm = sweep.slurm_settings(cpu_study, argparse.Namespace(**{**vars(args), "slurm_extra": [
        "max_num_timeout=10"], "slurm_partition": "cpu"}))
    assert gpus == 0 and slurm == dict(partition="cpu", extra=dict(max_num_timeout=10))
    executor = sweep.make_executor("slurm", tmp_path / "cpu_jobs", gpus, slurm, threads=4)
    text = executor._make_submission_file_text("CMD", "u")
    assert "#SBATCH --cpus-per-task=4\n" in text and "#SBATCH --partition=cpu\n" in text
    assert "gpu" not in text.replace("--partition=cpu", "") and "max_num_timeout" not in text
    assert executor.max_num_timeout == 10  # requeues at the time limit before the driver resubmits
    assert sweep.parse_args([str(study_file), "--gpus_per_run", "0", "--dry_run"]).gpus_per_run == 0
    job = sweep.TrainJob(sweep.nproc_run_args(study, "linear", 1e-2, 1, 2), "out/x", nproc=2, cwd=str(tmp_path))
    cmd = job.command()
    assert cmd[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    assert "--signals_to_handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2" in cmd
    assert cmd[-2:] == ["--batch_size=2", "--gradient_accumulation_steps=2"]  # 1 x 4 by 2 ranks
