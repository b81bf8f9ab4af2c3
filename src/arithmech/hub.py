"""Whether the Hugging Face hub can be reached, decided at once rather than after the libraries' retries.

Background
    Given a hub id on a machine without network, transformers and datasets retry each request with backoff and
    print a line per retry: about 27 s of "Retrying in 8s" before one error. A single connection attempt to the
    hub's host says the same in milliseconds when the name does not resolve or the route is down (`PROBE_S` at
    most when packets vanish), so a loader asks `unreachable()` first and, when the hub cannot be reached, loads
    only what the local cache holds (`local_files_only`) or says so in one sentence.

When it does not probe
    HF_HUB_OFFLINE set: the hub is not to be used, and that is the reason given. A proxy in the environment
    (HTTPS_PROXY, ALL_PROXY): a direct connection says nothing about the route the libraries take, so they try
    as usual.
"""

from __future__ import annotations

import functools
import os
import socket
from urllib.parse import urlparse

PROBE_S = 3.0
"""How long the connection attempt may take before the hub counts as unreachable."""
PROXIES = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")


def unreachable() -> str | None:
    """Why the hub cannot be reached ("HF_HUB_OFFLINE is set", "huggingface.co:443: Name or service not known"),
    or None when it may be (the connection is tried once per process)."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    if any(os.environ.get(name) for name in PROXIES):
        return None
    url = urlparse(constants.ENDPOINT)
    return _probe(url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443))


@functools.cache
def _probe(host: str, port: int) -> str | None:
    try:
        socket.create_connection((host, port), timeout=PROBE_S).close()
    except OSError as err:
        return f"{host}:{port}: {err.strerror or err.__class__.__name__}"
    return None
