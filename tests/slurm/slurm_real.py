"""The cluster path on a real SLURM: the single node of scripts/slurm_local.sh (munge, slurmctld, slurmd, 2 GPUs
declared as gres; slurmdbd on MariaDB unless it was brought up with --no-accounting). Not part of the suite
(its name is not test_*.py, so `pytest tests/` does not collect it); .ci/run runs it after the suite, once with
accounting and once without:

    bash scripts/slurm_local.sh up [--no-accounting]
    python -m pytest -q tests/slurm/slurm_real.py
    bash scripts/slurm_local.sh down

A study to the end as GPU-shaped jobs, a CPU study on the cpu partition (one of its jobs scancelled while it
waits: its run is submitted again), a run past its time limit (submitit's USR2, a checkpoint, a requeue) and a
run requeued with `scontrol requeue` (SIGTERM, as at a preemption), each ending row for row as the same run made
uninterrupted, and scripts/slurm_fsdp.sbatch on 2 ranks of the node. Without accounting every sweep ends when
its runs end, having said so once."""
import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest
from conftest import ROOT
from test_sweep import tiny_study

from nlq import checkpoint
from research import sweep
from research.study import final_row, is_finished, load_study, run_dir, run_list

TIMING = ("ms_per_iter", "tokens_per_s", "mfu", "elapsed_s")  # a run's speed: the only columns that may differ


@pytest.fixture(scope="module")
def accounting():
    """Whether the local SLURM keeps accounting (sacct answers); fails when no SLURM is up."""
    ping = shutil.which("scontrol") and subprocess.run(["scontrol", "ping"], capture_output=True, text=True)
    if not ping or ping.returncode:
        pytest.fail("no SLURM is up here: bash scripts/slurm_local.sh up (as root), then run this again",
                    pytrace=False)
    config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, check=True).stdout
    return "accounting_storage/none" not in config


def one_arm_study(folder, extra="", iters=20):
    """tiny_study's study with one arm (linear), its runs of `iters` steps; extra: more lines."""
    study_file = tiny_study(folder, "half_steps = False\nmax_extensions = 0\n"
                                    "arms = {'linear': dict(query_mode='linear')}\n" + extra)
    config = study_file.with_name("tiny_config.py")
    config.write_text(config.read_text().replace("max_iters = 20\nlr_decay_iters = 20",
                                                 f"max_iters = {iters}\nlr_decay_iters = {iters}")
                      .replace("eval_interval = 5\neval_windows = 8\nlog_interval = 5",
                               f"eval_interval = {max(5, iters // 10)}\neval_windows = 8\n"
                               f"log_interval = {max(5, iters // 10)}"))
    return study_file


def run_sweep(study_file, *options):
    """Start `python -m research.sweep STUDY --executor slurm` (polling every second) -> its Popen."""
    return subprocess.Popen([sys.executable, "-m", "research.sweep", str(study_file), "--executor", "slurm",
                             "--poll_s", "1", *options], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def ended(driver, timeout=300):
    """The driver's output once it ended (it must end well, within timeout seconds)."""
    try:
        out = driver.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        driver.kill()
        pytest.fail(f"the sweep did not end in {timeout} s:\n{driver.communicate()[0]}", pytrace=False)
    assert driver.returncode == 0, out
    return out


def check_log(out, study, accounting, cancelled=None):
    """Every run finished, submitted once (again after its job `cancelled`), its job ids in the driver's log;
    one line about accounting if there is none."""
    runs = [run for arm in study["arms"] for run in run_list(study, arm)]
    for run in runs:
        assert is_finished(study, *run)
        record = sweep.read_job_record(study, *run)
        before = [cancelled] if cancelled in record["job_ids"] else []
        assert record["executor"] == "slurm" and record["job_ids"] == before + [record["job_id"]], record
        name = f"{run[0]} lr={run[1]:g} seed={run[2]}"
        assert out.count(f"submitted: {name} as job {record['job_id']} (slurm)") == 1, out
        assert f"job {record['job_id']} ({name}): finished" in out, out
    said = [line for line in out.splitlines() if line.startswith("no accounting on this cluster")]
    if accounting:
        assert said == [], out
    else:
        assert len(said) == 1 and "Slurm accounting storage is disabled): the driver follows its jobs with " \
                                  "squeue and their run folders instead" in said[0], out
    assert "sacct error" not in out and "Bypassing" not in out  # (submitit's warning, once per poll)
    return {run: sweep.read_job_record(study, *run)["job_id"] for run in runs}


def job_info(job_id):
    """scontrol's record of a job (kept MinJobAge, 300 s, after it ended): {field: value}."""
    text = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True,
                          check=True).stdout
    return dict(field.split("=", 1) for field in text.split() if "=" in field)


