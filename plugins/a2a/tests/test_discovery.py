"""Cards and the registry: ETag revalidation, selectors, refresh, agents unreachable at start."""

from __future__ import annotations

import copy
import logging
from pathlib import Path

import anyio
import pytest
from a2a.types import AgentSkill
from starlette.applications import Starlette
from starlette.routing import Mount, Route
from toolwire_a2a_testkit import (
    RESEARCH,
    Agent,
    KernelFactory,
    Registry,
    Router,
    eventually,
    fixture,
    make_agent,
)

from toolwire import ErrorKind, Kernel

pytestmark = pytest.mark.anyio

AGENTS = {"agents": [{"url": RESEARCH, "nickname": "research"}]}
CARD_URL = RESEARCH + "/.well-known/agent-card.json"


async def test_card_is_revalidated_with_its_etag(
    make_kernel: KernelFactory, router: Router, research: Agent
) -> None:
    kernel, plugin = await make_kernel(AGENTS)
    hits = router.card_hits("research.test")
    assert [h.status for h in hits] == [200] and hits[0].if_none_match is None
    etag = plugin.agents()[CARD_URL]["etag"]
    assert etag and etag.startswith('W/"')
    before = kernel.get_tool("agent_research")

    assert await plugin.refresh() is False  # unchanged card: 304, same tools
    hits = router.card_hits("research.test")
    assert [h.status for h in hits] == [200, 304]
    assert hits[1].if_none_match == etag
    assert kernel.get_tool("agent_research") is before

    research.card = copy.deepcopy(research.card)
    research.card.description = "Now also writes executive summaries."
    assert await plugin.refresh() is True  # new card: 200, tools rebuilt, catalog refreshed
    assert [h.status for h in router.card_hits("research.test")] == [200, 304, 200]
    after = kernel.get_tool("agent_research")
    assert after is not None and after is not before
    assert "executive summaries" in after.description
    assert plugin.agents()[CARD_URL]["etag"] != etag


async def test_registry_listing_with_selector_yields_the_expected_tools(
    make_kernel: KernelFactory, router: Router
) -> None:
    proposal = fixture("registry_listing_proposed.json")
    listing = {"agents": proposal["agents"]}
    registry = Registry(listing)
    research = make_agent("http://research-agent.test")
    legacy = make_agent("http://translator.test", rpc_path="/a2a")
    router.hosts.update(
        {
            "registry.test": registry.app(),
            "research-agent.test": research.app,
            "translator.test": legacy.app,
        }
    )
    config = {
        "registry": {"url": "http://registry.test/agents", "selector": proposal["selector_example"]}
    }
    kernel, plugin = await make_kernel(config)
    names = sorted(t.name for t in kernel.list_tools() if not t.name.endswith("_task"))
    assert names == sorted(proposal["expected_tool_names"])
    assert kernel.get_tool("agent_billing") is None  # its skills are tagged "finance" only
    billing = plugin.agents()["http://billing.test/.well-known/agent-card.json"]
    assert billing["offered"] is False and "selector" in billing["excluded"]
    assert registry.queries == ["tag=specialist&match=all"]
    # the inline cards are used as they are: no card was fetched
    assert not [h for h in router.hits if h.path.endswith("agent-card.json")]
    # both calls reach the agents the cards name (1.0 for research, 0.3 for the translator)
    res = await kernel.call("agent_research", {"query": "solid-state batteries"})
    assert res.content["text"] == "Findings on: solid-state batteries", res.content
    res = await kernel.call("agent_translator", {"query": "hello"})
    assert res.content["text"] == "Findings on: hello", res.content
    v03 = [h for h in router.hits if h.host == "translator.test"]
    assert v03 and v03[-1].headers["a2a-version"] == "0.3"

    # the listing is revalidated with its ETag; a new listing updates the catalog
    assert await plugin.refresh() is False
    assert registry.statuses == [200, 304]
    listing["agents"] = [a for a in listing["agents"] if a["nickname"] != "translator"]
    assert await plugin.refresh() is True
    assert kernel.get_tool("agent_translator") is None
    assert kernel.get_tool("agent_research") is not None


