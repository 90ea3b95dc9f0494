"""The container deployment is consistent with the code (no Docker engine needed).

- docker-compose.yml: the PRD's services, each one's command exists in the
  project, `depends_on` conditions, healthchecks, and environment names that
  are settings TaskForge actually reads.
- Dockerfile: slim base, non-root user, build steps in deploy/build.sh.
- deploy/build.sh: run for real into a temp dir and a fresh virtualenv; it must
  leave an installed app with its static files collected, and exactly the locked
  runtime dependencies (requirements/service.txt, hashes checked) installed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.core.management import get_commands
from packaging.markers import Marker
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
BUILD_SCRIPT = ROOT / "deploy" / "build.sh"

APP_SERVICES = {"api", "dispatcher", "scheduler", "watchdog", "pusher"}
ALL_SERVICES = APP_SERVICES | {"postgres", "redis", "migrate"}
LOOP_COMMANDS = {
    "dispatcher": "run_dispatcher",
    "scheduler": "run_scheduler",
    "watchdog": "run_watchdog",
    "pusher": "run_pusher",
}


def setting_names() -> set[str]:
    """Every environment variable TaskForge reads, found in its source."""
    settings_src = (ROOT / "taskforge" / "settings.py").read_text()
    names = set(re.findall(r"\benv(?:\.\w+)?\(\s*\"([A-Z_][A-Z0-9_]*)\"", settings_src))
    env_block = re.search(r"environ\.FileAwareEnv\((.*?)\n\)", settings_src, re.S)
    assert env_block is not None
    names |= set(re.findall(r"^\s*([A-Z_][A-Z0-9_]*)=", env_block.group(1), re.M))
    for path in (ROOT / "taskforge" / "api" / "server.py", ROOT / "taskforge" / "metrics.py"):
        names |= set(
            re.findall(r"\benviron(?:\.get\(|\[)\s*\"([A-Z_][A-Z0-9_]*)\"", path.read_text())
        )
    # FileAwareEnv reads NAME_FILE for any NAME (used for secrets).
    names |= {f"{name}_FILE" for name in list(names)}
    return names


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return document


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    services: dict[str, Any] = compose["services"]
    return services


def test_setting_names_found() -> None:
    names = setting_names()
    for expected in (
        "DATABASE_URL",
        "REDIS_URL",
        "SECRET_KEY",
        "DEBUG",
        "ALLOWED_HOSTS",
        "DATABASE_POOL_MAX",
        "STATIC_ROOT",
        "LOG_LEVEL",
        "PROMETHEUS_MULTIPROC_DIR",
        "TASKFORGE_BIND",
        "TASKFORGE_WEB_WORKERS",
        "TASKFORGE_HEARTBEAT_TIMEOUT_SECONDS",
    ):
        assert expected in names


def test_compose_has_the_prd_services(services: dict[str, Any]) -> None:
    assert set(services) == ALL_SERVICES
    assert services["postgres"]["image"] == "postgres:15"
    assert services["redis"]["image"] == "redis:7-alpine"
    images = {services[name].get("image") for name in APP_SERVICES | {"migrate"}}
    assert len(images) == 1, "the API, the loops and migrate share one image"
    for name in APP_SERVICES | {"migrate"}:
        assert services[name]["build"] == "."


def command_of(service: dict[str, Any]) -> list[str]:
    command = service["command"]
    assert isinstance(command, list), "exec form, so signals reach the process"
    return command


def test_every_command_exists(services: dict[str, Any]) -> None:
    commands = get_commands()
    assert command_of(services["api"]) == ["python", "manage.py", "run_api"]
    assert commands["run_api"] == "taskforge.api"

    for name, management_command in LOOP_COMMANDS.items():
        assert command_of(services[name]) == ["python", "manage.py", management_command]
    migrate = command_of(services["migrate"])
    assert migrate[:3] == ["python", "manage.py", "migrate"]
    for name in APP_SERVICES | {"migrate"}:
        command = command_of(services[name])
        if command[:2] == ["python", "manage.py"]:
            assert command[2] in commands, f"{name}: no management command {command[2]!r}"
            assert (ROOT / "manage.py").is_file()


def test_compose_api_matches_procfile_and_dockerfile(services: dict[str, Any]) -> None:
    procfile = (ROOT / "Procfile").read_text()
    assert " ".join(command_of(services["api"])) in procfile
    for name, management_command in LOOP_COMMANDS.items():
        assert f"{name}: exec python manage.py {management_command}" in procfile
    cmd = re.search(r"^CMD (\[.*\])$", DOCKERFILE.read_text(), re.M)
    assert cmd is not None
    assert yaml.safe_load(cmd.group(1)) == command_of(services["api"])


def test_depends_on_conditions(services: dict[str, Any]) -> None:
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert services["migrate"].get("restart") in ("no", None)
    for name in APP_SERVICES:
        deps = services[name]["depends_on"]
        assert deps["postgres"]["condition"] == "service_healthy", name
        assert deps["redis"]["condition"] == "service_healthy", name
        assert deps["migrate"]["condition"] == "service_completed_successfully", name


def test_healthchecks(services: dict[str, Any]) -> None:
    pg = services["postgres"]["healthcheck"]["test"]
    assert "pg_isready" in pg
    assert services["redis"]["healthcheck"]["test"][-2:] == ["redis-cli", "ping"]
    api = services["api"]["healthcheck"]["test"]
    assert api[:2] == ["CMD", "python"], "slim images have no curl"
    probe = api[-1]
    assert "urllib.request" in probe
    assert "127.0.0.1:8080/readyz" in probe
    assert services["api"]["ports"] == ["8080:8080"]
    assert services["api"]["environment"]["TASKFORGE_BIND"].endswith(":8080")


def test_environment_names_are_settings(services: dict[str, Any]) -> None:
    known = setting_names()
    for name in APP_SERVICES | {"migrate"}:
        env = services[name]["environment"]
        unknown = set(env) - known
        assert not unknown, f"{name}: settings TaskForge does not read: {unknown}"
        for required in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "ALLOWED_HOSTS"):
            assert required in env, f"{name} lacks {required}"
        assert env["DATABASE_URL"].startswith("postgres://")
        assert "@postgres:5432/" in env["DATABASE_URL"]
        assert env["REDIS_URL"].startswith("redis://redis:6379/")
        assert "SECRET_KEY" in env["SECRET_KEY"], "from the environment, never a literal"
        # One multiprocess metrics directory, on a volume shared by every process.
        mp_dir = env["PROMETHEUS_MULTIPROC_DIR"]
        assert f"prometheus:{mp_dir}" in services[name]["volumes"]


def test_documented_settings_cover_the_code() -> None:
    """README's and operations.md's configuration tables name every setting."""
    readme = (ROOT / "README.md").read_text()
    operations = (ROOT / "docs" / "operations.md").read_text()
    for name in setting_names():
        if name.endswith("_FILE") and name != "SECRET_KEY_FILE":
            continue
        assert f"`{name}`" in operations, f"docs/operations.md does not document {name}"
        if name not in {"SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE", "SECRET_KEY_FILE"}:
            assert name in readme, f"README.md does not document {name}"


def test_dockerfile() -> None:
    text = DOCKERFILE.read_text()
    base = re.search(r"^FROM (\S+)", text, re.M)
    assert base is not None
    assert re.fullmatch(r"python:3\.(1[1-9])-slim(-\w+)?", base.group(1))
    users = re.findall(r"^USER (\S+)", text, re.M)
    assert users, "the image must not run as root"
    assert users[-1].split(":")[0] not in ("root", "0")
    assert re.search(r"^RUN sh deploy/build\.sh /app /opt/venv$", text, re.M)
    assert "STATIC_ROOT=/app/staticfiles" in text
    assert "PROMETHEUS_MULTIPROC_DIR=" in text
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv", ".taskforge", ".git"} <= set(ignored)
    # The image installs from the lock (COPY . /app brings requirements/ and uv.lock).
    assert not {"requirements", "requirements/", "uv.lock"} & set(ignored)
    script = BUILD_SCRIPT.read_text()
    assert re.search(
        r'^pip_install --require-hashes --no-deps -r "\$APP_DIR/requirements/service\.txt"$',
        script,
        re.M,
    )
    assert re.search(r'^pip_install --no-deps --no-build-isolation -e "\$APP_DIR"$', script, re.M)


def source_files() -> list[str]:
    """The files a `docker build` context would hold (tracked or not ignored)."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return [name for name in out.split("\0") if name and (ROOT / name).is_file()]


