"""The one place that knows the HTTP API: what each operation sends and how an answer is
read. Nothing here does I/O; :mod:`contextengine.client` sends the :class:`Call` values
built here (``Client`` blocking, ``AsyncClient`` with ``await``).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import (
    Any,
    Callable,
    Dict,
    Generator,
    Generic,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    TypedDict,
    TypeVar,
    Union,
    cast,
)
from urllib.parse import quote

from . import types as t
from .errors import (
    ContextEngineError,
    ForbiddenError,
    IndexingTimeout,
    KbFollowTimeout,
    NetworkError,
    NotFoundError,
    error_for,
)

T = TypeVar("T")

DEFAULT_BASE_URL = "http://127.0.0.1:7420"
"""Where ``ce serve`` listens by default."""

DEFAULT_TIMEOUT = 60.0
"""Seconds a request may take (a waiting ``reindex`` can take a while)."""

Params = Dict[str, Union[str, int, float]]


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request to send and how to read its answer (``T`` is the answer's type)."""

    method: str
    path: str
    params: Params = field(default_factory=dict)
    body: Optional[Dict[str, Any]] = None
    ok_statuses: Tuple[int, ...] = ()
    """Statuses besides 2xx whose JSON body is the answer (``readyz``'s 503)."""

    def parse(self, status: int, headers: Mapping[str, str], content: bytes) -> T:
        """The answer of a response, or the typed error it carries."""
        if 200 <= status < 300 or status in self.ok_statuses:
            try:
                return cast(T, json.loads(content))
            except ValueError as e:
                raise ContextEngineError(
                    "internal",
                    f"{self.method} {self.path}: the answer is not JSON ({e})",
                    False,
                    status,
                ) from None
        raise answer_error(status, headers, content)


def answer_error(
    status: int, headers: Mapping[str, str], content: bytes
) -> ContextEngineError:
    """The exception of an error answer: the server's ``{code, message, retryable}``, or
    for a body that is not one (e.g. a proxy's page) an error named after the status."""
    retry_after: Optional[float] = None
    try:
        retry_after = float(headers.get("retry-after", ""))
    except ValueError:
        pass
    try:
        doc = json.loads(content)
    except ValueError:
        doc = None
    if (
        isinstance(doc, dict)
        and isinstance(doc.get("code"), str)
        and isinstance(doc.get("message"), str)
    ):
        retryable = bool(doc.get("retryable", False))
        return error_for(status, doc["code"], doc["message"], retryable, retry_after)
    text = content.decode("utf-8", "replace").strip()[:500]
    code = "internal" if status >= 500 else "http_error"
    retryable = status in (429, 502, 503, 504)
    return error_for(status, code, f"HTTP {status}: {text}", retryable, retry_after)


def network_error(call: Call[Any], e: Exception) -> NetworkError:
    """The error of a request that got no answer."""
    return NetworkError(f"{call.method} {call.path}: {type(e).__name__}: {e}")


@dataclass(frozen=True)
class Config:
    """Where the server is and the headers every request carries."""

    base_url: str
    headers: Dict[str, str]

    @staticmethod
    def resolve(base_url: Optional[str], api_key: Optional[str]) -> "Config":
        """``base_url`` (else ``$CE_SERVER``, else :data:`DEFAULT_BASE_URL`) and ``api_key``
        (else ``$CE_API_KEY`` when set and not empty), sent as ``Authorization: Bearer KEY``."""
        url = base_url or os.environ.get("CE_SERVER") or DEFAULT_BASE_URL
        key = api_key if api_key is not None else os.environ.get("CE_API_KEY") or None
        headers = {"Accept": "application/json"}
        if key is not None:
            if not key or any(c.isspace() for c in key):
                raise ValueError(
                    "api_key (or CE_API_KEY) must be a non-empty key without whitespace"
                )
            headers["Authorization"] = f"Bearer {key}"
        return Config(url.rstrip("/"), headers)


def _some(**fields: Any) -> Dict[str, Any]:
    """The fields that are given (not ``None``)."""
    return {k: v for k, v in fields.items() if v is not None}


# --- nodes -------------------------------------------------------------------------------


