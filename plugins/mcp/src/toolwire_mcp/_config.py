"""Configuration models: ``[plugins.mcp]`` (upstream servers) and ``[server]`` (``toolwire serve``).

Both are plain pydantic models, importable without loading FastMCP.
"""

from __future__ import annotations

import ipaddress
import os
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

#: Largest image file ``toolwire serve`` sends for an ``img_path`` result, by default.
DEFAULT_IMAGE_MAX_BYTES = 10 * 1024 * 1024

__all__ = [
    "AUTH_ENABLED_ENV",
    "AUTH_TOKEN_ENV",
    "BearerAuth",
    "ClientConfig",
    "MCPConfig",
    "ServeConfig",
    "ServerConfig",
    "resolve_auth",
    "resolve_auth_token",
]

AUTH_ENABLED_ENV = "TOOLS_AUTH_ENABLED"
AUTH_TOKEN_ENV = "TOOLS_AUTH_TOKEN"

_SERVER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
#: What MCP allows as a tool name (the kernel's MCP export checks the same).
TOOL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")
#: An HTTP header name (RFC 9110 token).
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_BREAKS = ("\r", "\n", "\0")


def _redacted_url(url: str) -> str:
    """``url`` without what may be a credential: its userinfo, the values of its query."""
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:  # user:password, or a token as the user name
        netloc = "***@" + netloc.rpartition("@")[2]
    query = "&".join(
        f"{k}=***" if sep else k
        for k, sep, _ in (item.partition("=") for item in parts.query.split("&") if item)
    )
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


