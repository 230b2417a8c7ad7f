"""Configuration: validation at load, invalid regexes, the included YAML file."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolwire import ConfigError, Kernel, load_config, tool
from toolwire.testing import FakeClock
from toolwire_ratelimit import RateLimitPlugin, key_pool

pytestmark = pytest.mark.anyio

ENV = {"TOOLWIRE_LOAD_PLUGINS": "ratelimit"}


def kernel_from(tmp_path: Path, toml: str) -> Kernel:
    path = tmp_path / "toolwire.toml"
    path.write_text(toml)
    return Kernel.from_config(load_config(path, env=ENV), clock=FakeClock())


def test_an_invalid_regex_is_a_startup_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        kernel_from(
            tmp_path,
            '[plugins.ratelimit.providers.brave]\nrate_limit_patterns = ["ok", "rate (limit"]\n',
        )
    msg = str(exc.value)
    assert "toolwire.toml" in msg
    assert "plugins.ratelimit.providers.brave.rate_limit_patterns.1" in msg
    assert "rate (limit" in msg and "invalid regular expression" in msg


# before, only an unbounded repetition around another was refused: "(.*,){12}x" and
# "(a|a)*b" were accepted, and one 40-character message held the event loop for minutes
@pytest.mark.parametrize(
    "pattern",
    [
        "(a+)+$",
        "(.*,){12}x",
        "(a|a)*b",
        "(?:a|ab|b)*c",
        "(x|)*y",
        "(\\w+,)+",
        # a body that may match nothing: before, accepted ("(a?a?)+b" on 18 a's: 3.2 s)
        "(a?a?)+b",
        "(?:x?y?)*z",
        "(?:\\bq)+|(?:a?)+b",
    ],
)
def test_catastrophic_patterns_are_rejected(tmp_path: Path, pattern: str) -> None:
    with pytest.raises(ConfigError, match="backtrack catastrophically"):
        kernel_from(tmp_path, f"[plugins.ratelimit]\ndeny_patterns = ['{pattern}']\n")


# Some cost time quadratic in the text on hostile input ("rate.*limit", "(?:a|A)+b"):
# ratelimit.md says so and how to bound them; ordinary patterns are not refused.
@pytest.mark.parametrize(
    "pattern",
    [
        "(?:foo|bar)+",
        "(?:\\s|,)+x",
        "x{2,5}",
        "(?:ab)+c",
        "quota[_ -]?(?:exceeded|hit)",
        "rate.*limit",
        "(?:a|A)+b",
        "rate.{0,40}limit",
        "[^b]{1,100}b",
    ],
)
def test_patterns_that_cannot_backtrack_catastrophically_are_accepted(
    tmp_path: Path, pattern: str
) -> None:
    kernel_from(tmp_path, f"[plugins.ratelimit]\ndeny_patterns = ['{pattern}']\n")


@pytest.mark.parametrize("pattern", ["code [[:digit:]]+", "[[:alpha:]]{3}"])
def test_a_posix_class_the_two_engines_read_apart_is_rejected(tmp_path: Path, pattern: str) -> None:
    """re reads [[:digit:]] as a set of characters ('[', ':', 'd', ...), regex as a POSIX
    class: before, accepted, and it matched differently from what re's syntax promised."""
    with pytest.raises(ConfigError, match=r"holds '\[\[:'.*write the characters you mean"):
        kernel_from(tmp_path, f"[plugins.ratelimit]\ndeny_patterns = ['{pattern}']\n")


@pytest.mark.parametrize("pattern", ["", ".*", "(too many)?", "^"])
def test_a_pattern_matching_every_message_is_rejected(tmp_path: Path, pattern: str) -> None:
    """Before: "" (an unset ${VAR}, say) was accepted and made every 500 a retryable
    rate_limit, defeating the rule that an unmatched error is terminal."""
    with pytest.raises(ConfigError) as exc:
        kernel_from(
            tmp_path,
            "[plugins.ratelimit]\n"
            f'rate_limit_patterns = ["hold your horses", {pattern!r}]\n'.replace("'", '"'),
        )
    msg = str(exc.value)
    assert "plugins.ratelimit.rate_limit_patterns.1" in msg
    assert "matches every message" in msg


