"""The answers of the ContextEngine HTTP API, as :class:`typing.TypedDict` types.

The client returns the server's JSON documents unchanged (plain ``dict`` and ``list``
values); these ``TypedDict`` types describe them for type checkers and editors. They match
``docs/http-api.md`` (the JSON ``ce --json`` prints for the same command). Keys the server
only sometimes sends are in a ``total=False`` base class; a newer server may add keys, which
are kept.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, TypedDict

__all__ = [
    "CatAnswer",
    "Edge",
    "EmbedCache",
    "Fallback",
    "FlatHit",
    "Health",
    "HierarchicalAnswer",
    "HierarchicalHit",
    "HierarchicalStats",
    "IndexLag",
    "Job",
    "JobCount",
    "JobQueued",
    "JobsStatus",
    "KbAddResult",
    "KbFailure",
    "KbItem",
    "KbJobs",
    "KbProgress",
    "KbOverview",
    "KbStatus",
    "KnowledgeBase",
    "KnowledgeStatus",
    "ConsumerStats",
    "ConsumerStatus",
    "NodeStat",
    "PathStep",
    "Readiness",
    "ReindexAnswer",
    "RelatedAnswer",
    "RelatedEdge",
    "Relations",
    "SearchAnswer",
    "Status",
    "WriteOutcome",
]


class _WriteOutcomeOptional(TypedDict, total=False):
    layers_removed: List[int]
    """Layers a ``replace`` put emptied because it did not give them (e.g. ``[0, 1]``)."""


class WriteOutcome(_WriteOutcomeOptional):
    """The answer of every write (``put``, ``rm``, ``mv``, ``link``, ``unlink``)."""

    uri: str
    version: int
    changed: bool
    event_ids: List[str]
    nodes_affected: int
    trace_id: str


class Fallback(TypedDict):
    """The layer search indexes instead of an empty one (its first ``max_chars``)."""

    level: int
    max_chars: int


class _CatAnswerOptional(TypedDict, total=False):
    fallback: Fallback


class CatAnswer(_CatAnswerOptional):
    """One layer of a node (``cat``): ``text`` is the layer exactly as stored."""

    uri: str
    level: int
    version: int
    content_hash: str
    text: str


class NodeStat(TypedDict):
    """A node's attributes (``stat``, and each entry of ``ls`` and ``tree``).

    ``layer_bytes`` are the sizes of L0, L1 and L2; ``kind`` is ``account``,
    ``container`` or ``leaf`` (derived from the tree).
    """

    uri: str
    parent_uri: Optional[str]
    context_type: str
    category: str
    owner_space: str
    version: int
    content_hash: str
    relation_version: int
    layer_bytes: List[int]
    children: int
    kind: str
    meta: Dict[str, Any]
    created_at_ms: int
    updated_at_ms: int


class Edge(TypedDict):
    """A stored relation (``relations``)."""

    from_uri: str
    to_uri: str
    relation_type: str
    weight: float
    reason: str


class Relations(TypedDict):
    """A node's edges from the source of truth (``relations``)."""

    outgoing: List[Edge]
    incoming: List[Edge]


class IndexLag(TypedDict):
    """Changes within the request's scope an index has not applied yet.

    ``capped``: over 1000 changes are pending and ``events`` is a lower bound.
    """

    index: str
    events: int
    capped: bool
    oldest_age_seconds: float


class RelatedEdge(Edge):
    """An edge from the relation index (``related``): ``other`` is the far end."""

    direction: str
    other: str
    abstract: str


class RelatedAnswer(TypedDict):
    """The answer of ``related``: edges strongest first, and the relation index's lag."""

    uri: str
    edges: List[RelatedEdge]
    dropped_by_hydration: int
    lag: List[IndexLag]
    took_ms: float


class _FlatHitOptional(TypedDict, total=False):
    ranks: Dict[str, Optional[int]]
    """Hybrid mode only: the hit's rank in each mode (``None`` where a mode missed it)."""


class FlatHit(_FlatHitOptional):
    """One hit of a vector, keyword or hybrid search (per node, its best level)."""

    uri: str
    parent_uri: Optional[str]
    level: int
    record_id: str
    score: float
    abstract: str
    version: int
    context_type: str
    kind: str
    category: str


class _SearchAnswerOptional(TypedDict, total=False):
    fusion: str
    """Hybrid mode only, e.g. ``"rrf k=60, vector×1, keyword×1"``."""


class SearchAnswer(_SearchAnswerOptional):
    """The answer of a vector, keyword or hybrid search.

    ``mode`` is the mode asked for, ``mode_used`` the one that ran and ``notice`` why they
    differ. ``lag`` has one entry per index the search read.
    """

    mode: str
    mode_used: str
    notice: Optional[str]
    hits: List[FlatHit]
    candidates: int
    dropped_by_hydration: int
    model: Optional[str]
    lag: List[IndexLag]
    timings: Dict[str, float]


class PathStep(TypedDict):
    """An ancestor on a hierarchical hit's path."""

    uri: str
    abstract: str
    score: float


class HierarchicalHit(TypedDict):
    """One hit of a hierarchical search: ``score`` mixes ``own_score`` with its path's."""

    uri: str
    score: float
    own_score: float
    level: int
    record_id: str
    abstract: str
    version: int
    path: List[PathStep]
    drill_down: List[int]


class HierarchicalStats(TypedDict, total=False):
    """What a hierarchical descent did (containers expanded, searches run, timings)."""

    containers_expanded: int
    index_searches: int
    converged: bool
    embed_ms: float
    descend_ms: float
    hydrate_ms: float
    total_ms: float


class HierarchicalAnswer(TypedDict):
    """The answer of a hierarchical search (``docs/retrieval.md``)."""

    hits: List[HierarchicalHit]
    dropped_by_hydration: int
    model: Optional[str]
    lag: List[IndexLag]
    stats: HierarchicalStats


