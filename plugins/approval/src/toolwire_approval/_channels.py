"""Channels that ask a person: MCP elicitation and the terminal prompt.

The HTTP API (``_http.py``), in-process callbacks and events live elsewhere;
every channel ends in ``ApprovalPlugin.decide``, so the first decision wins
whichever channel it came from.
"""

from __future__ import annotations

import contextvars
import getpass
import json
import unicodedata
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, runtime_checkable

from toolwire import TERMINAL_EXTENSION as _KERNEL_TERMINAL_EXTENSION
from toolwire import Terminal

from ._types import ApprovalDecision, ApprovalRequest, Approve, InvalidEditError, Reject

__all__ = [
    "ELICIT_EXTENSION",
    "ELICIT_KEY",
    "ELICIT_SCHEMA",
    "INPUT_REQUIRED",
    "STATE_PREFIX",
    "TERMINAL_EXTENSION",
    "Elicitor",
    "TerminalPrompt",
    "current_terminal",
    "elicitation_message",
    "offer_terminal",
    "parse_elicitation",
    "terminal_prompt",
]

#: ``ctx.extensions`` key of the MCP elicitation capability (offered by ``toolwire serve``).
ELICIT_EXTENSION = "mcp.elicit"
#: ``ctx.extensions`` key of a terminal (the kernel's ``Terminal``, or a ``TerminalPrompt``).
TERMINAL_EXTENSION = _KERNEL_TERMINAL_EXTENSION
#: Error kind that ends a call while an MCP client (2026-07-28 protocol) asks its user;
#: ``toolwire serve`` turns it into an MCP ``InputRequiredResult``.
INPUT_REQUIRED = "input_required"
#: Elicitation key prefix (``toolwire.approval/<request id>``).
ELICIT_KEY = "toolwire.approval"
#: ``request_state`` prefix echoed by the MCP client on the retried call.
STATE_PREFIX = "toolwire.approval:"

#: The form an MCP client shows its user (flat primitives, as elicitation requires).
ELICIT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "decision": {
            "type": "string",
            "title": "Decision",
            "enum": ["approve", "reject"],
            "description": "approve: run the call; reject: it never runs",
        },
        "reason": {
            "type": "string",
            "title": "Reason",
            "description": "why (recorded in the audit log; shown to the agent on rejection)",
        },
        "args": {
            "type": "string",
            "title": "Edited arguments (JSON object, optional)",
            "description": "leave empty to run with the arguments shown",
        },
    },
    "required": ["decision"],
}


@runtime_checkable
class Elicitor(Protocol):
    """What ``ctx.extensions["mcp.elicit"]`` offers (see docs/mcp.md).

    ``mode`` is ``"push"`` (handshake-era connections: ``ask`` sends
    ``elicitation/create`` and waits for the answer) or ``"input_required"``
    (2026-07-28: ``ask`` returns the answer the retried request carries for
    ``key``, or records the question and returns None; the caller then ends the
    call with error kind ``input_required`` and ``toolwire serve`` answers the
    client with an ``InputRequiredResult`` whose ``request_state`` is
    ``state``). ``request_state`` is the state the client echoed (None on a
    first round). ``client`` names the MCP client, when it said. An elicitor may
    also have ``principal``: the authenticated name of the client (``toolwire
    serve``'s ``[server.clients]`` entry), which the audit records instead.
    """

    mode: str
    request_state: str | None
    client: str | None

    async def ask(
        self, key: str, message: str, schema: dict[str, Any], *, state: str | None = None
    ) -> dict[str, Any] | None:
        """``{"action": "accept"|"decline"|"cancel", "content": {...}}`` or None (deferred)."""
        ...


#: What a prompt never prints as it is: control, format (bidi overrides, zero-width) and
#: line/paragraph separator characters, and lone surrogates. JSON escapes those below
#: U+0020 itself; the others would let an argument reorder or hide what the approver reads.
_UNSHOWN_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})


def _escape_unshown(text: str) -> str:
    if text.isascii() and "\x7f" not in text:
        return text
    return "".join(
        _json_escape(c)
        if (c == "\x7f" or not c.isascii()) and unicodedata.category(c) in _UNSHOWN_CATEGORIES
        else c
        for c in text
    )


