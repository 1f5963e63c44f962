"""The decode step as one persistent launch: the plan serialised into per-SM instruction
lists (``schedule``), a CPU model that runs those lists in any order the counters allow
(``vm``), and the Gluon kernel that runs them on the GPU (``gluon_mlp`` for the MLP probe).
``isa`` is the one place the instruction format is written down."""
