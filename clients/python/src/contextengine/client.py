"""``Client`` (blocking) and ``AsyncClient`` (asyncio) over the ContextEngine HTTP API.

Both expose the same operations with the same arguments and answers: each method is the
operation of :mod:`contextengine._protocol` of the same name (which builds the request and
reads the answer), sent by the client's own I/O.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from types import TracebackType
from typing import (
    TYPE_CHECKING,
    Any,
    Awaitable,
    Callable,
    Generator,
    Optional,
    Sequence,
    Type,
    TypeVar,
    Union,
    cast,
)

import httpx

from . import _protocol as ops
from ._protocol import Call, Config, Step, network_error
from .errors import ContextEngineError
from .types import KbAddResult, KbJobs, KbProgress

if TYPE_CHECKING:
    from typing_extensions import Concatenate, ParamSpec

    P = ParamSpec("P")

T = TypeVar("T")


def _method(op: Callable[..., Any], method: Callable[..., Any], owner: str) -> None:
    """Gives ``method`` the name, docstring and signature of ``op`` as a method of ``owner``
    answering what ``op``'s call answers (for ``help()`` and runtime introspection)."""
    functools.update_wrapper(method, op)
    del method.__wrapped__  # type: ignore[attr-defined]
    sig = inspect.signature(op)
    answer = str(sig.return_annotation)
    if answer.startswith("Call[") and answer.endswith("]"):
        answer = answer[len("Call[") : -1]
    this = inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)
    method.__signature__ = sig.replace(  # type: ignore[attr-defined]
        parameters=[this, *sig.parameters.values()], return_annotation=answer
    )
    method.__annotations__ = {**op.__annotations__, "return": answer}
    method.__qualname__ = f"{owner}.{op.__name__}"
    method.__module__ = __name__


