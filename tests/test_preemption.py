"""Preemption: a stop signal (SIGTERM, SIGUSR1; SLURM's warnings) in the middle of a step ends the run at the
next step boundary with a checkpoint there and exit status EXIT_PREEMPTED (during an eval: at the eval's next
batch, the eval still to come), on one process and on 2 gloo ranks (which agree to stop together even when one
rank alone is signalled), and the resumed run equals a run never stopped, bit for bit. Ctrl-C during an eval
checkpoints the step boundary too (one process)."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch
from conftest import ROOT, write_tiny_dataset
from test_layouts import args as layout_args, data_dir  # noqa: F401  (data_dir: the tiny dataset fixture)

import train
from nlq import checkpoint, data, preemption, settings


def args(data_dir, out, **kw):
    """train.py arguments of test_layouts' tiny run, with dropout (so the RNG state matters): 8 windows of 16
    tokens a step."""
    return layout_args(data_dir, out, **{"dropout": 0.1, **kw})


def run(data_dir, out, **kw):
    return train.train(settings.parse_config(args(data_dir, out, **kw)))


def ckpt(out):
    return torch.load(out / "ckpt.pt", map_location="cpu", weights_only=False)


def rows(out):
    return checkpoint.read_metrics(str(out))  # the eval rows


def train_rows(out):
    return [r for r in checkpoint.read_metrics(str(out), train_rows=True) if "val_loss" not in r]


def assert_same_weights(a, b):
    a, b = ckpt(a)["model"], ckpt(b)["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("sig,during_step,eval_step", [
    (signal.SIGUSR1, 4, False),  # the 4th of 6 steps: a checkpoint at iter 4, between the evals at 3 and 6
    (signal.SIGTERM, 3, True),   # the 3rd step: a checkpoint at iter 3, an eval step whose eval has not run
    (signal.SIGUSR2, 6, True),   # the last step: the final eval is still to come
])
def test_signal_mid_step_checkpoints_at_the_boundary_and_resumes_exactly(data_dir, tmp_path, monkeypatch, sig,
                                                                        during_step, eval_step):
    """The signal arrives at the start of step `during_step` (as it draws its training windows, before its
    forward pass): the step finishes, the checkpoint holds iter = during_step and its tokens, the metrics end
    at the last eval before it, and the resumed run has the straight run's weights and evals exactly."""
    run(data_dir, tmp_path / "straight")
    real_batch_starts, steps = data.TrainData.batch_starts, []

    def batch_starts_then_signal(*a, **kw):  # train.py draws each step's windows with it, once a step
        steps.append(1)
        if len(steps) == during_step:
            signal.raise_signal(sig)  # to this thread, at once (os.kill may reach another)
        return real_batch_starts(*a, **kw)

    monkeypatch.setattr(data.TrainData, "batch_starts", batch_starts_then_signal)
    before = signal.getsignal(sig)
    with pytest.raises(train.TrainingPreempted, match=f"stopped by {sig.name} after iter {during_step}: "
                                                      f"checkpoint .*ckpt.pt at iter {during_step}"):
        run(data_dir, tmp_path / "stopped")
    assert signal.getsignal(sig) == before  # the handlers are put back
    monkeypatch.setattr(data.TrainData, "batch_starts", real_batch_starts)
    saved = ckpt(tmp_path / "stopped")
    assert saved["iter_num"] == during_step and saved["tokens"] == during_step * 8 * 16
    assert saved["eval_pending"] is eval_step
    assert [r["iter"] for r in rows(tmp_path / "stopped")] == [it for it in (0, 3) if it < during_step]
    run(data_dir, tmp_path / "stopped", init_from="resume")
    assert_same_weights(tmp_path / "straight", tmp_path / "stopped")
    straight, resumed = rows(tmp_path / "straight"), rows(tmp_path / "stopped")
    assert [r["iter"] for r in resumed] == [0, 3, 6]
    assert [(r["val_loss"], r["train_loss"], r["tokens"]) for r in resumed] == [
        (r["val_loss"], r["train_loss"], r["tokens"]) for r in straight]
    assert train_rows(tmp_path / "stopped") == train_rows(tmp_path / "straight")  # every step's, once


