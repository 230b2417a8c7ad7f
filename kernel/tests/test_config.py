"""toolwire.toml loading, env overrides, secrets, and entry-point plugin loading."""

from __future__ import annotations

import importlib.metadata as md
import os
import textwrap
from pathlib import Path
from typing import Any

import pydantic
import pytest
from pydantic import BaseModel, ConfigDict, Field, SecretStr

from toolwire import ConfigError, Kernel, PluginError, hookimpl, load_config
from toolwire import _config as config_mod

pytestmark = pytest.mark.anyio


def write(tmp_path: Path, text: str, name: str = "toolwire.toml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text), encoding="utf-8")
    return p


# ---------------------------------------------------------------- loading
def test_defaults_without_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = load_config(env={})
    assert cfg.path is None
    assert cfg.state is None and cfg.max_attempts == 5 and cfg.enabled_plugins is None


def test_full_file(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        """
        state = "sqlite:///state.db"
        enabled_plugins = ["a"]
        max_attempts = 3
        default_timeout_s = 10
        deadline_s = 60

        [tools]
        modules = ["toolwire.examples", {module = "json", namespace = "j"}]

        [plugins.a]
        x = 1
        """,
    )
    cfg = load_config(p, env={})
    assert cfg.path == str(p)
    # a relative SQLite path means "next to the config file", wherever the process runs
    state = f"sqlite:///{(tmp_path / 'state.db').resolve()}"
    assert (cfg.state, cfg.enabled_plugins, cfg.max_attempts) == (state, ["a"], 3)
    assert [(m.module, m.namespace) for m in cfg.tools.refs()] == [
        ("toolwire.examples", None),
        ("json", "j"),
    ]
    assert cfg.plugins == {"a": {"x": 1}}


def test_close_grace_period_from_the_file_and_the_environment(tmp_path: Path) -> None:
    """config.md: `close_grace_s` (default 10), overridden by TOOLWIRE_CLOSE_GRACE_S."""
    assert load_config(None, env={}).close_grace_s == 10.0
    p = write(tmp_path, "enabled_plugins = []\nclose_grace_s = 2.5\n")
    assert load_config(p, env={}).close_grace_s == 2.5
    assert load_config(p, env={"TOOLWIRE_CLOSE_GRACE_S": "0"}).close_grace_s == 0
    assert Kernel.from_config(load_config(p, env={})).close_grace_s == 2.5
    for bad in ("-1", "nan", "inf"):
        with pytest.raises(ConfigError, match="TOOLWIRE_CLOSE_GRACE_S"):
            load_config(p, env={"TOOLWIRE_CLOSE_GRACE_S": bad})


def test_short_form_plugins_list(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, 'plugins = ["audit"]\n'), env={})
    assert cfg.enabled_plugins == ["audit"]