def _json_escape(c: str) -> str:
    """``c`` as a JSON escape (a surrogate pair past U+FFFF, e.g. the tag characters)."""
    n = ord(c)
    if n <= 0xFFFF:
        return f"\\u{n:04x}"
    n -= 0x10000
    return f"\\u{0xD800 + (n >> 10):04x}\\u{0xDC00 + (n & 0x3FF):04x}"


def show_json(value: Any, *, indent: int | None = None) -> str:
    """``value`` as JSON for a person to read: non-ASCII text as it is, except the
    characters that change how the rest displays (``\\u202e``, ``\\u200b``...), escaped."""
    return _escape_unshown(json.dumps(value, ensure_ascii=False, indent=indent, sort_keys=True))


#: The longest string (value or key) the elicitation shows whole; a longer one is shortened
#: on its own, so every other argument is still shown.
SHOWN_STRING = 300
#: The longest the arguments' text gets in the elicitation (past it, cut, and said so).
SHOWN_TOTAL = 8000


def _shorten(value: Any, hidden: list[int]) -> Any:
    """``value`` with each string over ``SHOWN_STRING`` cut, counting what was cut."""
    if isinstance(value, str):
        if len(value) <= SHOWN_STRING:
            return value
        hidden[0] += len(value) - SHOWN_STRING
        return f"{value[:SHOWN_STRING]}... [{len(value) - SHOWN_STRING} more characters]"
    if isinstance(value, dict):
        return {_shorten(k, hidden): _shorten(v, hidden) for k, v in value.items()}
    if isinstance(value, list):
        return [_shorten(v, hidden) for v in value]
    return value


def shown_args(args: dict[str, Any]) -> tuple[str, int]:
    """The arguments as an approver is shown them, and how many characters were left out.

    Long strings are shortened one by one, never the text as a whole: cutting the JSON
    at a length hid the arguments sorted after a long one (a ``to`` after a long
    ``body``), which the user then approved unseen.
    """
    hidden = [0]
    text = show_json(_shorten(args, hidden), indent=2)
    if len(text) > SHOWN_TOTAL:
        hidden[0] += len(text) - SHOWN_TOTAL
        text = text[:SHOWN_TOTAL] + "..."
    return text, hidden[0]


def elicitation_message(request: ApprovalRequest, *, cli: str = "toolwire approvals") -> str:
    """The question an MCP client shows its user."""
    text, hidden = shown_args(request.args)
    lines = [f"Approve the call of tool {request.tool!r}?", ""]
    if request.description:
        first = request.description.strip().splitlines()[0]
        lines.insert(1, "Tool: " + _escape_unshown(first))
    if hidden:
        lines += [
            f"The arguments are long: {hidden} characters not shown below. Read them in full "
            f"(`{cli} show {request.id}`) before approving.",
            "",
        ]
    lines += [
        f"Arguments:\n{text}",
        "",
        f"Policy {request.policy} (rule {request.rule}); request {request.id}.",
    ]
    return "\n".join(lines)


def parse_elicitation(answer: dict[str, Any], *, by: str) -> ApprovalDecision | None:
    """An elicitation answer as a decision; None for ``cancel`` (no decision).

    ``decline`` rejects. An accepted form without a valid ``decision`` is no
    decision. Edited ``args`` that are not a JSON object raise ``InvalidEditError``.
    """
    action = answer.get("action")
    if action == "decline":
        return Reject("declined by the MCP client's user", by=by)
    if action != "accept":
        return None
    content = answer.get("content") or {}
    choice = str(content.get("decision", "")).strip().lower()
    reason = content.get("reason")
    reason = str(reason).strip() if reason else None
    if choice == "reject":
        return Reject(reason or "rejected by the MCP client's user", by=by)
    if choice != "approve":
        return None
    raw = content.get("args")
    args: dict[str, Any] | None = None
    if isinstance(raw, str) and raw.strip():
        try:
            parsed = json.loads(raw)
        except ValueError as exc:
            raise InvalidEditError(f"the edited arguments are not valid JSON: {exc}") from None
        if not isinstance(parsed, dict):
            raise InvalidEditError("the edited arguments must be a JSON object")
        args = parsed
    return Approve(by=by, args=args, comment=reason)


