"""bench/gpu_check.sh, checked on the CPU before a GPU is ever lent: with python3 and nvidia-smi replaced by
stubs that record their arguments, the script runs its steps in order, each command's arguments are ones
the real scripts accept (parsed by their own parsers), a budget too small skips steps by name, and bad
BUDGET or STEPS values stop it before anything runs."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_sweep import command_lines

import bench
from nlq import settings

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import kv_cache  # noqa: E402
import saved_activations  # noqa: E402

STUB = """#!/usr/bin/env python3
import json, os, sys, time
with open(os.environ["GPU_CHECK_LOG"], "a") as f:
    f.write(json.dumps([os.path.basename(sys.argv[0])] + sys.argv[1:]) + "\\n")
if sys.argv[0].endswith("python3") and sys.argv[1] != "-c":  # a step: GPU_CHECK_STEP_S long (a measurement)
    time.sleep(float(os.environ.get("GPU_CHECK_STEP_S", 0)))
"""


def stubbed_env(tmp_path, **env):
    """The environment in which gpu_check.sh's python3 and nvidia-smi are stubs that log their arguments."""
    stubs = tmp_path / "bin"
    stubs.mkdir(exist_ok=True)
    for name in ("python3", "nvidia-smi"):
        (stubs / name).write_text(STUB.replace("#!/usr/bin/env python3", f"#!{sys.executable}"))
        (stubs / name).chmod(0o755)
    (tmp_path / "calls.jsonl").unlink(missing_ok=True)
    return {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "GPU_CHECK_LOG": str(tmp_path / "calls.jsonl"),
            "OUT": str(tmp_path / "out"), **env}


def run_script(tmp_path, **env):
    """Run gpu_check.sh with stubbed python3 and nvidia-smi -> (completed process, recorded python3 argvs)."""
    log = tmp_path / "calls.jsonl"
    result = subprocess.run(["bash", "bench/gpu_check.sh"], cwd=ROOT, env=stubbed_env(tmp_path, **env),
                            capture_output=True, text=True, timeout=60)
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return result, [c[1:] for c in calls if c[0] == "python3" and c[1] != "-c"]  # -c: the torch version line


def test_every_step_runs_in_order_with_arguments_the_scripts_accept(tmp_path, monkeypatch):
    result, calls = run_script(tmp_path)
    assert result.returncode == 0, result.stderr
    scripts = [c[0] for c in calls]
    assert scripts == ["bench/saved_activations.py"] + ["bench.py"] * 4 + ["bench/gpu_sanity.py",
                                                                             "bench/kv_cache.py"]
    assert "not run" not in result.stdout
    # saved_activations.py: its own parser (the counting itself replaced: it is what the GPU is for)
    monkeypatch.setattr(saved_activations, "saved_bytes_per_layer_token", lambda *a, **k: 1.0)
    saved_activations.main([a if a != "--device=cuda" else "--device=cpu" for a in calls[0][1:]])  # (no GPU here)
    assert "--device=cuda" in calls[0]
    # bench.py: the micro-batches in order of what they decide, each a config train.py would accept
    batches = []
    for call in calls[1:5]:
        opts, rest = bench.split_args(call[1:])
        cfg = settings.parse_config(rest)
        assert cfg["compile"] is True and opts["json"].endswith(f"bench_nlq_small_b{cfg['batch_size']}.json")
        batches.append((cfg["batch_size"], opts["query_modes"]))
    assert batches == [(12, "linear,identity,nonlinear"), (64, "linear,nonlinear"), (32, "linear,nonlinear"),
                       (16, "linear,nonlinear")]
    # kv_cache.py: its parser checks the shape and the prompt + new tokens against the block; the device is
    # checked on this machine's CPU instead of CUDA
    args = kv_cache.parse_args([a if a != "--device=cuda" else "--device=cpu" for a in calls[-1][1:]])
    assert (args.n_layer, args.n_embd, args.block_size, args.dtype) == (12, 768, 1024, "bfloat16")
    steps_log = (tmp_path / "out" / "steps.log").read_text()
    assert steps_log.count("ended with status 0") == 7


def test_a_small_budget_skips_steps_by_name_and_steps_selects_them(tmp_path):
    result, calls = run_script(tmp_path, BUDGET="0")
    assert result.returncode == 0 and calls == []
    assert ("not run, the budget of 0s would not hold them: 1:saved_activations.md 2:bench_nlq_small_b12.md "
            "3:bench_nlq_small_b64.md 3:bench_nlq_small_b32.md 3:bench_nlq_small_b16.md 4:gpu_sanity.md "
            "5:kv_cache.md") in result.stdout
    result, calls = run_script(tmp_path, STEPS="4,5")
    assert [c[0] for c in calls] == ["bench/gpu_sanity.py", "bench/kv_cache.py"]


@pytest.mark.parametrize("env,message", [({"BUDGET": "ten"}, "BUDGET=ten: give whole seconds"),
                                         ({"STEPS": "3;6"}, "STEPS=3;6: give step numbers 1-5")])
def test_bad_settings_stop_before_anything_runs(tmp_path, env, message):
    result, calls = run_script(tmp_path, **env)
    assert result.returncode == 2 and message in result.stderr
    assert calls == [] and not (tmp_path / "out").exists()


def test_a_signal_stops_the_step_under_way_too(tmp_path):
    """Killed while a step ran, the script went and left the step's benchmark on the GPU (up to its timeout):
    now the step's processes get the signal too, and steps.log says where it stopped."""
    env = stubbed_env(tmp_path, GPU_CHECK_STEP_S="60")
    script = subprocess.Popen(["bash", "bench/gpu_check.sh"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    steps_log = tmp_path / "out" / "steps.log"
    deadline = time.time() + 30
    while not (steps_log.exists() and "== step 1" in steps_log.read_text()) and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)  # the step's stub is asleep now
    stub = [pid for pid, cmd in command_lines().items() if str(tmp_path / "bin" / "python3") in cmd]
    assert len(stub) == 1
    script.send_signal(signal.SIGTERM)
    assert script.wait(timeout=30) == 130
    deadline = time.time() + 10
    while stub[0] in command_lines() and time.time() < deadline:
        time.sleep(0.1)
    assert stub[0] not in command_lines()  # the step's process ended with the script
    assert steps_log.read_text().splitlines()[-1].startswith("== stopped by a signal after ")


def test_without_cuda_it_stops_before_anything_runs(tmp_path):
    """On a machine without CUDA it ran every step on the CPU, each to its timeout (minutes of nothing)."""
    env = {k: v for k, v in os.environ.items() if k != "PATH"}
    env.update(PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}", OUT=str(tmp_path / "out"),
               CUDA_VISIBLE_DEVICES="")  # this machine's real python3, with no GPU to see
    result = subprocess.run(["bash", "bench/gpu_check.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2 and "no CUDA GPU here (torch.cuda.is_available() is False)" in result.stderr
    assert not (tmp_path / "out").exists()
