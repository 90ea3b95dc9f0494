"""`python -m taskforge_client.worker module:function --queue q ...`: run a worker.

The implementation lives in `taskforge_client.runtime` (so that `-m` runs this module
fresh rather than one the package already imported); this module re-exports it.
"""

from __future__ import annotations

import sys

from taskforge_client.runtime import Permanent, RetryAfter, Worker, load_handler, main

__all__ = ["Permanent", "RetryAfter", "Worker", "load_handler", "main"]

if __name__ == "__main__":
    sys.exit(main())
