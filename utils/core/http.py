"""JSON over HTTP to an OpenAI-compatible endpoint (a `vllm serve`): the LLM judge and the `openai`
sampling engine share it. Standard library only; every request has a timeout, so an endpoint that
accepts a connection and never answers ends in an error, never a hang. The API key is read from
the environment variable the config names, at request time, and goes nowhere but the header.
"""
from __future__ import annotations

import json
import os
import urllib.error
import urllib.request

# what a failed request raises: refused or unreachable, timed out, an HTTP error status, a broken reply
HTTP_ERRORS = (urllib.error.URLError, OSError, ValueError)


def request_json(base_url: str, path: str, body: dict | None, timeout: float, api_key_env: str = "") -> dict:
    """GET (body None) or POST `body` to base_url + path; the decoded JSON reply."""
    headers = {"Content-Type": "application/json"}
    key = os.environ.get(api_key_env) if api_key_env else None
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base_url.rstrip("/") + path, data=data, headers=headers)
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - the configured endpoint
        return json.loads(resp.read().decode("utf-8", errors="replace"))


def describe_error(exc: BaseException) -> str:
    """One line for a failed request: the HTTP status and the server's message where it sent one."""
    if isinstance(exc, urllib.error.HTTPError):
        try:
            detail = exc.read().decode("utf-8", errors="replace")[:300]
        except OSError:
            detail = ""
        return f"HTTP {exc.code}: {detail or exc.reason}"
    return f"{type(exc).__name__}: {getattr(exc, 'reason', None) or exc}"
