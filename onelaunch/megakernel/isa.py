"""The megakernel's instruction format: one row of int32 per instruction.

A schedule is an int32 tensor ``[P, N, WIDTH]``: P lists (one per SM, run in order by
that SM) of at most N instructions, padded with ``OP_END`` rows. Every field below is an
int32 column; ``NONE`` (-1) marks an unused counter. Counters live in one int32 device
tensor; an instruction waits until each named counter is at least its target (acquire),
runs, stores its outputs and only then adds 1 to its bump counter (release).

    OP      what it computes (the opcodes below)
    LAYER   the layer it belongs to (0 for the head)
    ROW0    first output row it owns
    ROWS    output rows it owns
    K0      first reduction index it reads (a split of K), KLEN how many
    WAITn   counter index it waits for (NONE: no wait), TARGETn the count it waits for
    BUMP    counter index it adds 1 to when its stores are done (NONE: none)
    ARG     op-specific (a head, a split, an expert slot)
"""
OP, LAYER, ROW0, ROWS, K0, KLEN, WAIT0, TARGET0, WAIT1, TARGET1, BUMP, ARG = range(12)
WIDTH = 16            # 64-byte rows: fields above, the rest zero (room to grow)
NONE = -1

# opcodes (dense step first; the MoE issue adds its own after these)
OP_END = 0            # end of this SM's list
OP_RMS_QKV = 1        # rows of qkv = W_qkv @ rmsnorm(x) + b
OP_ROPE_KV = 2        # RoPE on q/k of one kv head group, the new k/v into the cache
OP_ATTN_PARTIAL = 3   # one (kv head, split) of the context: partial softmax state
OP_ATTN_MERGE = 4     # one query head's splits merged into attn
OP_O_PROJ = 5         # rows of x += W_o @ attn
OP_GATE_UP = 6        # rows of h = silu(W_g @ xn) * (W_u @ xn), xn = rmsnorm(x)
OP_DOWN = 7           # rows (x K split) of x += W_down @ h
OP_LM_HEAD = 8        # rows of the logits: this instruction's best (value, index)
OP_ARGMAX = 9         # the step's token from every LM-head instruction's best
OPCODES = {v: k for k, v in dict(globals()).items() if k.startswith("OP_")}
