"""Bad input gets a clear error naming the problem and the fix, and writes nothing: damaged datasets,
checkpoints and logs, odd study files, wrong arguments, interruptions."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import common
import train
from conftest import ROOT

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
    return {**common.DEFAULTS, "data_dir": str(data_dir), "dataset": "tiny", "out_dir": str(out_dir),
            "n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 8, "batch_size": 2,
            "gradient_accumulation_steps": 1, "max_iters": 2, "eval_interval": 2, "eval_iters": 1,
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
                            r"meta.json is damaged, not JSON .*prepare the dataset again"),
    "meta.json without dtype": (lambda d: write_meta(d, '{"vocab_size": 64}'),
                                r"needs a positive int vocab_size and a dtype uint16 or uint32, got "
                                r"vocab_size=64, dtype=None"),
    "meta.json a list": (lambda d: write_meta(d, "[1, 2]"), r"needs a positive int vocab_size"),
    "vocab_size a string": (lambda d: write_meta(d, '{"vocab_size": "64", "dtype": "uint16"}'),
                            r"vocab_size='64'"),
    "uint16 with 70000 ids": (lambda d: write_meta(d, '{"vocab_size": 70000, "dtype": "uint16"}'),
                              r"vocab_size 70000 does not fit dtype uint16"),
    "train.bin of odd length": (lambda d: (d / "train.bin").write_bytes((d / "train.bin").read_bytes()[:-1]),
                                r"train.bin is 11639 bytes, not a whole number of uint16 token ids"),
    "val.bin empty": (lambda d: (d / "val.bin").write_bytes(b""), r"val.bin is empty; prepare the dataset"),
    "val.bin a folder": (lambda d: ((d / "val.bin").unlink(), (d / "val.bin").mkdir()),
                         r"val.bin is missing \(or not a file\); prepare the dataset again"),
    "val.bin changed since it was prepared": (
        lambda d: (write_meta(d, json.dumps({**json.loads((d / "meta.json").read_text()), "train_tokens": 5820,
                                             "val_tokens": 776})),
                   np.tile(PATTERN, 9).astype(np.uint16).tofile(d / "val.bin")),
        r"val.bin holds 873 tokens, but meta.json says 776: the file changed since the dataset was prepared"),
    "ids beyond the vocabulary": (lambda d: np.full(2000, 100, np.uint16).tofile(d / "train.bin"),
                                  r"train.bin holds token id 100, but meta.json's vocab_size is 64: the bin "
                                  r"and meta.json do not belong together"),
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
    """An OSError while training (a full disk as metrics.jsonl grows: a traceback in an adversarial trial;
    here its log path is a folder) ends the run with one line naming the fix."""
    make_dataset(tmp_path / "data")
    (tmp_path / "out" / "metrics.jsonl").mkdir(parents=True)
    code, err = run_script("train.py", f"--data_dir={tmp_path / 'data'}", "--dataset=tiny", "--device=cpu",
                           f"--out_dir={tmp_path / 'out'}", "--max_iters=1", "--n_layer=1", "--n_embd=16",
                           "--n_head=2", "--block_size=8", "--batch_size=2", "--eval_iters=1")
    assert code == 1 and err.splitlines()[-1] == (f"error: [Errno 21] Is a directory: "
                                                  f"'{tmp_path / 'out' / 'metrics.jsonl'}'; mend that path or "
                                                  f"choose another out_dir"), err
    assert "Traceback" not in err and not (tmp_path / "out" / "ckpt.pt").exists()


# ------------------------------------------------------------------------------------------- settings
@pytest.mark.parametrize("override,message", [
    ("--vocab_size=0", r"'vocab_size' = 0 must be > 0"),  # was taken as None: sized from the data
    ("--device=mps:0", r"device=mps:0 but MPS is not available here; use --device=cpu"),  # was a traceback
    ("--device=cuda0", r"device='cuda0'; use auto, cpu, cuda, cuda:N or mps"),
    ("--device=cpu:1", r"device='cpu:1'; use auto, cpu, cuda, cuda:N or mps"),  # ran on the one CPU device
    ("--seed=99999999999999999999", r"'seed' = 99999999999999999999 is too large; use \|seed\| < 2\*\*62"),
    ("--learning_rate=1e400", r"'learning_rate' = inf must be > 0 and finite$"),  # was "= inf must be > 0"
    ("--grad_clip=-1e999", r"'grad_clip' = -inf must be >= 0 and finite$"),
])
def test_settings_that_used_to_pass_or_crash(override, message):
    with pytest.raises(ValueError, match=message):
        cfg = common.parse_config([override])
        common.resolve_device(cfg)


def test_a_cuda_index_beyond_the_gpus_is_named(monkeypatch):
    monkeypatch.setattr(common.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(common.torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ValueError, match=r"device=cuda:2 but this machine has 2 GPU\(s\), cuda:0 to cuda:1"):
        common.resolve_device({"device": "cuda:2", "dtype": "float32"})


def test_wandb_missing_and_an_unwritable_out_dir_fail_before_anything_is_written(tmp_path, monkeypatch):
    make_dataset(tmp_path / "data")
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError, as when not installed
    with pytest.raises(ValueError, match=r"wandb_log=True but the wandb package is not installed: pip "
                                         r"install wandb, or drop --wandb_log"):
        train.train(tiny_cfg(tmp_path / "data", tmp_path / "out", wandb_log=True))
    assert not (tmp_path / "out").exists()
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match=r"cannot write to out_dir .*file.sub \(Not a directory\); .*file is a "
                                         r"file, not a folder; choose a writable folder"):
        train.train(tiny_cfg(tmp_path / "data", tmp_path / "file" / "sub"))


def test_an_interrupted_save_leaves_the_old_checkpoint_and_no_temp_file(tmp_path, monkeypatch):
    path = str(tmp_path / "ckpt.pt")
    common.save_checkpoint(path, {"iter_num": 1})

    def save_half_then_interrupt(obj, f):
        open(f, "wb").write(b"half a checkpoint")
        raise KeyboardInterrupt
    monkeypatch.setattr(common.torch, "save", save_half_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        common.save_checkpoint(path, {"iter_num": 2})
    assert os.listdir(tmp_path) == ["ckpt.pt"] and common.torch.load(path)["iter_num"] == 1


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
                          "--n_embd=16", "--block_size=8", "--batch_size=2", "--eval_iters=10000000"])
    with proc:
        for line in proc.stdout:  # the first eval (ten million batches) has begun
            if line.startswith("tokens per iteration"):
                break
        err = interrupt(proc)
    assert proc.returncode == common.EXIT_INTERRUPTED == 130 and "Traceback" not in err
    assert "interrupted before the first checkpoint: there is nothing to resume; run the same command" in err


@pytest.mark.parametrize("env", [dict(RANK="0"), dict(RANK="abc", LOCAL_RANK="0", WORLD_SIZE="2"),
                                 dict(RANK="1", LOCAL_RANK="0", WORLD_SIZE="1"),
                                 dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="2")])  # no MASTER_ADDR, MASTER_PORT
def test_a_stale_rank_in_the_environment_is_named_before_any_rendezvous(env, monkeypatch):
    """RANK left in a shell (no torchrun) gave a KeyError traceback, int()'s message or a rendezvous that waited
    30 minutes for a peer; now one error names the variables and both fixes, and no process group starts."""
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(common.dist, "init_process_group", lambda **k: pytest.fail("a rendezvous started"))
    with pytest.raises(ValueError) as e:
        common.setup_distributed(dict(common.DEFAULTS, device="cpu"))
    named = ", ".join(f"{k}={env[k]}" if k in env else f"{k} unset"
                      for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))
    assert str(e.value) == (f"RANK is set in the environment, but not as torchrun sets it ({named}): for one "
                            f"process, unset RANK, LOCAL_RANK and WORLD_SIZE; for several, launch with torchrun")


def test_a_rendezvous_that_hangs_can_still_be_stopped():
    """While the process group starts (a C++ wait, where Python's handlers never run), SIGTERM and Ctrl-C do
    what they do by default, ending the process; train.py's own handlers are back afterwards."""
    with train.StopSignals() as stop:
        ours = {sig: signal.getsignal(sig) for sig in (*train.STOP_SIGNALS, signal.SIGINT)}
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


def test_a_missing_checkpoint_gets_advice_that_works(trained, tmp_path):
    """Each fix named is one that then runs: resuming a committed study run (its log, no checkpoint) said
    'use init_from=scratch', which is then refused (its results would be replaced); a ckpt.pt that is a
    folder sent scratch to resume and resume to scratch (an adversarial trial)."""
    data, out = trained
    os.remove(out / "ckpt.pt")  # as a committed study run: metrics.jsonl and config.json only
    with pytest.raises(FileNotFoundError, match=f"init_from=resume but {out / 'ckpt.pt'} does not exist; {out} "
                                                f"holds only a run's log \\(metrics.jsonl up to iter 2: a committed "
                                                f"study run keeps no checkpoint\\), so there is nothing to resume; "
                                                f"give the run a new out_dir"):
        train.train(tiny_cfg(data, out, init_from="resume"))
    with pytest.raises(FileNotFoundError, match="does not exist; use init_from=scratch$"):  # nothing there yet
        train.train(tiny_cfg(data, tmp_path / "new", init_from="resume"))
    (tmp_path / "odd" / "ckpt.pt").mkdir(parents=True)
    for how in ("scratch", "resume"):
        with pytest.raises(ValueError, match=f"{tmp_path / 'odd' / 'ckpt.pt'} is a folder, not a checkpoint; "
                                             f"move it away, or give the run a new out_dir"):
            train.train(tiny_cfg(data, tmp_path / "odd", init_from=how))


def test_resume_refuses_a_dataset_whose_contents_changed(trained):
    data, out = trained
    meta = json.loads((data / "tiny" / "meta.json").read_text())
    write_meta(data / "tiny", json.dumps({**meta, "sha256": {**meta["sha256"], "train.bin": "c" * 64}}))
    before = (out / "ckpt.pt").read_bytes()
    with pytest.raises(ValueError, match=r"is not the data this checkpoint was trained on \(sha256 of "
                                         r"train.bin differs\).*pass --data_dir pointing to the data it"):
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
    """16 bytes a parameter (float32 weights, gradients, AdamW's two moments) above the free memory: refused,
    naming both, before out_dir is made; exactly enough passes (activations are not counted)."""
    make_dataset(tmp_path / "data")
    cfg = tiny_cfg(tmp_path / "data", tmp_path / "out")
    n = common.param_counts(common.model_config(cfg, 64))["total"]
    monkeypatch.setattr(common, "available_memory", lambda device: 16 * n - 1)
    with pytest.raises(ValueError, match=f"the model has {n:,} parameters: their weights, gradients and AdamW "
                                         f"state need 0.0 GiB before any activation, and cpu has 0.0 GiB free; "
                                         f"make the model smaller"):
        train.train(cfg)
    assert not (tmp_path / "out").exists()
    monkeypatch.setattr(common, "available_memory", lambda device: 16 * n)
    train.train(cfg)
    monkeypatch.undo()
    free = common.available_memory("cpu")  # MemAvailable in bytes on Linux; not known elsewhere
    assert free > 2**20 if sys.platform.startswith("linux") else free is None


def test_a_run_never_writes_into_a_dataset_or_the_repository(tmp_path):
    """out_dir=data/NAME (a prepared dataset) or . in the repository would put ckpt.pt, config.json and
    metrics.jsonl among the bins or the code: refused before anything is written."""
    make_dataset(tmp_path / "data")
    before = sorted(os.listdir(tmp_path / "data" / "tiny"))
    for out, found in ((tmp_path / "data" / "tiny", "train.bin, val.bin, meta.json"),
                       (ROOT, "nlq's own code: out_dir is the repository")):
        with pytest.raises(ValueError, match=f"out_dir {re.escape(str(out))} holds a Hugging Face export, a "
                                             f"prepared dataset or another program's files \\({found}\\): the run "
                                             f"would write its checkpoint and config.json among them"):
            train.train(tiny_cfg(tmp_path / "data", out))
    assert sorted(os.listdir(tmp_path / "data" / "tiny")) == before
    assert not any((ROOT / f).exists() for f in ("ckpt.pt", "config.json", "metrics.jsonl"))


def test_sampling_needs_only_the_same_tokenizer_not_the_same_data(trained):
    """Text re-prepared with the same characters (new hashes) still decodes this model's ids: sample.py's and
    HellaSwag's dataset lookup (need_data=False) accepts it, where evaluating on it (need_data) does not, and
    other characters are refused for both."""
    import sample
    data, out = trained
    meta = json.loads((data / "tiny" / "meta.json").read_text())
    write_meta(data / "tiny", json.dumps({**meta, "sha256": {**meta["sha256"], "train.bin": "c" * 64}}))
    found, folder = sample.find_dataset(str(out), str(data), need_data=False)
    assert found["sha256"]["train.bin"] == "c" * 64 and folder == str(data / "tiny")
    with pytest.raises(ValueError, match=r"is not the data this checkpoint was trained on \(sha256 of train.bin"):
        sample.find_dataset(str(out), str(data), need_data=True)
    write_meta(data / "tiny", json.dumps({**meta, "chars": meta["chars"][::-1]}))
    with pytest.raises(ValueError, match=r"is not tokenised as this checkpoint's training data was \(other "
                                         r"characters, or the same in another order\)"):
        sample.find_dataset(str(out), str(data), need_data=False)
    # another char text with fewer characters: preparing it again cannot help, so that is not the advice
    write_meta(data / "tiny", json.dumps({**meta, "chars": meta["chars"][:6], "vocab_size": 6}))
    with pytest.raises(ValueError) as e:
        sample.find_dataset(str(out), str(data), need_data=False)
    assert f"(vocab_size {meta['vocab_size']} at training, 6 now)" in str(e.value)
    assert str(e.value).endswith("other tokens to the model; a char vocabulary is its own dataset's characters, "
                                 "so a char model reads only text whose meta.json lists the characters of its "
                                 "training data in the same order")


@pytest.mark.parametrize("key, value, named", [
    ("rng", None, "rng is NoneType, not list"), ("iter_num", "5", "iter_num is str, not int"),
    ("config", None, "config is NoneType, not dict"), ("rng", [None], "rng is [None], not a dict of RNG states")])
def test_a_checkpoint_entry_of_the_wrong_type_is_named(trained, key, value, named):
    """Edited by hand (an adversarial trial), they failed with TypeErrors deep in a resume."""
    data, out = trained
    ckpt = common.torch.load(out / "ckpt.pt", weights_only=True)
    ckpt[key] = value
    common.torch.save(ckpt, out / "ckpt.pt")
    with pytest.raises(ValueError, match=rf"ckpt.pt is damaged or was edited \({re.escape(named)}.*\); restore a "
                                         r"copy, or delete it to start again"):
        train.train(tiny_cfg(data, out, init_from="resume", max_iters=4))


def test_weights_that_do_not_fit_their_settings_are_named(trained):
    import eval as nlq_eval
    import sample
    data, out = trained
    ckpt = common.torch.load(out / "ckpt.pt", weights_only=True)
    ckpt["model"]["transformer.wpe.weight"] = common.torch.zeros(4, 16)  # block_size is 8
    common.torch.save(ckpt, out / "ckpt.pt")
    message = (r"ckpt.pt does not fit the model of its own settings \(Error\(s\) in loading state_dict "
               r"for GPT: size mismatch for transformer.wpe.weight.*\): it is damaged or was edited; restore")
    with pytest.raises(ValueError, match=message):
        train.train(tiny_cfg(data, out, init_from="resume", max_iters=4))
    for main in (sample.main, nlq_eval.main):
        with pytest.raises(ValueError, match=message):
            main(["--out_dir", str(out)])


# ------------------------------------------------------------------------------------------ eval, bench
def test_an_unwritable_json_path_fails_before_the_work(trained, capsys, monkeypatch):
    import bench
    import eval as nlq_eval
    _, out = trained
    monkeypatch.setattr(nlq_eval, "evaluate", lambda *a: pytest.fail("evaluated before checking --json"))
    with pytest.raises(SystemExit) as e:  # /proc/x.json: the folder exists, but no file can be made there
        nlq_eval.main(["--out_dir", str(out), "--json", "/proc/x.json"])
    assert e.value.code == 2 and "--json /proc/x.json: cannot create its folder or write in it" in \
        capsys.readouterr().err
    monkeypatch.setattr(bench, "bench", lambda *a: pytest.fail("benchmarked before checking --json"))
    with pytest.raises(ValueError, match=r"--json /proc/x.json: cannot create its folder or write in it"):
        bench.main(["--device=cpu", "--json=/proc/x.json"])


def test_a_json_path_never_overwrites_a_file_the_command_did_not_write(trained, tmp_path, capsys, monkeypatch):
    """--json at a checkpoint, a run's config.json or its metrics.jsonl (an adversarial trial overwrote these and
    a dataset's meta.json) is refused before the work, the file intact, a large file unread; the command's own
    earlier output is replaced."""
    import bench
    import eval as nlq_eval
    _, out = trained
    monkeypatch.setattr(nlq_eval, "evaluate", lambda *a: pytest.fail("evaluated before checking --json"))
    monkeypatch.setattr(bench, "bench", lambda *a: pytest.fail("benchmarked before checking --json"))
    bench_rows = tmp_path / "bench.json"
    bench_rows.write_text(json.dumps([dict(query_mode="linear", ms_per_iter=1.0)]))
    for name in ("ckpt.pt", "config.json", "metrics.jsonl"):
        before = (out / name).read_bytes()
        with pytest.raises(SystemExit) as e:
            nlq_eval.main(["--out_dir", str(out), "--json", str(out / name)])
        stem = os.path.splitext(out / name)[0]
        assert e.value.code == 2 and (f"--json {out / name} exists and is not a results file this command "
                                      f"wrote: it would be overwritten; give a new file, e.g. "
                                      f"{stem}_results.json") in " ".join(capsys.readouterr().err.split())
        with pytest.raises(ValueError, match=f"--json {re.escape(str(out / name))} exists and is not a results"):
            bench.main(["--device=cpu", f"--json={out / name}"])
        assert (out / name).read_bytes() == before
    with pytest.raises(SystemExit):  # another command's results: not eval's
        nlq_eval.main(["--out_dir", str(out), "--json", str(bench_rows)])
    monkeypatch.setattr(bench, "bench", lambda *a: ([dict(query_mode="identity", ms_per_iter=2.0)], "cpu"))
    monkeypatch.setattr(bench, "table", lambda rows, device: "")
    bench.main(["--device=cpu", f"--json={bench_rows}"])  # its own: replaced
    assert json.loads(bench_rows.read_text()) == [dict(query_mode="identity", ms_per_iter=2.0)]
    big = tmp_path / "big.pt"  # a checkpoint of gigabytes is refused without being read
    with open(big, "wb") as f:
        f.truncate(3 * 2**30)  # sparse: no disk used
    with monkeypatch.context() as mp, pytest.raises(ValueError, match="exists and is not a results file"):
        mp.setattr(common.json, "load", lambda f: pytest.fail("a large file was read"))
        bench.main(["--device=cpu", f"--json={big}"])
    evaluated = tmp_path / "eval.json"
    evaluated.write_text(json.dumps(dict(out_dir="o", iter=3, dtype="float32", loss=2.0)))
    monkeypatch.setattr(nlq_eval, "evaluate", lambda *a: dict(out_dir="o", iter=4, dtype="float32", loss=1.0))
    monkeypatch.setattr(nlq_eval, "table", lambda r: "")
    nlq_eval.main(["--out_dir", str(out), "--json", str(evaluated)])
    assert json.loads(evaluated.read_text())["iter"] == 4


def test_a_hellaswag_file_that_is_not_text_or_a_folder_is_named(trained, tmp_path):
    import eval as nlq_eval
    _, out = trained
    line = b'{"ctx": "a", "endings": ["a", "b", "c", "d"], "label": 0}\n'
    (tmp_path / "hs.jsonl").write_bytes(line + b"\xff\xfe")
    with pytest.raises(ValueError, match=r"hs.jsonl:2: not UTF-8 text \(byte 58\); it should be hellaswag"):
        nlq_eval.main(["--out_dir", str(out), "--hellaswag", str(tmp_path / "hs.jsonl")])
    with pytest.raises(FileNotFoundError, match=r"HellaSwag file .* is a folder; download hellaswag_val"):
        nlq_eval.main(["--out_dir", str(out), "--hellaswag", str(tmp_path)])


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
    ("learning_rates = [1e-2, float('inf')]", r"learning_rates must be .* \(not a positive finite number: inf\)"),
    ("learning_rates = [-1e-2]", r"learning_rates must be .* \(not a positive finite number: -0.01\)"),
    ("seeds = [True]", r"seeds must be a non-empty list of ints"),
    ("learning_rates = [1e-3]", r"arm linear has one learning rate \(0.001\) but selection_seeds are set: a "
                                r"search needs a grid of two or more rates .* or selection_seeds = \[\] to run"),
    ("max_extensions = -1", r"max_extensions must be an int >= 0"),
    ("half_steps = 'no'", r"half_steps must be True or False"),
    ("overrides = {'learning_rate': 1e-3}", r"overrides sets learning_rate, which sweep.py sets for every "
                                           r"run \(it would be ignored\); set it with learning_rates"),
    ("overrides = {'min_lr': 0.0}", r"overrides sets min_lr.*set it with each arm's min_lr"),
    ("arms = {'linear': dict(seed=5)}", r"arm linear sets seed.*set it with selection_seeds and seeds"),
    # and these were tracebacks
    ("arms = {'linear': 5}", r"arms must be a non-empty dict: arm name \(a plain folder name: letters, digits, "
                             r"_ . -\) -> dict"),
    ("arms = {'linear': {}, 'lin/ear': {}}", r"arm name 'lin/ear' is not a plain folder name \(letters, digits, "
                                            r"_ . -; not starting with . or -\); rename the arm"),
    ("arms = {'.hidden': {}}", r"arm name '.hidden' is not a plain folder name"),
    ("overrides = 5", r"overrides must be a dict of train.py keys"),
    ("overrides = {'n_layer': '2'}", r"overrides: config key 'n_layer' needs an int, got '2' \(str\)"),
    ("arms = {'linear': dict(qk_norm=1)}", r"arm linear: config key 'qk_norm' needs a bool, got 1 \(int\)"),
    ("config = 5", r"config must be the path of a train.py config file"),
    ("name = 5\nruns_dir = None", r"name must be a plain folder name"),
    ("name = '.'", r"name must be a plain folder name"),
    ("name = '-x'", r"name must be a plain folder name \(letters, digits, _ . -; not starting with . or -\)"),
    ("name = 'my study'", r"name must be a plain folder name"),
    ("runs_dir = 5", r"runs_dir must be a folder path"),
    ("contrasts = [('linear', 'lineer', 'a typo')]", r"contrasts name \['lineer'\], which are not arms of this "
                                                     r"study; its arms: linear, nonlinear"),
    ("contrasts = [('linear', 'linear', 'itself')]", r"contrasts must be .* of two different arms"),
    ("contrasts = ('linear', 'linear')", r"contrasts must be a list"),
    ("contrasts = [(['linear'], 'linear', 'a list')]", r"contrasts must be a list of \(arm"),  # was TypeError
])
def test_odd_study_files_are_refused_before_any_run(study, edit, message):
    import sweep
    study.write_text(study.read_text() + edit + "\n")
    with pytest.raises(ValueError, match=message):
        sweep.load_study(str(study))


