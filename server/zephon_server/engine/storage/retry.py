"""Retrying object-store requests: bounded concurrency, exponential backoff with full jitter.

Every request a store makes goes through :meth:`Requests.call`: it waits for one of the
store's ``max_concurrency`` slots (a semaphore per store and process), makes the attempt,
counts it (:mod:`.metrics`), and on a retryable failure sleeps a uniform draw from
``[0, min(cap, base * 2**(k-1)))`` before attempt ``k + 1`` ("full jitter": throttled
clients spread out instead of retrying in lock step). The SDK's own retries are off, so
every attempt is seen here.

Retryable: throttling (HTTP 429, 503, ``SlowDown``), other 5xx answers, and connection
resets, refusals and timeouts. Not retryable: a missing object or bucket, denied access or
bad credentials, and anything unrecognised. After the last attempt the request fails with a
:class:`StorageRequestError` (a :class:`~..errors.DataError`, so a dataset's ``on_error``
decides) naming the URL, the operation, the attempts made and the last answer.
"""

from __future__ import annotations

import logging
import random
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from ..errors import DataError
from .metrics import StorageStats, storage_stats

logger = logging.getLogger(__name__)
_T = TypeVar("_T")

RETRYABLE: frozenset[str] = frozenset({"throttled", "server_error", "network"})
_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("not_found", re.compile(r"NO_SUCH_(KEY|BUCKET|UPLOAD)|HTTP status 404|Path does not exist")),
    (
        "denied",
        re.compile(
            r"ACCESS_DENIED|INVALID_ACCESS_KEY_ID|SIGNATURE_DOES_NOT_MATCH|EXPIRED_TOKEN|"
            r"INVALID_TOKEN|InvalidAccessKeyId|AccessDenied|HTTP status 40[13]|"
            r"No response body.*40[13]|credentials|OAuth2 access token",
            re.IGNORECASE,
        ),
    ),
    (
        "throttled",
        re.compile(
            r"SLOW_DOWN|SlowDown|THROTTL|Throttl|TooManyRequests|REQUEST_LIMIT_EXCEEDED|"
            r"SERVICE_UNAVAILABLE|HTTP status (429|503)"
        ),
    ),
    ("server_error", re.compile(r"INTERNAL_FAILURE|InternalError|HTTP status 5\d\d")),
    (
        "network",
        re.compile(
            r"NETWORK_CONNECTION|curlCode|[Cc]onnection (reset|refused|aborted)|"
            r"REQUEST_TIMEOUT|[Tt]imed? ?out|Broken pipe|short read",
        ),
    ),
)


class StorageRequestError(DataError):
    """An object-store request failed for good (its retries used up, or not retryable)."""

    def __init__(self, url: str, operation: str, attempts: int, outcome: str, last: str) -> None:
        self.url = url
        self.operation = operation
        self.attempts = attempts
        self.outcome = outcome
        self.last = last
        tries = f"after {attempts} attempts" if attempts > 1 else "on the first attempt"
        super().__init__(
            f"storage request failed: {operation} {url} {tries} ({outcome}); last answer: "
            f"{last}{_fix(outcome, url, last)}"
        )

    def __reduce__(self) -> tuple[type, tuple[str, str, int, str, str]]:
        return (type(self), (self.url, self.operation, self.attempts, self.outcome, self.last))


#: The fix of a denied gs:// request (Google's credentials are not AWS's).
GCS_CREDENTIALS_FIX = (
    "check the credentials: GOOGLE_APPLICATION_CREDENTIALS or `gcloud auth "
    "application-default login`; or read the bucket through Google's S3-compatible endpoint: "
    "s3:// with AWS_ENDPOINT_URL=https://storage.googleapis.com and HMAC keys"
)


def is_gcs(url: str) -> bool:
    """Whether ``url`` is a Google Cloud Storage URL (``gs://`` or ``gcs://``)."""
    return url.split("://")[0].lower() in ("gs", "gcs")


#: What the AWS SDK says when an answer is longer than the range asked for: the error body of
#: a refused GET of a few hundred bytes overflows the buffer of the range, which hides the
#: status (a 403 or 404 then reads like a server failure, and is retried as one).
_ANSWER_TOO_LONG = "Failed to flush response stream"


