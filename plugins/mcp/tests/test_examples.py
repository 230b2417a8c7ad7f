"""examples/toolwire.toml works as documented: the gateway config fronting the demo upstream."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from toolwire_mcp_testkit import clean_env

from toolwire import Kernel, load_config

pytestmark = pytest.mark.anyio

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "toolwire.toml"


async def test_example_config_fronts_the_demo_server_with_audit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if shutil.which("python") is None:
        pytest.skip("the example starts `python` from PATH")
    example = tmp_path / "toolwire.toml"  # its state and audit log go next to it, .toolwire/
    shutil.copy(EXAMPLE, example)
    monkeypatch.chdir(tmp_path.parent)  # started elsewhere, as an MCP client may
    cfg = load_config(example, env=clean_env())
    assert cfg.server["transport"] == "stdio" and cfg.enabled_plugins == ["mcp", "audit"]
    async with Kernel.from_config(cfg) as kernel:
        names = {t.name for t in kernel.list_tools()}
        assert {"add", "weather_forecast", "weather_report", "weather_alert"} <= names
        r = await kernel.call("weather_forecast", {"city": "Lyon", "days": 2}, call_id="ex-1")
        assert r.content["city"] == "Lyon" and len(r.content["sky"]) == 2
        steps: list[str | None] = []

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            steps.append(message)

        r = await kernel.call("weather_report", {"city": "Lyon"}, progress=on_progress)
        assert steps == ["fetching (Lyon)", "analysing (Lyon)", "writing (Lyon)"]
        bad = await kernel.call("weather_alert", {"region": "Alps"})
        assert bad.error is not None and bad.error.kind == "tool_error"
    lines = [json.loads(x) for x in (tmp_path / ".toolwire/audit.jsonl").read_text().splitlines()]
    assert [x["tool"] for x in lines] == ["weather_forecast", "weather_report", "weather_alert"]
    assert lines[0]["call_id"] == "ex-1" and lines[0]["args"] == {"city": "Lyon", "days": 2}
    assert (tmp_path / ".toolwire/state.db").exists()