def put(
    uri: str,
    *,
    content: Optional[str] = None,
    abstract: Optional[str] = None,
    overview: Optional[str] = None,
    context_type: Optional[str] = None,
    category: Optional[str] = None,
    owner_space: Optional[str] = None,
    meta: Optional[Mapping[str, Any]] = None,
    mode: Optional[str] = None,
    expect_version: Optional[int] = None,
    trace_id: Optional[str] = None,
) -> Call[t.WriteOutcome]:
    """Writes a node (``POST /v1/put``), creating missing ancestors.

    Args:
        uri: The node, e.g. ``"ctx://acme/docs/guide"``.
        content: L2, the full text.
        abstract: L0, a one-line summary (search ranks it first).
        overview: L1, a paragraph.
        context_type: ``memory``, ``resource``, ``skill`` or ``session`` (default: from the
            path).
        category: The category (default: from the path).
        owner_space: ``user:ID``, ``agent:ID`` or ``shared`` (default: from the path).
        meta: Metadata, any JSON values; flat scalars are filterable in search. In ``merge``
            mode a ``None`` value removes the key.
        mode: ``replace`` (default: layers not given are emptied), ``merge`` (layers and
            meta keys not given are kept) or ``append`` (text is appended to the layers).
        expect_version: Fail with :class:`~contextengine.VersionConflictError` unless the
            stored version is this one (``0``: the node must not exist yet).
        trace_id: Recorded on the node and its events.

    Returns:
        The write outcome: the new ``version``, whether it ``changed``, the events appended.
    """
    body = _some(
        uri=uri,
        content=content,
        abstract=abstract,
        overview=overview,
        context_type=context_type,
        category=category,
        owner_space=owner_space,
        meta=dict(meta) if meta is not None else None,
        mode=mode,
        expect_version=expect_version,
        trace_id=trace_id,
    )
    return Call("POST", "/v1/put", body=body)


def cat(uri: str, level: Optional[int] = None) -> Call[t.CatAnswer]:
    """One layer of a node (``GET /v1/cat``): ``level`` 0 (abstract), 1 (overview) or 2
    (content, the default)."""
    return Call("GET", "/v1/cat", _some(uri=uri, level=level))


def stat(uri: str) -> Call[t.NodeStat]:
    """A node's attributes, sizes, version and number of children (``GET /v1/stat``)."""
    return Call("GET", "/v1/stat", {"uri": uri})


def ls(uri: Optional[str] = None) -> Call[List[t.NodeStat]]:
    """The children of ``uri`` (``GET /v1/ls``); without one, the accounts the key sees."""
    return Call("GET", "/v1/ls", _some(uri=uri))


def tree(uri: str, depth: Optional[int] = None) -> Call[List[t.NodeStat]]:
    """``uri`` and its descendants, the root first (``GET /v1/tree``), at most ``depth``
    levels below it."""
    return Call("GET", "/v1/tree", _some(uri=uri, depth=depth))


def rm(
    uri: str,
    *,
    recursive: bool = False,
    expect_version: Optional[int] = None,
    trace_id: Optional[str] = None,
) -> Call[t.WriteOutcome]:
    """Removes a node (``POST /v1/rm``); one with children only when ``recursive`` (else
    :class:`~contextengine.ConflictError` ``not_empty``)."""
    body = _some(uri=uri, expect_version=expect_version, trace_id=trace_id)
    if recursive:
        body["recursive"] = True
    return Call("POST", "/v1/rm", body=body)


def mv(from_uri: str, to_uri: str, *, trace_id: Optional[str] = None) -> Call[t.WriteOutcome]:
    """Moves a node and its subtree (``POST /v1/mv``); the outcome's ``uri`` is the new
    one."""
    return Call("POST", "/v1/mv", body=_some(**{"from": from_uri, "to": to_uri}, trace_id=trace_id))


# --- relations ---------------------------------------------------------------------------


def link(
    from_uri: str,
    to_uri: str,
    relation_type: str,
    *,
    weight: Optional[float] = None,
    reason: Optional[str] = None,
    trace_id: Optional[str] = None,
) -> Call[t.WriteOutcome]:
    """Adds (or updates) the edge ``from_uri -relation_type-> to_uri`` (``POST /v1/link``);
    ``weight`` defaults to 1.0, ``reason`` to ``""``."""
    body = _some(
        **{"from": from_uri, "to": to_uri, "type": relation_type},
        weight=weight,
        reason=reason,
        trace_id=trace_id,
    )
    return Call("POST", "/v1/link", body=body)