def test_a_runs_dir_that_is_a_file_and_bad_counts_are_refused(study, capsys):
    import sweep
    (study.parent / "runs").write_text("not a folder")
    with pytest.raises(ValueError, match=r"runs_dir .*runs is a file; choose a folder"):
        sweep.main([str(study)])
    for option in ("--print", "--threads", "--slurm_time"):  # --print 0 used to run the whole sweep
        with pytest.raises(SystemExit) as e:
            sweep.main([str(study), option, "0"])
        assert e.value.code == 2 and f"{option} must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        sweep.main([str(study), "--poll_s", "-1"])
    assert e.value.code == 2 and "--poll_s -1: must be a positive number" in capsys.readouterr().err
    (study.parent / "runs").unlink()
    if shutil.which("sbatch") is None:  # no SLURM here: said at once, and no run folder is left behind
        with pytest.raises(SystemExit) as e:
            sweep.main([str(study), "--executor", "slurm"])
        assert e.value.code == 2 and "sbatch, which is not on PATH here" in capsys.readouterr().err
        assert not (study.parent / "runs").exists()


# ------------------------------------------------------------------------------------ run logs, reports
@pytest.mark.parametrize("line", ['garbage', '{"val_loss": 1.0}', '[1]', '{"iter": 4, "val_loss": "abc"}'])
def test_a_damaged_metrics_line_is_named_with_the_fix(line, tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"iter": 0, "val_loss": 4.2}\n' + line + '\n{"iter": 5}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl: line 2 is not a metrics row \(a JSON object with "
                                         r"an int iter and numbers as losses\); the log is damaged: restore"):
        common.read_metrics(str(tmp_path))
    (tmp_path / "metrics.jsonl").write_text('{"iter": 0, "val_loss": 4.2}\n{"iter": 5, "val_lo')  # cut short
    assert common.read_metrics(str(tmp_path)) == [{"iter": 0, "val_loss": 4.2}]