@pytest.mark.parametrize(
    ("selector", "query"),
    [
        ({}, "team=core&key=k1"),
        ({"tags": ["specialist"]}, "team=core&key=k1&tag=specialist&match=all"),
    ],
)
async def test_a_registry_url_keeps_its_own_query(
    make_kernel: KernelFactory, router: Router, selector: dict[str, object], query: str
) -> None:
    """Before: the selector's query parameters replaced the query of the registry's URL
    (httpx's ``params`` do), even an empty selector's: ``/agents?team=core&key=k1`` was
    read as ``/agents``, another listing (or a 401 when the key is in the query)."""
    registry = Registry({"agents": fixture("registry_listing_proposed.json")["agents"]})
    router.hosts["registry.test"] = registry.app()
    url = "http://registry.test/agents?team=core&key=k1"
    kernel, _ = await make_kernel({"registry": {"url": url, "selector": selector}})
    assert registry.queries == [query]
    assert kernel.get_tool("agent_research") is not None


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ({"tags": ["specialist", "research"]}, ["agent_research"]),
        (
            {"tags": ["language", "research"], "match": "any"},
            ["agent_research", "agent_translator"],
        ),
        ({"tags": ["language", "research"]}, []),
        ({"skills": ["translate"]}, ["agent_translator"]),
        ({"names": ["billing*"]}, ["agent_billing"]),
        ({"names": ["*specialist"], "tags": ["web"]}, ["agent_research"]),
        ({}, ["agent_billing", "agent_research", "agent_translator"]),
    ],
)
async def test_selector_semantics(
    make_kernel: KernelFactory, router: Router, selector: dict[str, object], expected: list[str]
) -> None:
    registry = Registry({"agents": fixture("registry_listing_proposed.json")["agents"]})
    router.hosts["registry.test"] = registry.app()
    config = {"registry": {"url": "http://registry.test/agents", "selector": selector}}
    kernel, _ = await make_kernel(config)
    names = sorted(t.name for t in kernel.list_tools() if not t.name.endswith("_task"))
    assert names == expected


async def test_registry_entries_without_inline_cards_are_fetched(
    make_kernel: KernelFactory, router: Router, research: Agent
) -> None:
    plain = make_agent(
        "http://plain.test",
        name="Plain Helper",
        skills=[AgentSkill(id="chat", name="Chat", description="Small talk", tags=["general"])],
    )
    router.hosts["plain.test"] = plain.app
    registry = Registry(
        [
            {"nickname": "research", "card_url": CARD_URL},
            {"card_url": "http://plain.test/.well-known/agent-card.json"},
        ]
    )
    router.hosts["registry.test"] = registry.app()
    config = {
        "registry": {
            "url": "http://registry.test/agents",
            "selector": {"tags": ["specialist"]},
            "send_selector": False,
        }
    }
    kernel, plugin = await make_kernel(config)
    assert kernel.get_tool("agent_research") is not None
    assert kernel.get_tool("agent_plain_helper") is None  # fetched, but not a specialist
    assert registry.queries == [""]
    assert router.card_hits("plain.test") and router.card_hits("research.test")
    status = plugin.agents()["http://plain.test/.well-known/agent-card.json"]
    assert status["name"] == "Plain Helper" and status["offered"] is False


