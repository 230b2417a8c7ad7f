"""Failures talking to an agent -> ``toolwire.ToolError`` with a kind classifiers understand."""

from __future__ import annotations

import re
from typing import Any

import httpx
from a2a.client.errors import A2AClientError, A2AClientTimeoutError
from a2a.utils.errors import (
    JSON_RPC_ERROR_CODE_MAP,
    A2AError,
    InternalError,
    InvalidAgentResponseError,
    InvalidParamsError,
    InvalidRequestError,
    MethodNotFoundError,
    TaskNotCancelableError,
    TaskNotFoundError,
    VersionNotSupportedError,
)

from toolwire import ErrorKind, ToolError, parse_retry_after

from ._limits import AnswerTooLarge, AnswerUndecodable, RedirectRefused

__all__ = ["map_error", "retry_after"]

_RPC_CODE = re.compile(r"JSON-RPC Error (-?\d+):\s*(.*)", re.DOTALL)


def retry_after(response: httpx.Response, now: float | None = None) -> float | None:
    """``Retry-After`` in seconds: delta seconds or an HTTP-date (RFC 9110), or None.

    ``now``: epoch seconds the date is measured from (default: the wall clock).
    """
    return parse_retry_after(response.headers.get("retry-after"), now)


def _cause(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    seen = 0
    cur: BaseException | None = exc
    while cur is not None and seen < 10:
        if isinstance(cur, kind):
            return cur
        cur = cur.__cause__
        seen += 1
    return None


def _internal_error(response: httpx.Response) -> str | None:
    """The message of an HTTP 500 that is the agent's own ``google.rpc.Status`` with
    status ``INTERNAL`` (how an A2A REST server answers when its executor raised), or None
    (any other answer: a proxy's page, an outage)."""
    if response.status_code != 500:
        return None
    try:
        body = response.json()
    except (ValueError, httpx.ResponseNotRead):
        return None
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict) or error.get("status") != "INTERNAL":
        return None
    message = error.get("message")
    return message if isinstance(message, str) and message else "no reason given"


def _status_error(exc: httpx.HTTPStatusError, agent: str, action: str) -> ToolError:
    status = exc.response.status_code
    where = f"agent {agent!r}: {action}"
    details: dict[str, Any] = {"agent": agent}
    if status in (401, 403):
        return ToolError(
            f"{where} was refused with HTTP {status}; give the agent's credentials in "
            f"[plugins.a2a] agents (bearer_token or headers)",
            kind=ErrorKind.AUTH,
            status=status,
            details=details,
        )
    if status == 429:
        return ToolError(
            f"{where} was rate limited (HTTP 429); try again later",
            kind=ErrorKind.RATE_LIMIT,
            status=status,
            retry_after_s=retry_after(exc.response),
            details=details,
        )
    if status in (404, 408, 410) or status >= 500:
        return ToolError(
            f"{where} failed with HTTP {status}: the agent's endpoint is not available; "
            f"try again later or check the agent's URL",
            kind=ErrorKind.UNAVAILABLE,
            status=status,
            retry_after_s=retry_after(exc.response),
            details=details,
        )
    return ToolError(
        f"{where} failed with HTTP {status}",
        kind=ErrorKind.TOOL_ERROR,
        status=status,
        details=details,
    )


def _a2a_error(exc: A2AError, agent: str, where: str, details: dict[str, Any]) -> ToolError:
    """The ``ToolError`` for an A2A error the agent answered (JSON-RPC, or REST's
    ``google.rpc.Status`` the SDK maps back to the same errors)."""
    code = JSON_RPC_ERROR_CODE_MAP.get(type(exc))
    if code is not None:
        details["code"] = code
    if exc.data:
        details["data"] = exc.data
    text = exc.message or str(exc)
    if isinstance(exc, TaskNotFoundError):
        return ToolError(
            f"{where}: the agent has no such task ({text}); it may have expired — start a "
            f"new one with agent_{agent}",
            kind=ErrorKind.NOT_FOUND,
            details=details,
        )
    if isinstance(exc, TaskNotCancelableError):
        return ToolError(
            f"{where}: the task cannot be canceled ({text})",
            kind=ErrorKind.CONFLICT,
            details=details,
        )
    if isinstance(exc, (InvalidParamsError, InvalidRequestError)):
        return ToolError(
            f"{where}: the agent rejected the request as invalid: {text}",
            kind=ErrorKind.INVALID_ARGS,
            details=details,
        )
    if isinstance(exc, (InternalError, InvalidAgentResponseError)):
        # The agent had the request and failed while carrying it out: it may have acted
        # (``in_flight``: not to be repeated, whatever its text suggests to a classifier).
        details["in_flight"] = True
        return ToolError(f"{where}: the agent failed: {text}", details=details)
    if isinstance(exc, VersionNotSupportedError):
        return ToolError(
            f"{where}: the agent does not speak the protocol version its card announced "
            f"({text}); check the card's supportedInterfaces",
            details=details,
        )
    return ToolError(f"{where}: the agent answered an error: {text}", details=details)