def test_report_names_a_damaged_config_json_and_an_out_that_is_a_file(study, capsys):
    import report
    import sweep
    loaded = sweep.load_study(str(study))
    out = sweep.run_dir(loaded, "linear", 1e-2, 1)
    os.makedirs(out)
    for text in ("garbage", "[1]"):
        (Path(out) / "config.json").write_text(text)
        with pytest.raises(ValueError, match=r"config.json is damaged \(not a JSON object of settings\); "
                                             r"restore it from a copy, or delete its run folder"):
            report.main([str(study), "--out", str(study.parent / "report")])
    os.remove(Path(out) / "config.json")  # (load_study checks the runs first)
    (study.parent / "file").write_text("")
    with pytest.raises(SystemExit) as e:
        report.main([str(study), "--out", str(study.parent / "file")])
    assert e.value.code == 2 and "file: cannot create the folder (File exists)" in capsys.readouterr().err


def test_bench_says_when_its_timings_are_unreliable(monkeypatch):
    """bench.py on a busy CPU: a 2-thread bench beside another job ran 100x slower with a p90 5.6x its p10 and
    ratios of 0.4 that looked like results. It warns before timing when the load average leaves fewer idle cores
    than its threads, and the table says so when a mode's step times spread widely."""
    import bench
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(bench.torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (1.2, 1.0, 1.0))
    assert bench.busy_warning("cpu").startswith("warning: the machine is busy (load average 1.2 on 2 cores) and "
                                                "the bench runs 2 threads: steps will be slow")
    assert bench.busy_warning("cuda") is None
    monkeypatch.setattr(os, "getloadavg", lambda: (0.4, 1.0, 1.0))  # idle but for the bench itself
    assert bench.busy_warning("cpu") is None
    row = dict(query_mode="linear", compile=False, dtype="float32", parallel="single", world_size=1, batch_size=2,
               block_size=8, ms_per_iter=10.0, ms_p10=9.0, ms_p90=11.0, tokens_per_s=1600.0, mfu=None,
               peak_mem_mb=100.0, peak_mem_mb_per_rank=[100.0], params=1000, vocab_size=64)
    steady = bench.table([row, {**row, "query_mode": "nonlinear"}], "cpu")
    assert "spread widely" not in steady and len(steady.splitlines()) == 6  # the last: the CPU's memory column
    noisy = bench.table([row, {**row, "query_mode": "nonlinear", "ms_p10": 5.0, "ms_p90": 28.0}], "cpu")
    assert noisy.splitlines()[-2] == ("(the step times spread widely: nonlinear's p90 is 5.6x its p10. The machine "
                                      "was busy or its speed drifted, so the ratios are uncertain: run again on "
                                      "idle cores, or with more --rounds)")


