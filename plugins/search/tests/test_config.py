"""Configuration, key sources, tool definitions, and adding a backend in code."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pydantic
import pytest
import respx
from toolwire_search_testkit import B1, B2, BRAVE_URL, E1, keys_sent, load, make_kernel

from toolwire import ConfigError, Kernel
from toolwire.testing import FakeClock
from toolwire_ratelimit import RateLimitConfig, RateLimitPlugin
from toolwire_retry import RetryConfig, RetryPlugin
from toolwire_search import (
    Backend,
    BackendPage,
    BackendRequest,
    SearchConfig,
    SearchPlugin,
    SearchQuery,
    make_result,
)

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"collections": {"My Docs": {"path": "d"}}}, "lower-case"),
        ({"collections": {"d": {"path": "d", "chunk_words": 50, "overlap_words": 50}}}, "overlap"),
        ({"brave": {"pool": {"keys": ["x"]}}}, "cannot be set in pool"),
        ({"brave": {"pool": {"cooldown_secs": 1}}}, "cooldown_secs"),
        ({"brave": {"base_url": "api.search.brave.com"}}, "http://"),
        ({"chain_order": ["exa", "exa"]}, "more than once"),
        (
            {"searxng": {"max_answer_bytes": 100}},
            "max_answer_bytes\n.*greater than or equal to 1024",
        ),
        ({"brave": {"api_key": "k", "colour": "red"}}, "colour"),
        # failed at startup before, with "ValueError: Unknown scheme for proxy URL"
        ({"proxy": "proxy.internal:3128"}, "proxy\n.*http://, https:// or socks5://"),
        # before: accepted; every call failed with "invalid URL (InvalidURL)", saying
        # neither what nor where, and web_search did not go on to the next backend
        (
            {"brave": {"base_url": "https://api.search.brave.com:abc/res/v1"}},
            "brave.base_url\n.*not a valid URL: Invalid port: 'abc'",
        ),
        ({"exa": {"base_url": "https://:443"}}, "exa.base_url\n.*not a valid URL: it has no host"),
        # before: the kernel failed to start, "discover failed: ValueError: Invalid pattern:
        # '**' can only be an entire path component", naming no key
        (
            {"collections": {"docs": {"path": "d", "include": ["**.md"]}}},
            "include\n.*'\\*\\*.md': '\\*\\*' must be a whole path component.*'\\*\\*/\\*.md'",
        ),
        (
            {"collections": {"docs": {"path": "d", "include": ["/srv/docs/*.md"]}}},
            "include\n.*is absolute; patterns are relative to path",
        ),
        ({"collections": {"docs": {"path": "d", "include": [""]}}}, "include\n.*empty pattern"),
        (
            {"collections": {"docs": {"path": "d", "include": ["../*.md"]}}},
            "include\n.*leaves the folder",
        ),
        # before: a bare UnicodeEncodeError at startup naming no key; a line break failed
        # every request instead (LocalProtocolError), each retried and fallen over
        ({"user_agent": "acme-bot/1.0 (équipe)"}, "user_agent\n.*printable ASCII.*U\\+00E9"),
        ({"user_agent": "acme\r\nX-Evil: 1"}, "user_agent\n.*printable ASCII.*U\\+000D"),
    ],
)
def test_invalid_configuration_names_the_key(data: dict[str, Any], message: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=message):
        SearchConfig.model_validate(data)


def test_max_answer_bytes_defaults_per_backend() -> None:
    """4 MiB, Exa 16 MiB (its contents.text gives answers of megabytes); a key wins."""
    plugin = SearchPlugin(SearchConfig.model_validate({"searxng": {"max_answer_bytes": 2048}}))
    caps = {name: b.max_answer_bytes for name, b in plugin.backends.items()}
    assert caps == {"brave": 4 * 1024 * 1024, "exa": 16 * 1024 * 1024, "searxng": 2048}


def test_unknown_backends_in_the_chain_or_tables_are_errors() -> None:
    with pytest.raises(ConfigError, match="unknown backend 'bing'"):
        SearchPlugin(SearchConfig(chain_order=["brave", "bing"]))
    with pytest.raises(ConfigError, match="unknown backends"):
        SearchPlugin(SearchConfig.model_validate({"backends": {"bing": {}}}))


def test_secrets_do_not_show_in_the_config_repr() -> None:
    cfg = SearchConfig.model_validate(
        {
            "brave": {"api_keys": [B1, {"alias": "two", "secret": B2}]},
            "searxng": {"urls": "https://s.test"},
        }
    )
    text = repr(cfg) + str(cfg.model_dump())
    assert B1 not in text and B2 not in text and "s.test" not in text


async def test_environment_keys_comma_separated() -> None:
    kernel = make_kernel(environ={"BRAVE_API_KEY": f" {B1} , {B2},", "EXA_API_KEY": ""})
    async with kernel:
        status = SearchPlugin.of(kernel).status()
    assert status["backends"]["brave"]["keys"] == ["brave-1", "brave-2"]
    assert status["backends"]["exa"]["configured"] is False
    assert status["configured"] == ["brave"]


async def test_custom_env_variable_names() -> None:
    kernel = make_kernel(
        environ={"BRAVE_API_KEY": B1, "CORP_BRAVE": B2}, search={"brave": {"env": ["CORP_BRAVE"]}}
    )
    async with kernel:
        pool = RateLimitPlugin.of(kernel).pool("brave")
        assert pool.aliases == ["brave-1"]
        lease = await pool.acquire()
        assert lease.secret == B2
        await lease.release()


async def test_keys_in_the_ratelimit_section_are_used_and_env_is_ignored(
    respx_mock: respx.MockRouter,
) -> None:
    route = respx_mock.get(BRAVE_URL).mock(
        return_value=httpx.Response(200, json=load("brave_web_search_200.json"))
    )
    kernel = make_kernel(
        environ={"BRAVE_API_KEY": B2},
        rl={"providers": {"brave": {"keys": [{"alias": "ops", "secret": B1}]}}},
    )
    async with kernel:
        res = await kernel.call("web_search", {"query": "q"})
    assert keys_sent(route, "X-Subscription-Token") == [B1]
    assert res.meta.extra["served_by"]["key"] == "ops"


async def test_the_same_alias_in_both_sections_fails_at_startup() -> None:
    kernel = make_kernel(
        search={"brave": {"api_keys": [{"alias": "main", "secret": B1}]}},
        rl={"providers": {"brave": {"keys": [{"alias": "main", "secret": B2}]}}},
    )
    with pytest.raises(ConfigError, match="give its keys in one place"):
        await kernel.start()


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        (
            [{"alias": "main", "secret": B1}, {"alias": "main", "secret": B2}],
            "entry 1 and entry 2 both have alias 'main'",
        ),
        (
            [{"alias": "brave-2", "secret": B1}, B2],
            "entry 1 and entry 2 (no alias: named after its place) both have alias 'brave-2'",
        ),
    ],
)
async def test_the_same_alias_twice_in_one_table_names_the_entries(
    keys: list[Any], message: str
) -> None:
    """Before: "duplicate key aliases ['main']; give its keys in one place ([plugins.search.brave]
    or [plugins.ratelimit.providers.brave])", though they were in one place."""
    kernel = make_kernel(search={"brave": {"api_keys": keys}})
    with pytest.raises(ConfigError) as info:
        await kernel.start()
    text = str(info.value)
    assert f"[plugins.search.brave] api_keys: {message}; give each its own alias" in text
    assert "in one place" not in text and B1 not in text and B2 not in text


