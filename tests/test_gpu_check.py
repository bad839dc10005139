"""bench/gpu_check.sh, checked on the CPU before a GPU is ever lent: --cpu-smoke runs every step at tiny shapes
and each appends its row; the steps' limits fit the 8 minutes; a step that fails gets a row and the next runs;
without CUDA and --cpu-smoke it stops at once."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import model
from nlq import settings

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = (ROOT / "bench" / "gpu_check.sh").read_text()
STEPS = ["env", "bench linear", "correctness", "bench nonlinear", "graph_breaks", "ddp"]


def rows_of(out):
    return [json.loads(line) for line in (out / "gpu_check.jsonl").read_text().splitlines()]


def test_the_steps_run_in_order_within_480_seconds():
    """The linear baseline is the first measurement; the steps' own limits add up to 8 minutes at most."""
    steps = re.findall(r'^step ("[^"]+"|\S+) (\d+) ', SCRIPT, re.M)
    assert [name.strip('"') for name, _ in steps] == STEPS
    assert sum(int(limit) for _, limit in steps) <= 480


def test_cpu_smoke_runs_every_step_and_each_appends_its_row(tmp_path):
    result = subprocess.run(["bash", "bench/gpu_check.sh", "--cpu-smoke"], cwd=ROOT, capture_output=True, text=True,
                            timeout=400, env={**os.environ, "OUT": str(tmp_path), "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    rows = rows_of(tmp_path)
    assert [r["step"] for r in rows] == STEPS and all(r["ok"] for r in rows), rows
    env, linear, correctness, nonlinear, graphs, ddp = rows
    assert env["torch"] and env["commit"]
    assert linear["query_mode"] == "linear" and nonlinear["query_mode"] == ddp["query_mode"] == "nonlinear"
    assert all(r["tokens_per_s"] > 0 and r["peak_mem_mb"] > 0 for r in (linear, nonlinear, ddp))
    assert (ddp["parallel"], ddp["world_size"]) == ("ddp", 1)
    checks = correctness["checks"]
    assert set(checks) == {"float32_eager", "float32_compiled", "bfloat16_eager", "bfloat16_compiled"}
    assert all(0 < c["error"] <= c["bound"] for c in checks.values())
    assert checks["float32_eager"]["bound"] == 1e-4 < checks["bfloat16_eager"]["bound"]
    assert (graphs["graphs"], graphs["graph_breaks"]) == (1, 0)


def test_correctness_catches_a_recompute_that_is_off(monkeypatch):
    """f's checkpointed path made 10% off (a wrong recompute would be off by more): the compiled checks, which
    take that path on the CPU, fail in float32 and in bf16; the eager ones (f run plainly here) pass."""
    sys.path.insert(0, str(ROOT / "bench"))
    import gpu_check
    torch._dynamo.reset()
    monkeypatch.setattr(model, "checkpoint", lambda f, x, **k: 1.1 * checkpoint(f, x, **k))
    monkeypatch.setitem(model.QUERY_MODES, "plain_f", gpu_check.PlainF)  # (the check registers it; gone after)
    row = gpu_check.correctness(smoke=True)
    ok = {name: c["error"] <= c["bound"] for name, c in row["checks"].items()}
    assert ok == dict(float32_eager=True, float32_compiled=False, bfloat16_eager=True, bfloat16_compiled=False)
    assert not row["ok"]


def test_a_step_that_fails_gets_a_row_and_the_next_step_runs(tmp_path):
    """python3 replaced by one that fails every step at once: each step still leaves its row, in order."""
    stub = tmp_path / "bin" / "python3"
    stub.parent.mkdir()
    stub.write_text("#!/bin/sh\nexit 3\n")
    stub.chmod(0o755)
    result = subprocess.run(["bash", "bench/gpu_check.sh", "--cpu-smoke"], cwd=ROOT, capture_output=True, text=True,
                            timeout=60, env={**os.environ, "OUT": str(tmp_path / "out"),
                                             "PATH": f"{stub.parent}:{os.environ['PATH']}"})
    assert result.returncode == 0
    rows = rows_of(tmp_path / "out")
    assert [r["step"] for r in rows] == STEPS
    assert all(not r["ok"] and r["exit_status"] == 3 and r["timed_out"] is False for r in rows)


def test_without_cuda_it_stops_before_anything_runs(tmp_path):
    result = subprocess.run(["bash", "bench/gpu_check.sh"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "OUT": str(tmp_path / "out"), "CUDA_VISIBLE_DEVICES": ""})
    assert result.returncode == 2 and "no CUDA GPU here" in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("config", sorted((ROOT / "config").glob("*.py")), ids=lambda p: p.name)
def test_every_config_evaluates_in_whole_batches(config):
    """eval_windows a multiple of batch_size: a last, smaller eval batch is one more shape to compile (a third
    graph), which config/ladder_gpu.py had (400 windows of 32: a last batch of 16)."""
    cfg = settings.parse_config([str(config)])
    assert cfg["eval_windows"] % cfg["batch_size"] == 0, (cfg["eval_windows"], cfg["batch_size"])
