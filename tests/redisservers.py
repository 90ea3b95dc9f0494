"""Redis servers of a test's own on loopback: one server, or a master with a replica
watched by three Sentinels.

Started from the `redis-server` on PATH (tests/rediscluster.py), without
persistence, on ports found free at run time below the ephemeral range (a
restart finds its port free); `stop()` shuts one down (its data gone), `kill()`
SIGKILLs it, `start()` starts it again on the same port.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import redis

from tests.rediscluster import free_ports, redis_server

MASTER_NAME = "tfmaster"
SENTINELS = 3
# How soon the Sentinels call a silent master down (their quorum is 2).
DOWN_AFTER_MS = 1000


class RedisServer:
    """One redis-server in `directory` on a port of its own."""

    def __init__(self, directory: Path, *extra: str) -> None:
        self.directory = directory
        self.port = free_ports(1)[0]
        self.extra = list(extra)
        self.process: subprocess.Popen[bytes] | None = None

    def url(self, db: int) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)

    def argv(self) -> list[str]:
        server = redis_server()
        assert server is not None, "no redis-server on PATH"
        return [
            server,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.directory),
            "--save", "",
            "--appendonly", "no",
            "--logfile", str(self.directory / "redis.log"),
            *self.extra,
        ]  # fmt: skip

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            self.argv(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                with self.client() as client:
                    if client.ping():
                        return
            except redis.ConnectionError:
                assert time.monotonic() < deadline, f"redis-server on {self.port} did not start"
                time.sleep(0.05)

    def stop(self) -> None:
        """SIGTERM: a clean shutdown (no persistence: its data are gone)."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def kill(self) -> None:
        process, self.process = self.process, None
        assert process is not None
        process.kill()
        process.wait()


class Sentinel(RedisServer):
    """A `redis-server --sentinel` watching `master` (its config file is its own)."""

    def __init__(self, directory: Path, master: RedisServer) -> None:
        super().__init__(directory)
        self.master = master

    def argv(self) -> list[str]:
        server = redis_server()
        assert server is not None, "no redis-server on PATH"
        config = self.directory / "sentinel.conf"
        config.write_text(
            f"port {self.port}\n"
            "bind 127.0.0.1\n"
            f"dir {self.directory}\n"
            f"logfile {self.directory / 'sentinel.log'}\n"
            f"sentinel monitor {MASTER_NAME} 127.0.0.1 {self.master.port} 2\n"
            f"sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {MASTER_NAME} 10000\n"
            f"sentinel parallel-syncs {MASTER_NAME} 1\n"
        )
        return [server, str(config), "--sentinel"]


class SentinelGroup:
    """A master, a replica and three Sentinels."""

    def __init__(self, directory: Path) -> None:
        self.master = RedisServer(directory / "master")
        self.replica = RedisServer(directory / "replica")
        self.replica.extra = ["--replicaof", "127.0.0.1", str(self.master.port)]
        self.sentinels = [Sentinel(directory / f"sentinel-{i}", self.master) for i in range(3)]

    def url(self, db: int) -> str:
        """REDIS_URL for TaskForge: every Sentinel, the master's name, the db."""
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{MASTER_NAME}/{db}"

    def start(self) -> None:
        self.master.start()
        self.replica.start()
        for sentinel in self.sentinels:
            sentinel.start()
        self.wait_watched(self.master.port)

    def wait_watched(self, master_port: int, timeout: float = 30) -> None:
        """Until every Sentinel names `master_port` the master, knows a replica and
        the other Sentinels (so that two of them can agree to fail over)."""
        deadline = time.monotonic() + timeout
        while True:
            states = []
            for sentinel in self.sentinels:
                with sentinel.client() as client:
                    states.append(client.sentinel_master(MASTER_NAME))
            if all(
                int(s["port"]) == master_port
                and s["num-slaves"] >= 1
                and s["num-other-sentinels"] == SENTINELS - 1
                for s in states
            ):
                return
            assert time.monotonic() < deadline, states
            time.sleep(0.2)

    def master_port(self) -> int:
        """The master the Sentinels name now."""
        with self.sentinels[0].client() as client:
            return int(client.sentinel_get_master_addr_by_name(MASTER_NAME)[1])

    def stop(self) -> None:
        for server in [*self.sentinels, self.replica, self.master]:
            server.stop()
