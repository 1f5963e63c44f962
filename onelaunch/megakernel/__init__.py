"""The decode step as one persistent launch: the plan serialised into per-SM instruction
lists (``schedule``; what each SM's loader streams, the bytes and the checks in
``loads``), a CPU model that runs those lists in any order the counters allow (``vm``,
with each opcode's torch math in ``vm_ops``), and the Gluon kernel that runs them on the
GPU (``gluon_mlp``, its host side ``mlp_stream``: the 28 MLPs so far). ``isa`` is the
one place the instruction format is written down."""
