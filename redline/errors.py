"""The one error tree. Every error a client can see ends in `api.errors`, which
writes it as OpenAI-shaped JSON: {"error": {"message", "type", "param", "code"}}.

    RedlineError                    500 server_error (a bug or a fault we did not expect)
    ├── InvalidRequest              400 invalid_request_error (param set where known)
    │   └── ContextLengthExceeded   400 code=context_length_exceeded
    ├── AuthenticationFailed        401 authentication_error
    ├── PermissionDenied            403 permission_error (a valid key without the role)
    ├── NotFound                    404 invalid_request_error
    │   └── ModelNotFound           404 code=model_not_found
    ├── RequestTimeout              408 invalid_request_error (a client too slow to send)
    ├── PayloadTooLarge             413 invalid_request_error
    ├── RateLimited                 429 rate_limit_error (+ Retry-After)
    ├── Overloaded                  503 overloaded (+ Retry-After)
    │   └── NotReady                503 not_ready
    └── BackendError                502 backend_error (an upstream or engine failed)
        └── EngineDead              503 fatal: the engine thread died; safe message only
"""

from __future__ import annotations


class RedlineError(Exception):
    status = 500
    type = "server_error"
    code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.retry_after = retry_after

    def to_dict(self) -> dict[str, object]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


class InvalidRequest(RedlineError):
    status = 400
    type = "invalid_request_error"


class ContextLengthExceeded(InvalidRequest):
    code = "context_length_exceeded"


class AuthenticationFailed(RedlineError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class PermissionDenied(RedlineError):
    status = 403
    type = "permission_error"
    code = "permission_denied"


class NotFound(RedlineError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class ModelNotFound(NotFound):
    code = "model_not_found"


class RequestTimeout(RedlineError):
    status = 408
    type = "invalid_request_error"
    code = "request_timeout"


class PayloadTooLarge(RedlineError):
    status = 413
    type = "invalid_request_error"
    code = "payload_too_large"


class RateLimited(RedlineError):
    status = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"


class Overloaded(RedlineError):
    status = 503
    type = "overloaded_error"
    code = "overloaded"


class NotReady(Overloaded):
    code = "not_ready"


class BackendError(RedlineError):
    status = 502
    type = "backend_error"
    code = "backend_error"


class EngineDead(BackendError):
    status = 503
    code = "engine_dead"
