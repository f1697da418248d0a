"""``python -m dtwork ...``: the same command line as the ``dtwork`` script (:mod:`dtwork.cli`)."""

from __future__ import annotations

import sys

from dtwork.cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m dtwork"))