async def test_pool_settings_reach_the_key_pool() -> None:
    kernel = make_kernel(
        environ={"EXA_API_KEY": E1},
        search={"exa": {"pool": {"cooldown_seconds": 7, "suspend_seconds": 60}}},
    )
    async with kernel:
        pool = RateLimitPlugin.of(kernel).pool("exa")
    assert pool.settings.cooldown_s == 7 and pool.settings.suspend_s == 60


async def test_disabled_backends_have_no_tool_and_are_skipped() -> None:
    kernel = make_kernel(
        environ={"BRAVE_API_KEY": B1, "EXA_API_KEY": E1}, search={"brave": {"enabled": False}}
    )
    async with kernel:
        names = {t.name for t in kernel.list_tools()}
        web = kernel.get_tool("web_search")
        res = await kernel.call("web_search", {"query": "q", "backend": "brave"})
    assert "web_search_brave" not in names and web is not None
    assert web.settings["provider"] == "exa"
    assert res.error is not None and res.error.kind == "invalid_args"


async def test_tool_definitions() -> None:
    kernel = make_kernel(environ={"BRAVE_API_KEY": B1})
    async with kernel:
        tools = {t.name: t for t in kernel.list_tools()}
        mcp = {d["name"]: d for d in kernel.list_tools(format="mcp")}
    web = tools["web_search"]
    assert web.input_schema["properties"]["backend"]["enum"] == ["auto", "brave", "exa", "searxng"]
    assert web.input_schema["required"] == ["query"]
    assert web.input_schema is tools["web_search_exa"].input_schema  # one schema for all
    assert web.output_schema is not None
    assert set(web.output_schema["properties"]) == {
        "results",
        "served_by",
        "warnings",
        "provider_metadata",
    }
    assert web.annotations.readOnlyHint and web.annotations.openWorldHint
    assert tools["web_search_searxng"].settings == {"provider": "searxng"}
    assert all(t.source == "search" for t in tools.values())
    assert mcp["web_search_brave"]["annotations"]["readOnlyHint"] is True
    json.dumps(mcp)  # exportable


