"""Reads of object storage that may fail for a while: which faults are worth retrying, the
capped backoff, and what to say when retries run out.

Why one place: listing a bucket, reading the footers for the index and reading row
groups meet the same faults -- throttling (S3's 503 SlowDown), connection resets,
timeouts -- and each must retry them alike and name them alike when they last: a
throttled store is not a broken file, and an object rewritten under the job (s3fs's
``FileExpired``: its ETag changed) is neither, and is never retried.

Example:
    >>> calls = []
    >>> def flaky():
    ...     calls.append(1)
    ...     if len(calls) < 3:
    ...         raise ConnectionResetError("reset by peer")
    ...     return "ok"
    >>> retrying(flaky, "reading x", backoff_s=0.0)
    'ok'
"""

from __future__ import annotations

import errno
import re
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ..errors import PipelineError, SourceChanged, StorageThrottled

__all__ = ["ATTEMPTS", "expired", "retrying", "throttled", "transient"]

T = TypeVar("T")

#: attempts per read, and the backoff between them (doubling, capped)
ATTEMPTS = 6
BACKOFF_S, MAX_BACKOFF_S = 0.05, 5.0
# status codes only where a message shows them as codes: a path may hold "503" too
_THROTTLED = re.compile(
    r"SlowDown|Service ?Unavailable|reduce your request rate|TooManyRequests|Throttl"
    r"|RequestLimitExceeded|\((?:503|429)\)|\b(?:HTTP|[Ss]tatus)[ =:]*(?:503|429)\b"
)
_TRANSIENT = re.compile(
    _THROTTLED.pattern + r"|Connection reset|reset by peer|ServerDisconnected|timed out|Timeout"
)
_NEVER = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)
_TRANSIENT_ERRNOS = {errno.EBUSY, errno.EAGAIN, errno.ECONNRESET, errno.ETIMEDOUT}


def _chain(e: BaseException | None):
    seen = 0
    while e is not None and seen < 8:
        yield e
        e, seen = e.__cause__ or e.__context__, seen + 1


def expired(e: BaseException | None) -> bool:
    """The object changed since its listing (s3fs's ``FileExpired``, an HTTP 412 on an
    ``If-Match``): a rewrite, never worth retrying."""
    return any(
        type(x).__name__ == "FileExpired" or "PreconditionFailed" in str(x) for x in _chain(e)
    )


def throttled(e: BaseException | None) -> bool:
    """The store asked us to slow down (503 SlowDown, 429)."""
    return transient(e) and any(_THROTTLED.search(f"{type(x).__name__}: {x}") for x in _chain(e))


def transient(e: BaseException | None) -> bool:
    """Throttling, resets and timeouts: worth retrying the same read. (s3fs reports S3's
    SlowDown as ``OSError(EBUSY)``, and a rewritten object with EBUSY too: that one is
    not transient.)"""
    if e is None or isinstance(e, _NEVER) or expired(e):
        return False
    for x in _chain(e):
        if isinstance(x, (ConnectionError, TimeoutError)):
            return True
        if isinstance(x, OSError) and x.errno in _TRANSIENT_ERRNOS:
            return True
        if _TRANSIENT.search(f"{type(x).__name__}: {x}"):
            return True
    return False


def retrying(
    fn: Callable[[], T],
    what: str,
    *,
    attempts: int | None = None,
    backoff_s: float | None = None,
    on_retry: Callable[[BaseException], Any] | None = None,
    operator: str = "fetch",
) -> T:
    """``fn()``, called again after a transient failure (capped exponential backoff),
    up to ``attempts`` times in all. ``what`` names the read in the errors ("reading the
    footer of s3://b/x.parquet").

    Raises:
        StorageThrottled: the store still throttled the last attempt.
        PipelineError: another transient fault outlasted the attempts.
        SourceChanged: the object was rewritten (never retried).
        Exception: anything else ``fn`` raises, unchanged.
    """
    attempts = ATTEMPTS if attempts is None else attempts
    delay = BACKOFF_S if backoff_s is None else backoff_s
    waited, attempt = 0.0, 1
    while True:
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - classified below, re-raised if not transient
            if expired(e):
                raise SourceChanged(
                    f"{what}: the object was rewritten after it was listed ({e}): restore "
                    "it, or start a new run over the new data (a checkpoint of this run "
                    "would not restore over it)",
                    operator=operator,
                ) from e
            if not transient(e):
                raise
            if attempt >= attempts:
                raise exhausted(what, e, attempts, waited, operator) from e
            if on_retry is not None:
                on_retry(e)
        time.sleep(delay)  # backoff before the same read again
        waited += delay
        delay = min(2 * delay, MAX_BACKOFF_S)
        attempt += 1


def exhausted(
    what: str, e: BaseException, attempts: int, waited: float, operator: str
) -> PipelineError:
    """The error for a transient fault that outlasted ``attempts`` tries."""
    if throttled(e):
        return StorageThrottled(
            f"{what}: the object store throttled {attempts} attempts in a row over "
            f"{waited:.1f} s ({type(e).__name__}: {e}). The data may be fine; the store "
            "limited the request rate. Retry later, or read with fewer requests at once "
            "(fewer DataLoader workers or ranks, a lower fetch parallelism), keep the index "
            "with index_path= so footers are read once, read through disk_cache=, or let "
            "the client retry longer (for s3fs: storage_options={'config_kwargs': "
            "{'retries': {'max_attempts': 10, 'mode': 'adaptive'}}})",
            operator=operator,
        )
    return PipelineError(
        f"{what} failed {attempts} times: {type(e).__name__}: {e}", operator=operator
    )
