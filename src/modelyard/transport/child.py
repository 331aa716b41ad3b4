"""Entry of a child started by `transport.spawn.start_process`: `python -m
modelyard.transport.child NAME` reads `sys.path`, then `(target, args)`, pickled on stdin, runs
`target(*args)` and exits with its status (`sys.exit` inside the target included)."""

from __future__ import annotations

import os
import pickle
import sys


def main() -> None:
    sys.path[:] = pickle.load(sys.stdin.buffer)  # first: the target may live on it
    target, args = pickle.load(sys.stdin.buffer)
    sys.stdin.close()
    sys.stdin = open(os.devnull)  # noqa: SIM115 (the process's stdin until it exits)
    target(*args)


if __name__ == "__main__":
    main()
