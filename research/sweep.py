r"""
Run a study (study.py: what a study file sets, and each arm's learning-rate search): each run is train.py in its
own folder, started here or as SLURM jobs, in waves: the runs due now, then what their results make due.

    python -m research.sweep studies/enwiki_cpu.py --jobs 2 --threads 1  # here: 2 runs at a time, 1 thread each
    python -m research.sweep studies/paper_claim_gpu.py --dry_run        # the plan: runs, tokens, GPU-hours
    python -m research.sweep studies/ladder_gpu.py --dry_run             # a scaling ladder: the same by size
    python -m research.sweep studies/ladder_gpu.py --rung 4x256          # its first rung only
    python -m research.sweep studies/enwiki_cpu.py --quick --jobs 2      # try it: 5% of the steps, in out/quick/
    python -m research.sweep studies/paper_claim_gpu.py --executor slurm --gpus_per_run 8 --slurm_partition gpu \
        --slurm_time 480                                                 # SLURM jobs through submitit
    python -m research.report studies/enwiki_cpu.py                      # tables, paired statistics, plots

A ladder (a study file with rungs: the same study at several model sizes) runs its rungs one after the other.
A finished run (its metrics.jsonl reaches max_iters, or records divergence) is never rerun, also when only its
committed metrics.jsonl and config.json are there; a run with a checkpoint resumes exactly. Stop the sweep at
any time (its stop signal reaches the runs, which checkpoint) and start it again.

On a cluster (--executor slurm, through submitit) each due run is a job of one node running torchrun on
--gpus_per_run GPUs, and the driver plans again as jobs end; preempted jobs are requeued and resume exactly
(docs/cluster.md: job states, requeue, a restarted driver).
"""
import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from nlq.checkpoint import atomic_write_text, is_locked, lock_file
from nlq.distributed import resolve_device
from nlq.preemption import EXIT_DIVERGED, EXIT_INTERRUPTED, EXIT_PREEMPTED
from nlq.settings import HelpFormatter
from research import study as study_file
from research.plan import dry_run, ladder_dry_run
from research.study import (QUICK_DIR, QUICK_FRACTION, ROOT, arm_config, check_data, due_runs,
                            final_row, final_val_loss, is_diverged, is_finished, load_study, plan, quick_option,
                            run_args, run_config, run_dir, rungs_of, study_progress)

TRAIN_PY = os.path.join(ROOT, "train.py")


# ------------------------------------------------------------------------------------------------ one run
# torchrun forwards these to its workers (and waits up to TORCHRUN_SHUTDOWN_S for them before it kills them):
# SLURM's and submitit's stop signals reach train.py's ranks, which checkpoint and exit (train.py's docstring)
TORCHRUN_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2"
TORCHRUN_SHUTDOWN_S = 300


