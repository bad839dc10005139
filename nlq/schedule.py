"""
What the learning-rate schedule (train.get_lr: linear warmup, then a cosine or linear decay to min_lr at
lr_decay_iters, then flat) does over a run: where its decay ends when a run resumes, and notes on what a reader
may not expect. lr is the schedule itself, lr(it, cfg, decay_iters), passed in by train.py.
"""
import warnings


def decay_iters_for(cfg, trained, iter_num, log, lr):
    """The iteration at which the rate reaches min_lr. A new run (trained None): lr_decay_iters, else max_iters.
    A resumed run keeps its checkpoint's (trained), so raising max_iters trains on at min_lr; an explicit
    lr_decay_iters that differs wins, with a warning naming the jump. Notes on what the schedule does that a
    reader may not expect are printed for a run with steps left (schedule_notes)."""
    decay_iters = cfg["lr_decay_iters"] or cfg["max_iters"]
    to_train = iter_num < cfg["max_iters"] and cfg["decay_lr"]
    if trained is not None and to_train:
        if cfg["lr_decay_iters"] is None and trained != cfg["max_iters"]:
            log(f"note: lr_decay_iters is unset; keeping the checkpoint's schedule (decay to min_lr at iter "
                f"{trained}), not max_iters={cfg['max_iters']}; pass --lr_decay_iters=N to change it")
        elif cfg["lr_decay_iters"] not in (None, trained):
            warnings.warn(f"lr_decay_iters={cfg['lr_decay_iters']} differs from the checkpoint's {trained}: the "
                          f"learning rate at iter {iter_num} changes from {lr(iter_num, cfg, trained):.3e} to "
                          f"{lr(iter_num, cfg, decay_iters):.3e}")
    if trained is not None and cfg["lr_decay_iters"] is None:
        decay_iters = trained
    if to_train:
        for kind, text in schedule_notes(cfg, decay_iters, lr):
            warnings.warn(text) if kind == "warning" else log(f"note: {text}")
    return decay_iters


def schedule_notes(cfg, decay_iters, lr):
    """What the schedule does that a reader may not expect, as [(kind 'note' | 'warning', text)]: the whole
    run is warmup, or the warmup outlasts the decay (warnings); the last steps run flat at min_lr, or the run
    stops before the decay ends (notes)."""
    warmup, steps, peak = cfg["warmup_iters"], cfg["max_iters"], cfg["learning_rate"]
    if 0 < steps <= warmup:
        return [("warning", f"the whole run is warmup (warmup_iters={warmup} >= max_iters={steps}): the learning "
                            f"rate rises from {lr(0, cfg, decay_iters):.2e} to "
                            f"{lr(steps - 1, cfg, decay_iters):.2e} and never reaches learning_rate={peak:g}; "
                            f"lower warmup_iters")]
    out = []
    if warmup >= decay_iters:
        out.append(("warning", f"the warmup (warmup_iters={warmup}) does not end before the decay does "
                               f"(lr_decay_iters={decay_iters}): the learning rate rises to "
                               f"{lr(warmup - 1, cfg, decay_iters):.2e} until iteration {warmup}, then drops "
                               f"straight to min_lr={cfg['min_lr']:g}, with no decay; set lr_decay_iters above "
                               f"warmup_iters"))
    flat_from = max(decay_iters, warmup)  # the first step (0-based) that runs at min_lr
    if steps > flat_from:
        out.append(("note", f"the last {steps - flat_from} of {steps} steps (iterations {flat_from + 1}-{steps}) "
                            f"run at min_lr={cfg['min_lr']:g}: the schedule reaches min_lr at "
                            f"lr_decay_iters={decay_iters}"))
    elif steps < decay_iters:
        out.append(("note", f"the run stops at max_iters={steps}, before the learning rate has decayed to min_lr "
                            f"(at lr_decay_iters={decay_iters}); its last step runs at "
                            f"{lr(steps - 1, cfg, decay_iters):.2e} (--lr_decay_iters={steps} decays to "
                            f"min_lr by the last step)"))
    return out
