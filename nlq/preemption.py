"""
Stop signals and how a run ends. A cluster warns before it takes the machine away: SLURM sends SIGTERM at a
preemption and at the time limit, or sbatch --signal's signal (USR1 by convention; submitit asks for USR2).
While a run trains these set a flag instead of killing the process; the loop reads it after each step (an eval
before each batch), checkpoints at that step boundary and exits with EXIT_PREEMPTED. Under torchrun the ranks
agree on the flag in one all-reduce, so a signal that reaches one rank stops them all at the same step.

Exit statuses (train.py's docstring lists them): EXIT_PREEMPTED is 144, the status submitit's job controller reads
as "requeue me" and none a run ends with otherwise (128 + N is death by signal N), so a sweep tells "stopped
cleanly, resumable" apart. eval.py and sample.py, with nothing to checkpoint, stop at once on these signals with
the same status (exit_on_stop_signals), as does train.py --eval_only=True.
"""
import signal
import sys
import threading
from contextlib import contextmanager

import torch

EXIT_DIVERGED, EXIT_INTERRUPTED, EXIT_PREEMPTED = 3, 130, 144
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)


class TrainingPreempted(RuntimeError):
    """A stop signal ended the run at a step boundary, after a checkpoint there."""


class StopAtBoundary(Exception):
    """Raised in the loop to stop at the current step boundary (train.Loop.stop_at checkpoints it): a stop
    signal, or Ctrl-C during an eval (ctrl_c). eval_pending: the boundary's eval has not run yet."""

    def __init__(self, eval_pending, when, ctrl_c=False):
        super().__init__(when)
        self.eval_pending, self.when, self.ctrl_c = eval_pending, when, ctrl_c


class StopSignals:
    """While entered (a with block in the main thread), STOP_SIGNALS set .received to the first signal's name
    instead of killing the process; the previous handlers come back on exit. Off the main thread Python cannot
    install handlers: nothing is installed."""

    def __init__(self):
        self.received, self._previous = None, {}

    def _handle(self, signum, frame):
        self.received = self.received or signal.Signals(signum).name

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handle) for sig in STOP_SIGNALS}
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def flag(self, device):
        """1.0 if a stop signal came to this process, else 0.0: a tensor to all-reduce with the step's loss."""
        return torch.tensor(float(self.received is not None), device=device)

    def asked(self, world_size, device):
        """Whether a stop signal reached any rank (every rank asks at the same point)."""
        if world_size == 1:
            return self.received is not None
        flag = self.flag(device)
        torch.distributed.all_reduce(flag)
        return flag.item() > 0

    @contextmanager
    def paused(self):
        """A block in which the stop signals and Ctrl-C end the process at once, for a call that blocks in C++
        where no Python handler runs (the process group's rendezvous)."""
        if not self._previous:
            yield
            return
        ours = {sig: signal.signal(sig, signal.SIG_DFL) for sig in (*STOP_SIGNALS, signal.SIGINT)}
        try:
            yield
        finally:
            for sig, handler in ours.items():
                signal.signal(sig, handler)


def exit_on_stop_signals():
    """From now on a stop signal ends this process at once with one line and EXIT_PREEMPTED (a requeueing wrapper
    runs it again): for eval.py and sample.py, whose outputs are written whole or not at all."""
    def stop(signum, frame):
        print(f"stopped by {signal.Signals(signum).name}; run the same command again", file=sys.stderr)
        sys.exit(EXIT_PREEMPTED)
    for sig in STOP_SIGNALS:
        signal.signal(sig, stop)
