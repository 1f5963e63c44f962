"""onelaunch: a batch-1 LLM decode engine in Triton, built step by step against its floor."""
from .specs import SPECS, ModelSpec, get_spec  # noqa: F401

__version__ = "0.1.0"