def map_error(exc: BaseException, agent: str, action: str) -> ToolError:
    """The ``ToolError`` for ``exc``, raised while doing ``action`` with ``agent``.

    an answer over ``max_answer_bytes`` -> ``tool_error`` with ``details.answer_too_large``;
    an answer that cannot be read (a coding not supported, a stream not in UTF-8) ->
    ``tool_error`` with ``details.reason = "undecodable_answer"``;
    a redirect to another origin -> ``tool_error`` with ``details.reason = "redirect_refused"``;
    unreachable (connection refused, DNS, HTTP 404/5xx) -> ``unavailable``;
    timeouts -> ``timeout``; HTTP 401/403 -> ``auth``; HTTP 429 ->
    ``rate_limit``; JSON-RPC -32001 TaskNotFound -> ``not_found``; -32002
    TaskNotCancelable -> ``conflict``; -32600/-32602 -> ``invalid_args``;
    -32603 from the agent -> ``tool_error`` carrying the agent's text; any
    other A2A error -> ``tool_error`` with its code in ``details``. Over HTTP+JSON
    the A2A error in the body decides, not the HTTP status it came with; an HTTP 500
    with the agent's ``google.rpc.Status`` ``INTERNAL`` is -32603.
    """
    where = f"agent {agent!r}: {action}"
    details: dict[str, Any] = {"agent": agent}
    if isinstance(exc, ToolError):
        return exc
    too_large = _cause(exc, AnswerTooLarge)
    if isinstance(too_large, AnswerTooLarge):
        # Not a lost connection (the plugin closed it) and not worth repeating: the same
        # request brings the same answer, and it may have taken effect already.
        what = (
            "what the agent's stream sent adds up to more than"
            if too_large.kept
            else "the agent's answer is over"
        )
        return ToolError(
            f"{where}: {what} max_answer_bytes = {too_large.limit} bytes "
            f"({too_large.setting}); it was dropped. What was asked may have taken effect on "
            f"the agent's side: check before asking again; raise max_answer_bytes if answers "
            f"this large are expected",
            kind=ErrorKind.TOOL_ERROR,
            details={
                **details,
                "answer_too_large": True,
                "max_answer_bytes": too_large.limit,
                "in_flight": True,
            },
        )
    undecodable = _cause(exc, AnswerUndecodable)
    if isinstance(undecodable, AnswerUndecodable):
        # The agent answered, in a form toolwire cannot read: not a lost connection, and
        # the same request brings the same answer.
        return ToolError(
            f"{where}: the answer could not be read: {undecodable}. What was asked may "
            f"have taken effect on the agent's side: check before asking again",
            kind=ErrorKind.TOOL_ERROR,
            details={**details, "reason": "undecodable_answer", "in_flight": True},
        )
    redirect = _cause(exc, RedirectRefused)
    if isinstance(redirect, RedirectRefused):
        return ToolError(
            f"{where}: {redirect}",
            kind=ErrorKind.TOOL_ERROR,
            details={**details, "reason": "redirect_refused", "location": str(redirect.target)},
        )
    if isinstance(_cause(exc, httpx.PoolTimeout), httpx.PoolTimeout):
        return ToolError(
            f"{where}: every connection to the agent stayed busy (httpx's limit: 100 per "
            f"agent) for request_timeout_s; the request was not sent: try again once "
            f"fewer calls to this agent are running, or raise plugins.a2a.request_timeout_s",
            kind=ErrorKind.TIMEOUT,
            details={**details, "in_flight": False},
        )
    if isinstance(_cause(exc, httpx.ConnectTimeout), httpx.ConnectTimeout):
        return ToolError(
            f"{where}: no connection to the agent could be opened within "
            f"request_timeout_s; the request was not sent: try again later or check the "
            f"agent's URL",
            kind=ErrorKind.TIMEOUT,
            details={**details, "in_flight": False},
        )
    if isinstance(exc, A2AClientTimeoutError) or isinstance(
        _cause(exc, httpx.TimeoutException), httpx.TimeoutException
    ):
        return ToolError(
            f"{where} timed out; the agent may still be working (use hands_off=true for long "
            f"tasks, or raise plugins.a2a.timeout_s)",
            kind=ErrorKind.TIMEOUT,
            details=details,
        )
    http_err = _cause(exc, httpx.HTTPStatusError)
    # Over REST an A2A error comes with an HTTP status (TaskNotFound: 404,
    # TaskNotCancelable: 400, ...), which the SDK maps back to the A2A error: that error
    # is the answer, not the status. A bare 404 (no A2A error in the body: the SDK's
    # MethodNotFound) is a missing endpoint.
    if (
        isinstance(exc, A2AError)
        and not isinstance(exc, A2AClientError)
        and not (isinstance(exc, MethodNotFoundError) and http_err is not None)
    ):
        if isinstance(http_err, httpx.HTTPStatusError):
            details["status"] = http_err.response.status_code
        return _a2a_error(exc, agent, where, details)
    if isinstance(http_err, httpx.HTTPStatusError):
        internal = _internal_error(http_err.response)
        if internal is not None:  # the agent's own failure, as JSON-RPC's -32603
            details["code"] = JSON_RPC_ERROR_CODE_MAP[InternalError]
            details["status"] = http_err.response.status_code
            details["in_flight"] = True
            return ToolError(f"{where}: the agent failed: {internal}", details=details)
        return _status_error(http_err, agent, action)
    req_err = _cause(exc, httpx.RequestError)
    if isinstance(req_err, httpx.RequestError):
        return ToolError(
            f"{where} failed: the agent is unreachable ({type(req_err).__name__}: {req_err}); "
            f"try again later or check the agent's URL",
            kind=ErrorKind.UNAVAILABLE,
            details=details,
        )
    if isinstance(exc, A2AClientError):
        text = exc.message or str(exc)
        m = _RPC_CODE.match(text)
        if m:
            details["code"] = int(m.group(1))
            return ToolError(f"{where}: {m.group(2)}", details=details)
        if not _UNREADABLE.match(text):  # e.g. "HTTP client is closed": not the answer's fault
            return ToolError(f"{where}: {text}", details=details)
        details["reason"] = "malformed_answer"
        return ToolError(f"{where}: {text}; {_MALFORMED_HINT}", details=details)
    if isinstance(exc, RecursionError):  # JSON nested too deeply for Python's parser
        details["reason"] = "malformed_answer"
        return ToolError(
            f"{where}: the answer is JSON nested too deeply to read; {_MALFORMED_HINT}",
            details=details,
        )
    if isinstance(exc, ValueError):  # the SDK could not make sense of what the agent sent
        details["reason"] = "malformed_answer"
        return ToolError(
            f"{where}: {type(exc).__name__}: {exc}; {_MALFORMED_HINT}", details=details
        )
    return ToolError(f"{where}: {type(exc).__name__}: {exc}", details=details)


#: How the SDK's messages about an answer it could not read begin (JSON decode errors, bad
#: JSON-RPC or SSE). Only the beginning: what follows may be the agent's own words (an SSE
#: error event's data), which must not decide whether the answer was readable.
_UNREADABLE = re.compile(
    r"JSON Decode Error|Invalid JSON-RPC response|Invalid response type|SSE stream error"
)

_MALFORMED_HINT = (
    "the agent's answer is not A2A 1.0 JSON-RPC as its card promised: check that the card's "
    "URL (plugins.a2a.agents) points at the agent's A2A endpoint, or tell the agent's owner"
)
