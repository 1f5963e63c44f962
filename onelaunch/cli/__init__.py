"""The command line: ``python -m onelaunch <command>``.

One subparser and one ``cmd_<name>(args) -> int`` per command. A user's mistake (an
unknown model, a prompt that does not fit, no GPU for ``--device cuda``, a bad checkpoint)
is one line on stderr that starts with ``error:`` and says what to do, and exit status 2;
a check that runs but disagrees exits 1.

The only place argv and the environment (``env.py``) are read. One module per command
(``check``, ``info``, ``generate``, ``bench``: ``--what`` names its measurements, and
``python -m onelaunch.bench`` is the same command), each with its ``cmd_<name>`` and its
subparser; ``args.py`` holds the parser and the argument types they share; ``profile.py``
is ``python -m onelaunch.profile``.
"""
from __future__ import annotations

import argparse
import sys

from ..prompt import UsageError
from ..specs import UnknownModel
from ..checkpoint import CheckpointError
from .args import _Parser
from .bench import _add_bench, print_ladder  # noqa: F401  (print_ladder: the table)
from .check import _add_check
from .generate import _add_generate
from .info import _add_info


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="onelaunch", description="A batch-1 decode engine in Triton, "
                     "measured against the memory-bandwidth floor.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    _add_check(sub)
    _add_info(sub)
    _add_generate(sub)
    _add_bench(sub)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help(sys.stderr)
            return 2
        return args.func(args)
    except (UsageError, UnknownModel, CheckpointError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
