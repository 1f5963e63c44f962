"""The megakernels' device code (Gluon, for Hopper: TMA, mbarriers, warp specialisation).

    dense.py       the dense model's whole step in one launch (``step_kernel``)
    moe.py         the mixture of experts' step (``moe_step_kernel``), its loader in
                   ``moe_loader.py``, its q/k-normed RoPE and top-k in ``moe_ops.py``
    attention.py   RoPE, the attention partials and their merges, one kv head a call
    args.py        the kernels' arguments in groups (NamedTuples the host fills)
    ops.py         header fields, the RMS-normed vector, a row box's dot, embed, argmax
    ring.py        the ring of weight tiles: TMA fills, the down boxes' views, dots
    sync.py        the clock, bounded counter waits, stage barriers, the counters' reset

Gluon kernels do not run in Triton's interpreter; ``aot.py`` compiles them for sm_90 on
any machine, and the CPU VM (``vm.py``) runs the same instruction lists with torch.
"""
