"""`python -m taskforge_client.worker module:function --queue q ...`: run a worker.

The command line (`main`, `load_handler`); the `Worker` itself lives in
`taskforge_client.runtime`, so that `-m` runs this module fresh rather than one the
package already imported, and re-exported here.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from typing import Any

from taskforge_client.http import key_in_argv_warning
from taskforge_client.runtime import Handler, Permanent, RetryAfter, Worker, log

__all__ = ["Permanent", "RetryAfter", "Worker", "load_handler", "main"]


def load_handler(spec: str) -> Handler:
    """`module:function` (or `module.function`) to the function."""
    module_name, sep, attr = spec.partition(":")
    if not sep:
        module_name, _, attr = spec.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"handler must be module:function, not {spec!r}")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    target: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise TypeError(f"{spec} is not callable")
    handler: Handler = target
    return handler


def main(argv: list[str] | None = None) -> int:
    """`python -m taskforge_client.worker module:function --queue q ...`."""
    parser = argparse.ArgumentParser(
        prog="python -m taskforge_client.worker", description="Run a TaskForge worker."
    )
    parser.add_argument("handler", help="module:function called with each Task")
    parser.add_argument(
        "--queue",
        "-q",
        action="append",
        required=True,
        dest="queues",
        help="queue to claim from (repeat for several, in priority order)",
    )
    parser.add_argument("--concurrency", "-c", type=int, default=1)
    parser.add_argument("--url", default=os.environ.get("TASKFORGE_URL"))
    parser.add_argument("--api-key", default=os.environ.get("TASKFORGE_API_KEY"))
    parser.add_argument("--worker-id", default=None)
    parser.add_argument("--grace-seconds", type=float, default=30.0)
    parser.add_argument("--heartbeat-interval", type=float, default=10.0)
    parser.add_argument("--wait-seconds", type=float, default=30.0)
    parser.add_argument("--log-level", default=os.environ.get("LOG_LEVEL", "INFO"))
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s [%(threadName)s] %(message)s",
    )
    warning = key_in_argv_warning(argv)
    if warning:
        log.warning(warning)
    if not args.url or not args.api_key:
        parser.error("--url and --api-key (or TASKFORGE_URL and TASKFORGE_API_KEY) are required")
    handler = load_handler(args.handler)
    worker = Worker(
        args.url,
        args.api_key,
        queues=args.queues,
        handler=handler,
        concurrency=args.concurrency,
        worker_id=args.worker_id,
        grace_seconds=args.grace_seconds,
        heartbeat_interval=args.heartbeat_interval,
        wait_seconds=args.wait_seconds,
    )
    worker.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
