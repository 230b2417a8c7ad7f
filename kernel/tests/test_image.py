"""``toolwire.Image``: what an image result normalizes to, and the tool schema it gets."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from toolwire import IMG_PATH_KEY, Image, Kernel, normalize_content, sniff_image_type, tool

pytestmark = pytest.mark.anyio

PNG_HEAD = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_a_file_image_is_its_absolute_path_and_type(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert normalize_content(Image(path="out/plot.jpg")) == {
        IMG_PATH_KEY: str(tmp_path / "out" / "plot.jpg"),
        "mime_type": "image/jpeg",
    }
    assert normalize_content(Image(path="raw.bin", mime_type="image/png")) == {
        IMG_PATH_KEY: str(tmp_path / "raw.bin"),
        "mime_type": "image/png",
    }
    assert normalize_content(Image(path="noext")) == {IMG_PATH_KEY: str(tmp_path / "noext")}


def test_image_bytes_become_mcp_image_content() -> None:
    content = normalize_content(Image(data=PNG_HEAD))
    [block] = content["content"]
    assert block == {
        "type": "image",
        "data": base64.b64encode(PNG_HEAD).decode(),
        "mimeType": "image/png",
    }
    svg = normalize_content(Image(data=b"<svg/>", mime_type="image/svg+xml"))
    assert svg["content"][0]["mimeType"] == "image/svg+xml"


def test_bad_images_are_refused_with_what_to_do() -> None:
    with pytest.raises(ValueError, match=r"exactly one of path= .* or data="):
        Image()
    with pytest.raises(ValueError, match="exactly one of"):
        Image(path="a.png", data=PNG_HEAD)
    with pytest.raises(ValueError, match="give mime_type="):
        Image(data=b"<svg/>")
    with pytest.raises(TypeError, match="must be bytes, not str"):
        Image(data="iVBOR")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("head", "mime"),
    [
        (PNG_HEAD, "image/png"),
        (b"\xff\xd8\xff\xe0\0\x10JFIF", "image/jpeg"),
        (b"GIF89a\x01\0", "image/gif"),
        (b"RIFF\x10\0\0\0WEBPVP8 ", "image/webp"),
        (b"BM\x3a\0\0\0", "image/bmp"),
        (b"%PDF-1.7", None),
        (b"RIFF\x10\0\0\0WAVEfmt ", None),
        (b"", None),
    ],
)
def test_sniffing(head: bytes, mime: str | None) -> None:
    assert sniff_image_type(head) == mime


async def test_a_tool_returning_an_image_promises_no_output_schema(tmp_path: Path) -> None:
    @tool
    def plot() -> Image:
        """A plot."""
        return Image(path=tmp_path / "p.png")

    @tool
    def maybe_plot() -> Image | None:
        """Maybe a plot."""
        return None

    async with Kernel(tools=[plot, maybe_plot]) as k:
        plot_tool, maybe_tool = k.get_tool("plot"), k.get_tool("maybe_plot")
        assert plot_tool is not None and plot_tool.output_schema is None
        assert maybe_tool is not None and maybe_tool.output_schema is None
        r = await k.call("plot", {})
    assert not r.is_error
    assert r.content == {IMG_PATH_KEY: str(tmp_path / "p.png"), "mime_type": "image/png"}
