"""
The learning-rate schedule: linear warmup, then a cosine or linear decay to min_lr at the decay's horizon (or wsd:
the rate held, then a linear decay over the horizon's last warmdown_ratio), then flat at min_lr. get_lr is the
schedule; decay_horizon says, once per start, where the decay ends (a resumed run keeps its checkpoint's).
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
    if cfg["lr_schedule"] == "wsd":  # 1 until decay_start, then linearly down to 0 at decay_iters
        weight = min(1.0, (decay_iters - it) / (decay_iters - decay_start(cfg, decay_iters)))
    else:
        progress = (it - cfg["warmup_iters"]) / max(1, decay_iters - cfg["warmup_iters"])  # 0 -> 1
        weight = 1 - progress if cfg["lr_schedule"] == "linear" else 0.5 * (1 + math.cos(math.pi * progress))
    return cfg["min_lr"] + weight * (cfg["learning_rate"] - cfg["min_lr"])


def decay_start(cfg, decay_iters):
    """wsd: the first step of the decay, warmdown_ratio of decay_iters before it (at least one step)."""
    return decay_iters - max(1, round(cfg["warmdown_ratio"] * decay_iters))


def decay_horizon(cfg, trained, iter_num, log):
    """The iteration at which the rate reaches min_lr. A new run (trained None): lr_decay_iters, else max_iters.
    A resumed run keeps its checkpoint's (trained), so raising max_iters trains on at min_lr; an explicit
    lr_decay_iters that differs wins, with a warning where the rate jumps; for wsd, that is a cool-down
    branched at another horizon, refused (ValueError) from a checkpoint inside either horizon's decay.
    A run with steps left is warned when its warmup outlasts the run or the decay, and told when it stops
    before the decay ends."""
    decay_iters = cfg["lr_decay_iters"] or trained or cfg["max_iters"]
    warmup, steps = cfg["warmup_iters"], cfg["max_iters"]
    if iter_num >= steps or not cfg["decay_lr"]:
        return decay_iters
    if trained is not None and cfg["lr_decay_iters"] is None and trained != steps:
        log(f"note: lr_decay_iters is unset; keeping the checkpoint's schedule (decay to min_lr at iter "
            f"{trained}), not max_iters={steps}; pass --lr_decay_iters=N to change it")
    elif trained not in (None, decay_iters):
        start = decay_start(cfg, decay_iters)
        if cfg["lr_schedule"] == "wsd" and iter_num > min(start, decay_start(cfg, trained)):
            raise ValueError(f"the checkpoint at iter {iter_num} is inside a wsd decay (lr_decay_iters={trained} "
                             f"decays from iter {decay_start(cfg, trained)}, {decay_iters} from iter {start}): branch "
                             f"a cool-down from a stable-phase checkpoint, or resume with lr_decay_iters={trained}")
        before, now = get_lr(iter_num, cfg, trained), get_lr(iter_num, cfg, decay_iters)
        if before != now:  # (a wsd cool-down branched in the stable phase starts at the same rate)
            warnings.warn(f"lr_decay_iters={decay_iters} differs from the checkpoint's {trained}: the learning "
                          f"rate at iter {iter_num} changes from {before:.3e} to {now:.3e}")
    if steps <= warmup:
        warnings.warn(f"the whole run is warmup (warmup_iters={warmup} >= max_iters={steps}): the learning rate "
                      f"never reaches learning_rate={cfg['learning_rate']:g}; lower warmup_iters")
    elif warmup >= decay_iters:
        warnings.warn(f"the warmup (warmup_iters={warmup}) does not end before the decay does (lr_decay_iters="
                      f"{decay_iters}): the rate drops from its warmup straight to min_lr; set lr_decay_iters "
                      f"above warmup_iters")
    elif steps < decay_iters:
        log(f"note: the run stops at max_iters={steps}, before the learning rate has decayed to min_lr (at "
            f"lr_decay_iters={decay_iters}); --lr_decay_iters={steps} decays to min_lr by the last step")
    return decay_iters
