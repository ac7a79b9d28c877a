"""Typed exceptions for the server's error answers ``{code, message, retryable}``.

Every failure is a :class:`ContextEngineError` carrying the server's ``code`` (e.g.
``"version_conflict"``), ``message``, ``retryable`` flag and HTTP ``status``. The subclass
names the family, so callers catch what they can handle::

    try:
        client.put(uri, content="...", expect_version=3)
    except VersionConflictError:
        ...  # read it again and retry the edit
    except ContextEngineError as e:
        if not e.retryable:
            raise

A request that never got an answer (connection refused, reset, timed out) is a
:class:`NetworkError` (retryable, ``status`` is ``None``).
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Type

__all__ = [
    "ConflictError",
    "ContextEngineError",
    "ForbiddenError",
    "IndexingTimeout",
    "InvalidInputError",
    "KbFollowTimeout",
    "NetworkError",
    "NotFoundError",
    "PayloadTooLargeError",
    "ServerError",
    "UnauthorizedError",
    "UnavailableError",
    "VersionConflictError",
    "error_for",
]


class ContextEngineError(Exception):
    """A failed request: the server's ``{code, message, retryable}`` and the HTTP status.

    Attributes:
        code: The stable error code (``not_found``, ``version_conflict``, ...; see
            ``docs/http-api.md``), ``network`` for a request that got no answer.
        message: What went wrong, naming the offending value.
        retryable: Whether the same request can succeed later.
        status: The HTTP status, or ``None`` when there was no answer.
        retry_after: Seconds the server asked to wait (``Retry-After``), if it did.
    """

    def __init__(
        self,
        code: str,
        message: str,
        retryable: bool,
        status: Optional[int] = None,
        retry_after: Optional[float] = None,
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.retryable = retryable
        self.status = status
        self.retry_after = retry_after

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(code={self.code!r}, message={self.message!r}, "
            f"retryable={self.retryable!r}, status={self.status!r})"
        )


class InvalidInputError(ContextEngineError):
    """400: a bad URI, level, field, event type, payload or move (``invalid_*``)."""


class PayloadTooLargeError(InvalidInputError):
    """413 ``payload_too_large``: a layer, query or body over the server's limit."""


class UnauthorizedError(ContextEngineError):
    """401 ``unauthenticated``: no API key, or one the server does not know."""


class ForbiddenError(ContextEngineError):
    """403 ``forbidden``: the key may not do this (another account, an owner space it
    lacks, an admin-only route). Reads of another account's nodes are ``NotFoundError``."""


class NotFoundError(ContextEngineError):
    """404 ``not_found``: no such node, relation, event, job or route (or one the key may
    not see)."""


class ConflictError(ContextEngineError):
    """409: ``already_exists``, ``not_empty``, ``state_transition``, ``busy`` (retryable),
    ``large_delete``, ... The state does not allow the change."""


class VersionConflictError(ConflictError):
    """409 ``version_conflict``: ``expect_version`` did not match the stored version."""


class UnavailableError(ContextEngineError):
    """429, 502, 503, 504: ``rate_limited``, ``upstream``, ``unavailable``,
    ``embed_timeout``; normally retryable."""


class NetworkError(UnavailableError):
    """No answer: the connection failed or timed out (``code`` is ``network``; retryable)."""

    def __init__(self, message: str) -> None:
        super().__init__("network", message, True)


class IndexingTimeout(UnavailableError, TimeoutError):
    """``wait_until_indexed`` gave up: the indexes still had changes to apply."""

    def __init__(self, message: str) -> None:
        super().__init__("indexing_timeout", message, True)


class KbFollowTimeout(UnavailableError, TimeoutError):
    """``kb_follow`` gave up before the work ended (it goes on in the server).

    Attributes:
        progress: The last progress read (a :class:`~contextengine.types.KbProgress`).
    """

    def __init__(self, message: str, progress: Mapping[str, Any]) -> None:
        super().__init__("kb_follow_timeout", message, True)
        self.progress = progress


class ServerError(ContextEngineError):
    """500: ``io``, ``corrupt`` or ``internal`` (a defect or a broken store)."""


_BY_CODE: Dict[str, Type[ContextEngineError]] = {
    "version_conflict": VersionConflictError,
    "payload_too_large": PayloadTooLargeError,
}

_BY_STATUS: Dict[int, Type[ContextEngineError]] = {
    400: InvalidInputError,
    401: UnauthorizedError,
    403: ForbiddenError,
    404: NotFoundError,
    405: InvalidInputError,
    409: ConflictError,
    413: PayloadTooLargeError,
    429: UnavailableError,
    502: UnavailableError,
    503: UnavailableError,
    504: UnavailableError,
}


def error_for(
    status: int,
    code: str,
    message: str,
    retryable: bool,
    retry_after: Optional[float] = None,
) -> ContextEngineError:
    """The exception for an error answer: by its code where one has its own class, else by
    the HTTP status's family (any other 5xx is a :class:`ServerError`)."""
    cls = _BY_CODE.get(code) or _BY_STATUS.get(status)
    if cls is None:
        cls = ServerError if status >= 500 else ContextEngineError
    return cls(code, message, retryable, status, retry_after)
