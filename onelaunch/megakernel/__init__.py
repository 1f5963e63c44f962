"""The decode step as one persistent launch: the plan serialised into per-SM instruction
lists (``isa``: the format and a constructor per opcode; ``schedule`` builds the lists,
``lists`` holds them; what each SM's loader streams, the bytes and the checks in
``loads``), a CPU model that runs those lists in any order the counters allow (``vm``,
with each opcode's torch math in ``vm_ops``), and the Gluon kernels that run them on the
GPU (``gluon/``: the dense step and the mixture of experts' step), their host side
(``step``: ``Engine(megakernel=True)``; the TMA boxes in ``boxes``; the dense loaders'
L2 prefetch of the next gate/up, off by default, in ``l2stage``) and their compile for
sm_90 without a GPU (``aot``)."""