def test_errors_about_the_short_form_name_the_key_the_file_has(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: `plugins = [...]` was reported as `enabled_plugins`, a key the file lacks."""
    with pytest.raises(ConfigError) as ei:
        load_config(write(tmp_path, 'plugins = ["demo", 5]\n'), env={})
    assert str(ei.value).endswith("toolwire.toml: plugins.1: Input should be a valid string")

    fake_eps(monkeypatch, demo=f"{HERE}:DemoPlugin", plain=f"{HERE}:NoConfigPlugin")
    cfg = load_config(write(tmp_path, 'plugins = ["dmeo"]\n'), env={})
    with pytest.raises(ConfigError) as ei:
        Kernel.from_config(cfg)
    assert ei.value.key == "plugins" and "unknown plugin 'dmeo'" in str(ei.value)

    cfg = load_config(write(tmp_path, 'plugins = ["demo"]\n'), env={})
    assert 'plugins = ["demo"] leaves it out' in str(config_mod.plugin_not_loaded(cfg, "plain"))

    # TOOLWIRE_LOAD_PLUGINS replaces the list: named as before
    cfg = load_config(write(tmp_path, 'plugins = ["demo"]\n'), env={"TOOLWIRE_LOAD_PLUGINS": "x"})
    with pytest.raises(ConfigError) as ei:
        Kernel.from_config(cfg)
    assert ei.value.key == "enabled_plugins" and "TOOLWIRE_LOAD_PLUGINS" in str(ei.value)


def test_a_boolean_is_no_number_of_attempts_or_seconds(tmp_path: Path) -> None:
    """Before: `max_attempts = true` was one attempt and `deadline_s = true` one second."""
    for key in ("max_attempts", "default_timeout_s", "deadline_s"):
        with pytest.raises(ConfigError) as ei:
            load_config(write(tmp_path, f"{key} = true\n"), env={})
        assert str(ei.value).endswith(f"{key}: expected a number, not the boolean true")
    var = "TOOLWIRE_MAX_ATTEMPTS"
    with pytest.raises(ConfigError, match=f"the boolean false .*environment variable {var}"):
        load_config(write(tmp_path, ""), env={var: "false"})
    assert (
        load_config(write(tmp_path, "deadline_s = 2\nmax_attempts = 3\n"), env={}).deadline_s == 2
    )


def test_broken_toml_names_the_file(tmp_path: Path) -> None:
    p = write(tmp_path, "state = \n")
    with pytest.raises(ConfigError, match=r"toolwire\.toml: invalid TOML"):
        load_config(p, env={})


def test_unknown_key_and_bad_value_name_file_and_key(tmp_path: Path) -> None:
    p = write(tmp_path, 'stat = "memory://"\nmax_attempts = 0\n')
    with pytest.raises(ConfigError) as ei:
        load_config(p, env={})
    msg = str(ei.value)
    assert str(p) in msg
    assert "stat: unknown key" in msg
    assert "max_attempts: Input should be greater than or equal to 1" in msg


def test_state_must_be_a_url(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"state: .*expected a URL"):
        load_config(write(tmp_path, 'state = "redis"\n'), env={})


def test_explicit_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.toml", env={})


def test_a_missing_file_named_by_toolwire_config_names_the_variable(tmp_path: Path) -> None:
    """Before: only the path was named, not where it came from (a stale export)."""
    env = {"TOOLWIRE_CONFIG": str(tmp_path / "nope.toml")}
    with pytest.raises(ConfigError, match=r"config file not found.*TOOLWIRE_CONFIG"):
        load_config(None, env=env)


# ------------------------------------------------------------------- env
def test_env_overrides(tmp_path: Path) -> None:
    p = write(tmp_path, 'state = "memory://"\nmax_attempts = 2\n[plugins.a]\nx = 1\n')
    env = {
        "TOOLWIRE_STATE": "sqlite:///x.db",
        "TOOLWIRE_MAX_ATTEMPTS": "7",
        "TOOLWIRE_PLUGINS__a__x": "2",
        "TOOLWIRE_PLUGINS__a__nested__flag": "true",
        "TOOLWIRE_PLUGINS__b__name": "plain text",
        "TOOLWIRE_LOAD_PLUGINS": "a, b",
        "TOOLWIRE_DISABLE_PLUGINS": "b",
    }
    cfg = load_config(p, env=env)
    assert cfg.state == "sqlite:///x.db" and cfg.max_attempts == 7
    assert cfg.plugins == {"a": {"x": 2, "nested": {"flag": True}}, "b": {"name": "plain text"}}
    assert cfg.enabled_plugins == ["a", "b"] and cfg.disabled_plugins == ["b"]


def test_empty_load_plugins_means_none(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, ""), env={"TOOLWIRE_LOAD_PLUGINS": ""})
    assert cfg.enabled_plugins == []


def test_redis_url_is_the_state_when_none_is_configured(tmp_path: Path) -> None:
    assert (
        load_config(write(tmp_path, ""), env={"REDIS_URL": "redis://h:1/0"}).state
        == "redis://h:1/0"
    )
    p = write(tmp_path, 'state = "memory://"\n')
    assert load_config(p, env={"REDIS_URL": "redis://h:1/0"}).state == "memory://"


def test_malformed_plugin_env_var() -> None:
    with pytest.raises(ConfigError, match="TOOLWIRE_PLUGINS__x"):
        load_config(None, env={"TOOLWIRE_PLUGINS__x": "1"}, required=False)


# ---------------------------------------------------------------- secrets
def test_secret_refs_from_env_and_secrets_file(tmp_path: Path) -> None:
    (tmp_path / "app.secrets.env").write_text("# comment\nexport B_KEY='from-file'\n")
    p = write(
        tmp_path,
        """
        secrets_file = "app.secrets.env"
        [plugins.a]
        key = {"$secretRef" = "A_KEY"}
        keys = [{"$secretRef" = "B_KEY"}]
        """,
    )
    cfg = load_config(p, env={"A_KEY": "from-env"})
    assert cfg.plugins["a"] == {"key": "from-env", "keys": ["from-file"]}


def test_a_relative_secrets_file_from_the_environment_is_relative_to_the_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As TOOLWIRE_STATE's SQLite path is. Before: relative to the config file's folder,
    so a path typed next to the command was looked for elsewhere."""
    conf, here = tmp_path / "conf", tmp_path / "here"
    conf.mkdir()
    here.mkdir()
    (here / "mine.secrets.env").write_text("B_KEY=from-cwd\n")
    (conf / "mine.secrets.env").write_text("B_KEY=beside-the-file\n")
    p = write(conf, '[plugins.a]\nkey = {"$secretRef" = "B_KEY"}\n')
    monkeypatch.chdir(here)
    cfg = load_config(p, env={"TOOLWIRE_SECRETS_FILE": "mine.secrets.env"})
    assert cfg.plugins["a"] == {"key": "from-cwd"}
    # written in the file, it stays relative to the file
    p = write(
        conf, 'secrets_file = "mine.secrets.env"\n[plugins.a]\nkey = {"$secretRef" = "B_KEY"}\n'
    )
    assert load_config(p, env={}).plugins["a"] == {"key": "beside-the-file"}


def test_missing_secret_names_key_and_variable(tmp_path: Path) -> None:
    p = write(tmp_path, '[plugins.a]\nkey = {"$secretRef" = "NOPE_KEY"}\n')
    with pytest.raises(ConfigError) as ei:
        load_config(p, env={})
    assert "plugins.a.key" in str(ei.value) and "export NOPE_KEY" in str(ei.value)


# ----------------------------------------------------------- entry points
class DemoConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    greeting: str = "hello"


class DemoPlugin:
    order = 42
    Config = DemoConfig

    def __init__(self, config: DemoConfig) -> None:
        self.config = config

    @hookimpl
    def after_call(self, result: Any) -> None:
        result.meta.extra["demo"] = self.config.greeting


class NoConfigPlugin:
    @hookimpl
    def before_call(self) -> None:
        return None


def _failing_factory() -> object:
    raise RuntimeError("kaput")


def fake_eps(monkeypatch: pytest.MonkeyPatch, **targets: str) -> None:
    eps = {n: md.EntryPoint(n, v, "toolwire") for n, v in targets.items()}
    monkeypatch.setattr(config_mod, "installed_plugins", lambda: eps)


HERE = __name__


def test_plugins_load_from_entry_points_with_validated_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_eps(monkeypatch, demo=f"{HERE}:DemoPlugin", plain=f"{HERE}:NoConfigPlugin")
    p = write(tmp_path, '[plugins.demo]\ngreeting = "hi"\norder = 7\n')
    k = Kernel.from_config(str(p))
    infos = {i.name: i for i in k.plugins.ordered()}
    assert set(infos) == {"demo", "plain"}  # no list: every installed plugin
    assert infos["demo"].order == 7 and infos["plain"].order == 1000
    assert isinstance(infos["demo"].config, DemoConfig) and infos["demo"].config.greeting == "hi"


async def test_configured_plugin_acts_on_calls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_eps(monkeypatch, demo=f"{HERE}:DemoPlugin")
    p = write(
        tmp_path,
        'enabled_plugins = ["demo"]\n[tools]\nmodules = ["toolwire.examples"]\n[plugins.demo]\ngreeting = "salut"\n',
    )
    async with Kernel.from_config(str(p)) as k:
        r = await k.call("add", {"a": 1, "b": 2})
    assert r.content == {"result": 3.0}
    assert r.meta.extra["demo"] == "salut"


class KeyedConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    api_key: SecretStr | None = None
    mode: SecretStr | None = Field(None, json_schema_extra={"toolwire_not_secret": ["oauth"]})
    headers: dict[str, SecretStr] = Field(default_factory=dict)


class KeyedPlugin:
    Config = KeyedConfig

    def __init__(self, config: KeyedConfig) -> None:
        self.config = config


def test_a_credential_written_in_the_file_is_named_in_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fake_eps(monkeypatch, keyed=f"{HERE}:KeyedPlugin")
    p = write(
        tmp_path,
        """
        [plugins.keyed]
        api_key = "sk-live-123456"
        mode = "oauth"
        headers = {X-Token = "tok-abcdef", X-Ref = {"$secretRef" = "REF_TOKEN"}, X-Url = "https://searx.example.org", X-Url2 = "https://u:pw@searx.example.org"}
        """,
    )
    monkeypatch.setenv("REF_TOKEN", "from-the-env")
    with caplog.at_level("WARNING", logger="toolwire.config"):
        k = Kernel.from_config(str(p))
    assert k.plugins.plugins["keyed"].config.api_key.get_secret_value() == "sk-live-123456"
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 3, warned  # not the $secretRef, the mode "oauth", a bare URL
    assert "plugins.keyed.api_key holds a credential in plain text" in warned[0]
    assert "plugins.keyed.headers.X-Token" in warned[1] and "$secretRef" in warned[1]
    assert "plugins.keyed.headers.X-Url2" in warned[2]  # a URL with a password in it
    assert "sk-live" not in " ".join(warned)  # the warning never shows the value

    caplog.clear()
    monkeypatch.setenv("TOOLWIRE_PLUGINS__keyed__api_key", "sk-from-env-1")
    p.write_text('[plugins.keyed]\nmode = "oauth"\n')
    with caplog.at_level("WARNING", logger="toolwire.config"):
        k = Kernel.from_config(str(p))
    assert k.plugins.plugins["keyed"].config.api_key.get_secret_value() == "sk-from-env-1"
    assert caplog.records == []  # the environment is where a credential belongs


class MisnamedPlugin:
    name = "stamp"  # but its entry point is "stamper"


def test_an_entry_point_named_unlike_its_plugin_is_warned_about(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fake_eps(monkeypatch, stamper=f"{HERE}:MisnamedPlugin")
    with caplog.at_level("WARNING", logger="toolwire.config"):
        k = Kernel.from_config(str(write(tmp_path, "")))
    assert "stamper" in k.plugins.plugins
    assert any(
        "plugin 'stamper'" in r.getMessage() and "calls itself 'stamp'" in r.getMessage()
        for r in caplog.records
    )


def test_enable_and_disable_lists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_eps(monkeypatch, demo=f"{HERE}:DemoPlugin", plain=f"{HERE}:NoConfigPlugin")
    k = Kernel.from_config(str(write(tmp_path, 'enabled_plugins = ["plain"]\n')))
    assert [i.name for i in k.plugins.ordered()] == ["plain"]
    k = Kernel.from_config(str(write(tmp_path, 'disabled_plugins = ["plain"]\n')))
    assert [i.name for i in k.plugins.ordered()] == ["demo"]
    k = Kernel.from_config(str(write(tmp_path, "enabled_plugins = []\n")))
    assert k.plugins.ordered() == []


def test_a_plugin_left_out_is_explained_by_what_left_it_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, `toolwire keys` said "add it to enabled_plugins or give it a [plugins.x]
    table" whatever excluded the plugin, even with that table already there."""
    fake_eps(monkeypatch, demo=f"{HERE}:DemoPlugin", plain=f"{HERE}:NoConfigPlugin")
    table = '[plugins.demo]\ngreeting = "hi"\n'

    def why(text: str, **env: str) -> str:
        p = write(tmp_path, text)
        cfg = load_config(p, env=env)
        k = Kernel.from_config(cfg)
        assert "demo" not in k.plugins.plugins
        return str(config_mod.plugin_not_loaded(cfg, "demo"))

    p = str(tmp_path / "toolwire.toml")
    assert why('disabled_plugins = ["demo"]\n' + table) == (
        f"{p}: the demo plugin is not loaded: disabled_plugins lists it "
        "(remove 'demo' from that list)"
    )
    assert why('enabled_plugins = ["plain"]\n' + table) == (
        f'{p}: the demo plugin is not loaded: enabled_plugins = ["plain"] leaves it out '
        "(add 'demo' to that list, or remove the list to load every installed plugin)"
    )
    assert why(table, TOOLWIRE_DISABLE_PLUGINS="plain, demo") == (
        "the demo plugin is not loaded: the environment variable TOOLWIRE_DISABLE_PLUGINS "
        "disables it (remove demo from it)"
    )
    both = why('disabled_plugins = ["demo"]\n', TOOLWIRE_DISABLE_PLUGINS="demo")
    assert "TOOLWIRE_DISABLE_PLUGINS disables it" in both
    assert both.startswith(f"{p}: ") and "; and disabled_plugins lists it" in both
    assert why('enabled_plugins = ["demo"]\n', TOOLWIRE_LOAD_PLUGINS="plain") == (
        "the demo plugin is not loaded: the environment variable TOOLWIRE_LOAD_PLUGINS "
        "loads only plain (add demo to it, or unset it to load every installed plugin)"
    )
    assert why(table, TOOLWIRE_LOAD_PLUGINS="") == (
        "the demo plugin is not loaded: the environment variable TOOLWIRE_LOAD_PLUGINS is "
        "set but empty, which loads no plugin (add demo to it, or unset it to load every "
        "installed plugin)"
    )
    cfg = load_config(write(tmp_path, ""), env={})
    assert str(config_mod.plugin_not_loaded(cfg, "demo")) == (
        "the demo plugin is not loaded: it is installed and enabled but could not be loaded: "
        "see the warning logged above (a missing dependency, usually)"
    )
    assert str(config_mod.plugin_not_loaded(cfg, "other", dist="acme-other")) == (
        "the other plugin is not loaded: it is not installed (pip install acme-other)"
    )


def test_disabled_plugins_of_the_wrong_type_stays_a_config_error_with_the_env_var(
    tmp_path: Path,
) -> None:
    """Before: a TypeError traceback (an int was unpacked) or a list of single letters."""
    for value in ("5", '"demo"'):
        p = write(tmp_path, f"disabled_plugins = {value}\n")
        with pytest.raises(ConfigError) as ei:
            load_config(p, env={"TOOLWIRE_DISABLE_PLUGINS": "plain"})
        assert str(ei.value) == f"{p}: disabled_plugins: Input should be a valid list"


def test_unknown_plugin_names_are_startup_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_eps(monkeypatch, demo=f"{HERE}:DemoPlugin")
    with pytest.raises(ConfigError, match=r"unknown plugin 'nope'; installed plugins: \['demo'\]"):
        Kernel.from_config(str(write(tmp_path, 'enabled_plugins = ["nope"]\n')))
    with pytest.raises(
        ConfigError, match=r"plugins\.typo: configuration for unknown plugin 'typo'"
    ):
        Kernel.from_config(str(write(tmp_path, "[plugins.typo]\nx = 1\n")))


def test_a_table_for_an_unknown_plugin_from_the_environment_names_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: `toolwire.toml: plugins.dmeo: configuration for unknown plugin` for a table
    only TOOLWIRE_PLUGINS__DMEO__X made: the file has no such table, the variable was
    not named."""
    fake_eps(monkeypatch, demo=f"{HERE}:DemoPlugin")
    p = write(tmp_path, "max_attempts = 3\n")
    var = "TOOLWIRE_PLUGINS__" + "DMEO__GREETING"  # a made-up variable
    cfg = load_config(p, env={var: "hi"})
    with pytest.raises(ConfigError) as ei:
        Kernel.from_config(cfg)
    assert ei.value.file is None and ei.value.key == "plugins.dmeo"
    assert "did you mean 'demo'?" in str(ei.value)
    assert f"set by the environment variable {var}: rename or unset it" in str(ei.value)

    # the file's own table (a variable adding to it): the file is still named
    both = write(tmp_path, "[plugins.dmeo]\nx = 1\n", name="both.toml")
    with pytest.raises(ConfigError) as ei:
        Kernel.from_config(load_config(both, env={var: "hi"}))
    assert ei.value.file == str(both) and var in str(ei.value)


def test_invalid_plugin_config_names_file_and_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_eps(monkeypatch, demo=f"{HERE}:DemoPlugin", plain=f"{HERE}:NoConfigPlugin")
    p = write(tmp_path, "[plugins.demo]\ngreting = 1\n")
    with pytest.raises(ConfigError) as ei:
        Kernel.from_config(str(p))
    assert str(p) in str(ei.value) and "plugins.demo.greting: unknown key" in str(ei.value)
    with pytest.raises(ConfigError, match="plugin 'plain' takes no configuration"):
        Kernel.from_config(str(write(tmp_path, "[plugins.plain]\nx = 1\n")))


def test_missing_optional_dependency_is_skipped_with_pip_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    pkg = tmp_path / "mods" / "twtest_needsdep"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "import toolwire_tests_missing_dep_xyz  # a third-party dependency, not installed\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    fake_eps(monkeypatch, needsdep="twtest_needsdep:Plugin", plain=f"{HERE}:NoConfigPlugin")
    with caplog.at_level("WARNING", logger="toolwire"):
        k = Kernel.from_config(str(write(tmp_path, "")))
    assert [i.name for i in k.plugins.ordered()] == ["plain"]
    assert "plugin 'needsdep' skipped" in caplog.text
    assert "install the distribution that provides module 'toolwire_tests_missing_dep_xyz'" in (
        caplog.text
    )
    # named explicitly, the same plugin is a fatal error that says what to install
    with pytest.raises(
        PluginError, match=r"plugin 'needsdep': cannot be loaded.*install the distribution"
    ):
        Kernel.from_config(str(write(tmp_path, 'enabled_plugins = ["needsdep"]\n')))


def fake_dist(tmp_path: Path, name: str, module: str, *requires: str) -> md.Distribution:
    """An installed distribution ``name`` whose plugin ``needsdep`` is ``module:Plugin``."""
    info = tmp_path / f"{name.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    lines = [f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n"]
    lines += [f"Requires-Dist: {r}\n" for r in requires]
    (info / "METADATA").write_text("".join(lines))
    (info / "entry_points.txt").write_text(f"[toolwire]\nneedsdep = {module}:Plugin\n")
    return md.PathDistribution(info)


@pytest.mark.parametrize(
    ("requires", "advice"),
    [
        (
            ["toolwire-tests-missing-dep-xyz-api>=1.2", "toolwire-tests-missing-dep-xyz-sdk"],
            "pip install acme-needsdep (it requires toolwire-tests-missing-dep-xyz-api, "
            "toolwire-tests-missing-dep-xyz-sdk)",
        ),
        (
            ['Toolwire_Tests.Missing_Dep_XYZ; extra == "fast"', "pydantic"],
            "pip install 'acme-needsdep[fast]' (it requires Toolwire_Tests.Missing_Dep_XYZ)",
        ),
        (
            ["pydantic"],
            "acme-needsdep does not declare a distribution named like it: install the one "
            "that provides module 'toolwire_tests_missing_dep_xyz'",
        ),
    ],
)
def test_a_missing_dependency_is_named_by_the_distribution_that_brings_it(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    requires: list[str],
    advice: str,
) -> None:
    """Before: the hint was `pip install 'opentelemetry'` for toolwire-profiling, whose
    dependencies are opentelemetry-api and opentelemetry-sdk: the import name is not
    always a distribution's. The plugin's distribution knows what brings the module."""
    pkg = tmp_path / "mods" / "twtest_distdep"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("import toolwire_tests_missing_dep_xyz.trace\n")
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    dist = fake_dist(tmp_path, "acme-needsdep", "twtest_distdep", *requires)
    eps = {ep.name: ep for ep in dist.entry_points}
    monkeypatch.setattr(config_mod, "installed_plugins", lambda: eps)
    with caplog.at_level("WARNING", logger="toolwire"):
        Kernel.from_config(str(write(tmp_path, "")))
    assert "plugin 'needsdep' skipped" in caplog.text
    assert f"its dependency 'toolwire_tests_missing_dep_xyz' is not installed: {advice}" in (
        caplog.text
    )
    assert "pip install 'toolwire_tests_missing_dep_xyz'" not in caplog.text


def test_a_dependency_missing_behind_a_lazy_attribute_is_handled_like_an_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A package that imports its plugin class lazily (a module __getattr__, PEP 562). Before,
    the attribute was looked up outside the import's error handling: the ModuleNotFoundError
    escaped Kernel.from_config as it was, instead of the plugin being skipped with the
    pip hint, and any other error of the lookup was not a PluginError."""
    pkg = tmp_path / "mods" / "twtest_lazy"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "def __getattr__(name):\n"
        "    if name == 'Plugin':\n"
        "        import toolwire_tests_missing_dep_xyz  # a third-party dependency\n"
        "    if name == 'Broken':\n"
        "        raise RuntimeError('the plugin module is broken')\n"
        "    raise AttributeError(name)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    fake_eps(monkeypatch, lazy="twtest_lazy:Plugin", plain=f"{HERE}:NoConfigPlugin")
    with caplog.at_level("WARNING", logger="toolwire"):
        k = Kernel.from_config(str(write(tmp_path, "")))
    assert [i.name for i in k.plugins.ordered()] == ["plain"]
    assert "plugin 'lazy' skipped" in caplog.text
    assert "install the distribution that provides module 'toolwire_tests_missing_dep_xyz'" in (
        caplog.text
    )
    with pytest.raises(
        PluginError, match=r"plugin 'lazy': cannot be loaded.*install the distribution"
    ):
        Kernel.from_config(str(write(tmp_path, 'enabled_plugins = ["lazy"]\n')))
    fake_eps(monkeypatch, broken="twtest_lazy:Broken")
    with pytest.raises(PluginError) as ei:
        Kernel.from_config(str(write(tmp_path, "")))
    assert str(ei.value) == (
        "plugin 'broken': cannot be loaded: RuntimeError: the plugin module is broken (raised "
        'while importing entry point broken = "twtest_lazy:Broken": a bug in the plugin or a '
        "broken install; reinstall or fix its distribution, or leave it out with "
        "disabled_plugins = ['broken'] or TOOLWIRE_DISABLE_PLUGINS=broken; --log-level DEBUG "
        "shows the traceback)"
    )


def test_a_plugin_missing_a_module_of_its_own_is_a_bug_not_a_dependency(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pkg = tmp_path / "mods" / "twtest_broken"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("import twtest_broken.helpers_typo\n")
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    fake_eps(monkeypatch, broken="twtest_broken:Plugin")
    with pytest.raises(PluginError) as exc:
        Kernel.from_config(str(write(tmp_path, "")))  # not even named: never silently skipped
    assert "twtest_broken.helpers_typo" in str(exc.value)
    assert "own package" in str(exc.value) and "pip install" not in str(exc.value)


NOT_A_FACTORY = NoConfigPlugin()  # an instance, where the entry point wants its class


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        (
            "twtest_x:Plugin()",
            "plugin 'bad': entry point bad = \"twtest_x:Plugin()\" is not of the form "
            '"module:attribute" (fix [project.entry-points.toolwire] in the plugin\'s '
            "pyproject.toml and reinstall it)",
        ),
        (
            "twtest_no_such_module_xyz:Plugin",
            "plugin 'bad': cannot be loaded: entry point bad = \"twtest_no_such_module_xyz:"
            "Plugin\" names module 'twtest_no_such_module_xyz', which is not installed (No "
            "module named 'twtest_no_such_module_xyz'): a typo in the entry point or a broken "
            "install; fix [project.entry-points.toolwire] in the plugin's pyproject.toml and "
            "reinstall it",
        ),
        (
            f"{HERE}:DemoPlugn",
            f"plugin 'bad': cannot be loaded: entry point bad = \"{HERE}:DemoPlugn\" names "
            f"'DemoPlugn', which '{HERE}' does not define (did you mean 'DemoPlugin'?); fix "
            "[project.entry-points.toolwire] in the plugin's pyproject.toml and reinstall it",
        ),
        (
            HERE,
            f"plugin 'bad': entry point bad = \"{HERE}\" names the module '{HERE}': an entry "
            "point names a factory (the plugin class, or a function returning the plugin) "
            f'that the kernel calls once per kernel, e.g. bad = "{HERE}:MyPlugin"',
        ),
        (
            f"{HERE}:NOT_A_FACTORY",
            f"plugin 'bad': entry point bad = \"{HERE}:NOT_A_FACTORY\" names a NoConfigPlugin "
            "object, not a class or function: an entry point names a factory (the plugin "
            "class, or a function returning the plugin) that the kernel calls once per "
            f'kernel, e.g. bad = "{HERE}:NoConfigPlugin"',
        ),
    ],
    ids=["malformed", "no-such-module", "no-such-attribute", "a-module", "an-instance"],
)
def test_an_entry_point_that_names_no_factory_says_what_to_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: str, expected: str
) -> None:
    """A plugin author's slips in [project.entry-points.toolwire]. Before: "AttributeError:
    'NoneType' object has no attribute 'group'", a misspelt module blamed on "a module of
    the plugin's own package", "'module' object is not callable" (or, with a table, "takes
    no configuration"), "'NoConfigPlugin' object is not callable"."""
    fake_eps(monkeypatch, bad=target)
    with pytest.raises(PluginError) as ei:
        Kernel.from_config(str(write(tmp_path, "[plugins.bad]\nx = 1\n")))
    assert str(ei.value) == expected


