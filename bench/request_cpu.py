"""API CPU per single-path request, in one process through the WSGI application.

    .venv/bin/python bench/request_cpu.py                          # this checkout
    .venv/bin/python bench/request_cpu.py --against /path/to/other # interleaved A/B
    .venv/bin/python bench/request_cpu.py --env-b DATABASE_POOL_MAX=0  # A/B of a setting

Each checkout runs in a process of its own (this script, with that checkout
first on the import path), on a database of its own created afresh on the
server of DATABASE_URL (`<name>_a`, `<name>_b`, dropped at the end) and the
Redis of REDIS_URL (only its queues' keys are deleted afterwards), with
PROMETHEUS_MULTIPROC_DIR set as `run_api` runs.  A cycle is the single path of
one task: `POST /queues/:name/tasks` (enqueue 1), `POST /workers/claim`
(`max_tasks` 1, `wait_seconds` 0), `POST /workers/ack`.  Each request goes
to the WSGI application as taskforge.api.bridge hands it over (the same
environ; a checkout whose application has an `answer` method, the hot lane's,
is asked that first, as its bridge did), and is timed with
`time.process_time()`: the process's CPU, request signals, logging and
metrics included.  A round is `--cycles` cycles; the processes take rounds in
turn (A B, then B A), and each figure is the median of a process's
`--rounds` rounds.  `--pairs` runs that many pairs of fresh processes.

Prints microseconds of CPU per request for enqueue 1, claim 1 and ack 1.
`--profile FILE` (single checkout) writes a cProfile of the rounds, measured
with the CPU clock; `--callgrind` runs the rounds under valgrind's callgrind
(instruction counts; slow: use few cycles).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from io import BytesIO
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

ENDPOINTS = ("enqueue", "claim", "ack")


# --- the child: one checkout, driven round by round over stdin -----------------------


class Driver:
    """One checkout's WSGI application, with a queue and two keys of its own."""

    def __init__(self) -> None:
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "taskforge.settings")
        import django

        django.setup(set_prefix=False)
        from queues.models import Queue
        from taskforge.api.models import ApiKey
        from taskforge.api.server import prepare_process
        from taskforge.wsgi import application

        self.app: Any = application
        self.answer = getattr(application, "answer", None)
        self.queue = f"reqcpu-{uuid.uuid4().hex[:8]}"
        Queue.objects.create(name=self.queue)
        _, producer = ApiKey.issue(name="bench-producer", role="producer")
        _, worker = ApiKey.issue(name="bench-worker", role="worker")
        self.auth = {"producer": f"Bearer {producer}", "worker": f"Bearer {worker}"}
        self.worker_id = f"bench-{os.getpid()}"
        prepare_process()  # as run_api's processes: gc frozen, its thresholds

    def environ(self, path: str, role: str, body: bytes) -> dict[str, Any]:
        return {
            "REQUEST_METHOD": "POST",
            "SCRIPT_NAME": "",
            "PATH_INFO": path,
            "QUERY_STRING": "",
            "SERVER_NAME": "127.0.0.1",
            "SERVER_PORT": "8080",
            "SERVER_PROTOCOL": "HTTP/1.1",
            "REMOTE_ADDR": "127.0.0.1",
            "REMOTE_PORT": "50000",
            "CONTENT_LENGTH": str(len(body)),
            "CONTENT_TYPE": "application/json",
            "HTTP_HOST": "127.0.0.1:8080",
            "HTTP_AUTHORIZATION": self.auth[role],
            "HTTP_ACCEPT": "*/*",
            "HTTP_CONNECTION": "keep-alive",
            "wsgi.version": (1, 0),
            "wsgi.url_scheme": "http",
            "wsgi.input": BytesIO(body),
            "wsgi.errors": sys.stderr,
            "wsgi.multithread": True,
            "wsgi.multiprocess": True,
            "wsgi.run_once": False,
        }

    def call(self, environ: dict[str, Any]) -> tuple[int, bytes, float]:
        """The answer's status and body, and the CPU seconds it took."""
        started = time.process_time()
        if self.answer is not None:
            answer = self.answer(environ)
            if answer is not None:
                took = time.process_time() - started
                return answer[0], answer[2], took
        status: list[str] = []

        def start_response(code: str, headers: Any, exc_info: Any = None) -> Any:
            status.append(code)

        result = self.app(environ, start_response)
        try:
            body = b"".join(result)
        finally:
            result.close()
        took = time.process_time() - started
        return int(status[0].split(" ", 1)[0]), body, took

    def cycle(self, spent: dict[str, float]) -> None:
        enqueue = json.dumps({"payload": {"n": 1}}).encode()
        code, body, took = self.call(
            self.environ(f"/queues/{self.queue}/tasks", "producer", enqueue)
        )
        _expect(code, 201, body)
        spent["enqueue"] += took
        claim = json.dumps(
            {"worker_id": self.worker_id, "queues": [self.queue], "max_tasks": 1}
        ).encode()
        code, body, took = self.call(self.environ("/workers/claim", "worker", claim))
        _expect(code, 200, body)
        spent["claim"] += took
        [task] = json.loads(body)["tasks"]
        ack = json.dumps(
            {
                "worker_id": self.worker_id,
                "task_id": task["id"],
                "attempt": task["attempts"],
                "result": {"ok": True},
            }
        ).encode()
        code, body, took = self.call(self.environ("/workers/ack", "worker", ack))
        _expect(code, 200, body)
        spent["ack"] += took

    def round(self, cycles: int) -> dict[str, float]:
        """Microseconds of CPU per request of each endpoint over `cycles` cycles."""
        spent = dict.fromkeys(ENDPOINTS, 0.0)
        for _ in range(cycles):
            self.cycle(spent)
        return {name: seconds / cycles * 1e6 for name, seconds in spent.items()}

    def clean(self) -> None:
        from django.conf import settings
        from redis import Redis

        from queues.models import Queue

        Queue.objects.filter(name=self.queue).delete()
        redis = Redis.from_url(settings.REDIS_URL)
        for key in redis.scan_iter(match=f"tf:*{self.queue}*", count=1000):
            redis.delete(key)


