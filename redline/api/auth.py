"""API keys: `Authorization: Bearer <key>` checked against sha256 digests in the config.

No keys configured means an open server (the embedded default). With keys, every /v1/*
request needs a valid one (401 in the OpenAI shape otherwise) and the key's name becomes
`request.state.tenant`, which scopes cached answers, rate limits and every object the
request creates. The plain keys are never stored: `redline.api.auth.digest(key)` gives the
value to put in the config.

Roles: a key is `user` unless configured `role: admin`. Operator routes (/v1/admin/*:
the long-tail log, the dashboard's figures, experiment management) need an admin key
(`require_admin`, a route dependency, so it holds whichever way a request enters). On an
open server (no keys) there are no roles and everything is open, as everything else is.

Managed keys (store/keys.py, made through /v1/admin/keys) are looked up in the store after
the config's; a key found is remembered for `auth.key_cache_s` (1 s by default) on this
replica, so a revocation reaches every replica within that, while a key not found is
asked for again each time (a new key works on every replica at once). They count only
where keys are configured: a keyed server needs at least one config key (its admin makes
the others).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from starlette.types import ASGIApp, Receive, Scope, Send

from redline.api.keyring import KeyRing, ManagedKeys, bearer, digest, key_label
from redline.api.middleware import send_error
from redline.api.services import services_of
from redline.config import ApiKey, AuthConfig
from redline.errors import AuthenticationFailed, Overloaded, PermissionDenied, RedlineError
from redline.store.base import StoreUnavailable

ANONYMOUS = "anonymous"
# always reachable: the spec and its viewer describe how to authenticate
OPEN_PATHS = ("/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc")
# open unless `auth.protect_ops`: probes and scrapers often cannot send a key; the
# dashboard page holds no data (its figures come from /v1/admin/stats, admin only)
OPS_PATHS = ("/healthz", "/readyz", "/metrics", "/dashboard", "/health", "/ping", "/version")
# keyed as /v1/... is: vLLM's tokenizer, rerank and score routes (they name models a key
# may not use)
KEYED_PATHS = ("/v1", "/tokenize", "/detokenize", "/apply-template", "/rerank", "/v2/rerank",
               "/score")


class Auth:
    """ASGI middleware: 401 without a valid key where one is needed; sets the tenant."""

    def __init__(self, app: ASGIApp, config: AuthConfig, managed: ManagedKeys | None = None) -> None:
        self.app = app
        self.keys = KeyRing(config.keys)
        self.protect_ops = config.protect_ops
        self.managed = managed

    def _needs_key(self, path: str) -> bool:
        if not self.keys or path in OPEN_PATHS:
            return False
        if path in OPS_PATHS:
            return self.protect_ops
        return path.startswith("/v1/") or path in KEYED_PATHS

    async def check(self, scope: Scope) -> RedlineError | None:
        """Put the caller's tenant and key in the scope's state, or the error to answer
        where the path needs a key and the request has no valid one."""
        state = scope.setdefault("state", {})
        token = bearer(scope.get("headers", ()))
        key = self.keys.find(token) if token and self.keys else None
        state["key_id"] = None  # a managed key's id (usage, per-key limits)
        if key is None and token and self.keys and self.managed is not None:
            try:
                record = await self.managed.find(token)
            except StoreUnavailable:
                # config keys (and managed ones remembered) still work; this one cannot be
                # checked: a 503 to retry, not a 401 that calls a good key bad
                return Overloaded("API keys cannot be checked now; retry shortly.", retry_after=1)
            if record is not None:
                key, state["key_id"] = record.key, record.id
        if key is None and self._needs_key(scope["path"]):
            if token is None:
                return AuthenticationFailed(
                    "You didn't provide an API key. You need to provide your API key in an "
                    "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).")
            return AuthenticationFailed("Incorrect API key provided.")
        state["tenant"] = key.name if key is not None else ANONYMOUS
        state["api_key"] = key
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refused = await self.check(scope)
        if refused is not None:
            await send_error(send, refused, headers=[(b"www-authenticate", b"Bearer")]
                             if refused.status == 401 else None)
            return
        await self.app(scope, receive, send)


def is_admin(key: ApiKey | None, keys_configured: bool) -> bool:
    """Without keys there are no roles (an open server); with them, only an admin key."""
    return not keys_configured or (key is not None and key.role == "admin")


def require_admin(request: Request) -> None:
    """Route dependency of the operator routes: 403 for a valid key that is not admin
    (Auth has answered 401 already for no key or a wrong one)."""
    keys_configured = bool(services_of(request.app).config.auth.keys)
    if not is_admin(request.scope.get("state", {}).get("api_key"), keys_configured):
        raise PermissionDenied("This route needs an API key with role 'admin'.")


def document(app: FastAPI, config: AuthConfig) -> None:
    """Declare the bearer scheme in /openapi.json when keys are configured, so the spec
    says what the server enforces."""
    if not config.keys:
        return
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        spec = build()
        spec.setdefault("components", {}).setdefault("securitySchemes", {})["bearer"] = {
            "type": "http", "scheme": "bearer"}
        for path, ops in spec.get("paths", {}).items():
            needs = path.startswith("/v1/") or (config.protect_ops and path in OPS_PATHS)
            if needs:
                for op in ops.values():
                    op["security"] = [{"bearer": []}]
        app.openapi_schema = spec
        return spec

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to extend the schema


__all__ = ["ANONYMOUS", "Auth", "KeyRing", "ManagedKeys", "digest", "document", "is_admin",
           "key_label", "require_admin"]