# ---------------------------------------------------------------------------------- bench/kv_cache.py
@pytest.mark.parametrize("args,expected", [
    (["--n_head=3"], "n_embd=128 is not divisible by n_head=3"),  # these three were tracebacks
    (["--vocab_size=0"], "vocab_size=0 must be a positive integer"),
    (["--device=gpu"], "device='gpu'; use auto, cpu, cuda, cuda:N or mps"),
    (["--threads=0"], "--threads must be >= 1"),  # was ignored
])
def test_kv_cache_bench_arguments(args, expected, capsys):
    sys.path.insert(0, str(ROOT / "bench"))
    import kv_cache
    with pytest.raises(SystemExit) as e:
        kv_cache.parse_args(args)
    assert e.value.code == 2 and expected in capsys.readouterr().err


@pytest.mark.parametrize("args,expected", [  # each was a traceback
    (["--n_head=0"], "n_head=0 must be a positive integer"),
    (["--n_embd=30", "--n_head=4"], "n_embd=30 is not divisible by n_head=4"),
    (["--block_size=0"], "block_size=0 must be a positive integer"),
    (["--device=bogus"], "device='bogus'; use auto, cpu, cuda, cuda:N or mps"),
])
def test_saved_activations_arguments(args, expected, capsys):
    sys.path.insert(0, str(ROOT / "bench"))
    import saved_activations
    with pytest.raises(SystemExit) as e:
        saved_activations.main(args)
    assert e.value.code == 2 and expected in capsys.readouterr().err