# ----------------------------------------------------------------- terminal
ReadLine = Callable[[], Awaitable[str | None]]
Write = Callable[[str], None]


class TerminalPrompt:
    """Asks at a terminal: ``[y]es / [n]o / [e]dit``. I/O is injectable for tests.

    ``TerminalPrompt.stdio()`` reads stdin without a thread (cancellable: when
    another channel decides first, the prompt just stops) and writes to
    stderr (stdout carries the command's JSON output).
    """

    def __init__(self, read_line: ReadLine, write: Write, *, user: str | None = None) -> None:
        self._read_line = read_line
        self._write = write
        self.user = user or _user()

    @classmethod
    def stdio(cls) -> TerminalPrompt:
        """A prompt on this process's stdin / stderr."""
        return cls.on(Terminal.stdio())

    @classmethod
    def on(cls, terminal: Terminal) -> TerminalPrompt:
        """A prompt on the kernel's ``Terminal`` (what ``toolwire call`` offers)."""
        return cls(terminal.read_line, terminal.write)

    def say(self, text: str) -> None:
        """Print a line to the terminal."""
        self._write(text.rstrip("\n") + "\n")

    async def ask(
        self, request: ApprovalRequest, note: str | None = None, *, cli: str = "toolwire approvals"
    ) -> ApprovalDecision | None:
        """Ask about ``request``; None when input ends (no decision)."""
        if note:
            self.say(f"toolwire: {note}")
        else:
            self.say(
                f"\ntoolwire: tool {request.tool!r} needs approval "
                f"({request.policy}, rule {request.rule}), request {request.id}"
            )
            self.say("  arguments: " + show_json(request.args))
            self.say(f"  (also: {cli} approve {request.id} / {cli} reject {request.id})")
        while True:
            self._write("approve? [y]es / [n]o / [e]dit arguments: ")
            line = await self._read_line()
            if line is None:
                return None
            choice = line.strip().lower()
            if choice in ("y", "yes"):
                return Approve(by=self.user)
            if choice in ("n", "no"):
                self._write("reason (optional): ")
                reason = await self._read_line()
                return Reject((reason or "").strip() or "rejected at the terminal", by=self.user)
            if choice in ("e", "edit"):
                self._write("arguments as a JSON object: ")
                text = await self._read_line()
                if text is None:
                    return None
                try:
                    args = json.loads(text)
                except ValueError as exc:
                    self.say(f"toolwire: not valid JSON ({exc}); try again")
                    continue
                if not isinstance(args, dict):
                    self.say("toolwire: the arguments must be a JSON object; try again")
                    continue
                return Approve(by=self.user, args=args)
            self.say("toolwire: answer y, n or e")


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no user name in this environment
        return "terminal"


_TERMINAL: contextvars.ContextVar[TerminalPrompt | None] = contextvars.ContextVar(
    "toolwire_approval_terminal", default=None
)


def offer_terminal(prompt: TerminalPrompt | None) -> contextvars.Token[TerminalPrompt | None]:
    """Offer ``prompt`` to the calls made in this context (``toolwire call`` does this).

    Prefer ``kernel.call(..., extensions={"toolwire.terminal": prompt})`` when
    you make the call yourself. Returns the token for ``ContextVar.reset``.
    """
    return _TERMINAL.set(prompt)


def current_terminal() -> TerminalPrompt | None:
    """The prompt offered to this context, if any."""
    return _TERMINAL.get()


def terminal_prompt(offered: object) -> TerminalPrompt | None:
    """A prompt from what a call offers under ``toolwire.terminal``: a ``TerminalPrompt``,
    the kernel's ``Terminal`` (``toolwire call`` on a terminal), else the context's."""
    if isinstance(offered, TerminalPrompt):
        return offered
    if isinstance(offered, Terminal):
        return TerminalPrompt.on(offered)
    return current_terminal()
