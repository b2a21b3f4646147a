"""A cluster of worker processes on this machine, for the MultiWorkerMirroredStrategy tests."""

from __future__ import annotations

import json
import socket


def local_tf_configs(workers: int) -> list[str]:
    """One TF_CONFIG per worker of a cluster on 127.0.0.1, on ports free when called."""
    sockets = [socket.socket() for _ in range(workers)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        cluster = {"worker": [f"127.0.0.1:{s.getsockname()[1]}" for s in sockets]}
    finally:
        for s in sockets:
            s.close()
    return [
        json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
        for index in range(workers)
    ]