def test_a_tilde_after_the_equals_sign_means_the_home_folder(tmp_path, monkeypatch):
    """The shell expands ~ only at the start of a word, so --out_dir=~/runs reached the scripts as it is and
    train.py wrote into a folder named ~ in the current one."""
    import convert
    import prepare_data
    import sample
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = common.parse_config(["--out_dir=~/runs", "--data_dir=~/data"])
    assert (cfg["out_dir"], cfg["data_dir"]) == (str(tmp_path / "runs"), str(tmp_path / "data"))
    assert sample.parse_args(["--out_dir=~/runs"]).out_dir == str(tmp_path / "runs")
    assert prepare_data.parse_args(["shakespeare_char", "--data_dir=~/d"]).data_dir == str(tmp_path / "d")
    make_dataset(tmp_path / "data")
    with pytest.raises(FileNotFoundError, match=f"{tmp_path}/ckpt.pt is not a file"):
        convert.main(["official", "~/ckpt.pt", "--out_dir=~/out", "--dataset=tiny", "--data_dir=~/data"])


def test_a_char_dataset_without_its_characters_is_named_in_sample_and_eval(tmp_path):
    import eval as nlq_eval
    import sample
    meta = make_dataset(tmp_path / "data") / "meta.json"
    cfg = json.loads(meta.read_text())
    del cfg["chars"]
    meta.write_text(json.dumps(cfg))
    train.train(tiny_cfg(tmp_path / "data", tmp_path / "out", max_iters=0))
    for main in (sample.main, nlq_eval.main):  # were KeyError tracebacks
        with pytest.raises(ValueError, match=r"has tokenizer char but no list of chars: it was not written "
                                             r"by prepare_data.py; prepare the dataset again"):
            main(["--out_dir", str(tmp_path / "out")])
    import prepare_data  # a meta.json without a name: the message named it with a KeyError
    with pytest.raises(ValueError, match=r"characters \['b'\] are not in the vocabulary of dataset None"):
        prepare_data.get_codec({"tokenizer": "char", "chars": ["a"]})[0]("b")


