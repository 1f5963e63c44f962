"""The one-launch kernels' arguments in groups: the host (``step.py``) builds each group as
one of these NamedTuples, the kernels take it as one parameter and read its fields by
name. A group of pointers or sizes is a tuple argument (Triton passes its fields in
order, one kernel parameter each); the compile-time constants are one constexpr
``Consts``. The TMA descriptors stay separate parameters (Triton converts a descriptor
only at the top level of a launch).

Shapes: H hidden, I intermediate (an MoE: top_k x I, one slot's rows after another), HQ
= heads x head_dim, KVS = kv_heads x head_dim, QKV = HQ + 2 KVS, L layers, D head_dim,
P SMs, SPMAX the most splits a kv head's keys take, MAXCTX the cache's positions.
"""
from __future__ import annotations

from typing import NamedTuple


class Acts(NamedTuple):
    """bf16 activations of the step: rewritten every layer."""
    x: object          # [H] the residual stream
    qkv: object        # [QKV] the QKV projection
    q: object          # [HQ] the queries after RoPE (the "four" form's ROPE_KV)
    attn: object       # [HQ] the attention's output
    h: object          # [I] (an MoE: [top_k * I]) the MLP's hidden activations


class Cache(NamedTuple):
    """The engine's KV cache and RoPE tables (bf16)."""
    kc: object         # [L, HKV, MAXCTX, D] keys
    vc: object         # [L, HKV, MAXCTX, D] values
    cos: object        # [MAXCTX, D]
    sin: object        # [MAXCTX, D]


class Partials(NamedTuple):
    """The attention splits' fp32 partial softmax states, row (query head, split)."""
    pm: object         # [HQ / D, SPMAX] running max
    pl: object         # [HQ / D, SPMAX] sum of exp
    po: object         # [HQ / D, SPMAX, D] unnormalised output


class Token(NamedTuple):
    """The step's token: the LM head's bests, and the engine's sequence state."""
    val: object        # [P] fp32: each LM-head instruction's best logit
    idx: object        # [P] int32: and its row
    seq: object        # [max_ctx + 1] int32: prompt, then the tokens generated
    amax: object       # [max_ctx + 1] int32: the argmax at each position
    pos: object        # [1] int32: this step's position (ARGMAX adds 1)
    plen: object       # [1] int32: the prompt's length


class Gains(NamedTuple):
    """A dense model's embedding, RMS gains (bf16) and QKV bias."""
    emb: object        # [V, H]
    gin: object        # [L, H] input norm
    gpost: object      # [L, H] post-attention norm
    gfin: object       # [H] final norm
    bqkv: object       # [L * QKV] (unread without a bias)


class MoEGains(NamedTuple):
    """A mixture of experts' embedding, RMS gains and q/k-norm gains (bf16)."""
    emb: object        # [V, H]
    gin: object        # [L, H]
    gpost: object      # [L, H]
    gfin: object       # [H]
    qn: object         # [L, HQ] q norm
    kn: object         # [L, KVS] k norm


class Route(NamedTuple):
    """A mixture of experts' routing buffers."""
    ss: object         # [QKV blocks, 2] fp32: each QKV block's sums of squares of q, k
    rl: object         # [E] fp32: the router's logits
    ids: object        # [L, top_k] int32: each layer's experts
    rw: object         # [L, top_k] fp32: and their routing weights
    log: object        # [max_ctx + 1, L, top_k] int32: the engine's expert log


class Sync(NamedTuple):
    """Counters and the stall and clock records (int32, int64)."""
    ctr: object        # [counters + 1]: the schedule's counters, then the exit count
    err: object        # [P (MoE: 2 P), 4]: instruction + 1, counter, value seen, target
    clk: object        # [P, N, 4] int64 globaltimer stamps an instruction


class Sizes(NamedTuple):
    L: int
    H: int
    I: int
    QKV: int
    HQ: int
    KVS: int
    V: int
    SPMAX: int
    MAXCTX: int


class MoESizes(NamedTuple):
    L: int
    H: int
    I: int
    QKV: int
    HQ: int
    KVS: int
    V: int
    E: int
    SPMAX: int
    MAXCTX: int


class Consts(NamedTuple):
    """A dense step's compile-time constants."""
    KB_: int           # K tiles a [TN, KB, TK] ring box
    KG: int            # gate/up's K tiles: a box of KG and a tail box of GT (0: none)
    GT: int
    NF: int            # the down projection's full boxes of KD = 2 KB K tiles
    TAIL: int          # and the tail box's K tiles (0: none)
    STAGES: int        # ring stages
    WIDTH: int         # an instruction's int32 fields (isa.WIDTH)
    G: int             # query heads a kv head, and that padded to a power of two
    GP: int
    D: int             # head_dim
    HKV: int           # kv heads
    BT: int            # keys an attention partial takes a block
    SB: int            # splits a merge takes a chunk
    SBF: int           # splits a fused merge takes a chunk
    NPB: int           # P padded to a power of two (the argmax's block)
    EB: int            # columns an embedding copy takes a block
    BIAS: int          # 1: QKV has a bias
    ATT: int           # the attention's stages after QKV (4, 3, 2: ``step.ATT_STAGES``)
    CTR_BLOCK: int     # counters + 1 padded to a power of two (the reset's block)
    CLOCK: int         # 1: stamp the clock an instruction
    POLL: int          # 0: one thread's acquire load broadcast; 1: every thread's own
    L2PF: int = 0      # the loaders' L2 prefetch of gate/up (``l2stage.py``): 0 off, 1 on,
                       # 2 on with an evict-last policy


class MoEConsts(NamedTuple):
    """A mixture of experts' step's compile-time constants (as ``Consts`` where named
    alike)."""
    KB_: int
    KG: int
    GT: int
    KE: int            # an expert's down rows' K tiles (all of I in one box)
    TOPK: int          # experts a token
    EP: int            # experts padded to a power of two
    QSB: int           # QKV blocks' q/k squares a RoPE sums a chunk
    STAGES: int
    HOLD: int          # held stages (after the ring's) for the loader's hoist
    WIDTH: int
    G: int
    GP: int
    D: int
    HKV: int
    BT: int
    SB: int
    NPB: int
    EB: int
    CTR_BLOCK: int
    CLOCK: int
    POLL: int
