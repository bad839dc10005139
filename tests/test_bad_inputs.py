"""Bad input gets a clear error naming the problem and the fix, and writes nothing: damaged datasets,
checkpoints and logs, odd study files, wrong arguments, interruptions."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT

import train
from nlq import checkpoint, distributed, preemption, settings

PATTERN = np.random.default_rng(0).integers(0, 64, 97)


def make_dataset(root, name="tiny", vocab_size=64, dtype="uint16", **meta):
    """A tiny prepared dataset root/name (a repeating pattern of ids < 64); returns its folder."""
    folder = root / name
    folder.mkdir(parents=True)
    np.tile(PATTERN, 60).astype(dtype).tofile(folder / "train.bin")
    np.tile(PATTERN, 8).astype(dtype).tofile(folder / "val.bin")
    chars = [chr(48 + i) for i in range(64)]
    meta = {"vocab_size": vocab_size, "dtype": dtype, "tokenizer": "char", "chars": chars, **meta}
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder


def tiny_cfg(data_dir, out_dir, **kw):
    return {**settings.DEFAULTS, "data_dir": str(data_dir), "dataset": "tiny", "out_dir": str(out_dir),
            "n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 8, "batch_size": 2,
            "gradient_accumulation_steps": 1, "max_iters": 2, "eval_interval": 2, "eval_windows": 2,
            "warmup_iters": 1, "device": "cpu", "compile": False, **kw}


def run_script(*args):
    """Run one of the scripts as a user would -> (exit status, stderr)."""
    result = subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, cwd=ROOT)
    return result.returncode, result.stderr


# ------------------------------------------------------------------------------------- damaged datasets
def write_meta(folder, text):
    (folder / "meta.json").write_text(text)


DAMAGED = {
    "meta.json cut short": (lambda d: write_meta(d, '{"vocab_size": 64, "dty'),
                            r"meta.json is damaged \(JSONDecodeError.*prepare the dataset again"),
    "meta.json without dtype": (lambda d: write_meta(d, '{"vocab_size": 64}'), r"meta.json is damaged \(KeyError"),
    "uint16 with 70000 ids": (lambda d: write_meta(d, '{"vocab_size": 70000, "dtype": "uint16"}'),
                              r"meta.json is damaged \(ValueError: dtype uint16 for vocab_size 70000\)"),
    "val.bin empty": (lambda d: (d / "val.bin").write_bytes(b""), r"val.bin holds 0 tokens, fewer than block_size"),
    "val.bin missing": (lambda d: (d / "val.bin").unlink(), r"val.bin is missing; prepare the dataset again"),
    "val.bin changed since it was prepared": (
        lambda d: (write_meta(d, json.dumps({**json.loads((d / "meta.json").read_text()), "train_tokens": 5820,
                                             "val_tokens": 776})),
                   np.tile(PATTERN, 9).astype(np.uint16).tofile(d / "val.bin")),
        r"val.bin holds 1746 bytes, not meta.json's 776 uint16 token ids: it changed since the dataset was "
        r"prepared"),
    "ids beyond the vocabulary": (lambda d: np.full(2000, 100, np.uint16).tofile(d / "train.bin"),
                                  r"train.bin holds token id 100, but meta.json's vocab_size is 64; prepare"),
}


@pytest.mark.parametrize("case", DAMAGED)
def test_a_damaged_dataset_is_named_before_anything_is_written(case, tmp_path):
    damage, message = DAMAGED[case]
    damage(make_dataset(tmp_path / "data"))
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        train.train(tiny_cfg(tmp_path / "data", tmp_path / "out"))
    assert not (tmp_path / "out" / "ckpt.pt").exists()


def test_a_damaged_dataset_on_the_command_line_is_one_line_not_a_traceback(tmp_path):
    write_meta(make_dataset(tmp_path / "data"), "{")
    for script in ("train.py", "bench.py"):
        code, err = run_script(script, f"--data_dir={tmp_path / 'data'}", "--dataset=tiny", "--device=cpu",
                               *(["--data=real"] if script == "bench.py" else []))
        assert code == 1 and "meta.json is damaged" in err and "Traceback" not in err, err


def test_a_log_that_cannot_be_written_is_one_line_not_a_traceback(tmp_path):
    """An OSError while training (a full disk as metrics.jsonl grows; here its log path is a folder) ends the run
    with one line."""
    make_dataset(tmp_path / "data")
    (tmp_path / "out" / "metrics.jsonl").mkdir(parents=True)
    code, err = run_script("train.py", f"--data_dir={tmp_path / 'data'}", "--dataset=tiny", "--device=cpu",
                           f"--out_dir={tmp_path / 'out'}", "--max_iters=1", "--n_layer=1", "--n_embd=16",
                           "--n_head=2", "--block_size=8", "--batch_size=2", "--eval_windows=2")
    assert code == 1 and err.splitlines()[-1] == (f"error: [Errno 21] Is a directory: "
                                                  f"'{tmp_path / 'out' / 'metrics.jsonl'}'"), err
    assert "Traceback" not in err and not (tmp_path / "out" / "ckpt.pt").exists()


# ------------------------------------------------------------------------------------------- settings
@pytest.mark.parametrize("override,message", [
    ("--vocab_size=0", r"'vocab_size' = 0 must be > 0"),  # was taken as None: sized from the data
    ("--device=mps:0", r"device=mps:0 but MPS is not available here; use --device=cpu"),  # was a traceback
    ("--device=cuda0", r"device='cuda0'; use auto, cpu, cuda, cuda:N or mps"),
    ("--device=cpu:1", r"device='cpu:1'; use auto, cpu, cuda, cuda:N or mps"),  # ran on the one CPU device
    ("--learning_rate=1e400", r"'learning_rate' = inf must be > 0$"),
    ("--grad_clip=-1e999", r"'grad_clip' = -inf must be >= 0$"),
])
def test_settings_that_used_to_pass_or_crash(override, message):
    with pytest.raises(ValueError, match=message):
        cfg = settings.parse_config([override])
        distributed.resolve_device(cfg)


def test_an_unwritable_out_dir_fails_before_anything_is_written(tmp_path):
    make_dataset(tmp_path / "data")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match=r"cannot write to out_dir .*file.sub \(Not a directory\)"):
        train.train(tiny_cfg(tmp_path / "data", tmp_path / "file" / "sub"))


def test_outputs_that_cannot_be_written_fail_before_the_work_and_say_why(trained, tmp_path, monkeypatch, capsys):
    """eval.py --json into a folder it cannot write was a traceback after scoring the whole split: now one line
    before it (a file where the folder would be; chmod does not stop root, who runs CI), as for a folder. A
    checkpoint that cannot be written for want of permission (what open() raises in a read-only folder) was said
    to need free space."""
    import eval as nlq_eval
    data, out = trained
    (tmp_path / "file.txt").write_text("x")
    monkeypatch.setattr(nlq_eval, "evaluate", lambda *a: pytest.fail("scored before --json was checked"))
    with pytest.raises(ValueError, match=r"cannot write to --json's folder .*file.txt \(Not a directory\); "
                                         r"choose another"):
        nlq_eval.main(["--out_dir", str(out), "--full", "--json", str(tmp_path / "file.txt" / "val.json")])
    with pytest.raises(SystemExit) as e:  # a folder: refused before the scoring, not replaced after it
        nlq_eval.main(["--out_dir", str(out), "--json", str(tmp_path)])
    assert e.value.code == 2 and f"--json {tmp_path} is a folder; give a file name" in capsys.readouterr().err
    def denied(obj, path):
        raise PermissionError(13, "Permission denied", path)
    monkeypatch.setattr(checkpoint.torch, "save", denied)
    with pytest.raises(checkpoint.CheckpointNotWritten, match=r"could not write the checkpoint at iter 0 \(\[Errno "
                       r"13\] Permission denied: .*\); the previous one is intact: make the folder writable and "
                       r"continue with --init_from=resume$"):
        train.train(tiny_cfg(data, tmp_path / "denied"))


def test_an_interrupted_save_leaves_the_old_checkpoint_and_no_temp_file(tmp_path, monkeypatch):
    path = str(tmp_path / "ckpt.pt")
    save = lambda obj: checkpoint.replace_atomically(path, lambda tmp: torch.save(obj, tmp))
    save({"iter_num": 1})

    def save_half_then_interrupt(obj, f):
        open(f, "wb").write(b"half a checkpoint")
        raise KeyboardInterrupt
    with monkeypatch.context() as m, pytest.raises(KeyboardInterrupt):
        m.setattr(torch, "save", save_half_then_interrupt)
        save({"iter_num": 2})
    assert os.listdir(tmp_path) == ["ckpt.pt"] and torch.load(path)["iter_num"] == 1


def interruptible(cmd):
    """Popen(cmd) in the repository root, with Ctrl-C (SIGINT) at its default in the child: a shell that
    starts the tests in the background (`pytest &`, nohup) sets it to 'ignore', which Python would keep."""
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def interrupt(proc):
    """Send Ctrl-C, wait up to 60 s for the exit and return the rest of stderr; the child is killed if it
    does not exit (it must never outlive a failed test)."""
    proc.send_signal(signal.SIGINT)
    try:
        return proc.communicate(timeout=60)[1]
    except subprocess.TimeoutExpired:
        proc.kill()
        raise


def test_ctrl_c_before_the_first_checkpoint_says_to_start_again(tmp_path):
    make_dataset(tmp_path / "data")
    proc = interruptible([sys.executable, "train.py", f"--data_dir={tmp_path / 'data'}", "--dataset=tiny",
                          f"--out_dir={tmp_path / 'out'}", "--device=cpu", "--n_layer=1", "--n_head=2",
                          "--n_embd=16", "--block_size=8", "--batch_size=2", "--eval_windows=2000000"])
    with proc:
        for line in proc.stdout:  # the first eval is next (a million batches: minutes)
            if line.startswith("tokens per iteration"):
                break
        err = interrupt(proc)
    assert proc.returncode == preemption.EXIT_INTERRUPTED == 130 and "Traceback" not in err
    assert "interrupted before the first checkpoint: run the same command again to start over" in err


def test_a_rendezvous_that_hangs_can_still_be_stopped():
    """While the process group starts (a C++ wait, where Python's handlers never run), SIGTERM and Ctrl-C do
    what they do by default, ending the process; train.py's own handlers are back afterwards."""
    with preemption.StopSignals() as stop:
        ours = {sig: signal.getsignal(sig) for sig in (*preemption.STOP_SIGNALS, signal.SIGINT)}
        with stop.paused():
            assert all(signal.getsignal(sig) == signal.SIG_DFL for sig in ours)
        assert {sig: signal.getsignal(sig) for sig in ours} == ours
        assert signal.getsignal(signal.SIGTERM) == stop._handle


# ---------------------------------------------------------------------------------------------- checkpoints
@pytest.fixture
def trained(tmp_path):
    """A dataset and a 2-step run of it: (data_dir, out_dir)."""
    make_dataset(tmp_path / "data", sha256={"train.bin": "a" * 64, "val.bin": "b" * 64})
    train.train(tiny_cfg(tmp_path / "data", tmp_path / "out"))
    return tmp_path / "data", tmp_path / "out"


def test_a_missing_checkpoint_is_named(trained, tmp_path):
    data, out = trained
    with pytest.raises(FileNotFoundError, match="init_from=resume but .*new.ckpt.pt does not exist"):
        train.train(tiny_cfg(data, tmp_path / "new", init_from="resume"))


def test_resume_refuses_a_dataset_whose_contents_changed(trained):
    data, out = trained
    meta = json.loads((data / "tiny" / "meta.json").read_text())
    write_meta(data / "tiny", json.dumps({**meta, "sha256": {**meta["sha256"], "train.bin": "c" * 64}}))
    before = (out / "ckpt.pt").read_bytes()
    with pytest.raises(ValueError, match=r"is not the data this checkpoint was trained on \(the bins' sha256 "
                                         r"differ\); pass --data_dir with the data it was trained on"):
        train.train(tiny_cfg(data, out, init_from="resume", max_iters=4))
    assert (out / "ckpt.pt").read_bytes() == before
    # prepared again from a text with other characters: another vocabulary too, which was blamed on the
    # settings ("settings differ ... vocab_size"), with no flag to give; the data is what differs
    write_meta(data / "tiny", json.dumps({**meta, "vocab_size": 200, "sha256": {**meta["sha256"],
                                                                              "train.bin": "c" * 64}}))
    with pytest.raises(ValueError, match=r"is not the data this checkpoint was trained on"):
        train.train(tiny_cfg(data, out, init_from="resume", max_iters=4))
    assert (out / "ckpt.pt").read_bytes() == before


def test_a_model_too_large_for_the_free_memory_is_refused_before_it_is_built(tmp_path, monkeypatch):
    """16 bytes a parameter (float32 weights, gradients, AdamW's two moments) above the free memory (a size typed
    wrong): refused, naming both, before out_dir is made."""
    make_dataset(tmp_path / "data")
    cfg = tiny_cfg(tmp_path / "data", tmp_path / "out", n_embd=2**16, n_layer=2**10)  # ~50 T parameters
    with pytest.raises(ValueError, match=r"the model has [\d,]+ parameters: their weights, gradients and AdamW "
                                         r"state need [\d,.]+ GiB, and cpu has [\d,.]+ GiB free"):
        train.train(cfg)
    assert not (tmp_path / "out").exists()


def test_a_run_never_writes_into_a_dataset(tmp_path):
    """out_dir=data/NAME (a prepared dataset) would put ckpt.pt, config.json and metrics.jsonl among the bins:
    refused before anything is written."""
    make_dataset(tmp_path / "data")
    before = sorted(os.listdir(tmp_path / "data" / "tiny"))
    with pytest.raises(ValueError, match="holds another program's files"):
        train.train(tiny_cfg(tmp_path / "data", tmp_path / "data" / "tiny"))
    assert sorted(os.listdir(tmp_path / "data" / "tiny")) == before


def test_a_file_that_is_not_a_checkpoint_is_named(trained):
    data, out = trained
    torch.save({"weights": torch.zeros(2)}, out / "ckpt.pt")
    with pytest.raises(ValueError, match=r"ckpt.pt is not a train.py checkpoint"):
        train.train(tiny_cfg(data, out, init_from="resume", max_iters=4))


def test_weights_that_do_not_fit_their_settings_are_named(trained):
    import eval as nlq_eval
    import sample
    data, out = trained
    ckpt = distributed.torch.load(out / "ckpt.pt", weights_only=True)
    ckpt["model"]["transformer.wpe.weight"] = distributed.torch.zeros(4, 16)  # block_size is 8
    distributed.torch.save(ckpt, out / "ckpt.pt")
    message = r"ckpt.pt does not fit the model of its own settings: Error\(s\) in loading state_dict for GPT"
    with pytest.raises(ValueError, match=message):
        train.train(tiny_cfg(data, out, init_from="resume", max_iters=4))
    for main in (sample.main, nlq_eval.main):
        with pytest.raises(ValueError, match=message):
            main(["--out_dir", str(out)])


def test_every_text_nlq_reads_takes_a_bom_and_windows_line_ends_and_names_other_encodings(tmp_path):
    """Corpora, prompts and config files, each as a Windows editor saves it (a byte-order mark, \\r\\n) read as
    without; not UTF-8 is one line naming the file and the fix. A lone surrogate, which only a JSON escape or a
    command line's undecodable bytes give, is U+FFFD in every tokenizer."""
    import prepare_data
    import sample
    from nlq import tokenizers
    lines = "x = 'caf\u00e9'\nn_layer = 3\n", "one line\nand \u00e9 another\n"
    for name, text in zip(("config.py", "corpus.txt"), lines):
        (tmp_path / name).write_text(text, newline="\n")
        (tmp_path / f"bom_{name}").write_bytes(b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode())
        (tmp_path / f"latin1_{name}").write_bytes(text.encode("latin-1"))
    read = dict(config=lambda p: settings.read_config_file(str(p)), corpus=prepare_data.read_documents,
                prompt=lambda p: sample.prompt_ids(f"FILE:{p}", None, list))
    for kind, name in (("config", "config.py"), ("corpus", "corpus.txt"), ("prompt", "corpus.txt")):
        assert read[kind](tmp_path / f"bom_{name}") == read[kind](tmp_path / name), kind
        with pytest.raises(ValueError, match=rf"latin1_{name}.*(not valid UTF-8 \(byte|codec can't decode byte)"):
            read[kind](tmp_path / f"latin1_{name}")
    for meta in (dict(tokenizer="byte"), dict(tokenizer="char", chars=list("ab \ufffd")), dict(tokenizer="gpt2")):
        encode, decode = tokenizers.get_codec(meta)
        assert decode(encode("a \ud83d b")) == "a \ufffd b", meta


# ------------------------------------------------------------------------------------------ study files
STUDY = ("name = 'tiny'\nconfig = 'CONFIG'\noverrides = {}\nruns_dir = 'RUNS'\n"
         "arms = {'linear': dict(query_mode='linear'), 'nonlinear': dict(query_mode='nonlinear')}\n"
         "learning_rates = [1e-2, 3e-3]\nselection_seeds = [1]\nseeds = [2, 3]\n")


@pytest.fixture
def study(tmp_path):
    """A valid study file on a tiny config (nothing is run); returns its path."""
    make_dataset(tmp_path / "data")
    (tmp_path / "config.py").write_text(f"data_dir = {str(tmp_path / 'data')!r}\ndataset = 'tiny'\n"
                                        "n_layer = 1\nn_head = 2\nn_embd = 16\nblock_size = 8\n")
    path = tmp_path / "study.py"
    path.write_text(STUDY.replace("CONFIG", str(tmp_path / "config.py"))
                    .replace("RUNS", str(tmp_path / "runs")))
    return path


@pytest.mark.parametrize("edit,message", [
    # each of these used to be accepted: duplicated runs in the statistics, a search that repeats a rate,
    # no bound on the extensions, half steps on for 'no', a setting silently replaced by the sweep's
    ("seeds = [2, 2]", r"seeds must be a non-empty list of ints, each once"),
    ("selection_seeds = [1, 1]", r"selection_seeds must be a non-empty list of ints, each once"),
    ("learning_rates = [1e-2, 1e-2, 3e-3]", r"learning_rates must be a non-empty list of positive numbers, "
                                            r"each once"),
    ("learning_rates = [1e-2, 1.0000001e-2]", r"learning_rates .*each once \(to 6 significant digits"),
    ("learning_rates = [1e-2, float('inf')]", r"learning_rates must be a non-empty list of positive numbers"),
    ("learning_rates = [-1e-2]", r"learning_rates must be a non-empty list of positive numbers"),
    ("seeds = [True]", r"seeds must be a non-empty list of ints"),
    ("learning_rates = [1e-3]", r"arm linear has one learning rate but selection_seeds are set: a search needs "
                                r"two or more rates \(or selection_seeds = \[\] to run that rate without a search\)"),
    ("overrides = {'learning_rate': 1e-3}", r"overrides sets learning_rate, which sweep.py sets for every "
                                           r"run \(it would be ignored\); set it with learning_rates"),
    ("overrides = {'min_lr': 0.0}", r"overrides sets min_lr.*set it with each arm's min_lr"),
    ("arms = {'linear': dict(seed=5)}", r"arm linear sets seed.*set it with selection_seeds and seeds"),
    # and these were tracebacks
    ("arms = {'linear': 5}", r"arms must be a non-empty dict: arm name -> dict of train.py keys"),
    ("arms = {'linear': {}, 'lin/ear': {}}", r"arm name 'lin/ear' must be a plain folder name \(letters, digits, "
                                            r"_ . -; not starting with . or -\)"),
    ("arms = {'.hidden': {}}", r"arm name '.hidden' must be a plain folder name"),
    ("overrides = {'n_layer': '2'}", r"overrides: config key 'n_layer' needs an int, got '2'"),
    ("arms = {'linear': dict(qk_norm=1)}", r"arm linear: config key 'qk_norm' needs a bool, got 1"),
    ("name = 5\nruns_dir = None", r"name must be a plain folder name"),
    ("name = '.'", r"name must be a plain folder name"),
    ("name = '-x'", r"name must be a plain folder name \(letters, digits, _ . -; not starting with . or -\)"),
    ("name = 'my study'", r"name must be a plain folder name"),
    ("contrasts = [('linear', 'lineer', 'a typo')]", r"contrasts must be .* two different arms of linear, nonlinear"),
    ("contrasts = [('linear', 'linear', 'itself')]", r"contrasts must be .* two different arms"),
    ("contrasts = ('linear', 'linear')", r"contrasts must be a list"),
    ("contrasts = [(['linear'], 'linear', 'a list')]", r"contrasts must be a list of \(arm"),  # was TypeError
])
def test_odd_study_files_are_refused_before_any_run(study, edit, message):
    from research.study import load_study
    study.write_text(study.read_text() + edit + "\n")
    with pytest.raises(ValueError, match=message):
        load_study(str(study))


def test_bad_counts_are_refused(study, capsys):
    from research import sweep
    for option in ("--jobs", "--threads", "--slurm_time"):
        with pytest.raises(SystemExit) as e:
            sweep.main([str(study), option, "0"])
        assert e.value.code == 2 and f"{option} must be >= 1" in capsys.readouterr().err
    if shutil.which("sbatch") is None:  # no SLURM here: said at once, and no run folder is left behind
        with pytest.raises(SystemExit) as e:
            sweep.main([str(study), "--executor", "slurm"])
        assert e.value.code == 2 and "sbatch, which is not on PATH here" in capsys.readouterr().err
        assert not (study.parent / "runs").exists()


def test_a_damaged_metrics_line_is_named_with_the_fix(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"iter": 0, "val_loss": 4.2}\ngarbage\n{"iter": 5}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl: line 2 is not JSON; restore the log or delete that line"):
        checkpoint.read_metrics(str(tmp_path))
    (tmp_path / "metrics.jsonl").write_text('{"iter": 0, "val_loss": 4.2}\n{"iter": 5, "val_lo')  # cut short
    assert checkpoint.read_metrics(str(tmp_path)) == [{"iter": 0, "val_loss": 4.2}]


def test_report_names_a_damaged_config_json(study):
    from research import report
    from research.study import load_study, run_dir
    loaded = load_study(str(study))
    out = run_dir(loaded, "linear", 1e-2, 1)
    os.makedirs(out)
    for text in ("garbage", "[1]"):
        (Path(out) / "config.json").write_text(text)
        with pytest.raises(ValueError, match=r"config.json is damaged \(not a JSON object of settings\); "
                                             r"restore it from a copy, or delete its run folder"):
            report.main([str(study), "--out", str(study.parent / "report")])


def test_bench_says_when_its_timings_are_unreliable():
    """bench.py on a busy CPU: a 2-thread bench beside another job ran 100x slower with a p90 5.6x its p10 and
    ratios of 0.4 that looked like results. The table says so when a mode's step times spread widely."""
    import bench
    row = dict(query_mode="linear", compile=False, dtype="float32", parallel="single", world_size=1, batch_size=2,
               block_size=8, ms_per_iter=10.0, ms_p10=9.0, ms_p90=11.0, tokens_per_s=1600.0, mfu=None,
               peak_mem_mb=100.0, peak_mem_mb_per_rank=[100.0], params=1000, vocab_size=64)
    steady = bench.table([row, {**row, "query_mode": "nonlinear"}], "cpu")
    assert "spread widely" not in steady and len(steady.splitlines()) == 6  # the last: the CPU's memory column
    noisy = bench.table([row, {**row, "query_mode": "nonlinear", "ms_p10": 5.0, "ms_p90": 28.0}], "cpu")
    assert noisy.splitlines()[-2] == ("(the step times spread widely: nonlinear's p90 is 5.6x its p10, so the "
                                      "ratios are uncertain: run again on idle cores, or with more --rounds)")


def test_a_tilde_after_the_equals_sign_means_the_home_folder(tmp_path, monkeypatch):
    """The shell expands ~ only at the start of a word, so --out_dir=~/runs reached the scripts as it is and
    train.py wrote into a folder named ~ in the current one."""
    import prepare_data
    import sample
    from interop import convert
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = settings.parse_config(["--out_dir=~/runs", "--data_dir=~/data"])
    assert (cfg["out_dir"], cfg["data_dir"]) == (str(tmp_path / "runs"), str(tmp_path / "data"))
    assert sample.parse_args(["--out_dir=~/runs"]).out_dir == str(tmp_path / "runs")
    assert prepare_data.parse_args(["shakespeare_char", "--data_dir=~/d"]).data_dir == str(tmp_path / "d")
    make_dataset(tmp_path / "data")
    with pytest.raises(FileNotFoundError, match=f"{tmp_path}/ckpt.pt is not a file"):
        convert.main(["official", "~/ckpt.pt", "--out_dir=~/out", "--dataset=tiny", "--data_dir=~/data"])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/PID/maps")
def test_ctrl_c_during_an_evaluation_is_one_line_and_writes_nothing(tmp_path):
    make_dataset(tmp_path / "data")
    np.tile(PATTERN, 20000).astype("uint16").tofile(tmp_path / "data" / "tiny" / "val.bin")  # minutes at batch 1
    out = tmp_path / "out"
    train.train(tiny_cfg(tmp_path / "data", out, max_iters=0))
    proc = interruptible([sys.executable, "eval.py", f"--out_dir={out}", "--full", "--batch_size=1",
                          f"--json={tmp_path / 'r.json'}"])
    with proc:  # the scoring has begun once val.bin is mapped (each batch maps it; Linux's /proc shows it)
        while proc.poll() is None and "val.bin" not in Path(f"/proc/{proc.pid}/maps").read_text():
            time.sleep(0.01)
        err = interrupt(proc)
    assert proc.returncode == 1 and err.endswith("interrupted; nothing was written\n"), err[-2000:]
    assert "Traceback" not in err and not (tmp_path / "r.json").exists()


def test_a_run_that_ends_without_an_error_but_unfinished_is_not_launched_forever(study, monkeypatch):
    """A run whose checkpoint is at max_iters but whose metrics.jsonl lost its rows exits 0 without training;
    sweep.py used to launch it again and again."""
    from research import sweep
    calls = []

    class TrainExits0:
        def __init__(self, cmd, **kw):
            calls.append(cmd)
            assert len(calls) < 10, "launched again and again"
        def wait(self):
            return 0
    monkeypatch.setattr(sweep.subprocess, "Popen", TrainExits0)
    with pytest.raises(RuntimeError, match=r"(?s)4 run\(s\) did not finish; the others did:.*lr0.01_seed1 ended "
                                           r"before max_iters without an error: its metrics.jsonl ends at iter None"):
        sweep.main([str(study)])
    assert len(calls) == 4  # the 2 arms x 2 rates of the search, once each


def test_small_options_named_as_the_other_scripts_name_them(tmp_path, capsys):
    """An empty prompt file is an error (it fell back to the default start without a word); bench.py takes the
    query modes' aliases as train.py does and names an unknown mode before building any model;
    bench/gpu_check.py answers --help and refuses other arguments."""
    import bench
    import sample
    sys.path.insert(0, str(ROOT / "bench"))
    import gpu_check
    (tmp_path / "prompt.txt").write_text("ab")
    assert sample.prompt_ids(f"FILE:{tmp_path / 'prompt.txt'}", dict(tokenizer="char"), lambda t: [7] * len(t)) \
        == [7, 7]
    opts, _ = bench.split_args(["--query_modes=original,residual_gelu"])
    assert opts["query_modes"] == "linear,nonlinear"
    with pytest.raises(ValueError, match="--query_modes: unknown nonlinar; registered: linear"):
        bench.split_args(["--query_modes=linear,nonlinar"])
    with pytest.raises(SystemExit) as e:
        gpu_check.main(["--help"])
    assert e.value.code == 0 and "The steps of bench/gpu_check.sh" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        gpu_check.main(["env", "--out=rows.jsonl", "--steps=3"])
    assert e.value.code == 2 and "unrecognized arguments: --steps=3" in capsys.readouterr().err


def test_two_writers_of_one_path_never_take_each_others_temp_file(tmp_path):
    """Two report.py runs into one --out: with one temp name per path (path + '.tmp') the second writer wrote
    into the first's temp file and renamed it away, and the first failed ('No such file ... .tmp')."""
    path = str(tmp_path / "val_loss.png")

    def first(tmp):
        with open(tmp, "w") as f:
            f.write("first")
        checkpoint.atomic_write_text(path, "second")  # another process writes the same path meanwhile

    checkpoint.replace_atomically(path, first)
    assert open(path).read() == "first" and os.listdir(tmp_path) == ["val_loss.png"]  # the last rename wins