def unlink(
    from_uri: str, to_uri: str, relation_type: str, *, trace_id: Optional[str] = None
) -> Call[t.WriteOutcome]:
    """Removes the edge ``from_uri -relation_type-> to_uri`` (``POST /v1/unlink``)."""
    body = _some(**{"from": from_uri, "to": to_uri, "type": relation_type}, trace_id=trace_id)
    return Call("POST", "/v1/unlink", body=body)


def relations(uri: str) -> Call[t.Relations]:
    """A node's outgoing and incoming edges from the source of truth
    (``GET /v1/relations``)."""
    return Call("GET", "/v1/relations", {"uri": uri})


def related(
    uri: str,
    *,
    relation_type: Optional[str] = None,
    direction: Optional[str] = None,
    limit: Optional[int] = None,
) -> Call[t.RelatedAnswer]:
    """A node's neighbours from the relation index, strongest first (``GET /v1/related``).

    Args:
        uri: The node.
        relation_type: Only edges of this type.
        direction: ``out`` (default), ``in`` or ``both``.
        limit: At most this many edges (1-1000, default 50).
    """
    params = _some(uri=uri, type=relation_type, direction=direction, limit=limit)
    return Call("GET", "/v1/related", params)


# --- search ------------------------------------------------------------------------------


class SearchFilters(TypedDict, total=False):
    """Filters of a search besides ``subtree`` and ``level``; all given ones must match.

    ``owner_space`` matches any of the spaces given; ``meta`` is equality on flat scalar
    metadata values. A tenant key's account and owner spaces are applied by the server.
    """

    parent_uri: str
    context_type: str
    category: str
    owner_space: Union[str, Sequence[str]]
    account_id: str
    meta: Mapping[str, Union[str, int, float, bool]]


def _search_body(
    query: str,
    mode: Optional[str],
    top_k: Optional[int],
    level: Optional[int],
    subtree: Optional[str],
    filters: Optional[SearchFilters],
    min_score: Optional[float],
) -> Dict[str, Any]:
    body: Dict[str, Any] = dict(filters or {})
    spaces = body.get("owner_space")
    if isinstance(spaces, str):
        body["owner_space"] = [spaces]
    elif spaces is not None:
        body["owner_space"] = list(spaces)
    if "meta" in body:
        body["meta"] = dict(body["meta"])
    body.update(
        _some(
            query=query,
            mode=mode,
            top_k=top_k,
            level=level,
            subtree=subtree,
            min_score=min_score,
        )
    )
    return body


def search(
    query: str,
    *,
    mode: Optional[str] = None,
    top_k: Optional[int] = None,
    level: Optional[int] = None,
    subtree: Optional[str] = None,
    filters: Optional[SearchFilters] = None,
    min_score: Optional[float] = None,
) -> Call[t.SearchAnswer]:
    """Searches nodes (``POST /v1/search``): hits per node, best first, each checked against
    the source of truth (stale text is never returned).

    Args:
        query: The text to look for (non-empty, at most 16 KiB).
        mode: ``vector``, ``keyword`` or ``hybrid`` (default: the server's
            ``retrieval.default_mode``). See :meth:`hierarchical_search` for the
            hierarchical descent.
        top_k: Number of nodes (1-100, default 10).
        level: Only records of this layer (0, 1 or 2).
        subtree: Only nodes at or below this URI.
        filters: More filters (:class:`SearchFilters`).
        min_score: Skip vector candidates below this cosine similarity (not in keyword
            mode).

    Returns:
        The hits with the mode that ran, the indexes' ``lag`` (so that "no hits" right after a
        write is explained) and timings.
    """
    body = _search_body(query, mode, top_k, level, subtree, filters, min_score)
    return Call("POST", "/v1/search", body=body)