def _fix(outcome: str, url: str = "", last: str = "") -> str:
    if _ANSWER_TOO_LONG in last:
        return (
            " (the store answered a GET of a small range with more bytes than asked, which hides "
            "the answer's status: throttling, or a GET refused while HEAD succeeds, e.g. "
            "AccessDenied for an SSE-KMS object without kms:Decrypt or an archived object, or "
            "an endpoint that ignores Range; check the object with `aws s3 cp URL -`)"
        )
    if outcome == "denied" and is_gcs(url):
        return f" ({GCS_CREDENTIALS_FIX})"
    if outcome in RETRYABLE:
        return (
            " (the store is throttling or failing: lower storage_options.max_concurrency, raise "
            "retry_attempts (the default 6 backs off 3.1 s at most in all), or use on_error: "
            "skip to skip and count its rows)"
        )
    if outcome == "denied":
        return (
            " (check the credentials: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or storage_options)"
        )
    return ""


def classify(exc: BaseException) -> str:
    """The outcome a failed attempt counts as (see :data:`~.metrics.OUTCOMES`)."""
    if isinstance(exc, FileNotFoundError):
        return "not_found"
    if isinstance(exc, PermissionError):
        return "denied"
    if isinstance(exc, ConnectionError | TimeoutError):
        return "network"
    text = str(exc)
    for outcome, pattern in _PATTERNS:
        if pattern.search(text):
            return outcome
    return "error"


_UNDERLYING = re.compile(r"The underlying error message was: (.+?)(?: error_info=|$)")


def one_line(exc: BaseException) -> str:
    """An exception's message on one line (SDK messages may span several)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    cause = _UNDERLYING.search(text)  # Google's client puts the cause after a long preamble
    if cause:
        text = f"{cause.group(1)} ({text})"
    return text if len(text) <= 400 else text[:397] + "..."


def _store_errors() -> tuple[type[BaseException], ...]:
    """What a failed request raises: ``OSError`` mostly, ``ValueError``, and pyarrow's bare
    ``ArrowException`` (Google's client reports a credentials file it cannot read so)."""
    from pyarrow.lib import ArrowException

    return (OSError, ValueError, ArrowException)


@dataclass(frozen=True)
class RetryPolicy:
    """Attempts per request and the backoff's base and cap in seconds."""

    attempts: int
    base_s: float
    cap_s: float

    def delay(self, retry: int, draw: Callable[[], float] = random.random) -> float:
        """The sleep before retry number ``retry`` (1-based): full jitter."""
        return draw() * min(self.cap_s, self.base_s * (2 ** (retry - 1)))


class Requests:
    """One store's request gate: its concurrency slots, retry policy and counters."""

    def __init__(
        self,
        policy: RetryPolicy,
        max_concurrency: int,
        stats: StorageStats | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.policy = policy
        self.max_concurrency = max_concurrency
        self._slots = threading.BoundedSemaphore(max_concurrency)
        self._stats = stats if stats is not None else storage_stats()
        self._sleep = sleep

    def call(
        self,
        operation: str,
        url: str,
        attempt: Callable[[], _T],
        nbytes: Callable[[_T], int] = lambda _: 0,
    ) -> _T:
        """``attempt()`` with retries; :class:`StorageRequestError` when it fails for good.

        ``nbytes(result)`` is what a successful attempt read (counted as bytes read)."""
        tries = 0
        while True:
            tries += 1
            started = time.perf_counter()
            with self._slots:
                try:
                    result = attempt()
                except _store_errors() as exc:
                    outcome = classify(exc)
                    self._stats.request(operation, outcome, time.perf_counter() - started)
                    if outcome not in RETRYABLE or tries >= self.policy.attempts:
                        raise StorageRequestError(
                            url, operation, tries, outcome, one_line(exc)
                        ) from exc
                    last = exc
                else:
                    self._stats.request(
                        operation, "ok", time.perf_counter() - started, nbytes(result)
                    )
                    return result
            delay = self.policy.delay(tries)
            logger.debug(
                "%s %s: attempt %d failed (%s), retrying in %.3fs",
                operation,
                url,
                tries,
                last,
                delay,
            )
            self._stats.retry(operation)
            self._sleep(delay)
