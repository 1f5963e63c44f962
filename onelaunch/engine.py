"""The engine: packed weights, static buffers, one decode step as a list of launches,
captured once into a CUDA graph and replayed for every token.

Everything that changes from one token to the next lives in a device tensor that the
kernels read on replay:

    seq        int32 [max_ctx]   the tokens: the prompt, then what greedy decoding chose
    pos        int32 [1]         position of the token the next step consumes
    prompt_len int32 [1]         steps before this only fill the cache (prefill)

The step reads seq[pos], writes K/V at slot pos, attends over pos + 1 keys, writes its
argmax to seq[pos + 1] (once past the prompt) and advances pos, all on the GPU. So the
host launches one graph per token and reads tokens back in batches. The attention
length, the KV slot and the input token are all derived from ``pos``: a recorded launch
is byte-identical at every step, while the sequence grows underneath it.

Modes: ``graph=False`` runs the same launches eagerly (the "fused eager" rung);
``attention="plain"`` uses one program per query head, ``"splitk"`` the
flash-decode pair;
``pdl=True`` launches every kernel with programmatic dependent launch (Hopper+);
``persistent=True`` (split-K, dense models, one GPU) runs each layer as one persistent
launch whose phases are the unfused kernels' bodies separated by grid barriers
(``kernels/layer_persistent.py``): layers + 2 launches a step, same bits; ``persist``
(``options.PersistentOptions``) overrides its launch table entry for a measurement.

The step itself is data: ``self.plan``, a list of launches built from the spec by the
block builders in ``plan.py`` (embedding, attention, dense MLP or mixture of experts,
head), so Qwen2.5 and OLMoE differ only in the blocks they pick. With ``tp`` (a
``tp.Group``) the engine is one rank of a tensor-parallel group: built from a sharded
spec and sharded weights (``tp.shard_spec``, ``tp.shard_weights``), its plan adds what
the group's rung needs where partial sums meet.
"""
from __future__ import annotations

import sys

import torch
import torch.distributed

from . import kernels as K
from . import plan
from .kernels import config
from .options import PersistentOptions
from .oracle import rope_cos_sin
from .specs import get_spec
from .weights import pack_weights


class EngineError(ValueError):
    """Bad input to the engine: the message says what to do."""


def persistent_refusal(spec, attention: str = "splitk", tp=None, stages: int | None = None):
    """Why an engine with ``persistent=True`` cannot be built for these settings (one line
    saying what to use), or None: the one rule the engine and the ladder's rungs share.
    ``stages``: the persistent entry's STAGES (None: the table's, which streams)."""
    spec = get_spec(spec)
    if attention != "splitk":
        return "persistent=True needs split-K attention: use attention='splitk'"
    if spec.is_moe and stages == 0:
        return (f"persistent=True streams the {spec.name} layer's experts: leave STAGES at "
                f"the table's (not 0), or use persistent=False")
    if tp is not None:
        return ("persistent=True runs on one GPU: leave out tp (or use persistent=False "
                "under tensor parallelism)")
    return None


FALLBACK = "fallback"      # megakernel_refusal: a GPU without Hopper's TMA runs the chain


def megakernel_refusal(spec, device, max_ctx: int, attention="splitk", tp=None,
                       persistent=False):
    """Why an engine with ``megakernel=True`` cannot be built (one line; None: it can;
    FALLBACK: a CUDA GPU that is not Hopper, where the chain runs instead)."""
    from .megakernel.step import device_refusal, refusal
    if attention != "splitk" or tp is not None or persistent:
        return ("megakernel=True is the whole step in one launch on one GPU: leave "
                "attention at 'splitk', and leave out tp and persistent")
    why = refusal(spec, max_ctx)
    if why:
        return why
    if torch.device(device).type == "cuda" and device_refusal(device):
        return FALLBACK
    return device_refusal(device)


