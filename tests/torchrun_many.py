"""Several train.py / bench.py runs in one torchrun launch, one after another (for the tests: it saves
torchrun's and torch's start-up, ~4 s on 2 cores, per run).

    python -m torch.distributed.run --standalone --nproc_per_node=2 tests/torchrun_many.py \
        '["train.py", "--fsdp=True", "--out_dir=out/a"]' '["bench.py", "--fsdp=True", "--steps=2"]'

Each argument is a JSON list: the script's name, then its command-line arguments. The runs share one gloo
process group, started here: restarting it in the same process can read the previous run's addresses from
torchrun's store and hang. A train.py run that diverges prints "diverged: <message>" and the next run starts;
any other error stops the launch.
"""
import json
import sys
from pathlib import Path

import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench  # noqa: E402
import train  # noqa: E402
from nlq.settings import parse_config  # noqa: E402

dist.init_process_group(backend="gloo")
destroy_process_group, dist.destroy_process_group = dist.destroy_process_group, lambda *args, **kwargs: None
for arg in sys.argv[1:]:
    script, *argv = json.loads(arg)
    try:
        if script == "train.py":
            train.train(parse_config(argv))
        elif script == "bench.py":
            bench.main(argv)
        else:
            raise ValueError(f"unknown script {script!r}: use train.py or bench.py")
    except train.TrainingDiverged as e:
        print(f"diverged: {e}", flush=True)
destroy_process_group()