class ServerConfig(BaseModel):
    """One upstream MCP server, in the familiar ``mcpServers`` shape.

    Either ``command`` (stdio: ``args``, ``env``, ``cwd``) or ``url`` (HTTP:
    ``transport``, ``headers``, ``auth``) must be given.
    """

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    # stdio
    command: str | None = Field(None, description="executable to start (stdio servers)")
    args: list[str] = Field(default_factory=list, description="its arguments")
    env: dict[str, str] = Field(
        default_factory=dict,
        description="environment variables for the child (added to a minimal default environment)",
    )
    cwd: str | None = Field(None, description="working directory of the child")
    # http
    url: str | None = Field(None, description="endpoint of a remote server (http:// or https://)")
    transport: Literal["stdio", "http", "streamable-http", "sse"] | None = Field(
        None,
        description="stdio for `command`; http (= streamable-http) or sse for `url`; "
        "inferred when omitted (a URL path ending in /sse means sse)",
    )
    type: Literal["stdio", "http", "streamable-http", "sse"] | None = Field(
        None, description="alias of `transport` (some clients write `type`)"
    )
    headers: dict[str, str] = Field(default_factory=dict, description="extra HTTP headers")
    auth: SecretStr | None = Field(
        None,
        description='bearer token sent to the server; write {"$secretRef" = "NAME"}',
        json_schema_extra={"toolwire_not_secret": ["oauth"]},  # a mode, not a credential
    )
    max_answer_bytes: int = Field(
        32 * 1024 * 1024,
        ge=1024,
        description="HTTP: the largest answer taken from this server, in bytes (a JSON "
        "response, or one event of an event stream, decompressed); a larger one fails the "
        "call (`tool_error`, `details.answer_too_large`) and is not kept in memory",
    )
    # common
    timeout: int | None = Field(
        None, gt=0, description="per-request timeout in milliseconds (mcpServers convention)"
    )
    include: list[str] | None = Field(
        None, description="only these remote tool names (also announced while the server is down)"
    )
    exclude: list[str] = Field(default_factory=list, description="remote tool names to leave out")
    namespace: str | None = Field(
        None, description="replaces the server name in tool names (default: the server name)"
    )
    enabled: bool = Field(True, description="false: ignore this entry")
    description: str | None = Field(None, description="free text (ignored)")

    def __repr_args__(self) -> Any:
        # `env` and `headers` often hold credentials (an API key, an Authorization header,
        # $secretRef values once resolved): repr and str show their names, not their values.
        for name, value in super().__repr_args__():
            if name in ("env", "headers") and value:
                value = dict.fromkeys(value, "***")
            yield name, value

    @field_validator("timeout", mode="before")
    @classmethod
    def _timeout_in_ms(cls, v: Any) -> Any:
        # Seconds are the usual guess (timeout = 1.5, timeout = 0.5): say the unit.
        if v is None or isinstance(v, str):
            return v  # None, or a string from the environment: pydantic's own check
        whole = isinstance(v, int) or (isinstance(v, float) and v.is_integer())
        if whole and not isinstance(v, bool) and v > 0:
            return v
        raise ValueError(
            f"got {v!r}: `timeout` is a whole number of milliseconds > 0 (the mcpServers "
            "convention), e.g. 30000 for 30 s"
        )

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, v: str | None) -> str | None:
        if v is not None and not _SERVER_NAME.match(v):
            raise ValueError(f"namespace {v!r}: use letters, digits, '_', '-' or '.' (max 64)")
        return v

    @field_validator("headers")
    @classmethod
    def _headers(cls, v: dict[str, str]) -> dict[str, str]:
        # The value is never quoted: it may be a secret (and the HTTP stack's own error,
        # "Illegal header value b'...'", did quote it in every log line and error).
        for name, value in v.items():
            if not _HEADER_NAME.fullmatch(name):
                raise ValueError(f"header name {name!r}: use letters, digits and '-'")
            if any(c in value for c in _BREAKS):
                raise ValueError(
                    f"header {name!r}: its value contains a line break or NUL, which HTTP "
                    "does not allow (a secret read with its trailing newline?); remove it"
                )
        return v

    @field_validator("auth")
    @classmethod
    def _auth(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None and any(c in v.get_secret_value() for c in _BREAKS):
            raise ValueError(
                "the token contains a line break or NUL, which HTTP does not allow (a secret "
                "read with its trailing newline?); remove it"
            )
        return v

    @model_validator(mode="after")
    def _check_shape(self) -> ServerConfig:
        kind = self.transport or self.type
        if self.transport and self.type and self.transport != self.type:
            raise ValueError("`transport` and `type` disagree; give only one of them")
        if self.command and self.url:
            raise ValueError("give either `command` (stdio) or `url` (HTTP), not both")
        if not self.command and not self.url:
            raise ValueError(
                "give `command` (and `args`) for a stdio server or `url` for an HTTP server"
            )
        if self.command and kind not in (None, "stdio"):
            raise ValueError(f"`command` needs transport 'stdio', got {kind!r}")
        if self.url:
            if kind == "stdio":
                raise ValueError("`url` needs transport 'http' or 'sse', not 'stdio'")
            if not self.url.startswith(("http://", "https://")):
                raise ValueError(f"`url` must start with http:// or https://, got {self.url!r}")
        # Keys of the other kind of server would be ignored without a word.
        stray = (
            [k for k in ("headers", "auth") if getattr(self, k)]
            + [k for k in ("max_answer_bytes",) if k in self.model_fields_set]
            if self.command
            else [k for k in ("args", "env", "cwd") if getattr(self, k)]
        )
        if "max_answer_bytes" in self.model_fields_set and self.url and self.kind == "sse":
            raise ValueError(
                "`max_answer_bytes` does not apply to a legacy SSE server (transport 'sse'): "
                "the MCP SDK caps its events at 1 MiB"
            )
        if stray:
            what = "a stdio server (`command`)" if self.command else "an HTTP server (`url`)"
            verb = "does" if len(stray) == 1 else "do"
            raise ValueError(f"{', '.join(f'`{k}`' for k in stray)} {verb} not apply to {what}")
        return self

    @property
    def kind(self) -> Literal["stdio", "http", "sse"]:
        """The effective transport."""
        if self.command:
            return "stdio"
        t = self.transport or self.type
        if t == "sse":
            return "sse"
        if t in ("http", "streamable-http"):
            return "http"
        path = (self.url or "").split("?", 1)[0].rstrip("/")
        return "sse" if path.endswith("/sse") else "http"

    @property
    def timeout_s(self) -> float | None:
        """``timeout`` in seconds."""
        return self.timeout / 1000.0 if self.timeout else None

    def target(self) -> str:
        """What to connect to, for messages (never includes secrets: the userinfo of the
        URL and the values of its query are shown as ``***``)."""
        if self.command:
            return " ".join([self.command, *self.args])
        return _redacted_url(str(self.url))


class MCPConfig(BaseModel):
    """``[plugins.mcp]``: the upstream MCP servers whose tools the kernel offers."""

    model_config = ConfigDict(extra="forbid")

    servers: dict[str, ServerConfig] = Field(
        default_factory=dict, description="upstream servers by name ([plugins.mcp.servers.<name>])"
    )
    name_template: str = Field(
        "{server}_{tool}",
        description="kernel tool name of a remote tool; `{server}` is the server's name "
        "(or its `namespace`), `{tool}` the remote name",
    )
    connect_timeout_s: float = Field(
        10.0, gt=0, description="how long startup waits for each server's first connection"
    )
    reconnect_initial_s: float = Field(0.5, gt=0, description="first reconnect delay")
    reconnect_max_s: float = Field(30.0, gt=0, description="longest reconnect delay (backoff cap)")
    cache_tools: bool = Field(
        True,
        description="remember each server's tool list in the kernel's state store, so a "
        "server that is down at the next start still shows its tools (answering `unavailable`)",
    )
    protocol: Literal["auto", "legacy"] = Field(
        "auto",
        description="client protocol: auto (2026-07-28 when the server speaks it, else the "
        "initialize handshake) or legacy (always the initialize handshake)",
    )
    direct_http_calls: bool = Field(
        True,
        description="send tools/call of Streamable-HTTP upstreams speaking the 2026-07-28 "
        "protocol straight over a lean HTTP client; false: through the FastMCP client",
    )

    @field_validator("servers")
    @classmethod
    def _names(cls, v: dict[str, ServerConfig]) -> dict[str, ServerConfig]:
        for name in v:
            if not _SERVER_NAME.match(name):
                raise ValueError(
                    f"server name {name!r}: use letters, digits, '_', '-' or '.' (max 64)"
                )
        return v

    @field_validator("name_template")
    @classmethod
    def _template(cls, v: str) -> str:
        if "{tool}" not in v:
            raise ValueError("must contain {tool}, e.g. '{server}_{tool}'")
        try:
            sample = v.format(server="s", tool="t")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"only {{server}} and {{tool}} may be used: {exc}") from exc
        if not TOOL_NAME.fullmatch(sample):
            raise ValueError(
                f"{v!r} makes tool names like {sample!r}, which MCP does not allow: around "
                "{server} and {tool} use only letters, digits, '_', '-' or '.'"
            )
        return v

    @model_validator(mode="after")
    def _backoff(self) -> MCPConfig:
        if self.reconnect_max_s < self.reconnect_initial_s:
            raise ValueError("reconnect_max_s must be >= reconnect_initial_s")
        return self

    def tool_name(self, server: str, tool: str) -> str:
        """The kernel name of remote tool ``tool`` of ``server``."""
        cfg = self.servers.get(server)
        ns = cfg.namespace if cfg is not None and cfg.namespace else server
        return self.name_template.format(server=ns, tool=tool)