@pytest.mark.parametrize("how", ["SIGTERM", "Ctrl-C"])
@pytest.mark.parametrize("at,whole_split", [(3, False), (6, True)])
def test_a_stop_during_an_eval_ends_it_and_the_resumed_run_evaluates_again(data_dir, tmp_path, monkeypatch, at,
                                                                         whole_split, how):
    """A stop signal, or Ctrl-C, during the eval of iter `at` (the fixed-window eval at 3; the final whole-split
    eval at 6, which can take an hour on a large split) ends the eval: a checkpoint at `at` with its eval still
    to come (the signal at the eval's next batch, Ctrl-C at once), and the resumed run evaluates it and ends
    with the straight run's weights and evals."""
    run(data_dir, tmp_path / "straight", eval_full_at_end=whole_split)
    name = "full_split_loss" if whole_split else "estimate_loss"
    evaluate, calls = getattr(train, name), []

    def eval_then_stop(*a, **kw):  # the stop comes as the eval of iter `at` starts (estimate_loss: the 2nd)
        calls.append(1)
        if len(calls) == (1 if whole_split else 2):
            if how == "Ctrl-C":
                raise KeyboardInterrupt  # what Python raises on SIGINT, wherever the eval is
            signal.raise_signal(signal.SIGTERM)
        return evaluate(*a, **kw)

    monkeypatch.setattr(train, name, eval_then_stop)
    expected = (pytest.raises(KeyboardInterrupt) if how == "Ctrl-C" else
                pytest.raises(train.TrainingPreempted, match=f"stopped by SIGTERM during the eval of iter {at}: "
                                                             f"checkpoint .*ckpt.pt at iter {at}"))
    with expected:
        run(data_dir, tmp_path / "stopped", eval_full_at_end=whole_split)
    monkeypatch.setattr(train, name, evaluate)
    saved = ckpt(tmp_path / "stopped")
    assert saved["iter_num"] == at and saved["eval_pending"] is True
    assert [r["iter"] for r in rows(tmp_path / "stopped")] == [it for it in (0, 3) if it < at]
    run(data_dir, tmp_path / "stopped", init_from="resume", eval_full_at_end=whole_split)
    assert_same_weights(tmp_path / "straight", tmp_path / "stopped")
    straight, resumed = rows(tmp_path / "straight"), rows(tmp_path / "stopped")
    assert [(r["iter"], r["val_loss"], r.get("val_loss_full")) for r in resumed] == [
        (r["iter"], r["val_loss"], r.get("val_loss_full")) for r in straight]
    assert train_rows(tmp_path / "stopped") == train_rows(tmp_path / "straight")  # every step's, once


