"""Configuration, cards, results and error mapping, checked against the shared fixtures."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client.errors import A2AClientError, A2AClientTimeoutError
from a2a.utils.errors import InternalError, TaskNotFoundError
from toolwire_a2a_testkit import FIXTURES, KernelFactory, Router, fixture, make_agent, make_card

from toolwire import ConfigError, ErrorKind, Kernel
from toolwire_a2a import A2AConfig, A2APlugin, card_url_for
from toolwire_a2a._cards import describe_card, make_entry, selector_matches
from toolwire_a2a._config import Selector
from toolwire_a2a._errors import map_error
from toolwire_a2a._limits import AnswerTooLarge
from toolwire_a2a._results import StreamAggregator, message_result, restore_ints, task_result

pytestmark = pytest.mark.anyio


# ------------------------------------------------------------------ config
def test_agents_accept_urls_tables_and_a_table_keyed_by_nickname() -> None:
    a = A2AConfig.model_validate(
        {"agents": ["http://a.test", {"url": "http://b.test/card.json", "nickname": "bee"}]}
    )
    assert [x.card_url for x in a.agents] == [
        "http://a.test/.well-known/agent-card.json",
        "http://b.test/card.json",
    ]
    assert a.agents[1].nickname == "bee"
    b = A2AConfig.model_validate(
        {"agents": {"res": "http://r.test/", "tr": {"url": "http://t.test", "bearer_token": "zq9"}}}
    )
    assert [(x.nickname, x.card_url) for x in b.agents] == [
        ("res", "http://r.test/.well-known/agent-card.json"),
        ("tr", "http://t.test/.well-known/agent-card.json"),
    ]
    assert b.agents[1].http_headers() == {"Authorization": "Bearer zq9"}
    assert "zq9" not in repr(b)


def test_a_disabled_entry_is_ignored_by_the_duplicate_checks() -> None:
    """Before: a disabled entry still counted for the nickname check: replacing an agent
    by disabling its old entry and adding a new one with the same nickname was refused
    ("two agents use the nickname 'research'")."""
    cfg = A2AConfig.model_validate(
        {
            "agents": [
                {"url": "http://old.test", "nickname": "research", "enabled": False},
                {"url": "http://new.test", "nickname": "research"},
                {"url": "http://new.test/", "enabled": False},
            ]
        }
    )
    assert [a.url for a in cfg.agents if a.enabled] == ["http://new.test"]


def test_card_url_for_keeps_card_urls_and_queries() -> None:
    assert card_url_for("http://h:8/base/") == "http://h:8/base/.well-known/agent-card.json"
    assert card_url_for("http://h/x.json?v=1") == "http://h/x.json?v=1"
    assert card_url_for("http://h/a?k=1") == "http://h/a/.well-known/agent-card.json?k=1"


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        ('agents = ["ftp://x"]', "must start with http:// or https://"),
        ('agents = [{url = "http://x", nickname = "Bad Name"}]', "nickname 'Bad Name' must be"),
        (
            'agents = [{url = "http://a", nickname = "n"}, {url = "http://b", nickname = "n"}]',
            "plugins.a2a.agents: two agents use the nickname 'n'",
        ),
        ("context = {when = 1979-05-27T07:32:00Z}", "JSON message metadata"),
        ('registry = {url = "http://r", selector = {tagz = ["x"]}}', "unknown key"),
        ("refresh_interval_s = -1", "plugins.a2a.refresh_interval_s"),
        # was a bare TypeError traceback from the agents validator
        ("agents = {research = 5}", "plugins.a2a.agents.0: Input should be a valid dictionary"),
        # was accepted, then every state write failed: context_id never continued a task
        # the kernel then failed to start: "tool 'agent_b' provided by a2a:b and a2a:b"
        (
            'agents = [{url = "http://a", nickname = "x"}, {url = "http://a/", nickname = "y"}]',
            # the key is named (it was "plugins.a2a.: two agents ...")
            "plugins.a2a.agents: two agents have the same card "
            "http://a/.well-known/agent-card.json",
        ),
        ("interrupted_ttl_s = inf", "plugins.a2a.interrupted_ttl_s"),
        ("interrupted_ttl_s = 1e16", "plugins.a2a.interrupted_ttl_s"),
        # durations are finite, as in every other plugin ("0: never" where never makes sense)
        ("request_timeout_s = inf", "plugins.a2a.request_timeout_s"),
        ("poll_interval_s = 1e16", "plugins.a2a.poll_interval_s"),
        ('agents = [{url = "http://a", timeout_s = nan}]', "plugins.a2a.agents.0.timeout_s"),
        ("max_answer_bytes = 10", "plugins.a2a.max_answer_bytes"),
        (
            'agents = [{url = "http://a", max_answer_bytes = 512}]',
            "plugins.a2a.agents.0.max_answer_bytes",
        ),
        # was sent as a double: the agent got 9007199254740992, silently
        (
            "context = {ids = [1, 9007199254740993]}",
            "plugins.a2a.context: `context.ids.1` = 9007199254740993 is past 2**53 in "
            "magnitude: message metadata numbers are doubles, which hold every integer only "
            'up to 2**53 (it would arrive as 9007199254740992.0); write it as a string ("',
        ),
        (
            'agents = [{url = "http://a", context = {n = -9007199254740993}}]',
            "plugins.a2a.agents.0.context: `context.n` = -9007199254740993 is past 2**53",
        ),
    ],
)
def test_config_errors_name_the_key_and_the_fix(
    tmp_path: Path, section: str, expected: str
) -> None:
    cfg = tmp_path / "toolwire.toml"
    cfg.write_text(f'enabled_plugins = ["a2a"]\n[plugins.a2a]\n{section}\n')
    with pytest.raises(ConfigError, match=r"plugins\.a2a") as err:
        Kernel.from_config(str(cfg))
    assert expected in str(err.value)


async def test_loaded_from_its_entry_point_with_no_configuration(tmp_path: Path) -> None:
    cfg = tmp_path / "toolwire.toml"
    cfg.write_text('enabled_plugins = ["a2a"]\n')
    kernel = Kernel.from_config(str(cfg))
    plugin = kernel.plugins.plugins["a2a"].plugin
    assert isinstance(plugin, A2APlugin) and plugin.config == A2AConfig()
    async with kernel:
        assert kernel.list_tools() == []


def test_env_and_secret_refs_configure_the_plugin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from toolwire import load_config

    cfg = tmp_path / "toolwire.toml"
    cfg.write_text(
        'enabled_plugins = ["a2a"]\n[plugins.a2a]\n'
        'agents = [{url = "http://a.test", bearer_token = {"$secretRef" = "AGENT_TOKEN"}}]\n'
    )
    env = {"AGENT_TOKEN": "t0k3n", "TOOLWIRE_PLUGINS__A2A__REFRESH_INTERVAL_S": "60"}
    loaded = load_config(str(cfg), env=env)
    conf = A2AConfig.model_validate(loaded.plugins["a2a"])
    assert conf.refresh_interval_s == 60
    assert conf.agents[0].http_headers()["Authorization"] == "Bearer t0k3n"
    assert "t0k3n" not in repr(conf) and "t0k3n" not in conf.model_dump_json()
    only_env = load_config(
        str(cfg), env={**env, "TOOLWIRE_PLUGINS__A2A__AGENTS": '["http://b.test"]'}
    )
    assert [a.url for a in A2AConfig.model_validate(only_env.plugins["a2a"]).agents] == [
        "http://b.test"
    ]


# ------------------------------------------------------------------- cards
def test_v1_and_v0_3_cards_parse_and_describe_themselves() -> None:
    v1 = make_entry("http://r/card.json", fixture("agent_card_v1.json"))
    assert v1.card.name == "Research Specialist"
    assert [i.protocol_version for i in v1.card.supported_interfaces] == ["1.0", "0.3"]
    legacy = make_entry("http://t/card.json", fixture("agent_card_v0_3_legacy.json"))
    iface = legacy.card.supported_interfaces[0]
    assert (iface.url, iface.protocol_binding) == ("http://translator.test/a2a", "JSONRPC")
    assert iface.protocol_version.startswith("0.3")
    text = describe_card(v1.card, "research", limit=2000)
    for expected in (
        "Performs multi-source research",
        "Example Labs",
        "Deep research",
        "Fact check",
        "Summarize recent work on solid-state batteries",
        "agent_research_task",
    ):
        assert expected in text


def test_description_is_cut_to_the_limit_but_keeps_the_usage_line() -> None:
    data = fixture("agent_card_v1.json")
    data["skills"] = [
        {"id": f"s{i}", "name": f"Skill {i}", "description": "x" * 200, "tags": ["t"]}
        for i in range(50)
    ]
    card = make_entry("http://r/card.json", data).card
    text = describe_card(card, "research", limit=800)
    assert len(text) <= 900
    assert "more skills" in text and text.endswith("answer the agent's question).")


async def test_a_card_with_huge_names_still_gives_descriptions_within_the_limit(
    make_kernel: KernelFactory, router: Router
) -> None:
    """Before: the card's name, provider and version went into the descriptions (and the
    titles) whole: a card named with 5000 characters gave a 13 000-character
    description, past ``max_description_chars = 2000``, in every tool listing."""
    card = make_card("http://huge.test", name="Huge " + "N" * 5000)
    card.provider.organization = "O" * 5000
    card.provider.url = "http://huge.test"
    card.version = "V" * 3000
    router.hosts["huge.test"] = make_agent("http://huge.test", card=card).app
    kernel, _ = await make_kernel({"agents": {"huge": "http://huge.test"}})
    call, task = kernel.get_tool("agent_huge"), kernel.get_tool("agent_huge_task")
    assert call is not None and task is not None
    assert len(call.description) <= 2000, len(call.description)
    assert "Huge NNN" in call.description and "agent_huge_task" in call.description
    assert len(task.description) <= 400, len(task.description)
    for tool in (call, task):
        assert tool.annotations.title is not None and len(tool.annotations.title) <= 120


def test_broken_cards_are_rejected_with_a_reason() -> None:
    from toolwire_a2a._cards import CardFetchError

    with pytest.raises(CardFetchError, match="no `name`"):
        make_entry("http://x/c.json", {"description": "nameless"})
    with pytest.raises(CardFetchError, match="names no endpoint"):
        make_entry("http://x/c.json", {"name": "Nowhere"})
    with pytest.raises(CardFetchError, match="not a JSON object"):
        make_entry("http://x/c.json", ["list"])


def test_selector_any_of_and_all_of() -> None:
    card = make_entry("http://r/c.json", fixture("agent_card_v1.json")).card
    assert selector_matches(Selector(tags=["SPECIALIST", "web"]), card)
    assert not selector_matches(Selector(tags=["specialist", "finance"]), card)
    assert selector_matches(Selector(tags=["specialist", "finance"], match="any"), card)
    assert selector_matches(Selector(skills=["fact-check"]), card)
    assert selector_matches(Selector(names=["res*"]), card, "research")
    assert not selector_matches(Selector(names=["bill*"]), card, "research")
    assert selector_matches(Selector(), card)


# ----------------------------------------------------------------- results
def test_task_result_from_the_captured_sendmessage_response() -> None:
    task = fixture("sendmessage_response_task_v1.json")["result"]["task"]
    out = task_result("research", task)
    assert out["state"] == "completed" and out["done"] is True
    assert out["text"] == "Findings on: solid-state batteries"
    assert out["task_id"] == task["id"] and out["context_id"] == task["contextId"]
    got = task_result("research", fixture("gettask_response_v1.json")["result"])
    assert got["artifacts"] == [{"name": "report", "text": "Findings on: solid-state batteries"}]


def test_stream_aggregator_on_the_captured_sse_body() -> None:
    agg = StreamAggregator()
    notes = []
    for line in (FIXTURES / "sendstreamingmessage_v1.sse.txt").read_text().splitlines():
        if line.startswith("data: "):
            notes.append(agg.apply(json.loads(line[6:])["result"]))
    assert notes == ["task submitted", "working", "artifact report", "completed"]
    out = agg.result("research")
    assert out["state"] == "completed" and out["text"] == "Findings on: solid-state batteries"


def test_stream_aggregator_extends_in_place_and_counts_what_it_keeps() -> None:
    """Before: each append copied the artifact's parts (quadratic), and what the events
    added up to was not bounded."""
    agg = StreamAggregator(4096, "here")
    agg.apply({"task": {"id": "t", "contextId": "c", "status": {"state": "TASK_STATE_WORKING"}}})
    first = agg.kept

    def append(text: str, artifact: str = "a") -> dict[str, Any]:
        art = {"artifactId": artifact, "parts": [{"text": text}]}
        return {"artifactUpdate": {"taskId": "t", "append": True, "artifact": art}}

    agg.apply(append("x" * 100))
    assert agg.task is not None
    parts = agg.task["artifacts"][0]["parts"]
    for _ in range(9):
        agg.apply(append("x" * 100))
    assert agg.task["artifacts"][0]["parts"] is parts and len(parts) == 10  # not copied
    assert 10 * 100 < agg.kept - first < 10 * 130
    # replaced, not added: the status and a replaced artifact
    for _ in range(20):
        status = {"state": "TASK_STATE_WORKING", "message": {"parts": [{"text": "y" * 500}]}}
        agg.apply({"statusUpdate": {"taskId": "t", "status": status}})
    whole = {"artifactId": "a", "parts": [{"text": "z" * 200}]}
    agg.apply({"artifactUpdate": {"taskId": "t", "artifact": whole}})
    assert agg.kept < first + 200 + 600
    for i in range(20):  # artifacts of their own add up
        agg.apply(append("w" * 100, artifact=f"b{i}"))
    assert 4096 - 1000 < agg.kept <= 4096
    with pytest.raises(AnswerTooLarge) as info:
        agg.apply(append("w" * 1000, artifact="c"))
    assert info.value.limit == 4096 and info.value.setting == "here" and info.value.kept


def test_v0_3_states_and_data_and_file_parts() -> None:
    task: dict[str, Any] = {
        "id": "t",
        "contextId": "c",
        "status": {"state": "input-required"},
        "artifacts": [
            {
                "artifactId": "a",
                "parts": [
                    {"data": {"rows": 2}},
                    {"url": "https://x/f.pdf", "mediaType": "application/pdf", "filename": "f.pdf"},
                    {"raw": "aGk=", "filename": "hi.txt"},
                ],
            }
        ],
    }
    out = task_result("a", task)
    assert out["state"] == "input-required" and out["interrupted"] and not out["done"]
    assert out["artifacts"] == [
        {
            "name": "a",
            "data": [{"rows": 2}],
            "files": [
                {"name": "f.pdf", "media_type": "application/pdf", "url": "https://x/f.pdf"},
                {"name": "hi.txt", "base64": "aGk="},
            ],
        }
    ]


def test_data_parts_get_their_integers_back_and_nothing_else_changes() -> None:
    """A data part's numbers arrive as doubles (protobuf Value): integral ones up to 2**53
    become ints, recursively; the rest is left as it came."""
    got = restore_ints(
        {
            "n": 3.0,
            "neg": -(2.0**53),
            "nested": [1.0, {"deep": [4.0, 0.5]}],
            "frac": 0.5,
            "past": 2.0**53 + 2,
            "huge": 1e300,
            "nan": math.nan,
            "inf": -math.inf,
            "negzero": -0.0,
            "yes": True,
            "no": False,
            "null": None,
            "text": "3.0",
        }
    )
    assert [(k, type(v).__name__) for k, v in got.items()] == [
        ("n", "int"),
        ("neg", "int"),
        ("nested", "list"),
        ("frac", "float"),
        ("past", "float"),
        ("huge", "float"),
        ("nan", "float"),
        ("inf", "float"),
        ("negzero", "float"),
        ("yes", "bool"),
        ("no", "bool"),
        ("null", "NoneType"),
        ("text", "str"),
    ]
    assert json.dumps(got["nested"]) == '[1, {"deep": [4, 0.5]}]'
    assert got["neg"] == -(2**53) and math.copysign(1.0, got["negzero"]) == -1.0
    assert restore_ints(7.0) == 7 and type(restore_ints(7.0)) is int  # a bare number part
    # a reply that is a message (no task) goes through the same conversion
    reply = message_result("a", {"parts": [{"text": "hi"}, {"data": {"rows": 2.0}}]})
    assert json.dumps(reply["artifacts"]) == '[{"name": "message", "data": [{"rows": 2}]}]'


# ------------------------------------------------------------------ errors
def _status_error(status: int, headers: dict[str, str] | None = None) -> Exception:
    request = httpx.Request("POST", "http://a.test/rpc")
    response = httpx.Response(status, headers=headers, request=request)
    cause = httpx.HTTPStatusError("boom", request=request, response=response)
    try:
        raise A2AClientError(f"HTTP Error {status}") from cause
    except A2AClientError as exc:
        return exc


@pytest.mark.parametrize(
    ("exc", "kind", "retry_after"),
    [
        (_status_error(401), ErrorKind.AUTH, None),
        (_status_error(403), ErrorKind.AUTH, None),
        (_status_error(429, {"Retry-After": "7"}), ErrorKind.RATE_LIMIT, 7.0),
        (_status_error(503, {"Retry-After": "2"}), ErrorKind.UNAVAILABLE, 2.0),
        (_status_error(503, {"Retry-After": "nan"}), ErrorKind.UNAVAILABLE, None),
        (_status_error(429, {"Retry-After": "soon"}), ErrorKind.RATE_LIMIT, None),
        # an HTTP-date in the past (often clock skew): no hint, so the caller's own backoff
        # applies rather than an immediate retry of a 429 (the future form is checked below)
        (
            _status_error(429, {"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}),
            ErrorKind.RATE_LIMIT,
            None,
        ),
        (_status_error(404), ErrorKind.UNAVAILABLE, None),
        (_status_error(400), ErrorKind.TOOL_ERROR, None),
        (TaskNotFoundError("Task not found"), ErrorKind.NOT_FOUND, None),
        (InternalError("agent crashed"), ErrorKind.TOOL_ERROR, None),
    ],
)
def test_error_kinds(exc: Exception, kind: str, retry_after: float | None) -> None:
    err = map_error(exc, "research", "sending the message")
    assert err.kind == kind
    assert err.retry_after_s == retry_after
    assert str(err).startswith("agent 'research': sending the message")


@pytest.mark.parametrize(
    ("cause", "words"),
    [
        (httpx.PoolTimeout("all busy"), "every connection to the agent stayed busy"),
        (httpx.ConnectTimeout("no answer to SYN"), "no connection to the agent could be opened"),
    ],
)
def test_a_timeout_before_the_request_went_out_says_it_was_not_sent(
    cause: Exception, words: str
) -> None:
    try:
        raise A2AClientTimeoutError("Client Request timed out") from cause
    except A2AClientTimeoutError as exc:
        err = map_error(exc, "research", "sending the message")
    assert err.kind == ErrorKind.TIMEOUT and err.details["in_flight"] is False
    assert words in str(err) and "the request was not sent" in str(err)


def test_retry_after_as_an_http_date() -> None:
    """RFC 9110's other form of Retry-After; it used to give no retry_after_s at all."""
    from toolwire_a2a._errors import retry_after

    response = httpx.Response(429, headers={"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"})
    assert retry_after(response, now=1445412480.0 - 90) == 90.0