def test_a_study_runs_to_the_end_as_gpu_jobs(tmp_path, accounting):
    """2 selection runs, then the final seed at the chosen rate: 3 jobs of one GPU each, in 2 waves; the driver
    ends when the last run ends (with or without accounting)."""
    study_file = one_arm_study(tmp_path)
    study = load_study(str(study_file))
    out = ended(run_sweep(study_file, "--gpus_per_run", "1", "--threads", "1"))
    done = time.time()
    jobs = check_log(out, study, accounting)
    last = max(os.path.getmtime(os.path.join(run_dir(study, *run), "metrics.jsonl")) for run in jobs)
    assert done - last < 30, f"the driver ended {done - last:.0f} s after the last run"
    assert "chosen learning rates:" in out and "3 of the study's 3 runs finished" in out
    for job_id in jobs.values():
        info = job_info(job_id)
        assert info["Partition"] == "gpu" and info["TresPerNode"] == "gres:gpu:1", info


def test_a_cpu_study_runs_as_cpu_jobs_on_the_cpu_partition(tmp_path, accounting):
    """A study whose config runs on the CPU: each run a job of --threads CPUs and no GPU (no --gpus_per_run).
    Each takes the whole node, so one waits (PENDING) while the other runs: scancel it; the driver sees it
    ended (sacct's or squeue's CANCELLED) and submits its run again, which then finishes."""
    study_file = one_arm_study(tmp_path, "learning_rates = [1e-2]\nselection_seeds = []\nseeds = [1, 2]\n")
    study = load_study(str(study_file))
    cpus = str(os.cpu_count())  # the node's (scripts/slurm_local.sh)
    driver = run_sweep(study_file, "--threads", cpus, "--slurm_partition", "cpu")
    records = lambda: [r for r in (sweep.read_job_record(study, "linear", 1e-2, seed) for seed in (1, 2)) if r]
    squeue = lambda job_id: subprocess.run(["squeue", "-h", "-o", "%T", "-j", job_id], capture_output=True,
                                           text=True).stdout.strip()
    cancelled, deadline = None, time.time() + 120
    while cancelled is None and time.time() < deadline:
        cancelled = next((r["job_id"] for r in records() if squeue(r["job_id"]) == "PENDING"), None)
        time.sleep(0.1)
    assert cancelled, f"no job of the study waited: {records()}"
    subprocess.run(["scancel", cancelled], check=True)
    out = ended(driver)
    assert re.search(f"job {cancelled} \\(linear lr=0.01 seed=[12]\\): ended unfinished \\(resubmitted", out), out
    for job_id in check_log(out, study, accounting, cancelled).values():
        info = job_info(job_id)
        assert info["Partition"] == "cpu" and info["NumCPUs"] == cpus and "TresPerNode" not in info, info


def rows(out_dir):
    return [{k: v for k, v in row.items() if k not in TIMING} for row in checkpoint.read_metrics(out_dir)]


