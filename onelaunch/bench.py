"""``python -m onelaunch.bench ARGS`` is ``python -m onelaunch bench ARGS``: the same parser
and command (:mod:`onelaunch.cli.bench`)."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
