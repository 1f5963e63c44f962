"""onelaunch: a batch-1 LLM decode engine in Triton, built step by step against its floor."""
from . import env as _env
from .specs import SPECS, ModelSpec, get_spec  # noqa: F401

__version__ = "0.1.0"

if _env.interpreting():        # Triton's CPU interpreter without its repeated set-up
    from .interpreter import speed_up as _speed_up
    _speed_up()
