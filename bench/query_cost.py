"""
Where the nonlinear query's time goes: bench.py with extra query modes that build f up piece by piece.

    python bench/query_cost.py config/shakespeare_char.py --threads=2 --steps=300 --rounds=300

Every mode below has the nonlinear query's parameters and its W1 inside the attention's input matmul
(input_weight), so the only differences are what runs after that matmul:
    f_matmuls    q = x + W2·(x W1ᵀ)                     f's two matmuls, nothing else
    f_gelu       q = x + W2·GELU(x W1ᵀ)                 ... and the GELU
    f_autograd   q = x + LayerNorm(W2·GELU(rstd·x W1ᵀ))  the whole f, autograd saving every intermediate
    f_checkpoint the same under torch.utils.checkpoint  model.py's path before FusedF (2026-12-01)
    f_as_written NonlinearQuery.f, module by module     what a CPU runs by default (fused_f=None)
    nonlinear    model.py's FusedF                       the whole f, its intermediates recomputed (fused_f=True,
                                                         which this script sets unless given)
f_matmuls and f_gelu are not the paper's f (diagnostics, never for training). The default --query_modes is
linear,f_matmuls,f_gelu,f_autograd,f_checkpoint,nonlinear; every bench.py option works. --rounds equal to
--steps interleaves the modes step by step, so a machine whose speed drifts within seconds (a shared VM)
slows every mode alike.
"""
import os
import sys

import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench  # noqa: E402
import model  # noqa: E402


class Fused(model.NonlinearQuery):
    fused = True  # W1 inside the attention's input matmul on every device


class FMatmuls(Fused):
    def forward(self, x, xw):
        return x + self.w2(xw)


class FGelu(Fused):
    def forward(self, x, xw):
        return x + self.w2(F.gelu(xw))


class FAutograd(Fused):
    def rest_of_f(self, xw, r):
        return self.norm_out(self.w2(F.gelu(xw * r)))

    def forward(self, x, xw):
        return x + self.rest_of_f(xw, model.FusedF.rstd(x, self.norm_in.eps))


class FAsWritten(model.NonlinearQuery):
    fused = False  # NonlinearQuery.f module by module, what runs on a CPU by default


class FCheckpoint(FAutograd):
    def forward(self, x, xw):
        r = model.FusedF.rstd(x, self.norm_in.eps)
        return x + checkpoint(self.rest_of_f, xw, r, use_reentrant=False, preserve_rng_state=False)


VARIANTS = dict(f_matmuls=FMatmuls, f_gelu=FGelu, f_autograd=FAutograd, f_checkpoint=FCheckpoint,
                f_as_written=FAsWritten)

if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):
        sys.exit(print(__doc__))
    model.QUERY_MODES.update(VARIANTS)
    bench.BENCH_DEFAULTS["query_modes"] = "linear," + ",".join(VARIANTS) + ",nonlinear"
    argv = sys.argv[1:] + ([] if any(a.startswith("--fused_f=") for a in sys.argv) else ["--fused_f=True"])
    try:
        bench.main(argv)
    except (ValueError, OSError) as e:
        sys.exit(f"bench error: {e}")
