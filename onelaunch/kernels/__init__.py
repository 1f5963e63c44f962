"""Triton kernels, one file per fused op, named for everything it fuses. A module holds
the op's kernel ``_name_kernel`` and its launcher ``name(...)``, and the op is ``name``
everywhere: the plan's launch, the launch-configuration key, the tuned table.

    from onelaunch.kernels import rms_qkv
    rms_qkv.rms_qkv(x, g, w_qkv, b_qkv, out, eps, cfg=c)

Ops that share device code share a module: ``attention_splitk`` (``attention_partial``,
``attention_reduce``, the pair as ``attention_splitk``), ``moe_experts``
(``moe_gate_up_swiglu``, ``moe_down_residual``), ``tp_ops`` (the tensor-parallel
reductions). The persistent layer (``layer_persistent``, its launcher) keeps its kernel in
``layer_persistent_kernel`` and the kernel's argument groups in ``layer_persistent_args``.
``config`` chooses launch configurations; ``tuned`` reads and writes the measured tables;
``peer`` holds the peer-mapped exchange buffers.
"""
from . import (attention, attention_splitk, config,  # noqa: F401
               down_residual, embed, layer_persistent, lm_head_argmax, moe_experts,
               moe_router, o_proj_residual, peer, rms_gate_up_swiglu, rms_qkv,
               rope_kv_write, tp_ops, tuned)

# every launcher the plan can issue -> the module that holds it (``plan.launcher_name``
# names a launch's function by it)
LAUNCHERS = {
    "embed": embed, "rms_qkv": rms_qkv, "rope_kv_write": rope_kv_write,
    "attention": attention, "attention_partial": attention_splitk,
    "attention_reduce": attention_splitk,
    "o_proj_residual": o_proj_residual, "rms_gate_up_swiglu": rms_gate_up_swiglu,
    "down_residual": down_residual, "layer_persistent": layer_persistent,
    "lm_head_argmax": lm_head_argmax, "moe_router": moe_router,
    "moe_gate_up_swiglu": moe_experts, "moe_down_residual": moe_experts,
    "qk_sumsq": tp_ops, "allreduce_residual": tp_ops, "residual_add": tp_ops,
    "argmax_merge": tp_ops,
}
