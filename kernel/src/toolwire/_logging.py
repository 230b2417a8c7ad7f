"""JSON-lines logging on stderr (stdout belongs to MCP stdio frames)."""

from __future__ import annotations

import json
import logging
import os
import sys
import time

from ._hooks import TRACE_ENV, trace_setting

__all__ = ["JSONFormatter", "configure_logging"]


class JSONFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, and exc when present."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def configure_logging(level: str | int = "INFO") -> None:
    """Route the ``toolwire`` loggers to stderr as JSON lines.

    When ``TOOLWIRE_TRACE_PLUGINS`` asks for hook tracing, the ``toolwire.trace``
    logger logs at INFO whatever ``level`` is: setting the variable is the request.
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JSONFormatter())
    root = logging.getLogger("toolwire")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
    tracing = trace_setting(os.environ.get(TRACE_ENV))
    logging.getLogger("toolwire.trace").setLevel(logging.INFO if tracing else logging.NOTSET)
