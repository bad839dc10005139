"""
A run's clock: step times, tokens/s, MFU, elapsed time and the ETA, for the log line printed every
log_interval steps and the timing fields of each eval's metrics row.

ms_per_iter in metrics.jsonl is the mean step time since the previous eval; the log line's is the mean since
the previous log line. Both leave out eval time and the first step after a start (it pays for compilation and
warm-up). The ETA adds the evals still to come at their mean time so far.
"""
import time


def clock(seconds):
    """Seconds as h:mm:ss (or m:ss under an hour)."""
    m, s = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def evals_after(iter_num, cfg):
    """How many fixed-window evals the loop still runs after iter_num: every eval_interval steps, and at
    max_iters."""
    last, interval = cfg["max_iters"], cfg["eval_interval"]
    return last // interval - iter_num // interval + (last % interval != 0 and iter_num < last)


class Progress:
    """Times the steps and evals of one start of a run (see the module's doc).

    model: its estimate_mfu gives the MFU; seqs_per_iter: sequences a step on one device; elapsed_before:
    seconds the run trained before this start; first_iter: the iteration this start begins at.
    """

    def __init__(self, cfg, model, tokens_per_iter, seqs_per_iter, elapsed_before, first_iter):
        self.cfg, self.model, self.tokens_per_iter, self.seqs = cfg, model, tokens_per_iter, seqs_per_iter
        self.elapsed_before, self.first_iter = elapsed_before, first_iter
        self.since_eval, self.since_log, self.since_start = [0, 0.0], [0, 0.0], [0, 0.0]  # steps, seconds
        self.evals, self.eval_seconds = 0, 0.0
        self.started = self.t0 = time.time()

    def elapsed(self):
        """Seconds the run has trained, over all its starts."""
        return round(self.elapsed_before + time.time() - self.started, 3)

    def step_done(self, iter_num):
        """Record the step that ended now -> its seconds."""
        t1 = time.time()
        dt, self.t0 = t1 - self.t0, t1
        if iter_num > self.first_iter + 1:  # the first step pays for compilation and warm-up
            for counter in (self.since_eval, self.since_log, self.since_start):
                counter[0], counter[1] = counter[0] + 1, counter[1] + dt
        return dt

    def eval_done(self, seconds):
        """Record an eval of that many seconds; the step clock restarts (eval time is not step time)."""
        self.evals, self.eval_seconds = self.evals + 1, self.eval_seconds + seconds
        self.since_eval = [0, 0.0]
        self.t0 = time.time()

    def eval_fields(self):
        """The timing fields of a metrics row: ms_per_iter, tokens_per_s, mfu (None before a timed step)."""
        steps, seconds = self.since_eval
        dt = seconds / steps if steps else None
        return dict(ms_per_iter=dt and 1000 * dt, tokens_per_s=dt and self.tokens_per_iter / dt,
                    mfu=dt and self.model.estimate_mfu(self.seqs, dt), elapsed_s=self.elapsed())

    def log_line(self, iter_num, loss, lr, dt):
        """The log line after step iter_num (dt: its seconds, used before any step is timed)."""
        step = self.since_log[1] / self.since_log[0] if self.since_log[0] else dt
        per_step = self.since_start[1] / self.since_start[0] if self.since_start[0] else dt
        eta = ((self.cfg["max_iters"] - iter_num) * per_step
               + evals_after(iter_num, self.cfg) * (self.eval_seconds / self.evals if self.evals else 0.0))
        mfu = self.model.estimate_mfu(self.seqs, step) if step > 0 else None
        self.since_log = [0, 0.0]
        return (f"iter {iter_num}: loss {loss:.4f}, lr {lr:.2e}, {1000 * step:.1f} ms/iter, "
                f"{self.tokens_per_iter / max(step, 1e-9):,.0f} tokens/s" + (f", MFU {100 * mfu:.1f}%" if mfu else "")
                + f", elapsed {clock(self.elapsed())}, ETA {clock(eta)}"
                + (" + the whole-split eval" if self.cfg["eval_full_at_end"] else ""))