def test_ctrl_c_during_an_evaluation_is_one_line_and_writes_nothing(tmp_path):
    make_dataset(tmp_path / "data", tokenizer="byte")  # HellaSwag needs a space
    out = tmp_path / "out"
    train.train(tiny_cfg(tmp_path / "data", out, max_iters=0))
    example = json.dumps({"activity_label": "0", "ctx_a": "12", "ctx_b": "3", "endings": ["45", "67", "89", "::"],
                          "label": 0})
    (tmp_path / "hs.jsonl").write_text((example + "\n") * 20000)
    proc = interruptible([sys.executable, "eval.py", f"--out_dir={out}", "--batch_size=1",
                          f"--hellaswag={tmp_path / 'hs.jsonl'}", f"--json={tmp_path / 'r.json'}"])
    with proc:
        err = ""
        while "hellaswag:" not in err and proc.poll() is None:  # tqdm's bar: the scoring has begun
            err += proc.stderr.read(1)
        err += interrupt(proc)
    assert proc.returncode == 1 and err.endswith("interrupted; nothing was written\n"), err[-2000:]
    assert "Traceback" not in err and not (tmp_path / "r.json").exists()


def test_sample_seed_out_of_range(capsys):
    import sample
    with pytest.raises(SystemExit) as e:  # was "error: Overflow when unpacking long long"
        sample.parse_args(["--seed=99999999999999999999"])
    assert e.value.code == 2 and "--seed is too large; use |seed| < 2**62" in capsys.readouterr().err


