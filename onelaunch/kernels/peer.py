"""Tensor parallelism's exchange inside the kernels: peer stores and a flag per tile.

Under TP every rank computes a partial of a row-parallel projection (O, down, MoE down)
and must end with the same x = bf16(x + bf16(p_0 + p_1 + ...)), the partials summed in
rank order. Instead of a collective after the kernel, the program that owns a row tile
(the only program of the O-projection; the last arrival of a split-K or MoE row block)
exchanges its tile with the other ranks itself, through buffers every rank can store into
(symmetric memory, NVLink peer stores; never NVLink multicast), and then finishes the
residual add. :func:`peer_sum` is that exchange, and every TP kernel uses it.

The protocol, per (site, tile), replayable in a CUDA graph with no host reset. Each fp32
value travels in one 8-byte word with the exchange's number in its high half (NCCL's
low-latency protocol), so a word that has arrived says so itself: no fence, no flag.

    v = ++seqno[site, tile]                              local: the exchange's number
    for every rank r != me:  slots_r[site, v % 2, me, offs] = (v << 32) | bits(my value)
    for every rank r != me:  spin until every word of slots_me[site, v % 2, r, offs] says v
    total = sum over r in rank order of (my value if r == me else the word's low half)

Every rank sums the same values in the same order, so every rank gets the same bits.
The slots are double-buffered by the parity of v: a fast rank's exchange v + 1 writes the
other half, so it cannot overwrite what a slow rank still reads for exchange v (and
exchange v + 2 needs the slow rank's words of v + 1, which it sends only after reading v).
The first version raised a separate flag after a system-scope fence: about 7 us a call
on two H200s, where the words alone take one NVLink round trip.

Buffers, per rank (every rank can store into every rank's copy of the first two):

    slots  int64 [sites, 2, world, n_max]   words, by parity and source rank
    flags  int32 [sites, world, tiles_max]  (kept for the descriptor's layout; unused)
    seqno  int32 [sites, tiles_max]         local: this rank's last exchange number

A kernel gets one pointer per call site, to an int64 descriptor of that site:

    [0, world)          address of slots[site] on rank r (as mapped in this process)
    [world, 2 world)    address of flags[site] on rank r
    2 world             address of seqno[site] (local)
    2 world + 1..3      rank, n_max, tiles_max

A tile must fit: ``n <= n_max`` values and tile index < ``tiles_max`` (a GEMV site with
N rows in BLOCK_N-row programs needs tiles_max >= ceil(N / BLOCK_N)).

Progress: a program that exchanges spins until the same tile's program on every other
rank has stored. GPUs dispatch a grid's programs in index order, and every rank runs the
same grid, so a program spinning on tile t means its rank has dispatched everything
before it; the peer's programs for tile t are then either dispatched too or behind
programs that can finish, whether the tile has one program (the O-projection) or its
exchange falls to the last of several (split-K's down, the MoE's slots). (The first
version hung on split-K downs: every warp read the exchange number and one warp stored
the next, so a late warp could read the new number and wait for words that never come.
The number is now read behind a barrier; 100 checked replays of each fused kernel on two
H200s, ``lab/tp_peer_check.py``.) ``reset`` zeroes this rank's slots, flags and seqno (all
ranks, with a barrier before and after), so a replay after an interrupted one starts clean.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@triton.jit
def peer_sum(y, offs_n, n_mask, tile, peer_ptr, WORLD: tl.constexpr,
             FENCE: tl.constexpr):
    """Sum over ranks, in rank order, of every rank's ``y`` (fp32, this program's values
    at ``offs_n`` of exchange tile ``tile``), through the site ``peer_ptr`` describes
    (the protocol in the module docstring). Every rank gets the same bits.

    Each value travels with its exchange number in one 8-byte word (NCCL's low-latency
    protocol): a reader knows a word has arrived when its high half says ``v``, so no
    fence and no separate flag sit between the stores and the wait."""
    seq = tl.load(peer_ptr + 2 * WORLD).to(tl.pointer_type(tl.int32))
    rank = tl.load(peer_ptr + 2 * WORLD + 1).to(tl.int32)
    n_max = tl.load(peer_ptr + 2 * WORLD + 2)
    v = tl.load(seq + tile, volatile=True) + 1
    # every warp has read the old number before one stores the new
    tl.debug_barrier()
    tl.store(seq + tile, v)
    half = (v % 2) * WORLD * n_max           # double buffer: the parity of the exchange
    word = ((v.to(tl.int64) << 32)
            | (y.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF))
    # my words into every other rank's slots[me]
    for r in tl.static_range(WORLD):
        if r != rank:
            dst = tl.load(peer_ptr + r).to(tl.pointer_type(tl.int64))
            tl.store(dst + half + rank * n_max + offs_n, word, mask=n_mask)
    mine = tl.load(peer_ptr + rank).to(tl.pointer_type(tl.int64)) + half
    total = tl.zeros_like(y)
    for r in tl.static_range(WORLD):         # rank order: the same bits on every rank
        if r == rank:
            total += y
        else:
            src = mine + r * n_max + offs_n
            w = tl.load(src, mask=n_mask, other=0, volatile=True)
            ready = tl.min(tl.where(n_mask, ((w >> 32).to(tl.int32) == v).to(tl.int32),
                                    1), axis=0)
            while ready == 0:                # spin on the words themselves
                w = tl.load(src, mask=n_mask, other=0, volatile=True)
                ready = tl.min(tl.where(n_mask,
                                        ((w >> 32).to(tl.int32) == v).to(tl.int32), 1),
                               axis=0)
            total += (w & 0xFFFFFFFF).to(tl.int32).to(tl.float32, bitcast=True)
    return total


@dataclass(frozen=True)
class PeerSite:
    """What a launcher needs for one call site: the descriptor (int64, on the kernel's
    device) and the sizes to check a launch against."""
    desc: torch.Tensor
    rank: int
    world: int
    n_max: int
    tiles_max: int

    def check(self, n: int, tiles: int) -> None:
        assert n <= self.n_max, f"{n} values per exchange, the site holds {self.n_max}"
        assert tiles <= self.tiles_max, f"{tiles} tiles, the site holds {self.tiles_max}"


DESC = 4   # descriptor entries past the 2 * world addresses


class PeerBuffers:
    """One rank's exchange buffers for ``sites`` call sites (module docstring). Build with
    :meth:`cuda` (symmetric memory over a process group) or :meth:`from_tensors` (CPU
    tensors in shared memory, for the interpreter); ``site(i)`` is a kernel's ``peer=``."""

    def __init__(self, rank, world, slots_per_rank, flags_per_rank, seqno, keep=()):
        self.rank, self.world = rank, world
        self.sites, _, w, self.n_max = slots_per_rank[rank].shape
        self.tiles_max = flags_per_rank[rank].shape[2]
        assert w == world and len(slots_per_rank) == len(flags_per_rank) == world
        assert seqno.shape == (self.sites, self.tiles_max) and seqno.dtype == torch.int32
        self.slots, self.flags, self.seqno = slots_per_rank[rank], flags_per_rank[rank], seqno
        self._keep = (slots_per_rank, flags_per_rank, keep)    # peers' mappings stay alive
        rows = []
        for i in range(self.sites):
            rows.append([s[i].data_ptr() for s in slots_per_rank]
                        + [f[i].data_ptr() for f in flags_per_rank]
                        + [seqno[i].data_ptr(), rank, self.n_max, self.tiles_max])
        self.desc = torch.tensor(rows, dtype=torch.int64, device=self.slots.device)

    def site(self, i: int) -> PeerSite:
        return PeerSite(self.desc[i], self.rank, self.world, self.n_max, self.tiles_max)

    def reset(self) -> None:
        """Zero this rank's words, flags and exchange numbers. Every rank calls it, with a barrier
        (and the GPU idle) before and after: then no exchange is half done anywhere."""
        self.slots.zero_()           # a stale word could carry a number the next run reuses
        self.flags.zero_()
        self.seqno.zero_()

    @staticmethod
    def shapes(world, sites, n_max, tiles_max):
        return (sites, 2, world, n_max), (sites, world, tiles_max), (sites, tiles_max)

    @classmethod
    def alloc_shared(cls, world, sites, n_max, tiles_max):
        """Every rank's buffers as CPU tensors in shared memory (zeroed), to create in a
        parent process and hand to the rank processes: (slots, flags, seqnos) lists."""
        ss, fs, qs = cls.shapes(world, sites, n_max, tiles_max)
        mk = lambda shape, dt: [torch.zeros(shape, dtype=dt).share_memory_() for _ in range(world)]  # noqa: E731
        return mk(ss, torch.int64), mk(fs, torch.int32), mk(qs, torch.int32)

    @classmethod
    def from_tensors(cls, rank, world, slots_per_rank, flags_per_rank, seqno):
        """Buffers that already exist: ``slots_per_rank[r]`` int64 [sites, 2, world, n_max]
        and ``flags_per_rank[r]`` int32 [sites, world, tiles_max] as this process sees rank
        r's copy; ``seqno`` this rank's int32 [sites, tiles_max] (all zero to start)."""
        return cls(rank, world, slots_per_rank, flags_per_rank, seqno)

    @classmethod
    def cuda(cls, group_name, rank, world, sites, n_max, tiles_max, device):
        """Symmetric-memory buffers over the process group ``group_name`` (every rank calls
        this, collectively). NVLink multicast is never used: peer stores only."""
        import torch.distributed._symmetric_memory as symm_mem
        ss, fs, qs = cls.shapes(world, sites, n_max, tiles_max)
        slots = symm_mem.empty(int(torch.Size(ss).numel()), device=device, dtype=torch.int64)
        flags = symm_mem.empty(int(torch.Size(fs).numel()), device=device, dtype=torch.int32)
        slots.zero_()
        flags.zero_()
        torch.cuda.synchronize(device)       # zero here before any rank can leave the rendezvous
        hs = symm_mem.rendezvous(slots, group_name)
        hf = symm_mem.rendezvous(flags, group_name)
        s_r = [slots.view(ss) if r == rank else hs.get_buffer(r, ss, torch.int64)
               for r in range(world)]
        f_r = [flags.view(fs) if r == rank else hf.get_buffer(r, fs, torch.int32)
               for r in range(world)]
        seqno = torch.zeros(qs, dtype=torch.int32, device=device)
        return cls(rank, world, s_r, f_r, seqno, keep=(slots, flags, hs, hf))


def epilogue_args(x, out, peer, n, tiles):
    """The arguments of :func:`_common.finish_rows` for a launcher: (out_ptr, peer_ptr),
    {OUT, PEER, WORLD}. Unused pointers are ``x`` (never dereferenced)."""
    assert out is None or peer is None, "out (unfused TP) or peer (fused TP), not both"
    if peer is not None:
        peer.check(n, tiles)
        return x, peer.desc, dict(OUT=False, PEER=True, WORLD=peer.world)
    if out is not None:
        assert out.dtype == torch.float32 and out.numel() >= n
        return out, x, dict(OUT=True, PEER=False, WORLD=1)
    return x, x, dict(OUT=False, PEER=False, WORLD=1)
