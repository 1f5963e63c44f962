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
    LWAIT   the counter its *loader* waits for before asking for its first tile (NONE:
            weights that depend on nothing the step computes), LTARGET the count; the
            experts' tiles are addressed by the router's ids, so they wait on its counter
    HOIST   tiles the loader streams into its held stages before that wait: the first
            HOIST tiles of the instructions after this run of loader-waiting ones (the
            next layer's attention, the router, the LM head: what does not depend on it)
    BUMP2   ATTN_FUSED: the counter the last of its group (the instructions bumping
            BUMP) adds 1 to after its merge (NONE elsewhere)

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
    ARGMAX        the token from ROWS slots; then resets every counter to zero (the VM's
                  rule, checked there: every other SM's last bump ordered before it;
                  the Gluon kernels reset when their last CTA leaves, a later point)
    ATTN_FUSED    RoPE + partial (+ merge) in one (``schedule.build(attention="three" or
                  "two")``, the one-launch kernel's lists): ROW0 = kv head, ROWS its G
                  query heads, ARG = split of SPLITS; waits for all of QKV, RoPEs its
                  queries and the new key itself, the split whose keys hold pos writes
                  the new k/v into the cache, then the partial as ATTN_PARTIAL; it bumps
                  BUMP. With a BUMP2 ("two"), that bump is an acquire and release, and the
                  one that brings it to SPLITS merges the group's G heads into attn and
                  bumps BUMP2; without ("three"), ATTN_MERGE instructions merge

The mixture of experts (OLMoE) adds, per layer (RMS_QKV then also stores its rows' sums
of squares of q and k, row IDX of a [blocks, 2] partial; ROPE_KV sums its SPLITS
partials in order for the q/k norm over the whole projection, before RoPE):

    ROUTER        router logits rows [ROW0, ROW0+ROWS) = W_r rows @ rmsnorm(x)
    TOPK          ROWS = E logits: softmax, top-k (no renormalisation, ties to the lower
                  expert index) into the layer's ids and routing weights
    EXPERT_GATE_UP  rows [ROW0, ROW0+ROWS) of h over (slot, row) = slot * I + row: each
                  slot's rows of its expert's gate and up (+ SwiGLU)
    EXPERT_DOWN   x rows [ROW0, ROW0+ROWS), slots [K0 / I, (K0 + KLEN) / I) (the K of
                  (slot, I)), group ARG of SPLITS: each slot's rows x its routing weight,
                  summed in slot order; earlier groups store fp32 partials, the last adds
                  them in group order to x
"""
(OP, LAYER, ROW0, ROWS, K0, KLEN, WAIT0, TARGET0, WAIT1, TARGET1, BUMP, ARG, IDX,
 SPLITS, UNIT, LWAIT, LTARGET, HOIST, BUMP2) = range(19)
WIDTH = 32            # 128-byte rows (one L2 line): fields above, the rest zero
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
# the mixture of experts
OP_ROUTER = 11        # rows of the router's logits = W_r @ rmsnorm(x)
OP_TOPK = 12          # softmax over the logits, the top-k ids and routing weights
OP_EXPERT_GATE_UP = 13  # (slot, rows) of h = silu(W_g[id] @ xn) * (W_u[id] @ xn)
OP_EXPERT_DOWN = 14   # rows (x a group of slots) of x += sum_j w_j W_down[id_j] @ h_j
# the one-launch kernel's attention: fewer stages a layer (entry 29 of NOTES.md)
OP_ATTN_FUSED = 15    # RoPE + partial (the "two" form: the last split of a kv head merges)
OPCODES = {v: k for k, v in dict(globals()).items() if k.startswith("OP_")}
