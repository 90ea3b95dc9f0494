"""The suite spread over processes (pytest-xdist, `make test` runs ``-n``): each process gets
a Redis db of its own.

pytest-django already gives each process its own test database (``test_<name>_gw<N>``); the
Redis db is ours to split.  Loaded with ``-p tests.workers`` (pyproject's addopts), so it runs
before pytest-django imports the settings: process ``gw<N>`` reads REDIS_URL's db plus N.
Nothing changes outside a worker process.
"""

from __future__ import annotations

import os
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

REDIS_DBS = 16


def worker_redis_url(url: str, worker: int) -> str:
    """``url`` moved ``worker`` dbs along: ``redis://h:p/9`` is ``/10`` for gw1, and a
    socket's ``?db=0`` is ``?db=1``."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    if any(name == "db" for name, _ in query) or parts.scheme == "unix":
        base = int(dict(query).get("db") or 0)
        query = [(n, v) for n, v in query if n != "db"] + [("db", str(_moved(base, worker)))]
        # Not urlunsplit: it drops a socket URL's empty host (unix:///path).
        return url.partition("?")[0] + "?" + urlencode(query)
    base = int(parts.path.strip("/") or 0)
    return urlunsplit(parts._replace(path=f"/{_moved(base, worker)}"))


def _moved(base: int, worker: int) -> int:
    db = base + worker
    if db >= REDIS_DBS:
        raise RuntimeError(f"Redis db {base} + worker {worker} is past db {REDIS_DBS - 1}")
    return db


def _worker_number() -> int | None:
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(name[2:]) if name.startswith("gw") else None


_worker = _worker_number()
if _worker is not None and os.environ.get("REDIS_URL"):
    os.environ["REDIS_URL"] = worker_redis_url(os.environ["REDIS_URL"], _worker)