class TakesNoConfig:
    Config = DemoConfig

    def __init__(self) -> None:  # forgot the config parameter
        self.config = DemoConfig()


class NeedsAConfig:  # forgot `Config = ...`
    def __init__(self, config: DemoConfig) -> None:
        self.config = config


class NeedsMoreThanItsConfig:
    Config = DemoConfig

    def __init__(self, config: DemoConfig, kernel: object) -> None:  # the kernel passes one
        self.config = config


def test_a_factory_that_cannot_take_what_the_kernel_passes_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: "failed to start: TypeError: TakesNoConfig.__init__() takes 1 positional
    argument but 2 were given", which does not say that the kernel passes the config
    because of the `Config` attribute (or passes nothing without one)."""
    fake_eps(monkeypatch, a=f"{HERE}:TakesNoConfig", b=f"{HERE}:NeedsAConfig")
    p = write(tmp_path, 'enabled_plugins = ["a"]\n')
    with pytest.raises(PluginError) as ei:
        Kernel.from_config(str(p))
    assert str(ei.value) == (
        "plugin 'a': TakesNoConfig has a Config attribute, so the kernel calls "
        "TakesNoConfig(config) with the validated [plugins.a] table, but it takes no such "
        "argument (too many positional arguments): give it a config parameter"
    )
    p = write(tmp_path, 'enabled_plugins = ["b"]\n')
    with pytest.raises(PluginError) as ei:
        Kernel.from_config(str(p))
    assert str(ei.value) == (
        "plugin 'b': NeedsAConfig has no Config attribute, so the kernel calls NeedsAConfig() "
        "with no arguments, but it needs some (missing a required argument: 'config'): "
        "declare Config = <its pydantic model> on it, or give its parameters defaults"
    )
    # a factory that takes the config and needs more was told it "takes no such argument"
    fake_eps(monkeypatch, c=f"{HERE}:NeedsMoreThanItsConfig")
    with pytest.raises(PluginError) as ei:
        Kernel.from_config(str(write(tmp_path, 'enabled_plugins = ["c"]\n')))
    assert str(ei.value) == (
        "plugin 'c': NeedsMoreThanItsConfig has a Config attribute, so the kernel calls "
        "NeedsMoreThanItsConfig(config) with the validated [plugins.c] table and nothing "
        "else, but it needs more (missing a required argument: 'kernel'): give its other "
        "parameters defaults"
    )


class LaxConfig(BaseModel):  # pydantic's default: unknown keys are dropped
    label: str = "x"
    refuse: list[str] = Field(default_factory=list, alias="deny")


class LaxPlugin:
    Config = LaxConfig

    def __init__(self, config: LaxConfig) -> None:
        self.config = config


def test_keys_a_lax_config_model_drops_are_warned_about(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """config.md promises unknown keys are errors, but a third-party plugin's Config that
    does not say extra="forbid" dropped `labl = "y"` without a word: the label stayed "x".
    The kernel cannot refuse what the plugin accepts, but it names the key and the fix."""
    fake_eps(monkeypatch, lax=f"{HERE}:LaxPlugin")
    monkeypatch.setenv("TOOLWIRE_PLUGINS__lax__colour", "red")
    p = write(tmp_path, '[plugins.lax]\nlabl = "y"\ndeny = ["rm"]\n')
    with caplog.at_level("WARNING", logger="toolwire.config"):
        k = Kernel.from_config(str(p))
    assert k.plugins.plugins["lax"].config.refuse == ["rm"]  # an alias is a known key
    assert [r.getMessage() for r in caplog.records] == [
        f"{p}: plugins.lax.colour: unknown key (known keys: deny, label) (the value comes "
        "from the environment variable TOOLWIRE_PLUGINS__lax__colour); the plugin ignores it "
        "(its Config model does not refuse unknown keys: model_config = "
        "ConfigDict(extra='forbid') would make this an error)",
        f"{p}: plugins.lax.labl: unknown key; did you mean 'label'?; the plugin ignores it "
        "(its Config model does not refuse unknown keys: model_config = "
        "ConfigDict(extra='forbid') would make this an error)",
    ]
    caplog.clear()
    with caplog.at_level("WARNING", logger="toolwire.config"):
        Kernel.from_config(str(write(tmp_path, '[plugins.lax]\nlabel = "y"\n')))
    [only] = [r.getMessage() for r in caplog.records]  # the file's keys are all known now
    assert "plugins.lax.colour" in only
    # A field with an alias is read by its alias only: its name is dropped too. Before, the
    # name counted as known, and `refuse = [...]` was lost without a word.
    monkeypatch.delenv("TOOLWIRE_PLUGINS__lax__colour")
    caplog.clear()
    with caplog.at_level("WARNING", logger="toolwire.config"):
        k = Kernel.from_config(str(write(tmp_path, '[plugins.lax]\nrefuse = ["rm"]\n')))
    assert k.plugins.plugins["lax"].config.refuse == []
    [dropped] = [r.getMessage() for r in caplog.records]
    assert dropped.startswith(f"{p}: plugins.lax.refuse: unknown key (known keys: deny, label)")


class ByNameConfig(BaseModel):
    model_config = ConfigDict(validate_by_name=True)
    refuse: list[str] = Field(default_factory=list, alias="deny")


class ByNamePlugin:
    Config = ByNameConfig

    def __init__(self, config: ByNameConfig) -> None:
        self.config = config


def test_a_lax_model_read_by_name_too_warns_only_of_keys_it_drops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fake_eps(monkeypatch, byname=f"{HERE}:ByNamePlugin")
    for key in ("refuse", "deny"):  # validate_by_name: the name is read as well as the alias
        with caplog.at_level("WARNING", logger="toolwire.config"):
            k = Kernel.from_config(str(write(tmp_path, f'[plugins.byname]\n{key} = ["rm"]\n')))
        assert k.plugins.plugins["byname"].config.refuse == ["rm"]
        assert caplog.records == []
    p = write(tmp_path, '[plugins.byname]\nrefuses = ["rm"]\n')
    with caplog.at_level("WARNING", logger="toolwire.config"):
        Kernel.from_config(str(p))
    [dropped] = [r.getMessage() for r in caplog.records]
    # the field's name is a key the model reads, so it is the one suggested
    assert dropped.startswith(f"{p}: plugins.byname.refuses: unknown key; did you mean 'refuse'?")


def test_any_other_load_error_is_fatal_and_names_the_plugin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_eps(monkeypatch, broken=f"{HERE}:_failing_factory")
    with pytest.raises(PluginError, match="plugin 'broken': failed to start: RuntimeError: kaput"):
        Kernel.from_config(str(write(tmp_path, "")))
    fake_eps(monkeypatch, broken=f"{HERE}:DoesNotExist")
    with pytest.raises(PluginError, match="plugin 'broken': cannot be loaded"):
        Kernel.from_config(str(write(tmp_path, "")))


def test_bad_tool_module_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_eps(monkeypatch)
    p = write(tmp_path, '[tools]\nmodules = ["no_such_module_abc"]\n')
    with pytest.raises(
        ConfigError, match=r"tools\.modules\[0\]: cannot import module 'no_such_module_abc'"
    ):
        Kernel.from_config(str(p))


def test_a_tool_module_beside_the_config_file_says_to_set_pythonpath(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: only Python's "No module named 'sitetools_abc'": nothing said that the
    config file's directory is not searched, nor what to set."""
    fake_eps(monkeypatch)
    (tmp_path / "sitetools_abc.py").write_text("")
    p = write(tmp_path, '[tools]\nmodules = ["sitetools_abc"]\n')
    with pytest.raises(ConfigError) as ei:
        Kernel.from_config(str(p))
    message = str(ei.value)
    assert "tools.modules[0]: cannot import module 'sitetools_abc'" in message
    assert f"is in {tmp_path.resolve()}, which is not on Python's import path" in message
    assert f"set PYTHONPATH={tmp_path.resolve()}" in message
    # nowhere to be found: install it or add its directory to PYTHONPATH
    p = write(tmp_path, '[tools]\nmodules = ["no_such_module_abc"]\n')
    with pytest.raises(ConfigError, match="install the package that provides it, or add"):
        Kernel.from_config(str(p))
    # found, but a module it imports is missing: that one is named
    (tmp_path / "needs_dep_abc.py").write_text("import no_such_dependency_abc\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    p = write(tmp_path, '[tools]\nmodules = ["needs_dep_abc"]\n')
    with pytest.raises(
        ConfigError,
        match="a module it imports is missing: install the package that provides "
        "'no_such_dependency_abc'",
    ):
        Kernel.from_config(str(p))


@pytest.mark.parametrize(
    ("modules", "problem"),
    [
        (
            '["broken_tools_mod"]',
            r"tools\.modules\[0\]: module 'broken_tools_mod' failed while "
            r"being imported: SyntaxError",
        ),
        ('["toolwire.examples", "toolwire.examples"]', r"tools\.modules\[1\]: tool name 'add'"),
        (
            '[{module = "toolwire.examples", namespace = "bad name"}]',
            r"tools\.modules: entry 0: namespace 'bad name': use 1-100 letters[^;]*$",
        ),
        (  # before: pydantic's pair of errors for the two union branches
            '[{module = "toolwire.examples", namespace = 5}]',
            r"tools\.modules: entry 0: namespace 5 is an integer, not a string; [^;]*$",
        ),
        (  # before: "is a dict", Python's name, not TOML's
            '[{module = "toolwire.examples", namespace = {a = 1}}]',
            r"tools\.modules: entry 0: namespace \{'a': 1\} is a table, not a string; [^;]*$",
        ),
        (
            '[{module = "toolwire.examples", extra = 1}]',
            r"tools\.modules: entry 0: unknown key\(s\) \['extra'\]; an entry is",
        ),
    ],
)
def test_broken_tool_modules_are_config_errors_naming_the_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, modules: str, problem: str
) -> None:
    """Before: a SyntaxError or a bad namespace was a traceback, a clash had no file or key,
    and an unknown key gave pydantic's two-branch union message."""
    fake_eps(monkeypatch)
    (tmp_path / "broken_tools_mod.py").write_text("def oops(:\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    p = write(tmp_path, f"[tools]\nmodules = {modules}\n")
    with pytest.raises(ConfigError, match=problem) as ei:
        Kernel.from_config(str(p))
    assert str(p) in str(ei.value)


def test_from_config_takes_a_path_object_as_well_as_a_string(tmp_path: Path) -> None:
    path = tmp_path / "toolwire.toml"
    path.write_text(
        'state = "memory://"\nenabled_plugins = []\n[tools]\nmodules = ["toolwire.examples"]\n'
    )
    by_path = Kernel.from_config(path)
    by_str = Kernel.from_config(str(path))
    assert {t.name for t in by_path.list_tools()} == {t.name for t in by_str.list_tools()}
    assert "add" in {t.name for t in by_path.list_tools()}


def test_an_invalid_value_from_the_environment_names_the_variable(tmp_path: Path) -> None:
    path = tmp_path / "toolwire.toml"
    path.write_text('state = "memory://"\nenabled_plugins = []\n')
    with pytest.raises(ConfigError) as exc:
        load_config(path, env={"TOOLWIRE_MAX_ATTEMPTS": "abc"})
    assert "max_attempts" in str(exc.value)
    assert "environment variable TOOLWIRE_MAX_ATTEMPTS" in str(exc.value)
    path.write_text('state = "memory://"\nmax_attempts = "abc"\n')
    with pytest.raises(ConfigError) as exc:
        load_config(path, env={})
    assert "environment" not in str(exc.value)  # the file's own value: no variable to blame


def test_a_plugin_can_ask_where_a_value_came_from(tmp_path: Path) -> None:
    """api.md: `ToolwireConfig.env_var_of(key)` / `source_of(key)`. Before: where a value
    came from was kept only in a private attribute, so a plugin checking a value itself
    (ratelimit's config_file) blamed the file for a variable's value."""
    p = write(tmp_path, '[plugins.audit]\npath = "a.jsonl"\n')
    env = {
        "TOOLWIRE_STATE": "memory://",
        "TOOLWIRE_PLUGINS__RATELIMIT__CONFIG_FILE": "p.yaml",
        "TOOLWIRE_PLUGINS__MCP__SERVERS": '{"w": {"url": "http://h/mcp", "args": ["a"]}}',
        "TOOLWIRE_DISABLE_PLUGINS": "retry",
    }
    cfg = load_config(p, env=env)
    var = "TOOLWIRE_PLUGINS__RATELIMIT__CONFIG_FILE"
    assert cfg.env_var_of("plugins.ratelimit.config_file") == var
    assert cfg.source_of("plugins.ratelimit.config_file") == f"the environment variable {var}"
    assert cfg.env_var_of("state") == "TOOLWIRE_STATE"
    assert cfg.env_var_of("disabled_plugins[retry]") == "TOOLWIRE_DISABLE_PLUGINS"
    # a key inside a table one variable gave as JSON: that variable
    assert cfg.env_var_of("plugins.mcp.servers.w.args[0]") == "TOOLWIRE_PLUGINS__MCP__SERVERS"
    # the file's own values, and keys nobody set
    for key in ("plugins.audit.path", "plugins.audit", "max_attempts", "plugins"):
        assert cfg.env_var_of(key) is None, key
        assert cfg.source_of(key) == f"key {key} in {p}"
    assert cfg.env_var_of("plugins.ratelimit") is None  # the table is not the variable's
    bare = load_config(tmp_path / "none.toml", env={"TOOLWIRE_DEADLINE_S": "5"}, required=False)
    assert bare.path is None
    assert bare.source_of("deadline_s") == "the environment variable TOOLWIRE_DEADLINE_S"
    assert bare.source_of("max_attempts") == (
        "key max_attempts (no config file: a default, or set in code)"
    )


def test_a_bad_plugin_order_from_the_environment_names_the_variable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: blamed on the file (`a.toml: plugins.audit.order: must be an integer`)."""
    from toolwire.cli import main

    p = write(tmp_path, 'enabled_plugins = ["audit"]\n')
    monkeypatch.setenv("TOOLWIRE_LOAD_PLUGINS", "audit")
    monkeypatch.setenv("TOOLWIRE_PLUGINS__AUDIT__ORDER", "abc")
    assert main(["--config", str(p), "config", "check"]) == 2
    err = capsys.readouterr().err
    assert "plugins.audit.order: must be an integer" in err
    assert "environment variable TOOLWIRE_PLUGINS__AUDIT__ORDER" in err


def test_the_short_plugins_list_and_enabled_plugins_together_are_an_error(tmp_path: Path) -> None:
    """Before: `plugins = [...]` silently replaced `enabled_plugins`."""
    p = write(tmp_path, 'enabled_plugins = ["audit"]\nplugins = ["retry"]\n')
    with pytest.raises(ConfigError, match="keep one"):
        load_config(p, env={})


def test_relative_sqlite_state_is_beside_the_config_file_unless_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: `toolwire serve --config /abs/toolwire.toml` started by an MCP client put the
    state database in whatever directory the client started it from."""
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    p = write(tmp_path, 'state = "sqlite:///.toolwire/state.db?busy_timeout=2"\n')
    cfg = load_config(p, env={})
    assert cfg.state == f"sqlite:///{tmp_path.resolve()}/.toolwire/state.db?busy_timeout=2"
    env = {"TOOLWIRE_STATE": "sqlite:///mine.db"}  # the caller's own, relative to its cwd
    assert load_config(p, env=env).state == "sqlite:///mine.db"
    for url in ("sqlite:////abs/s.db", "redis://127.0.0.1:6379/0", "memory://"):
        assert load_config(write(tmp_path, f'state = "{url}"\n'), env={}).state == url


@pytest.mark.parametrize("dirname", ["has%41pct", "has#hash", "has?q", "plain"])
def test_a_relative_sqlite_path_survives_odd_characters_in_the_config_directory(
    tmp_path: Path, dirname: str
) -> None:
    """Before: the joined path went into the URL unencoded, so open_store decoded %41 to A,
    cut the path at '#', or read '?q/state.db' as an option."""
    from toolwire.state import open_store

    conf = tmp_path / dirname
    conf.mkdir()
    state = load_config(write(conf, 'state = "sqlite:///state.db"\n'), env={}).state
    assert state is not None
    assert open_store(state).path == str((conf / "state.db").resolve())  # type: ignore[attr-defined]


def test_special_sqlite_urls_are_left_alone(tmp_path: Path) -> None:
    for url in ("sqlite:///:memory:", "sqlite:///%7E/x.db", "sqlite:///~/x.db"):
        assert load_config(write(tmp_path, f'state = "{url}"\n'), env={}).state == url


def test_tool_module_entries_may_be_module_refs() -> None:
    from toolwire._config import ModuleRef, ToolsConfig

    cfg = ToolsConfig(modules=[ModuleRef(module="toolwire.examples"), "x.y"])
    assert [r.module for r in cfg.refs()] == ["toolwire.examples", "x.y"]


# ------------------------------------------- broken files and env vars: typed errors
@pytest.mark.parametrize(
    ("text", "var", "where"),
    [
        ("[plugins]\naudit = 5\n", "TOOLWIRE_PLUGINS__AUDIT__PATH", "plugins.audit"),
        ('plugins = "x"\n', "TOOLWIRE_PLUGINS__AUDIT__PATH", "plugins"),
        (
            '[plugins.audit]\npath = "p"\n',
            "TOOLWIRE_PLUGINS__" + "AUDIT__PATH__SUB",
            "plugins.audit.path",
        ),
    ],
)
def test_plugin_env_var_under_a_value_that_is_not_a_table(
    tmp_path: Path, text: str, var: str, where: str
) -> None:
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as ei:
        load_config(p, env={var: "1"})
    msg = str(ei.value)
    assert msg.startswith(f"{p}: {where}: ") and var in msg and "not a table" in msg


def test_config_file_that_is_not_utf8(tmp_path: Path) -> None:
    p = tmp_path / "toolwire.toml"
    p.write_bytes(b'state = "memory://\xe9"\n')
    with pytest.raises(ConfigError, match=r"toolwire\.toml: .*not UTF-8"):
        load_config(p, env={})


def test_secrets_file_that_is_not_a_string(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"secrets_file: .*a path \(a string\)"):
        load_config(write(tmp_path, "secrets_file = 5\n"), env={})


@pytest.mark.parametrize("what", ["directory", "not utf-8"])
def test_secrets_file_that_cannot_be_read(tmp_path: Path, what: str) -> None:
    target = tmp_path / "app.secrets.env"
    if what == "directory":
        target.mkdir()
    else:
        target.write_bytes(b"A_KEY=\xff\xfe\n")
    p = write(tmp_path, 'secrets_file = "app.secrets.env"\n')
    with pytest.raises(ConfigError) as ei:
        load_config(p, env={})
    assert "app.secrets.env" in str(ei.value) and "secrets_file" in str(ei.value)
    # the env var's name is given when the path came from there
    with pytest.raises(ConfigError, match="TOOLWIRE_SECRETS_FILE"):
        load_config(write(tmp_path, ""), env={"TOOLWIRE_SECRETS_FILE": str(target)})


@pytest.mark.parametrize("deep_first", [True, False])
def test_a_variable_inside_another_variables_value_is_an_error_in_any_order(
    deep_first: bool,
) -> None:
    """Before: with the deeper variable first in the environment, the shallower one silently
    overwrote it; the other order was an error."""
    pairs = [("TOOLWIRE_PLUGINS__a__x__y", "1"), ("TOOLWIRE_PLUGINS__a__x", "2")]
    env = dict(pairs if deep_first else pairs[::-1])
    with pytest.raises(ConfigError, match=r"set by TOOLWIRE_PLUGINS__a__x, not a table") as exc:
        load_config(None, env=env, required=False)
    assert "TOOLWIRE_PLUGINS__a__x__y" in str(exc.value)


@pytest.mark.parametrize("table", ['{"y": 1}', '{"z": 1}'])
def test_a_variable_inside_another_variables_table_is_an_error(table: str) -> None:
    """Before: a variable holding a JSON object took the deeper variable's key silently
    ({"y": 1} became y = 2, {"z": 1} grew a y), where any other value is an error."""
    env = {"TOOLWIRE_PLUGINS__a__x": table, "TOOLWIRE_PLUGINS__a__x__y": "2"}
    with pytest.raises(
        ConfigError, match=r"plugins\.a\.x: is a table set by TOOLWIRE_PLUGINS__a__x"
    ):
        load_config(None, env=env, required=False)


def test_two_spellings_of_one_variable_are_an_error() -> None:
    """Before: keys are lower-cased, so one silently overwrote the other, and which one won
    depended on the environment's order."""
    env = {"TOOLWIRE_PLUGINS__a__x": "1", "TOOLWIRE_PLUGINS__a__X": "2"}
    with pytest.raises(ConfigError, match=r"plugins\.a\.x: environment variables .* both set it"):
        load_config(None, env=env, required=False)


def test_looked_for_says_where_a_config_path_was_read(tmp_path: Path) -> None:
    from toolwire import looked_for

    base = tmp_path
    assert looked_for("p.yaml", base / "p.yaml", base) == (
        f" (looked for {base / 'p.yaml'}: a relative path is read from the directory of "
        "toolwire.toml)"
    )
    cwd_note = looked_for("p.yaml", os.path.abspath("p.yaml"), None)
    assert cwd_note == (
        f" (looked for {os.path.abspath('p.yaml')}: with no toolwire.toml, a relative path "
        "is read from the working directory)"
    )
    absolute = str(base / "p.yaml")
    assert looked_for(absolute, absolute, base) == ""  # read as written: nothing to add
    assert looked_for(absolute + "/", absolute, base) == ""  # the same file
    home = os.path.expanduser("~/p.yaml")
    assert looked_for("~/p.yaml", home, base) == f" (read as {home})"


def test_unknown_key_suggests_the_keys_a_model_reads() -> None:
    """Before: the known keys were each field's `alias`, so a field read from its
    validation alias was offered under a key the model refuses ('m', not 'mode_v')."""
    from pydantic import ConfigDict

    from toolwire._config import unknown_key

    class Inner(BaseModel):
        model_config = ConfigDict(extra="forbid")
        mode: str = Field("x", alias="m", validation_alias="mode_v")
        hidden: int = Field(0, exclude=True)

    class Outer(BaseModel):
        model_config = ConfigDict(extra="forbid")
        inner: Inner = Field(default_factory=Inner, validation_alias="inner_v")

    assert unknown_key(Inner, ("mode_x",)) == "unknown key; did you mean 'mode_v'?"
    assert unknown_key(Outer, ("inner_v", "mode_x")) == "unknown key; did you mean 'mode_v'?"
    assert unknown_key(Inner, ("zzz",)) == "unknown key (known keys: mode_v)"


def test_nesting_too_deep_is_a_config_error_naming_where(tmp_path: Path) -> None:
    """Before: a TOML value 500 arrays deep, or a TOOLWIRE_PLUGINS__ JSON value 600 deep,
    ended in a RecursionError traceback (tomllib, json, or resolving secrets)."""
    deep_toml = write(tmp_path, "[plugins.audit]\npath = " + "[" * 500 + "]" * 500 + "\n")
    with pytest.raises(ConfigError, match="nested too deeply to read") as exc:
        load_config(deep_toml, env={})
    assert exc.value.file == str(deep_toml)

    # parses, but deeper than any configuration needs: named by its key
    inline = write(tmp_path, "[plugins.audit]\npath = " + "{a=" * 150 + "1" + "}" * 150 + "\n")
    with pytest.raises(ConfigError, match="nested more than 100 levels deep") as exc:
        load_config(inline, env={})
    assert exc.value.key == "plugins.audit.path.a" and exc.value.file == str(inline)
    assert len(str(exc.value)) < 300  # not the 150-level path

    plain = write(tmp_path, "max_attempts = 3\n", name="plain.toml")
    var = "TOOLWIRE_PLUGINS__AUDIT__PATH"
    for depth, expected in ((600, "nested more than 100"), (3000, "JSON nested too deeply")):
        with pytest.raises(ConfigError, match=expected) as exc:
            load_config(plain, env={var: "[" * depth + "]" * depth})
        assert var in str(exc.value) and exc.value.file is None, depth  # not the file's fault

    # 100 levels is still fine
    ok = write(tmp_path, "[plugins.audit]\npath = " + "[" * 97 + "]" * 97 + "\n", name="ok.toml")
    assert load_config(ok, env={}).plugins["audit"]["path"]


@pytest.mark.parametrize(
    ("line", "value"),
    [
        ("B_KEY=ends-with-a-quote'", "ends-with-a-quote'"),
        ('B_KEY="quoted" # the gateway\'s token', "quoted"),
        ("B_KEY='single' # a comment", "single"),
        ("B_KEY=\"'inner quotes kept'\"", "'inner quotes kept'"),
        ("B_KEY=plain # a comment", "plain"),
        ("B_KEY=has#hash", "has#hash"),
        ('export B_KEY = "spaced"', "spaced"),
    ],
)
def test_a_secrets_file_value_keeps_its_own_quotes_and_drops_comments(
    tmp_path: Path, line: str, value: str
) -> None:
    """Before: every quote character at either end was stripped (a token ending in ``'`` lost
    it; ``'"x"'`` became ``x``) and a comment after a quoted value became part of the secret
    (``"abc" # note`` -> ``abc" # note``): the service then refused a credential that looked
    right in the file."""
    (tmp_path / "app.secrets.env").write_text(line + "\n")
    p = write(
        tmp_path, 'secrets_file = "app.secrets.env"\n[plugins.a]\nkey = {"$secretRef" = "B_KEY"}\n'
    )
    assert load_config(p, env={}).plugins["a"] == {"key": value}


def test_a_secrets_file_quoted_value_left_open_is_an_error_naming_the_line(
    tmp_path: Path,
) -> None:
    (tmp_path / "app.secrets.env").write_text('A=1\nB_KEY="no closing quote\n')
    p = write(
        tmp_path, 'secrets_file = "app.secrets.env"\n[plugins.a]\nkey = {"$secretRef" = "B_KEY"}\n'
    )
    with pytest.raises(ConfigError, match=r"app\.secrets\.env.*line 2.*closing"):
        load_config(p, env={})


def test_a_table_for_a_plugin_not_installed_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: `[plugins.approval]` with toolwire-approval not installed said only
    "configuration for unknown plugin 'approval'; installed plugins: [...]", where
    `enabled_plugins = ["approval"]` says `pip install toolwire-approval?`."""
    fake_eps(monkeypatch, demo=f"{HERE}:DemoPlugin")
    with pytest.raises(ConfigError) as ei:
        Kernel.from_config(str(write(tmp_path, '[plugins.approval]\ndefault = "NONE"\n')))
    assert "configuration for unknown plugin 'approval'" in str(ei.value)
    assert "pip install toolwire-approval?" in str(ei.value)


def test_an_empty_environment_variable_does_not_hide_the_secrets_file_value(
    tmp_path: Path,
) -> None:
    """Before: `BRAVE_API_KEY=` in the environment (an unset ${VAR} in a compose file, a
    placeholder export) resolved the reference to "" although the secrets file held the
    key: the provider was listed available with an empty key and every request was refused."""
    (tmp_path / "app.secrets.env").write_text("B_KEY=from-the-file\n")
    p = write(
        tmp_path, 'secrets_file = "app.secrets.env"\n[plugins.a]\nkey = {"$secretRef" = "B_KEY"}\n'
    )
    assert load_config(p, env={"B_KEY": ""}).plugins["a"] == {"key": "from-the-file"}
    # a value in the environment still wins; empty everywhere stays empty (plugins judge it)
    assert load_config(p, env={"B_KEY": "from-env"}).plugins["a"] == {"key": "from-env"}
    q = write(tmp_path, '[plugins.a]\nkey = {"$secretRef" = "B_KEY"}\n', name="q.toml")
    assert load_config(q, env={"B_KEY": ""}).plugins["a"] == {"key": ""}


def test_every_missing_secret_is_named_at_once(tmp_path: Path) -> None:
    """Before: only the first missing secret was named, so a config with several (a search
    backend, a gateway token, an approver token) took one failed start per secret."""
    p = write(
        tmp_path,
        '[server]\nauth_token = {"$secretRef" = "GW_TOKEN"}\n'
        '[plugins.a]\nkeys = [{"$secretRef" = "A_KEY"}, {"$secretRef" = "B_KEY"}]\n'
        'again = {"$secretRef" = "A_KEY"}\n',
    )
    with pytest.raises(ConfigError) as ei:
        load_config(p, env={"B_KEY": "set"})
    text = str(ei.value)
    assert ei.value.key == "server.auth_token" and "secret 'GW_TOKEN' is not set" in text
    assert (
        "also not set: plugins.a.keys[0]: secret 'A_KEY'; plugins.a.again: secret 'A_KEY'" in text
    )
    assert "export GW_TOKEN=... A_KEY=... or add them to the secrets file" in text


def test_a_byte_order_mark_is_read_past_in_the_config_and_the_secrets_file(
    tmp_path: Path,
) -> None:
    """Before: a file saved "UTF-8 with BOM" (Windows Notepad's default) gave "invalid TOML:
    Invalid statement (at line 1, column 1)" for toolwire.toml, and for a secrets file made
    its first name "\\ufeffB_KEY", so the secret was reported "not set" though it was there."""
    (tmp_path / "app.secrets.env").write_bytes(b"\xef\xbb\xbfB_KEY=from-the-file\n")
    p = tmp_path / "toolwire.toml"
    p.write_bytes(
        b"\xef\xbb\xbf"
        + b'secrets_file = "app.secrets.env"\n[plugins.a]\nkey = {"$secretRef" = "B_KEY"}\n'
    )
    assert load_config(p, env={}).plugins["a"] == {"key": "from-the-file"}


def test_a_home_relative_config_path_and_secrets_file_are_expanded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: `secrets_file = "~/app.secrets.env"` (no shell expands a path written in the
    file) and a quoted `TOOLWIRE_CONFIG="~/toolwire.toml"` were "not found" although the
    files existed; the SQLite path of `state` already expanded `~`."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "app.secrets.env").write_text("B_KEY=from-home\n")
    write(
        tmp_path,
        'secrets_file = "~/app.secrets.env"\n[plugins.a]\nkey = {"$secretRef" = "B_KEY"}\n',
    )
    cfg = load_config(None, env={"TOOLWIRE_CONFIG": "~/toolwire.toml"})
    assert cfg.plugins["a"] == {"key": "from-home"}
    assert load_config("~/toolwire.toml", env={}).plugins["a"] == {"key": "from-home"}


class LimitsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    limits: dict[str, int] = Field(default_factory=dict)
    tools: list[int] = Field(default_factory=list)


class LimitsPlugin:
    Config = LimitsConfig

    def __init__(self, config: LimitsConfig) -> None:
        self.config = config


def test_a_bad_value_inside_a_json_table_from_a_variable_names_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """config.md: "A JSON object sets the whole table" and "An error about a value a
    variable set names the variable, not the file". Before: a wrong value inside the
    JSON of TOOLWIRE_PLUGINS__LIMITS__LIMITS was `toolwire.toml: plugins.limits.limits.add:
    Input should be a valid integer ...`, sending the user to a file that has no such key."""
    fake_eps(monkeypatch, limits=f"{HERE}:LimitsPlugin")
    p = write(tmp_path, "[plugins.limits]\nlimits = {add = 2}\n")
    for var, raw, key in [
        ("TOOLWIRE_PLUGINS__" + "LIMITS__LIMITS", '{"add": "x"}', "plugins.limits.limits.add"),
        ("TOOLWIRE_PLUGINS__" + "LIMITS__TOOLS", '[1, "y"]', "plugins.limits.tools.1"),
    ]:
        with pytest.raises(ConfigError) as ei:
            Kernel.from_config(load_config(p, env={var: raw}))
        assert f"{key}: Input should be a valid integer" in str(ei.value)
        assert f"(the value comes from the environment variable {var})" in str(ei.value)
    # the file's own wrong value is still the file's
    bad = write(tmp_path, "[plugins.limits]\nlimits = {add = 'x'}\n", name="bad.toml")
    with pytest.raises(ConfigError) as ei:
        Kernel.from_config(load_config(bad, env={}))
    assert "environment variable" not in str(ei.value) and str(bad) in str(ei.value)


class CrashingValidatorConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    prefix: str = "q"

    @pydantic.field_validator("prefix")
    @classmethod
    def _check(cls, v: str) -> str:
        if v == "bad":
            raise RuntimeError("prefix check crashed")  # a bug: not a ValueError
        return v


class CrashingValidatorPlugin:
    Config = CrashingValidatorConfig

    def __init__(self, config: CrashingValidatorConfig) -> None:
        self.config = config


def test_a_config_validator_that_crashes_is_a_plugin_error_naming_the_plugin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """config.md: "Any other load or construction error is fatal and names the plugin".
    Before: a Config validator raising anything but ValueError escaped Kernel.from_config
    as that bare exception (RuntimeError: prefix check crashed), and `toolwire call`
    printed a traceback with exit code 1."""
    fake_eps(monkeypatch, crashy=f"{HERE}:CrashingValidatorPlugin")
    p = write(tmp_path, "[plugins.crashy]\nprefix = 'bad'\n")
    with pytest.raises(PluginError) as ei:
        Kernel.from_config(load_config(p, env={}))
    assert ei.value.plugin == "crashy"
    assert "CrashingValidatorConfig failed while validating [plugins.crashy]" in str(ei.value)
    assert "RuntimeError: prefix check crashed" in str(ei.value)
    assert isinstance(ei.value.__cause__, RuntimeError)
    # `config check` of a table the plugin list leaves out reports it, not a traceback
    off = write(tmp_path, "enabled_plugins = []\n[plugins.crashy]\nprefix = 'bad'\n", "off.toml")
    with caplog.at_level("WARNING", logger="toolwire"):
        config_mod.check_unloaded_plugin_tables(load_config(off, env={}))
    assert "would fail: plugin 'crashy': its Config model" in caplog.text


def test_a_list_or_table_from_a_variable_that_is_not_json_says_how_to_write_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """config.md: a variable's value is "parsed as JSON when it parses, else taken as a
    string". Before: TOOLWIRE_PLUGINS__LIMITS__TOOLS=1,2 (a comma list, as
    TOOLWIRE_LOAD_PLUGINS takes) failed as "Input should be a valid list" and no more."""
    fake_eps(monkeypatch, limits=f"{HERE}:LimitsPlugin")
    p = write(tmp_path, "")
    tools, limits = "TOOLWIRE_PLUGINS__" + "LIMITS__TOOLS", "TOOLWIRE_PLUGINS__" + "LIMITS__LIMITS"
    with pytest.raises(ConfigError) as ei:
        Kernel.from_config(load_config(p, env={tools: "1,2"}))
    assert "plugins.limits.tools: Input should be a valid list" in str(ei.value)
    assert f"""a variable gives one as JSON: {tools}='["a", "b"]'""" in str(ei.value)
    with pytest.raises(ConfigError) as ei:
        Kernel.from_config(load_config(p, env={limits: "add=2"}))
    assert f"""a variable gives one as JSON: {limits}='{{"k": "v"}}'""" in str(ei.value)
    # a JSON value of the wrong shape, or the file's own: no such advice
    with pytest.raises(ConfigError) as ei:
        Kernel.from_config(load_config(p, env={tools: "5"}))
    assert "as JSON" not in str(ei.value)
    bad = write(tmp_path, "[plugins.limits]\ntools = 'a,b'\n", name="bad.toml")
    with pytest.raises(ConfigError) as ei:
        Kernel.from_config(load_config(bad, env={}))
    assert "as JSON" not in str(ei.value)


def test_a_plugin_named_with_a_dash_or_capitals_is_configured_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """config.md: every key of a plugin's table may come from TOOLWIRE_PLUGINS__<plugin>__<key>.
    Before: the plugin part was only lower-cased, so a plugin whose entry point is named
    `my-demo` (a shell variable cannot hold `-`) or `MyDemo` could not be configured from
    the environment: TOOLWIRE_PLUGINS__MY_DEMO__GREETING was "configuration for unknown
    plugin 'my_demo' (did you mean 'my-demo'?) ... rename or unset it"."""
    fake_eps(monkeypatch, **{"my-demo": f"{HERE}:DemoPlugin", "MyDemo": f"{HERE}:DemoPlugin"})
    p = write(tmp_path, "")
    dash, caps = "TOOLWIRE_PLUGINS__" + "MY_DEMO__GREETING", "TOOLWIRE_PLUGINS__" + "MYDEMO__ORDER"
    cfg = load_config(p, env={dash: "hi", caps: "7"})
    assert cfg.plugins == {"my-demo": {"greeting": "hi"}, "MyDemo": {"order": 7}}
    assert cfg.env_var_of("plugins.my-demo.greeting") == dash
    k = Kernel.from_config(cfg)
    assert k.get_plugin("my-demo").config.greeting == "hi"
    assert k.plugins.plugins["MyDemo"].order == 7
    # with the file's own table: the variable still overrides it, named as it is spelt
    q = write(tmp_path, '[plugins.my-demo]\ngreeting = "file"\n', name="q.toml")
    assert load_config(q, env={dash: "env"}).plugins == {"my-demo": {"greeting": "env"}}
    # a plugin that is there lower-case wins over one named like it
    fake_eps(monkeypatch, **{"my_demo": f"{HERE}:DemoPlugin", "my-demo": f"{HERE}:DemoPlugin"})
    assert load_config(p, env={dash: "hi"}).plugins == {"my_demo": {"greeting": "hi"}}


class OrderFieldConfig(BaseModel):
    order: int = 5  # meant as the plugin's own setting: never reaches it


class OrderFieldPlugin:
    Config = OrderFieldConfig

    def __init__(self, config: OrderFieldConfig) -> None:
        self.config = config


def test_a_config_field_named_order_is_refused_naming_the_clash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``order`` in ``[plugins.<name>]`` is the kernel's (the hook order), taken out of the
    table before the plugin's Config sees it. Before: a Config field of that name silently
    kept its default whatever the file said, and the value moved the plugin's hooks."""
    fake_eps(monkeypatch, ordered=f"{HERE}:OrderFieldPlugin")
    p = write(tmp_path, "[plugins.ordered]\norder = 7\n")
    with pytest.raises(PluginError) as ei:
        Kernel.from_config(load_config(p, env={}))
    assert ei.value.plugin == "ordered"
    assert "its Config declares a field 'order'" in str(ei.value)
    assert "rename it" in str(ei.value)
