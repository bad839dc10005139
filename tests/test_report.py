"""report.py: paired statistics checked by hand on made-up run files, the learning-rate search table,
plots."""
import importlib
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

from nlq import settings
from research import compare, paired, report, sweep
from research import study as nlq_study  # study.py (a study's runs and its search)

# Two made-up comparisons with the reference arm "linear", final seeds 11, 12, 13 (final losses, nats/token).
LINEAR = {11: 2.00, 12: 2.10, 13: 2.20}
# paired: d = (-0.02, -0.015, -0.03), a consistent small gain under a large shared seed effect
PAIRED_WINS = {11: 1.98, 12: 2.085, 13: 2.17}
# unpaired: arm means 1.97 vs 2.02 with tiny spreads, but per-seed differences (-0.01, -0.05, -0.09) scatter
LINEAR_2 = {11: 2.00, 12: 2.02, 13: 2.04}
WELCH_WINS = {11: 1.99, 12: 1.97, 13: 1.95}


def write_run(study, arm, lr, seed, final, max_iters=100, diverged=False):
    """A finished (or diverged, or unfinished when final is None) run's metrics.jsonl and config.json."""
    out = nlq_study.run_dir(study, arm, lr, seed)
    os.makedirs(out, exist_ok=True)
    rows = [dict(iter=0, tokens=0, val_loss=5.5, ms_per_iter=None)]
    if diverged:
        rows.append(dict(iter=50, tokens=50 * 64, train_loss=None, diverged=True))
    elif final is None:
        rows.append(dict(iter=50, tokens=50 * 64, val_loss=3.0, ms_per_iter=10.0))
    else:
        rows += [dict(iter=50, tokens=50 * 64, val_loss=final + 0.5, ms_per_iter=10.0),
                 dict(iter=max_iters, tokens=max_iters * 64, val_loss=final + 0.01, val_loss_full=final,
                      ms_per_iter=12.0)]
    with open(os.path.join(out, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump({**nlq_study.run_config(study, arm, lr, seed), "dataset_meta": dict(tokenizer="byte")}, f)


def make_study(tmp_path, ref=LINEAR, wins=PAIRED_WINS, welch=WELCH_WINS, header="# Toy study.\n"):
    """A study of 3 arms; every arm's search (seed 1) picks 2e-3, an interior rate; final seeds 11-13."""
    (tmp_path / "cfg.py").write_text(f"data_dir = {str(tmp_path / 'data')!r}\ndataset = 'toy'\nn_layer = 1\n"
                                     "n_head = 2\nn_embd = 16\nblock_size = 8\nmax_iters = 100\n"
                                     "device = 'cpu'\n")
    path = tmp_path / "toy_study.py"
    path.write_text(header + f"name = 'toy'\nconfig = {str(tmp_path / 'cfg.py')!r}\noverrides = {{}}\n"
                    "arms = {'linear': {}, 'paired_wins': {'query_mode': 'nonlinear'}, "
                    "'welch_wins': {'query_mode': 'identity'}}\nlearning_rates = [1e-3, 2e-3, 4e-3]\n"
                    "selection_seeds = [1]\nseeds = [11, 12, 13]\nhalf_steps = False\n"
                    f"runs_dir = {str(tmp_path / 'runs')!r}\n")
    study = nlq_study.load_study(str(path))
    for arm, finals in (("linear", ref), ("paired_wins", wins), ("welch_wins", welch)):
        for lr, loss in ((1e-3, 2.5), (2e-3, 2.3), (4e-3, 2.4)):
            write_run(study, arm, lr, 1, loss)
        for seed, loss in finals.items():
            write_run(study, arm, 2e-3, seed, loss)
    return path, study


def test_paired_statistics_by_hand():
    # case 1: d = (-0.02, -0.015, -0.03); mean -0.021667, sd 0.0076376 (ddof 1), t(0.975, df 2) = 4.302653
    pd = report.paired_difference(PAIRED_WINS, LINEAR)
    half = 4.302653 * 0.0076376 / math.sqrt(3)
    assert pd["n"] == 3 and pd["mean"] == pytest.approx(-0.021667, abs=1e-6)
    assert pd["sd"] == pytest.approx(0.0076376, abs=1e-7)
    assert pd["ci"] == pytest.approx((-0.021667 - half, -0.021667 + half), abs=1e-5)  # [-0.04064, -0.00269]
    t = -0.021667 / (0.0076376 / math.sqrt(3))  # -4.9135; for df = 2, p = 1 - |t| / sqrt(t^2 + 2)
    assert pd["p"] == pytest.approx(1 - abs(t) / math.sqrt(t * t + 2), abs=1e-4)  # 0.0390
    assert report.verdict(pd["ci"]) == "lower"
    assert report.welch_p(list(PAIRED_WINS.values()), list(LINEAR.values())) > 0.7  # unpaired: nothing
    # case 2: d = (-0.01, -0.05, -0.09); mean -0.05, sd 0.04 -> CI [-0.1494, 0.0494] includes 0
    pd = report.paired_difference(WELCH_WINS, LINEAR_2)
    assert pd["ci"] == pytest.approx((-0.05 - 4.302653 * 0.04 / math.sqrt(3),
                                      -0.05 + 4.302653 * 0.04 / math.sqrt(3)), abs=1e-5)
    assert report.verdict(pd["ci"]) == "no call"
    # Welch: means 1.97 vs 2.02, both sd 0.02, n 3: t = 0.05 / sqrt(2 * 0.0004 / 3) = 3.0619, df = 4 exactly;
    # for df = 4, two-sided p = 1 - x (3 - x^2) / 2 with x = |t| / sqrt(t^2 + 4)
    t = 0.05 / math.sqrt(2 * 0.0004 / 3)
    x = t / math.sqrt(t * t + 4)
    p = report.welch_p(list(WELCH_WINS.values()), list(LINEAR_2.values()))
    # 0.0376: the unpaired rule calls it
    assert p == pytest.approx(1 - x * (3 - x * x) / 2, abs=1e-6) and p < 0.05


def test_paired_uses_only_shared_seeds_and_needs_two():
    pd = report.paired_difference({11: 1.0, 12: 2.0, 14: 9.0}, {11: 1.5, 12: 2.25, 13: 0.0})
    assert pd["seeds"] == [11, 12] and pd["diffs"] == pytest.approx([-0.5, -0.25])
    assert pd["mean"] == pytest.approx(-0.375)
    one = report.paired_difference({11: 1.0}, {11: 1.5})
    assert one["n"] == 1 and one["ci"] is None and one["p"] is None and report.verdict(one["ci"]) == "n < 2"
    assert report.welch_p([1.0], [2.0, 3.0]) is None


def test_report_tables_from_run_files(tmp_path, capsys):
    path, study = make_study(tmp_path)
    out = tmp_path / "results"
    text = report.main([str(path), "--out", str(out)])
    assert (out / "README.md").read_text() == text
    for png in ("forest.png", "val_loss.png"):
        assert (out / png).read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    # each arm's row of the results table (its first), then of the stalls table
    rows = {line.split(" | ")[0][2:]: line for line in reversed(text.splitlines()) if line.startswith("| ")}
    stalls = text.split("**Stalls (final runs; Method).**")[1]
    assert "| linear | none | 0 of 3: 0% [0%, 71%] | — |" in stalls
    assert "| 0.002 | 2.1000 ± 0.1000 (3) | 0 of 3 | 3.0297 | — | — |" in rows["linear"]
    assert "| -0.0217 (n=3) | [-0.0406, -0.0027] | -1.03% | 0.039 | 0.799 | lower |" in rows["paired_wins"]
    # welch_wins against LINEAR (not LINEAR_2): d = (-0.01, -0.13, -0.25), CI includes 0; beside it the robust
    # summaries: the median of the Walsh averages (-0.25, -0.19, -0.13, -0.13, -0.07, -0.01), no CI at n = 3, and
    # the signed-rank p of 3 negative differences, 2 / 2^3
    assert rows["welch_wins"].endswith("| no call | -0.1300 (no CI at n ≤ 5) | 0.25 |")
    assert "**A difference is called only when its 95% CI excludes 0**" in text
    assert "selection seeds [1]" in text and "final seeds [11, 12, 13]" in text
    assert "| 0.002 | **2.3000** | **2.3000** | **2.3000** |" in text  # the search table, chosen rate in bold
    assert "All 18 runs finished." in text  # every arm's search is complete: no "so far"
    assert "note:" not in capsys.readouterr().out  # no final run left out
    # the gap along training: val loss on the fixed windows is final + 0.5 at iter 50 and final + 0.01 at 100,
    # so the paired Δ and its CI there equal the final ones
    gap = text.split("## The gap along training")[1].split("## Runs")[0]
    assert "| iter | paired_wins − linear | welch_wins − linear |" in gap
    for it in (50, 100):
        assert f"| {it} | -0.0217 [-0.0406, -0.0027] (n=3) | -0.1300 [" in gap


def test_final_runs_left_out_are_named_on_the_console(tmp_path, capsys):
    """A final run whose log is empty or cut short (in progress, or damaged) leaves the statistics on fewer
    seeds: the console says which runs, not only the README (a committed report was rebuilt on n=2 quietly)."""
    path, study = make_study(tmp_path)
    open(os.path.join(nlq_study.run_dir(study, "linear", 0.002, 12), "metrics.jsonl"), "w").close()
    text = report.main([str(path), "--out", str(tmp_path / "results")])
    assert "| 0.002 | 2.1000 ± 0.1414 (2) |" in text
    out = capsys.readouterr().out
    assert ("note: 1 final run(s) not finished, left out of the statistics: linear seed 12 (missing); finish "
            f"them with python -m research.sweep {path}") in out


def test_reading_is_kept_across_rebuilds(tmp_path):
    path, _ = make_study(tmp_path)
    out = tmp_path / "results"
    out.mkdir()
    (out / "reading.md").write_text("paired_wins is lower, CI [-0.0406, -0.0027].\n")
    text = report.main([str(path), "--out", str(out)])
    reading = "## Reading\n\npaired_wins is lower, CI [-0.0406, -0.0027].\n\n## "
    assert "![val loss](val_loss.png)\n\n" + report.CURVES_CAPTION + "\n\n" + reading in text
    assert "band their min–max" in report.CURVES_CAPTION and "(`--jobs`)" in report.CURVES_CAPTION
    again = report.main([str(path), "--out", str(out)])  # a rebuild keeps it once, unchanged
    assert again.count("## Reading") == 1 and (out / "reading.md").read_text().strip() in again


def test_a_rebuild_of_the_same_runs_leaves_the_files_as_they_are(tmp_path, monkeypatch, capsys):
    """Rebuilt from runs that did not change, a report differs only in its README's 'Generated <date>' line:
    the committed files are left as they are (git stays clean); a changed reading rewrites the README only."""
    path, _ = make_study(tmp_path)
    out = tmp_path / "results"
    report.main([str(path), "--out", str(out)])
    capsys.readouterr()
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    generated = [line for line in before["README.md"].decode().splitlines() if line.startswith("Generated ")]
    assert len(generated) == 1 and compare.GENERATED.match(generated[0])
    real_datetime = report.datetime.datetime
    class Later(real_datetime):
        @classmethod
        def now(cls, tz=None):
            return real_datetime(2031, 1, 2, 3, 4, tzinfo=tz)
    monkeypatch.setattr(report.datetime, "datetime", Later)
    report.main([str(path), "--out", str(out)])
    assert capsys.readouterr().out == ("wrote nothing; README.md, forest.png, val_loss.png already up to date "
                                       "(a README's date line aside)\n")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    (out / "reading.md").write_text("a reading\n")
    text = report.main([str(path), "--out", str(out)])
    assert capsys.readouterr().out.startswith(f"wrote {out / 'README.md'}; forest.png, val_loss.png already")
    assert "Generated 2031-01-02 03:04 UTC on " in text and (out / "README.md").read_text() == text


def test_a_quick_report_makes_no_call(tmp_path):
    """A --quick try's runs are a fraction of the study's: its tables say 'no call (--quick try)' wherever the
    CI excludes 0 (or not), and its header says why."""
    _, study = make_study(tmp_path)
    data = report.collect(study)
    assert report.results_table(study, data, "char").count("| lower |") == 1
    table = report.results_table(dict(study, quick=0.1), data, "char")
    assert "| lower |" not in table and "| no call |" not in table and table.count("no call (--quick try)") == 2
    assert report.verdict((-0.04, -0.003)) == "lower" and report.verdict((-0.04, -0.003), quick=0.1) != "lower"


def test_a_failed_write_leaves_the_last_report_whole(tmp_path, monkeypatch):
    """A report that fails part way (a full disk, here the forest plot) changes none of the last report's
    files: every file is made before any is written."""
    path, _ = make_study(tmp_path)
    out = tmp_path / "results"
    report.main([str(path), "--out", str(out)])
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    (out / "reading.md").write_text("a new reading\n")  # would change README.md, were it written

    def disk_full(*args):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(report, "plot_forest", disk_full)
    with pytest.raises(OSError, match="No space left on device"):
        report.main([str(path), "--out", str(out)])
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.name != "reading.md"} == before


def test_a_run_without_a_config_is_named_as_damaged(tmp_path):
    """Metrics without the config.json train.py writes first is a damaged run: never counted unchecked."""
    path, study = make_study(tmp_path)
    os.remove(os.path.join(nlq_study.run_dir(study, "linear", 2e-3, 13), "config.json"))
    damaged = r"lr0.002_seed13 is damaged: it has metrics.jsonl but no config.json"
    with pytest.raises(ValueError, match=damaged):
        report.main([str(path), "--out", str(tmp_path / "results")])
    with pytest.raises(ValueError, match=damaged):  # nor does the sweep count it as finished
        sweep.main([str(path), "--dry_run"])


def test_contrasts_between_two_arms_are_paired(tmp_path):
    """A contrast between two non-reference arms: welch_wins - paired_wins per seed is (+0.01, -0.115, -0.22):
    mean -0.10833, sd 0.11515, half-width t(0.975, 2) 4.3027 x 0.11515 / sqrt(3) = 0.28604."""
    path, _ = make_study(tmp_path)
    path.write_text(path.read_text() + "contrasts = [('welch_wins', 'paired_wins', 'q = x vs x + f(x)')]\n")
    text = report.main([str(path), "--out", str(tmp_path / "r")])
    table = text.split("## Contrasts between arms")[1].split("![val loss]")[0]
    assert "| welch_wins − paired_wins | q = x vs x + f(x) | -0.1083 (n=3) | [-0.3944, +0.1777] |" in table
    assert table.strip().splitlines()[-1].endswith("| no call | -0.1100 (no CI at n ≤ 5) | 0.5 |")  # HL, Wilcoxon
    (tmp_path / "plain").mkdir()
    plain, _ = make_study(tmp_path / "plain")  # no contrasts named: no section
    assert "## Contrasts" not in report.main([str(plain), "--out", str(tmp_path / "r2")])


def test_welch_only_case_is_not_called(tmp_path):
    path, _ = make_study(tmp_path, ref=LINEAR_2)
    text = report.main([str(path), "--out", str(tmp_path / "r")])
    row = next(line for line in text.splitlines() if line.startswith("| welch_wins |"))
    assert "| -0.0500 (n=3) | [-0.1494, +0.0494] |" in row and "| 0.163 | 0.0376 | no call |" in row


def test_search_table_shows_extension_divergence_and_missing_runs(tmp_path):
    path, study = make_study(tmp_path)
    write_run(study, "linear", 4e-3, 1, None, diverged=True)  # the top rate diverged: 2e-3 stays interior
    write_run(study, "paired_wins", 1e-3, 1, 2.0)  # now the lowest rate is best: one more step down is due
    text = report.main([str(path), "--out", str(tmp_path / "r")])
    assert "| 0.004 | diverged (iter 50) |" in text
    assert "- paired_wins: best rate 0.001 was at the lower edge: added 0.0005" in text
    assert "| 0.0005 | · | missing | · |" in text
    assert "Arms whose search is not complete yet (their next runs are not listed): paired_wins." in text
    row = next(line for line in text.splitlines() if line.startswith("| paired_wins |"))
    assert "| — |" in row  # no chosen rate, no statistics yet


def test_report_with_no_runs(tmp_path):
    (tmp_path / "cfg.py").write_text("n_layer = 1\nn_head = 2\nn_embd = 16\nblock_size = 8\nmax_iters = 10\n")
    path = tmp_path / "s.py"
    path.write_text(f"name = 'empty'\nconfig = {str(tmp_path / 'cfg.py')!r}\noverrides = {{}}\n"
                    "arms = {'linear': {}, 'nonlinear': {'query_mode': 'nonlinear'}}\n"
                    "learning_rates = [1e-3, 2e-3]\n"
                    f"selection_seeds = [1]\nseeds = [2]\nruns_dir = {str(tmp_path / 'runs')!r}\n")
    with pytest.raises(ValueError, match=r"no run of study empty has started yet \(0 of the 4 runs planned so far "
                                         r"have metrics in .*\): nothing to report, nothing written; run "
                                         r"python -m research.sweep .*s.py first"):
        report.main([str(path), "--out", str(tmp_path / "r")])
    assert not (tmp_path / "r").exists()
    study = nlq_study.load_study(str(path))
    run = nlq_study.run_dir(study, "linear", 1e-3, 1)  # one run started: a report, 0 runs finished
    os.makedirs(run)
    with open(os.path.join(run, "metrics.jsonl"), "w") as f:
        f.write(json.dumps(dict(iter=0, val_loss=4.0)) + "\n")
    with open(os.path.join(run, "config.json"), "w") as f:
        json.dump(nlq_study.run_config(study, "linear", 1e-3, 1), f)
    text = report.main([str(path), "--out", str(tmp_path / "r")])
    assert "0 of 4 runs finished." in text and text.count(": missing") == 3
    assert (tmp_path / "r" / "forest.png").read_bytes().startswith(b"\x89PNG")


def test_elapsed_seconds_sums_step_times():
    rows = [dict(iter=0, ms_per_iter=None), dict(iter=10, ms_per_iter=100.0), dict(iter=30, ms_per_iter=50.0)]
    assert nlq_study.elapsed_seconds(rows) == pytest.approx([0.0, 1.0, 2.0])


# ------------------------------------------------------------------------------- learning-rate curves
def write_curve_run(study, arm, lr, seed, evals, final=None, diverged=False):
    """A run with fixed-window val losses at iters 25, 50, 75, 100 (evals) and its whole-split final loss."""
    out = nlq_study.run_dir(study, arm, lr, seed)
    os.makedirs(out, exist_ok=True)
    rows = [dict(iter=0, tokens=0, val_loss=5.5)]
    rows += [dict(iter=25 * (i + 1), tokens=25 * (i + 1) * 64, val_loss=v, ms_per_iter=10.0)
             for i, v in enumerate(evals)]
    if diverged:
        rows.append(dict(iter=25 * (len(evals) + 1), tokens=0, train_loss=None, diverged=True))
    else:
        rows[-1]["val_loss_full"] = final
    with open(os.path.join(out, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(nlq_study.run_config(study, arm, lr, seed), f)


def test_diverged_runs_are_listed_with_the_finished_ones():
    """A diverged run finished (recorded, the sweep goes on) but has no final loss: the runs section names it,
    also where the rate was given and no search table shows it."""
    run = lambda out, status, it: dict(out_dir=out, status=status, iter=it, max_iters=10, final=None)
    data = {"linear": dict(plan=dict(chosen=1e6), search={},
                           finals={1: run("r/linear/lr1e+06_seed1", "diverged", 3),
                                   2: run("r/linear/lr1e+06_seed2", "diverged", 4)})}
    assert report.status_section(data) == (
        "All 2 runs finished. 2 of them diverged (the loss became NaN/inf; recorded, no final loss):\n\n"
        "- r/linear/lr1e+06_seed1: diverged (iter 3)\n- r/linear/lr1e+06_seed2: diverged (iter 4)\n")


def test_flagged_final_runs_and_stall_rates_per_arm():
    """A plateaued run (stalled) and a late leaver (not stalled, but 5% or more above its arm's median half-way)
    are flagged and said with why; a run 4.3% above is not; with fewer than 3 runs only the plateau rule
    applies. Each arm's stall rate has its exact 95% interval, and Δ is also given without the flagged pairs."""
    def run(mid, final, status="done"):  # as read_run reads it
        rows = [dict(iter=25, val_loss=2.60), dict(iter=50, val_loss=mid), dict(iter=100, val_loss=final)]
        stalled = status == "done" and bool(nlq_study.is_stalled(rows, 100))
        return dict(status=status, final=final if status == "done" else None, rows=rows, max_iters=100,
                    stalled=stalled, flag="stalled" if stalled else None, why=None)
    mids = [2.59, 2.42, 2.40, 2.2, 2.2, 2.3, 2.3]  # the median 2.3: 2.42 is +5.2%, 2.40 +4.3%
    data = {"linear": dict(plan=dict(chosen=4e-3), finals={s: run(2.2, 2.0 + s / 100) for s in range(7)}),
            "nonlinear": dict(plan=dict(chosen=4e-3), finals={s: run(m, 2.0 + m / 10) for s, m in enumerate(mids)})}
    for d in data.values():
        nlq_study.flag_finals(d["finals"])
    assert [r["flag"] for r in data["nonlinear"]["finals"].values()] == ["stalled", "late"] + [None] * 5
    assert not any(r["flag"] for r in data["linear"]["finals"].values())
    low, high = stats.beta.ppf(0.025, 2, 6), stats.beta.ppf(0.975, 3, 5)  # Clopper–Pearson, 2 of 7
    assert paired.rate_ci(2, 7) == pytest.approx((low, high), abs=1e-12) and paired.rate_ci(0, 7)[0] == 0
    gap = paired.paired_difference(*({s: data[arm]["finals"][s]["final"] for s in range(2, 7)}
                                     for arm in ("nonlinear", "linear")))
    text = report.stall_caution(dict(reference="linear"), data)
    assert text[1].splitlines()[2:] == [
        "| linear | none | 0 of 7: 0% [0%, 41%] | — |",
        "| nonlinear | 0 stalled (2.590 at iter 50, -0.4% from iter 25); 1 late (2.420 at iter 50, +5.2% over the "
        f"median 2.300) | 2 of 7: 29% [{low:.0%}, {high:.0%}] | {gap['mean']:+.4f} (n=5) {paired.fmt_ci(gap['ci'])} |"]
    few = {s: run(mid, 2.0) for s, mid in ((1, 2.2), (2, 2.4))}  # 2 runs: +9% is not late
    nlq_study.flag_finals(few)
    assert [r["flag"] for r in few.values()] == [None, None]
    data["nonlinear"]["finals"] = {1: run(2.59, 2.3), 2: run(2.58, 2.3)}  # every final run stalled: the arm is named
    caution = ("**Every final run stalled: nonlinear (0.004).** None of these arms' final runs left the early "
               "plateau by half-way, so their results say little about the query, and the chosen rate (in "
               "brackets) may be far from the arm's best, often a lower one. Give such an arm lower rates "
               "(learning_rates as a dict arm -> grid: python -m research.sweep --help) or more steps (the full study, "
               "if this is a --quick try).")
    assert report.stall_caution(dict(reference="linear"), data)[2] == caution
    data["nonlinear"]["finals"][3] = run(2.59, 2.3, "running")  # not while one is unfinished
    assert caution not in report.stall_caution(dict(reference="linear"), data)


def test_is_stalled_at_half_way():
    """Stalled: at the first eval at or after half of max_iters, still within 5% of the first eval's loss."""
    stalled = lambda evals: nlq_study.is_stalled([dict(iter=0, val_loss=5.5)] + [
        dict(iter=i, val_loss=v) for i, v in evals], 100)
    assert stalled([(25, 2.60), (50, 2.48), (100, 2.0)]) is True   # 2.48 > 0.95 x 2.60 = 2.47
    assert stalled([(25, 2.60), (50, 2.46), (100, 2.0)]) is False
    assert stalled([(25, 2.60), (40, 2.40), (60, 2.50)]) is True   # the eval at 60 decides
    assert stalled([(50, 2.60), (100, 2.0)]) is None  # the first eval is the half-way one
    assert stalled([(25, 2.60)]) is None  # not half way yet


def curve_study(tmp_path, learning_rates, selection_seeds):
    """A study file of linear and nonlinear on a fixed grid (no extensions, no half steps), a tiny CPU config and
    final seed 11 -> its path."""
    (tmp_path / "cfg.py").write_text(f"data_dir = {str(tmp_path / 'data')!r}\ndataset = 'toy'\nn_layer = 1\n"
                                     "n_head = 2\nn_embd = 16\nblock_size = 8\nmax_iters = 100\ndevice = 'cpu'\n")
    path = tmp_path / "curves.py"
    path.write_text(f"name = 'curves'\nconfig = {str(tmp_path / 'cfg.py')!r}\noverrides = {{}}\n"
                    "arms = {'linear': {}, 'nonlinear': {'query_mode': 'nonlinear'}}\n"
                    f"learning_rates = {learning_rates}\nselection_seeds = {selection_seeds}\nseeds = [11]\n"
                    f"max_extensions = 0\nhalf_steps = False\nruns_dir = {str(tmp_path / 'runs')!r}\n")
    return path


def test_curve_and_band_tables_by_hand(tmp_path):
    """Two arms on a fixed grid with 3 selection seeds per rate: the mean and t-CI at each rate, the stalled,
    diverged and unfinished counts, the best rate and the band within 1% of its mean, all by hand."""
    path = curve_study(tmp_path, [1e-3, 2e-3, 4e-3], [1, 2, 3])
    study = nlq_study.load_study(str(path))
    plateau = [2.60, 2.40, 2.20, 2.10]  # leaves the plateau: 2.40 < 0.95 x 2.60
    stalled = [2.60, 2.58, 2.50, 2.45]
    finals = {"linear": {1e-3: (2.50, 2.52, 2.54), 2e-3: (2.30, 2.31, 2.32), 4e-3: (2.32, 2.33, 2.34)},
              "nonlinear": {1e-3: (2.40, 2.42, 2.44), 2e-3: (2.28, 2.30, 2.50), 4e-3: (2.20, 2.21, None)}}
    for arm, by_lr in finals.items():
        for lr, losses in by_lr.items():
            for seed, loss in zip((1, 2, 3), losses):
                if loss is None:
                    write_curve_run(study, arm, lr, seed, plateau[:2], diverged=True)
                else:
                    write_curve_run(study, arm, lr, seed, stalled if loss == 2.50 and arm == "nonlinear"
                                    else plateau, loss)
    data = report.collect(study)
    t = 4.302652729911275  # Student's t, 97.5% quantile, 2 df
    half = t * 0.02 / math.sqrt(3)  # sd 0.02 at every rate of linear
    table, gaps = report.curve_tables(study, data)
    assert f"| 0.001 | 2.5200 [{2.52 - half:+.4f}, {2.52 + half:+.4f}] (n=3) |" in table
    assert "| 0.002 | 2.3100 [" in table
    sd = math.sqrt(((2.28 - 2.36) ** 2 + (2.30 - 2.36) ** 2 + (2.50 - 2.36) ** 2) / 2)
    assert (f"{2.36:.4f} [{2.36 - t * sd / math.sqrt(3):+.4f}, {2.36 + t * sd / math.sqrt(3):+.4f}] (n=3); "
            f"1 stalled |") in table
    assert "2.2050 [" in table and "(n=2); 1 diverged |" in table  # mean of 2.20, 2.21; one diverged
    bands = report.band_table(study, data)
    # linear: best 2e-3 (2.31); 4e-3's 2.33 <= 1.01 x 2.31 = 2.3331, so the band is 2e-3..4e-3 (x2)
    assert "| linear | 0.002 | 2.3100 | 0.002, 0.004 | ×2.00 | 0 / 0 of 9 | 0 / 0 of 0 |" in bands
    # nonlinear: 4e-3 has a diverged seed (+inf), so the best is 2e-3 (2.36) and 1e-3 (2.42) is outside 1%
    assert "| nonlinear | 0.002 | 2.3600 | 0.002 | ×1.00 | 1 / 1 of 9 | 0 / 0 of 0 |" in bands
    # nonlinear - linear at each rate, paired by seed: 1e-3 -0.10 at every seed (a zero-width CI); 2e-3
    # -0.02, -0.01, +0.18; 4e-3 seeds 1 and 2 only (seed 3 diverged): -0.12 twice
    assert "| learning rate | nonlinear − linear |" in gaps
    assert "| 0.001 | -0.1000 [-0.1000, -0.1000] (n=3) lower |" in gaps
    sd = math.sqrt(((-0.02 - 0.05) ** 2 + (-0.01 - 0.05) ** 2 + (0.18 - 0.05) ** 2) / 2)
    half = t * sd / math.sqrt(3)
    assert f"| 0.002 | +0.0500 [{0.05 - half:+.4f}, {0.05 + half:+.4f}] (n=3) no call |" in gaps
    assert "| 0.004 | -0.1200 [-0.1200, -0.1200] (n=2) lower |" in gaps
    # against the study's reference, whichever arm it is
    other = report.curve_tables({**study, "reference": "nonlinear"}, data)[1]
    assert "| learning rate | linear − nonlinear |" in other
    assert "| 0.001 | +0.1000 [+0.1000, +0.1000] (n=3) higher |" in other
    text = report.main([str(path), "--out", str(tmp_path / "rep")])
    assert "## Learning-rate curves" in text and gaps in text
    assert (tmp_path / "rep" / "lr_curves.png").stat().st_size > 10_000
    # the search table: every seed finished -> the selection mean; a diverged seed -> diverged
    assert "| 0.001 | 2.5200 | 2.4200 |" in text and "| 0.004 | 2.3300 | diverged (iter 75) |" in text
    # the final seed at each chosen rate (2e-3 both): linear leaves the plateau, nonlinear stalls
    write_curve_run(study, "linear", 2e-3, 11, plateau, 2.30)
    write_curve_run(study, "nonlinear", 2e-3, 11, stalled, 2.45)
    results = report.results_table(study, report.collect(study), "char")
    rows = {line.split(" | ")[0][2:]: line for line in results.splitlines()[2:]}
    assert "| 2.3000 (1) | 0 of 1 |" in rows["linear"] and "| 2.4500 (1) | 1 of 1 |" in rows["nonlinear"]
    os.remove(os.path.join(nlq_study.run_dir(study, "linear", 1e-3, 3), "metrics.jsonl"))  # seed 3 not run yet
    text = report.search_table(study, report.collect(study))
    assert "| 0.001 | 2.5100 (2 of 3 seeds) | 2.4200 |" in text  # the mean of 2.50 and 2.52 so far


def test_an_arm_whose_every_curve_run_diverged_has_no_best_rate_and_no_band(tmp_path):
    """The band table where one arm has no finite selection loss at any rate: no best rate, no band."""
    study = nlq_study.load_study(str(curve_study(tmp_path, [1e-3, 2e-3], [1])))
    for lr, loss in ((1e-3, 2.0), (2e-3, 2.03)):  # 2.03 > 1.01 x 2.0: outside linear's band
        write_curve_run(study, "linear", lr, 1, [2.6, 2.4, 2.2, 2.1], loss)
        write_curve_run(study, "nonlinear", lr, 1, [2.6, 2.4], diverged=True)
    bands = report.band_table(study, report.collect(study))
    assert "| linear | 0.001 | 2.0000 | 0.001 | ×1.00 | 0 / 0 of 2 | 0 / 0 of 0 |" in bands
    assert "| nonlinear | — | — | — | — | 0 / 2 of 2 | 0 / 0 of 0 |" in bands


def test_report_never_replaces_a_file_that_is_not_its_own(tmp_path, capsys):
    """--out pointing at a folder whose README.md is not this study's report (the repository's own README,
    another study's report) is refused before anything is written; so is, in compare mode, a folder that holds
    a report (its plot would replace the report's val_loss.png)."""
    path, _ = make_study(tmp_path)
    for title in ("# nlq — GPTs with a nonlinear attention query", "# Study enwiki_cpu"):
        (tmp_path / "README.md").write_text(title + "\n\nnot this study's\n")
        with pytest.raises(SystemExit):
            report.main([str(path), "--out", str(tmp_path)])
        assert (f"--out {tmp_path} holds a README.md that is not a report of study toy (its first line: "
                f"{title!r}); the report would replace its files" in capsys.readouterr().err)
        assert (tmp_path / "README.md").read_text() == title + "\n\nnot this study's\n"
        assert not (tmp_path / "forest.png").exists()
    report.main([str(path), "--out", str(tmp_path / "own")])
    report.main([str(path), "--out", str(tmp_path / "own")])  # its own report: rebuilt in place
    write_plain_run(tmp_path / "a", [dict(iter=10, tokens=640, val_loss=2.0, ms_per_iter=1.0)])
    with pytest.raises(FileExistsError):
        report.main([str(tmp_path / "a"), "--out", str(tmp_path / "README.md")])
    plot = (tmp_path / "own" / "val_loss.png").read_bytes()
    with pytest.raises(SystemExit):
        report.main([str(tmp_path / "a"), "--out", str(tmp_path / "own")])
    assert ("own holds a README.md that is not a report of these runs (its first line: '# Study toy'); the "
            "report would replace its files") in capsys.readouterr().err
    assert (tmp_path / "own" / "val_loss.png").read_bytes() == plot


def write_plain_run(out, rows, **config):
    """A train.py run folder by hand: metrics.jsonl and config.json (DEFAULTS with the given settings)."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump({**settings.DEFAULTS, "out_dir": str(out), **config}, f)


def test_compare_plain_runs(tmp_path, capsys, monkeypatch):
    """report.py RUN RUN ...: the table's exact values, bits per byte for byte and char data (UTF-8 bytes of
    the val split's targets), the one setting that differs, the no-call caveat and the plot."""
    monkeypatch.chdir(tmp_path)
    data = tmp_path / "data" / "chars"
    data.mkdir(parents=True)
    meta = dict(tokenizer="char", vocab_size=2, dtype="uint16", chars=["a", "é"])  # é: 2 UTF-8 bytes
    (data / "meta.json").write_text(json.dumps(meta))
    np.array([0, 1, 1, 0, 1], np.uint16).tofile(data / "val.bin")  # targets 1, 1, 0, 1: 4 tokens, 7 bytes
    byte_meta = dict(tokenizer="byte", vocab_size=256)
    common_keys = dict(max_iters=100, dataset="enwiki_bytes", dataset_meta=byte_meta)
    write_plain_run("out/a", [dict(iter=0, tokens=0, val_loss=5.5, ms_per_iter=None, elapsed_s=2.0),
                              dict(iter=100, tokens=6400, val_loss=1.9, val_loss_full=1.8897,
                                   ms_per_iter=90.0, elapsed_s=12.6)], query_mode="nonlinear", **common_keys)
    write_plain_run("out/b", [dict(iter=0, tokens=0, val_loss=5.5, ms_per_iter=None),  # no elapsed_s: older
                              dict(iter=50, tokens=3200, val_loss=2.5, ms_per_iter=100.0),
                              dict(iter=100, tokens=6400, val_loss=1.9, val_loss_full=1.8847,
                                   ms_per_iter=80.0)], query_mode="linear", **common_keys)
    write_plain_run("out/c", [dict(iter=40, tokens=2560, val_loss=2.0, val_loss_full=1.5, ms_per_iter=1.0,
                                   elapsed_s=1.0)],
                    max_iters=80, data_dir="data", dataset="chars", dataset_meta=meta)
    legend = []
    plot_runs = compare.plot_runs
    monkeypatch.setattr(compare, "plot_runs", lambda runs, names: legend.extend(names) or plot_runs(runs, names))
    text = report.main(["out/a", "out/b", "out/c"])
    assert text == capsys.readouterr().out.rstrip("\n")
    assert text.splitlines()[2:5] == [
        "| out/a | 100 | 6,400 | 1.9000 | 1.8897 | 2.7263 | 13 s |",  # 1.8897 / ln 2
        "| out/b | 100 | 6,400 | 1.9000 | 1.8847 | 2.7190 | 9 s* |",  # 5 s + 4 s of steps
        "| out/c | 40 (unfinished: max_iters 80) | 2,560 | 2.0000 | 1.5000 | 1.2366 | 1 s |"]  # x 4/7
    assert "* out/b: training steps only" in text
    assert ("Their tokenizers differ (out/a: 'byte', out/b: 'byte', out/c: 'char'): val loss is in nats per "
            "token of each run's own tokenizer, so only bits/byte compares them.") in text
    assert ("Settings that differ:\n\n| setting | out/a | out/b | out/c |\n|---|---:|---:|---:|\n"
            "| dataset | 'enwiki_bytes' | 'enwiki_bytes' | 'chars' |\n| max_iters | 100 | 100 | 80 |\n"
            "| query_mode | 'nonlinear' | 'linear' | 'linear' |\n\n") in text  # not out_dir
    assert "supports no call" in text and "python -m research.sweep STUDY" in text
    assert text.endswith("Written to out/compare: README.md (this text) and val_loss.png (the val-loss curves)")
    # the table beside the plot, and the plot names each run by the settings it differs in
    assert open("out/compare/README.md").read() == ("# Runs compared\n\n" + text.rsplit("\n\n", 1)[0]
                                                    + "\n\n![val-loss curves](val_loss.png)\n")
    assert legend == ["dataset='enwiki_bytes', max_iters=100, nonlinear (out/a)",
                      "dataset='enwiki_bytes', max_iters=100, linear (out/b)",
                      "dataset='chars', max_iters=80, linear (out/c)"]


def test_compare_names_the_one_difference_and_refuses_a_folder_without_results(tmp_path):
    rows = [dict(iter=10, tokens=640, val_loss=2.0, ms_per_iter=1.0)]
    # model_args as train.py saves them: resolved (each mode's own attn_scale, which is no setting of the run)
    write_plain_run(tmp_path / "a", rows, max_iters=10, query_mode="nonlinear",
                    model_args=dict(mlp_hidden=512, attn_scale=0.0625))
    # mlp_hidden given as the default it resolves to (4 n_embd) is the same model as mlp_hidden=None
    write_plain_run(tmp_path / "b", rows, max_iters=10, mlp_hidden=512,
                    model_args=dict(mlp_hidden=512, attn_scale=0.125))
    text = report.main([str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "cmp")])
    assert "mlp_hidden" not in text  # a's None was built as 512
    a, b = tmp_path / "a", tmp_path / "b"
    assert f"They differ only in query_mode: {a}: 'nonlinear', {b}: 'linear'." in text
    assert f"Written to {tmp_path / 'cmp'}: README.md" in text
    # an alias is the mode it names; an attn_scale given as the mode's default is that default (n_embd 768,
    # 12 heads: 1/(2 sqrt(64)) for nonlinear)
    write_plain_run(tmp_path / "a2", rows, max_iters=10, query_mode="residual_gelu", attn_scale=0.0625,
                    model_args=dict(mlp_hidden=512))
    text = report.main([str(tmp_path / "a"), str(tmp_path / "a2"), "--out", str(tmp_path / "cmp")])
    assert "Their settings are the same" in text
    # where the weights started counts too (init_from itself says 'resume' once a run resumed)
    write_plain_run(tmp_path / "ft", rows, max_iters=10, init_from="resume", initialised_from="gpt2")
    write_plain_run(tmp_path / "old", rows, max_iters=10, init_from="resume")  # predates initialised_from
    write_plain_run(tmp_path / "s", rows, max_iters=10)
    s = tmp_path / "s"
    text = report.main([str(s), str(tmp_path / "ft"), str(tmp_path / "old"), "--out", str(tmp_path / "cmp")])
    assert (f"They differ only in initialised_from: {s}: 'scratch', {tmp_path / 'ft'}: 'gpt2', "
            f"{tmp_path / 'old'}: 'not recorded'.") in text
    # the same dataset name, prepared from other text (or split otherwise): other val tokens
    for name, sha in (("d1", "a"), ("d2", "b")):
        write_plain_run(tmp_path / name, rows, max_iters=10, dataset_meta=dict(sha256={"val.bin": sha * 64}))
    d1, d2 = tmp_path / "d1", tmp_path / "d2"
    text = report.main([str(d1), str(d2), "--out", str(tmp_path / "cmp")])
    assert f"They differ only in dataset contents: {d1}: data 1, {d2}: data 2." in text
    assert (f"Their data differ ({d1}: data 1, {d2}: data 2: other text, or the same split otherwise): their val "
            f"losses are not over the same tokens.") in text
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="empty is not a train.py run folder with results"):
        report.main([str(tmp_path / "a"), str(tmp_path / "empty")])
    cut = tmp_path / "cut"  # a log cut short in its first row (train.py killed before it ended)
    write_plain_run(cut, [])
    (cut / "metrics.jsonl").write_text('{"iter": 0, "tok')
    with pytest.raises(ValueError, match="cut is not a train.py run folder with results"):
        report.main([str(tmp_path / "a"), str(cut)])


def test_seeds_needed_and_the_precision_table_by_hand():
    """The fewest pairs whose 95% CI half-width t(n-1)·sd/√n reaches a target, from t quantiles by hand."""
    # sd 0.01, target 0.0055: n = 15 gives 2.1448 · 0.01 / √15 = 0.00554 (too wide), n = 16 2.1314 · 0.01 / 4
    assert report.seeds_needed(0.01, 0.0055) == 16
    assert report.seeds_needed(0.0, 0.001) == 2 and report.seeds_needed(math.nan, 0.001) is None
    assert report.seeds_needed(0.1, 1e-300) is None and report.seeds_needed(0.1, 0.0) is None  # beyond n_max
    study = dict(reference="linear", precision=0.003)
    runs = lambda losses: dict(finals={seed: dict(final=x) for seed, x in enumerate(losses, 1)})
    data = {"linear": runs([2.0, 2.0, 2.0, 2.0]), "nonlinear": runs([2.01, 1.99, 2.02, 2.00]),
            "identity": runs([2.1])}
    # nonlinear - linear: 0.01, -0.01, 0.02, 0 -> sd = sqrt(5e-4 / 3) = 0.01291; now t(3) = 3.1824:
    # ±3.1824 · 0.01291 / 2 = ±0.0205, 3.4× the target 0.003 · 2.0 = 0.006; n = 20: 2.0930 · 0.01291 / √20 =
    # 0.00604 > 0.006, n = 21: 2.0860 · 0.01291 / √21 = 0.00588
    table = report.precision_table(study, data)
    assert "| nonlinear | 4 | 0.0129 | ±0.0205 (3.4× the target) | ±0.0060 | 21 |" in table
    assert "| identity | 1 | — | — | ±0.0060 | — |" in table



@pytest.mark.parametrize("library", ["matplotlib", "scipy"])
def test_without_its_libraries_report_names_the_install_command(library, monkeypatch):
    """matplotlib and scipy are extras: without one, report.py ends with one line naming the file of those two
    (it named requirements-extra.txt, 1.9 GB with transformers and lm-eval)."""
    monkeypatch.setitem(sys.modules, library, None)  # an import of it now fails, as where it is not installed
    for module in ("research.report", "research.compare"):  # (compare.py imports them for both)
        monkeypatch.delitem(sys.modules, module)
    with pytest.raises(SystemExit) as e:
        importlib.import_module("research.report")
    assert e.value.code == (f"error: report.py needs {library}, which is not installed: "
                            "pip install -r requirements-report.txt (scipy and matplotlib)")


# the import names of the extras report.py does not need (requirements-extra.txt's other packages)
NOT_THE_REPORTS = {"transformers": "transformers", "safetensors": "safetensors", "tokenizers": "tokenizers",
                   "lm-eval[hf]": "lm_eval", "submitit": "submitit", "pytest": "pytest", "pytest-xdist": "xdist",
                   "ruff": "ruff"}


def test_report_needs_the_core_and_requirements_report_txt_alone(tmp_path):
    """requirements-report.txt is the core and scipy and matplotlib, pinned there once (requirements-extra.txt
    includes it); with every other extra unimportable, report.py compares two runs."""
    from conftest import ROOT
    packages = lambda name: [line.split("#")[0].split("==")[0].strip() for line in (ROOT / name).read_text()
                             .splitlines() if line.split("#")[0].strip()]
    assert packages("requirements-report.txt") == ["-r requirements.txt", "scipy", "matplotlib"]
    extra = packages("requirements-extra.txt")
    assert extra[0] == "-r requirements-report.txt" and sorted(extra[1:]) == sorted(NOT_THE_REPORTS)
    for name, loss in (("a", 2.0), ("b", 1.9)):
        write_plain_run(tmp_path / name, [dict(iter=10, tokens=640, val_loss=loss, ms_per_iter=1.0, elapsed_s=3.0)],
                        max_iters=10, learning_rate=1e-3 * loss)
    blocked = "; ".join(f"sys.modules[{m!r}] = None" for m in NOT_THE_REPORTS.values())
    code = f"import sys; {blocked}; from research import report; report.main(['a', 'b', '--out', 'cmp'])"
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert "| a | 10 | 640 | 2.0000 | — | — | 3 s |" in proc.stdout and (tmp_path / "cmp" / "val_loss.png").exists()
