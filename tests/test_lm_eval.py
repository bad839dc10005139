"""lm-evaluation-harness's hellaswag task on an exported nlq model scores each ending with nlq's own
log-probabilities (its acc and acc_norm follow), and a generation task gives nlq's greedy text, at batch size 1
and 4 alike (left-padded batches): a tiny random nonlinear rope model with GPT-2's vocabulary, exported with its
modeling code, local data files and the harness's own hellaswag task pointed at them (no download; conftest.py
sets the Hugging Face libraries offline)."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from test_hf import BYTE_META, random_gpt

from interop import convert, hf
from model import GPT, GPTConfig
from nlq import checkpoint, settings
from nlq import tokenizers

pytestmark = pytest.mark.xdist_group("lm_eval")  # one worker imports lm-evaluation-harness (4 s) once

EXAMPLES = [  # HellaSwag's fields, WikiHow markers included; the last context is longer than block_size
    dict(activity_label="Making a cake", ctx_a="A woman stands in a kitchen.", ctx_b="she",
         endings=["cracks eggs into a bowl.", "rides a horse [title] fast.", "sings loudly.", "reads."], label=0),
    dict(activity_label="Home and Garden", ctx_a="[header] How to water plants [title] Check the soil.",
         ctx_b="[step] if it is dry,", endings=["water it.", "leave it [step] alone.", "paint it.", "eat it."],
         label="1"),
    dict(activity_label="Running", ctx_a="A man runs down a road.", ctx_b="he",
         endings=["stops.", "keeps running down the road.", "flies.", "is a cat."], label=2),
    dict(activity_label="Piano", ctx_a="A girl sits at a piano.", ctx_b="she",
         endings=["plays a song.", "eats it.", "jumps.", "runs away from the piano quickly."], label=3),
    dict(activity_label="Long", ctx_a="The quick brown fox jumps over the lazy dog. " * 6, ctx_b="then it",
         endings=["sleeps.", "barks at the moon for a very long time.", "runs.", "eats."], label=1),
]


PROMPTS = ["The capital of France is", "Once upon a time, in a land far away, there lived", "1 2 3",
           "A cat sat on the mat and then"]  # a generation task; lengths differ, so a batch of 4 is padded


@pytest.fixture(scope="module")
def exported(shipped_data, tmp_path_factory):
    """(nlq run folder, transformers folder, HellaSwag file, task folder)."""
    root = tmp_path_factory.mktemp("lm_eval")
    torch.manual_seed(1)  # (seed 0's rope model gets none of the 5 examples right: acc 0)
    cfg = GPTConfig(block_size=48, vocab_size=50304, data_vocab_size=50257, n_layer=2, n_head=2, n_embd=32,
                    query_mode="nonlinear", pos_embedding="rope")  # today's positions: the harness pads left
    model = GPT(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    run = root / "run"  # a run folder as convert.py official --tokenizer gpt2 writes it: no dataset
    run.mkdir()
    meta = convert.tokenizer_meta("gpt2", "openwebtext")
    torch.save(dict(
        model=model.state_dict(), optimizer={}, iter_num=0, rng=[], model_args=vars(cfg), dataset_meta=meta,
        config=dict(settings.DEFAULTS, data_dir=str(root / "no_data"))), run / "ckpt.pt")
    convert.main(["hf", str(run), f"--out={root / 'hf'}", f"--bpe_dir={shipped_data / 'gpt2'}"])
    path = root / "hs.jsonl"
    path.write_text("".join(json.dumps(ex) + "\n" for ex in EXAMPLES))
    tasks = root / "tasks"
    tasks.mkdir()
    (root / "gen.jsonl").write_text("".join(json.dumps(dict(prompt=p, target="")) + "\n" for p in PROMPTS))
    (tasks / "nlq_generate_local.yaml").write_text(f"""\
task: nlq_generate_local
dataset_path: json
dataset_kwargs:
  data_files:
    validation: {root / "gen.jsonl"}
output_type: generate_until
validation_split: validation
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{target}}}}"
generation_kwargs:
  until: ["\\n\\n"]
  max_gen_toks: 8
  do_sample: false
metric_list:
  - metric: exact_match
""")
    from lm_eval import tasks as lm_eval_tasks
    harness_hellaswag = Path(lm_eval_tasks.__file__).parent / "hellaswag" / "hellaswag.yaml"
    (tasks / "nlq_hellaswag_local.yaml").write_text(f"""\
include: {harness_hellaswag}
task: nlq_hellaswag_local
tag: []
dataset_path: json
dataset_kwargs:
  data_files:
    validation: {path}