# ------------------------------------------------------------ a new backend
class ToyBackend(Backend):
    """A backend as the README's "Adding a backend" describes it."""

    name = "toy"
    title = "Toy Search"
    default_env = ("TOY_API_KEY",)
    default_base_url = "https://toy.test/v1"
    default_params: ClassVar[dict[str, Any]] = {"lang": "en"}

    def build_request(
        self, q: SearchQuery, *, secret: str, base_url: str, now: float
    ) -> BackendRequest:
        return BackendRequest(
            "GET",
            f"{base_url}/find",
            params={"text": q.query, "n": q.max_results, **self.params},
            headers={"Authorization": f"Bearer {secret}"},
        )

    def parse(self, data: Any, q: SearchQuery) -> BackendPage:
        return BackendPage(
            [
                make_result(
                    title=h["name"], url=h["link"], snippet=h["text"], engine=self.name, native=h
                )
                for h in data["hits"]
            ],
            metadata={"took_ms": data["took_ms"]},
        )


async def test_a_backend_added_in_code(respx_mock: respx.MockRouter) -> None:
    hits = {
        "took_ms": 3,
        "hits": [{"name": "T", "link": "https://t.test/x", "text": "toy <b>hit</b>"}],
    }
    route = respx_mock.get("https://toy.test/v1/find").mock(
        side_effect=[httpx.Response(429, text="Too Many Requests"), httpx.Response(200, json=hits)]
    )

    kernel = Kernel(
        clock=FakeClock(),
        plugins=[
            RateLimitPlugin(RateLimitConfig()),
            RetryPlugin(RetryConfig(seed=1)),
            SearchPlugin(
                SearchConfig.model_validate(
                    {
                        "chain_order": ["toy", "brave"],
                        "backends": {"toy": {"params": {"lang": "de"}}},
                    }
                ),
                environ={"TOY_API_KEY": "toy-secret-555555,toy-secret-666666"},
                extra_backends=[ToyBackend],
            ),
        ],
    )
    async with kernel:
        res = await kernel.call("web_search", {"query": "toys"})
        forced = kernel.get_tool("web_search_toy")
    assert forced is not None
    assert res.content["served_by"] == "toy"
    assert res.content["results"][0]["snippet"] == "toy hit"
    assert res.content["provider_metadata"] == {"toy": {"took_ms": 3}}
    # the 429 was classified and the second key used: rotation comes with the KeyPool
    assert [c.request.headers["Authorization"] for c in route.calls] == [
        "Bearer toy-secret-555555",
        "Bearer toy-secret-666666",
    ]
    assert route.calls.last.request.url.params["lang"] == "de"


async def test_a_backend_added_in_code_names_its_own_table() -> None:
    """Its table is [plugins.search.backends.<name>]; before, its messages sent the reader
    to [plugins.search.<name>], which is read only for the built-in backends."""
    plugin = SearchPlugin(SearchConfig(), environ={}, extra_backends=[ToyBackend])
    toy = plugin.backends["toy"]
    assert "[plugins.search.backends.toy] api_keys" in toy.missing_key_message()
    assert "[plugins.search.brave] api_keys" in plugin.backends["brave"].missing_key_message()
    # and its key problems at startup (before: "[plugins.search.toy]")
    keys = [{"alias": "a", "secret": "k-111111"}, {"alias": "a", "secret": "k-222222"}]
    config = SearchConfig.model_validate({"backends": {"toy": {"api_keys": keys}}})
    kernel = Kernel(
        plugins=[RateLimitPlugin(), SearchPlugin(config, environ={}, extra_backends=[ToyBackend])]
    )
    with pytest.raises(ConfigError, match=r"\[plugins\.search\.backends\.toy\] api_keys: entry 1"):
        await kernel.start()


def test_the_guide_sends_readers_to_the_readme_for_the_keys() -> None:
    # the README's tables are checked against the models by tests/test_doc_config_tables.py
    guide = (Path(__file__).parents[3] / "docs" / "search.md").read_text(encoding="utf-8")
    assert "plugins/search/README.md" in guide


async def test_without_ratelimit_the_warning_says_what_left_it_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: "the ratelimit plugin is not loaded", with no word on why or what to change."""
    cfg = tmp_path / "toolwire.toml"
    cfg.write_text('enabled_plugins = ["search", "retry"]\nstate = "memory://"\n')
    with caplog.at_level("WARNING", logger="toolwire"):
        async with Kernel.from_config(str(cfg)) as kernel:
            r = await kernel.call("web_search", {"query": "x"})
    assert r.error is not None and r.error.kind == "config_error"
    warned = " ".join(x.getMessage() for x in caplog.records)
    assert "the ratelimit plugin is not loaded" in warned and "enabled_plugins" in warned


def test_a_socks_proxy_without_socksio_names_the_package() -> None:
    try:
        import socksio  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("socksio is installed here")
    with pytest.raises(pydantic.ValidationError, match=r"httpx\[socks\]"):
        SearchConfig.model_validate({"proxy": "socks5://127.0.0.1:1080"})


def test_max_field_chars_is_0_or_at_least_100() -> None:
    from toolwire_search import SearchConfig

    assert SearchConfig().max_field_chars == 2000
    assert SearchConfig(max_field_chars=0).max_field_chars is None
    with pytest.raises(ValueError, match="must be 0 \\(keep text whole\\) or at least 100"):
        SearchConfig(max_field_chars=5)
