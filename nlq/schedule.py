"""
The learning-rate schedule: linear warmup, then a cosine or linear decay to min_lr at the decay's horizon (or wsd:
the rate held, then a linear decay over the horizon's last warmdown_ratio), then flat at min_lr. get_lr is the
schedule; decay_horizon says, once per start, where the decay ends (a resumed run keeps its checkpoint's) and what
the schedule does that a reader may not expect.
"""
import math
import warnings


def get_lr(it, cfg, decay_iters):
    """The learning rate of step it (0-based; iteration k of the log runs at get_lr(k - 1)): linear warmup
    (lr(0) > 0), then a cosine, linear or wsd decay (lr_schedule) to min_lr at decay_iters, then flat at min_lr.
    Optimizer groups with their own rates take the same share of theirs (train.py: lr_scale)."""
    if not cfg["decay_lr"]:
        return cfg["learning_rate"]
    if it < cfg["warmup_iters"]:
        return cfg["learning_rate"] * (it + 1) / (cfg["warmup_iters"] + 1)
    if it >= decay_iters:
        return cfg["min_lr"]
    progress = (it - cfg["warmup_iters"]) / max(1, decay_iters - cfg["warmup_iters"])  # 0 -> 1
    if cfg["lr_schedule"] == "wsd":  # 1 until decay_start, then linearly down to 0 at decay_iters
        weight = min(1.0, (decay_iters - it) / (decay_iters - decay_start(cfg, decay_iters)))
    else:
        weight = 1 - progress if cfg["lr_schedule"] == "linear" else 0.5 * (1 + math.cos(math.pi * progress))
    return cfg["min_lr"] + weight * (cfg["learning_rate"] - cfg["min_lr"])


def decay_start(cfg, decay_iters):
    """wsd: the first step of the decay, warmdown_ratio of decay_iters before it (at least one step)."""
    return decay_iters - max(1, round(cfg["warmdown_ratio"] * decay_iters))


def decay_horizon(cfg, trained, iter_num, log):
    """The iteration at which the rate reaches min_lr. A new run (trained None): lr_decay_iters, else max_iters.
    A resumed run keeps its checkpoint's (trained), so raising max_iters trains on at min_lr; an explicit
    lr_decay_iters that differs wins, with a warning naming the jump; for wsd, that is a cool-down branched at
    another horizon, refused (ValueError) from a checkpoint inside either horizon's decay. Notes on what the
    schedule does that a reader may not expect are printed for a run with steps left (schedule_notes)."""
    decay_iters = cfg["lr_decay_iters"] or trained or cfg["max_iters"]
    if iter_num >= cfg["max_iters"] or not cfg["decay_lr"]:
        return decay_iters
    if trained is not None and cfg["lr_decay_iters"] is None and trained != cfg["max_iters"]:
        log(f"note: lr_decay_iters is unset; keeping the checkpoint's schedule (decay to min_lr at iter "
            f"{trained}), not max_iters={cfg['max_iters']}; pass --lr_decay_iters=N to change it")
    elif trained not in (None, decay_iters) and cfg["lr_schedule"] == "wsd":
        start = decay_start(cfg, decay_iters)
        if iter_num > min(start, decay_start(cfg, trained)):
            raise ValueError(f"the checkpoint at iter {iter_num} is inside a wsd decay (lr_decay_iters={trained} "
                             f"decays from iter {decay_start(cfg, trained)}, {decay_iters} from iter {start}): branch "
                             f"a cool-down from a stable-phase checkpoint, or resume with lr_decay_iters={trained}")
        log(f"note: a wsd cool-down at another horizon: the rate holds until iter {start}, then decays to min_lr at "
            f"iter {decay_iters} (the checkpoint's decayed at {trained})")
    elif trained not in (None, decay_iters):
        warnings.warn(f"lr_decay_iters={decay_iters} differs from the checkpoint's {trained}: the learning rate "
                      f"at iter {iter_num} changes from {get_lr(iter_num, cfg, trained):.3e} to "
                      f"{get_lr(iter_num, cfg, decay_iters):.3e}")
    for kind, text in schedule_notes(cfg, decay_iters):
        warnings.warn(text) if kind == "warning" else log(f"note: {text}")
    return decay_iters


def schedule_notes(cfg, decay_iters):
    """What the schedule does that a reader may not expect, as [(kind 'note' | 'warning', text)]: the whole
    run is warmup, or the warmup outlasts the decay (warnings); the last steps run flat at min_lr, or the run
    stops before the decay ends (notes)."""
    warmup, steps, peak = cfg["warmup_iters"], cfg["max_iters"], cfg["learning_rate"]
    lr = lambda it: get_lr(it, cfg, decay_iters)
    if 0 < steps <= warmup:
        return [("warning", f"the whole run is warmup (warmup_iters={warmup} >= max_iters={steps}): the learning "
                            f"rate rises from {lr(0):.2e} to {lr(steps - 1):.2e} and never reaches "
                            f"learning_rate={peak:g}; lower warmup_iters")]
    out = []
    if warmup >= decay_iters:
        out.append(("warning", f"the warmup (warmup_iters={warmup}) does not end before the decay does "
                               f"(lr_decay_iters={decay_iters}): the learning rate rises to {lr(warmup - 1):.2e} "
                               f"until iteration {warmup}, then drops straight to min_lr={cfg['min_lr']:g}, with no "
                               f"decay; set lr_decay_iters above warmup_iters"))
    flat_from = max(decay_iters, warmup)  # the first step (0-based) that runs at min_lr
    if steps > flat_from:
        out.append(("note", f"the last {steps - flat_from} of {steps} steps (iterations {flat_from + 1}-{steps}) "
                            f"run at min_lr={cfg['min_lr']:g}: the schedule reaches min_lr at "
                            f"lr_decay_iters={decay_iters}"))
    elif steps < decay_iters:
        out.append(("note", f"the run stops at max_iters={steps}, before the learning rate has decayed to min_lr "
                            f"(at lr_decay_iters={decay_iters}); its last step runs at {lr(steps - 1):.2e} "
                            f"(--lr_decay_iters={steps} decays to min_lr by the last step)"))
    return out
