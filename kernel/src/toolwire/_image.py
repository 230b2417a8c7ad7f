"""Images as tool results: ``Image(path=...)`` or ``Image(data=..., mime_type=...)``.

A tool's result content is always a JSON object (DESIGN §3). An image takes
one of two shapes there:

- ``{"img_path": "/abs/path.png", "mime_type": "image/png"}`` — the image stays
  a file; results kept in state stores, logs and idempotency records stay
  small. ``toolwire serve`` reads the file when it answers an MCP client (from
  the directories it is allowed to read) and sends MCP image content.
- ``{"content": [{"type": "image", "data": "<base64>", "mimeType": "image/png"}]}``
  — MCP image content, carried inline (what an upstream MCP server's image
  becomes, too).

Imports nothing beyond the standard library.
"""

from __future__ import annotations

import base64
import mimetypes
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

__all__ = ["IMAGE_FILE_EXTRA", "IMG_PATH_KEY", "Image", "sniff_image_type"]

#: The content key of an image kept as a file.
IMG_PATH_KEY: Final = "img_path"

#: ``ResultMeta.extra`` key the kernel sets to the ``img_path`` when a tool
#: returned ``Image(path=...)``. Only such results are sent as image files
#: (a plain ``{"img_path": ...}`` dict may echo a caller's input or an
#: upstream's result, naming any file).
IMAGE_FILE_EXTRA: Final = "image_file"

# Leading bytes of the image formats MCP clients render.
_SIGNATURES: Final = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"BM", "image/bmp"),
)


def sniff_image_type(head: bytes) -> str | None:
    """The MIME type of an image from its first bytes (PNG, JPEG, GIF, WebP, BMP), else None."""
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    for magic, mime in _SIGNATURES:
        if head.startswith(magic):
            return mime
    return None


@dataclass(frozen=True, slots=True)
class Image:
    """An image a tool returns: a file it wrote (``path``) or the bytes (``data``).

    Return it as the tool's whole result::

        @tool
        def chart(days: int) -> Image:
            path = render_chart(days)             # writes a PNG
            return Image(path=path)               # -> {"img_path": ..., "mime_type": ...}

        @tool
        def thumbnail(url: str) -> Image:
            return Image(data=png_bytes, mime_type="image/png")  # -> MCP image content

    ``mime_type`` defaults to what the file name (``path``) or the bytes
    (``data``) say; bytes that are no known image format need it given.
    """

    path: str | os.PathLike[str] | None = None
    data: bytes | None = None
    mime_type: str | None = None

    def __post_init__(self) -> None:
        if (self.path is None) == (self.data is None):
            raise ValueError("Image takes exactly one of path= (a file) or data= (the bytes)")
        if self.data is not None:
            if not isinstance(self.data, (bytes, bytearray, memoryview)):
                raise TypeError(f"Image data must be bytes, not {type(self.data).__name__}")
            if self.mime_type is None and sniff_image_type(bytes(self.data[:16])) is None:
                raise ValueError(
                    "Image data is no PNG, JPEG, GIF, WebP or BMP: give mime_type= "
                    "(e.g. 'image/svg+xml')"
                )

    def to_content(self) -> dict[str, Any]:
        """The result content this image normalizes to (see the module docstring)."""
        if self.data is not None:
            raw = bytes(self.data)
            mime = self.mime_type or sniff_image_type(raw[:16])
            return {
                "content": [
                    {"type": "image", "data": base64.b64encode(raw).decode(), "mimeType": mime}
                ]
            }
        assert self.path is not None
        path = Path(self.path).expanduser().absolute()
        mime = self.mime_type or mimetypes.guess_type(path.name)[0]
        out: dict[str, Any] = {IMG_PATH_KEY: str(path)}
        if mime is not None:
            out["mime_type"] = mime
        return out