def test_unknown_keys_and_bad_values_name_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"providers\.brave\.cooldown_secs: unknown key"):
        kernel_from(tmp_path, "[plugins.ratelimit.providers.brave]\ncooldown_secs = 3\n")
    with pytest.raises(ConfigError, match="listed by providers"):
        kernel_from(
            tmp_path,
            '[plugins.ratelimit.providers.a]\ntools = ["t"]\n[plugins.ratelimit.providers.b]\ntools = ["t"]\n',
        )
    with pytest.raises(ConfigError, match="duplicate key aliases"):
        kernel_from(
            tmp_path,
            '[plugins.ratelimit.providers.x]\nkeys = [{alias = "k", secret = "secret-1234"}, '
            '{alias = "k", secret = "secret-5678"}]\n',
        )


def test_a_bad_key_entry_names_its_field_not_pydantics_union(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        kernel_from(
            tmp_path,
            '[plugins.ratelimit.providers.x]\nkeys = [{alias = "k", secret = "secret-1234", '
            "weight = 0}, 5]\n",
        )
    msg = str(exc.value)
    assert "providers.x.keys.0.key.weight: Input should be greater than or equal to 1" in msg
    assert "providers.x.keys.1.secret: Input should be a valid string" in msg
    assert "lax-or-strict" not in msg and "KeySpec" not in msg


@pytest.mark.parametrize(
    ("toml", "key", "problem"),
    [
        # each one passed `config check`, then every call of the provider failed
        ("rate = { requests = 1, per_seconds = inf }", "rate.per_seconds", "finite number"),
        ("rate = { requests = inf }", "rate.requests", "finite number"),
        ("rate = { requests = 1e-300 }", "rate", "one request every"),
        ("suspend_seconds = inf", "suspend_seconds", "finite number"),
        ("max_cooldown_seconds = inf", "max_cooldown_seconds", "finite number"),
        ("cooldown_seconds = 1e308", "cooldown_seconds", "less than or equal"),
        ("probe_timeout_seconds = nan", "probe_timeout_seconds", "finite number"),
        ("removed_key_grace_seconds = inf", "removed_key_grace_seconds", "finite number"),
        ("removed_key_grace_seconds = -1", "removed_key_grace_seconds", "greater than or equal"),
    ],
)
def test_durations_must_be_finite(tmp_path: Path, toml: str, key: str, problem: str) -> None:
    with pytest.raises(ConfigError) as exc:
        kernel_from(tmp_path, f'[plugins.ratelimit.providers.brave]\ntools = ["t"]\n{toml}\n')
    assert f"plugins.ratelimit.providers.brave.{key}" in str(exc.value)
    assert problem in str(exc.value)


async def test_a_slow_rate_with_a_big_burst_still_runs_calls(tmp_path: Path) -> None:
    """Before: the bucket's TTL (burst x interval) passed the stores' MAX_TTL_S for such a
    rate, which the config accepts (10 a month, bursts of 10,000): every call failed
    'internal'."""
    kernel = kernel_from(
        tmp_path,
        "[plugins.ratelimit.tools.t]\n"
        "rate = { requests = 10, per_seconds = 2592000, burst = 10000 }\n",
    )

    @tool
    def t() -> str:
        return "ok"

    kernel.add_tool(t)
    async with kernel:
        res = await kernel.call("t", {})
    assert res.error is None, res.error
    assert res.content == {"result": "ok"}


async def test_no_config_at_all(tmp_path: Path) -> None:
    kernel = Kernel.from_config(load_config(tmp_path / "absent.toml", env=ENV, required=False))
    async with kernel:
        plugin = RateLimitPlugin.of(kernel)
        assert plugin.settings.providers == {}
        assert kernel.plugins.plugins["ratelimit"].order == 400


YAML = """
chain_order: [brave, exa]
max_provider_attempts: 2
request_timeout_seconds: 7.5
fallback_on_empty: false
backends:
  brave:
    tools: [web_search_brave]
    api_keys: ["${BRAVE_KEY_1}", {"$secretRef": "BRAVE_KEY_2"}]
    rate_limit_patterns: ["RATE_LIMITED", "too many requests"]
    cooldown_seconds: 30
    suspend_on_monthly_exhausted: true
  exa:
    tools: [web_search_exa]
    keys:
      - {alias: main, secret: "exa-key-0000001", weight: 3}
    quota_patterns: ["NO_MORE_CREDITS"]
    request_timeout_seconds: 3
"""


async def test_an_included_yaml_file_in_the_aggregation_shape(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BRAVE_KEY_1", "brave-key-111111")
    monkeypatch.setenv("BRAVE_KEY_2", "brave-key-222222")
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "providers.yaml").write_text(YAML)
    kernel = kernel_from(
        conf,
        '[plugins.ratelimit]\nconfig_file = "providers.yaml"\n'
        "[plugins.ratelimit.providers.brave]\ncooldown_seconds = 5\n",
    )
    async with kernel:
        plugin = RateLimitPlugin.of(kernel)
        s = plugin.settings
        assert s.chain_order == ["brave", "exa"] and s.request_timeout_seconds == 7.5
        assert s.providers["brave"].cooldown_seconds == 5  # inline wins over the file
        assert s.providers["brave"].rate_limit_patterns == ["RATE_LIMITED", "too many requests"]
        brave = key_pool(kernel, "brave")
        assert brave.aliases == ["brave-1", "brave-2"]
        lease = await brave.acquire()
        assert lease.secret == "brave-key-111111"
        assert key_pool(kernel, "exa").aliases == ["main"]
        assert plugin.provider_of("web_search_exa") == "exa"
        assert plugin.tools_of("brave") == ["web_search_brave"]


async def test_a_config_file_that_cannot_be_read_names_its_key_and_both_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: "<resolved path>: cannot read the included config file: [Errno 2] No such
    file or directory: '<resolved path>'": not which key, nor the path as written, nor
    where a relative path is read from, nor what to do."""
    conf, cwd = tmp_path / "conf", tmp_path / "cwd"
    conf.mkdir()
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    (cwd / "p.yaml").write_text("{}\n")  # beside the process, not beside toolwire.toml
    toml = conf / "toolwire.toml"
    with pytest.raises(ConfigError) as exc:
        await kernel_from(conf, '[plugins.ratelimit]\nconfig_file = "p.yaml"\n').start()
    assert exc.value.file == str(toml) and exc.value.key == "plugins.ratelimit.config_file"
    assert str(exc.value) == (
        f"{toml}: plugins.ratelimit.config_file: the included config file 'p.yaml' "
        f"(looked for {conf / 'p.yaml'}: a relative path is read from the directory of "
        "toolwire.toml) does not exist; create it (YAML, TOML or JSON with the keys of "
        "[plugins.ratelimit]) or fix the path"
    )

    gone = tmp_path / "nowhere" / "p.yaml"
    with pytest.raises(ConfigError) as exc:
        await kernel_from(conf, f'[plugins.ratelimit]\nconfig_file = "{gone}"\n').start()
    assert str(exc.value).endswith(
        f"plugins.ratelimit.config_file: the included config file '{gone}' does not exist; "
        "create it (YAML, TOML or JSON with the keys of [plugins.ratelimit]) or fix the path"
    )

    (conf / "d.yaml").mkdir()
    with pytest.raises(ConfigError) as exc:
        await kernel_from(conf, '[plugins.ratelimit]\nconfig_file = "d.yaml"\n').start()
    assert str(exc.value).endswith(
        f"(looked for {conf / 'd.yaml'}: a relative path is read from the directory of "
        "toolwire.toml) is a directory; name a YAML, TOML or JSON file"
    )

    (conf / "latin1.yaml").write_bytes(b"chain_order: [caf\xe9]\n")
    with pytest.raises(ConfigError) as exc:
        await kernel_from(conf, '[plugins.ratelimit]\nconfig_file = "latin1.yaml"\n').start()
    assert exc.value.key == "plugins.ratelimit.config_file"
    assert "'latin1.yaml'" in str(exc.value) and "is not UTF-8 text" in str(exc.value)
    assert str(exc.value).endswith("; save it as UTF-8")

    # a plugin configured in code has no toolwire.toml: the working directory is used
    from toolwire_ratelimit import RateLimitConfig

    kernel = Kernel(plugins=[RateLimitPlugin(RateLimitConfig(config_file="q.yaml"))])
    with pytest.raises(ConfigError) as exc:
        await kernel.start()
    assert exc.value.file is None
    assert str(exc.value) == (
        "plugins.ratelimit.config_file: the included config file 'q.yaml' (looked for "
        f"{cwd / 'q.yaml'}: with no toolwire.toml, a relative path is read from the working "
        "directory) does not exist; create it (YAML, TOML or JSON with the keys of "
        "[plugins.ratelimit]) or fix the path"
    )


async def test_a_config_file_named_by_a_variable_blames_the_variable(tmp_path: Path) -> None:
    """Before: a path from TOOLWIRE_PLUGINS__RATELIMIT__CONFIG_FILE that could not be read
    was reported as `<toolwire.toml>: plugins.ratelimit.config_file: ...`, blaming a file
    that does not name it; the variable went unnamed."""
    var = "TOOLWIRE_PLUGINS__RATELIMIT__CONFIG_FILE"
    toml = tmp_path / "toolwire.toml"
    toml.write_text("[plugins.ratelimit]\n")
    cfg = load_config(toml, env={**ENV, var: "missing.yaml"})
    with pytest.raises(ConfigError) as exc:
        await Kernel.from_config(cfg, clock=FakeClock()).start()
    assert exc.value.file is None and exc.value.key == "plugins.ratelimit.config_file"
    assert str(exc.value) == (
        "plugins.ratelimit.config_file: the included config file 'missing.yaml' (looked for "
        f"{tmp_path / 'missing.yaml'}: a relative path is read from the directory of "
        "toolwire.toml) does not exist; create it (YAML, TOML or JSON with the keys of "
        f"[plugins.ratelimit]) or fix the path (the value comes from the environment "
        f"variable {var})"
    )
    # the variable names a file that is there: it is read, as one the file names
    (tmp_path / "p.yaml").write_text("request_timeout_seconds: 4\n")
    cfg = load_config(toml, env={**ENV, var: "p.yaml"})
    async with Kernel.from_config(cfg, clock=FakeClock()) as kernel:
        assert RateLimitPlugin.of(kernel).settings.request_timeout_seconds == 4


async def test_errors_in_the_included_file_name_the_file_and_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "p.yaml").write_text("backends:\n  brave:\n    cooldown: 3\n")
    kernel = kernel_from(tmp_path, '[plugins.ratelimit]\nconfig_file = "p.yaml"\n')
    with pytest.raises(ConfigError) as exc:
        await kernel.start()
    assert "p.yaml" in str(exc.value)
    # the key meant is named, as for the main config file
    assert "providers.brave.cooldown: unknown key; did you mean 'cooldown_seconds'?" in str(
        exc.value
    )

    (tmp_path / "p.yaml").write_text(
        "backends:\n  brave:\n    keys: [{'$secretRef': NOPE_NOT_SET}]\n"
    )
    monkeypatch.delenv("NOPE_NOT_SET", raising=False)
    with pytest.raises(ConfigError, match="NOPE_NOT_SET"):
        await kernel_from(tmp_path, '[plugins.ratelimit]\nconfig_file = "p.yaml"\n').start()

    (tmp_path / "p.yaml").write_text("backends: [\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        await kernel_from(tmp_path, '[plugins.ratelimit]\nconfig_file = "p.yaml"\n').start()

    (tmp_path / "p.yaml").write_text("deny_patterns: ['(x+)*y']\n")
    with pytest.raises(ConfigError, match=r"p\.yaml.*deny_patterns\.0"):
        await kernel_from(tmp_path, '[plugins.ratelimit]\nconfig_file = "p.yaml"\n').start()
