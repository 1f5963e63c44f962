"""The megakernel's instruction format: one row of int32 per instruction.

A schedule is an int32 tensor ``[P, N, WIDTH]``: P lists (one per SM, run in order by
that SM) of at most N instructions, padded with ``OP_END`` rows. Every field below is an
int32 column; ``NONE`` (-1) marks an unused counter. Counters live in one int32 device
tensor; an instruction waits until each named counter is at least its target (acquire),
runs, stores its outputs and only then adds 1 to its bump counter (release).

    OP      what it computes (the opcodes below)
    LAYER   the layer it belongs to (NONE for the embedding and the head)
    ROW0    first output row it owns
    ROWS    output rows it owns
    K0      first reduction index it reads (a split of K), KLEN how many
    WAITn   counter index it waits for (NONE: no wait), TARGETn the count it waits for
    BUMP    counter index it adds 1 to when its stores are done (NONE: none)
    ARG     op-specific (a split)
    IDX     its index among the instructions of its op and layer (0, 1, ...)
    SPLITS  the splits of its reduction (attention: per kv head; down: of K)
    UNIT    attention: positions a split's share of the live length is counted in

What the row fields mean per op (``schedule.py`` builds them, ``vm.py`` runs them):

    EMBED         x[ROW0:ROW0+ROWS] = E[seq[pos], ROW0:ROW0+ROWS]
    RMS_QKV       qkv rows [ROW0, ROW0+ROWS), K = [K0, K0+KLEN) = all of hidden
    ROPE_KV       ROW0 = the kv head; its GROUP query heads and its k/v at slot pos
    ATTN_PARTIAL  ROW0 = kv head, ROWS = its query heads, ARG = split of SPLITS; the keys
                  it reads come from pos at run time (``schedule.split_range``)
    ATTN_MERGE    ROW0 = query head; merges its SPLITS partials
    O_PROJ        x rows [ROW0, ROW0+ROWS) += W_o rows @ attn
    GATE_UP       h channels [ROW0, ROW0+ROWS) (gate rows r, up rows I + r)
    DOWN          x rows [ROW0, ROW0+ROWS), K split ARG of SPLITS = [K0, K0+KLEN); the
                  splits before the last store fp32 partials, the last adds them to x
    LM_HEAD       logits rows [ROW0, ROW0+ROWS); its best (value, index) into slot IDX
    ARGMAX        the token from ROWS slots; then resets every counter to zero
"""
(OP, LAYER, ROW0, ROWS, K0, KLEN, WAIT0, TARGET0, WAIT1, TARGET1, BUMP, ARG, IDX,
 SPLITS, UNIT) = range(15)
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
OP_EMBED = 10         # columns of x from the embedding row of the step's token
OPCODES = {v: k for k, v in dict(globals()).items() if k.startswith("OP_")}