training_split: null
""")
    return run, root / "hf", path, tasks


def reference_hellaswag(model, encode, examples):
    """Each ending's summed log-probability under the nlq model, as the harness's hellaswag task defines it:
    context = preprocess(activity_label + ": " + ctx_a + " " + ctx_b capitalized), continuation = " " + ending,
    its tokens those that follow the context's own encoding, the text cropped from the left to block_size + 1
    tokens -> (scores (N, 4), acc, acc_norm (scores over the ending's length in characters), number cropped)."""
    from lm_eval.tasks.hellaswag.utils import preprocess
    T, scores, lengths, cropped = model.config.block_size, [], [], 0
    for ex in examples:
        context = preprocess(ex["activity_label"] + ": " + ex["ctx_a"] + " " + ex["ctx_b"].capitalize())
        for ending in map(preprocess, ex["endings"]):
            ids = encode(context + " " + ending)
            n = len(ids) - len(encode(context))
            cropped += len(ids) > T + 1
            x = torch.tensor([ids[-(T + 1):]])
            with torch.no_grad():
                logp = model(x[:, :-1], targets=x[:, 1:])[0][0].log_softmax(-1).gather(-1, x[0, 1:, None])
            scores.append(logp[-n:].sum().item())
            lengths.append(len(ending))
    scores, labels = np.array(scores).reshape(-1, 4), np.array([int(ex["label"]) for ex in examples])
    acc = np.mean(scores.argmax(1) == labels)
    acc_norm = np.mean((scores / np.array(lengths).reshape(-1, 4)).argmax(1) == labels)
    return scores, acc, acc_norm, cropped


def test_lm_eval_hellaswag_scores_with_the_models_own_log_probabilities_at_batch_sizes_1_and_4(exported,
                                                                                                shipped_data):
    import lm_eval
    from lm_eval.tasks import TaskManager
    run, hf_dir, path, tasks = exported
    model, _ = checkpoint.load_run(str(run))
    encode, decode = tokenizers.get_codec(dict(tokenizer="gpt2"), str(shipped_data / "gpt2"))
    scores, acc, acc_norm, cropped = reference_hellaswag(model, encode, EXAMPLES)
    assert cropped == 4 and 0 < acc < 1  # the long context loses tokens to block_size 48
    texts = {}
    task_manager = TaskManager(include_path=str(tasks))  # indexes every task of the harness: once
    for batch_size in (1, 4):
        res = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={hf_dir},trust_remote_code=True,"
                                      "dtype=float32", tasks=["nlq_hellaswag_local", "nlq_generate_local"],
                                      device="cpu", batch_size=batch_size,
                                      task_manager=task_manager)
        theirs = res["results"]["nlq_hellaswag_local"]
        assert theirs["acc,none"] == pytest.approx(acc) and theirs["acc_norm,none"] == pytest.approx(acc_norm)
        samples = {task: sorted(res["samples"][task], key=lambda s: s["doc_id"]) for task in res["samples"]}
        lls = np.array([[r[0][0] for r in s["resps"]] for s in samples["nlq_hellaswag_local"]])
        np.testing.assert_allclose(lls, scores, rtol=0, atol=1e-4)  # the harness's per-ending log-likelihoods
        texts[batch_size] = [s["resps"][0][0] for s in samples["nlq_generate_local"]]
    # the generation task: each prompt's greedy text is nlq's own, alone or in a left-padded batch of 4
    want = [decode(model.generate(torch.tensor([encode(p)]), 8, temperature=0)[0, len(encode(p)):].tolist())
            .split("\n\n")[0] for p in PROMPTS]
    assert texts[1] == texts[4] == want and len(set(want)) == len(PROMPTS)


def test_a_byte_export_is_scored_with_the_prefix_token_its_note_names(tmp_path):
    """A byte model never saw its end-of-text token, which the harness would start a text with: the export's
    note names the newline as prefix_token_id, and with it the harness's rolling log-likelihood of a text is
    nlq's own sum of log-probabilities of the text after a newline."""
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM
    model = random_gpt(query_mode="nonlinear", vocab_size=256, data_vocab_size=256)
    notes = hf.export(model, BYTE_META, str(tmp_path / "hf"))
    assert ("lm-evaluation-harness starts a text without context from the end-of-text token, which the model "
            "never saw: add prefix_token_id=10 (a newline, or a token that starts texts in the training data) to "
            "lm_eval's --model_args") in notes
    lm = HFLM(pretrained=str(tmp_path / "hf"), trust_remote_code=True, dtype="float32", device="cpu",
              batch_size=1, prefix_token_id=10)
    text = "hello world"
    theirs = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)], disable_tqdm=True)
    ids = torch.tensor([list(b"\n" + text.encode())])  # 12 tokens <= block_size 16: one window
    with torch.no_grad():
        logp = model(ids, targets=ids)[0].log_softmax(-1)[0, :-1].gather(-1, ids[0, 1:, None]).sum()
    assert theirs[0] == pytest.approx(logp.item(), abs=1e-4)


def test_generation_tasks_run_on_a_byte_export_at_batch_sizes_1_and_4(tmp_path):
    """The harness's generate_until needs an end-of-text token and a pad token (it failed with "'None' is not an
    instance of 'Sequence'"): a byte export's is byte 0xFF, which no UTF-8 text holds. Each prompt's text is
    nlq's own greedy continuation, alone or in a left-padded batch of 4, cut at the task's stop sequence."""
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM
    model = random_gpt(query_mode="nonlinear", vocab_size=256, data_vocab_size=256, block_size=64)
    hf.export(model, BYTE_META, str(tmp_path / "hf"))
    encode, decode = tokenizers.get_codec(BYTE_META)
    want = [decode(model.generate(torch.tensor([encode(p)]), 12, temperature=0)[0, len(encode(p)):].tolist())
            .split("\n\n")[0] for p in PROMPTS]
    for batch_size in (1, 4):
        lm = HFLM(pretrained=str(tmp_path / "hf"), trust_remote_code=True, dtype="float32", device="cpu",
                  batch_size=batch_size)
        requests = [Instance("generate_until", {}, (p, dict(until=["\n\n"], max_gen_toks=12, do_sample=False)), i)
                    for i, p in enumerate(PROMPTS)]
        assert lm.generate_until(requests, disable_tqdm=True) == want, batch_size
    assert len(set(want)) == len(PROMPTS)
