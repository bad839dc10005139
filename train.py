"""
Train a GPT (model.py) whose attention query is linear, the identity, or the paper's nonlinear x + f(x).

    python train.py config/shakespeare_char.py --query_mode=nonlinear       # one process (CPU, one GPU, MPS)
    torchrun --standalone --nproc_per_node=8 train.py config/nlq_small.py   # DDP on 8 GPUs
    torchrun --standalone --nproc_per_node=8 train.py config/nlq_large.py   # FSDP (fsdp=True) on 8 GPUs

Settings: the defaults (nlq/settings.py), then a config file (plain Python; nanoGPT's config files work as
they are), then --key=value overrides; python train.py --help lists every key. gradient_accumulation_steps
counts the micro-batches of one optimizer step over all processes: every rank draws the step's windows from
the same stream and takes its share, so the data order, like the eval windows, depends on the seed alone.

One training step (Loop.step) reads in three files: this one (the micro-batches, backward, clipping, the
optimizer at the learning rate of nlq/schedule.py's get_lr), model.py (the forward pass, the loss) and
nlq/data.py (the windows). The rest of nlq/ is machinery called once per concern: the run folder, this
process's Job (rank, device, dtype), the clock, stop signals.

The run's folder, out_dir, holds ckpt.pt (written atomically at every eval), config.json and metrics.jsonl (a
row per eval, and the step's train loss every log_interval); the same command with --init_from=resume
continues the run bit for bit. How a run ends:
    0    done (after a last eval over every val token once: eval_full_at_end)
    3    the loss went NaN/inf: logged as the last row; the last finite checkpoint stays
    130  Ctrl-C: during a step the last checkpoint stays; during an eval the step boundary is saved first
    144  a stop signal (SIGTERM, SIGUSR1, SIGUSR2: a cluster's preemption or time limit): the step finishes, is
         checkpointed, and --init_from=resume goes on exactly
"""
import math
import os
import sys
import time
import warnings
from contextlib import ExitStack

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from model import GPT
from nlq.checkpoint import CheckpointNotWritten, RunFolder
from nlq.data import TrainData, prepare_if_missing
from nlq.distributed import (all_finite, all_reduce_sum, check_model_fits, check_world_size, end_distributed,
                             fsdp_gradient_sync, shard_model, start_job, use_compile)
from nlq.losses import EvalStopped, estimate_loss, full_split_loss, safe_exp
from nlq.preemption import (EXIT_DIVERGED, EXIT_INTERRUPTED, EXIT_PREEMPTED, StopAtBoundary, StopSignals,
                            TrainingPreempted)
from nlq.probe import attention_probe, probe_batch
from nlq.progress import Progress
from nlq.schedule import decay_horizon, get_lr
from nlq.settings import describe, model_config, param_counts, parse_config, settings_help


class TrainingDiverged(RuntimeError):
    """The loss or the weights became NaN/inf; the last finite checkpoint stays."""