#: A client's name in ``[server.clients.<name>]``.
CLIENT_NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$"


class ClientConfig(BaseModel):
    """``[server.clients.<name>]``: one HTTP client with its own bearer token, whose calls
    run as its tenant."""

    model_config = ConfigDict(extra="forbid")

    token: SecretStr = Field(
        description='the bearer token this client sends; write {"$secretRef" = "NAME"}'
    )
    tenant: str | None = Field(
        None,
        min_length=1,
        max_length=128,
        description="the tenant of this client's calls (default: the client's name); "
        "clients given one tenant share its idempotency records and approvals",
    )


class ServeConfig(BaseModel):
    """The ``[server]`` table: settings of ``toolwire serve`` (CLI flags override them)."""

    model_config = ConfigDict(extra="forbid")

    transport: Literal["stdio", "http"] = Field("stdio", description="stdio or http")
    host: str = Field("127.0.0.1", description="HTTP bind address")
    port: int = Field(8000, ge=0, le=65535, description="HTTP port; 0 picks a free port")
    path: str = Field("/mcp", description="HTTP endpoint path")
    name: str = Field("toolwire", description="server name announced to clients")
    instructions: str | None = Field(None, description="instructions announced to clients")
    auth_token: SecretStr | None = Field(
        None, description='bearer token HTTP clients must send; write {"$secretRef" = "NAME"}'
    )
    auth_enabled: bool | None = Field(
        None,
        description="require the bearer token (default: when a token is configured); "
        "TOOLS_AUTH_ENABLED overrides",
    )
    clients: dict[Annotated[str, Field(pattern=CLIENT_NAME_RE)], ClientConfig] = Field(
        default_factory=dict,
        description="HTTP clients with tokens of their own, by name; each one's calls run "
        "as its tenant (default: its name), kept apart from the other clients'",
    )
    allowed_hosts: list[str] = Field(
        default_factory=list, description="extra Host header values accepted (reverse proxies)"
    )
    allowed_origins: list[str] = Field(
        default_factory=list, description="extra browser Origins accepted"
    )
    forwarded_allow_ips: list[str] | None = Field(
        None,
        description="HTTP: addresses or networks of the reverse proxies whose X-Forwarded-For "
        "/ X-Forwarded-Proto are believed ('*': any); None: uvicorn's FORWARDED_ALLOW_IPS "
        "where set, else none (the client address is the connection's)",
    )
    shutdown_grace_s: float = Field(
        10.0, ge=0, description="on SIGINT/SIGTERM, how long in-flight calls may finish"
    )
    image_roots: list[str] | None = Field(
        None,
        description='directories whose image files `{"img_path": ...}` results may send '
        "to MCP clients (default: the system temp directory and the working directory)",
    )
    image_max_bytes: int = Field(
        DEFAULT_IMAGE_MAX_BYTES,
        ge=1,
        description="largest image file sent for an `img_path` result, in bytes",
    )
    loop: Literal["auto", "asyncio", "uvloop"] = Field(
        "auto",
        description="event loop of `toolwire serve`: auto (uvloop where it is installed, "
        "else asyncio), asyncio, or uvloop (an error where it is not installed)",
    )
    session_idle_timeout_s: float | None = Field(
        600.0,
        gt=0,
        description="HTTP: end a handshake-era (2025-11-25) session idle this long; the MCP "
        "SDK caps open sessions at 10,000, so abandoned ones must not pile up (None: never)",
    )
    max_connections: int | None = Field(
        1000,
        ge=1,
        description="HTTP: connections open at once (idle keep-alive sockets and open SSE "
        "streams count); while that many are open, requests get 503 (a client holding many "
        "sockets cannot take every file descriptor); None: no cap",
    )
    request_read_timeout_s: float | None = Field(
        30.0,
        gt=0,
        allow_inf_nan=False,
        description="HTTP: each request must arrive whole (head and body) this long after its "
        "first byte, or after the connection opens; else the connection is closed (a client "
        "sending a byte at a time cannot hold sockets for ever); None: no deadline",
    )
    max_header_bytes: int | None = Field(
        64 * 1024,
        ge=1024,
        description="HTTP: the longest request line and headers, together, in bytes; a longer "
        "head gets 431 and the connection is closed (a client cannot make the server hold a "
        "head of any size before auth); None: no cap",
    )
    max_sessions: int | None = Field(
        10_000,
        ge=1,
        description="HTTP: handshake-era (2025-11-25) sessions open at once; while that many "
        "are open, a new `initialize` gets 503 (the MCP SDK's cap); None: no cap",
    )
    fast_path: bool = Field(
        True,
        description="HTTP: answer plain 2026-07-28 `tools/call` requests on toolwire's lean "
        "path (same results, a fraction of FastMCP's per-call CPU); false: every request "
        "through FastMCP's handler",
    )

    @field_validator("host")
    @classmethod
    def _host(cls, v: str) -> str:
        # checked here, not first when binding: `config check` passed these and `serve`
        # then failed on "cannot listen on localhost:8000:8000: Name or service not known"
        if not v.strip():
            raise ValueError("is empty; give an address or name of this machine, e.g. 127.0.0.1")
        if "://" in v or "/" in v:
            raise ValueError(
                f"{v!r} is a URL; give only the address or name (e.g. '127.0.0.1'): the port "
                "goes in `port` (--port), the path in `path`"
            )
        name, sep, port = v.rpartition(":")
        if sep and ":" not in name and port.isdigit():  # one colon: IPv6 has several
            raise ValueError(
                f"{v!r} holds a port; give the address alone ({name!r}) and the port in "
                f"`port` (--port {port})"
            )
        return v

    @field_validator("forwarded_allow_ips")
    @classmethod
    def _forwarded(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return v
        out: list[str] = []
        for entry in v:
            entry = entry.strip()
            if entry == "*":
                # uvicorn trusts everyone only for a lone "*"; beside other entries it
                # would be a literal that never matches
                return ["*"]
            try:
                net = ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ValueError(
                    f"{entry!r} is not an IP address or network; give the proxies' "
                    "addresses (e.g. '127.0.0.1', '10.0.0.0/8') or '*' for any"
                ) from None
            # uvicorn parses a network strictly: one with host bits set ('10.0.0.1/8')
            # would be taken for a host name and never match. Given as its network.
            out.append(str(net) if "/" in entry else entry)
        return out

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError("must start with '/', e.g. '/mcp'")
        return v


def _truthy(raw: str, var: str) -> bool:
    low = raw.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"{var}={raw!r}: expected true or false")


