"""`python -m ashd` is the `ashd` command (ashd.cli)."""

from __future__ import annotations

import sys

from ashd.cli import main

if __name__ == "__main__":
    sys.exit(main())
