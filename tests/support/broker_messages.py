"""The Celery messages waiting in a Redis broker queue, decoded (for tests that run no worker)."""

import base64
import json
from datetime import datetime

from kombu.transport.redis import PRIORITY_STEPS


def _lists(queue):
    """The Redis lists of `queue`: kombu keeps one per priority step, read the lowest step first."""
    return [queue] + [f"{queue}\x06\x16{step}" for step in PRIORITY_STEPS[1:]]


def queue_length(broker, queue="celery") -> int:
    """How many messages wait in `queue`, whatever their priority."""
    return sum(broker.llen(name) for name in _lists(queue))


def _waiting(broker, queue):
    """Each message waiting in `queue`, decoded from JSON, in the order a worker takes them: the
    lowest priority step first, each oldest first (kombu pushes on the left)."""
    return [json.loads(raw) for name in _lists(queue) for raw in reversed(broker.lrange(name, 0, -1))]


def message_priorities(broker, queue="celery") -> list[int]:
    """The priority of each message waiting in `queue`, in the order a worker takes them."""
    return [m["properties"]["priority"] for m in _waiting(broker, queue)]


def queued_messages(broker, queue="celery") -> list[tuple[str, list[int], float]]:
    """(task name, job ids, hard time limit) of each message waiting in `queue`, oldest first."""
    found = []
    for message in _waiting(broker, queue):
        args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
        job_ids = [item[0] for item in args[0]] if message["headers"]["task"] == "timeouts.run_batch" else [args[0]]
        found.append((message["headers"]["task"], job_ids, message["headers"]["timelimit"][0]))
    return found


def message_etas(broker, queue="celery") -> list[datetime | None]:
    """The Celery ETA of each message waiting in `queue`, oldest first."""
    return [eta and datetime.fromisoformat(eta) for eta in (m["headers"]["eta"] for m in _waiting(broker, queue))]


def shown_arguments(broker, queue="celery") -> list[tuple[str, str, list]]:
    """(argsrepr, kwargsrepr, args) of each message waiting in `queue`, oldest first: what Celery
    shows of its arguments (worker logs, events, Flower), and the arguments themselves."""
    return [(m["headers"]["argsrepr"], m["headers"]["kwargsrepr"], json.loads(base64.b64decode(m["body"]))[0])
            for m in _waiting(broker, queue)]