def test_ctrl_c_during_the_first_eval_of_a_fresh_run_writes_no_checkpoint(data_dir, tmp_path, monkeypatch):
    """Nothing is trained before the eval of iter 0: Ctrl-C there leaves no checkpoint (nothing to resume)."""
    def interrupted(*a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(train, "estimate_loss", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run(data_dir, tmp_path / "stopped")
    assert not (tmp_path / "stopped" / "ckpt.pt").exists()


def wait_for_line(proc, text, timeout=120):
    """Read proc's stdout until a line contains text; the lines read. Fails if the process ends first."""
    lines, deadline = [], time.time() + timeout
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            pytest.fail(f"the run ended before logging {text!r}:\n" + "".join(lines[-20:]))
        lines.append(line)
        if text in line:
            return lines
    pytest.fail(f"no {text!r} within {timeout} s")


def stopped_at(out):
    """The iteration of the stop checkpoint, checked against the log line train.py printed."""
    it = ckpt(out)["iter_num"]
    assert f"checkpoint {out / 'ckpt.pt'} at iter {it};" in (out / "stdout.txt").read_text()
    return it


LONG = dict(max_iters=120, eval_interval=40, lr_decay_iters=120)  # ~1 s of steps: signalled near iter 5


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_a_signalled_process_exits_with_the_documented_status_and_resumes_exactly(data_dir, tmp_path, sig):
    out = tmp_path / "stopped"
    proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *args(data_dir, out, **LONG)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    try:
        lines = wait_for_line(proc, "iter 5:")
        proc.send_signal(sig)
        rest, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    (out / "stdout.txt").write_text("".join(lines) + rest)
    assert proc.returncode == preemption.EXIT_PREEMPTED == 144, rest[-2000:]
    it = stopped_at(out)
    assert 5 <= it < 120 and f"stopped by {sig.name} after iter {it}" in rest
    assert ckpt(out)["tokens"] == it * 128 and ckpt(out)["eval_pending"] == (it % 40 == 0)
    run(data_dir, out, init_from="resume", **LONG)
    run(data_dir, tmp_path / "straight", **LONG)
    assert_same_weights(tmp_path / "straight", out)
    assert [r["val_loss"] for r in rows(out)] == [r["val_loss"] for r in rows(tmp_path / "straight")]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The run of the two-rank case signalled during an eval: its first eval (iter 0) takes seconds, 8000 windows
LONG_EVAL = dict(max_iters=10, eval_interval=10, lr_decay_iters=10, eval_windows=8000)


def stop_two_ranks(data_dir, out, sig, signalled_rank, during_eval=False):
    """2 gloo ranks (the environment torchrun sets, without its agent, so that each rank's own exit status is
    seen) of the LONG run; once rank 0 logs iter 5, one rank gets sig (during_eval: the LONG_EVAL run, once rank
    0 logs its eval set, just before the eval of iter 0). -> (exit statuses, rank 0's output)."""
    port, procs = free_port(), []
    for rank in (0, 1):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
        run_args = args(data_dir, out, **(LONG_EVAL if during_eval else LONG))
        procs.append(subprocess.Popen([sys.executable, str(ROOT / "train.py"), *run_args],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      cwd=out.parent, env=env))
    try:
        lines = wait_for_line(procs[0], "eval set:" if during_eval else "iter 5:")
        procs[signalled_rank].send_signal(sig)
        outputs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    saved = ckpt(out) if (out / "ckpt.pt").exists() else {}
    return dict(codes=[p.returncode for p in procs], output="".join(lines) + outputs[0] + outputs[1],
                iter=saved.get("iter_num"), tokens=saved.get("tokens"), ranks=len(saved.get("rng", [])))


TWO_RANK_CASES = {"SIGTERM_to_rank_1": (signal.SIGTERM, 1, False), "SIGUSR1_to_rank_0": (signal.SIGUSR1, 0, False),
                  "SIGTERM_to_rank_1_during_an_eval": (signal.SIGTERM, 1, True)}


@pytest.fixture(scope="module")
def two_ranks(data_dir, tmp_path_factory):
    """Each case of TWO_RANK_CASES stopped, then one 2-rank launch that resumes them and runs the LONG and
    LONG_EVAL runs straight. -> (folder, {case: (exit statuses, output)})."""
    tmp = tmp_path_factory.mktemp("two_ranks")
    stops = {case: stop_two_ranks(data_dir, tmp / case, *how) for case, how in TWO_RANK_CASES.items()}
    keys = lambda case: LONG_EVAL if TWO_RANK_CASES[case][2] else LONG
    launch = [["train.py", *args(data_dir, tmp / case, init_from="resume", **keys(case))] for case in TWO_RANK_CASES]
    launch += [["train.py", *args(data_dir, tmp / "straight", **LONG)],
               ["train.py", *args(data_dir, tmp / "straight_eval", **LONG_EVAL)]]
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                             str(ROOT / "tests" / "torchrun_many.py"), *(json.dumps(c) for c in launch)],
                            capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    return tmp, stops


@pytest.mark.xdist_group("two_ranks")  # one worker makes the two_ranks launch once
@pytest.mark.parametrize("case", TWO_RANK_CASES)
def test_two_ranks_stop_together_when_one_is_signalled_and_resume_exactly(two_ranks, case):
    """One rank of 2 is signalled: both finish the step, rank 0 writes the checkpoint (both ranks' RNG states),
    both exit 144. A 2-rank resume then equals a 2-rank run never stopped, bit for bit."""
    tmp, stops = two_ranks
    stop, out = stops[case], tmp / case
    sig, signalled_rank, during_eval = TWO_RANK_CASES[case]
    assert stop["codes"] == [144, 144], stop["output"][-3000:]
    it = stop["iter"]  # the stop checkpoint's, read before the resume replaced it
    assert (it == 0 if during_eval else 5 <= it < 120) and stop["tokens"] == it * 128 and stop["ranks"] == 2
    who = sig.name if signalled_rank == 0 else "a stop signal to another rank"
    when = f"during the eval of iter {it}" if during_eval else f"after iter {it}"
    assert f"stopped by {who} {when}: checkpoint {out / 'ckpt.pt'} at iter {it};" in stop["output"]
    straight = tmp / ("straight_eval" if during_eval else "straight")
    assert_same_weights(straight, out)
    assert [r["val_loss"] for r in rows(out)] == [r["val_loss"] for r in rows(straight)]


def catches(pid, sig):
    """Whether process pid has a handler of its own for sig (Linux: /proc/PID/status's SigCgt mask)."""
    with open(f"/proc/{pid}/status") as f:
        mask = next(line.split()[1] for line in f if line.startswith("SigCgt:"))
    return int(mask, 16) >> (sig - 1) & 1


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 6-step run of a tiny dataset whose val split (194K tokens) takes eval.py --full seconds window
    by window, and whose meta.json lists its characters (bits per byte): (its out_dir, its train.py arguments)."""
    root = tmp_path_factory.mktemp("finished")
    folder = write_tiny_dataset(root / "data" / "tiny", val_repeats=2000)
    meta = json.loads((folder / "meta.json").read_text())
    (folder / "meta.json").write_text(json.dumps({**meta, "chars": [chr(48 + i) for i in range(64)]}))
    run(root / "data", root / "run")
    return root / "run", args(root / "data", root / "run")


STOPPED_MODES = {  # script and arguments after the run's out_dir; the signal
    "train.py eval_only": (["train.py", "--eval_only=True", "--init_from=resume", "--eval_windows=4000"],
                           signal.SIGTERM),
    "eval.py": (["eval.py", "--full", "--batch_size=1"], signal.SIGUSR1),  # still scoring when signalled
    "eval.py --full --json": (["eval.py", "--full", "--batch_size=1", "--json=scores/val.json"], signal.SIGTERM),
    "sample.py": (["sample.py", "--start=0", "--max_new_tokens=100000"], signal.SIGUSR1),  # "0": in the vocabulary
}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/PID/status")
@pytest.mark.parametrize("mode", STOPPED_MODES)
def test_a_stop_signal_ends_every_mode_with_the_documented_status(finished, mode, tmp_path):
    """A real signal to a real process, once its handler is in place: train.py --eval_only=True (an EvalStopped
    traceback and status 1), eval.py and sample.py (killed by the signal) end with one line and status 144, the
    status a requeueing wrapper reads; nothing is written."""
    out, train_args = finished
    script, *extra = STOPPED_MODES[mode][0]
    sig = STOPPED_MODES[mode][1]
    given = [*train_args, *extra] if script == "train.py" else [f"--out_dir={out}", *extra]
    before = sorted(os.listdir(out))
    proc = subprocess.Popen([sys.executable, str(ROOT / script), *given], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    try:
        while proc.poll() is None and not catches(proc.pid, sig):
            time.sleep(0.01)
        proc.send_signal(sig)
        output, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == preemption.EXIT_PREEMPTED == 144, output[-2000:]
    last = output.strip().splitlines()[-1]
    assert last == (f"stopped by {sig.name} during eval_only; nothing written" if script == "train.py" else
                    f"stopped by {sig.name}; run the same command again"), output[-2000:]
    assert "Traceback" not in output and sorted(os.listdir(out)) == before
    assert not (tmp_path / "scores" / "val.json").exists()
