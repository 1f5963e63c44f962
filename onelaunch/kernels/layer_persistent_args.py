"""The persistent layer kernel's arguments in groups (``layer_persistent_kernel.py``): the
launcher (``layer_persistent.py``) builds each group as one of these NamedTuples, the
kernel takes it as one parameter and reads its fields by name.

A group of tensors and sizes is a tuple argument: Triton passes its fields in order, one
kernel parameter each, so the groups follow the phases in the order they first read
their inputs (a later phase reads an earlier group's too: ``x``, ``eps``, ``H``, ``pos``)
and the compiled kernel's parameters are the same list as one flat signature. The
compile-time constants are three constexpr groups (``Heads``, ``Tiles``, ``MoETiles``);
the launch's own options (phase range, NEXT, STAGES, ...) stay plain constexprs.

Shapes: H hidden, I intermediate, HQ / HKV query / kv heads, D head_dim, C the cache's
positions, S the splits of a kv head's keys, E experts, k top_k.
"""
from __future__ import annotations

from typing import NamedTuple


class Qkv(NamedTuple):
    """Phase 0, RMSNorm + QKV (+ bias); ``x`` is every phase's residual stream."""
    x: object          # [H] bf16 the residual stream
    gin: object        # [H] input norm's gain
    w: object          # [N, H] W_qkv
    b: object          # [N] its bias (unread without HAS_BIAS)
    out: object        # [N] the QKV projection
    N: int             # rows of W_qkv: (HQ + 2 HKV) x D
    H: int
    eps: float         # RMSNorm's epsilon (q/k norm's too)
    stride: int        # W_qkv's row stride


class Rope(NamedTuple):
    """Phase 1, RoPE + KV write: the cache, the tables, the position."""
    q: object          # [HQ x D] the queries after RoPE
    kc: object         # [HKV, C, D] keys
    vc: object         # [HKV, C, D] values
    cos: object        # [C, D]
    sin: object        # [C, D]
    pos: object        # [1] int32 this step's position
    qn: object         # [HQ x D] q norm's gain (unread without QK_NORM)
    kn: object         # [HKV x D] k norm's gain
    stride_h: int      # the cache's head stride
    stride_t: int      # and position stride
    HQ: int
    HKV: int


class Attn(NamedTuple):
    """Phases 2-3, split-K attention partials and their merge."""
    po: object         # [HQ, S, D] fp32 unnormalised partial outputs
    pm: object         # [HQ, S] fp32 running maxima
    pl: object         # [HQ, S] fp32 sums of exp
    out: object        # [HQ x D] the attention's output
    n_splits: int      # S
    n_share: int       # splits the live length is shared over (``live_share``)
    scale: float       # D ** -0.5


class OProj(NamedTuple):
    """Phase 4, O-projection + residual."""
    w: object          # [H, K] W_o
    K: int             # HQ x D
    stride: int


class GateUp(NamedTuple):
    """Phase 5 (dense), RMSNorm + gate/up + SwiGLU (the MoE router reads ``gpost``)."""
    gpost: object      # [H] post-attention norm's gain
    w: object          # [2 I, H] W_gate_up: gate rows, then up rows
    h: object          # [I] the MLP's hidden activations
    I: int
    stride: int


class Down(NamedTuple):
    """Phase 6 (dense), down + residual."""
    w: object          # [H, I] W_down
    scratch: object    # [SPLIT_K x H] fp32 the K splits' partial rows
    counter: object    # [H / BN_DN] int32 arrivals a row block
    k_per_split: int
    stride: int


class Router(NamedTuple):
    """Phase 5 (MoE), RMSNorm + router logits; phase 6's top-k reads them."""
    w: object          # [E, H] W_router
    stride: int
    E: int
    logits: object     # [E] fp32
    ids: object        # [k] int32 the chosen experts
    wts: object        # [k] fp32 and their routing weights
    log: object        # [steps, layers, k] int32 the engine's expert log
    log_row: int       # its position stride
    log_offset: int    # and this layer's offset


class Experts(NamedTuple):
    """Phases 6-7 (MoE), the chosen experts' gate/up and down."""
    w_gu: object       # [E, 2 I, H]
    stride_gu_e: int
    stride_gu_n: int
    I: int
    w_dn: object       # [E, H, I]
    stride_dn_e: int
    stride_dn_n: int
    h: object          # [k, I] each slot's hidden activations


class Heads(NamedTuple):
    """Compile-time constants of the attention block (phases 0-3)."""
    HAS_BIAS: bool
    QK_NORM: bool      # q and k normed over all heads (OLMoE)
    D: int             # head_dim
    BLOCK_D: int       # D padded to a power of two
    BLOCK_R: int       # RoPE's block over HQ x D (at most 1024)
    GROUP: int         # query heads a kv head
    GROUP_PAD: int     # that padded (at least 16, for tl.dot)
    BLOCK_DA: int      # the attention's D block (at least 16)
    CHUNK: int         # keys a split
    BLOCK_T: int       # keys a tile
    DOT_F32: bool      # the interpreter's fp32 dot
    BLOCK_S: int       # splits a merge takes a block
    BLOCK_M: int


class Tiles(NamedTuple):
    """The dense GEMV phases' tiles: rows (BN), K (BK) and tiles in flight (PF)."""
    BN_QKV: int
    BK_QKV: int
    PF_QKV: int
    BN_O: int
    BK_O: int
    PF_O: int
    BN_GU: int
    BK_GU: int
    PF_GU: int
    BN_DN: int
    BK_DN: int
    PF_DN: int
    SPLIT_K: int       # down's K splits (the streamed phase runs whole rows: 1)


class MoETiles(NamedTuple):
    """A mixture of experts' constants (MOE False: the dense layer)."""
    MOE: bool
    TOP_K: int
    TOP_KP: int        # TOP_K padded to a power of two
    BLOCK_E: int       # E padded to a power of two
    BN_R: int
    BK_R: int
    BN_EGU: int
    BK_EGU: int
    BN_EDN: int
    BK_EDN: int
