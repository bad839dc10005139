"""A scaling ladder: one study at several model sizes (a study file with rungs). On the CPU, a tiny ladder (three
sizes, two arms, two paired seeds) goes through sweep.py (its dry run, then its runs) and report.py (the gap
against size in nats and in %, its fit, the multiplier, the probe's plot, a section per rung); the GPU ladder's
study file, its dry run and its pilot's commands are checked as the real scripts parse them."""
import json
import sys

import pytest
from conftest import ROOT, write_tiny_dataset

import bench
from nlq import settings
from research import paired, report, sweep
from research import study as nlq_study

sys.path.insert(0, str(ROOT / "bench"))
import ladder_pilot  # noqa: E402

LADDER = """# a tiny ladder: three sizes, each arm at one given rate
name = 'tiny_ladder'
config = {config!r}
overrides = {{}}
runs_dir = {runs!r}
arms = {{'linear': dict(query_mode='linear'), 'nonlinear': dict(query_mode='nonlinear')}}
selection_seeds = []
seeds = [1, 2]
rungs = {{'1x16': dict(n_layer=1, n_head=2, n_embd=16, learning_rates=[1e-2]),
          '2x32': dict(n_layer=2, n_head=2, n_embd=32, learning_rates=[1e-2]),
          '2x48': dict(n_layer=2, n_head=2, n_embd=48, learning_rates=[1e-2])}}
"""


@pytest.fixture
def tiny_ladder(tmp_path):
    write_tiny_dataset(tmp_path / "data" / "tiny")
    config = tmp_path / "tiny.py"
    config.write_text(f"data_dir = {str(tmp_path / 'data')!r}\ndataset = 'tiny'\nblock_size = 16\nbatch_size = 4\n"
                      "gradient_accumulation_steps = 1\nmax_iters = 20\nwarmup_iters = 2\neval_interval = 10\n"
                      "eval_windows = 8\nlog_interval = 10\ndevice = 'cpu'\ncompile = False\n")
    path = tmp_path / "ladder.py"
    path.write_text(LADDER.format(config=str(config), runs=str(tmp_path / "runs")))
    return path


def test_a_tiny_ladder_runs_and_reports_the_gap_against_size(tiny_ladder, tmp_path, capsys):
    ladder = nlq_study.load_study(str(tiny_ladder))
    assert list(ladder["rungs"]) == ["1x16", "2x32", "2x48"]
    small, large = ladder["rungs"]["1x16"], ladder["rungs"]["2x32"]
    assert small["runs_dir"] == str(tmp_path / "runs" / "1x16")
    assert (nlq_study.arm_config(small, "nonlinear")["n_embd"], nlq_study.arm_config(large, "linear")["n_layer"]) \
        == (16, 2)
    sweep.main([str(tiny_ladder), "--dry_run", "--tokens_per_s", "1000"])
    dry = capsys.readouterr().out
    assert "## rung 1x16" in dry and "## rung 2x48" in dry
    assert dry.count("data: ") == dry.count("finished: runs done") == dry.count("per second per") == 1  # once
    params = {rung: settings.param_counts(settings.model_config(nlq_study.arm_config(s, "linear"), 64))
              for rung, s in ladder["rungs"].items()}
    for rung, n in params.items():  # the budget both ways: per parameter (total, the tiny data's 64 tokens) and
        assert (f"| {rung} | {n['total']:,} | {n['non_embedding']:,} | 1,280 | {1280 / n['total']:.1f} | "
                f"{1280 / n['non_embedding']:.1f} | ") in dry  # per non-embedding parameter
    assert "| **all** | | | | | | | 12 |" in dry and "The ladder: 12 runs" in dry  # 3 rungs x 2 arms x 2 seeds
    sizes = [n["non_embedding"] for n in params.values()]
    assert (f"Trend power: {paired.trend_power(sizes, 2, -0.025, 0.014):.0%} of ladders of these 3 rungs x 2 seeds "
            f"find a gap that changes by -0.025 nats per 10x non-embedding parameters") in dry
    sweep.main([str(tiny_ladder), "--jobs", "2", "--threads", "1"])
    assert all(nlq_study.is_finished(s, arm, 1e-2, seed) for s in ladder["rungs"].values() for arm in s["arms"]
               for seed in (1, 2))
    text = report.main([str(tiny_ladder), "--out", str(tmp_path / "report")])
    assert "## The gap against model size" in text and "![gap against size](gap_vs_size.png)" in text
    finals = {(rung, arm, seed): json.loads((tmp_path / "runs" / rung / arm / f"lr0.01_seed{seed}" / "metrics.jsonl")
                                            .read_text().splitlines()[-1])["val_loss_full"]
              for rung in params for arm in ("linear", "nonlinear") for seed in (1, 2)}
    for rung, n in params.items():  # the gap in nats and in % of linear's mean loss, from the runs themselves
        diffs = [finals[rung, "nonlinear", s] - finals[rung, "linear", s] for s in (1, 2)]
        ref = (finals[rung, "linear", 1] + finals[rung, "linear", 2]) / 2
        mean = sum(diffs) / 2
        assert (f"| nonlinear − linear | {rung} | {n['non_embedding']:,} | {mean:+.4f} (n=2) | "
                f"[") in text and f"| {mean / ref * 100:+.2f}% [" in text
    assert "- **nonlinear − linear**: " in text and "across the 3 rungs Δ changes by " in text
    assert "per 10× non-embedding parameters (least squares over the 3 rungs' mean Δ, t on 1 df)" in text
    assert "To reach nonlinear's loss, linear would need M times the non-embedding parameters: " in text
    assert "## Rung 1x16: 1 × 16, 1,280 tokens a final run" in text and "## Rung 2x32: 2 × 32" in text
    for png in ("gap_vs_size.png", "probe_1x16.png", "probe_2x48.png"):  # the probe: every run wrote its columns
        assert (tmp_path / "report" / png).read_bytes().startswith(b"\x89PNG")
    assert "![probe of rung 2x48](probe_2x48.png)" in text
    capsys.readouterr()
    sweep.main([str(tiny_ladder)])  # nothing is due any more, rung by rung
    assert capsys.readouterr().out.count("nothing to run") == 3
    sweep.main([str(tiny_ladder), "--rung", "2x32"])
    assert capsys.readouterr().out.count("nothing to run") == 1
    with pytest.raises(ValueError, match="--rung 3x64: the study's rungs are 1x16, 2x32, 2x48"):
        sweep.main([str(tiny_ladder), "--rung", "3x64"])