def hierarchical_search(
    query: str,
    *,
    top_k: Optional[int] = None,
    level: Optional[int] = None,
    subtree: Optional[str] = None,
    filters: Optional[SearchFilters] = None,
    min_score: Optional[float] = None,
    alpha: Optional[float] = None,
    seeds: Optional[int] = None,
    max_expansions: Optional[int] = None,
    per_container: Optional[int] = None,
    convergence_rounds: Optional[int] = None,
    max_depth: Optional[int] = None,
) -> Call[t.HierarchicalAnswer]:
    """Hierarchical search (``POST /v1/search`` with ``"mode": "hierarchical"``): seeds from
    the vector index, then a descent through the best containers; each hit carries its
    ``path`` of ancestors and the layers to ``drill_down`` into (``docs/retrieval.md``).

    The descent's parameters are optional: ``alpha`` (0-1, weight of a node's own score
    against its parent's, default 0.5), ``seeds`` (20), ``max_expansions`` (30),
    ``per_container`` (50), ``convergence_rounds`` (3) and ``max_depth`` (8). The other
    arguments are those of :meth:`search`.
    """
    body = _search_body(query, "hierarchical", top_k, level, subtree, filters, min_score)
    params = _some(
        alpha=alpha,
        seeds=seeds,
        max_expansions=max_expansions,
        per_container=per_container,
        convergence_rounds=convergence_rounds,
        max_depth=max_depth,
    )
    if params:
        body["hierarchical"] = params
    return Call("POST", "/v1/search", body=body)


# --- operations --------------------------------------------------------------------------


def status() -> Call[t.Status]:
    """Readiness, model, index sizes, workers and per consumer the lag and validation
    state (``GET /v1/status``; admin key)."""
    return Call("GET", "/v1/status")


def healthz() -> Call[t.Health]:
    """``{"status": "ok"}`` while the server serves (``GET /healthz``; no key needed)."""
    return Call("GET", "/healthz")


def readyz() -> Call[t.Readiness]:
    """Whether the server is ready (``GET /readyz``; no key needed): ``{"ready": True}``,
    or ``{"ready": False, ...}`` with the error and its ``reasons`` instead of raising."""
    return Call("GET", "/readyz", ok_statuses=(503,))


def outbox_stats() -> Call[List[t.ConsumerStats]]:
    """Per consumer: delivery counts, low watermark, oldest pending
    (``GET /v1/outbox/stats``; admin key)."""
    return Call("GET", "/v1/outbox/stats")


def jobs(
    *, state: Optional[str] = None, job_type: Optional[str] = None, limit: Optional[int] = None
) -> Call[List[t.Job]]:
    """Jobs, newest first (``GET /v1/jobs``; admin key): only those in ``state``
    (``pending``, ``running``, ``completed``, ``dead``, ...) or of ``job_type``; at most
    ``limit`` (1-10000, default 100)."""
    return Call("GET", "/v1/jobs", _some(state=state, type=job_type, limit=limit))


def _job_path(job_id: str, action: str = "") -> str:
    return f"/v1/jobs/{quote(job_id, safe='')}{action}"


def job(job_id: str) -> Call[t.Job]:
    """One job (``GET /v1/jobs/{id}``; admin key)."""
    return Call("GET", _job_path(job_id))


def cancel_job(job_id: str) -> Call[t.Job]:
    """Cancels a job (``POST /v1/jobs/{id}/cancel``; admin key): a waiting one at once, a
    running one at its next checkpoint; a finished one is a ``state_transition``
    :class:`~contextengine.ConflictError`."""
    return Call("POST", _job_path(job_id, "/cancel"))


def retry_job(job_id: str) -> Call[t.Job]:
    """Puts a dead or cancelled job back to ``pending`` (``POST /v1/jobs/{id}/retry``;
    admin key)."""
    return Call("POST", _job_path(job_id, "/retry"))


def reindex(consumer: Optional[str] = None) -> Call[t.ReindexAnswer]:
    """Rebuilds an index (``POST /v1/reindex``; admin key) and answers once its job has run;
    ``consumer`` is ``vector`` (default), ``keyword`` or ``relation``. The workers then
    re-index in the background (:meth:`wait_until_indexed`)."""
    return Call("POST", "/v1/reindex", body=_some(consumer=consumer))


def start_reindex(consumer: Optional[str] = None) -> Call[t.JobQueued]:
    """:meth:`reindex` without waiting: answers the queued job at once."""
    return Call("POST", "/v1/reindex", body=_some(consumer=consumer, no_wait=True))


# --- knowledge bases (admin key; docs/ingestion.md) ----------------------------------------


def _kb_path(base: str, action: str = "") -> str:
    return f"/v1/kb/{quote(base, safe='')}{action}"


