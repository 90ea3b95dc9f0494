"""What `run` gives the app: local settings (SECRET_KEY, ALLOWED_HOSTS) and the --setup steps
(migrations; for `make run`, an admin API key and a staff login for the dashboard)."""

from __future__ import annotations

import contextlib
import logging
import secrets
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from devservices.common import DevServicesError, display, write_private
from devservices.datadir import Layout
from devservices.processes import run_child
from taskforge.api.server import ServerSettings

logger = logging.getLogger(__name__)

DEFAULT_ALLOWED_HOSTS = "localhost,127.0.0.1,[::1]"
# Push requests may go to loopback in local runs, for a demo target on this machine
# (TaskForge's own default blocks it; production settings never allow it).
LOCAL_PUSH_ALLOWED_NETWORKS = "127.0.0.0/8,::1/128"
ADMIN_KEY_NAME = "local-admin"
# The dashboard's sign-in that `make run` makes on its first start (a superuser).
STAFF_USER = "admin"


def _secret_key(layout: Layout | None) -> str:
    """The SECRET_KEY for local runs: random for throwaway runs, else kept in the data dir."""
    if layout is None:
        return secrets.token_urlsafe(50)
    with contextlib.suppress(FileNotFoundError):
        key = layout.secret_key.read_text().strip()
        if key:
            return key
    key = secrets.token_urlsafe(50)
    write_private(layout.secret_key, key + "\n")
    return key


def app_defaults(env: dict[str, str], layout: Layout | None) -> dict[str, str]:
    """Fill in SECRET_KEY, ALLOWED_HOSTS and, for a kept data directory (`make run`; `layout`
    is None for a throwaway run such as `make test`, whose tests must see TaskForge's own
    default), TASKFORGE_PUSH_ALLOWED_NETWORKS when unset; return what was added."""
    added: dict[str, str] = {}
    if not env.get("SECRET_KEY"):
        added["SECRET_KEY"] = _secret_key(layout)
    if "ALLOWED_HOSTS" not in env:
        added["ALLOWED_HOSTS"] = DEFAULT_ALLOWED_HOSTS
    if layout is not None and "TASKFORGE_PUSH_ALLOWED_NETWORKS" not in env:
        added["TASKFORGE_PUSH_ALLOWED_NETWORKS"] = LOCAL_PUSH_ALLOWED_NETWORKS
    env.update(added)
    return added


def _banner(lines: Sequence[str]) -> None:
    width = max(len(line) for line in lines) + 4
    rule = "=" * width
    body = "\n".join(f"  {line}".rstrip() for line in lines)
    sys.stderr.write(f"\n{rule}\n{body}\n{rule}\n\n")
    sys.stderr.flush()


def run_setup(env: Mapping[str, str], layout: Layout | None, *, fresh_database: bool) -> int:
    """Migrate, then (only with the embedded Postgres of a kept data directory: `make run`)
    make sure an admin API key and a staff login for the dashboard exist, and print where
    the API and the dashboard are, with both."""
    manage = Path.cwd() / "manage.py"
    if not manage.exists():
        raise DevServicesError("--setup needs manage.py in the current directory")
    logger.info("applying migrations")
    code, _ = run_child([sys.executable, str(manage), "migrate", "--noinput"], env)
    if code != 0:
        logger.error("manage.py migrate failed with exit code %s", code)
        return code
    if layout is None:
        logger.info(
            "DATABASE_URL is your own database: create an admin key with "
            "`python manage.py createapikey NAME --role admin`"
        )
        return 0
    if fresh_database:
        # They belonged to a database that no longer exists.
        layout.admin_key.unlink(missing_ok=True)
        layout.dashboard_password.unlink(missing_ok=True)
    url = ServerSettings.from_environ(env).local_url
    _banner(
        [
            f"TaskForge API: {url}",
            "",
            *_admin_key(env, manage, layout.admin_key),
            "",
            f"Dashboard: {url}/admin/dashboard/",
            *_staff_login(env, manage, layout.dashboard_password),
        ]
    )
    return 0


def _admin_key(env: Mapping[str, str], manage: Path, key_file: Path) -> list[str]:
    """The banner's lines on the admin API key, made and saved the first time."""
    if key_file.exists():
        return [f"Admin API key: saved in {display(key_file)}", f"  cat {display(key_file)}"]
    code, out = run_child(
        [sys.executable, str(manage), "createapikey", ADMIN_KEY_NAME, "--role", "admin"],
        env,
        capture=True,
    )
    key = out.strip()
    if code != 0 or not key or "\n" in key:
        logger.warning("could not create an admin API key (createapikey exited with %s)", code)
        return ["No admin API key: python manage.py createapikey NAME --role admin"]
    write_private(key_file, key + "\n")
    return [
        f"Admin API key (saved in {display(key_file)}):",
        "",
        f"    {key}",
        "",
        "Use it as:  Authorization: Bearer <key>",
    ]


def _staff_login(env: Mapping[str, str], manage: Path, password_file: Path) -> list[str]:
    """The banner's lines on the dashboard's local sign-in: a superuser made the first time,
    with a random password saved beside the admin key.  `run_setup` asks for it only with
    the embedded Postgres of a kept data directory: never for a throwaway run (`make
    test`), never with a database of your own (production)."""
    if password_file.exists():
        return [
            f"Sign in as {STAFF_USER}; password saved in {display(password_file)}",
            f"  cat {display(password_file)}",
        ]
    password = secrets.token_urlsafe(18)
    create = ["createsuperuser", "--noinput", "--username", STAFF_USER, "--email", ""]
    code, _ = run_child(
        [sys.executable, str(manage), *create],
        {**env, "DJANGO_SUPERUSER_PASSWORD": password},
        capture=True,
    )
    if code != 0:
        logger.warning(
            "could not create the dashboard user %s (createsuperuser exited with %s; "
            "does it exist already?)",
            STAFF_USER,
            code,
        )
        return ["Sign in with your staff account (python manage.py createsuperuser)"]
    write_private(password_file, password + "\n")
    return [
        f"Sign in as {STAFF_USER} with this password (saved in {display(password_file)}):",
        "",
        f"    {password}",
    ]
