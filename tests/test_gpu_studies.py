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


def budget(study, arm, final=True):
    """(tokens, total parameters) of a final (or selection) run of an arm (GPT-2's vocabulary, OpenWebText's)."""
    cfg = nlq_study.arm_config(study, arm, final)
    return nlq_study.run_tokens(cfg), settings.param_counts(settings.model_config(cfg))["total"]


def dry_run_hours(name, capsys):
    """The dry run's text and its total GPU-hours (fewest, most)."""
    sweep.main([str(ROOT / "studies" / f"{name}.py"), "--dry_run"])
    dry = capsys.readouterr().out
    found = re.search(r"The (?:study|ladder): [\d-]+ runs, ([\d.,]+)-([\d.,]+) GPU-hours", dry)
    return dry, tuple(float(x.replace(",", "")) for x in found.groups())


def tuned_alike(study):
    assert len(study["selection_seeds"]) >= 2 and study["stall_margin"] == 2 and len(study["seeds"]) >= 3
    assert not set(study["selection_seeds"]) & set(study["seeds"])


def test_the_paper_claim_tuned_alike_at_the_papers_horizon(capsys):
    """GPT-3 small (124M) at the paper's 60,000 x 491,520 tokens for the final runs, a twentieth for the search
    over learning rate x weight decay, the same for linear, linear + QK-norm and nonlinear."""
    study = load("paper_claim_gpu")
    tuned_alike(study)
    assert set(study["groups"]) == {"linear", "linear_qknorm", "nonlinear"}
    assert study["also_search"] == {"weight_decay": [0.05, 0.1, 0.2]}
    for group, variants in study["groups"].items():
        assert len(variants) == 3 and all(study["grids"][v] == [6e-4, 1.2e-3, 2.4e-3] for v in variants)
    tokens, params = budget(study, "nonlinear.weight_decay0.1")
    assert tokens == 60000 * 491520 and params == pytest.approx(124.4e6, rel=0.01)
    assert budget(study, "linear.weight_decay0.1", final=False)[0] * 20 == tokens
    dry, (fewest, most) = dry_run_hours("paper_claim_gpu", capsys)
    assert "budget of a final run (linear.weight_decay0.05): 29,491,200,000 tokens = 237.1 tokens per parameter" in dry
    assert "= 347.1 per non-embedding parameter" in dry
    assert 240 < fewest < most < 300  # 9 final runs (167 GPU-hours) and 90-126 selection runs
    print(f"paper_claim_gpu: {fewest}-{most} GPU-hours")


def test_the_training_length_ladder(capsys):
    """One model (6 x 384) at 20, 80 and 320 tokens per parameter, each budget its own search at a quarter of it."""
    ladder = load("length_gpu")
    sizes = set()
    for want, study in zip((20, 80, 320), ladder["rungs"].values()):
        tuned_alike(study)
        tokens, params = budget(study, "linear")
        sizes.add(params)
        assert tokens / params == pytest.approx(want, rel=0.001)
        assert budget(study, "linear", final=False)[0] / tokens == pytest.approx(0.25, rel=0.001)
    assert len(sizes) == 1  # one model: the report's axis is training tokens
    dry, (fewest, most) = dry_run_hours("length_gpu", capsys)
    assert "| 320tpp | 30,331,776 | 10,621,824 | 9,706,143,744 | 320.0 | 913.8 |" in dry
    assert 25 < fewest < most < 50
    print(f"length_gpu: {fewest}-{most} GPU-hours")


def test_the_size_ladder(capsys):
    """5 sizes spanning 48x in non-embedding parameters up to GPT-3 small's 124M in all, each final run on 20
    tokens per parameter (Chinchilla's ratio on Chinchilla's count), selection runs a quarter of it."""
    ladder = load("ladder_gpu")
    non_embedding = []
    for study in ladder["rungs"].values():
        tuned_alike(study)
        assert list(study["arms"]) == ["linear", "linear_qknorm", "nonlinear"]
        cfg = nlq_study.arm_config(study, "linear")
        assert cfg["n_embd"] // cfg["n_head"] == 64 and cfg["eval_full_at_end"]
        tokens, params = budget(study, "linear")
        assert tokens / params == pytest.approx(20, rel=0.001)
        assert budget(study, "linear", final=False)[0] / tokens == pytest.approx(0.25, rel=0.001)
        non_embedding.append(settings.param_counts(settings.model_config(cfg))["non_embedding"])
    assert len(non_embedding) == 5 and non_embedding[-1] / non_embedding[0] > 45 and params > 124e6
    dry, (fewest, most) = dry_run_hours("ladder_gpu", capsys)
    assert all(f"## rung {rung}" in dry for rung in ladder["rungs"])
    assert "| 12x768 | 124,373,760 | 84,953,856 | 2,487,582,720 | 20.0 | 29.3 |" in dry
    assert "Trend power: 79% of ladders of these 5 rungs x 3 seeds" in dry  # 43% without the 4x192 rung
    assert 25 < fewest < most < 50
    print(f"ladder_gpu: {fewest}-{most} GPU-hours")
