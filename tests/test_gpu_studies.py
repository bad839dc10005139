"""The three GPU studies, checked as sweep.py reads them and costed by its dry run (GPU-hours at the committed
one-H200 speeds): the paper's claim against a baseline tuned as hard (studies/paper_claim_gpu.py), the training-
length ladder (studies/length_gpu.py) and the size ladder (studies/ladder_gpu.py). Each states its token budget
in tokens per parameter on total parameters (the convention), tunes on two selection seeds with the stall rule,
and runs its final seeds paired."""
import re

import pytest
from conftest import ROOT

from nlq import settings
from research import sweep
from research import study as nlq_study


def load(name):
    return nlq_study.load_study(str(ROOT / "studies" / f"{name}.py"))


def budget(study, arm):
    """(tokens, total parameters) of a final run of an arm (GPT-2's vocabulary, OpenWebText's)."""
    cfg = nlq_study.arm_config(study, arm)
    return nlq_study.run_tokens(cfg), settings.param_counts(settings.model_config(cfg))["total"]


def dry_run_hours(name, capsys):
    """The dry run's text and its total GPU-hours (fewest, most)."""
    sweep.main([str(ROOT / "studies" / f"{name}.py"), "--dry_run"])
    dry = capsys.readouterr().out
    found = re.search(r"The (?:study|ladder): [\d-]+ runs, ([\d.,]+)-([\d.,]+) GPU-hours", dry)
    return dry, tuple(float(x.replace(",", "")) for x in found.groups())


def searched_at(study, tokens):
    """The horizons of a study's search as fractions of a final run's tokens; warmup 5% of every run."""
    cfgs = [nlq_study.arm_config(sub, "linear") for sub in study["horizon_studies"].values()]
    assert all(cfg["warmup_iters"] == round(0.05 * nlq_study.arm_config(study, "linear")["max_iters"] * cfg["max_iters"]
                                            / nlq_study.arm_config(study, "linear")["max_iters"]) for cfg in cfgs)
    return [nlq_study.run_tokens(cfg) / tokens for cfg in cfgs]


def tuned_alike(study):
    assert len(study["selection_seeds"]) >= 2 and study["stall_margin"] == 2 and len(study["seeds"]) >= 3
    assert not set(study["selection_seeds"]) & set(study["seeds"])


def test_the_paper_claim_tuned_alike_at_the_papers_horizon(capsys):
    """GPT-3 small (124M) at the paper's 60,000 x 491,520 tokens for the final runs, the rate searched at 1/20 and
    1/10 of it (warmup 1/30 of every run) and carried there, the same for linear, linear + QK-norm and nonlinear;
    weight decay the paper's 0.1 everywhere."""
    study = load("paper_claim_gpu")
    tuned_alike(study)
    assert study["grids"] == dict.fromkeys(["linear", "linear_qknorm", "nonlinear"], [6e-4, 1.2e-3, 2.4e-3])
    tokens, params = budget(study, "nonlinear")
    assert tokens == 60000 * 491520 and params == pytest.approx(124.4e6, rel=0.01)
    for h, sub in zip((3000, 6000), study["horizon_studies"].values()):
        cfg = nlq_study.arm_config(sub, "linear")
        assert (cfg["max_iters"], cfg["lr_decay_iters"], cfg["warmup_iters"], cfg["eval_interval"]) == (
            h, h, h // 30, h // 12) and cfg["weight_decay"] == 0.1
    dry, (fewest, most) = dry_run_hours("paper_claim_gpu", capsys)
    assert "budget of a final run (linear): 29,491,200,000 tokens = 237.1 tokens per parameter" in dry
    assert "budget of a 3,000-step selection run (linear): 1,474,560,000 tokens = 11.9 tokens" in dry
    assert "| arm | lr* at 3,000 steps | lr* at 6,000 steps | β [95% CI] | carried to 60,000 steps [95% CI] |" in dry
    assert 240 < fewest < most < 300  # 9 final runs (167 GPU-hours) and 60-84 selection runs
    print(f"paper_claim_gpu: {fewest}-{most} GPU-hours")


def test_the_training_length_ladder(capsys):
    """One model (6 x 384) at 20, 80 and 320 tokens per parameter, each budget its own search at 1/16 and 1/8 of
    it, carried to it."""
    ladder = load("length_gpu")
    sizes = set()
    for want, study in zip((20, 80, 320), ladder["rungs"].values()):
        tuned_alike(study)
        tokens, params = budget(study, "linear")
        sizes.add(params)
        assert tokens / params == pytest.approx(want, rel=0.001)
        assert searched_at(study, tokens) == pytest.approx([1 / 16, 1 / 8], rel=0.002)
    assert len(sizes) == 1  # one model: the report's axis is training tokens
    dry, (fewest, most) = dry_run_hours("length_gpu", capsys)
    assert "| 320tpp | 30,331,776 | 10,621,824 | 9,706,143,744 | 320.0 | 913.8 |" in dry
    assert 25 < fewest < most < 50
    print(f"length_gpu: {fewest}-{most} GPU-hours")


def test_the_size_ladder(capsys):
    """5 sizes spanning 48x in non-embedding parameters up to GPT-3 small's 124M in all, each final run on 20
    tokens per parameter (Chinchilla's ratio on Chinchilla's count), the search at 1/16 and 1/8 of it."""
    ladder = load("ladder_gpu")
    non_embedding = []
    for study in ladder["rungs"].values():
        tuned_alike(study)
        assert list(study["arms"]) == ["linear", "linear_qknorm", "nonlinear"]
        cfg = nlq_study.arm_config(study, "linear")
        assert cfg["n_embd"] // cfg["n_head"] == 64 and cfg["eval_full_at_end"]
        tokens, params = budget(study, "linear")
        assert tokens / params == pytest.approx(20, rel=0.001)
        assert searched_at(study, tokens) == pytest.approx([1 / 16, 1 / 8], rel=0.002)
        non_embedding.append(settings.param_counts(settings.model_config(cfg))["non_embedding"])
    assert len(non_embedding) == 5 and non_embedding[-1] / non_embedding[0] > 45 and params > 124e6
    dry, (fewest, most) = dry_run_hours("ladder_gpu", capsys)
    assert all(f"## rung {rung}" in dry for rung in ladder["rungs"])
    assert "| 12x768 | 124,373,760 | 84,953,856 | 2,487,582,720 | 20.0 | 29.3 |" in dry
    assert "Trend power: 79% of ladders of these 5 rungs x 3 seeds" in dry  # 43% without the 4x192 rung
    assert 25 < fewest < most < 50
    print(f"ladder_gpu: {fewest}-{most} GPU-hours")
