"""The Celery messages waiting in a Redis broker queue, decoded (for tests that run no worker)."""

import base64
import json
from datetime import datetime


def queued_messages(broker, queue="celery") -> list[tuple[str, list[int], float]]:
    """(task name, job ids, hard time limit) of each message waiting in `queue`, oldest first."""
    found = []
    for raw in reversed(broker.lrange(queue, 0, -1)):  # kombu pushes on the left
        message = json.loads(raw)
        args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
        job_ids = [item[0] for item in args[0]] if message["headers"]["task"] == "timeouts.run_batch" else [args[0]]
        found.append((message["headers"]["task"], job_ids, message["headers"]["timelimit"][0]))
    return found


def message_etas(broker, queue="celery") -> list[datetime | None]:
    """The Celery ETA of each message waiting in `queue`, oldest first."""
    etas = [json.loads(raw)["headers"]["eta"] for raw in reversed(broker.lrange(queue, 0, -1))]
    return [eta and datetime.fromisoformat(eta) for eta in etas]
