"""A client not written in Python: the TypeScript MCP SDK (npm) against `toolwire serve`.

The Node project is tests/ts_client (package.json + package-lock.json); the `node`
fixture (toolwire_mcp_testkit) runs `npm ci` when node_modules is missing. Without
`node` the test is skipped, unless TOOLWIRE_REQUIRE_NODE=1 (CI), which makes a
missing toolchain a failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from toolwire_mcp_testkit import TS_CLIENT, clean_env, write_config

from toolwire_mcp import ERROR_META_KEY

TS = TS_CLIENT


def test_typescript_sdk_lists_and_calls_through_the_gateway(
    node: str, tmp_path: Path, serve_process: Any
) -> None:
    write_config(
        tmp_path / "toolwire.toml",
        {"state": "memory://", "enabled_plugins": ["mcp"]},
        {
            "tools": {"modules": ["toolwire.examples"]},
            "server": {"transport": "http", "port": 0},
            "plugins.mcp.servers.weather": {
                "command": sys.executable,
                "args": ["-m", "toolwire_mcp.demo"],
            },
        },
    )
    p = serve_process("serve", env=clean_env(TOOLS_AUTH_TOKEN="ts-secret")).wait_ready(60)
    assert p.url is not None
    proc = subprocess.run(
        [node, str(TS / "client.mjs"), p.url],
        cwd=TS,
        env={**os.environ, "TOOLWIRE_TOKEN": "ts-secret"},
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert proc.returncode == 0, f"node client failed:\n{proc.stderr}\nserver:\n{p.stderr}"
    out = json.loads(proc.stdout.strip().splitlines()[-1])

    assert out["unauthenticated"]["code"] == 401, out["unauthenticated"]  # no token: refused
    assert {"add", "echo", "weather_forecast", "weather_report", "weather_alert"} <= set(
        out["tools"]
    )
    assert out["addTool"]["inputSchema"]["required"] == ["a", "b"]
    assert out["addTool"]["annotations"]["readOnlyHint"] is True

    add = out["add"]
    assert add.get("isError") in (None, False)
    assert add["structuredContent"] == {"result": 42.0}
    assert add["_meta"]["io.toolwire/result"]["call_id"] == "ts-e2e-1"

    bad = out["badArgs"]
    assert bad["isError"] is True
    assert bad["_meta"][ERROR_META_KEY]["kind"] == "invalid_args"
    assert bad["content"][0]["text"].startswith("invalid_args: ")

    unknown = out["unknown"]
    assert unknown["isError"] is True and unknown["_meta"][ERROR_META_KEY]["kind"] == "not_found"

    assert out["report"]["content"][0]["text"] == "Report for Lyon: mild, light wind."
    assert [x["progress"] for x in out["progress"]] == [1, 2, 3]
    assert out["progress"][0]["message"] == "fetching (Lyon)"
    alert = out["alert"]
    assert alert["isError"] is True and alert["_meta"][ERROR_META_KEY]["kind"] == "tool_error"
    assert "alert service unavailable" in alert["content"][0]["text"]
    assert p.stop() == 0
