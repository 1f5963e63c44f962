"""Measurement: timing and floors, agreement, the rung registry, the ladder, kernel rows,
sweeps, tuning, the step profile, and the tensor-parallel benchmark. Every time here is
taken only after its result passed the oracle check."""
