"""
Devices and processes: which device and precision a run uses, the torchrun process group, and the two ways
of spreading a model over its processes: DDP (each rank a whole copy) and FSDP2 (each rank 1/N of every
weight, gradient and AdamW moment).

Checkpoints are one unsharded file either way (full_state_dicts), so a run resumes on any number of
processes, with or without FSDP (and its data order, train.py's docstring says, does not depend on them).
"""
import os
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist


# ------------------------------------------------------------------------------------------------ devices
def resolve_device(cfg, local_rank=0, world_size=1):
    """-> (device str, device_type, torch dtype) from cfg's device and dtype; turns TF32 on for CUDA.
    ValueError for a device this machine lacks, or float16 off CUDA."""
    available = dict(cuda=torch.cuda.is_available(), mps=torch.backends.mps.is_available(), cpu=True)
    device = next(d for d in available if available[d]) if cfg["device"] == "auto" else cfg["device"]
    device_type = device.split(":")[0]
    if not available[device_type]:
        raise ValueError(f"device={device} but {device_type.upper()} is not available here; use --device=cpu (or auto)")
    if device == "cuda" and world_size > 1:
        device = f"cuda:{local_rank}"
    dtype = cfg["dtype"]
    if dtype == "auto":
        dtype = "float32" if device_type != "cuda" else "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    if dtype not in ("float32", "bfloat16", "float16") or (dtype == "float16" and device_type != "cuda"):
        raise ValueError(f"dtype {dtype!r} on {device_type}: use float32 or bfloat16 (float16 on CUDA only)")
    if device_type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    return device, device_type, getattr(torch, dtype)


def autocast(device_type, ptdtype):
    """The mixed-precision context for forward passes: none for float32."""
    return nullcontext() if ptdtype == torch.float32 else torch.autocast(device_type=device_type, dtype=ptdtype)


def use_compile(cfg, device_type):
    """Whether to torch.compile: the config's compile, or None = on for CUDA only."""
    return cfg["compile"] if cfg["compile"] is not None else device_type == "cuda"


def check_model_fits(n_params, device, shards=1):
    """ValueError, before the model is built, if its float32 weights, gradients and AdamW moments (16 bytes a
    parameter, over `shards` FSDP ranks) alone exceed the memory free on device (a size typed wrong would
    otherwise be killed by the system, or take other jobs' memory with it). Activations come on top."""
    if device.startswith("cuda"):
        free = torch.cuda.mem_get_info(torch.device(device))[0]
    elif device == "cpu" and os.path.exists("/proc/meminfo"):  # Linux
        with open("/proc/meminfo") as f:
            free = 1024 * next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))
    else:
        return
    need = 16 * n_params / shards
    if need > free:
        raise ValueError(f"the model has {n_params:,} parameters: their weights, gradients and AdamW state need "
                         f"{need / 2**30:,.1f} GiB, and {device} has {free / 2**30:,.1f} GiB free")


