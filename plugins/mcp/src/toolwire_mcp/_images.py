"""Image files of ``toolwire.Image(path=...)`` results go to MCP clients as image content.

A tool that returns ``toolwire.Image(path=...)`` keeps its image as a file: its
content is ``{"img_path": "/abs/file.png", "mime_type": ...}`` and the kernel
vouches for the path in ``meta.extra["image_file"]``. When ``toolwire serve``
answers an MCP client it reads the file and sends an ``image`` content block,
but only for such a result (a plain ``{"img_path": ...}`` dict may echo the
caller's input or an upstream's result, and name any file), and only a file
that:

- lies under one of the directories it may read (``[server] image_roots``;
  default: the system temp directory and the working directory), symlinks
  resolved first and then every folder on the way and the file opened
  without following a link, so a result cannot name ``/etc/shadow``, nor
  reach it through a folder swapped for a link after the check;
- is a regular file (not a FIFO or a device, which could block a reader)
  no larger than ``[server] image_max_bytes`` (10 MiB by default);
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
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path

import anyio.to_thread
import mcp_types

from toolwire import IMAGE_FILE_EXTRA, IMG_PATH_KEY, ToolResult, sniff_image_type

from ._config import DEFAULT_IMAGE_MAX_BYTES

__all__ = ["ImageFiles", "default_image_roots"]

log = logging.getLogger("toolwire.serve")


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

        The image block; or, when the file may not or cannot be sent, one text
        block: the result's JSON and why.
        """
        path = self.wanted(result)
        if path is None:
            return None
        from ._convert import render_text

        try:
            if result.meta.extra.get(IMAGE_FILE_EXTRA) != path:
                raise _NotSent(
                    "only the file of a toolwire.Image(path=...) a tool returned is sent "
                    f"({IMG_PATH_KEY} given as data is not read)"
                )
            image = await anyio.to_thread.run_sync(self._read, path)
        except _NotSent as exc:
            log.warning("image of tool %r not sent: %s", result.meta.tool, exc)
            return [
                mcp_types.TextContent(
                    type="text", text=f"{render_text(result)}\n[image not sent: {exc}]"
                )
            ]
        return [image]

    def _read(self, path: str) -> mcp_types.ImageContent:
        try:
            return self._read_checked(path)
        except (OSError, ValueError) as exc:  # ValueError: a NUL in the path, say
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise _NotSent(f"cannot read {path!r}: {reason}") from None

    def _read_checked(self, path: str) -> mcp_types.ImageContent:
        if not os.path.isabs(path):
            raise _NotSent(f"{IMG_PATH_KEY} {path!r} is not an absolute path")
        real = Path(os.path.realpath(path))
        root = next((r for r in self.roots if real.is_relative_to(r)), None)
        if root is None:
            roots = ", ".join(str(r) for r in self.roots)
            raise _NotSent(
                f"{path} is outside the directories images are served from ({roots}); "
                "add its directory to [server] image_roots"
            )
        fd = _open_beneath(root, real.relative_to(root).parts, path)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise _NotSent(f"{path} is not a regular file")
            if st.st_size > self.max_bytes:
                raise _NotSent(
                    f"{path} is {st.st_size} bytes, over [server] image_max_bytes "
                    f"({self.max_bytes})"
                )
            with open(fd, "rb", closefd=False) as f:
                data = f.read(self.max_bytes + 1)
        finally:
            os.close(fd)
        if len(data) > self.max_bytes:  # grew while being read
            raise _NotSent(f"{path} is over [server] image_max_bytes ({self.max_bytes})")
        mime = sniff_image_type(data[:16])
        if mime is None:
            raise _NotSent(f"{path} is not a PNG, JPEG, GIF, WebP or BMP image")
        return mcp_types.ImageContent(
            type="image", data=base64.b64encode(data).decode(), mime_type=mime
        )


# (Windows has none of these but O_RDONLY; there only realpath's check guards the path)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_FILE_FLAGS = os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
# O_PATH: a folder one may pass through but not list (mode --x) is still a way
_DIR_FLAGS = (
    getattr(os, "O_PATH", os.O_RDONLY) | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
)


def _open_beneath(root: Path, parts: tuple[str, ...], shown: str) -> int:
    """A descriptor of the file ``root/parts...``, following no link on the way.

    ``parts`` come from ``realpath``: none was a link when it looked. Each
    directory is then opened from the one before it without following a link,
    so a directory swapped for a link to elsewhere after that look fails the
    open (``ELOOP``/``ENOTDIR``) instead of leading out of ``root``; the file
    itself is opened non-blocking (no hanging on a FIFO). Where ``dir_fd`` is
    not supported (Windows), the path is opened whole, as ``realpath`` left it.
    """
    if not parts:
        raise _NotSent(f"{shown} is not a regular file")
    if os.open not in os.supports_dir_fd:
        return os.open(root.joinpath(*parts), _FILE_FLAGS)
    fd = os.open(root, _DIR_FLAGS)  # the root as configured, a link allowed
    try:
        for part in parts[:-1]:
            nxt = os.open(part, _DIR_FLAGS | _NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return os.open(parts[-1], _FILE_FLAGS, dir_fd=fd)
    finally:
        os.close(fd)


class _NotSent(Exception):
    """Why an image file is not sent."""
