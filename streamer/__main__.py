"""`python -m streamer ...`: the `streamer` command (`streamer.cli`)."""

import sys

from streamer.cli import main

if __name__ == "__main__":  # not in a child process that re-imports the parent's main module
    sys.exit(main())
