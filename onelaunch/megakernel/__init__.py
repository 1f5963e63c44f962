"""The decode step as one persistent launch: the plan serialised into per-SM instruction
lists (``schedule``; what each SM's loader streams, the bytes and the checks in
``loads``), a CPU model that runs those lists in any order the counters allow (``vm``,
with each opcode's torch math in ``vm_ops``), and the Gluon kernels that run them on the
GPU: the whole dense step (``gluon_step``, its host side ``step``: ``Engine(megakernel=
True)``) and the 28-MLP stream it grew from (``gluon_mlp``, ``mlp_stream``; its device
helpers are shared). ``isa`` is the one place the instruction format is written down."""