@dataclass(frozen=True)
class BearerAuth:
    """The bearer tokens HTTP clients of ``toolwire serve`` may present.

    ``token``: the shared token (``[server] auth_token`` or ``TOOLS_AUTH_TOKEN``;
    its calls have no tenant). ``clients``: name -> (token, tenant), from
    ``[server.clients.<name>]``; a client's calls run as its tenant.
    """

    token: str | None = None
    clients: Mapping[str, tuple[str, str]] = field(default_factory=dict)

    def __repr__(self) -> str:
        # Secrets, as SecretStr keeps them in the config: a log line or a traceback
        # showing the object must not show a token.
        shared = None if self.token is None else "***"
        clients = {name: ("***", tenant) for name, (_, tenant) in self.clients.items()}
        return f"BearerAuth(token={shared!r}, clients={clients!r})"

    def tokens(self) -> list[str]:
        """Every token that opens the server."""
        shared = [self.token] if self.token else []
        return shared + [t for t, _ in self.clients.values()]


def resolve_auth(cfg: ServeConfig, env: Mapping[str, str] | None = None) -> BearerAuth | None:
    """The bearer tokens HTTP clients must present, or None when auth is off.

    Auth is on when ``TOOLS_AUTH_ENABLED`` is true, or (when that variable is
    unset) when ``[server] auth_enabled`` is true, or when a token is configured
    (``[server] auth_token``, ``TOOLS_AUTH_TOKEN`` or a ``[server.clients.<name>]``
    entry). The config's shared token wins over ``TOOLS_AUTH_TOKEN``. Raises
    ``ValueError`` when auth is on without a token, when no client could send a
    token, and when two entries share one token, naming what to fix (never the
    token).
    """
    env = os.environ if env is None else env
    token = cfg.auth_token.get_secret_value() if cfg.auth_token is not None else None
    source = "[server] auth_token"
    #: where a token was given but is empty (a $secretRef or variable set to "")
    empty = source if token == "" else None
    if not token:
        token = env.get(AUTH_TOKEN_ENV) or None
        if token is None and empty is None and env.get(AUTH_TOKEN_ENV) == "":
            empty = AUTH_TOKEN_ENV
        source = AUTH_TOKEN_ENV
    raw = env.get(AUTH_ENABLED_ENV)
    if raw is not None and raw.strip() != "":
        enabled = _truthy(raw, AUTH_ENABLED_ENV)
    elif cfg.auth_enabled is not None:
        enabled = cfg.auth_enabled
    else:
        if token is None and empty is not None and not cfg.clients:
            # Asked for a token and got "": serving without auth would open every tool
            # to anyone who can connect. Off is a choice to make explicitly.
            raise ValueError(
                f"the bearer token ({empty}) is set but empty (a $secretRef or variable "
                "resolved to an empty string?), so no client would need one; set the "
                f"token, or turn auth off explicitly with {AUTH_ENABLED_ENV}=false or "
                "[server] auth_enabled = false"
            )
        enabled = token is not None or bool(cfg.clients)
    if not enabled:
        return None
    if not token and not cfg.clients:
        raise ValueError(
            f"bearer auth is enabled but no token is set: export {AUTH_TOKEN_ENV}=<token> or "
            f'set [server] auth_token = {{"$secretRef" = "NAME"}} in toolwire.toml'
        )
    owners: dict[str, str] = {}
    if token:
        _check_token(token, source)
        owners[token] = source
    clients: dict[str, tuple[str, str]] = {}
    for name, client in cfg.clients.items():
        where = f"[server.clients.{name}] token"
        secret = client.token.get_secret_value()
        if not secret:
            raise ValueError(f"the bearer token ({where}) is empty; give the client a token")
        _check_token(secret, where)
        if secret in owners:
            raise ValueError(
                f"{where} is the same token as {owners[secret]}: the server could not tell "
                "the two apart; give each client a token of its own"
            )
        owners[secret] = where
        clients[name] = (secret, client.tenant or name)
    return BearerAuth(token or None, clients)


