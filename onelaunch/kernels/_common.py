"""Pieces every GEMV-shaped kernel shares: the RMS statistic, a weight tile, an input tile
and the tile loop. All arithmetic is fp32; bf16 values are cast right after each load
(Triton's CPU interpreter does bf16 arithmetic on raw bits, so nothing here ever adds or
multiplies bf16 values).

A GEMV program owns BLOCK_N rows of W [N, K] and walks K in BLOCK_K tiles. The first
PREFETCH tiles (up to 4: all of K = 1536 in 512-wide tiles) are requested by the caller
*before* it waits on the previous kernel (programmatic dependent launch), so weight
streaming overlaps the previous kernel's tail and the activation's fetch: weights never
depend on the previous kernel, only the activation vector does.
"""
import triton
import triton.language as tl

from .peer import peer_sum


@triton.jit
def sum_sq(x_ptr, K, BLOCK_K: tl.constexpr):
    """sum(x^2) over x[0:K] in fp32 (x in bf16): BLOCK_K lanes, tile by tile, then summed.
    The order is fixed by BLOCK_K, so a caller that must agree with another (qk_sumsq with
    rope_kv_write's norm) passes the same BLOCK_K."""
    acc = tl.zeros([BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + offs, mask=offs < K, other=0.0).to(tl.float32)
        acc += x * x
    return tl.sum(acc, axis=0)


@triton.jit
def rstd_of(ss, K, eps):
    """1 / sqrt(mean(x^2) + eps) from the sum of squares ``ss`` of K values."""
    return 1.0 / tl.sqrt(ss / K + eps)


@triton.jit
def rms_rstd(x_ptr, K, eps, BLOCK_K: tl.constexpr):
    """1 / sqrt(mean(x^2) + eps) over x[0:K] (x in bf16, statistic in fp32)."""
    return rstd_of(sum_sq(x_ptr, K, BLOCK_K), K, eps)


@triton.jit
def load_w_tile(w_ptr, stride_w_n, offs_n, n_mask, k0, k_end, BLOCK_K: tl.constexpr):
    """W[offs_n, k0:k0+BLOCK_K] (masked past k_end), streamed once: evict first from L2."""
    offs_k = k0 + tl.arange(0, BLOCK_K)
    ptrs = w_ptr + offs_n[:, None] * stride_w_n + offs_k[None, :]
    mask = n_mask[:, None] & (offs_k[None, :] < k_end)
    return tl.load(ptrs, mask=mask, other=0.0, eviction_policy="evict_first")


@triton.jit
def load_x_tile(x_ptr, g_ptr, rstd, k0, k_end, BLOCK_K: tl.constexpr,
                HAS_NORM: tl.constexpr):
    """x[k0:k0+BLOCK_K] as fp32; with HAS_NORM, RMS-normalised the way HF does it:
    (x * rstd) rounded to bf16, times the gain, rounded to bf16."""
    offs_k = k0 + tl.arange(0, BLOCK_K)
    m = offs_k < k_end
    x = tl.load(x_ptr + offs_k, mask=m, other=0.0).to(tl.float32)
    if HAS_NORM:
        g = tl.load(g_ptr + offs_k, mask=m, other=0.0).to(tl.float32)
        x = bf16_round(x * rstd) * g
        x = bf16_round(x)
    return x


@triton.jit
def load_w_tiles(w_ptr, stride_w_n, offs_n, n_mask, k_start, k_end,
                 BLOCK_K: tl.constexpr, PREFETCH: tl.constexpr):
    """The first PREFETCH (1 to 4) tiles of a program's rows, all requested at once.

    Called before ``gdc_wait``: the weight bytes of those tiles are in flight while the
    previous kernel finishes and while the activation is fetched. Tiles past ``k_end``
    are fully masked (no memory traffic); unused slots repeat the first tile."""
    w0 = load_w_tile(w_ptr, stride_w_n, offs_n, n_mask, k_start, k_end, BLOCK_K)
    w1 = w0
    w2 = w0
    w3 = w0
    if PREFETCH > 1:
        w1 = load_w_tile(w_ptr, stride_w_n, offs_n, n_mask, k_start + BLOCK_K, k_end,
                         BLOCK_K)
    if PREFETCH > 2:
        w2 = load_w_tile(w_ptr, stride_w_n, offs_n, n_mask, k_start + 2 * BLOCK_K,
                         k_end, BLOCK_K)
    if PREFETCH > 3:
        w3 = load_w_tile(w_ptr, stride_w_n, offs_n, n_mask, k_start + 3 * BLOCK_K,
                         k_end, BLOCK_K)
    return w0, w1, w2, w3


@triton.jit
def row_tiles(w_ptr, stride_w_n, N, tile, k_start, k_end, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr, PREFETCH: tl.constexpr):
    """:func:`load_w_tiles` for row tile ``tile`` (rows tile * BLOCK_N ...) of W [N, K]: what
    a GEMV program requests before its wait. A tile past N is fully masked (no traffic), so
    a persistent program may request its next tile without checking that it exists."""
    offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    return load_w_tiles(w_ptr, stride_w_n, offs_n, offs_n < N, k_start, k_end, BLOCK_K, PREFETCH)


@triton.jit
def advance_tiles(w_ptr, stride_w_n, offs_n, n_mask, w0, w1, w2, w3, k_next, k_end,
                  BLOCK_K: tl.constexpr, PREFETCH: tl.constexpr):
    """Move the ring of PREFETCH loaded tiles on by one: drop w0, request the tile at
    ``k_next`` into the last slot. Used once per tile, so PREFETCH tiles stay in flight
    through the whole K loop, not just before the wait."""
    nxt = load_w_tile(w_ptr, stride_w_n, offs_n, n_mask, k_next, k_end, BLOCK_K)
    if PREFETCH == 1:
        w0 = nxt
    elif PREFETCH == 2:
        w0 = w1
        w1 = nxt
    elif PREFETCH == 3:
        w0 = w1
        w1 = w2
        w2 = nxt
    else:
        w0 = w1
        w1 = w2
        w2 = w3
        w3 = nxt
    return w0, w1, w2, w3


@triton.jit
def ring_start(w_ptr, stride_w_n, offs_n, n_mask, K, BLOCK_K: tl.constexpr,
               PREFETCH: tl.constexpr):
    """A program's ring of weight tiles in flight: W[offs_n, tile] for the first PREFETCH
    tiles of K, requested at once (:func:`load_w_tiles`). ``ring[0]`` is the tile the K
    loop consumes next; a kernel calls this before its PDL wait."""
    w0, w1, w2, w3 = load_w_tiles(w_ptr, stride_w_n, offs_n, n_mask, 0, K, BLOCK_K,
                                  PREFETCH)
    return w0, w1, w2, w3


@triton.jit
def ring_next(ring, w_ptr, stride_w_n, offs_n, n_mask, k0, K, BLOCK_K: tl.constexpr,
              PREFETCH: tl.constexpr):
    """The ring at K tile ``k0``: request the tile PREFETCH - 1 ahead of it and drop the
    one consumed (:func:`advance_tiles`), so PREFETCH tiles stay in flight through the
    whole K loop. ``ring[0]`` is then W[offs_n, k0:k0 + BLOCK_K]."""
    w0, w1, w2, w3 = ring
    w0, w1, w2, w3 = advance_tiles(w_ptr, stride_w_n, offs_n, n_mask, w0, w1, w2, w3,
                                   k0 + (PREFETCH - 1) * BLOCK_K, K, BLOCK_K, PREFETCH)
    return w0, w1, w2, w3


@triton.jit
def gemv_tiles(w_ptr, stride_w_n, offs_n, n_mask, x_ptr, g_ptr, rstd, w0, w1, w2, w3,
               k_start, k_end, BLOCK_K: tl.constexpr, HAS_NORM: tl.constexpr,
               PREFETCH: tl.constexpr):
    """sum_k W[offs_n, k] * x[k] for k in [k_start, k_end); ``w0..w3`` is the ring of
    the first PREFETCH tiles from :func:`load_w_tiles`. Each step consumes w0 and
    requests the tile PREFETCH ahead. The accumulation order is the same whatever
    PREFETCH is (tile by tile into one [BLOCK_N, BLOCK_K] fp32 accumulator, summed over
    K at the end), so the result does not depend on it. Returns fp32 [BLOCK_N]."""
    acc = w0.to(tl.float32) * load_x_tile(x_ptr, g_ptr, rstd, k_start, k_end, BLOCK_K,
                                          HAS_NORM)[None, :]
    for k0 in range(k_start + BLOCK_K, k_end, BLOCK_K):
        w0, w1, w2, w3 = advance_tiles(w_ptr, stride_w_n, offs_n, n_mask, w0, w1, w2,
                                       w3, k0 + (PREFETCH - 1) * BLOCK_K, k_end,
                                       BLOCK_K, PREFETCH)
        acc += w0.to(tl.float32) * load_x_tile(x_ptr, g_ptr, rstd, k0, k_end, BLOCK_K,
                                               HAS_NORM)[None, :]
    return tl.sum(acc, axis=1)


@triton.jit
def gemv2_tiles(wa_ptr, wb_ptr, stride_w_n, offs_n, n_mask, x_ptr, g_ptr, rstd,
                a0, a1, a2, a3, b0, b1, b2, b3, K, BLOCK_K: tl.constexpr, PREFETCH: tl.constexpr,
                HAS_NORM: tl.constexpr):
    """Two GEMVs over the same (optionally RMS-normalised) x, gate and up: like
    :func:`gemv_tiles` twice, bit for bit, but each x tile is loaded (and normalised) once
    for both. Returns two fp32 [BLOCK_N]."""
    xt = load_x_tile(x_ptr, g_ptr, rstd, 0, K, BLOCK_K, HAS_NORM)[None, :]
    acc_a = a0.to(tl.float32) * xt
    acc_b = b0.to(tl.float32) * xt
    for k0 in range(BLOCK_K, K, BLOCK_K):
        k_next = k0 + (PREFETCH - 1) * BLOCK_K
        a0, a1, a2, a3 = advance_tiles(wa_ptr, stride_w_n, offs_n, n_mask, a0, a1, a2, a3, k_next, K,
                                       BLOCK_K, PREFETCH)
        b0, b1, b2, b3 = advance_tiles(wb_ptr, stride_w_n, offs_n, n_mask, b0, b1, b2, b3, k_next, K,
                                       BLOCK_K, PREFETCH)
        xt = load_x_tile(x_ptr, g_ptr, rstd, k0, K, BLOCK_K, HAS_NORM)[None, :]
        acc_a += a0.to(tl.float32) * xt
        acc_b += b0.to(tl.float32) * xt
    return tl.sum(acc_a, axis=1), tl.sum(acc_b, axis=1)


@triton.jit
def stream_gemv(w_ptr, stride_w_n, N, K, x_ptr, g_ptr, rstd, out_ptr, b_ptr, first,
                step, EPI: tl.constexpr, HAS_NORM: tl.constexpr, HAS_BIAS: tl.constexpr,
                FENCE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                STAGES: tl.constexpr):
    """Row tiles ``first``, ``first + step``, ... of W [N, K] @ x, as one flat loop over
    (row tile, K tile) that Triton's software pipeliner streams through shared memory,
    STAGES - 1 tiles ahead (``tl.range(num_stages=...)``: asynchronous copies, so the
    bytes in flight do not take registers). A persistent program owns many tiles; the
    flat loop keeps its stream going from one tile into the next.

    The order of the sums is :func:`gemv_tiles`' (one [BLOCK_N, BLOCK_K] fp32
    accumulator, summed when a row tile's last K tile is in), and the epilogues are the
    unfused kernels': EPI 0 the QKV rows (bf16, + bias), EPI 1 the residual add
    (:func:`finish_rows`), EPI 2 gate/up (W holds the gate rows, the up rows N rows
    below: :func:`swiglu`)."""
    nk = tl.cdiv(K, BLOCK_K)
    mine = tl.cdiv(tl.maximum(tl.cdiv(N, BLOCK_N) - first, 0), step)
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for i in tl.range(0, mine * nk, num_stages=STAGES):
        tile = first + (i // nk) * step
        k0 = (i % nk) * BLOCK_K
        offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        n_mask = offs_n < N
        xt = load_x_tile(x_ptr, g_ptr, rstd, k0, K, BLOCK_K, HAS_NORM)[None, :]
        w = load_w_tile(w_ptr, stride_w_n, offs_n, n_mask, k0, K, BLOCK_K)
        acc += w.to(tl.float32) * xt
        if EPI == 2:
            u = load_w_tile(w_ptr + N * stride_w_n, stride_w_n, offs_n, n_mask, k0, K,
                            BLOCK_K)
            acc2 += u.to(tl.float32) * xt
        if k0 + BLOCK_K >= K:                          # the row tile's last K tile
            y = tl.sum(acc, axis=1)
            if EPI == 0:
                y = bf16_round(y)                      # the projection's bf16 output
                if HAS_BIAS:
                    y += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
                tl.store(out_ptr + offs_n, bf16_round(y).to(out_ptr.dtype.element_ty),
                         mask=n_mask)
            elif EPI == 1:
                finish_rows(y, out_ptr, out_ptr, offs_n, n_mask, tile, out_ptr, False,
                            False, 1, FENCE)
            else:
                h = swiglu(y, tl.sum(acc2, axis=1))
                tl.store(out_ptr + offs_n, h.to(out_ptr.dtype.element_ty), mask=n_mask)
            acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
            acc2 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)


@triton.jit
def swiglu(gate, up):
    """silu(gate) * up from fp32 projections, rounded where HF's bf16 model rounds: gate
    and up, silu(gate), then the product. Returns fp32 holding bf16 values."""
    gate = bf16_round(gate)
    up = bf16_round(up)
    act = bf16_round(gate / (1.0 + tl.exp(-gate)))
    return bf16_round(act * up)


@triton.jit
def finish_rows(total, x_ptr, out_ptr, offs_n, n_mask, tile, peer_ptr, OUT: tl.constexpr,
                PEER: tl.constexpr, WORLD: tl.constexpr, FENCE: tl.constexpr):
    """Where a program's finished projection rows (fp32 ``total``) go. By default the
    residual add, rounded as HF rounds (the projection to bf16, then the sum):
    x = bf16(x + bf16(total)). Under tensor parallelism ``total`` is one rank's partial:
    with OUT it is stored unrounded to ``out`` and x is left alone (an all-reduce and
    ``residual_add`` follow); with PEER the ranks' partials are summed in rank order
    here (:func:`peer.peer_sum`, every rank gets the same bits) and then added to x."""
    if OUT:
        tl.store(out_ptr + offs_n, total, mask=n_mask)
    else:
        if PEER:
            total = peer_sum(total, offs_n, n_mask, tile, peer_ptr, WORLD, FENCE)
        x = tl.load(x_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
        tl.store(x_ptr + offs_n, bf16_round(x + bf16_round(total)).to(x_ptr.dtype.element_ty),
                 mask=n_mask)


@triton.jit
def last_arrival_residual(y, scratch_ptr, counter_ptr, x_ptr, pid_n, pid_s, N, offs_n, n_mask,
                          out_ptr, peer_ptr, SPLITS: tl.constexpr, FENCE: tl.constexpr,
                          OUT: tl.constexpr, PEER: tl.constexpr, WORLD: tl.constexpr):
    """x[offs_n] += sum over SPLITS partial rows, by the last program to arrive.

    Each of the SPLITS programs of row block ``pid_n`` stores its fp32 partial ``y`` as
    row ``pid_s`` of ``scratch`` [SPLITS, N], fences and bumps ``counter[pid_n]``; the
    last to arrive (the threadfence-reduction pattern) sums the rows in split order
    (fixed: deterministic, unlike atomic adds), rounds the sum to bf16 as HF rounds a
    projection, adds the residual with one more rounding, and resets the counter.
    (OUT / PEER: the sum goes where :func:`finish_rows` sends it.)"""
    tl.store(scratch_ptr + pid_s * N + offs_n, y, mask=n_mask)
    thread_fence(FENCE)                                  # this thread's partials are visible
    tl.debug_barrier()                                   # ... and every thread's
    arrived = tl.atomic_add(counter_ptr + pid_n, 1, sem="acq_rel")
    if arrived == SPLITS - 1:
        tl.store(counter_ptr + pid_n, 0)
        total = tl.zeros_like(y)
        for s in range(SPLITS):                          # fixed order: deterministic
            total += tl.load(scratch_ptr + s * N + offs_n, mask=n_mask, other=0.0, volatile=True)
        finish_rows(total, x_ptr, out_ptr, offs_n, n_mask, pid_n, peer_ptr, OUT, PEER, WORLD, FENCE)


@triton.jit
def step_bookkeeping(tok, seq_ptr, argmax_ptr, pos_ptr, prompt_len_ptr, HAS_ARGMAX: tl.constexpr):
    """What the host would otherwise do between two greedy steps, given the step's token:
    argmax[pos + 1] = tok (every step, prompt or not, with HAS_ARGMAX); seq[pos + 1] = tok
    once past the prompt (inside it the prompt's own next token stays); pos += 1."""
    pos = tl.load(pos_ptr, volatile=True)
    if HAS_ARGMAX:
        tl.store(argmax_ptr + pos + 1, tok)      # every step's choice, prompt or not
    if pos + 1 >= tl.load(prompt_len_ptr):
        tl.store(seq_ptr + pos + 1, tok)
    tl.store(pos_ptr, pos + 1)


@triton.jit
def merge_keys(vals, idxs):
    """The token from per-rank (max logit, global index) keys: the largest value, the lowest
    index among equal values (torch.argmax's choice over the whole vocabulary). ``idxs``
    holds indices as fp32 (exact below 2^24); padding lanes hold -inf / +inf."""
    m = tl.max(vals, axis=0)
    return tl.min(tl.where(vals == m, idxs, float("inf")), axis=0).to(tl.int32)


@triton.jit
def pdl_wait(USE_PDL: tl.constexpr):
    """Wait for the previous kernel's results (a no-op without PDL), then let the next
    kernel start launching: its programs will issue their weight loads and wait in turn.
    (Triggering before the wait, so that launches run two kernels ahead, measured
    0.014 ms slower per token on the H200: the repository's performance log.)"""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def thread_fence(ENABLED: tl.constexpr):
    """__threadfence(): this thread's earlier writes and atomics are visible GPU-wide
    before its later ones. Used before the arrival counter of a last-arrival reduction.
    (The interpreter runs programs one after another and needs none.)"""
    if ENABLED:
        tl.inline_asm_elementwise("fence.acq_rel.gpu; mov.u32 $0, 0;", "=r", [],
                                  dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def bf16_round(x):
    """Round fp32 to the nearest bf16 value (ties to even), returned as fp32.

    Done on the bits, so the result is identical on the GPU and in Triton's CPU
    interpreter, whose own fp32->bf16 conversion does not round to nearest. A value
    rounded here converts to bf16 exactly under any rounding mode."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = bits + 0x7FFF + ((bits >> 16) & 1)
    bits = bits & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)
