# TaskForge: one image for the API and the three loops (see docker-compose.yml).
#
#   docker build -t taskforge .
#   docker run ... taskforge                                   # the API on :8080
#   docker run ... taskforge python manage.py run_dispatcher   # a loop
#
# The build steps are in deploy/build.sh (tested by tests/test_deploy.py).
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH \
    STATIC_ROOT=/app/staticfiles \
    PROMETHEUS_MULTIPROC_DIR=/run/taskforge/prometheus \
    TASKFORGE_BIND=0.0.0.0:8080

WORKDIR /app
COPY . /app

# venv in /opt/venv; the runtime dependencies as uv.lock pins them, hashes checked
# (requirements/service.txt: no dev or test extras), then TaskForge; static files
# collected into $STATIC_ROOT with throwaway SECRET_KEY and DATABASE_URL.
RUN sh deploy/build.sh /app /opt/venv

# Run as an unprivileged user. The code and static files stay root-owned
# (read-only to the app); only the metrics directory is writable. Compose
# mounts a tmpfs volume shared by every process over it.
RUN groupadd --system --gid 10001 taskforge \
    && useradd --system --uid 10001 --gid taskforge --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin taskforge \
    && mkdir -p "$PROMETHEUS_MULTIPROC_DIR" \
    && chown -R taskforge:taskforge /run/taskforge
USER taskforge:taskforge

EXPOSE 8080

# slim has no curl: probe /healthz with the standard library.
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=4)"]

# The API. The loops run the same image with another command
# (`python manage.py run_dispatcher`, `run_scheduler`, `run_watchdog`, `run_pusher`).
CMD ["python", "manage.py", "run_api"]