class TrainJob:
    """One run: train.py in cwd (the study's paths are relative to it) on one process, else under torchrun on
    nproc (one node), resuming from out_dir/ckpt.pt when there is one.

    As a submitit job, __call__ runs it -> train.py's exit status when the run finished or diverged, else a
    RuntimeError (the driver resubmits it). On its preemption signal (USR2) submitit calls checkpoint(), which
    stops train.py with SIGUSR1 (it checkpoints and exits) and returns the job to requeue, if it has not ended."""

    def __init__(self, args, out_dir, nproc=1, cwd=None, threads=None):
        self.args, self.out_dir, self.nproc = list(args), out_dir, nproc
        self.cwd, self.threads = cwd or os.getcwd(), threads
        self.pid = self.status = None

    def command(self):
        """The command line of this attempt: with --init_from=resume once a checkpoint exists."""
        args = self.args + (["--init_from=resume"]
                            if os.path.exists(os.path.join(self.cwd, self.out_dir, "ckpt.pt")) else [])
        if self.nproc == 1:
            return [sys.executable, TRAIN_PY, *args]
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={self.nproc}",
                f"--signals_to_handle={TORCHRUN_SIGNALS}", f"--shutdown_timeout={TORCHRUN_SHUTDOWN_S}", TRAIN_PY,
                *args]

    def wait(self):
        """Reap the child -> its exit status. Not Popen.wait: checkpoint() waits from a signal handler that may
        interrupt this very loop, and Popen.wait holds a lock that the handler would then wait for forever."""
        while self.status is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped by checkpoint() in between
                break
            if pid:
                self.status = os.waitstatus_to_exitcode(status)
            else:
                time.sleep(0.2)
        return self.status

    def start(self):
        """Start this attempt, its output appended to out_dir/train.log -> its Popen."""
        os.makedirs(os.path.join(self.cwd, self.out_dir), exist_ok=True)
        env = {**os.environ, **({"OMP_NUM_THREADS": str(self.threads)} if self.threads else {})}
        with open(os.path.join(self.cwd, self.out_dir, "train.log"), "a") as log:
            return subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, cwd=self.cwd, env=env)

    def __call__(self):
        proc = self.start()
        self.pid, self.status = proc.pid, None
        proc.returncode = code = self.wait()  # (Popen would otherwise try to reap it again)
        if code in (0, EXIT_DIVERGED):
            return code
        if code == EXIT_PREEMPTED and "SLURM_JOB_ID" in os.environ:  # SLURM's SIGTERM came first: give its
            time.sleep(60)  # USR2 time to reach submitit, which then requeues this job (checkpoint)
        raise RuntimeError(f"train.py ended with exit status {code}; see {self.out_dir}/train.log")

    def checkpoint(self, *args, **kwargs):
        import submitit  # (only a job that runs under submitit gets here)
        if self.pid is not None and self.status is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGUSR1)  # train.py (or torchrun, to every rank): checkpoint and exit
            self.wait()
        if self.status in (0, EXIT_DIVERGED):  # it ended before the signal: no requeue (it would train again)
            return None
        requeued = TrainJob(self.args, self.out_dir, self.nproc, self.cwd, self.threads)  # resumes: ckpt.pt
        return submitit.helpers.DelayedSubmission(requeued)

    def __getstate__(self):  # the pickle submitit stores: the run, not this attempt's process
        return {**self.__dict__, "pid": None, "status": None}


def nproc_run_args(study, arm, lr, seed, nproc):
    """run_args for nproc processes, the same global batch: accumulation divides among them, else the micro-batch is
    split (train.py draws a step's windows as one flat sequence: the same data). ValueError if neither divides."""
    args, cfg = run_args(study, arm, lr, seed), run_config(study, arm, lr, seed)
    accum, batch = cfg["gradient_accumulation_steps"], cfg["batch_size"]
    if accum % nproc:
        if batch % nproc:
            raise ValueError(f"neither gradient_accumulation_steps={accum} nor batch_size={batch} divides "
                             f"among {nproc} processes; pick another --gpus_per_run")
        args += [f"--batch_size={batch // nproc}", f"--gradient_accumulation_steps={accum * nproc}"]
    return args


# ------------------------------------------------------------------------------------------------ here
# The train.py processes the local sweep has started and that still run, and whether a stop signal came: a
# stop signal to the sweep (kill PID, a job's end) is passed on to them, and no run starts after it.
RUNNING = set()
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
STOPPED_BY = []  # the names of the stop signals the sweep got, in order (it reports the first)
PRINTING = threading.Lock()


def say(line):
    """Print line in one write: print's two (the text, its newline) from --jobs N threads could glue two lines."""
    with PRINTING:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def stop_runs(signum, frame=None):
    """The local sweep's signal handler: SIGTERM to every running train.py (it checkpoints and exits; it would die
    of a SIGHUP), and no more runs. SIGINT too: `kill -INT PID` reaches the sweep alone, not its runs."""
    STOPPED_BY.append(signal.Signals(signum).name)
    for proc in list(RUNNING):
        proc.send_signal(signal.SIGTERM)