def test_a_run_that_ends_without_an_error_but_unfinished_is_not_launched_forever(study, monkeypatch):
    """A run whose checkpoint is at max_iters but whose metrics.jsonl lost its rows exits 0 without training;
    sweep.py used to launch it again and again."""
    import sweep
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
    query modes' aliases as train.py does; bench/gpu_sanity.py answers --help and refuses other arguments (it
    ran the whole check)."""
    import bench
    import sample
    sys.path.insert(0, str(ROOT / "bench"))
    import gpu_sanity
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(ValueError, match="--start FILE:.*empty.txt: the file is empty; write the prompt in it"):
        sample.prompt_ids(f"FILE:{tmp_path / 'empty.txt'}", dict(tokenizer="char"), lambda t: [1] * len(t))
    (tmp_path / "prompt.txt").write_text("ab")
    assert sample.prompt_ids(f"FILE:{tmp_path / 'prompt.txt'}", dict(tokenizer="char"), lambda t: [7] * len(t)) \
        == [7, 7]
    opts, _ = bench.split_args(["--query_modes=original,residual_gelu"])
    assert opts["query_modes"] == "linear,nonlinear"
    with pytest.raises(ValueError, match="names a mode twice \\(aliases: original = linear"):
        bench.split_args(["--query_modes=original,linear"])
    with pytest.raises(SystemExit) as e:
        gpu_sanity.main(["--help"])
    assert e.value.code == 0 and "Numerical checks that only a GPU can run" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        gpu_sanity.main(["--steps=3"])
    assert e.value.code == 2 and "unrecognized arguments: --steps=3" in capsys.readouterr().err


def test_two_writers_of_one_path_never_take_each_others_temp_file(tmp_path):
    """Two report.py runs into one --out: with one temp name per path (path + '.tmp') the second writer wrote
    into the first's temp file and renamed it away, and the first failed ('No such file ... .tmp')."""
    path = str(tmp_path / "val_loss.png")

    def first(tmp):
        with open(tmp, "w") as f:
            f.write("first")
        common.atomic_write_text(path, "second")  # another process writes the same path meanwhile

    common.replace_atomically(path, first)
    assert open(path).read() == "first" and os.listdir(tmp_path) == ["val_loss.png"]  # the last rename wins