# ---------------------------------------------------------------------------------------------- processes
def check_world_size(cfg):
    """ValueError, before any process group starts, if a step's gradient_accumulation_steps micro-batches do
    not split evenly over torchrun's processes (WORLD_SIZE); the message gives settings that do."""
    world, accum, batch = int(os.environ.get("WORLD_SIZE", "1")), cfg["gradient_accumulation_steps"], cfg["batch_size"]
    if accum % world == 0:
        return
    windows = accum * batch  # the step's windows; another split of them into micro-batches is the same step
    more = -(-accum // world) * world  # the next multiple of world
    split = next((a for a in range(more, windows + 1, world) if windows % a == 0), None)
    fix = (f"--gradient_accumulation_steps={split} --batch_size={windows // split} (the same {windows} windows a "
           f"step)" if split else f"--gradient_accumulation_steps={more}")
    raise ValueError(f"gradient_accumulation_steps={accum} does not split over the {world} processes (each runs "
                     f"an equal share of every step's micro-batches): use {fix}")


@dataclass
class Job:
    """This process's place in the training job: its rank among world_size processes (torchrun's; one process:
    rank 0 of 1), the device it computes on and the dtype of its forward passes."""
    rank: int
    local_rank: int
    world_size: int
    device: str
    dtype: torch.dtype

    @property
    def device_type(self):
        """cuda, cpu or mps: the device without its index."""
        return self.device.split(":")[0]

    @property
    def master(self):
        """Rank 0: the process that writes the files and the log."""
        return self.rank == 0

    def log(self, *args, **kwargs):
        if self.master:
            print(*args, **kwargs)

    def autocast(self):
        return autocast(self.device_type, self.dtype)


def start_job(cfg):
    """-> this process's Job; starts the process group under torchrun (RANK set): backend, or by default NCCL
    on CUDA and gloo on the CPU. ValueError for a device, dtype or fsdp this machine cannot run."""
    rank, local_rank, world = 0, 0, 1
    if "RANK" in os.environ:
        rank, local_rank, world = (int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
        use_cuda = cfg["device"] != "cpu" and torch.cuda.is_available()
        if use_cuda:
            torch.cuda.set_device(local_rank)
        if not dist.is_initialized():  # (tests/torchrun_many.py starts one group for several runs)
            dist.init_process_group(backend=cfg["backend"] or ("nccl" if use_cuda else "gloo"))
    elif cfg["fsdp"]:
        raise ValueError("fsdp=True shards over the processes that torchrun starts; launch with torchrun")
    device, device_type, dtype = resolve_device(cfg, local_rank, world)
    if cfg["fsdp"]:
        check_fsdp_support(device_type, dtype)
    return Job(rank, local_rank, world, device, dtype)


def end_distributed():
    """Destroy the process group, if any, after a barrier and a pause. The pause lets gloo's worker thread,
    which needs the GIL, free the barrier before the group is torn down (without it torch 2.13 deadlocked
    now and then)."""
    if dist.is_initialized():
        dist.barrier()
        time.sleep(0.2)
        dist.destroy_process_group()


def all_reduce_sum(t):
    """t summed over the ranks in place (a no-op on one process) -> t."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t)
    return t


def fsdp_gradient_sync(model, sync):
    """FSDP's gradient reduction for the next backward: only if sync (a step's last micro-batch). Until then
    each rank accumulates unsharded gradients and keeps the gathered weights; then it reduce-scatters once."""
    model.set_requires_gradient_sync(sync)
    model.set_reshard_after_backward(sync)


# ------------------------------------------------------------------------------------------------- FSDP2
def check_fsdp_support(device_type, ptdtype):
    """ValueError for what fsdp=True does not support: MPS (no process-group backend) and float16 (its
    GradScaler would need an inf check across the gradient shards)."""
    if device_type == "mps":
        raise ValueError("fsdp=True needs CUDA or the CPU: MPS has no process-group backend")
    if ptdtype == torch.float16:
        raise ValueError("fsdp=True does not support float16; use --dtype=bfloat16 or float32")


def is_fsdp(model):
    """True if model is sharded by FSDP2 (shard_model). Looked up in sys.modules: FSDP's modules add a second
    to every start, so they are imported only by a run that shards."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    return fsdp is not None and isinstance(model, fsdp.FSDPModule)


def shard_model(model, device_type, ptdtype):
    """FSDP2, in place: fully_shard each Block, then the whole GPT (the root unit owns the embeddings, ln_f and
    the LM head, so a tied wte/lm_head weight stays one parameter). For bfloat16 the blocks compute with bf16
    copies gathered one block at a time and gradients are reduced in float32. Returns the model."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mesh = DeviceMesh.from_group(dist.group.WORLD, device_type)
    low = ptdtype if ptdtype != torch.float32 else None  # None: parameters keep their float32
    policy = MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32)
    for block in model.transformer.h:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def all_finite(model):
    """Whether every parameter is finite on every rank: each rank checks its own (FSDP: its shards), and the
    verdict is all-reduced, so that all ranks stop together or none does."""
    params = list(model.parameters())
    if is_fsdp(model):
        from torch.distributed.tensor import DTensor
        params = [p.to_local() if isinstance(p, DTensor) else p for p in params]
    finite = torch.stack([torch.isfinite(p).all() for p in params]).all().float()
    if dist.is_initialized():
        dist.all_reduce(finite, op=dist.ReduceOp.MIN)
    return bool(finite.item())


def _optimizer_param_names(model, optimizer):
    """The name of each parameter the optimizer holds, in its order (a tied weight: its first name)."""
    names = {p: name for name, p in model.named_parameters()}
    return [names[p] for group in optimizer.param_groups for p in group["params"]]


def _rekey(state, new_key):
    """An optimizer state dict with each parameter's key k (index or name) replaced by new_key[k]."""
    groups = [{**g, "params": [new_key[k] for k in g["params"]]} for g in state["param_groups"]]
    return dict(state={new_key[k]: v for k, v in state["state"].items()}, param_groups=groups)


def full_state_dicts(model, optimizer):
    """(model state, optimizer state) as one unsharded process has them, so that a checkpoint loads anywhere.
    Under FSDP the shards are gathered onto rank 0's CPU (every rank must call this); only rank 0's are whole."""
    if not is_fsdp(model):
        return model.state_dict(), optimizer.state_dict()
    from torch.distributed.checkpoint import state_dict as dcp
    options = dcp.StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state = dcp.get_model_state_dict(model, options=options)
    if not optimizer.state:  # before the first step: nothing to gather (the helper would make a step 1)
        return model_state, optimizer.state_dict()
    by_name = dcp.get_optimizer_state_dict(model, optimizer, options=options)
    index = {name: i for i, name in enumerate(_optimizer_param_names(model, optimizer))}
    return model_state, (_rekey(by_name, index) if by_name else {})


def load_full_state_dicts(model, optimizer, model_state, optimizer_state):
    """Load full_state_dicts' dicts into a plain or FSDP model and its optimizer (FSDP: each rank keeps its
    shards)."""
    if not is_fsdp(model):
        model.load_state_dict(model_state)
        optimizer.load_state_dict(optimizer_state)
        return
    from torch.distributed.checkpoint import state_dict as dcp
    options = dcp.StateDictOptions(full_state_dict=True)
    dcp.set_model_state_dict(model, model_state, options=options)
    if not optimizer_state["state"]:  # saved before the first step: hyperparameters only
        optimizer.load_state_dict(optimizer_state)
        return
    names = dict(enumerate(_optimizer_param_names(model, optimizer)))
    dcp.set_optimizer_state_dict(model, optimizer, _rekey(optimizer_state, names), options=options)


# ------------------------------------------------------------------------------------------ RNG per rank
def rng_state(train_gen, device):
    """This process's RNG states: the training window stream, torch's CPU RNG (dropout on the CPU) and, on
    CUDA, the RNG of this process's device (dropout there)."""
    state = dict(train=train_gen.get_state(), torch=torch.get_rng_state())
    if device.startswith("cuda"):
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def gather_rng_states(train_gen, device, world_size):
    """Every rank's rng_state, in rank order (collective under torchrun) -> a list."""
    states = [rng_state(train_gen, device)] * world_size
    if world_size > 1:
        dist.all_gather_object(states, states[0])
    return states


def restore_rng(saved, rank, train_gen, device, seed, iter_num):
    """Restore this rank's RNG states from a checkpoint's list of per-rank states.

    The training stream is global (every rank draws the same windows), so any rank's copy continues it. A rank
    beyond the saved ones (a run resumed on more processes) gets a dropout stream seeded from (seed, rank,
    iter_num), distinct from every other rank's.
    """
    train_gen.set_state(saved[0]["train"])
    if rank >= len(saved):
        torch.manual_seed(seed + rank + 1_000_003 * iter_num)  # also seeds every CUDA device
        return
    state = saved[rank]
    torch.set_rng_state(state["torch"])
    if device.startswith("cuda") and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)
