#!/bin/sh
# Build steps of the TaskForge container image, as one script so they can be
# tested without a Docker engine (tests/test_deploy.py runs it in a temp dir).
#
#   deploy/build.sh [APP_DIR] [VENV_DIR]
#
# APP_DIR  the source tree (manage.py, pyproject.toml, static/, templates/);
#          default /app. The app runs from here: settings.BASE_DIR is this dir.
# VENV_DIR the virtualenv to create and install into; default /opt/venv.
#
# Steps: create the venv, install TaskForge's runtime dependencies (no dev or
# test extras) as the lock pins them, with their hashes
# (APP_DIR/requirements/service.txt, exported from uv.lock by `make lock`), then
# TaskForge itself from APP_DIR, then collect static files into
# $STATIC_ROOT (default APP_DIR/staticfiles). SECRET_KEY and DATABASE_URL get
# throwaway values for collectstatic only: it connects to nothing, and the
# real values come from the container's environment at run time.
# Extra pip options (e.g. --no-index --find-links DIR) come from PIP_* env vars.
set -eu

APP_DIR=$(cd "${1:-/app}" && pwd)
VENV_DIR=${2:-/opt/venv}
PYTHON=${PYTHON:-python3}
STATIC_ROOT=${STATIC_ROOT:-$APP_DIR/staticfiles}

"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
    echo "build.sh: TaskForge needs Python 3.11 or newer" >&2
    exit 1
}

echo "build.sh: virtualenv $VENV_DIR"
"$PYTHON" -m venv "$VENV_DIR"

echo "build.sh: installing the locked dependencies and TaskForge from $APP_DIR"
pip_install() {
    "$VENV_DIR/bin/python" -m pip install --no-cache-dir --disable-pip-version-check -q "$@"
}
pip_install --require-hashes --no-deps -r "$APP_DIR/requirements/service.txt"
# Editable: the code stays in APP_DIR, next to the templates and static files
# that settings.BASE_DIR points at; no second copy in site-packages.  Built by
# the locked setuptools (no build isolation: nothing unpinned is fetched).
pip_install --no-deps --no-build-isolation -e "$APP_DIR"

echo "build.sh: collectstatic into $STATIC_ROOT"
cd "$APP_DIR"
STATIC_ROOT="$STATIC_ROOT" \
SECRET_KEY=collectstatic-only \
DATABASE_URL=postgres://unused@127.0.0.1:1/unused \
    "$VENV_DIR/bin/python" manage.py collectstatic --noinput -v 0

# Bytecode now, so a read-only container filesystem costs nothing at start.
"$VENV_DIR/bin/python" -m compileall -q "$APP_DIR/taskforge" "$APP_DIR/queues" \
    "$APP_DIR/tasks" "$APP_DIR/workers" "$APP_DIR/dlq" >/dev/null

echo "build.sh: done"