def _check_token(token: str, source: str) -> None:
    if token != token.strip() or any(c in token for c in _BREAKS):
        # No client can send it (header values lose surrounding whitespace): every request
        # would get 401. The value is never quoted.
        raise ValueError(
            f"the bearer token ({source}) starts or ends with whitespace, or holds a line "
            "break or NUL, which no client can send (a secret read with its trailing "
            "newline?); remove it"
        )
    problem = token_problem(token)
    if problem is not None:
        raise ValueError(f"the bearer token ({source}) {problem}")


def resolve_auth_token(cfg: ServeConfig, env: Mapping[str, str] | None = None) -> str | None:
    """The bearer token HTTP clients must present, or None when auth is off (checked as
    ``resolve_auth`` checks it).

    Raises ``ValueError`` when ``[server.clients]`` give tokens of their own, which one
    token cannot carry: None would read as "auth is off" (``create_server`` would serve
    without any token) and a shared token alone would refuse every client. Use
    ``resolve_auth``, whose ``BearerAuth`` ``create_server`` and ``create_http_app`` take.
    """
    auth = resolve_auth(cfg, env)
    if auth is None:
        return None
    if auth.clients:
        raise ValueError(
            "[server.clients] give clients bearer tokens of their own, which one token "
            "cannot carry: call resolve_auth(config) instead, and pass the BearerAuth it "
            "returns as auth_token to create_server / create_http_app"
        )
    return auth.token


