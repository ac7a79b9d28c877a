"""A typed Python client for ContextEngine, the context database for AI agents.

``Client`` is blocking, ``AsyncClient`` its asyncio twin; both speak the HTTP JSON API of
``ce serve`` (``docs/http-api.md``) and answer its JSON documents, described by the
``TypedDict`` types of :mod:`contextengine.types`. Failures raise the typed exceptions of
:mod:`contextengine.errors`, which carry the server's ``code``, ``message``, ``retryable``
flag and HTTP ``status``::

    from contextengine import Client

    with Client("http://127.0.0.1:7420", api_key="...") as ce:
        ce.put("ctx://acme/docs/guide", abstract="How to deploy.", content="...")
        ce.wait_until_indexed()
        for hit in ce.search("deploy", mode="hybrid")["hits"]:
            print(hit["uri"], hit["score"])
"""

from ._protocol import DEFAULT_BASE_URL, SearchFilters
from .client import AsyncClient, Client
from .errors import (
    ConflictError,
    ContextEngineError,
    ForbiddenError,
    IndexingTimeout,
    InvalidInputError,
    KbFollowTimeout,
    NetworkError,
    NotFoundError,
    PayloadTooLargeError,
    ServerError,
    UnauthorizedError,
    UnavailableError,
    VersionConflictError,
)

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_BASE_URL",
    "AsyncClient",
    "Client",
    "ConflictError",
    "ContextEngineError",
    "ForbiddenError",
    "IndexingTimeout",
    "InvalidInputError",
    "KbFollowTimeout",
    "NetworkError",
    "NotFoundError",
    "PayloadTooLargeError",
    "SearchFilters",
    "ServerError",
    "UnauthorizedError",
    "UnavailableError",
    "VersionConflictError",
]
