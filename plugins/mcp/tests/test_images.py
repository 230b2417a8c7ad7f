"""``{"img_path": ...}`` results reach MCP clients as image content, within the allowed roots."""

from __future__ import annotations

import base64
import json
import logging
import os
from pathlib import Path
from typing import Any

import anyio
import mcp_types
import pytest
from fastmcp import Client
from test_fastpath import asgi_client, both, envelope, headers_for, post

from toolwire import Image, Kernel, tool
from toolwire_mcp import ServeConfig, create_http_app, create_server

pytestmark = pytest.mark.anyio

# A 1x1 PNG and a 1x1 GIF.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYPgPAAEDAQAIicLsAAAAAElFTkSuQmCC"
)
GIF = base64.b64decode("R0lGODlhAQABAIAAAAAAAP///yH5BAEAAAAALAAAAAABAAEAAAIBRAA7")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def image_tools(where: Path) -> list[Any]:
    """Tools returning image files under ``where`` in every shape the reader must handle."""
    (where / "chart.png").write_bytes(PNG)
    (where / "named-wrong.png").write_bytes(GIF)  # the bytes decide the type
    (where / "notes.png").write_text("not an image")
    (where / "big.png").write_bytes(PNG + b"\0" * 4096)

    @tool
    def chart(name: str = "chart.png") -> Image:
        """An image file under the test directory."""
        return Image(path=where / name)

    @tool
    def echo(data: dict[str, Any]) -> dict[str, Any]:
        """Returns what it was given: an img_path here is the caller's, not the tool's."""
        return data

    @tool
    def elsewhere(path: str) -> Image:
        """Any path."""
        return Image(path=path)

    @tool
    def inline() -> Image:
        """The bytes themselves."""
        return Image(data=PNG)

    return [chart, echo, elsewhere, inline]


async def call(client: Client[Any], name: str, args: dict[str, Any] | None = None) -> Any:
    r = await client.call_tool_mcp(name, args or {})
    assert not r.is_error, r
    return r


async def test_an_image_file_goes_out_as_image_content(tmp_path: Path) -> None:
    async with Kernel(tools=image_tools(tmp_path)) as k, Client(create_server(k)) as c:
        r = await call(c, "chart")
        assert r.structured_content == {
            "img_path": str(tmp_path / "chart.png"),
            "mime_type": "image/png",
        }
        [block] = r.content
        assert isinstance(block, mcp_types.ImageContent)
        assert block.mime_type == "image/png" and base64.b64decode(block.data) == PNG

        gif = await call(c, "chart", {"name": "named-wrong.png"})
        assert gif.content[0].mime_type == "image/gif"  # from the bytes, not the name

        inline = await call(c, "inline")
        assert inline.content[0].type == "image"
        assert base64.b64decode(inline.content[0].data) == PNG


@pytest.mark.parametrize(
    ("case", "why"),
    [
        ("not_an_image", "is not a PNG, JPEG, GIF, WebP or BMP image"),
        ("too_big", "over [server] image_max_bytes (1000)"),
        ("missing", "cannot read"),
        ("outside", "is outside the directories images are served from"),
        ("symlink_out", "is outside the directories images are served from"),
        ("fifo", "is not a regular file"),
        ("directory", "is not a regular file"),
        ("nul_byte", "embedded null byte"),
        ("given_as_data", "only the file of a toolwire.Image(path=...) a tool returned is sent"),
    ],
)
async def test_an_image_that_may_not_be_sent_is_explained_and_the_result_kept(
    tmp_path: Path, case: str, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    served = tmp_path / "served"
    served.mkdir()
    secret = tmp_path / "private.png"
    secret.write_bytes(PNG)
    os.symlink(secret, served / "link.png")
    os.mkfifo(served / "pipe.png")  # opening it to read would block until a writer comes
    (served / "dir.png").mkdir()
    name, args = {
        "not_an_image": ("chart", {"name": "notes.png"}),
        "too_big": ("chart", {"name": "big.png"}),
        "missing": ("chart", {"name": "gone.png"}),
        "outside": ("elsewhere", {"path": str(secret)}),
        "symlink_out": ("chart", {"name": "link.png"}),
        "fifo": ("chart", {"name": "pipe.png"}),
        "directory": ("chart", {"name": "dir.png"}),
        "nul_byte": ("chart", {"name": "a\x00b.png"}),
        # an image file inside the roots, named by the caller: not sent
        "given_as_data": ("echo", {"data": {"img_path": str(served / "chart.png")}}),
    }[case]
    server = create_server(
        Kernel(tools=image_tools(served)), image_roots=[served], image_max_bytes=1000
    )
    with caplog.at_level(logging.WARNING, logger="toolwire.serve"), anyio.fail_after(20):
        async with Client(server) as c:
            r = await call(c, name, args)
    [block] = r.content
    assert isinstance(block, mcp_types.TextContent)
    body, _, note = block.text.rpartition("\n")
    assert json.loads(body) == r.structured_content  # the result itself is all there
    assert note.startswith("[image not sent: ") and why in note
    assert any(why in rec.getMessage() for rec in caplog.records)


async def test_both_http_paths_send_the_same_image(tmp_path: Path) -> None:
    body = envelope("chart", {})
    async with both(image_tools(tmp_path)) as (fast, slow):
        expected = await post(slow.url, body)
        got = await post(fast.url, body)
        assert fast.fast is not None and fast.fast.taken == 1
    assert got == expected
    [block] = got[2]["result"]["content"]
    assert block["type"] == "image" and base64.b64decode(block["data"]) == PNG


async def test_serve_config_sets_the_roots(tmp_path: Path) -> None:
    served = tmp_path / "served"
    served.mkdir()
    async with Kernel(tools=image_tools(tmp_path)) as k:
        cfg = ServeConfig(transport="http", image_roots=[str(served)])
        app = create_http_app(k, cfg)
        body = envelope("chart", {})
        async with asgi_client(app) as c:
            r = await c.post("/mcp", json=body, headers=headers_for(body))
    [block] = r.json()["result"]["content"]
    assert block["type"] == "text" and "is outside the directories" in block["text"]


def test_a_folder_swapped_for_a_link_after_the_check_is_not_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The roots are checked on the resolved path, then the file is opened. A folder under
    a root replaced by a link to elsewhere in between (``realpath`` saw a real folder) must
    not lead the open out of the roots. Before, only the last step refused links."""
    from toolwire_mcp import _images

    served, outside = tmp_path / "served", tmp_path / "outside"
    served.mkdir()
    outside.mkdir()
    (outside / "secret.png").write_bytes(PNG)
    (served / "shots").symlink_to(outside, target_is_directory=True)  # the swap, done
    (served / "real").mkdir()
    (served / "real" / "ok.png").write_bytes(PNG)
    files = _images.ImageFiles(roots=[served])
    # realpath as it was before the swap: "shots" still a folder of its own
    monkeypatch.setattr(_images.os.path, "realpath", lambda p: os.path.normpath(p))
    with pytest.raises(_images._NotSent, match="cannot read"):
        files._read(str(served / "shots" / "secret.png"))
    assert files._read(str(served / "real" / "ok.png")).data == base64.b64encode(PNG).decode()