def _blocking(op: "Callable[P, Call[T]]") -> "Callable[Concatenate[Client, P], T]":
    """The :class:`Client` method that sends ``op``'s call and returns its answer."""

    def method(self: Client, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._run(op(*args, **kwargs))

    _method(op, method, "Client")
    return method


def _awaitable(
    op: "Callable[P, Call[T]]",
) -> "Callable[Concatenate[AsyncClient, P], Awaitable[T]]":
    """The :class:`AsyncClient` coroutine method that sends ``op``'s call."""

    async def method(self: AsyncClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self._run(op(*args, **kwargs))

    _method(op, method, "AsyncClient")
    return method


class Client:
    """A blocking client. Use it as a context manager, or call :meth:`close`::

        with Client("http://127.0.0.1:7420", api_key="...") as ce:
            ce.put("ctx://acme/docs/guide", content="...")

    Args:
        base_url: The server (default ``$CE_SERVER``, else ``http://127.0.0.1:7420``).
        api_key: Sent as ``Authorization: Bearer KEY`` (default ``$CE_API_KEY``; none when
            unset, for a server without keys).
        timeout: Seconds a request may take.
        transport: An ``httpx`` transport to send requests through (tests, proxies).

    Every method raises a :class:`~contextengine.ContextEngineError` subclass on failure.
    """

    def __init__(
        self,
        base_url: Optional[str] = None,
        *,
        api_key: Optional[str] = None,
        timeout: float = ops.DEFAULT_TIMEOUT,
        transport: Optional[httpx.BaseTransport] = None,
    ) -> None:
        config = Config.resolve(base_url, api_key)
        self.base_url = config.base_url
        self._http = httpx.Client(
            base_url=config.base_url, headers=config.headers, timeout=timeout, transport=transport
        )

    def _run(self, call: Call[T]) -> T:
        try:
            r = self._http.request(call.method, call.path, params=call.params, json=call.body)
        except httpx.TransportError as e:
            raise network_error(call, e) from e
        return call.parse(r.status_code, r.headers, r.content)

    def close(self) -> None:
        """Closes the connections."""
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()

    def wait_until_indexed(
        self,
        *,
        timeout: float = 30.0,
        interval: float = 0.05,
        consumers: Optional[Sequence[str]] = None,
    ) -> None:
        """Waits until the indexes have applied every write so far, so that a search
        finds it. Polls :meth:`status` (an admin key, or a server without keys) until no
        consumer has changes to apply and no ``reindex`` job is pending or running; a tenant
        key may not read it and polls instead the lag that a search and :meth:`related`
        report within its account. ``consumers`` limits the wait to those indexes
        (``vector``, ``keyword``, ``relation``). Retryable errors (the model still loading)
        count as not indexed yet; others are raised.

        Raises:
            IndexingTimeout: Changes were still pending after ``timeout`` seconds.
        """
        self._drive(ops.wait_plan(timeout, interval, consumers))

    def kb_follow(
        self,
        base: str,
        started: Union[KbAddResult, KbJobs],
        *,
        timeout: Optional[float] = None,
        interval: float = 0.25,
        on_progress: Optional[Callable[[KbProgress], None]] = None,
    ) -> KbProgress:
        """Follows the work an entry started to its end: ``started`` is the answer of
        :meth:`kb_add` (its items and jobs), :meth:`kb_delete_items`, :meth:`kb_reindex` or
        :meth:`kb_remove`. Polls :meth:`kb_progress` every ``interval`` seconds, calls
        ``on_progress`` with each new progress (items done / total, failed, items by
        status — the stage —, jobs open) and returns the last one, ``finished``. Retryable
        errors count as no change. The work goes on in the server whatever the caller does.

        Raises:
            KbFollowTimeout: Not finished after ``timeout`` seconds (``None``: no limit);
                its ``progress`` is the last one read.
        """
        return self._drive(ops.kb_follow_plan(base, started, timeout, interval, on_progress))

    def _drive(self, plan: Generator[Step, Any, T]) -> T:
        """Runs a polling plan of :mod:`contextengine._protocol`: sends its calls (their
        answers or errors go back in), sleeps its pauses, returns what it returns."""
        step: Step = next(plan)
        try:
            while True:
                if isinstance(step, Call):
                    try:
                        answer = self._run(step)
                    except ContextEngineError as e:
                        step = plan.throw(e)
                        continue
                    step = plan.send(answer)
                else:
                    time.sleep(step)
                    step = plan.send(None)
        except StopIteration as done:
            return cast(T, done.value)

    put = _blocking(ops.put)
    cat = _blocking(ops.cat)
    stat = _blocking(ops.stat)
    ls = _blocking(ops.ls)
    tree = _blocking(ops.tree)
    rm = _blocking(ops.rm)
    mv = _blocking(ops.mv)
    link = _blocking(ops.link)
    unlink = _blocking(ops.unlink)
    relations = _blocking(ops.relations)
    related = _blocking(ops.related)
    search = _blocking(ops.search)
    hierarchical_search = _blocking(ops.hierarchical_search)
    status = _blocking(ops.status)
    healthz = _blocking(ops.healthz)
    readyz = _blocking(ops.readyz)
    outbox_stats = _blocking(ops.outbox_stats)
    jobs = _blocking(ops.jobs)
    job = _blocking(ops.job)
    cancel_job = _blocking(ops.cancel_job)
    retry_job = _blocking(ops.retry_job)
    reindex = _blocking(ops.reindex)
    start_reindex = _blocking(ops.start_reindex)
    kb_create = _blocking(ops.kb_create)
    kb_list = _blocking(ops.kb_list)
    kb_status = _blocking(ops.kb_status)
    kb_add = _blocking(ops.kb_add)
    kb_delete_items = _blocking(ops.kb_delete_items)
    kb_reindex = _blocking(ops.kb_reindex)
    kb_remove = _blocking(ops.kb_remove)
    kb_progress = _blocking(ops.kb_progress)


class AsyncClient:
    """An asyncio client: the methods of :class:`Client`, as coroutines::

        async with AsyncClient(api_key="...") as ce:
            hits = (await ce.search("dark mode", mode="hybrid"))["hits"]

    Takes the arguments of :class:`Client` (``transport`` an ``httpx.AsyncBaseTransport``).
    """

    def __init__(
        self,
        base_url: Optional[str] = None,
        *,
        api_key: Optional[str] = None,
        timeout: float = ops.DEFAULT_TIMEOUT,
        transport: Optional[httpx.AsyncBaseTransport] = None,
    ) -> None:
        config = Config.resolve(base_url, api_key)
        self.base_url = config.base_url
        self._http = httpx.AsyncClient(
            base_url=config.base_url, headers=config.headers, timeout=timeout, transport=transport
        )

    async def _run(self, call: Call[T]) -> T:
        try:
            r = await self._http.request(
                call.method, call.path, params=call.params, json=call.body
            )
        except httpx.TransportError as e:
            raise network_error(call, e) from e
        return call.parse(r.status_code, r.headers, r.content)

    async def aclose(self) -> None:
        """Closes the connections."""
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        await self.aclose()

    async def wait_until_indexed(
        self,
        *,
        timeout: float = 30.0,
        interval: float = 0.05,
        consumers: Optional[Sequence[str]] = None,
    ) -> None:
        """:meth:`Client.wait_until_indexed`, without blocking the event loop."""
        await self._drive(ops.wait_plan(timeout, interval, consumers))

    async def kb_follow(
        self,
        base: str,
        started: Union[KbAddResult, KbJobs],
        *,
        timeout: Optional[float] = None,
        interval: float = 0.25,
        on_progress: Optional[Callable[[KbProgress], None]] = None,
    ) -> KbProgress:
        """:meth:`Client.kb_follow`, without blocking the event loop."""
        return await self._drive(
            ops.kb_follow_plan(base, started, timeout, interval, on_progress)
        )

    async def _drive(self, plan: Generator[Step, Any, T]) -> T:
        """:meth:`Client._drive`, awaiting the calls and the pauses."""
        step: Step = next(plan)
        try:
            while True:
                if isinstance(step, Call):
                    try:
                        answer = await self._run(step)
                    except ContextEngineError as e:
                        step = plan.throw(e)
                        continue
                    step = plan.send(answer)
                else:
                    await asyncio.sleep(step)
                    step = plan.send(None)
        except StopIteration as done:
            return cast(T, done.value)

    put = _awaitable(ops.put)
    cat = _awaitable(ops.cat)
    stat = _awaitable(ops.stat)
    ls = _awaitable(ops.ls)
    tree = _awaitable(ops.tree)
    rm = _awaitable(ops.rm)
    mv = _awaitable(ops.mv)
    link = _awaitable(ops.link)
    unlink = _awaitable(ops.unlink)
    relations = _awaitable(ops.relations)
    related = _awaitable(ops.related)
    search = _awaitable(ops.search)
    hierarchical_search = _awaitable(ops.hierarchical_search)
    status = _awaitable(ops.status)
    healthz = _awaitable(ops.healthz)
    readyz = _awaitable(ops.readyz)
    outbox_stats = _awaitable(ops.outbox_stats)
    jobs = _awaitable(ops.jobs)
    job = _awaitable(ops.job)
    cancel_job = _awaitable(ops.cancel_job)
    retry_job = _awaitable(ops.retry_job)
    reindex = _awaitable(ops.reindex)
    start_reindex = _awaitable(ops.start_reindex)
    kb_create = _awaitable(ops.kb_create)
    kb_list = _awaitable(ops.kb_list)
    kb_status = _awaitable(ops.kb_status)
    kb_add = _awaitable(ops.kb_add)
    kb_delete_items = _awaitable(ops.kb_delete_items)
    kb_reindex = _awaitable(ops.kb_reindex)
    kb_remove = _awaitable(ops.kb_remove)
    kb_progress = _awaitable(ops.kb_progress)