def token_problem(token: str) -> str | None:
    """Why no client could present ``token`` in an ``Authorization`` header; None when one can.

    A header carries bytes, which the server reads as Latin-1: a token with
    characters beyond ASCII never equals what a client sends (UTF-8 from curl,
    an encoding error in Python's HTTP clients), so every request would get
    401. The value is never quoted.
    """
    if token.isascii() and not any((c < " " and c != "\t") or c == "\x7f" for c in token):
        return None
    return (
        "holds characters other than printable ASCII, which an HTTP header cannot carry "
        "as they are (clients send them in UTF-8, or refuse to), so every request would "
        "get 401; use ASCII letters, digits and punctuation (e.g. the output of "
        "`openssl rand -hex 32`)"
    )


def auth_switched_off(cfg: ServeConfig, env: Mapping[str, str] | None = None) -> str | None:
    """A warning when a token is configured but bearer auth is switched off
    (``TOOLS_AUTH_ENABLED=false`` or ``[server] auth_enabled = false``), else None.

    The token is never quoted."""
    env = os.environ if env is None else env
    configured = (
        (cfg.auth_token is not None and bool(cfg.auth_token.get_secret_value()))
        or bool(env.get(AUTH_TOKEN_ENV))
        or bool(cfg.clients)
    )
    if not configured:
        return None
    raw = env.get(AUTH_ENABLED_ENV)
    if raw is not None and raw.strip() != "":
        if _truthy(raw, AUTH_ENABLED_ENV):
            return None
        by = f"{AUTH_ENABLED_ENV}={raw.strip()}"
    elif cfg.auth_enabled is False:
        by = "[server] auth_enabled = false"
    else:
        return None
    return (
        f"bearer auth is off ({by}) although a token is configured: HTTP clients are not "
        "asked for it, and anyone who can connect can call every tool; remove the setting "
        "that turns it off, or the token"
    )


def validate_server_table(data: Mapping[str, Any]) -> ServeConfig:
    """``[server]`` validated (raises ``pydantic.ValidationError``)."""
    return ServeConfig.model_validate(dict(data))
