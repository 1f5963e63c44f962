"""Triton kernels, one file per fused op. Kernels are ``_name_kernel``; launchers ``name``."""
from .embed import embed  # noqa: F401
from .rms_qkv import rms_qkv  # noqa: F401
from .rope_kv import rope_kv_write  # noqa: F401
from .attention import attention  # noqa: F401
from .attention_splitk import (attention_partial, attention_reduce, attention_splitk,  # noqa: F401
                              chunk_for, default_live_cap, live_share,
                              live_splits_host, n_splits_for)
from .o_proj_residual import o_proj_residual  # noqa: F401
from .rms_gate_up_swiglu import rms_gate_up_swiglu  # noqa: F401
from .down_residual import down_residual  # noqa: F401
from .layer_persistent import entry as layer_persistent_entry  # noqa: F401
from .layer_persistent import layer_persistent  # noqa: F401
from .lm_head_argmax import lm_head_argmax, programs_for  # noqa: F401
from .moe_router import moe_router  # noqa: F401
from .moe_experts import moe_down_residual, moe_gate_up_swiglu  # noqa: F401
from .peer import PeerBuffers, PeerSite  # noqa: F401
from .tp_ops import allreduce_residual, argmax_merge, qk_sumsq, residual_add  # noqa: F401