def service_pins() -> dict[str, str]:
    """requirements/service.txt's pins that apply here (name -> version)."""
    text = (ROOT / "requirements" / "service.txt").read_text()
    pins: dict[str, str] = {}
    for match in re.finditer(r"^([A-Za-z0-9._-]+)==(\S+)(?: ; ([^\\\n]+))?", text, re.M):
        name, version, marker = match.groups()
        if marker is None or Marker(marker.strip()).evaluate():
            pins[canonicalize_name(name)] = version
    return pins


def installed_versions(python: Path, env: dict[str, str]) -> dict[str, str]:
    """The distributions in a virtualenv (name -> version), but pip and TaskForge."""
    probe = (
        "import importlib.metadata as m, json;"
        "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))"
    )
    out = subprocess.run(
        [str(python), "-c", probe], env=env, capture_output=True, text=True, check=True
    ).stdout
    found = {canonicalize_name(name): version for name, version in json.loads(out).items()}
    return {name: version for name, version in found.items() if name not in ("pip", "taskforge")}


@pytest.mark.timeout(420)
def test_build_script_produces_an_installed_app(tmp_path: Path) -> None:
    """deploy/build.sh, as the Dockerfile runs it, into a temp app dir and venv.

    Installs from the package index pip is configured with: about 15 s on an idle
    machine, 60-90 s on a loaded one (its bound is generous: a slow index is no failure
    of the build).
    """
    app = tmp_path / "app"
    for name in source_files():
        if name.startswith(("docs/screenshots/", ".")):
            continue
        (app / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, app / name)
    venv = tmp_path / "venv"
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("VIRTUAL_ENV", "DJANGO_SETTINGS_MODULE", "PYTHONPATH")
        and not key.startswith("TASKFORGE_")
    }
    env["PYTHON"] = sys.executable
    env["STATIC_ROOT"] = str(app / "staticfiles")
    result = subprocess.run(
        ["sh", str(app / "deploy" / "build.sh"), str(app), str(venv)],
        env=env,
        capture_output=True,
        text=True,
        timeout=360,
    )
    assert result.returncode == 0, result.stdout + result.stderr

    static = app / "staticfiles"
    for expected in (
        "admin/css/base.css",
        "dashboard",
        "rest_framework",
        "drf_spectacular_sidecar",
    ):
        assert (static / expected).exists(), expected
    assert list(static.rglob("*.css.gz")), "whitenoise's compressed copies"
    # Every file of the dashboard's static/ was collected.
    for path in (ROOT / "dashboard" / "static").rglob("*"):
        if path.is_file() and not path.name.startswith("."):
            assert (static / path.relative_to(ROOT / "dashboard" / "static")).is_file(), path

    python = venv / "bin" / "python"
    probe = (
        "import importlib.util as u, taskforge, django, gunicorn, psycopg, redis;"
        "print(taskforge.__file__);"
        "print(u.find_spec('pytest') is None and u.find_spec('ruff') is None)"
    )
    out = subprocess.run(
        [str(python), "-c", probe],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out[0] == str(app / "taskforge" / "__init__.py"), "the app runs from APP_DIR"
    assert out[1] == "True", "no test or dev extras in the image"
    assert installed_versions(python, env) == service_pins(), "the locked set, no other"

    # The installed app answers as the containers call it.
    run_env = {
        **env,
        "SECRET_KEY": "x",
        "DATABASE_URL": "postgres://unused@127.0.0.1:1/unused",
        "PATH": f"{venv / 'bin'}:{env['PATH']}",
    }
    for command in [*LOOP_COMMANDS.values(), "run_api"]:
        done = subprocess.run(
            [str(python), "manage.py", "help", command],
            cwd=app,
            env=run_env,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr
    check = subprocess.run(
        [
            str(venv / "bin" / "gunicorn"),
            "--check-config",
            "taskforge.wsgi",
            "-c",
            "gunicorn.conf.py",
        ],
        cwd=app,
        env=run_env,
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_gunicorn_config__workers_freeze_startup_objects() -> None:
    """gunicorn picks up the post_worker_init hook, which freezes what startup built."""
    code = (
        "import gc\n"
        "import django\n"
        "django.setup()\n"
        "from gunicorn.app.wsgiapp import WSGIApplication\n"
        "app = WSGIApplication.__new__(WSGIApplication)\n"
        "from gunicorn.config import Config\n"
        "app.cfg = Config()\n"
        "app.load_config_from_file('gunicorn.conf.py')\n"
        "app.cfg.post_worker_init(None)\n"
        "print(gc.get_freeze_count() > 0, gc.get_threshold())\n"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "taskforge.settings"}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[0] == "True (10000, 10, 10)"


def test_gunicorn_config__reads_the_server_settings_of_run_api() -> None:
    """One reader, one default: gunicorn's bind, processes and threads are run_api's."""
    code = (
        "from gunicorn.app.wsgiapp import WSGIApplication\n"
        "from gunicorn.config import Config\n"
        "from taskforge.api.server import ServerSettings\n"
        "app = WSGIApplication.__new__(WSGIApplication)\n"
        "app.cfg = Config()\n"
        "app.load_config_from_file('gunicorn.conf.py')\n"
        "s = ServerSettings.from_environ()\n"
        "c = app.cfg\n"
        "print(c.bind == [s.bind], c.workers == s.workers, c.threads, s.threads)\n"
    )
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("TASKFORGE_BIND", "TASKFORGE_WEB_"))
    }
    env["DJANGO_SETTINGS_MODULE"] = "taskforge.settings"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[0] == "True True 1024 1024"


def gunicorn_and_django_trust(trust: str) -> str:
    """gunicorn's forwarded_allow_ips and Django's SECURE_PROXY_SSL_HEADER for a value of
    TASKFORGE_TRUST_PROXY, from the project's gunicorn.conf.py and settings."""
    code = (
        "from gunicorn.app.wsgiapp import WSGIApplication\n"
        "from gunicorn.config import Config\n"
        "from django.conf import settings\n"
        "app = WSGIApplication.__new__(WSGIApplication)\n"
        "app.cfg = Config()\n"
        "app.load_config_from_file('gunicorn.conf.py')\n"
        "trusted = getattr(settings, 'SECURE_PROXY_SSL_HEADER', None) is not None\n"
        "print(app.cfg.forwarded_allow_ips, trusted)\n"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "taskforge.settings"}
    env["TASKFORGE_TRUST_PROXY"] = trust
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split("\n")[0]


def test_gunicorn_config__trusts_a_proxy_by_the_rule_django_does() -> None:
    """One reader of TASKFORGE_TRUST_PROXY: gunicorn and Django agree on every value."""
    assert gunicorn_and_django_trust("on") == "['*'] True"
    assert gunicorn_and_django_trust("true") == "['*'] True"
    assert gunicorn_and_django_trust("false") == "[] False"
