"""The terminal the CLI offers to plugins: ``ctx.extensions["toolwire.terminal"]``.

``toolwire call`` runs with a person at the keyboard when stdin and stderr are
terminals; it then offers a ``Terminal`` to the plugins of that call, so one
that needs to ask (an approval, a confirmation) can ask there. stdout carries
the command's JSON output, so prompts go to stderr.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import anyio

__all__ = ["TERMINAL_EXTENSION", "Terminal"]

#: ``ctx.extensions`` key of the ``Terminal`` offered by ``toolwire call``.
TERMINAL_EXTENSION = "toolwire.terminal"


class Terminal:
    """Lines read from a file descriptor on the event loop, text written to another.

    ``read_line`` waits without a thread, so it is cancelled cleanly when the
    caller stops waiting (another approval channel decided first, say).
    """

    def __init__(self, fd: int, write: Callable[[str], None]) -> None:
        self._fd = fd
        self._write = write
        self._buf = b""
        self._eof = False

    @classmethod
    def stdio(cls) -> Terminal:
        """This process's stdin (read) and stderr (write)."""

        def write(text: str) -> None:
            sys.stderr.write(text)
            sys.stderr.flush()

        return cls(sys.stdin.fileno(), write)

    @staticmethod
    def interactive() -> bool:
        """Whether stdin and stderr are terminals (someone can answer)."""
        try:
            return sys.stdin.isatty() and sys.stderr.isatty()
        except (AttributeError, ValueError):  # closed or replaced streams
            return False

    def write(self, text: str) -> None:
        """Show ``text`` (no newline added)."""
        self._write(text)

    async def read_line(self) -> str | None:
        """The next line without its newline; None at end of input."""
        while b"\n" not in self._buf and not self._eof:
            await anyio.wait_readable(self._fd)
            chunk = os.read(self._fd, 4096)
            if not chunk:
                self._eof = True
            self._buf += chunk
        if not self._buf:
            return None
        line, _sep, rest = self._buf.partition(b"\n")
        self._buf = rest
        return line.decode("utf-8", errors="replace")