def test_a_data_dir_that_cannot_be_opened_is_not_blamed_on_out_dir(tmp_path):
    """An OSError on a path outside out_dir (here a data_dir whose name is longer than the file system allows:
    an adversarial trial got 'mend that path or choose another out_dir') names the path, not out_dir."""
    data_dir = tmp_path / ("d" * 300)
    code, err = run_script("train.py", f"--data_dir={data_dir}", "--dataset=tiny", "--device=cpu",
                           f"--out_dir={tmp_path / 'out'}", "--max_iters=1")
    assert code == 1 and "Traceback" not in err, err
    assert err.splitlines()[-1].startswith("error: [Errno 36] File name too long") and "d" * 300 in err, err
    assert err.splitlines()[-1].endswith("; mend that path"), err


def test_a_link_to_nothing_where_an_output_folder_goes_is_named(tmp_path):
    """A symbolic link to a path that does not exist, as data_dir, out_dir or an export folder (or above it):
    an adversarial trial got 'File exists' and 'is a file'; the message names the link and where it points."""
    import prepare_data
    link, target = tmp_path / "gone", tmp_path / "nowhere"
    link.symlink_to(target)
    named = f"{link} is a link to {target}, which does not exist"
    with pytest.raises(SystemExit) as e:
        prepare_data.main(["shakespeare_char", "--data_dir", str(link)])
    assert f"cannot write the output folder {link / 'shakespeare_char'} (File exists); {named}; choose" in e.value.code
    for out_dir in (link, link / "run"):
        with pytest.raises(ValueError, match=re.escape(f"; {named}; choose a writable folder")):
            train.checkpoint_to_resume({"out_dir": str(out_dir), "init_from": "scratch"}, None,
                                       str(out_dir / "ckpt.pt"), None, None)
    with pytest.raises(ValueError, match=re.escape(f"--out {link} is a link to {target}, which does not exist; ")):
        common.check_creatable_folder(str(link), "--out", "hf/NAME")
    with pytest.raises(ValueError, match=re.escape(f"--out {link / 'x'} cannot be made: {named}; ")):
        common.check_creatable_folder(str(link / "x"), "--out", "hf/NAME")
    assert sorted(os.listdir(tmp_path)) == ["gone"]  # nothing was made, the link is untouched