def kb_create(
    name: str,
    *,
    root: Optional[str] = None,
    account: Optional[str] = None,
    settings: Optional[Dict[str, int]] = None,
) -> Call[t.KnowledgeBase]:
    """Creates a knowledge base (``POST /v1/kb/create``): its root defaults to
    ``ctx://{account}/resources/{name}``; ``settings`` are its chunk options
    (``max_tokens``, ``overlap_tokens``, ``min_tokens``)."""
    return Call(
        "POST",
        "/v1/kb/create",
        body=_some(name=name, root=root, account=account, settings=settings),
    )


def kb_list() -> Call[List[t.KnowledgeBase]]:
    """Every knowledge base (``GET /v1/kb``)."""
    return Call("GET", "/v1/kb")


def kb_status(base: str, *, item: Optional[str] = None) -> Call[t.KbStatus]:
    """A base's visible items by status, with their errors (``GET /v1/kb/{base}/status``);
    ``item``: that item and its subtree only."""
    return Call("GET", _kb_path(base, "/status"), _some(item=item))


def kb_add(
    base: str,
    *,
    urls: Sequence[str] = (),
    notes: Sequence[str] = (),
    paths: Sequence[str] = (),
) -> Call[t.KbAddResult]:
    """Adds URLs, notes and (server-side, under ``[ingest].allowed_paths``) paths
    (``POST /v1/kb/{base}/items``); answers once the items and their first jobs exist —
    :meth:`kb_progress` follows the work."""
    inputs = (
        [{"url": u} for u in urls]
        + [{"note": n} for n in notes]
        + [{"path": p} for p in paths]
    )
    return Call("POST", _kb_path(base, "/items"), body={"inputs": inputs})


def kb_delete_items(base: str, items: Sequence[str]) -> Call[t.KbJobs]:
    """Deletes items with their subtrees (``POST /v1/kb/{base}/items/rm``): invisible at
    once, removed by a cleanup job."""
    return Call("POST", _kb_path(base, "/items/rm"), body={"items": list(items)})


def kb_reindex(base: str, items: Sequence[str]) -> Call[t.KbJobs]:
    """Reindexes items (``POST /v1/kb/{base}/reindex``); a ``state_transition``
    :class:`~contextengine.ConflictError` unless every item of their subtrees is completed
    or failed."""
    return Call("POST", _kb_path(base, "/reindex"), body={"items": list(items)})


def kb_remove(base: str) -> Call[t.KbJobs]:
    """Removes a base with all its items and nodes (``POST /v1/kb/{base}/rm``)."""
    return Call("POST", _kb_path(base, "/rm"))


def kb_progress(
    base: str, *, roots: Sequence[str] = (), jobs: Sequence[str] = ()
) -> Call[t.KbProgress]:
    """Where the work of ``roots``' subtrees and of ``jobs`` stands
    (``POST /v1/kb/{base}/progress``): ``finished`` once the jobs ended and every item is
    completed or failed."""
    return Call(
        "POST",
        _kb_path(base, "/progress"),
        body={"roots": list(roots), "jobs": list(jobs)},
    )


def _progress_line(p: t.KbProgress) -> str:
    stages = ", ".join(f"{n} {s}" for s, n in sorted(p["by_status"].items()) if n)
    return (
        f"{p['done']}/{p['total']} items done, {p['failed']} failed ({stages or 'none'}), "
        f"{p['jobs_open']} jobs open"
    )


def kb_follow_plan(
    base: str,
    started: Union[t.KbAddResult, t.KbJobs],
    timeout: Optional[float],
    interval: float,
    on_progress: Optional[Callable[[t.KbProgress], None]],
) -> Generator[Step, Any, t.KbProgress]:
    """The polling of ``kb_follow``, free of I/O.

    Asks :func:`kb_progress` for the roots and jobs ``started`` names (the answer of
    :func:`kb_add`, or of :func:`kb_delete_items` / :func:`kb_reindex` / :func:`kb_remove`)
    every ``interval`` seconds until it is ``finished``, calling ``on_progress`` at each
    change; returns the last progress. Retryable errors (a busy or restarting server) count
    as no change; others are raised. After ``timeout`` seconds (``None``: no limit) it raises
    :class:`~contextengine.KbFollowTimeout` with the last progress.
    """
    if "roots" in started:
        roots = list(cast(t.KbJobs, started)["roots"])
    else:
        roots = [i["id"] for i in started["items"]]
    jobs = list(started["jobs"])
    deadline = None if timeout is None else time.monotonic() + timeout
    last: Optional[t.KbProgress] = None
    while True:
        try:
            p: t.KbProgress = yield kb_progress(base, roots=roots, jobs=jobs)
        except ContextEngineError as e:
            if not e.retryable:
                raise
        else:
            if p != last:
                last = p
                if on_progress is not None:
                    on_progress(p)
            if p["finished"]:
                return p
        if deadline is not None and time.monotonic() >= deadline:
            seen = _progress_line(last) if last is not None else "no progress read"
            raise KbFollowTimeout(
                f"knowledge base {base}: work not finished after {timeout} s ({seen})",
                dict(last) if last is not None else {},
            )
        yield interval