class ConsumerStats(TypedDict):
    """One consumer's delivery counts (``outbox_stats``)."""

    consumer: str
    pending: int
    claimed: int
    retry_wait: int
    done: int
    dead: int
    low_watermark_seq: Optional[int]
    oldest_pending_created_at_ms: Optional[int]
    last_error: Optional[Dict[str, Any]]


class ConsumerStatus(ConsumerStats):
    """One consumer in ``status``: its counts, lag and validation state.

    ``lag_events`` = pending + claimed + retry_wait; ``validation`` is ``blocked``,
    ``partial``, ``delta_valid`` or ``applied_valid``.
    """

    lag_events: int
    lag_seconds: float
    validation: str
    validation_reason: str
    applied: bool


class EmbedCache(TypedDict, total=False):
    """The embedding cache's size and this server's counters."""

    entries: int
    all_entries: int
    bytes: int
    hits: int
    misses: int
    duplicates: int
    provider_calls: int
    texts_embedded: int
    cache_errors: int


class JobCount(TypedDict):
    """Jobs of one type in one state."""

    job_type: str
    state: str
    count: int


class JobsStatus(TypedDict):
    """The durable jobs in ``status``: per state, and per type and state."""

    enabled: bool
    runner: bool
    types: List[str]
    by_state: Dict[str, int]
    counts: List[JobCount]


class Status(TypedDict, total=False):
    """The answer of ``status`` (admin): readiness, model, indexes, workers, consumers.

    Declared ``total=False``: some keys depend on the server's configuration.
    """

    ready: bool
    not_ready: List[str]
    data_dir: str
    store_backend: str
    store_location: str
    vector_destination: str
    model: Dict[str, Any]
    index_model: Optional[Dict[str, Any]]
    index_records: int
    keyword_records: int
    relation_records: int
    consumers: List[ConsumerStatus]
    workers: int
    worker_consumers: List[str]
    embed_cache: EmbedCache
    holds: List[Dict[str, Any]]
    jobs: JobsStatus
    kb: KnowledgeStatus


class Health(TypedDict):
    """The answer of ``healthz``: ``{"status": "ok"}``."""

    status: str


class Readiness(TypedDict, total=False):
    """The answer of ``readyz``: ``ready``, and when not ready the error and ``reasons``."""

    ready: bool
    code: str
    message: str
    retryable: bool
    reasons: List[str]


class Job(TypedDict):
    """A job (``jobs``, ``job``, ``cancel_job``, ``retry_job``; ``docs/jobs.md``)."""

    id: str
    job_type: str
    payload: Any
    idempotency_key: Optional[str]
    state: str
    attempts: int
    run_at_ms: Optional[int]
    claimed_by: Optional[str]
    claimed_until_ms: Optional[int]
    parent_job_id: Optional[str]
    progress: Any
    cancel_requested: bool
    error_code: Optional[str]
    last_error: Optional[str]
    created_at_ms: int
    updated_at_ms: int
    started_at_ms: Optional[int]
    finished_at_ms: Optional[int]


class JobQueued(TypedDict):
    """A ``reindex`` with ``no_wait=True``: the job, and whether this request created it."""

    job_id: str
    created: bool
    job: Job


class ReindexAnswer(TypedDict):
    """A ``reindex`` whose job has run: its report and the job's id."""

    consumer: str
    cleared_records: int
    requeued: int
    model: Optional[Dict[str, Any]]
    took_ms: float
    job_id: str


class KnowledgeBase(TypedDict):
    """A knowledge base (``kb_create``, ``kb_list``; ``docs/ingestion.md``)."""

    name: str
    root: str
    settings: Dict[str, Any]
    status: str
    created_at_ms: int
    updated_at_ms: int


class KbItem(TypedDict):
    """An item: one input and the nodes it produced, with its durable status."""

    base: str
    id: str
    parent_id: Optional[str]
    kind: str
    source: str
    node_uri: str
    status: str
    error: Optional[Dict[str, str]]
    through_seq: Optional[int]
    fingerprint: Optional[str]
    """A file's: a digest of its stat and of the reading settings its nodes were made from
    (a re-sync does not read a completed file whose fingerprint is unchanged)."""
    created_at_ms: int
    updated_at_ms: int


class KbStatus(TypedDict):
    """A base and its visible items by status (``kb_status``)."""

    base: KnowledgeBase
    counts: Dict[str, int]
    done: int
    total: int
    items: List[KbItem]
    token_counter: str


class KbFailure(TypedDict):
    """A failed item in ``status`` (``kb.bases[].recent_failures``)."""

    id: str
    kind: str
    node_uri: str
    error: Dict[str, str]
    at_ms: int


class KbOverview(TypedDict):
    """A base in ``status``: its items by status and its latest failures, newest first."""

    name: str
    root: str
    status: str
    counts: Dict[str, int]
    recent_failures: List[KbFailure]


class KnowledgeStatus(TypedDict):
    """The ``kb`` section of ``status``: every base, and the workflow's jobs not ended per
    type."""

    bases: List[KbOverview]
    active_jobs: Dict[str, int]


class KbAddResult(TypedDict):
    """The new items and their first jobs (``kb_add``)."""

    items: List[KbItem]
    jobs: List[str]


class KbJobs(TypedDict):
    """The folded roots and the jobs an entry enqueued (``kb_delete_items``, ``kb_reindex``,
    ``kb_remove``)."""

    roots: List[str]
    jobs: List[str]


class KbProgress(TypedDict):
    """Where an entry's work stands (``kb_progress``)."""

    done: int
    total: int
    failed: int
    by_status: Dict[str, int]
    jobs_open: int
    finished: bool
