"""Which rule decides a tool's policy, and the configuration that states the rules."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pydantic
import pytest

from toolwire import ConfigError, Kernel, Tool, ToolAnnotations, load_config
from toolwire_approval import ApprovalConfig, ApprovalPlugin, Policy, RuleSet


async def _noop(args: dict[str, Any], ctx: Any) -> None:
    return None


def make(
    name: str = "t",
    *,
    tags: tuple[str, ...] = (),
    source: str = "local",
    settings: dict[str, Any] | None = None,
    **hints: bool,
) -> Tool:
    return Tool(
        name=name,
        description="",
        input_schema={"type": "object"},
        executor=_noop,
        tags=frozenset(tags),
        source=source,
        annotations=ToolAnnotations(**hints),
        settings=settings or {},
    )


def rule(cfg: dict[str, Any], tool: Tool) -> tuple[str, str]:
    res = RuleSet(ApprovalConfig.model_validate(cfg)).resolve(tool)
    return str(res.policy), res.rule


def test_no_rules_means_none_for_everything_even_destructive_tools() -> None:
    assert rule({}, make(destructiveHint=True, openWorldHint=True)) == ("NONE", "default")


def test_the_one_line_annotation_rule() -> None:
    cfg = {"annotations": {"destructiveHint": "REQUIRED"}}
    assert rule(cfg, make(destructiveHint=True)) == ("REQUIRED", "annotations.destructiveHint")
    # only a hint the tool sets to true matches (MCP's implicit default is not assumed)
    assert rule(cfg, make()) == ("NONE", "default")
    assert rule(cfg, make(destructiveHint=False)) == ("NONE", "default")


def test_precedence_exact_then_glob_then_settings_then_tags_sources_annotations() -> None:
    cfg = {
        "default": "LAZY",
        "tools": {"send_email": "NONE", "send_*": "REQUIRED", "*": "LAZY"},
        "tags": {"mail": "REQUIRED"},
        "sources": {"mcp:*": "REQUIRED", "mcp:calendar": "NONE"},
        "annotations": {"readOnlyHint": "NONE"},
    }
    full = make("send_email", tags=("mail",), source="mcp:mail", destructiveHint=True)
    assert rule(cfg, full) == ("NONE", "tools.send_email")
    assert rule(cfg, make("send_sms")) == ("REQUIRED", 'tools."send_*"')
    assert rule(cfg, make("other")) == ("LAZY", 'tools."*"')
    cfg["tools"] = {}
    settings = make("x", tags=("mail",), settings={"approval": "none"})
    assert rule(cfg, settings) == ("NONE", "tool settings")
    assert rule({**cfg, "use_tool_settings": False}, settings) == ("REQUIRED", "tags.mail")
    assert rule(cfg, make("x", source="mcp:calendar", readOnlyHint=True)) == (
        "NONE",
        'sources."mcp:calendar"',
    )
    assert rule(cfg, make("x", source="mcp:github")) == ("REQUIRED", 'sources."mcp:*"')
    assert rule(cfg, make("x", readOnlyHint=True)) == ("NONE", "annotations.readOnlyHint")
    assert rule(cfg, make("x")) == ("LAZY", "default")


def test_the_most_specific_glob_wins_whatever_the_order() -> None:
    cfg = {"tools": {"*": "NONE", "github_*": "LAZY", "github_delete_*": "REQUIRED"}}
    assert rule(cfg, make("github_delete_repo")) == ("REQUIRED", 'tools."github_delete_*"')
    assert rule(cfg, make("github_list")) == ("LAZY", 'tools."github_*"')


def test_the_strictest_matching_tag_or_hint_wins() -> None:
    cfg = {
        "tags": {"a": "LAZY", "b": "REQUIRED", "c": "NONE"},
        "annotations": {"openWorldHint": "LAZY", "destructiveHint": "REQUIRED"},
    }
    assert rule(cfg, make(tags=("a", "b", "c"))) == ("REQUIRED", "tags.b")
    assert rule(cfg, make(openWorldHint=True, destructiveHint=True)) == (
        "REQUIRED",
        "annotations.destructiveHint",
    )


def test_a_bad_tool_setting_fails_closed() -> None:
    assert rule({}, make(settings={"approval": "REQUIRE"})) == ("REQUIRED", "tool settings")
    assert rule({}, make(settings={"approval": True})) == ("REQUIRED", "tool settings")
    assert rule({}, make(settings={"approval": False})) == ("NONE", "tool settings")


def test_resolution_is_cached_per_tool_object() -> None:
    rules = RuleSet(ApprovalConfig(tools={"t": Policy.LAZY}))
    t = make("t")
    assert rules.resolve(t) is rules.resolve(t)
    assert rules.resolve(make("t")) is not rules.resolve(t)  # a new tool object: resolved again


def test_describe_names_the_config_line() -> None:
    res = RuleSet(ApprovalConfig(tools={"send_*": Policy.REQUIRED})).resolve(make("send_x"))
    assert res.describe() == 'plugins.approval.tools."send_*" = "REQUIRED"'


@pytest.mark.parametrize(
    ("cfg", "problem"),
    [
        ({"default": "ALWAYS"}, "expected 'NONE', 'LAZY' or 'REQUIRED'"),
        ({"annotations": {"dangerous": "REQUIRED"}}, "unknown annotation 'dangerous'"),
        ({"lazy_timeout_s": 0}, "greater than 0"),
        # infinity became a state-store TTL: every call needing approval failed 'internal'
        ({"required_timeout_s": float("inf")}, "finite number"),
        ({"retention_s": float("inf")}, "finite number"),
        ({"lazy_timeout_s": float("nan")}, "finite number"),
        ({"retention_s": 1e300}, "less than or equal to 1000000000"),
        ({"http_prefix": "approvals"}, "must start with '/'"),
        ({"colour": "red"}, "Extra inputs"),
        # a UTF-8 client sending "pässwörd" got 401: the header is read as Latin-1
        ({"http_token": "pässwörd"}, "outside printable ASCII"),
        ({"http_token": "tab\tinside"}, "outside printable ASCII"),
    ],
)
def test_bad_config_is_refused(cfg: dict[str, Any], problem: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=problem):
        ApprovalConfig.model_validate(cfg)


def test_a_hint_spelled_two_ways_is_refused_naming_both() -> None:
    """Hints match case-insensitively: the two entries were merged and one policy won
    silently (here NONE, turning off the approval of destructive tools)."""
    cfg = {"annotations": {"destructiveHint": "REQUIRED", "destructivehint": "NONE"}}
    with pytest.raises(pydantic.ValidationError) as exc:
        ApprovalConfig.model_validate(cfg)
    msg = str(exc.value)
    assert "'destructiveHint' and 'destructivehint' both set the annotation" in msg
    assert "case-insensitive" in msg
    # one spelling, whichever, is fine
    assert ApprovalConfig.model_validate(
        {"annotations": {"DESTRUCTIVEHINT": "NONE", "readOnlyHint": "LAZY"}}
    ).annotations == {"destructiveHint": Policy.NONE, "readOnlyHint": Policy.LAZY}


def test_a_hint_spelled_two_ways_in_the_file_or_by_the_environment_fails_at_load(
    tmp_path: Path,
) -> None:
    path = tmp_path / "toolwire.toml"
    path.write_text(
        'enabled_plugins = ["approval"]\n\n[plugins.approval]\n'
        'annotations = { destructiveHint = "REQUIRED", destructivehint = "NONE" }\n'
    )
    with pytest.raises(ConfigError, match=r"plugins\.approval\.annotations: 'destructiveHint' and"):
        Kernel.from_config(load_config(path, env={}))
    # an environment variable's key is read lower-case: it names the file's hint again
    path.write_text(
        'enabled_plugins = ["approval"]\n\n[plugins.approval]\n'
        'annotations = { destructiveHint = "REQUIRED" }\n'
    )
    env = {"TOOLWIRE_PLUGINS__APPROVAL__ANNOTATIONS__DESTRUCTIVEHINT": "NONE"}
    with pytest.raises(ConfigError) as exc:
        Kernel.from_config(load_config(path, env=env))
    assert "'destructiveHint' and 'destructivehint'" in str(exc.value)
    assert "TOOLWIRE_PLUGINS__APPROVAL__ANNOTATIONS__DESTRUCTIVEHINT" in str(exc.value)
    # the file spelling it lower-case lets the variable override it
    path.write_text(
        'enabled_plugins = ["approval"]\n\n[plugins.approval]\n'
        'annotations = { destructivehint = "REQUIRED" }\n'
    )
    p = Kernel.from_config(load_config(path, env=env)).get_plugin("approval")
    assert isinstance(p, ApprovalPlugin)
    assert p.config.annotations == {"destructiveHint": Policy.NONE}


def test_config_from_toml_and_environment(tmp_path: Path) -> None:
    path = tmp_path / "toolwire.toml"
    path.write_text(
        'enabled_plugins = ["approval"]\n\n[plugins.approval]\ndefault = "lazy"\n'
        'annotations = { destructivehint = "required" }\n'
        'tools = { "send_*" = "REQUIRED" }\n'
    )
    env = {
        "TOOLWIRE_PLUGINS__APPROVAL__REQUIRED_TIMEOUT_S": "120",
        "TOOLWIRE_PLUGINS__APPROVAL__TOOLS__DELETE_ALL": "REQUIRED",
    }
    kernel = Kernel.from_config(load_config(path, env=env))
    p = kernel.get_plugin("approval")
    assert isinstance(p, ApprovalPlugin)
    cfg = p.config
    assert cfg.default is Policy.LAZY and cfg.required_timeout_s == 120
    assert cfg.annotations == {"destructiveHint": Policy.REQUIRED}
    assert cfg.tools == {"send_*": Policy.REQUIRED, "delete_all": Policy.REQUIRED}
    with pytest.raises(ConfigError, match=r"plugins\.approval\.required_timeout_s.*finite"):
        Kernel.from_config(
            load_config(path, env={"TOOLWIRE_PLUGINS__APPROVAL__REQUIRED_TIMEOUT_S": "inf"})
        )
    path.write_text('[plugins.approval]\ntools = { x = "SOMETIMES" }\n')
    with pytest.raises(ConfigError, match=r"plugins\.approval\.tools\.x"):
        Kernel.from_config(load_config(path, env={}))


def test_a_tool_rule_set_by_an_environment_variable_matches_a_mixed_case_name(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: TOOLWIRE_PLUGINS__APPROVAL__TOOLS__SENDEMAIL became the rule `sendemail`
    (environment keys are lower-case), which matched no tool named `sendEmail`: the tool
    the operator meant to hold for approval ran without one, silently."""
    path = tmp_path / "toolwire.toml"
    path.write_text('enabled_plugins = ["approval"]\n')
    env = {
        "TOOLWIRE_PLUGINS__APPROVAL__TOOLS__SENDEMAIL": "REQUIRED",
        "TOOLWIRE_PLUGINS__APPROVAL__TOOLS__DROP_*": "LAZY",
    }
    plugin = Kernel.from_config(load_config(path, env=env)).get_plugin("approval")
    assert isinstance(plugin, ApprovalPlugin)
    with caplog.at_level("WARNING", logger="toolwire_approval"):
        res = plugin.rules.resolve(make("sendEmail"))
    assert (str(res.policy), res.rule) == ("REQUIRED", "tools.sendemail")
    assert "differs in case" in caplog.text and "'sendEmail'" in caplog.text
    assert str(plugin.rules.resolve(make("Drop_Table")).policy) == "LAZY"


def test_an_exact_rule_in_the_right_case_still_wins() -> None:
    cfg = {"tools": {"sendemail": "NONE", "sendEmail": "REQUIRED", "*": "LAZY"}}
    assert rule(cfg, make("sendEmail")) == ("REQUIRED", "tools.sendEmail")
    # a lower-case exact rule goes before the globs, as an exact rule does
    assert rule({"tools": {"sendemail": "REQUIRED", "*": "NONE"}}, make("SendEmail"))[0] == (
        "REQUIRED"
    )
    # a name in lower case is matched only as it is
    assert rule({"tools": {"SENDEMAIL": "REQUIRED"}}, make("sendemail")) == ("NONE", "default")