def launch(study, arm, lr, seed, threads, progress=""):
    """Run (or resume) one training run as a subprocess; progress: shown in its 'running:' line. -> None when the
    run finished or diverged, else a line saying why not: one failed run never stops the others."""
    out_dir, name = run_dir(study, arm, lr, seed), f"{arm} lr={lr:g} seed={seed}"
    if STOPPED_BY:
        return f"{out_dir} was not started: the sweep was stopped"
    if is_finished(study, arm, lr, seed):
        say(f"done already: {name}")
        return None
    try:  # again before each run: the dataset may have been prepared again since the sweep started
        check_data(study)
    except (FileNotFoundError, ValueError) as e:
        say(f"not started: {name}: {e}")
        return f"{out_dir} was not started: {e}"
    if is_locked(os.path.join(out_dir, ".lock")):  # e.g. left running by a sweep killed with SIGKILL
        say(f"busy: {name}: another train.py is training it; not started")
        return (f"{out_dir} is being trained by another train.py (it holds {out_dir}/.lock; a run left by a "
                f"killed sweep?): run the sweep again once it has ended")
    say(f"running{f' ({progress})' if progress else ''}: {name} -> {out_dir}")
    proc = TrainJob(run_args(study, arm, lr, seed), out_dir, threads=threads).start()
    RUNNING.add(proc)
    if STOPPED_BY:  # the signal came while it was being started
        proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait()
    finally:
        RUNNING.discard(proc)
    log_path = f"{out_dir}/train.log"
    # Ctrl-C (EXIT_INTERRUPTED) or a stop signal (EXIT_PREEMPTED); -2 and -15: killed during start-up
    interrupted, stopped = code in (EXIT_INTERRUPTED, -signal.SIGINT), code in (EXIT_PREEMPTED, -signal.SIGTERM)
    row, finished = final_row(out_dir), is_finished(study, arm, lr, seed)  # (a signal as it ended: finished)
    if code == EXIT_DIVERGED and is_diverged(row):
        say(f"diverged: {name} (recorded; the sweep goes on)")
    elif (interrupted or stopped) and not finished:
        then = ("it resumes from its last checkpoint" if os.path.exists(os.path.join(out_dir, "ckpt.pt")) else
                "it had no checkpoint yet, so it starts again")
        say(f"{'interrupted' if interrupted else 'stopped'}: {name} ({then} when the sweep runs again)")
        how = "interrupted (Ctrl-C)" if interrupted else "stopped by a signal"
        return f"{out_dir} was {how}; {then} when the sweep runs again"
    elif code != 0 and not (interrupted or stopped):
        say(f"FAILED: {name} (exit code {code}); see {log_path}")
        return f"{out_dir} failed (exit code {code}); see {log_path}"
    elif not finished:  # else it would be launched again and again
        say(f"FAILED: {name} (ended without an error before max_iters)")
        return (f"{out_dir} ended before max_iters without an error: its metrics.jsonl ends at iter "
                f"{row and row['iter']} (rows lost?); delete the folder to run it again, see {log_path}")
    else:
        loss = final_val_loss(row)
        say(f"finished: {name}: val loss {'—' if loss is None else f'{loss:.4f}'}"
            + (f" in {row['elapsed_s'] / 60:.1f} min" if row.get("elapsed_s") else ""))
    return None


