"""Whether this machine can reach a TFDS download host: asked without TensorFlow, and answered
within its timeout however the network fails (a name server that never answers included)."""

from __future__ import annotations

import os
import socket
import threading

# A host TFDS downloads from; reaching it says the machine is online.
HOST = ("storage.googleapis.com", 443)
PROXY_VARIABLES = ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY", "all_proxy")

_answer: bool | None = None  # asked once a process


def reachable(timeout: float = 3.0) -> bool:
    """Whether a TCP connection to `HOST` opens within `timeout` seconds, its name looked up
    included (`socket.create_connection`'s own timeout leaves the lookup unbounded: a name
    server that drops the query holds it for 20 s and more). Behind a proxy a direct
    connection may be refused while downloads work, so with a proxy configured this answers
    True and leaves the verdict to the download itself. The first answer holds for the process."""
    global _answer
    if any(os.environ.get(name) for name in PROXY_VARIABLES):
        return True
    if _answer is None:
        answers: list[bool] = []

        def connect() -> None:
            try:
                with socket.create_connection(HOST, timeout=timeout):
                    answers.append(True)
            except OSError:
                answers.append(False)

        # A daemon thread: one still stuck in the lookup does not keep the process alive.
        probe = threading.Thread(target=connect, name="online-probe", daemon=True)
        probe.start()
        probe.join(timeout)
        _answer = bool(answers and answers[0])
    return _answer