def train(cfg):
    """Run one training job from a checked config dict (settings.parse_config). Returns the last eval's losses."""
    with StopSignals() as stop, ExitStack() as cleanup:
        # -- processes and devices ----------------------------------------------------------------------------
        check_world_size(cfg)  # before the process group: the step's micro-batches must split over the ranks
        with stop.paused():  # a rendezvous that hangs can still be stopped
            job = start_job(cfg)  # this process's rank, world_size, device and dtype
        if not job.master:  # every rank resolves the same settings: rank 0 warns about them once
            warnings.filterwarnings("ignore")
        run = RunFolder(cfg, job)  # never another program's folder
        cleanup.callback(run.close)
        cfg.update(run.kept_settings())  # a resumed run keeps the shape its pretrained weights gave it

        # -- data: memory-mapped token bins, the eval windows drawn from the seed ------------------------------
        data_folder = os.path.join(cfg["data_dir"], cfg["dataset"])
        if job.master:  # Tiny Shakespeare ships with nlq: the quick start needs no prepare_data.py
            prepare_if_missing(cfg["data_dir"], cfg["dataset"], job.log)
        if job.world_size > 1:
            torch.distributed.barrier()  # rank 0 prepares the shipped data while the others wait
        data = TrainData(data_folder, cfg["block_size"], cfg["eval_windows"], cfg["seed"])
        cleanup.callback(data.close)

        # -- the model and its optimizer: from scratch, pretrained weights, or the checkpoint to resume --------
        pretrained = None
        if cfg["init_from"] not in ("scratch", "resume"):
            from interop.pretrained import Pretrained  # its shape sets the model keys; its vocabulary the data's
            pretrained = Pretrained(cfg, data.meta, job.log)
            cfg.update(pretrained.settings)
        model_cfg = model_config(cfg, data.meta["vocab_size"])
        check_model_fits(param_counts(model_cfg)["total"], job.device, job.world_size if cfg["fsdp"] else 1)
        run.open(model_cfg, data.meta, data_folder,  # locks out_dir; reads and checks the checkpoint to resume
                 pretrained.settings if pretrained else {})
        torch.manual_seed(cfg["seed"])  # the same initial weights on every rank and in every run of this seed
        model = GPT(model_cfg)
        if pretrained is not None:
            pretrained.load_into(model)
        job.log(model.param_table())
        if cfg["fsdp"]:
            shard_model(model, job.device_type, job.dtype)  # in place, each block's shard on its device
        else:
            model.to(job.device)
        optimizer = model.configure_optimizers(cfg["weight_decay"], cfg["learning_rate"], (cfg["beta1"], cfg["beta2"]),
                                               job.device_type, cfg["optimizer"], cfg["embedding_lr"],
                                               cfg["unembedding_lr"])  # AdamW, or Muon for the matrices
        loop = Loop(cfg, job, data, run, stop, model, optimizer)  # resumes the checkpoint, if any
        if cfg["eval_only"]:  # nanoGPT's eval_only: the losses on the fixed eval windows; nothing is written
            try:
                losses = loop.estimate()
            except EvalStopped:  # nothing to checkpoint: the status of a stop, which a requeueing wrapper reads
                job.log(f"stopped by {stop.received or 'a stop signal to another rank'} during eval_only; nothing "
                        f"written")
                end_distributed()
                raise TrainingPreempted("eval_only") from None
            job.log(f"eval_only at iter {loop.state.iter_num}: train loss {losses['train']:.4f}, "
                    f"val loss {losses['val']:.4f}")
            end_distributed()
            return losses

        # -- train until max_iters, or until a stop -------------------------------------------------------------
        run.start(dict(model_args=vars(model_cfg), world_size=job.world_size, resolved_device=job.device,
                       resolved_dtype=str(job.dtype), tokens_per_iter=loop.tokens_per_iter,
                       lr_decay_iters_resolved=loop.state.lr_decay_iters, dataset_meta=data.meta), loop.state)
        job.log(describe(cfg, job.world_size))  # every setting, the tokens of a step, the eval set
        losses = loop.run()
        job.log(run.summary(loop.state))  # where the checkpoint and metrics are, and what reads them
        end_distributed()
        return losses