def run_here(study, jobs, threads):
    """The local sweep: waves of the runs due now, `jobs` train.py processes at a time, until none is due, holding
    the runs folder's .sweep.lock. -> {run: why it did not finish}; after a stop signal, exits as train.py would."""
    for arm in study["arms"]:  # else every run would start and fail, its reason only in its train.log
        try:
            resolve_device(arm_config(study, arm))
        except ValueError as e:
            raise ValueError(f"the study's runs cannot train on this machine (arm {arm}: {e}); run the sweep where "
                             f"their device is (--executor slurm), or set device in its overrides; nothing was started")
    os.makedirs(study["runs_dir"], exist_ok=True)
    lock = os.path.join(study["runs_dir"], ".sweep.lock")
    try:  # held until the sweep ends
        sweep_lock = lock_file(lock)
    except BlockingIOError:
        raise ValueError(f"another sweep.py is running the runs in {study['runs_dir']} (it holds {lock}): two "
                         f"sweeps would start the same runs; wait for it to end, or stop it") from None
    failed = {}
    STOPPED_BY.clear()
    previous = {sig: signal.signal(sig, stop_runs) for sig in STOP_SIGNALS}  # else its train.py would go on
    try:
        with ThreadPoolExecutor(jobs) as pool:
            wave = 0
            while not STOPPED_BY:
                due = [run for run in due_runs(study) if run not in failed]
                if not due:
                    break
                wave += 1
                print(f"wave {wave}: {len(due)} run(s) due now; {study_progress(study)}", flush=True)
                labels = [f"{i} of {len(due)} due now" for i in range(1, len(due) + 1)]
                for run, failure in zip(due, pool.map(lambda r, label: launch(study, *r, threads, label), due, labels)):
                    if failure:
                        failed[run] = failure
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if sweep_lock is not None:  # (None: a file system without locks)
            sweep_lock.close()
    if STOPPED_BY:
        stopped = [f for f in failed.values() if "was stopped by a signal" in f or "was interrupted" in f]
        how = "interrupted (Ctrl-C)" if STOPPED_BY[0] == "SIGINT" else f"stopped by {STOPPED_BY[0]}"
        print(f"error: the sweep was {how}: {len(stopped)} running run(s) stopped, none started after it; run the "
              f"same command again to go on (each resumes from its last checkpoint)", file=sys.stderr)
        raise SystemExit(EXIT_INTERRUPTED if STOPPED_BY[0] == "SIGINT" else EXIT_PREEMPTED)  # as train.py's
    return failed


# ------------------------------------------------------------------------- on a cluster: submitit (--executor)
# SLURM job states in which a job may still run, or run again (a requeued job keeps its id)
SLURM_ALIVE = ("PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "COMPLETING",
               "RESIZING", "SUSPENDED", "SIGNALING", "STAGE_OUT", "UNKNOWN")
NO_ACCOUNTING = []  # sacct's answer, once it said that this cluster keeps no accounting
MAX_ATTEMPTS = 3  # submissions of one run per driver session before it counts as failed


def make_executor(kind, folder, gpus_per_run, slurm, threads=None):
    """A submitit executor whose jobs log in folder: 'slurm' (one node, one task, gpus_per_run GPUs, or with 0 a
    CPU job of `threads` CPUs) or 'local_submitit'. slurm: partition, time in minutes, extra parameters."""
    import submitit
    setup = [f"export PYTHONPATH={shlex.quote(os.path.dirname(TRAIN_PY))}${{PYTHONPATH:+:$PYTHONPATH}}"]
    if kind == "local_submitit":
        executor = submitit.LocalExecutor(folder=folder)
        executor.update_parameters(timeout_min=slurm.get("time") or 60 * 24, setup=setup)
        return executor
    extra = dict(slurm.get("extra") or {})
    # max_num_timeout: how many times a job that reaches its time limit is requeued (then the driver resubmits)
    executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=extra.pop("max_num_timeout", 3))
    known = executor._valid_parameters()
    params = dict(nodes=1, ntasks_per_node=1, setup=setup,
                  **{k: slurm[k] for k in ("partition", "time") if slurm.get(k) is not None})
    params.update({"gpus_per_node": gpus_per_run} if gpus_per_run else {"cpus_per_task": threads})  # CPU: no gres
    params.update({k: v for k, v in extra.items() if k in known})
    raw = {k: v for k, v in extra.items() if k not in known}  # any other sbatch flag, as it is
    if raw:
        params["additional_parameters"] = raw
    executor.update_parameters(**params)
    return executor


