"""docs/cloud-tasks.md's worked example runs: examples/cloudtasks_producer.py (Google's
client, TaskForge's setup) and receiver.py (verifies the OIDC token with PyJWT)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.service import Service, free_port

ROOT = Path(__file__).resolve().parents[2]


def test_example__the_producer_reaches_the_receiver_with_a_verified_token(
    fleet: Service, keys: dict[str, str], tmp_path: Path
) -> None:
    port = free_port()
    env = {
        **os.environ,
        "TASKFORGE_URL": fleet.base_url,
        "TASKFORGE_API_KEY": keys["admin"],
        "RECEIVER_PORT": str(port),
    }
    out = (tmp_path / "receiver.log").open("w+")
    receiver = subprocess.Popen(
        [sys.executable, str(ROOT / "examples/cloudtasks_receiver.py")],
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    try:
        time.sleep(1.0)  # the receiver reads the issuer, then listens
        produced = subprocess.run(
            [sys.executable, str(ROOT / "examples/cloudtasks_producer.py")],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert produced.returncode == 0, produced.stderr
        assert produced.stdout.startswith("created projects/my-project/")
        deadline = time.monotonic() + 30
        while (
            "from orders@my-project.example, attempt 1"
            not in (tmp_path / "receiver.log").read_text()
        ):
            assert time.monotonic() < deadline, (tmp_path / "receiver.log").read_text()
            assert receiver.poll() is None, (tmp_path / "receiver.log").read_text()
            time.sleep(0.1)
        assert '{"order": 42}' in (tmp_path / "receiver.log").read_text()
    finally:
        receiver.terminate()
        receiver.wait(timeout=10)
        out.close()
