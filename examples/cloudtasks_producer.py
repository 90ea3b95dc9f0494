"""Code written for Google Cloud Tasks, run against TaskForge: only the client setup differs.

    export TASKFORGE_URL=http://localhost:8080
    export TASKFORGE_API_KEY=$(cat .taskforge/admin_api_key)
    python examples/cloudtasks_producer.py

Needs `pip install google-cloud-tasks`.  Creates the queue `cloudtasks-demo` (once) and
a named task for receiver.py, with an OIDC token, then shows the task as Cloud Tasks does.
"""

from __future__ import annotations

import json
import os
import uuid

from google.api_core import exceptions
from google.api_core.client_options import ClientOptions
from google.cloud import tasks_v2
from google.oauth2.credentials import Credentials

# The only TaskForge-specific lines: the endpoint (scheme kept) and an API key as the token.
client = tasks_v2.CloudTasksClient(
    transport="rest",
    client_options=ClientOptions(api_endpoint=os.environ["TASKFORGE_URL"]),
    credentials=Credentials(token=os.environ["TASKFORGE_API_KEY"]),
)

# From here on, code as written for Google.
parent = "projects/my-project/locations/us-central1"
queue_name = f"{parent}/queues/cloudtasks-demo"
try:
    client.create_queue(
        parent=parent,
        queue=tasks_v2.Queue(
            name=queue_name,
            rate_limits=tasks_v2.RateLimits(max_dispatches_per_second=5),
            retry_config=tasks_v2.RetryConfig(max_attempts=5),
        ),
    )
except exceptions.Conflict:  # over REST: Conflict, where gRPC raises AlreadyExists
    pass

port = os.environ.get("RECEIVER_PORT", "8099")
task = client.create_task(
    parent=queue_name,
    task=tasks_v2.Task(
        name=f"{queue_name}/tasks/order-{uuid.uuid4().hex[:8]}",
        http_request=tasks_v2.HttpRequest(
            http_method=tasks_v2.HttpMethod.POST,
            url=f"http://localhost:{port}/",
            headers={"Content-Type": "application/json"},
            body=json.dumps({"order": 42}).encode(),
            oidc_token=tasks_v2.OidcToken(service_account_email="orders@my-project.example"),
        ),
    ),
)
print("created", task.name)