# --- waiting for the indexes -------------------------------------------------------------

Step = Union[Call[Any], float]
"""What :func:`wait_plan` asks its driver for: send a call (and send back its answer or
throw its error in), or sleep this many seconds."""

Lagging = Dict[str, int]


@dataclass(frozen=True)
class _Probe:
    """A call whose answer tells some indexes' lag."""

    call: Call[Any]
    lag_of: Callable[[Any], Lagging]
    may_vanish: bool = False
    """A ``not_found`` answer drops the probe (a key that does not see its account node)."""


REINDEX_JOBS = "reindex"
"""The :func:`wait_plan` lag entry of ``reindex`` jobs not finished yet: until one has run,
the index it rebuilds is about to be cleared and refilled."""


def _status_lag(answer: t.Status) -> Lagging:
    lag = {c["consumer"]: c["lag_events"] for c in answer.get("consumers", [])}
    jobs = answer["jobs"]["counts"] if "jobs" in answer else []
    open_states = ("pending", "running")
    lag[REINDEX_JOBS] = sum(
        c["count"] for c in jobs if c["job_type"] == "reindex" and c["state"] in open_states
    )
    return lag


def _reported_lag(answer: Union[t.SearchAnswer, t.RelatedAnswer]) -> Lagging:
    return {x["index"]: x["events"] for x in answer["lag"]}


def _tenant_probes() -> Generator[Step, Any, List[_Probe]]:
    """The probes of a tenant key: a one-hit search (the vector and keyword indexes' lag
    within its account) and ``related`` on its account node (the relation index's)."""
    accounts: List[t.NodeStat] = yield ls()
    probes = [_Probe(search("index lag probe", top_k=1), _reported_lag)]
    probes += [_Probe(related(n["uri"], limit=1), _reported_lag, True) for n in accounts]
    return probes


def wait_plan(
    timeout: float, interval: float, consumers: Optional[Sequence[str]]
) -> Generator[Step, Any, None]:
    """The polling of ``wait_until_indexed``, free of I/O.

    Asks ``status`` until every consumer (or those named) has no lag and no ``reindex`` job
    is pending or running (its rebuild has not started yet). A tenant key may not
    read ``status`` (admin only); it asks instead the lag that a search and ``related``
    report within its account. Retryable errors (the model still loading, a busy server)
    count as not indexed yet.
    """
    deadline = time.monotonic() + timeout
    probes: Optional[List[_Probe]] = [_Probe(status(), _status_lag)]
    tenant = False
    while True:
        behind: Lagging = {}
        last = ""
        for probe in list(probes or []):
            try:
                answer = yield probe.call
            except ForbiddenError:
                if tenant:
                    raise
                tenant, probes = True, None
                break
            except NotFoundError:
                if not probe.may_vanish or probes is None:
                    raise
                probes.remove(probe)
                continue
            except ContextEngineError as e:
                if not e.retryable:
                    raise
                last = str(e)
                break
            for index, events in probe.lag_of(answer).items():
                wanted = consumers is None or index in consumers or index == REINDEX_JOBS
                if events > 0 and wanted:
                    behind[index] = events
        if probes is None:
            probes = yield from _tenant_probes()
            continue
        if not behind and not last:
            return
        last = last or ", ".join(
            f"{k}: {v} {'jobs not run yet' if k == REINDEX_JOBS else 'changes pending'}"
            for k, v in sorted(behind.items())
        )
        if time.monotonic() >= deadline:
            raise IndexingTimeout(f"indexes not caught up after {timeout} s ({last})")
        yield interval
