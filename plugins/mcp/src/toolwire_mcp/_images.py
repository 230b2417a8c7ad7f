"""``{"img_path": ...}`` results go to MCP clients as image content.

A tool that returns ``toolwire.Image(path=...)`` (or the content
``{"img_path": "/abs/file.png"}`` itself) keeps its image as a file. When
``toolwire serve`` answers an MCP client it reads the file and sends an
``image`` content block, but only a file that:

- lies under one of the directories it may read (``[server] image_roots``;
  default: the system temp directory and the working directory), symlinks
  resolved first, so a result cannot name ``/etc/shadow``;
- is no larger than ``[server] image_max_bytes`` (10 MiB by default);
- starts with the bytes of a PNG, JPEG, GIF, WebP or BMP image (its type is
  taken from those bytes, not from the name).

Anything else still answers the call: the result's JSON goes out as text,
followed by ``[image not sent: <why>]``, and a warning is logged. The
structured content is the result's own (``img_path`` and all) either way.
"""

from __future__ import annotations

import base64
import logging
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Final

import anyio.to_thread
import mcp_types

from toolwire import IMG_PATH_KEY, ToolResult, sniff_image_type

from ._config import DEFAULT_IMAGE_MAX_BYTES

__all__ = ["ImageFiles", "default_image_roots"]

log = logging.getLogger("toolwire.serve")
_IMAGE_KEYS: Final = frozenset({IMG_PATH_KEY, "mime_type"})


def default_image_roots() -> list[Path]:
    """The system temp directory and the working directory."""
    return [Path(tempfile.gettempdir()), Path.cwd()]


class ImageFiles:
    """Reads the image files of ``{"img_path": ...}`` results, within ``roots``."""

    def __init__(
        self,
        roots: Iterable[str | os.PathLike[str]] | None = None,
        *,
        max_bytes: int = DEFAULT_IMAGE_MAX_BYTES,
    ) -> None:
        given = default_image_roots() if roots is None else [Path(r) for r in roots]
        self.roots = [Path(os.path.realpath(r.expanduser())) for r in given]
        self.max_bytes = max_bytes

    @staticmethod
    def wanted(result: ToolResult) -> str | None:
        """The ``img_path`` of a successful result, or None (not an image-file result)."""
        if result.is_error:
            return None
        path = result.content.get(IMG_PATH_KEY)
        return path if isinstance(path, str) else None

    async def blocks(self, result: ToolResult) -> list[mcp_types.ContentBlock] | None:
        """The MCP content of an image-file result (None: not one; the caller renders it).

        The image block, after a text block with the JSON when the content has
        more than the image's keys; or, when the file may not or cannot be
        sent, one text block saying why.
        """
        path = self.wanted(result)
        if path is None:
            return None
        from ._convert import render_text

        try:
            image = await anyio.to_thread.run_sync(self._read, path)
        except _NotSent as exc:
            log.warning("image of tool %r not sent: %s", result.meta.tool, exc)
            return [
                mcp_types.TextContent(
                    type="text", text=f"{render_text(result)}\n[image not sent: {exc}]"
                )
            ]
        if result.content.keys() <= _IMAGE_KEYS:
            return [image]
        return [mcp_types.TextContent(type="text", text=render_text(result)), image]

    def _read(self, path: str) -> mcp_types.ImageContent:
        if not os.path.isabs(path):
            raise _NotSent(f"{IMG_PATH_KEY} {path!r} is not an absolute path")
        real = Path(os.path.realpath(path))
        if not any(real.is_relative_to(root) for root in self.roots):
            roots = ", ".join(str(r) for r in self.roots)
            raise _NotSent(
                f"{path} is outside the directories images are served from ({roots}); "
                "add its directory to [server] image_roots"
            )
        try:
            with open(real, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size > self.max_bytes:
                    raise _NotSent(
                        f"{path} is {size} bytes, over [server] image_max_bytes ({self.max_bytes})"
                    )
                data = f.read(self.max_bytes + 1)
        except OSError as exc:
            raise _NotSent(f"cannot read {path}: {exc.strerror or exc}") from None
        if len(data) > self.max_bytes:  # grew while being read
            raise _NotSent(f"{path} is over [server] image_max_bytes ({self.max_bytes})")
        mime = sniff_image_type(data[:16])
        if mime is None:
            raise _NotSent(f"{path} is not a PNG, JPEG, GIF, WebP or BMP image")
        return mcp_types.ImageContent(
            type="image", data=base64.b64encode(data).decode(), mime_type=mime
        )


class _NotSent(Exception):
    """Why an image file is not sent."""