async def test_a_relative_card_url_in_the_listing_is_read_from_the_listings_host(
    make_kernel: KernelFactory, router: Router, research: Agent, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: a listing entry whose card_url was relative (as links in a REST listing
    often are) was skipped, with a warning that it had "neither a card_url nor a card"."""
    registry = Registry(
        {
            "agents": [
                {"nickname": "research", "card_url": "/.well-known/agent-card.json"},
                {"nickname": "odd", "card_url": "ftp://files.test/card.json"},
            ]
        }
    )
    router.hosts["research.test"] = Starlette(
        routes=[Route("/agents", registry.app()), Mount("/", research.app)]
    )
    config = {"registry": {"url": RESEARCH + "/agents", "send_selector": False}}
    with caplog.at_level(logging.WARNING, logger="toolwire.a2a"):
        kernel, plugin = await make_kernel(config)
    assert kernel.get_tool("agent_research") is not None
    assert CARD_URL in plugin.agents()
    res = await kernel.call("agent_research", {"query": "batteries"})
    assert res.content["text"] == "Findings on: batteries", res.content
    warned = [r.getMessage() for r in caplog.records]
    assert any("entry 1 has a card_url that is not an http(s) URL" in w for w in warned), warned


async def test_unreachable_agent_at_start_appears_once_reachable(
    make_kernel: KernelFactory, router: Router, research: Agent
) -> None:
    del router.hosts["research.test"]
    kernel, plugin = await make_kernel(AGENTS)  # the kernel starts anyway
    assert kernel.get_tool("agent_research") is None
    status = plugin.agents()[CARD_URL]
    assert status["status"] == "down" and "ConnectError" in status["last_error"]
    assert await plugin.refresh() is False  # still down

    router.hosts["research.test"] = research.app
    assert await plugin.refresh() is True
    res = await kernel.call("agent_research", {"query": "back"})
    assert res.content["text"] == "Findings on: back"


async def test_background_refresh_runs_on_schedule_and_stops_at_shutdown(
    router: Router, research: Agent
) -> None:
    from toolwire_a2a import A2AConfig, A2APlugin

    del router.hosts["research.test"]
    cfg = A2AConfig.model_validate({**AGENTS, "refresh_interval_s": 60, "retry_interval_s": 0.05})
    plugin = A2APlugin(cfg, transport=router)
    kernel = Kernel(plugins=[plugin])
    async with kernel:
        assert kernel.get_tool("agent_research") is None
        router.hosts["research.test"] = research.app  # comes up: retried soon
        await eventually(lambda: kernel.get_tool("agent_research") is not None)
        task = plugin._refresher
        assert task is not None and not task.done
    assert task.done
    calls = len(router.hits)
    await anyio.sleep(0.2)
    assert len(router.hits) == calls  # nothing runs after shutdown


async def test_card_cached_in_state_serves_while_the_agent_is_down(
    tmp_path: Path,
    router: Router,
    research: Agent,
    make_kernel: KernelFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    state = f"sqlite:///{tmp_path / 'state.db'}"
    first, plugin = await make_kernel(AGENTS, state=state)
    etag = plugin.agents()[CARD_URL]["etag"]
    await first.close()

    # restart with the agent down: the cached card keeps the tool, which answers unavailable
    del router.hosts["research.test"]
    with caplog.at_level(logging.WARNING, logger="toolwire.a2a"):
        second, _ = await make_kernel(AGENTS, state=state)
    # said at startup (so `toolwire config check --strict` sees it); before, nothing was
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(
        CARD_URL in m and "could not be read at startup" in m and "cached by an earlier run" in m
        for m in warned
    ), warned
    assert second.get_tool("agent_research") is not None
    res = await second.call("agent_research", {"query": "x"})
    assert res.is_error and res.error is not None and res.error.kind == ErrorKind.UNAVAILABLE
    await second.close()

    # restart with the agent up: the first read is a revalidation (304)
    router.hosts["research.test"] = research.app
    third, _ = await make_kernel(AGENTS, state=state)
    last = router.card_hits("research.test")[-1]
    assert last.if_none_match == etag and last.status == 304
    assert third.get_tool("agent_research") is not None


async def test_nickname_clash_skips_the_second_agent(
    make_kernel: KernelFactory, router: Router
) -> None:
    twin = make_agent("http://twin.test")  # same card name "Research Specialist"
    router.hosts["twin.test"] = twin.app
    kernel, plugin = await make_kernel({"agents": [RESEARCH, "http://twin.test"]})
    assert kernel.get_tool("agent_research_specialist") is not None
    twin_status = plugin.agents()["http://twin.test/.well-known/agent-card.json"]
    assert twin_status["offered"] is False and "clashes" in twin_status["excluded"]
    res = await kernel.call("agent_research_specialist", {"query": "who"})
    assert not res.is_error
    assert [h.host for h in router.hits if h.method == "POST"] == ["research.test"]


async def test_no_configuration_means_no_tools_and_no_requests(router: Router) -> None:
    from toolwire_a2a import A2APlugin

    plugin = A2APlugin(transport=router)
    async with Kernel(plugins=[plugin]) as kernel:
        assert kernel.list_tools() == []
        assert await plugin.refresh() is False
    assert router.hits == []