def test_a_run_past_its_time_limit_and_a_requeued_run_end_as_the_run_made_uninterrupted(tmp_path, accounting):
    """The same run three times at once: as a job of a 1-minute limit (USR2 asked for 1 s before it; slurmctld
    checks every 30 s and signals up to 30 s early, so it comes 29-59 s into the job: train.py checkpoints, the
    job is requeued, maybe again, and resumes), as a job that `scontrol requeue` stops (SIGTERM, as at a
    preemption) after its first evals, and here uninterrupted. The run trains 90 s at the probe's speed, so a job
    that runs alone until its neighbours start is still training when USR2 comes (by 59 s), even where the machine
    got 1.5x faster after the probe (other jobs on it ended);
    max_num_timeout=10: requeued as often as it takes. The three metrics.jsonl are equal row for row (the speed
    columns aside); each job was submitted once and kept its id."""
    extra, run = "learning_rates = [1e-2]\nselection_seeds = []\nseeds = [1]\n", ("linear", 1e-2, 1)
    probe = load_study(str(one_arm_study(tmp_path / "probe", extra, 2000)))
    assert sweep.launch(probe, *run, threads=1) is None
    s_per_iter = checkpoint.read_metrics(run_dir(probe, *run))[-1]["ms_per_iter"] / 1000
    iters = max(10000, int(round(90 / s_per_iter, -3)))
    limit_file, requeue_file, here_file = (one_arm_study(tmp_path / name, extra, iters)
                                           for name in ("limit", "requeue", "here"))
    limit = run_sweep(limit_file, "--threads", "1", "--slurm_time", "1", "--slurm_extra", "signal_delay_s=1",
                      "max_num_timeout=10")
    requeue = run_sweep(requeue_file, "--threads", "1")
    requeue_study = load_study(str(requeue_file))
    requeue_dir = run_dir(requeue_study, *run)
    try:
        deadline = time.time() + 120
        while not ((row := final_row(requeue_dir)) and row["iter"] >= iters // 10) and time.time() < deadline:
            time.sleep(0.1)
        assert row and row["iter"] < iters, f"the run to requeue did not train within 120 s: {row}"
        job_id = sweep.read_job_record(requeue_study, *run)["job_id"]
        subprocess.run(["scontrol", "requeue", job_id], check=True)
        assert sweep.launch(load_study(str(here_file)), *run, threads=1) is None  # meanwhile, here
    finally:
        outs = [ended(driver, timeout=600) for driver in (limit, requeue)]
    here = rows(run_dir(load_study(str(here_file)), *run))
    assert len(here) == 11 and here[-1]["iter"] == iters
    for study_file, out, stop in zip((limit_file, requeue_file), outs, ("SIGUSR", "SIGTERM")):
        study = load_study(str(study_file))
        check_log(out, study, accounting)
        out_dir = run_dir(study, *run)
        log = open(os.path.join(out_dir, "train.log")).read()
        assert f"stopped by {stop}" in log and "resumed from" in log, log  # (USR1 from submitit, or SLURM's USR2)
        assert rows(out_dir) == here
    submitit_log = "".join(open(p).read() for p in (tmp_path / "limit").glob("runs/*/*/submitit/*_log.out"))
    assert "Job has timed out" in submitit_log and "Requeued job" in submitit_log


def test_the_fsdp_sbatch_script_trains_on_2_ranks(tmp_path, accounting):
    """scripts/slurm_fsdp.sbatch as its header says, on this one node: 2 GPU-shaped ranks (gloo on the CPU)."""
    study_file = one_arm_study(tmp_path)  # (its tiny config and dataset)
    config = study_file.with_name("tiny_config.py")
    log = tmp_path / "fsdp-%j.log"
    result = subprocess.run(["sbatch", "--wait", "--nodes=1", "--gpus-per-node=2", "--cpus-per-task=2",
                             "--time=5", f"--output={log}", "scripts/slurm_fsdp.sbatch", str(config),
                             "--fsdp=True", "--gradient_accumulation_steps=2", f"--out_dir={tmp_path / 'out'}"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    job_id = re.search(r"Submitted batch job (\d+)", result.stdout).group(1)
    text = open(str(log).replace("%j", job_id)).read()
    assert result.returncode == 0, text
    assert f"job {job_id}: 1 nodes x 2 GPUs" in text
    assert "2 process(es), FSDP)" in text, text
    assert checkpoint.read_metrics(tmp_path / "out")[-1]["iter"] == 20
    assert json.loads((tmp_path / "out" / "config.json").read_text())["fsdp"] is True