def test_unknown_json_rpc_codes_keep_their_code() -> None:
    err = map_error(A2AClientError("JSON-RPC Error -32050: quota gone"), "r", "x")
    assert err.kind == ErrorKind.TOOL_ERROR and err.details["code"] == -32050
    assert "quota gone" in str(err)


def test_a_client_error_that_is_not_about_the_answer_gets_no_malformed_hint() -> None:
    """Before: every A2AClientError without a JSON-RPC code was labelled malformed_answer,
    "HTTP client is closed" (an agent dropped mid-call) included, with a misleading hint."""
    closed = map_error(A2AClientError("HTTP client is closed"), "r", "sending the message")
    assert "reason" not in closed.details and "card's" not in str(closed)
    bad = map_error(A2AClientError("JSON Decode Error: Expecting value"), "r", "sending")
    assert bad.details["reason"] == "malformed_answer" and "card's URL" in str(bad)


@pytest.mark.parametrize(
    ("text", "malformed"),
    [
        ("HTTP client is closed", False),
        ("gRPC Error INVALID_ARGUMENT: the JSON field 'x' is unexpected", False),
        ("Invalid JSON-RPC response: it has neither 'result' nor 'error'", True),
        ("Invalid response type: <class 'list'>", True),
        ("SSE stream error: quota exhausted", True),
        ("SSE stream error event received: quota exhausted", True),
    ],
)
def test_the_malformed_hint_follows_the_sdks_words_not_the_agents(
    text: str, malformed: bool
) -> None:
    """Before: the words were looked for anywhere in the message, the agent's own text
    included: an SSE error event saying "quota exhausted" got no hint, one saying "invalid
    key" got it; a gRPC status naming JSON got it."""
    err = map_error(A2AClientError(text), "r", "sending")
    assert (err.details.get("reason") == "malformed_answer") is malformed, err
    assert ("card's URL" in str(err)) is malformed