def _expect(code: int, wanted: int, body: bytes) -> None:
    if code != wanted:
        raise SystemExit(f"expected {wanted}, got {code}: {body[:300]!r}")


def child(cycles: int, warmup: int, profile: str | None) -> None:
    driver = Driver()
    driver.round(warmup)
    print("ready", flush=True)
    profiler = None
    if profile:
        import cProfile

        profiler = cProfile.Profile(time.process_time)
    for line in sys.stdin:
        if line.strip() != "round":
            break
        if profiler is not None:
            profiler.enable()
        figures = driver.round(cycles)
        if profiler is not None:
            profiler.disable()
        print(json.dumps(figures), flush=True)
    if profiler is not None and profile:
        profiler.dump_stats(profile)
    driver.clean()


# --- the parent: databases, processes, rounds in turn, the report ---------------------


def _admin_url(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


class Checkout:
    def __init__(self, label: str, root: Path, database_url: str, args: argparse.Namespace):
        self.label = label
        env = dict(os.environ, DATABASE_URL=database_url, PYTHONPATH=str(root))
        env.update(item.split("=", 1) for item in getattr(args, f"env_{label.lower()}"))
        env.setdefault("SECRET_KEY", "bench-secret")
        env.setdefault("LOG_LEVEL", "INFO")  # as run_api: a line per request and transition
        env["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="reqcpu-metrics-")
        # The schema first, in a plain process (under callgrind it would take minutes).
        migrate = [sys.executable, "manage.py", "migrate", "--verbosity", "0"]
        subprocess.run(migrate, cwd=root, env=env, check=True)
        command = [sys.executable, os.path.abspath(__file__), "--child"]
        command += ["--cycles", str(args.cycles), "--warmup", str(args.warmup)]
        if args.profile:
            command += ["--profile", args.profile]
        self.callgrind = f"{args.callgrind}.{label.lower()}" if args.callgrind else None
        if self.callgrind:
            command = [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={self.callgrind}",
                "--instr-atstart=no",
                *command,
            ]
        self.process = subprocess.Popen(
            command,
            cwd=root,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None if args.stderr else subprocess.DEVNULL,  # the log lines, written
            text=True,
        )
        self._read("ready")

    def _read(self, wanted: str | None = None) -> str:
        assert self.process.stdout is not None
        line: str = self.process.stdout.readline()
        if not line:
            raise SystemExit(f"{self.label}: the process ended ({self.process.wait()})")
        if wanted is not None and line.strip() != wanted:
            raise SystemExit(f"{self.label}: {line!r}")
        return line

    def round(self) -> dict[str, float]:
        assert self.process.stdin is not None
        self._collect("on")
        self.process.stdin.write("round\n")
        self.process.stdin.flush()
        figures: dict[str, float] = json.loads(self._read())
        self._collect("off")
        return figures

    def _collect(self, state: str) -> None:
        """Under callgrind: count instructions during the rounds only."""
        if self.callgrind:
            subprocess.run(
                ["callgrind_control", f"--instr={state}", str(self.process.pid)],
                check=True,
                capture_output=True,
                timeout=120,
            )

    def instructions(self) -> int:
        """Under callgrind, once stopped: the instructions counted in the rounds."""
        assert self.callgrind
        totals = [
            int(line.split()[1])
            for line in Path(self.callgrind).read_text().splitlines()
            if line.startswith("totals:")
        ]
        if not totals:
            raise SystemExit(f"no totals in {self.callgrind}")
        return totals[-1]

    def stop(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("stop\n")
        self.process.stdin.close()
        self.process.wait(timeout=120)


def parent(args: argparse.Namespace) -> None:
    base = os.environ.get("DATABASE_URL")
    if not base:
        raise SystemExit("DATABASE_URL names the Postgres server (its database is not used)")
    here = Path(__file__).resolve().parent.parent
    roots = {"A": here}
    if args.against or args.env_b:
        roots = {"A": Path(args.against or here).resolve(), "B": here}
    names = {label: f"{args.database}_{label.lower()}" for label in roots}
    admin = _admin_url(base, "postgres")
    instructions: dict[str, list[float]] = {label: [] for label in roots}
    results: dict[str, dict[str, list[float]]] = {
        label: {name: [] for name in ENDPOINTS} for label in roots
    }
    try:
        for pair in range(args.pairs):
            with psycopg.connect(admin, autocommit=True) as conn:
                for name in names.values():
                    conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                    conn.execute(f'CREATE DATABASE "{name}"')
            checkouts = [
                Checkout(label, root, _admin_url(base, names[label]), args)
                for label, root in roots.items()
            ]
            rounds: dict[str, list[dict[str, float]]] = {c.label: [] for c in checkouts}
            for number in range(args.rounds):
                order = checkouts if number % 2 == 0 else checkouts[::-1]
                for checkout in order:
                    rounds[checkout.label].append(checkout.round())
            for checkout in checkouts:
                checkout.stop()
                if checkout.callgrind:
                    per_cycle = checkout.instructions() / (args.rounds * args.cycles)
                    instructions[checkout.label].append(per_cycle)
            line = [f"pair {pair + 1}:"]
            for label, taken in rounds.items():
                for name in ENDPOINTS:
                    median = statistics.median(r[name] for r in taken)
                    results[label][name].append(median)
                    line.append(f"{label} {name} {median:.0f}")
            print("  ".join(line), flush=True)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            for name in names.values():
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    how = f"median of {args.rounds} rounds of {args.cycles} cycles"
    print(f"\nus CPU per request ({how}; per pair)")
    for label, root in roots.items():
        print(f"  {label} = {root}")
    for name in ENDPOINTS:
        row = [f"  {name + ' 1':<10}"]
        for label in roots:
            figures = results[label][name]
            row.append(f"{label}: {'/'.join(f'{f:.0f}' for f in figures):<20}")
        if "B" in roots:
            ratios = [b / a for a, b in zip(results["A"][name], results["B"][name], strict=True)]
            row.append(f"B/A {statistics.median(ratios) - 1:+.1%}")
        print(" ".join(row))
    if args.callgrind:
        print("instructions per cycle (enqueue 1 + claim 1 + ack 1; callgrind)")
        for label in roots:
            print(f"  {label}: {'/'.join(f'{n / 1e6:.2f}M' for n in instructions[label])}")
        if "B" in roots:
            ratio = statistics.median(instructions["B"]) / statistics.median(instructions["A"])
            print(f"  B/A {ratio - 1:+.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", help="another checkout: A is it, B this one")
    parser.add_argument(
        "--env-a", action="append", default=[], metavar="NAME=VALUE", help="for A's process"
    )
    parser.add_argument(
        "--env-b", action="append", default=[], metavar="NAME=VALUE", help="for B's process"
    )
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cycles", type=int, default=150)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--database", default="taskforge_reqcpu")
    parser.add_argument("--profile", help="a cProfile file of the rounds (CPU clock)")
    parser.add_argument("--callgrind", help="a callgrind output file of the whole process")
    parser.add_argument("--stderr", action="store_true", help="show the processes' log lines")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.cycles, args.warmup, args.profile)
    else:
        parent(args)


if __name__ == "__main__":
    main()
