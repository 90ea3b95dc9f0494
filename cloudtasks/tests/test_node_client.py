"""Google's Node client (@google-cloud/tasks >= 6, REST fallback) against run_api.

`npm install` puts the client in a cache directory (~/.cache/taskforge/node) the first
time; without npm, or when the install fails, the test is skipped and says why.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.service import Service

HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("TASKFORGE_NODE_CACHE", Path.home() / ".cache/taskforge/node"))
PACKAGES = ("@google-cloud/tasks@6", "google-auth-library@10")


@pytest.fixture(scope="session")
def node_modules() -> Path:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node and npm are needed for the Node client's test (apt-get install npm)")
    modules = CACHE / "node_modules"
    if not (modules / "@google-cloud/tasks").is_dir():
        CACHE.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            [npm, "install", "--prefix", str(CACHE), "--no-audit", "--no-fund", *PACKAGES],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if done.returncode != 0:
            pytest.skip(f"npm install of the Node client failed: {done.stderr[-500:]}")
    return modules


def test_node_client__queues_and_tasks(
    server: Service, keys: dict[str, str], node_modules: Path
) -> None:
    done = subprocess.run(
        [
            "node",
            str(HERE / "node_client.js"),
            "127.0.0.1",
            str(server.port),
            keys["admin"],
            "https://receiver.example/patch",
        ],
        env={**os.environ, "NODE_PATH": str(node_modules)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    name = "projects/node-project/locations/europe-west1/queues/from-node"
    assert seen["queue"] == {"name": name, "rate": 2.5, "burst": 3}
    assert seen["conflict"] == 409
    assert seen["task"] == {
        "name": f"{name}/tasks/node-1",
        "method": "PATCH",
        "body": "from node",
    }
    assert seen["listed"] == [f"{name}/tasks/node-1"]
    assert seen["deleted"] == 404
