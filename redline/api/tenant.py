"""Whose request is this? The tenant scopes cached answers (never served across tenants).

With API keys configured, `Auth` sets `request.state.tenant` to the key's name. On an open
server (no keys) every caller would be "anonymous" and share cached answers; so a caller
who sends a bearer token anyway gets a tenant of its own: a hash of that token (the
token itself is never kept).
"""

from __future__ import annotations

import hashlib

from starlette.requests import Request
from starlette.types import Scope

ANONYMOUS = "anonymous"


def tenant_of(request: Request) -> str:
    return tenant_from(request.scope, request.headers.get("authorization", ""))


def tenant_from(scope: Scope, authorization: str) -> str:
    """The same, from the scope (where Auth put the key's tenant) and the Authorization
    header's value, for a caller that has read the headers already."""
    tenant = scope.get("state", {}).get("tenant")
    if tenant and tenant != ANONYMOUS:
        return str(tenant)
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return "token-" + hashlib.sha256(token.strip().encode()).hexdigest()[:24]
    return ANONYMOUS
