"""--help teaches: every train.py key with its default, a meaning and its allowed values; every script's
options with their defaults; sample.py and eval.py check the dataset's tokenizer before reading weights."""
import dataclasses
import inspect
import re

import pytest

import bench
import eval as nlq_eval
import prepare_data
import sample
import train
from interop import convert
from model import QUERY_MODE_ALIASES, QUERY_MODES, GPTConfig
from nlq import settings
from research import report, sweep


def test_train_help_gives_every_key_a_meaning():
    text = train.usage()
    lines = {m.group(1): m.group(2) for m in re.finditer(r"^  --(\w+)=\S+\s+(.*)$", text, re.M)}
    assert set(lines) == set(settings.DEFAULTS)  # every key, nothing else
    assert all(len(meaning.strip()) > 10 for meaning in lines.values())
    assert all(f"--{k}={v!r} " in text for k, v in settings.DEFAULTS.items())  # with its default
    for mode in [*QUERY_MODES, *QUERY_MODE_ALIASES]:  # query_mode's allowed values, from model.QUERY_MODES
        assert re.search(rf"\b{mode}\b", lines["query_mode"]), mode
    assert "cosine, linear or wsd" in lines["lr_schedule"] and "scratch" in lines["init_from"]


def test_defaults_and_help_come_from_one_table():
    """A key's default, kind and meaning are written once: SETTINGS, and for the model GPTConfig's fields and the
    comments beside them; the tables the resume check and the study machinery read are SETTINGS' kinds."""
    assert settings.DEFAULTS == {k: default for k, (default, *_) in settings.SETTINGS.items()}
    fields = {f.name: f.default for f in dataclasses.fields(GPTConfig)}
    assert all(settings.DEFAULTS[k] == fields[k] for k in settings.MODEL_KEYS if k != "vocab_size")
    text = train.usage()
    source = inspect.getsource(GPTConfig)
    assert all(f"  # {meaning}\n" in source or k == "query_mode" for k, meaning in settings.MODEL_MEANINGS.items())
    assert set(settings.MODEL_MEANINGS) > set(settings.MODEL_KEYS) and "model width d\n" in text
    kinds = {k: kind for k, (_, kind, *_) in settings.SETTINGS.items()}
    assert set(settings.RESUME_FIXED) == {k for k, kind in kinds.items() if kind == "fixed"} >= {"seed", "n_layer"}
    assert settings.NOT_EXPERIMENT == {k for k, kind in kinds.items() if kind in ("log", "machine")}


@pytest.mark.parametrize("main, expected", [
    (sample.main, ["(default: out)", "(default: 200)", "(default: 0.8)", "(default: 1337)", "(default: cpu)"]),
    (nlq_eval.main, ["(default: out)", "(default: val)", "(default: cpu)", "default: the checkpoint's"]),
    (lambda argv: convert.main(["official", *argv]), ["(default: data)"]),
    (lambda argv: convert.main(["hf", *argv]), ["(default: auto)"]),
    (sweep.main, ["(default: 1)"]),
    (report.main, ["default: results/<study name>"]),
    (prepare_data.parse_args, ["(default: data)", "(default: 1234)"]),
])
def test_every_script_help_shows_its_defaults(main, expected, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert e.value.code == 0 and all(x in out for x in expected), out


def test_bench_help_shows_its_defaults_and_the_config_keys():
    text = bench.parser().format_help()
    assert text.startswith("usage: python bench.py [CONFIG_FILE.py] [--key=value ...]\n")  # like train.py's
    assert all(f"--{k} " in text for k in ("query_modes", "warmup", "steps", "rounds", "data", "threads"))
    assert "(default: 10)" in text and "(default: 50)" in text and "(default: 5)" in text
    assert all(f"--{k}=" in text for k in settings.DEFAULTS)


def test_start_up_config_is_a_block_of_short_lines():
    block = settings.format_config(settings.DEFAULTS)
    assert all(len(line) <= 110 for line in block.splitlines()) and len(block.splitlines()) > 5
    assert all(f"{k} = {v!r}" in block for k, v in settings.DEFAULTS.items())