class Engine:
    def __init__(self, spec, weights: dict[str, torch.Tensor], max_ctx: int | None = None,
                 attention: str = "splitk", pdl: bool = False,
                 device=None, cfgs: dict | None = None, tp=None, persistent: bool = False,
                 live_cap: int | None = 0, persist: PersistentOptions | None = None,
                 megakernel: bool = False):
        self.spec = spec = get_spec(spec)
        if attention not in ("plain", "splitk"):
            raise EngineError("attention must be 'plain' or 'splitk'")
        w0 = weights["model.embed_tokens.weight"]
        self.device = torch.device(device or w0.device)
        if self.device.type == "cpu" and not config.interpreting():
            raise EngineError("the Triton kernels need a CUDA GPU; on a CPU set TRITON_INTERPRET=1 "
                              "(slow: tiny models only)")
        if w0.dtype != torch.bfloat16:
            raise EngineError("the kernels read bf16 weights: build them with dtype=torch.bfloat16")
        self.max_ctx = max_ctx or spec.max_ctx
        if self.max_ctx > spec.max_ctx:
            raise EngineError(f"max_ctx {self.max_ctx} exceeds {spec.name}'s context "
                              f"({spec.max_ctx}); build the engine with max_ctx <= {spec.max_ctx}")
        self.attention = attention
        self.pdl = bool(pdl) and config.pdl_supported(self.device)
        self.persist = persist or PersistentOptions()   # the persistent layer's switches
        stages = None            # the persistent entry's STAGES (the MoE layer must stream)
        if persistent:
            stages = K.layer_persistent.entry(dict(
                config.get("layer_persistent", self.device),
                **(cfgs or {}).get("layer_persistent", {})), self.persist)["STAGES"]
        why = persistent_refusal(spec, attention, tp, stages) if persistent else None
        if megakernel:
            why = megakernel_refusal(spec, self.device, self.max_ctx, attention, tp,
                                     persistent)
            if why == FALLBACK:
                # off Hopper the chain runs (``paths`` says so), and one line says why
                from .megakernel.step import device_refusal
                print(f"onelaunch: {device_refusal(self.device)}", file=sys.stderr)
                megakernel, why = False, None
        if why:
            raise EngineError(why)
        self.persistent = bool(persistent)
        self.cfgs = dict(cfgs or {})                    # op -> launch config (a sweep's trial)
        self.tp = tp                                    # tp.Group: this engine is one rank
        self.hf_weights = weights                       # the HF-named dict (prefill reads it)
        self.W = pack_weights(spec, weights)
        dev, s = self.device, spec
        self.buffers: dict[str, torch.Tensor] = {}
        # ---- per-step state (read by the kernels on replay) -----------------------------
        self.seq = self.buf("seq", (self.max_ctx + 1,), torch.int32)
        self.argmax = self.buf("argmax", (self.max_ctx + 1,), torch.int32)  # every step's argmax
        self.pos = self.buf("pos", (1,), torch.int32)
        self.prompt_len = self.buf("prompt_len", (1,), torch.int32)
        self.x = self.buf("x", (s.hidden,))                              # residual stream
        # ---- caches: [layers, Hkv, max_ctx, D], one timeline per (layer, kv head) -----
        shape = (s.layers, s.kv_heads, self.max_ctx, s.head_dim)
        self.k_cache = self.buf("k_cache", shape)
        self.v_cache = self.buf("v_cache", shape)
        cos, sin = rope_cos_sin(torch.arange(self.max_ctx, device=dev), s.head_dim, s.rope_theta,
                                torch.bfloat16)
        self.cos, self.sin = cos.contiguous(), sin.contiguous()          # [max_ctx, D]
        # split-K unit: the live length is shared out in it
        self.chunk = K.attention_splitk.chunk_for(self.max_ctx)
        # live splits a kv head at most (0: the default for this model; None: no cap)
        self.live_cap = self._live_cap(live_cap)
        # ---- the step: a list of launches; each builder asks for the buffers it needs --
        # (the one-launch step: megakernel/step.py, over this engine's buffers)
        self.mega = None
        if megakernel:
            from .megakernel.step import MegaStep
            self.mega = MegaStep(self)
        self.plan = [self.mega.launch()] if megakernel else plan.build(self)
        self.graph = None
        self.paths = self.ran_paths()   # what the plan runs, read from its launches
        self.last_run: dict | None = None   # what the last generate/teacher_forced ran

    def _live_cap(self, live_cap: int | None) -> int | None:
        return (K.attention_splitk.default_live_cap(self.spec.kv_heads) if live_cap == 0
                else live_cap)

    def replan(self, **changes):
        """Change settings the launches read, ``live_cap`` or ``persist`` (as in the
        constructor), and rebuild the plan with them: each launch holds its arguments, so
        a setting reaches the step only through a new plan. The next graph step
        recaptures."""
        bad = sorted(set(changes) - {"live_cap", "persist"})
        if bad or self.mega is not None:
            raise EngineError(f"replan changes live_cap or persist of a chain of kernels, "
                              f"not {bad or 'the one-launch step'}")
        if "live_cap" in changes:
            self.live_cap = self._live_cap(changes["live_cap"])
        if "persist" in changes:
            self.persist = changes["persist"] or PersistentOptions()
        self.plan = plan.build(self)
        self.paths = self.ran_paths()
        self.graph = None

    # ---- buffers and launch configurations, for the plan's builders ---------------------
    def buf(self, name: str, shape, dtype=torch.bfloat16) -> torch.Tensor:
        """The static device buffer ``name`` (allocated zeroed on first request; every later
        request gets the same tensor, so all layers share one activation buffer)."""
        t = self.buffers.get(name)
        if t is None:
            t = self.buffers[name] = torch.zeros(shape, dtype=dtype, device=self.device)
        assert tuple(t.shape) == tuple(shape) and t.dtype == dtype, f"buffer {name} redefined"
        return t

    def partials(self):
        """Split-K partials [Hq, n_splits(, D)]: max, sum of exp, unnormalised output."""
        s, n = self.spec, K.attention_splitk.n_splits_for(self.max_ctx, self.chunk)
        return (self.buf("part_m", (s.heads, n), torch.float32),
                self.buf("part_l", (s.heads, n), torch.float32),
                self.buf("part_o", (s.heads, n, s.head_dim), torch.float32))

    def cfg(self, op: str, weight: torch.Tensor | None = None) -> dict:
        """The launch configuration of ``op`` for ``weight``'s shape on this GPU (or the one
        this engine was given for ``op``)."""
        if op in self.cfgs:
            return dict(self.cfgs[op])
        return plan.default_cfg(op, self.device, weight)

    def __getattr__(self, name):          # engine.qkv, engine.part_o, ...: the named buffers
        buffers = self.__dict__.get("buffers")
        if buffers is not None and name in buffers:
            return buffers[name]
        raise AttributeError(name)

    # ------------------------------------------------------------------------------------
    def launches_per_step(self) -> int:
        return len(self.plan)

    def step_launches(self):
        """Launch one decode step: every entry of the plan, in order. Reads seq/pos on
        the GPU; no host synchronisation."""
        for launch in self.plan:
            launch.run()

    # ---- what runs: read from the plan's launches, not from the arguments -------------
    def trace(self) -> list[dict]:
        """The kernel calls one step makes, read from the plan without running a kernel.
        One dict a launch: ``op`` and ``layer`` (the plan entry's), ``kernel`` (the
        launcher it calls, by its name in ``K.LAUNCHERS``) and ``args`` (its arguments by
        name, defaults filled in). A launch that calls no launcher of ``onelaunch.kernels``
        (an all-reduce through torch.distributed, the one-launch step) has ``kernel``
        None and no ``args``."""
        import inspect
        calls = []
        for launch in self.plan:
            name = plan.launcher_name(launch.fn)
            args = {}
            if name is not None:
                bound = inspect.signature(launch.fn).bind(*launch.args, **launch.kwargs)
                bound.apply_defaults()
                args = dict(bound.arguments)
            calls.append({"op": launch.op, "layer": launch.layer, "kernel": name,
                          "args": args})
        return calls

    def ran_paths(self) -> dict:
        """What this engine's step runs, read from its kernel calls (``trace``), so that a
        setting which silently fell back shows: ``attention`` ("splitk" or "plain"),
        ``persistent``, ``megakernel`` (the whole step in one launch), ``pdl`` (True,
        False, or "mixed" when only some
        launches use it), ``tp`` (None on one GPU; else how the ranks' partial sums
        meet: "fused", "p2p", "symm", the all-reduce's backend, or "none") and
        ``launches`` (a step's)."""
        calls = self.trace()
        kernels = {c["kernel"] for c in calls}
        pdl = {bool(c["args"]["use_pdl"]) for c in calls if "use_pdl" in c["args"]}
        attention = None
        if kernels & {"attention_partial", "layer_persistent"}:
            attention = "splitk"
        elif "attention" in kernels:
            attention = "plain"
        tp = None
        if self.tp is not None:
            if any(c["op"] == "all_reduce" for c in calls):
                tp = ("symm" if any(n.endswith("_sum") for n in self.buffers)
                      else torch.distributed.get_backend()
                      if torch.distributed.is_initialized() else "all-reduce")
            elif "allreduce_residual" in kernels:
                tp = "p2p"
            elif any(c["args"].get("peer") is not None for c in calls):
                tp = "fused"
            else:
                tp = "none"
        mega = [launch.op for launch in self.plan] == ["megakernel"]
        if mega:
            attention = "splitk"                 # its partials and merges (step.py)
        return {"attention": attention, "persistent": "layer_persistent" in kernels,
                "megakernel": mega,
                "pdl": (pdl.pop() if len(pdl) == 1 else "mixed") if pdl else False,
                "tp": tp, "launches": len(self.plan)}

    def describe(self) -> str:
        """``paths`` in words, for a run's header ("split-K attention, PDL off, one
        GPU, a chain of 16 launches a step")."""
        p = self.paths
        words = [{"splitk": "split-K attention", "plain": "plain attention"}.get(
            p["attention"], "no attention")]
        if p["persistent"]:
            words.append("persistent layers")
        if p.get("megakernel"):
            words.append("one launch a step (megakernel)")
        words.append({True: "PDL on", False: "PDL off"}.get(p["pdl"], "PDL on some launches"))
        how = {"all-reduce": "all-reduce", "none": "no all-reduce"}.get(
            p["tp"], f"{p['tp']} all-reduce")
        words.append("one GPU" if p["tp"] is None else f"{self.tp.world} ranks ({how})")
        if not p.get("megakernel"):
            words.append(f"a chain of {p['launches']} launches a step")
        return ", ".join(words)

    def prefill_mode(self, n: int, batched: bool) -> str:
        """How ``generate`` fills the cache for an n-token prompt: "batched" (in chunks,
        through the oracle's math: ``prefill.py``) or "steps" (one decode step a prompt
        token; so is a one-token prompt, which leaves nothing to prefill)."""
        return "batched" if batched and n > 1 else "steps"

    def distinct_experts(self, start: int, stop: int) -> list[int] | None:
        """MoE: how many distinct experts each layer's router chose at positions
        [start, stop) (the steps that consumed those positions), from the device log."""
        log = self.buffers.get("expert_log")
        if log is None:
            return None
        rows = log[start:stop].cpu()                       # [steps, layers, top_k]
        return [int(rows[:, li].unique().numel()) for li in range(self.spec.layers)]

    def capture(self):
        """Record one step into a CUDA graph (after a warm-up that compiles every
        kernel). The warm-up runs real steps, so callers reset the state afterwards."""
        if self.device.type != "cuda":
            # CPU smoke runs (Triton's interpreter): there is no graph to record, so a
            # "graph" step runs the same launches eagerly. Only the GPU measures graphs.
            self.graph = "emulated"
            return self.graph
        saved = self.pos.clone()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                self.step_launches()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        if self.tp is not None:           # every rank has warmed up before any captures
            torch.distributed.barrier()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.step_launches()
        torch.cuda.synchronize()
        self.pos.copy_(saved)
        return self.graph

    def step(self, graph: bool = True):
        if graph:
            if self.graph is None:
                self.capture()
            if self.graph == "emulated":
                self.step_launches()
            else:
                self.graph.replay()
        else:
            self.step_launches()

    # ------------------------------------------------------------------------------------
    def check_prompt(self, prompt_ids, max_new_tokens: int):
        ids = torch.as_tensor(prompt_ids).flatten()
        if ids.numel() == 0:
            raise EngineError("the prompt is empty: give at least one token id")
        if max_new_tokens < 1:
            raise EngineError("max_new_tokens must be at least 1")
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= self.spec.vocab:
            raise EngineError(f"token id {lo if lo < 0 else hi} is out of range for "
                              f"{self.spec.name} (vocabulary 0..{self.spec.vocab - 1})")
        if ids.numel() + max_new_tokens > self.max_ctx:
            raise EngineError(f"prompt ({ids.numel()}) + new tokens ({max_new_tokens}) exceeds the "
                              f"engine's context ({self.max_ctx}); shorten the prompt or build the "
                              f"engine with a larger max_ctx")
        return ids

    def start(self, prompt_ids):
        """Load a prompt into the sequence buffer and rewind to position 0."""
        ids = torch.as_tensor(prompt_ids).flatten()
        self.seq.zero_()
        self.seq[: ids.numel()] = ids.to(device=self.device, dtype=torch.int32)
        self.pos.zero_()
        self.prompt_len.fill_(ids.numel())

    @torch.no_grad()
    def generate(self, prompt_ids, max_new_tokens: int, graph: bool = True,
                 on_tokens=None, read_every: int = 64, batched_prefill: bool = False):
        """Greedy decoding. The prompt fills the cache either by the same step run over
        it (each step writes one KV slot), or with ``batched_prefill`` in a few large
        chunks (``prefill.prefill``: the oracle's batched math writing into this cache),
        after which the step consumes the last prompt token. Every step after the prompt
        appends its argmax on the GPU and the next step reads it there. The host never
        waits per token: with ``on_tokens`` (a callback taking a list of ids) it reads
        the first new token as soon as it exists (time to first token), then every
        ``read_every`` new tokens, a batched read for streaming output; otherwise once,
        at the end."""
        ids = self.check_prompt(prompt_ids, max_new_tokens)
        n = ids.numel()
        if batched_prefill and self.tp is not None:
            raise EngineError("batched prefill runs on one GPU: under --tp the prompt "
                              "fills the cache step by step (leave out --prefill)")
        if graph and self.graph is None:
            self.capture()
        first, ran = 0, "steps"
        if self.prefill_mode(n, batched_prefill) == "batched":
            from .prefill import prefill
            prefill(self, ids)
            first, ran = n - 1, "batched"
        else:
            self.start(ids)
        # what ran: the prefill taken and the positions the steps consumed
        self.last_run = {"prefill": ran, "first_pos": first, "last_pos": first - 1}
        done = 0                                # tokens handed to on_tokens so far
        for i in range(first, n - 1 + max_new_tokens):
            self.step(graph)
            self.last_run["last_pos"] = i
            ready = i + 2 - n                   # tokens generated after this step
            if (on_tokens is not None and ready > 0
                    and (done == 0 or ready - done >= read_every)):
                on_tokens(self.seq[n + done: n + ready].tolist())
                done = ready
        self.check_stalls()
        out = self.seq[n: n + max_new_tokens].tolist()
        if on_tokens is not None and done < max_new_tokens:
            on_tokens(out[done:])
        return torch.tensor(out, dtype=torch.long)

    @torch.no_grad()
    def teacher_forced(self, prompt_ids, forced_ids, graph: bool = True):
        """Run the step over prompt + forced tokens (all treated as prompt) and return the
        argmax chosen at each forced position: the engine's greedy choice given the same
        prefix as the reference, so a near tie early on cannot hide later steps."""
        ids = torch.cat([torch.as_tensor(prompt_ids).flatten(), torch.as_tensor(forced_ids).flatten()])
        n, m = torch.as_tensor(prompt_ids).numel(), torch.as_tensor(forced_ids).numel()
        self.check_prompt(ids, 1)
        if graph and self.graph is None:
            self.capture()
        self.start(ids)
        self.argmax.zero_()
        self.last_run = {"prefill": "steps", "first_pos": 0, "last_pos": n + m - 2}
        for _ in range(n + m - 1):
            self.step(graph)
        self.check_stalls()
        return self.argmax[n: n + m].cpu().long()

    def check_stalls(self):
        """The one-launch step's bounded waits: raise, naming the SM and counter, if one
        ran out (its kernel then ran on without waiting: its tokens are not to be used)."""
        if self.mega is not None:
            self.mega.check_stalls()

    def adopt_cache(self, k_cache: torch.Tensor, v_cache: torch.Tensor, upto: int, tokens):
        """Start decoding at position ``upto`` from a cache filled elsewhere (the oracle's
        batched prefill: same layout). ``tokens`` are the ids at positions 0..upto."""
        C = min(self.max_ctx, k_cache.shape[2])
        self.k_cache[:, :, :C].copy_(k_cache[:, :, :C])
        self.v_cache[:, :, :C].copy_(v_cache[:, :, :C])
        t = torch.as_tensor(tokens).flatten()
        self.seq.zero_()
        self.seq[: t.numel()] = t.to(self.device, torch.int32)
        self.pos.fill_(upto)
        self.prompt_len.fill_(t.numel())