def test_the_gpu_ladders_pilot_runs_the_smallest_rungs_selection_runs():
    """bench/ladder_pilot.py: its commands are ones bench.py and train.py accept, one bench per rung of
    studies/ladder_gpu.py, and its runs the smallest rung's selection runs (tests/test_gpu_studies.py checks the
    ladder itself)."""
    ladder = nlq_study.load_study(str(ROOT / "studies" / "ladder_gpu.py"))
    steps = ladder_pilot.commands("OUT", "data", "enwiki_gpt2")
    benches = [argv for name, _, argv in steps if name.startswith("bench")]
    trains = [argv for name, _, argv in steps if name.startswith("train")]
    assert len(benches) == len(ladder["rungs"]) and len(trains) == 4
    for argv in benches:
        opts, rest = bench.split_args(argv[2:])
        assert settings.parse_config(rest)["compile"] is True and opts["query_modes"] == "linear,nonlinear"
    smallest = list(next(iter(ladder["rungs"].values()))["horizon_studies"].values())[-1]  # its longest horizon
    for argv in trains:
        cfg = settings.parse_config(argv[2:])
        assert cfg["seed"] in smallest["selection_seeds"]
        study_cfg = nlq_study.run_config(smallest, cfg["query_mode"], cfg["learning_rate"], cfg["seed"])
        same = lambda c: {k: v for k, v in c.items() if k not in ("out_dir", "data_dir", "dataset", "compile")}
        assert same(cfg) == same(study_cfg) and cfg["dataset"] == "enwiki_gpt2"


def test_a_ladder_reading_that_lost_pairs_to_flags_says_so():
    """A rung's flagged pair is left out of its Δ (report.unflagged_gap, LADDER_FLAGS) and counted; a trend that
    then finds no change says it has less power than the design, not that there is none."""
    finals = lambda losses, flagged=None: dict(finals={s: dict(final=v, flag="stalled" if s == flagged else None)
                                                       for s, v in enumerate(losses)})
    ref = [3.9, 3.91, 3.92]
    points = [(f"r{i}", x, report.unflagged_gap(finals([r + d for r, d in zip(ref, gaps)], flagged), finals(ref)))
              for i, (x, gaps, flagged) in enumerate([(10**6, (0.01, -0.01, 0.5), 2), (10**7, (0.03, 0.01, 0.02), None),
                                                      (10**8, (0.0, 0.01, -0.01), None)])]
    assert [d["left_out"] for _, _, d in points] == [1, 0, 0] and points[0][2]["n"] == 2
    text = report.ladder_reading({("nonlinear", "linear"): points}, None, "non-embedding parameters",
                                 {10**6: 1e12, 10**7: 1e14, 10**8: 1e16})
    assert "no change along the rungs is supported (its CI includes 0) (1 flagged pairs left out: less power " \
           "than the design, not evidence of none)" in text
    row = report.ladder_table({("nonlinear", "linear"): points}, None, "x").splitlines()[2]
    assert row.startswith("| nonlinear − linear | r0 | 1,000,000 | +0.0000 (n=2) |") and row.endswith(" | 1 |")