class Loop:
    """The training loop: each optimizer step of accum micro-batches, and at every eval_interval an eval, its
    metrics row and a checkpoint. Its collaborators: the job (rank, world_size, device), the data, the run's
    folder, the stop signals, and the model with its optimizer. State that survives a resume lives in state
    (checkpoint.TrainState): iter_num, tokens, best_val_loss, ..."""

    def __init__(self, cfg, job, data, run_folder, stop, model, optimizer):
        self.cfg, self.job, self.data, self.run_folder, self.stop = cfg, job, data, run_folder, stop
        self.raw_model, self.optimizer = model, optimizer
        self.scaler = torch.amp.GradScaler(job.device_type, enabled=(job.dtype == torch.float16))
        self.train_gen = torch.Generator().manual_seed(cfg["seed"] + 1)  # the training stream of windows
        torch.manual_seed(cfg["seed"] + job.rank)  # dropout differs per rank
        self.state = state = run_folder.resume(model, optimizer, self.scaler, self.train_gen)  # or a fresh one
        # lr_decay_iters, the step where the rate reaches min_lr, is fixed once, here; a resume keeps the saved one
        state.lr_decay_iters = decay_horizon(cfg, state.lr_decay_iters, state.iter_num, job.log)
        if use_compile(cfg, job.device_type):  # one compiled graph for the forward and backward passes
            model = torch.compile(model)
        if job.world_size > 1 and not cfg["fsdp"]:  # DDP: a whole copy per rank, gradients all-reduced in backward
            model = DDP(model, device_ids=[job.local_rank] if job.device_type == "cuda" else None)
        self.model, self.ctx = model, job.autocast()
        self.local_accum = cfg["gradient_accumulation_steps"] // job.world_size  # micro-batches per rank per step
        self.tokens_per_iter = cfg["gradient_accumulation_steps"] * cfg["batch_size"] * cfg["block_size"]
        self.progress = Progress(cfg, self.raw_model, self.tokens_per_iter, cfg["batch_size"] * self.local_accum,
                                 state.elapsed_s, state.resumed_at or 0)

    def run(self):
        """Train from state.iter_num to max_iters -> the last eval's losses. A stop signal (or Ctrl-C during an
        eval) ends it at a step boundary, checkpointed there (stop_at)."""
        cfg, state, losses, nonfinite_steps = self.cfg, self.state, {}, 0
        try:
            while True:
                # a resumed run skips the eval its checkpoint was written at, unless a stop came before it ran
                if self.is_eval_iter(state.iter_num) and (state.iter_num != state.resumed_at or state.eval_pending):
                    losses = self.evaluate()
                if state.iter_num >= cfg["max_iters"]:
                    return losses
                lr = get_lr(state.iter_num, cfg, state.lr_decay_iters)
                loss_sum = self.step(lr)
                state.iter_num += 1
                state.tokens += self.tokens_per_iter
                # one all-reduce (it waits for the step to finish): every rank then takes the same decisions below
                loss_sum, ranks_stopping = all_reduce_sum(torch.stack([loss_sum, self.stop.flag(self.job.device)]))
                loss = (loss_sum / self.job.world_size).item()  # the step's mean loss over the ranks
                dt = self.progress.step_done(state.iter_num)
                nonfinite_steps = 0 if math.isfinite(loss) else nonfinite_steps + 1
                row = dict(iter=state.iter_num, tokens=state.tokens, lr=lr, train_loss=loss)  # a train row
                if state.iter_num % cfg["log_interval"] == 0:
                    self.run_folder.log_metrics(row)  # the step's loss between evals: when a run left its plateau
                if state.iter_num % cfg["log_interval"] == 0 or nonfinite_steps == 1:
                    self.job.log(self.progress.log_line(state.iter_num, loss, lr, dt))
                if nonfinite_steps >= cfg["max_nonfinite_steps"]:
                    self.diverged(row, f"the training loss was not finite for {nonfinite_steps} consecutive steps")
                if ranks_stopping.item() > 0:  # a preemption or the time limit is near: checkpoint here, then exit
                    raise StopAtBoundary(self.is_eval_iter(state.iter_num), f"after iter {state.iter_num}")
        except StopAtBoundary as s:
            self.stop_at(s)

    def step(self, lr):
        """One optimizer step at learning rate lr -> the mean loss over its micro-batches (a tensor)."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)  # groups with their own rates (muon) take the same share
        # every rank draws the whole step's windows, (accum, B), and takes its rows: rank r gets micro-batches
        # r * local_accum ... (r + 1) * local_accum - 1 of the global stream
        starts = self.data.batch_starts(self.train_gen, self.cfg["gradient_accumulation_steps"], self.cfg["batch_size"])
        starts = starts[self.job.rank * self.local_accum:(self.job.rank + 1) * self.local_accum]  # (local_accum, B)
        loss_sum = torch.zeros((), device=self.job.device)
        for micro in range(self.local_accum):
            x, y = self.data.batch(starts[micro], self.job.device)  # (B, T) each
            last = micro == self.local_accum - 1  # several processes reduce the gradients in this backward only
            if isinstance(self.model, DDP):
                self.model.require_backward_grad_sync = last  # DDP's all-reduce, as nanoGPT sets it
            elif self.cfg["fsdp"]:
                fsdp_gradient_sync(self.raw_model, last)  # FSDP's reduce-scatter, the same way
            with self.ctx:
                _, loss = self.model(x, y)
                loss = loss / self.local_accum  # the step's gradient is the mean over its micro-batches
            self.scaler.scale(loss).backward()
            loss_sum += loss.detach()
        if self.cfg["grad_clip"] > 0:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg["grad_clip"])
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return loss_sum

    def is_eval_iter(self, iter_num):
        """Every eval_interval steps, and at max_iters."""
        return iter_num % self.cfg["eval_interval"] == 0 or iter_num == self.cfg["max_iters"]

    def estimate(self):
        """The mean loss on each split's fixed eval windows -> {"train": float, "val": float}. EvalStopped if a
        stop signal reaches a rank during it."""
        job = self.job
        return estimate_loss(self.model, self.data.splits, self.ctx, job.rank, job.world_size, job.device,
                             self.data.meta["vocab_size"], self.cfg["batch_size"], stop=self.stop_asked,
                             progress=job.master)

    def stop_asked(self):
        return self.stop.asked(self.job.world_size, self.job.device)

    def evaluate(self):
        """The eval at this step boundary: the loss on the fixed eval windows (and, at the end, over the whole
        val split), its metrics row, and a checkpoint -> the losses. A stop signal or Ctrl-C during it raises
        StopAtBoundary: the boundary is checkpointed with its eval still to come."""
        cfg, state, job, t0 = self.cfg, self.state, self.job, time.time()
        try:
            losses = self.estimate()
            seconds = time.time() - t0
            if cfg["eval_full_at_end"] and state.iter_num == cfg["max_iters"]:  # every val token once
                n = self.data.tokens["val"]
                job.log(f"whole-split eval: val loss over all {n - 1:,} next-token predictions of the {n:,} val "
                        f"tokens; turn it off with --eval_full_at_end=False")
                nats, tokens, _ = full_split_loss(self.raw_model, self.ctx, self.data.files["val"],
                                                  self.data.meta["dtype"], cfg["block_size"], 4 * cfg["batch_size"],
                                                  job.device, job.rank, job.world_size,
                                                  vocab_size=self.data.meta["vocab_size"], progress=job.master,
                                                  stop=self.stop_asked)
                losses["val_full"] = nats / tokens
        except (EvalStopped, KeyboardInterrupt) as e:
            raise StopAtBoundary(True, f"during the eval of iter {state.iter_num}",
                                 ctrl_c=isinstance(e, KeyboardInterrupt)) from None
        row = dict(iter=state.iter_num, tokens=state.tokens, lr=get_lr(max(state.iter_num - 1, 0), cfg,
                   state.lr_decay_iters), train_loss=losses["train"], val_loss=losses["val"],
                   val_ppl=safe_exp(losses["val"]), **self.progress.eval_fields(),
                   **attention_probe(self.raw_model, probe_batch(self.data, job.device), self.ctx))  # nlq/probe.py
        if "val_full" in losses:
            row["val_loss_full"] = losses["val_full"]
        job.log(f"eval iter {state.iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}, "
                f"val ppl {row['val_ppl']:.2f}"
                + (f", val loss (whole split) {losses['val_full']:.4f}" if "val_full" in losses else ""))
        if not all(math.isfinite(v) for v in losses.values()) or not all_finite(self.raw_model):
            self.diverged(row, "the eval loss or the weights are not finite")
        self.run_folder.log_metrics(row)
        if losses["val"] < state.best_val_loss or cfg["always_save_checkpoint"]:  # the same on every rank
            state.best_val_loss = min(state.best_val_loss, losses["val"])
            self.save()
        state.eval_pending = False
        self.progress.eval_done(seconds)
        return losses

    def save(self):
        self.state.elapsed_s = self.progress.elapsed()  # seconds of training over every start of the run
        self.run_folder.save(self.raw_model, self.optimizer, self.scaler, self.train_gen, self.state)

    def stop_at(self, s):
        """Checkpoint the step boundary the loop stopped at (s: the StopAtBoundary) and end the run:
        TrainingPreempted after a stop signal, KeyboardInterrupt again after Ctrl-C during an eval; unsaved where
        nothing was trained since the last checkpoint, or where the ranks may sit in different collectives."""
        state, path = self.state, self.run_folder.ckpt_path
        if s.ctrl_c and (self.job.world_size > 1 or state.iter_num == (state.last_saved or 0)):
            raise KeyboardInterrupt
        state.eval_pending = s.eval_pending
        self.save()
        if s.ctrl_c:
            self.job.log(f"interrupted during the eval of iter {state.iter_num}: checkpoint {path} at iter "
                         f"{state.iter_num}, its eval still to come", flush=True)
            raise KeyboardInterrupt
        message = (f"stopped by {self.stop.received or 'a stop signal to another rank'} {s.when}: checkpoint {path} "
                   f"at iter {state.iter_num}; continue with --init_from=resume")
        self.job.log(message, flush=True)
        end_distributed()  # its barrier: no rank exits before rank 0 has written the checkpoint
        raise TrainingPreempted(message)

    def diverged(self, row, reason):
        """Log the bad numbers as the run's last metrics row and raise TrainingDiverged (every rank together:
        the numbers it looks at are all-reduced)."""
        self.run_folder.log_metrics({**row, "diverged": True})
        last = self.state.last_saved
        raise TrainingDiverged(f"training diverged at iter {row['iter']}: {reason}; " + (
            f"the last finite checkpoint is {self.run_folder.ckpt_path} (iter {last})" if last is not None else
            "no checkpoint was written") + ". Try a lower learning_rate, a longer warmup_iters or grad_clip > 0")


def usage():
    return (f"usage: python train.py [CONFIG_FILE.py] [--key=value ...]\n{__doc__}\n"
            f"Config keys, their defaults and meanings:\n{settings_help()}")


def main():
    if {"-h", "--help"} & set(sys.argv[1:]):
        sys.exit(print(usage()))
    warnings.formatwarning = lambda message, *a, **k: f"warning: {message}\n"
    # under torchrun every rank reads the same settings and meets the same error: rank 0 says it, once
    def fail(message, status=1):
        if os.environ.get("RANK", "0") == "0":
            print(message, file=sys.stderr)
        sys.exit(status)

    try:
        cfg = parse_config(sys.argv[1:])
    except (ValueError, FileNotFoundError) as e:
        fail(f"config error: {e}")
    resume = f" (the last checkpoint in {cfg['out_dir']} is intact: continue with --init_from=resume)"
    try:
        train(cfg)
    except (ValueError, CheckpointNotWritten, OSError) as e:  # the message says what to do
        fail(f"error: {e}")
    except TrainingDiverged as e:
        fail(f"error: {e}", EXIT_DIVERGED)
    except TrainingPreempted:  # logged already; the status tells a scheduler to requeue it
        sys.exit(EXIT_PREEMPTED)
    except KeyboardInterrupt:
        print("interrupted" + (resume if os.path.exists(os.path.join(cfg["out_dir"], "ckpt.pt")) else
                               " before the first checkpoint: run the same command again to start over"),
              file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)


if __name__ == "__main__":
    main()
