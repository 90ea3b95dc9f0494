"""``python -m devservices``: see the package docstring."""

from __future__ import annotations

import sys

from devservices.cli import main

if __name__ == "__main__":
    sys.exit(main())
