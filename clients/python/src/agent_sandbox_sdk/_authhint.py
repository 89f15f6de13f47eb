"""Why a router refused a request (401 `unauthenticated`, 403 `forbidden`), told from what the SDK sent.

A router's authorization answers carry no reason (spec §1.10: the bare words, so as not to help a guesser),
and every cause read the same: `HTTP 401: unauthenticated`. The client knows more - the headers it sent, and
a scoped token's payload, which is signed but not encrypted (`v1.<base64url JSON {ns, name, exp}>.<sig>`) -
so the error says which of the usual mistakes it is: no token sent, an expired scoped token, one scoped to
another sandbox, a pod IP sent with a scoped token, `Bearer ` given twice. Nothing is verified here (the
client has no key); the exception's type and status stay the router's.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import time
from collections.abc import Mapping
from datetime import UTC, datetime

from .constants import HEADER_SANDBOX_POD_IP, ROUTER_TOKEN_ENV

__all__ = ["AUTH_STATUSES", "auth_hint", "scoped_token_claims"]

AUTH_STATUSES = frozenset({401, 403})
_NO_TOKEN = (
    "no Authorization header was sent: give the router's token in the connection config "
    "(extra_headers={'Authorization': 'Bearer <token>'}), or set $" + ROUTER_TOKEN_ENV + " for a client made "
    "without a connection_config"
)


def scoped_token_claims(token: str) -> tuple[str, str, int] | None:
    """(namespace, sandbox name, expiry in Unix seconds) of a scoped token `v1.<payload>.<sig>`, unverified;
    None when `token` is not one."""
    version, _, rest = token.partition(".")
    payload, _, sig = rest.partition(".")
    if version != "v1" or not payload or not sig or "." in sig:
        return None
    try:
        data = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (ValueError, binascii.Error):
        return None
    if not isinstance(data, dict):
        return None
    ns, name, exp = data.get("ns"), data.get("name"), data.get("exp")
    if (
        not isinstance(ns, str)
        or not isinstance(name, str)
        or not isinstance(exp, int)
        or isinstance(exp, bool)
    ):
        return None
    return ns, name, exp


def _header(headers: Mapping[str, str], name: str) -> str | None:
    return next((v for k, v in headers.items() if k.lower() == name.lower()), None)


def _when(exp: int) -> str:
    try:
        return datetime.fromtimestamp(exp, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, OSError, ValueError):
        return f"{exp} (Unix time)"


def auth_hint(
    status: int, headers: Mapping[str, str], namespace: str, sandbox_id: str, *, now: float | None = None
) -> str | None:
    """Why a router answered `status` (401/403) to a request for sandbox `namespace/sandbox_id` sent with
    `headers`, when the request itself shows it; else None."""
    authorization = (_header(headers, "Authorization") or "").strip()
    if not authorization:
        if status != 401:
            return None
        if os.environ.get(ROUTER_TOKEN_ENV, "").strip():
            return (
                f"{_NO_TOKEN} (${ROUTER_TOKEN_ENV} is set, but this client was given a connection_config, "
                "which is used as it is)"
            )
        return _NO_TOKEN
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer":
        return f"the Authorization header's scheme is {scheme!r}: a router reads only 'Bearer <token>'"
    if token.partition(" ")[0].lower() == "bearer":
        return (
            "the Authorization header reads 'Bearer Bearer ...': the token was given with its 'Bearer ' prefix, "
            "and another was added in front of it (give the token alone)"
        )
    claims = scoped_token_claims(token)
    if claims is None:
        if status != 401:
            return None
        return (
            "the router did not accept the bearer token sent: with --authz-mode=tokenreview the API server does not "
            "authenticate it (expired, its ServiceAccount deleted, or issued for another audience); with "
            "scoped-token it is not a scoped token"
        )
    ns, name, exp = claims
    if status == 401:
        if exp <= (time.time() if now is None else now):
            return f"the scoped token expired at {_when(exp)} (by this machine's clock): mint a new one"
        return (
            f"the scoped token (for sandbox {ns}/{name}, valid until {_when(exp)}) was not accepted: the router's "
            "--authz-scoped-token-secret-file key did not sign it, or the router is not in scoped-token mode"
        )
    if _header(headers, HEADER_SANDBOX_POD_IP) is not None:
        return (
            f"a router in scoped-token mode refuses a request naming a pod ({HEADER_SANDBOX_POD_IP}), which "
            "pod_ip_routing=True sends: leave pod_ip_routing unset (with a scoped token it is off by default)"
        )
    if (ns, name) != (namespace, sandbox_id):
        return (
            f"the scoped token is for sandbox {ns}/{name}, not {namespace}/{sandbox_id} (a token reaches only the "
            "Sandbox it names)"
        )
    return None