def read_job_record(study, arm, lr, seed):
    """The run's job.json: {executor, job_id, folder, job_ids (every submission, oldest first)}, or None."""
    path = os.path.join(run_dir(study, arm, lr, seed), "job.json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)


def slurm_state(job_id):
    """A SLURM job's state: sacct's; else (no accounting, or no record yet) squeue's while slurmctld remembers
    the job; None once neither knows it (it ended); UNKNOWN when squeue cannot reach slurmctld."""
    if not NO_ACCOUNTING:
        acct = subprocess.run(["sacct", "-n", "-X", "-P", "-o", "State", "-j", job_id], capture_output=True, text=True)
        if acct.returncode == 0 and acct.stdout.strip():
            return acct.stdout.split()[0]  # e.g. CANCELLED of "CANCELLED by 0"
        if acct.returncode:
            NO_ACCOUNTING.append((acct.stderr or acct.stdout).strip())
            print(f"no accounting on this cluster (sacct -j {job_id}: {NO_ACCOUNTING[0]}): the driver follows its "
                  f"jobs with squeue and their run folders instead (a finished run is finished; a job squeue no "
                  f"longer lists has ended and its unfinished run is resubmitted)", flush=True)
    queue = subprocess.run(["squeue", "-h", "-o", "%T", "--states=all", "-j", job_id], capture_output=True, text=True)
    if queue.returncode and "Invalid job id" not in queue.stderr:
        return "UNKNOWN"
    return queue.stdout.split()[0] if queue.stdout.strip() else None


def job_alive(job, record):
    """Whether a submitted job may still run: on SLURM, a state in SLURM_ALIVE (slurm_state; a requeued job
    counts); for a local job, no result file yet and its controller process still exists (not a zombie)."""
    if record["executor"] == "slurm":  # the state first: a job SLURM requeued may have a result from before
        return slurm_state(record["job_id"]) in SLURM_ALIVE
    if job.paths.result_pickle.exists():
        return False
    if getattr(job, "_process", None) is not None:  # submitted by this driver
        return job._process.poll() is None
    try:  # submitted by an earlier driver: its controller, the job id, is an orphan now (or gone)
        with open(f"/proc/{int(record['job_id'])}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, ValueError):
        return False


def submit(study, arm, lr, seed, kind, gpus_per_run, slurm, threads):
    """Submit one run as a job, recorded in <run dir>/job.json -> the Job (after check_data, again before each)."""
    check_data(study)
    out_dir = run_dir(study, arm, lr, seed)
    os.makedirs(out_dir, exist_ok=True)
    folder = os.path.abspath(os.path.join(out_dir, "submitit"))
    nproc = max(gpus_per_run, 1)  # a CPU job (0 GPUs): one process
    job_fn = TrainJob(nproc_run_args(study, arm, lr, seed, nproc), out_dir, nproc, os.getcwd(), threads)
    job = make_executor(kind, folder, gpus_per_run, slurm, threads).submit(job_fn)
    old = read_job_record(study, arm, lr, seed) or {}
    atomic_write_text(os.path.join(out_dir, "job.json"), json.dumps(dict(
        executor="slurm" if kind == "slurm" else "local", job_id=str(job.job_id), folder=folder,
        job_ids=old.get("job_ids", []) + [str(job.job_id)]), indent=1))
    print(f"submitted: {arm} lr={lr:g} seed={seed} as job {job.job_id} ({kind}) -> {out_dir}", flush=True)
    return job


def drive(study, kind, gpus_per_run=1, slurm=None, threads=None, poll_s=30.0):
    """Run the study as jobs until it is complete: submit every run that is due, wait until one ends, plan again. A
    run's job that may still run (job.json) is waited for; one that ended unfinished is submitted again (at most
    MAX_ATTEMPTS times). -> {run: why it failed} for those given up on."""
    try:
        import submitit
    except ImportError:
        raise ValueError("--executor slurm needs submitit: pip install -r requirements-extra.txt") from None
    slurm, failed, attempts, active = slurm or {}, {}, {}, {}
    threads = threads or (None if gpus_per_run else 1)  # a CPU job's CPUs
    while True:
        for run in due_runs(study):
            if run in active or run in failed:
                continue
            record = read_job_record(study, *run)  # a job of this driver's or an earlier one's
            job = record and (submitit.SlurmJob if record["executor"] == "slurm" else submitit.LocalJob)(
                folder=record["folder"], job_id=record["job_id"])
            if job and job_alive(job, record):
                print(f"attached: {run[0]} lr={run[1]:g} seed={run[2]} is job {record['job_id']}", flush=True)
                active[run] = (job, record)
                continue
            if attempts.get(run, 0) >= MAX_ATTEMPTS:
                failed[run] = (f"{run_dir(study, *run)} did not finish in {MAX_ATTEMPTS} submissions; see its "
                               f"train.log and submitit/ logs")
                continue
            attempts[run] = attempts.get(run, 0) + 1
            job = submit(study, *run, kind, gpus_per_run, slurm, threads)
            active[run] = (job, read_job_record(study, *run))
        if not active:
            return failed
        # a job has ended, or its run finished (whatever SLURM says of the job)
        while not (ended := [r for r in active if is_finished(study, *r) or not job_alive(*active[r])]):
            time.sleep(poll_s)
        for run in ended:
            job_id = active.pop(run)[1]["job_id"]
            state = "finished" if is_finished(study, *run) else "ended unfinished (resubmitted if still due)"
            print(f"job {job_id} ({run[0]} lr={run[1]:g} seed={run[2]}): {state}", flush=True)


def slurm_settings(study, args):
    """The study file's slurm dict with the command line's options on top -> (gpus_per_run, slurm dict)."""
    slurm = {**study["slurm"], "extra": dict(study["slurm"].get("extra") or {})}
    for item in args.slurm_extra:
        key, is_set, text = item.partition("=")
        if not is_set:
            raise ValueError(f"--slurm_extra {item!r}: write KEY=VALUE, e.g. account=myproject")
        try:
            slurm["extra"][key] = json.loads(text)
        except ValueError:
            slurm["extra"][key] = text
    slurm.update({k: v for k, v in (("partition", args.slurm_partition), ("time", args.slurm_time))
                  if v is not None})
    on_cpu = all(arm_config(study, arm)["device"] == "cpu" for arm in study["arms"])
    gpus = slurm.pop("gpus_per_run", 0 if on_cpu else 1)  # a study on the CPU: CPU jobs
    return (gpus if args.gpus_per_run is None else args.gpus_per_run), slurm


# ------------------------------------------------------------------------------------------ the command line
def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m research.sweep", description=__doc__,
                                     formatter_class=HelpFormatter, allow_abbrev=False,
                                     epilog=f"The study file:{study_file.__doc__}")
    arg = parser.add_argument
    arg("study", help="study file, e.g. studies/enwiki_cpu.py")
    arg("--jobs", type=int, default=1, help="runs at a time on this machine")
    arg("--threads", type=int, default=None, help="OMP_NUM_THREADS per run (default: torch's; a CPU job's CPUs, "
                                                  "default 1)")
    arg("--quick", type=float, nargs="?", const=QUICK_FRACTION, metavar="FRACTION",
        help=f"try the machinery: every run at this fraction of its steps (alone: {QUICK_FRACTION}), in "
             f"{QUICK_DIR}/<name>/runs; results/ is never touched")
    arg("--rung", default=None, help="a ladder (a study file with rungs): only this rung")
    arg("--dry_run", action="store_true", help="print the plan (runs, tokens, GPU-hours; a study on the CPU: "
                                               "CPU-hours timed on its finished runs) and run nothing")
    arg("--tokens_per_s", type=float, default=None, help="--dry_run: measured training tokens/s per GPU (per "
                                                         "process on the CPU: bench.py's), for every arm")
    arg("--bench_json", default=None, help="--dry_run: bench.py's --json file; each arm at its query mode's "
                                           "tokens/s (default: the one-H200 figures, bench/results/h200_2026-11-30/)")
    arg("--executor", choices=("local", "slurm", "local_submitit"), default="local", help="local: runs here, --jobs "
        "at a time; slurm: each due run a SLURM job through submitit; local_submitit: submitit's local one (tests)")
    arg("--gpus_per_run", type=int, default=None,
        help="GPUs (torchrun processes on one node) per run; 0: a CPU job of --threads CPUs (default: the "
             "study's slurm gpus_per_run, else 0 for a study on the CPU, 1 for one on a GPU)")
    arg("--slurm_partition", default=None, help="SLURM partition (default: the study's)")
    arg("--slurm_time", type=int, default=None,
        help="SLURM time limit per job, minutes; a run that needs longer is requeued and resumes")
    arg("--slurm_extra", nargs="*", default=[], metavar="KEY=VALUE", help="more SlurmExecutor parameters "
        "(account=..., qos=..., cpus_per_task=8, mem=...) or any sbatch flag (exclusive=true), added to the study's")
    arg("--poll_s", type=float, default=30.0, help="seconds between job-state checks")
    args = parser.parse_args(argv)
    for option in ("jobs", "threads", "slurm_time"):
        if getattr(args, option) is not None and getattr(args, option) < 1:
            parser.error(f"--{option} must be >= 1")
    if args.executor == "slurm" and not args.dry_run and shutil.which("sbatch") is None:
        parser.error("--executor slurm submits with SLURM's sbatch, which is not on PATH here: run it on the "
                     "cluster's login node, or use --executor local on this machine")
    return args


def main(argv=None):
    args = parse_args(argv)
    study = load_study(args.study, args.quick)
    report_cmd = f"python -m research.report {shlex.quote(args.study)}{quick_option(args.quick)}"  # (spaces in a path)
    if args.quick:
        print(f"quick: every run at {args.quick:g} of its steps, in {study['runs_dir']} (scratch; results/ is not "
              f"touched). For trying the machinery, not for comparing arms; report: {report_cmd}", flush=True)
    if args.dry_run:
        print(ladder_dry_run(study, args.tokens_per_s, args.bench_json) if "rungs" in study else
              dry_run(study, args.tokens_per_s, args.bench_json))
        return
    if args.rung is not None and args.rung not in study.get("rungs", {}):
        raise ValueError(f"--rung {args.rung}: the study's rungs are {', '.join(study.get('rungs', {})) or 'none'}")
    for rung in rungs_of(study):  # a ladder's rungs one after the other, smallest first
        if args.rung not in (None, rung.get("rung")):
            continue
        if "rung" in rung:
            print(f"rung {rung['rung']}: runs in {rung['runs_dir']}", flush=True)
        sweep(rung, args, report_cmd)


def sweep(study, args, report_cmd):
    """Run what is due in one study until it is complete."""
    if not due_runs(study):  # before check_data: a finished study needs no data (a clone reads its report)
        print(f"nothing to run: every run of the study has finished ({study['runs_dir']}); its report: {report_cmd}")
        return
    check_data(study)
    if args.executor == "local":
        failed = run_here(study, args.jobs, args.threads)
    else:
        gpus, slurm = slurm_settings(study, args)
        failed = drive(study, args.executor, gpus, slurm, args.threads, args.poll_s)
    print("chosen learning rates:", json.dumps({arm: plan(study, arm)["chosen"] for arm in study["arms"]}))
    failed = {run: f for run, f in failed.items() if not is_finished(study, *run)}  # another process's, since
    if failed:
        raise RuntimeError(f"{len(failed)} run(s) did not finish; the others did:\n" + "\n".join(failed.values()))
    print(f"{study_progress(study)}; its report: {report_cmd}")


if __name__ == "__main__":
    try:
        main()
    except (ValueError, OSError, RuntimeError) as e:  # OSError: a runs_dir that cannot be written
        sys.exit(f"error: {e}")
    except KeyboardInterrupt:
        sys.exit(130)
