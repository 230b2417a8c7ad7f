"""``toolwire.toml`` loading, env overrides, secrets and plugin loading (DESIGN §5-6)."""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata as md
import inspect
import json
import logging
import os
import re
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote, urlsplit

import pydantic
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator

from ._errors import ConfigError, PluginError, ToolCollisionError

if TYPE_CHECKING:
    from ._kernel import Kernel

__all__ = [
    "ENTRY_POINT_GROUP",
    "ModuleRef",
    "ToolsConfig",
    "ToolwireConfig",
    "build_kernel",
    "check_unloaded_plugin_tables",
    "installed_plugins",
    "load_config",
    "plugin_not_loaded",
    "read_secrets_file",
    "resolve_secrets",
]

log = logging.getLogger("toolwire.config")

ENTRY_POINT_GROUP = "toolwire"
SECRET_REF = "$secretRef"
DEFAULT_CONFIG_FILE = "toolwire.toml"


_NAMESPACE = re.compile(r"[A-Za-z0-9_.-]{1,100}")


_NAMESPACE_RULE = (
    "use 1-100 letters, digits, '_', '-' or '.' (tool names become <namespace>_<name>)"
)


def _namespace_problem(ns: str) -> str:
    return f"namespace {ns!r}: {_NAMESPACE_RULE}"


class ModuleRef(BaseModel):
    """A module whose ``@tool`` functions become tools, optionally namespaced."""

    model_config = ConfigDict(extra="forbid")
    module: str
    namespace: str | None = None

    @field_validator("namespace")
    @classmethod
    def _namespace_fits_tool_names(cls, v: str | None) -> str | None:
        if v is not None and not _NAMESPACE.fullmatch(v):
            raise ValueError(_namespace_problem(v))
        return v


class ToolsConfig(BaseModel):
    """The ``[tools]`` table."""

    model_config = ConfigDict(extra="forbid")
    modules: list[str | ModuleRef] = Field(default_factory=list)

    @field_validator("modules", mode="before")
    @classmethod
    def _entries_are_names_or_tables(cls, v: Any) -> Any:
        # One clear message instead of pydantic's pair for the two union branches.
        if isinstance(v, list):
            for i, item in enumerate(v):
                if isinstance(item, dict):
                    unknown = sorted(set(item) - {"module", "namespace"})
                    if unknown or not isinstance(item.get("module"), str):
                        what = f"unknown key(s) {unknown}" if unknown else "no module name"
                        raise ValueError(
                            f'entry {i}: {what}; an entry is "package.module" or '
                            '{module = "package.module", namespace = "ns"}'
                        )
                    ns = item.get("namespace")
                    if isinstance(ns, str) and not _NAMESPACE.fullmatch(ns):
                        raise ValueError(f"entry {i}: {_namespace_problem(ns)}")
                    if ns is not None and not isinstance(ns, str):
                        kind = _TOML_KINDS.get(type(ns), "a " + type(ns).__name__)
                        raise ValueError(
                            f"entry {i}: namespace {ns!r} is {kind}, not a string; "
                            + _NAMESPACE_RULE
                        )
                elif not isinstance(item, str | ModuleRef):
                    raise ValueError(
                        f"entry {i}: {item!r} is not a module name (a string) or a table"
                    )
        return v

    def refs(self) -> list[ModuleRef]:
        """Modules as ``ModuleRef`` objects."""
        return [m if isinstance(m, ModuleRef) else ModuleRef(module=m) for m in self.modules]


class ToolwireConfig(BaseModel):
    """The whole ``toolwire.toml``. See docs/config.md for every key."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    state: str | None = None
    enabled_plugins: list[str] | None = None
    disabled_plugins: list[str] = Field(default_factory=list)
    max_attempts: int = Field(5, ge=1, le=100)
    default_timeout_s: float | None = Field(None, gt=0)
    deadline_s: float | None = Field(None, gt=0)
    close_grace_s: float = Field(10.0, ge=0, allow_inf_nan=False)
    secrets_file: str | None = None
    tools: ToolsConfig = Field(default_factory=ToolsConfig)
    plugins: dict[str, dict[str, Any]] = Field(default_factory=dict)
    server: dict[str, Any] = Field(default_factory=dict)
    #: Where the config was read from (not a key of the file).
    path: str | None = Field(None, exclude=True)
    #: NAME -> value of every ``$secretRef`` resolved (kept out of repr and dumps).
    _secrets: dict[str, str] = PrivateAttr(default_factory=dict)
    #: dotted key -> the environment variable its value came from.
    _env_sources: dict[str, str] = PrivateAttr(default_factory=dict)
    #: The key the file lists the plugins to load under: ``plugins`` for the short form.
    _enabled_key: str = PrivateAttr("enabled_plugins")

    @property
    def secret_names(self) -> list[str]:
        """The names of the secrets this configuration resolved (never their values)."""
        return sorted(self._secrets)

    def env_var_of(self, key: str) -> str | None:
        """The environment variable the value at dotted ``key`` came from, else ``None``.

        ``key`` as the file spells it: ``"plugins.ratelimit.config_file"``,
        ``"state"``. A value inside a table one variable set as JSON
        (``TOOLWIRE_PLUGINS__MCP__SERVERS='{...}'``) names that variable. A plugin
        uses it to blame the variable, not the file, for a value it finds wrong.
        """
        return _env_var_at(key, self._env_sources)

    def source_of(self, key: str) -> str:
        """Where the value at dotted ``key`` came from, as a message says it.

        ``"the environment variable TOOLWIRE_PLUGINS__RATELIMIT__CONFIG_FILE"``,
        ``"key plugins.ratelimit.config_file in /srv/toolwire.toml"``, or, with no
        file read, ``"key plugins.ratelimit.config_file (no config file: a default,
        or set in code)"``. Whether the key is set at all is not checked.
        """
        var = self.env_var_of(key)
        if var is not None:
            return f"the environment variable {var}"
        if self.path is not None:
            return f"key {key} in {self.path}"
        return f"key {key} (no config file: a default, or set in code)"

    def __repr_args__(self) -> Any:
        hide = self._secrets
        for k, v in super().__repr_args__():
            yield k, _hide_values(v, hide) if hide else v

    @field_validator("max_attempts", "default_timeout_s", "deadline_s", mode="before")
    @classmethod
    def _no_boolean(cls, v: Any) -> Any:
        # pydantic reads true as 1: `max_attempts = true` meant one attempt, silently
        if isinstance(v, bool):
            raise ValueError(f"expected a number, not the boolean {str(v).lower()}")
        return v

    @field_validator("state")
    @classmethod
    def _state_url(cls, v: str | None) -> str | None:
        if v is not None and "://" not in v:
            raise ValueError(
                "expected a URL: 'memory://', 'sqlite:///path/to/state.db' or 'redis://host:6379/0'"
            )
        if v is not None:
            from .state import StateStoreError, open_store

            try:
                open_store(v)  # the whole URL (scheme, path, options); nothing is opened
            except StateStoreError:
                pass  # a missing client library: reported, with its fix, when the kernel opens
        return v


# ----------------------------------------------------------------- loading
def _loc(err: Mapping[str, Any]) -> str:
    return ".".join(str(p) for p in err.get("loc", ()))


def _model_at(ann: Any, path: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model that holds the key at the end of ``path`` (None: unknown)."""
    while True:
        origin = typing.get_origin(ann)
        if origin is typing.Annotated:
            ann = typing.get_args(ann)[0]
        elif origin in (typing.Union, types.UnionType):
            for arg in typing.get_args(ann):
                found = _model_at(arg, path) if arg is not type(None) else None
                if found is not None:
                    return found
            return None
        elif isinstance(ann, type) and issubclass(ann, BaseModel):
            if not path:
                return ann
            model = ann
            field = next(
                (f for n, f in model.model_fields.items() if path[0] in _field_keys(model, n, f)),
                None,
            )
            if field is None:
                return None
            ann, path = field.annotation, path[1:]
        elif origin in (dict, Mapping) and path:
            ann, path = typing.get_args(ann)[-1], path[1:]
        elif origin in (list, tuple) and path and isinstance(path[0], int):
            ann, path = typing.get_args(ann)[0], path[1:]
        else:
            return None


def unknown_key(model: Any, loc: tuple[Any, ...]) -> str:
    """The message for a key ``loc`` that ``model`` forbids: the close match, or the keys.

    ``enabled_plugin`` reads "unknown key; did you mean 'enabled_plugins'?"; a key
    with no close match lists the keys its table takes. ``model`` is the model that
    was validated; ``loc`` the error's location in it.
    """
    holder = _model_at(model, tuple(loc[:-1]))
    if holder is None or not loc:
        return "unknown key"
    known = sorted(_model_keys(holder, shown=True))
    key = str(loc[-1])
    close = difflib.get_close_matches(key, known, n=2, cutoff=0.6)
    if close and difflib.SequenceMatcher(None, key, close[0]).ratio() >= 0.9:
        close = close[:1]  # a slip of one letter: the second guess is noise
    if close:
        return f"unknown key; did you mean {' or '.join(repr(k) for k in close)}?"
    return f"unknown key (known keys: {', '.join(known)})" if known else "unknown key"


def _env_value(var: str, raw: str) -> Any:
    """A variable's value: parsed as JSON when it parses, else the string itself."""
    try:
        return json.loads(raw)
    except ValueError:
        return raw
    except RecursionError:
        raise ConfigError(
            f"the environment variable {var} holds JSON nested too deeply to read; "
            f"a configuration value is at most {MAX_DEPTH} levels deep: fix or unset {var}"
        ) from None


#: How deeply tables and arrays of a configuration may nest: far more than any real
#: configuration needs, far less than what exhausts Python's stack (a RecursionError
#: traceback instead of an error naming the key).
MAX_DEPTH = 100


def _too_deep(value: Any, limit: int = MAX_DEPTH) -> str | None:
    """The dotted key of the first value nested more than ``limit`` levels deep, else None.

    Iterative: it must not itself run out of stack on what it checks.
    """
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        node, key, depth = stack.pop()
        if isinstance(node, dict):
            children = [(v, f"{key}.{k}" if key else str(k)) for k, v in node.items()]
        elif isinstance(node, list):
            children = [(v, f"{key}[{i}]") for i, v in enumerate(node)]
        else:
            continue
        if depth >= limit and children:
            return key
        stack.extend((v, k, depth + 1) for v, k in reversed(children))
    return None


_TOML_KINDS = {
    str: "a string",
    int: "an integer",
    float: "a float",
    bool: "a boolean",
    list: "an array",
    dict: "a table",
}


def _apply_env(
    data: dict[str, Any], env: Mapping[str, str], file: str | None = None
) -> dict[str, str]:
    """TOOLWIRE_* variables override file values (see docs/config.md).

    Returns ``dotted key -> variable`` for the values taken from the environment,
    so an invalid one is reported as the variable's fault, not the file's.
    """
    sources: dict[str, str] = {}
    simple = {
        "TOOLWIRE_STATE": "state",
        "TOOLWIRE_MAX_ATTEMPTS": "max_attempts",
        "TOOLWIRE_DEFAULT_TIMEOUT_S": "default_timeout_s",
        "TOOLWIRE_DEADLINE_S": "deadline_s",
        "TOOLWIRE_CLOSE_GRACE_S": "close_grace_s",
        "TOOLWIRE_SECRETS_FILE": "secrets_file",
    }
    for var, key in simple.items():
        if var in env and env[var] != "":
            raw = env[var]
            data[key] = raw if key in ("state", "secrets_file") else _env_value(var, raw)
            sources[key] = var
    if "state" not in data and env.get("REDIS_URL"):
        data["state"] = env["REDIS_URL"]
        sources["state"] = "REDIS_URL"
    if "TOOLWIRE_LOAD_PLUGINS" in env:
        raw = env["TOOLWIRE_LOAD_PLUGINS"]
        data["enabled_plugins"] = [p.strip() for p in raw.split(",") if p.strip()]
        sources["enabled_plugins"] = "TOOLWIRE_LOAD_PLUGINS"
    if env.get("TOOLWIRE_DISABLE_PLUGINS"):
        raw = env["TOOLWIRE_DISABLE_PLUGINS"]
        extra = list(dict.fromkeys(p.strip() for p in raw.split(",") if p.strip()))
        listed = data.get("disabled_plugins", [])
        if isinstance(listed, list):  # otherwise validation names the file's bad value
            data["disabled_plugins"] = [*listed, *extra]
        # One entry per name ("disabled_plugins[x]"): the file's list and the variable's add up.
        sources.update((f"disabled_plugins[{p}]", "TOOLWIRE_DISABLE_PLUGINS") for p in extra)
    prefix = "TOOLWIRE_PLUGINS__"
    names: list[str] | None = None  # the plugin names a variable may mean (read once)
    # shallow variables first: __A__X and __A__X__Y both set is an error whatever the
    # environment's order (the deeper one used to be overwritten silently)
    for var, raw in sorted(env.items(), key=lambda kv: kv[0].count("__")):
        if not var.startswith(prefix):
            continue
        parts = var[len(prefix) :].split("__")
        if len(parts) < 2 or not all(parts):
            raise ConfigError(
                f"environment variable {var}: expected TOOLWIRE_PLUGINS__<plugin>__<key>[__<subkey>]"
            )
        if names is None:
            tables = data.get("plugins")
            names = [*(tables if isinstance(tables, dict) else ()), *installed_plugins()]
        path = ["plugins"]
        node = data.setdefault("plugins", {})
        for p in [_env_plugin_name(parts[0], names), *[x.lower() for x in parts[1:-1]], None]:
            if not isinstance(node, dict):
                # a value is there (from the file, or another variable); a key needs a table
                key = ".".join(path)
                other = sources.get(key)
                where = f"set by {other}" if other else "in the file"
                kind = _TOML_KINDS.get(type(node), "a " + type(node).__name__)
                raise ConfigError(
                    f"is {kind} {where}, not a table, so the environment variable {var} "
                    f"cannot set a key inside it; fix {other or 'the value'} or unset {var}",
                    file=file,
                    key=key,
                )
            if p is None:
                break
            path.append(p)
            node = node.setdefault(p, {})
            other = sources.get(".".join(path))
            if other is not None and isinstance(node, dict):
                # a JSON object from another variable: a key set both in it and by this one,
                # or merged into it, is no clearer than a key inside a string
                raise ConfigError(
                    f"is a table set by {other}, so the environment variable {var} cannot "
                    f"set a key inside it too; set that key in {other}'s value or unset {var}",
                    file=file,
                    key=".".join(path),
                )
        dotted = ".".join([*path, parts[-1].lower()])  # the plugin's name as resolved
        twin = sources.get(dotted)
        if twin is not None and twin != var:
            # keys are lower-cased: which of two spellings won depended on the environment
            raise ConfigError(
                f"environment variables {twin} and {var} both set it (keys are lower-cased); "
                "unset one",
                file=file,
                key=dotted,
            )
        node[parts[-1].lower()] = _env_value(var, raw)
        sources[dotted] = var
    return sources


def _env_plugin_name(part: str, names: list[str]) -> str:
    """The plugin a ``TOOLWIRE_PLUGINS__<part>__...`` variable configures.

    Its name lower-cased, unless that is no plugin and exactly one plugin (installed,
    or with a table in the file) is named like it but for case and ``-`` (which no
    shell lets a variable name hold): ``MY_QUOTA`` configures ``my-quota`` and
    ``MyQuota``. Before, such a plugin could not be configured from the environment.
    """
    low = part.lower()
    if low in names:
        return low
    key = low.replace("-", "_")
    meant = {n for n in names if n.lower().replace("-", "_") == key}
    return meant.pop() if len(meant) == 1 else low


def _env_var_at(key: str, sources: Mapping[str, str] | None) -> str | None:
    """The variable that set ``key`` or a table or list holding it (see ``env_var_of``)."""
    while key and sources:
        var = sources.get(key)
        if var is not None:
            return var
        cut = max(key.rfind("."), key.rfind("["))
        if cut <= 0:
            return None
        key = key[:cut]
    return None


def _problem(key: str, msg: str, sources: Mapping[str, str] | None) -> str:
    """``key: msg``, naming the environment variable when the value came from one.

    A problem with a table that only environment variables put there (keys are
    lower-cased: ``TOOLWIRE_PLUGINS__MCP__SERVERS__WEATHER__TIMEOUT`` makes
    ``servers.weather`` even when the file says ``Weather``) names them too.
    """
    msg = msg.removeprefix("Value error, ")  # pydantic's prefix for a validator's ValueError
    # a value inside a table or list one variable set as JSON names that variable
    # (before: `plugins.x.limits.add: ...` blamed the file for TOOLWIRE_PLUGINS__X__LIMITS)
    var = _env_var_at(key, sources)
    if var is not None:
        return f"{key}: {msg} (the value comes from the environment variable {var})"
    inside = sorted(v for k, v in (sources or {}).items() if k.startswith(key + "."))
    if inside:
        return (
            f"{key}: {msg} (set by the environment variable{'s' if len(inside) > 1 else ''} "
            f"{', '.join(inside)}; their keys are read lower-case)"
        )
    return f"{key}: {msg}"


def looked_for(
    path: str, resolved: str | os.PathLike[str], base_dir: str | os.PathLike[str] | None
) -> str:
    """Where a path written in the config was read, for an error message about it.

    ``path`` as written, ``resolved`` as read (relative to ``base_dir``, the directory
    of toolwire.toml; ``None``: no config file, the working directory). Returns
    ``" (looked for /abs/p: a relative path is read from the directory of
    toolwire.toml)"``, ``" (read as /abs/p)"`` for an absolute path read elsewhere
    (``~`` expanded), or ``""`` when the path was read as written.
    """
    where = os.path.abspath(resolved)
    if Path(os.path.expanduser(path)).is_absolute():
        return "" if where == os.path.abspath(path) else f" (read as {where})"
    if base_dir is not None:
        return f" (looked for {where}: a relative path is read from the directory of toolwire.toml)"
    return (
        f" (looked for {where}: with no toolwire.toml, a relative path is read from the "
        "working directory)"
    )


def read_secrets_file(path: Path) -> dict[str, str]:
    """Parse a ``NAME=value`` secrets file (``#`` comments, optional ``export``, quotes).

    A value in quotes (``'...'`` or ``"..."``) is taken as it stands between
    them; a comment may follow. An unquoted value ends before `` #``.

    A file that cannot be read (a directory, no permission, not UTF-8) is a
    ``ConfigError`` naming it.
    """
    out: dict[str, str] = {}
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 text: {exc}", file=str(path)) from exc
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc}", file=str(path)) from exc
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "=" not in line:
            raise ConfigError(f"line {n}: expected NAME=value", file=str(path))
        k, v = line.split("=", 1)
        k = k.strip().removeprefix("export ").strip()
        out[k] = _secrets_value(v.strip(), n)
    return out


def _secrets_value(v: str, n: int) -> str:
    """The value of line ``n``: a quoted one unquoted (one pair), a trailing `` # ...`` dropped."""
    if v[:1] in ("'", '"'):
        end = v.find(v[0], 1)
        rest = v[end + 1 :].strip() if end != -1 else ""
        if end == -1 or (rest and not rest.startswith("#")):
            raise ConfigError(
                f"line {n}: a value that starts with {v[0]} needs its closing {v[0]} "
                "(only a # comment may follow it)"
            )
        return v[1:end]
    for i, c in enumerate(v):  # unquoted: `# ...` after a space is a comment
        if c == "#" and i and v[i - 1] in " \t":
            return v[:i].rstrip()
    return v


def _hide_values(value: Any, secrets: Mapping[str, str]) -> Any:
    """``value`` with every resolved secret shown as ``[secret:<NAME>]`` (for repr)."""
    names = {v: k for k, v in secrets.items()}
    if isinstance(value, str):
        return f"[secret:{names[value]}]" if value in names else value
    if isinstance(value, Mapping):
        return {k: _hide_values(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [_hide_values(v, secrets) for v in value]
    return value


def resolve_secrets(
    value: Any,
    *,
    env: Mapping[str, str],
    secrets: Mapping[str, str],
    file: str | None,
    key: str = "",
    found: dict[str, str] | None = None,
    missing: list[tuple[str, str]] | None = None,
) -> Any:
    """Replace every ``{"$secretRef": "NAME"}`` by the secret's value.

    Looked up in the environment first, then in the secrets file (also when the
    environment has it empty). A missing secret is a ``ConfigError`` naming the
    key and the variable to set.
    ``found`` collects ``NAME -> value`` of every reference resolved. With
    ``missing``, a missing secret is appended to it as ``(key, NAME)`` (and left
    as ``None``) instead, so that the caller can name every one at once.
    """
    if isinstance(value, dict):
        if SECRET_REF in value:
            if set(value) != {SECRET_REF} or not isinstance(value[SECRET_REF], str):
                raise ConfigError(
                    'a secret reference must be exactly {"$secretRef" = "ENV_NAME"}',
                    file=file,
                    key=key,
                )
            name = value[SECRET_REF]
            resolved = env.get(name)
            in_file = secrets.get(name)
            # unset, or set to "" (an unset ${VAR} in a compose file): the file's value
            if resolved is None or (resolved == "" and in_file):
                resolved = in_file
            if resolved is not None:
                if found is not None:
                    found[name] = resolved
                return resolved
            if missing is not None:
                missing.append((key, name))
                return None
            raise ConfigError(
                f"secret {name!r} is not set; export {name}=... or add it to the secrets file",
                file=file,
                key=key,
            )
        return {
            k: resolve_secrets(
                v,
                env=env,
                secrets=secrets,
                file=file,
                key=f"{key}.{k}" if key else k,
                found=found,
                missing=missing,
            )
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [
            resolve_secrets(
                v,
                env=env,
                secrets=secrets,
                file=file,
                key=f"{key}[{i}]",
                found=found,
                missing=missing,
            )
            for i, v in enumerate(value)
        ]
    return value


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    required: bool | None = None,
) -> ToolwireConfig:
    """Load and validate ``toolwire.toml``, applying env overrides and secrets.

    With ``path=None``: ``$TOOLWIRE_CONFIG``, else ``./toolwire.toml`` if it
    exists, else the defaults. An explicit path that does not exist is an error.
    """
    env = os.environ if env is None else env
    explicit = path is not None or bool(env.get("TOOLWIRE_CONFIG"))
    # `~` expanded: a quoted TOOLWIRE_CONFIG="~/..." or --config '~/...' reaches us unexpanded
    p = Path(
        os.path.expanduser(
            path if path is not None else env.get("TOOLWIRE_CONFIG") or DEFAULT_CONFIG_FILE
        )
    )
    data: dict[str, Any] = {}
    file: str | None = None
    from_env = path is None and bool(env.get("TOOLWIRE_CONFIG"))
    named_by = " (named by the environment variable TOOLWIRE_CONFIG)" if from_env else ""
    if path is not None and not str(path).strip():
        raise ConfigError(
            "the config path is empty: give the path of a toolwire.toml, or none to use "
            "$TOOLWIRE_CONFIG, else ./toolwire.toml, else the defaults"
        )
    if p.is_dir():
        raise ConfigError(
            f"is a directory, not a config file{named_by}: give the file's path, "
            f"e.g. {str(p / DEFAULT_CONFIG_FILE)!r}",
            file=str(p),
        )
    if p.exists():
        file = str(p)
        try:
            data = tomllib.loads(p.read_text(encoding="utf-8-sig"))
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"invalid TOML: {exc}", file=file) from exc
        except RecursionError:
            raise ConfigError(
                "arrays or inline tables nested too deeply to read; a configuration value "
                f"is at most {MAX_DEPTH} levels deep",
                file=file,
            ) from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"not UTF-8 text (TOML files are UTF-8): {exc}", file=file) from exc
        except OSError as exc:
            raise ConfigError(f"cannot read: {exc}", file=file) from exc
    elif explicit if required is None else required:
        where = "" if p.is_absolute() else f" (a relative path is read from {os.getcwd()})"
        raise ConfigError(f"config file not found{named_by}; check the path{where}", file=str(p))
    if isinstance(data.get("plugins"), list):
        # DESIGN's short form: plugins = ["a", "b"] (only when no [plugins.x] tables)
        if "enabled_plugins" in data:
            raise ConfigError(
                "both `plugins = [...]` and `enabled_plugins` list the plugins to load; "
                "keep one (enabled_plugins)",
                file=file,
                key="plugins",
            )
        data["enabled_plugins"] = data.pop("plugins")
        enabled_key = "plugins"  # what errors about the list name: the key the file has
    else:
        enabled_key = "enabled_plugins"
    env_sources = _apply_env(data, env, file)
    if "enabled_plugins" in env_sources:
        enabled_key = "enabled_plugins"  # TOOLWIRE_LOAD_PLUGINS replaced the file's list
    deep = _too_deep(data)
    if deep is not None:
        key = ".".join(deep.split("[", 1)[0].split(".")[:4])  # where it starts, not 100 levels
        var = next(
            (v for k, v in env_sources.items() if deep == k or deep.startswith((k + ".", k + "["))),
            None,
        )
        where = f" (the value comes from the environment variable {var})" if var else ""
        raise ConfigError(
            f"nested more than {MAX_DEPTH} levels deep{where}; a configuration value "
            "never needs that: flatten it",
            file=None if var else file,
            key=key,
        )
    secrets_path = data.get("secrets_file")
    secrets: dict[str, str] = {}
    if secrets_path is not None and not isinstance(secrets_path, str):
        raise ConfigError(
            _problem(
                "secrets_file",
                f"must be a path (a string), not {type(secrets_path).__name__} {secrets_path!r}",
                env_sources,
            ),
            file=file,
        )
    if secrets_path:
        sp = Path(os.path.expanduser(secrets_path))  # as the SQLite path of `state` is
        # relative to the file that names it; from the environment (TOOLWIRE_SECRETS_FILE),
        # to the working directory, as TOOLWIRE_STATE's SQLite path is
        if file and not sp.is_absolute() and "secrets_file" not in env_sources:
            sp = Path(file).parent / sp
        if not sp.exists():
            raise ConfigError(
                _problem("secrets_file", f"secrets file {str(sp)!r} not found", env_sources),
                file=file,
            )
        try:
            secrets = read_secrets_file(sp)
        except ConfigError as exc:
            raise ConfigError(
                _problem("secrets_file", f"secrets file {str(sp)!r}: {exc.detail}", env_sources),
                file=file,
            ) from exc
    found: dict[str, str] = {}
    missing: list[tuple[str, str]] = []
    data = resolve_secrets(data, env=env, secrets=secrets, file=file, found=found, missing=missing)
    if missing:  # every one at once: a newcomer with five to set should not learn them one a run
        (first, name), rest = missing[0], missing[1:]
        names = list(dict.fromkeys(n for _, n in missing))
        also = "; ".join(f"{k}: secret {n!r}" for k, n in rest)
        raise ConfigError(
            f"secret {name!r} is not set"
            + (f"; also not set: {also}" if rest else "")
            + f"; export {' '.join(f'{n}=...' for n in names)} or add "
            + ("them" if len(names) > 1 else "it")
            + " to the secrets file",
            file=file,
            key=first,
        )
    try:
        cfg = ToolwireConfig.model_validate(data)
    except pydantic.ValidationError as exc:
        msgs = []
        for e in exc.errors(include_url=False):
            msg = (
                unknown_key(ToolwireConfig, e["loc"])
                if e.get("type") == "extra_forbidden"
                else e.get("msg", "invalid")
            )
            loc = _loc(e)
            if enabled_key != "enabled_plugins" and loc.split(".")[0] == "enabled_plugins":
                loc = enabled_key + loc.removeprefix("enabled_plugins")
            msgs.append(_problem(loc, msg, env_sources))
        raise ConfigError("; ".join(msgs), file=file or "<defaults+env>") from exc
    cfg.path = file
    cfg._enabled_key = enabled_key
    cfg._secrets = found
    cfg._env_sources = env_sources
    if file is not None and cfg.state is not None and "state" not in env_sources:
        cfg.state = sqlite_beside(cfg.state, Path(file).parent)
    return cfg


def sqlite_beside(url: str, base: Path) -> str:
    """A ``sqlite:///relative.db`` URL made absolute under ``base`` (other URLs unchanged).

    A relative path in a config file means "next to the file", not "wherever
    the process happens to start" (an MCP client spawning ``toolwire serve
    --config ...`` picks the working directory). The path is read as
    ``open_store`` reads it (percent-decoded) and written back encoded, so a
    ``#``, ``?`` or ``%`` in ``base`` survives; ``:memory:``, absolute and
    ``~`` paths are left alone.
    """
    text = url.strip()
    if not text.lower().startswith("sqlite:///"):
        return url
    try:
        parts = urlsplit(text)
    except ValueError:
        return url  # open_store names the problem
    path = unquote(parts.path[1:])
    if not path or path == ":memory:" or path.startswith(("/", "~")):
        return url
    query = f"?{parts.query}" if parts.query else ""
    return f"sqlite:///{quote(str((base / path).resolve()))}{query}"


# ------------------------------------------------------------ entry points
def installed_plugins() -> dict[str, md.EntryPoint]:
    """Plugins installed in this environment: entry-point name -> entry point."""
    return {ep.name: ep for ep in md.entry_points(group=ENTRY_POINT_GROUP)}


def _dist_of(ep: md.EntryPoint) -> tuple[str | None, str | None]:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return None, None
    return dist.metadata["Name"], dist.version


#: pydantic error types of a value that must be a list or a table
_SHAPES = frozenset({"list_type", "dict_type", "model_type", "model_attributes_type"})


def _plugin_config(
    name: str,
    factory: Any,
    section: dict[str, Any],
    file: str | None,
    env_sources: Mapping[str, str] | None = None,
) -> Any:
    model = getattr(factory, "Config", None)
    if model is None:
        if section:
            raise ConfigError(
                f"plugin {name!r} takes no configuration, but keys {sorted(section)} were given",
                file=file,
                key=f"plugins.{name}",
            )
        return None
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise PluginError(name, "its Config attribute must be a pydantic BaseModel subclass")
    if "order" in model.model_fields:
        raise PluginError(
            name,
            f"its Config declares a field 'order', but `order` in [plugins.{name}] is the "
            "kernel's own key (the plugin's place in the hook order), taken out before the "
            "plugin's Config sees the table: that field would never get a value; rename it",
        )
    try:
        validated = model.model_validate(section)
    except pydantic.ValidationError as exc:
        msgs = []
        for e in exc.errors(include_url=False):
            msg = (
                unknown_key(model, e["loc"])
                if e.get("type") == "extra_forbidden"
                else e.get("msg", "invalid")
            )
            key = f"plugins.{name}.{_loc(e)}"
            problem = _problem(key, msg, env_sources)
            var = (env_sources or {}).get(key)
            if var is not None and isinstance(e.get("input"), str) and e.get("type") in _SHAPES:
                # the variable's text was not JSON, so it was taken as a string (`a,b`)
                example = '["a", "b"]' if e["type"] == "list_type" else '{"k": "v"}'
                problem += f"; a variable gives one as JSON: {var}='{example}'"
            msgs.append(problem)
        raise ConfigError("; ".join(msgs), file=file or "<defaults+env>") from exc
    except (ConfigError, PluginError):
        raise
    except Exception as exc:  # a validator's bug: pydantic wraps only ValueError/AssertionError
        raise PluginError(
            name,
            f"its Config model {model.__qualname__} failed while validating [plugins.{name}]: "
            f"{type(exc).__name__}: {exc} (a bug in the plugin: a validator refuses a value by "
            "raising ValueError; report it to the plugin's authors, or disable the plugin)",
        ) from exc
    _warn_ignored_keys(name, model, section, file, env_sources)
    return validated


def _model_keys(model: type[BaseModel], *, shown: bool = False) -> set[str]:
    """The keys ``model`` reads: a field's alias (its validation alias when it has one),
    and its name when it has no alias or the model also validates by name.
    ``shown``: only the fields a table shows (not ``exclude``)."""
    keys: set[str] = set()
    for fname, field in model.model_fields.items():
        if not (shown and field.exclude):
            keys |= _field_keys(model, fname, field)
    return keys


def _field_keys(model: type[BaseModel], fname: str, field: Any) -> set[str]:
    """The keys ``model`` reads its field ``fname`` from (see ``_model_keys``)."""
    cfg = model.model_config
    by_name = bool(cfg.get("validate_by_name") or cfg.get("populate_by_name"))
    by_alias = cfg.get("validate_by_alias") is not False
    alias = field.validation_alias if field.validation_alias is not None else field.alias
    names: set[str] = set()
    for a in alias.choices if isinstance(alias, pydantic.AliasChoices) else [alias]:
        if isinstance(a, str):
            names.add(a)
        elif isinstance(a, pydantic.AliasPath) and a.path:
            names.add(str(a.path[0]))
    keys = names if by_alias else set()
    if by_name or not by_alias or not names:
        keys = keys | {fname}
    return keys


def _warn_ignored_keys(
    name: str,
    model: type[BaseModel],
    section: Mapping[str, Any],
    file: str | None,
    env_sources: Mapping[str, str] | None,
) -> None:
    """Warn about keys of ``[plugins.<name>]`` that a ``Config`` which does not forbid
    unknown keys (pydantic's default) dropped: a misspelt key would otherwise be lost
    without a word. ("forbid" made them errors; "allow" keeps them.)"""
    if model.model_config.get("extra") not in (None, "ignore"):
        return
    known = _model_keys(model)
    for key in sorted(k for k in section if k not in known):
        log.warning(
            "%s: %s; the plugin ignores it (its Config model does not refuse unknown keys: "
            "model_config = ConfigDict(extra='forbid') would make this an error)",
            file or "<defaults+env>",
            _problem(f"plugins.{name}.{key}", unknown_key(model, (key,)), env_sources),
        )


def _binds(bind: Any, *args: Any) -> bool:
    try:
        bind(*args)
    except TypeError:
        return False
    return True


def _check_factory_call(name: str, factory: Any, cfg: Any) -> None:
    """A ``PluginError`` when ``factory`` cannot take what the kernel passes it: the
    validated config when it has a ``Config`` attribute, nothing otherwise."""
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):  # a builtin or C callable: let the call say
        return
    try:
        sig.bind(cfg) if cfg is not None else sig.bind()
    except TypeError as exc:
        qual = getattr(factory, "__qualname__", type(factory).__name__)
        if cfg is not None and _binds(sig.bind_partial, cfg):  # it takes the config, and more
            why = (
                f"{qual} has a Config attribute, so the kernel calls {qual}(config) with the "
                f"validated [plugins.{name}] table and nothing else, but it needs more "
                f"({exc}): give its other parameters defaults"
            )
        elif cfg is not None:
            why = (
                f"{qual} has a Config attribute, so the kernel calls {qual}(config) with the "
                f"validated [plugins.{name}] table, but it takes no such argument ({exc}): "
                "give it a config parameter"
            )
        else:
            why = (
                f"{qual} has no Config attribute, so the kernel calls {qual}() with no "
                f"arguments, but it needs some ({exc}): declare Config = <its pydantic "
                "model> on it, or give its parameters defaults"
            )
        raise PluginError(name, why) from exc


def _pop_order(
    name: str, section: dict[str, Any], file: str | None, env_sources: Mapping[str, str] | None
) -> int | None:
    """Take the kernel's own key ``order`` out of a ``[plugins.<name>]`` table (checked)."""
    order = section.pop("order", None)
    if order is not None and (not isinstance(order, int) or isinstance(order, bool)):
        key = f"plugins.{name}.order"
        var = (env_sources or {}).get(key)
        where = f" (the value comes from the environment variable {var})" if var else ""
        raise ConfigError(f"must be an integer{where}", file=file, key=key)
    return order


def instantiate_plugin(
    name: str,
    factory: Any,
    section: dict[str, Any],
    file: str | None,
    env_sources: Mapping[str, str] | None = None,
    *,
    where: str | None = None,
) -> tuple[object, Any, int | None]:
    """Validate the plugin's section and call its factory; returns (plugin, config, order).

    ``where`` names the entry point the factory came from, for errors.
    """
    if isinstance(factory, types.ModuleType) or not callable(factory):
        # pytest11-style entry points name a module; a module-level instance is a slip too
        if isinstance(factory, types.ModuleType):
            what, example = f"the module {factory.__name__!r}", f"{factory.__name__}:MyPlugin"
        else:
            cls = type(factory)
            what = f"a {cls.__name__} object, not a class or function"
            example = f"{cls.__module__}:{cls.__qualname__}"
        raise PluginError(
            name,
            f"{where or 'the entry point'} names {what}: an entry point names a factory (the "
            f"plugin class, or a function returning the plugin) that the kernel calls once "
            f"per kernel, e.g. {name} = {json.dumps(example)}",
        )
    section = dict(section)
    order = _pop_order(name, section, file, env_sources)
    cfg = _plugin_config(name, factory, section, file, env_sources)
    _check_factory_call(name, factory, cfg)
    try:
        plugin = factory(cfg) if cfg is not None else factory()
    except (ConfigError, PluginError):
        raise
    except Exception as exc:
        raise PluginError(name, f"failed to start: {type(exc).__name__}: {exc}") from exc
    return plugin, cfg, order


def plugin_not_loaded(cfg: ToolwireConfig, name: str, *, dist: str | None = None) -> ConfigError:
    """The error for a plugin ``name`` that ``build_kernel(cfg)`` did not load.

    It names what left the plugin out - ``disabled_plugins`` in the file,
    ``TOOLWIRE_DISABLE_PLUGINS``, an ``enabled_plugins`` list without it (from
    the file or ``TOOLWIRE_LOAD_PLUGINS``), or the plugin not being installed or
    loadable - and what to change. ``dist`` is the distribution that brings the
    plugin (default ``toolwire-<name>``).
    """
    reasons, in_file = _left_out(cfg, name)
    if not reasons:
        if name not in installed_plugins():
            reasons.append(f"it is not installed (pip install {dist or 'toolwire-' + name})")
        else:
            reasons.append(
                "it is installed and enabled but could not be loaded: see the warning logged "
                "above (a missing dependency, usually)"
            )
    return ConfigError(
        f"the {name} plugin is not loaded: {'; and '.join(reasons)}",
        file=cfg.path if in_file else None,
    )


def _left_out(cfg: ToolwireConfig, name: str) -> tuple[list[str], bool]:
    """Why ``enabled_plugins`` / ``disabled_plugins`` (from the file or the environment)
    leave plugin ``name`` out, each with what to change (empty: they do not); and
    whether a reason is in the file."""
    env = cfg._env_sources
    reasons: list[str] = []
    in_file = False
    if name in cfg.disabled_plugins:
        var = env.get(f"disabled_plugins[{name}]")
        if var is not None:
            reasons.append(f"the environment variable {var} disables it (remove {name} from it)")
        if var is None or cfg.disabled_plugins.count(name) > 1:
            in_file = True
            reasons.append(f"disabled_plugins lists it (remove {name!r} from that list)")
    enabled = cfg.enabled_plugins
    if enabled is not None and name not in enabled:
        var = env.get("enabled_plugins")
        if var is not None and not enabled:
            reasons.append(
                f"the environment variable {var} is set but empty, which loads no plugin "
                f"(add {name} to it, or unset it to load every installed plugin)"
            )
        elif var is not None:
            reasons.append(
                f"the environment variable {var} loads only {', '.join(enabled)} "
                f"(add {name} to it, or unset it to load every installed plugin)"
            )
        else:
            in_file = True
            reasons.append(
                f"{cfg._enabled_key} = {json.dumps(enabled)} leaves it out (add {name!r} to "
                "that list, or remove the list to load every installed plugin)"
            )
    return reasons, in_file


def check_unloaded_plugin_tables(cfg: ToolwireConfig) -> None:
    """Warn about each ``[plugins.<name>]`` table of an installed plugin that
    ``enabled_plugins`` / ``disabled_plugins`` leave out (``toolwire config check``).

    The table is validated against the plugin's ``Config`` model as if the plugin
    were enabled, so a broken table does not wait for the day it is: the warning
    says what would fail, or that the table is not used (a valid table of a plugin
    that ``disabled_plugins`` switches off on purpose is no warning). This imports the plugin's
    module but never constructs the plugin; ``build_kernel`` does neither for a
    plugin it does not load. Unknown plugin names are ``build_kernel``'s errors.
    """
    file = cfg.path
    where = file or "<defaults+env>"
    available = installed_plugins()
    for n, table in cfg.plugins.items():
        if n not in available:
            continue
        reasons, _ = _left_out(cfg, n)
        if not reasons:
            continue
        head = f"{where}: plugin {n!r} is not enabled: {'; and '.join(reasons)}"
        try:
            factory = _load_factory(n, available[n], explicit=True)
        except PluginError as exc:
            log.warning("%s; its table [plugins.%s] could not be checked: %s", head, n, exc)
            continue
        try:
            section = dict(table)
            _pop_order(n, section, file, cfg._env_sources)
            _plugin_config(n, factory, section, file, cfg._env_sources)
        except (ConfigError, PluginError) as exc:
            problem = str(exc)
            if isinstance(exc, ConfigError):  # the file is named once, at the start
                problem = f"{exc.key}: {exc.detail}" if exc.key else exc.detail
            log.warning("%s; its table [plugins.%s] would fail: %s", head, n, problem)
            continue
        if n in cfg.disabled_plugins:  # switched off on purpose, its table kept for later
            log.info("%s; its table [plugins.%s] is valid, not used", head, n)
        else:  # left out of enabled_plugins: a table written for nothing, likely a slip
            log.warning("%s; its table [plugins.%s] is not used", head, n)


def _meant(name: str, names: Mapping[str, Any]) -> str:
    """``did you mean 'retry'?`` for a misspelt plugin name, else ''."""
    close = difflib.get_close_matches(name, sorted(names), n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else ""


_SKIPPED = object()
_FIX_EP = "fix [project.entry-points.toolwire] in the plugin's pyproject.toml and reinstall it"


def _where(ep: md.EntryPoint) -> str:
    """``entry point stamp = "toolwire_stamp:StampPlugin" of toolwire-stamp``."""
    dist, _ = _dist_of(ep)
    return f"entry point {ep.name} = {json.dumps(ep.value)}" + (f" of {dist}" if dist else "")


def _load_factory(n: str, ep: md.EntryPoint, *, explicit: bool) -> Any:
    """What the plugin's entry point names, or ``_SKIPPED`` (a missing third-party
    dependency of a plugin loaded only because it is installed: a warning is logged).

    Errors say which of the entry point and the plugin's code is wrong: a value not of
    the form ``module:attribute``, a module or attribute that is not there.
    """
    where = _where(ep)
    match = ep.pattern.match(ep.value)
    if match is None:
        raise PluginError(n, f'{where} is not of the form "module:attribute" ({_FIX_EP})')
    module_name = match.group("module")
    try:
        obj: Any = importlib.import_module(module_name)
        # in the try: a module's lazy __getattr__ may import (and miss) a dependency
        path = module_name
        for attr in filter(None, (match.group("attr") or "").split(".")):
            found = getattr(obj, attr, _SKIPPED)
            if found is _SKIPPED:
                names = [a for a in dir(obj) if not a.startswith("_")]
                close = difflib.get_close_matches(attr, names, n=1)
                meant = f" (did you mean {close[0]!r}?)" if close else ""
                raise PluginError(
                    n,
                    f"cannot be loaded: {where} names {attr!r}, which {path!r} does not "
                    f"define{meant}; {_FIX_EP}",
                )
            obj, path = found, f"{path}.{attr}"
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            # the entry point's own module: a typo in the entry point, or a broken install
            raise PluginError(
                n,
                f"cannot be loaded: {where} names module {module_name!r}, which is not "
                f"installed ({exc}): a typo in the entry point or a broken install; {_FIX_EP}",
            ) from exc
        own = module_name.split(".", 1)[0]
        if missing == own or missing.startswith(own + "."):
            # The plugin's own code imports a module of its package that is not there:
            # a bug in the plugin (or a broken install), not a missing dependency.
            raise PluginError(
                n, f"cannot be loaded: {exc} (a module of the plugin's own package)"
            ) from exc
        top = missing.split(".", 1)[0]
        hint = f"its dependency {top!r} is not installed: {_what_to_install(ep, top)}"
        if explicit:
            raise PluginError(n, f"cannot be loaded: {exc}; {hint}") from exc
        log.warning("plugin %r skipped: %s; %s", n, exc, hint)
        return _SKIPPED
    except PluginError:
        raise
    except Exception as exc:
        # the plugin's code raised while being imported: say where, and how to go on without it
        dist, _ = _dist_of(ep)
        raise PluginError(
            n,
            f"cannot be loaded: {type(exc).__name__}: {exc} (raised while importing {where}: "
            f"a bug in the plugin or a broken install; reinstall or fix "
            f"{dist or 'its distribution'}, or leave it out with disabled_plugins = [{n!r}] "
            f"or TOOLWIRE_DISABLE_PLUGINS={n}; --log-level DEBUG shows the traceback)",
        ) from exc
    return obj


_REQ_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_REQ_EXTRA = re.compile(r"""\bextra\s*==\s*["']([^"']+)["']""")


def _dist_key(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _what_to_install(ep: md.EntryPoint, module: str) -> str:
    """How to install the missing ``module`` a plugin's code imports, from the requirements
    of the plugin's distribution: a module's name is not always a distribution's
    (``opentelemetry`` comes with ``opentelemetry-api``, which toolwire-profiling requires)."""
    dist = getattr(ep, "dist", None)
    if dist is None:
        return f"install the distribution that provides module {module!r}"
    name = dist.metadata["Name"]
    want = _dist_key(module)
    plain: list[str] = []
    extras: dict[str, list[str]] = {}
    for req in dist.requires or ():
        m = _REQ_NAME.match(req)
        key = _dist_key(m.group(1)) if m is not None else ""
        if m is None or (key != want and not key.startswith(want + "-")):
            continue
        extra = _REQ_EXTRA.search(req.partition(";")[2])
        if extra is None:
            plain.append(m.group(1))
        else:
            extras.setdefault(extra.group(1), []).append(m.group(1))
    if plain:
        return f"pip install {name} (it requires {', '.join(plain)})"
    if extras:
        extra_name, names = next(iter(extras.items()))
        return f"pip install '{name}[{extra_name}]' (it requires {', '.join(names)})"
    return (
        f"{name} does not declare a distribution named like it: install the one that "
        f"provides module {module!r}"
    )


def build_kernel(kernel_cls: type[Kernel], cfg: ToolwireConfig, **overrides: Any) -> Kernel:
    """A kernel configured by ``cfg``: state, guards, plugins, tool modules."""
    file = cfg.path
    available = installed_plugins()
    enabled = cfg.enabled_plugins
    explicit = enabled is not None
    names = list(enabled) if enabled is not None else sorted(available)
    for n in [*names, *cfg.disabled_plugins]:
        if n not in available:
            key = "enabled_plugins" if n in names else "disabled_plugins"
            var = cfg._env_sources.get(key if n in names else f"{key}[{n}]")
            if key == "enabled_plugins":
                key = cfg._enabled_key  # `plugins = [...]`: the key the file has
            raise ConfigError(
                f"unknown plugin {n!r}; installed plugins: {sorted(available) or 'none'} "
                f"({_meant(n, available) or f'pip install toolwire-{n}?'})"
                + (f" (the name comes from the environment variable {var})" if var else ""),
                file=None if var else file,
                key=key,
            )
    for n, table in cfg.plugins.items():
        if n not in available:
            meant = _meant(n, available)
            # a table TOOLWIRE_PLUGINS__<N>__... made: the variables are to fix, not the file
            own = {f"plugins.{n}.{k}": cfg._env_sources.get(f"plugins.{n}.{k}") for k in table}
            names = sorted({v for v in own.values() if v is not None})
            from_env = bool(names) and all(v is not None for v in own.values())
            by = (
                f" (set by the environment variable{'s' if len(names) > 1 else ''} "
                f"{', '.join(names)}: rename or unset {'them' if len(names) > 1 else 'it'})"
                if names
                else ""
            )
            raise ConfigError(
                f"configuration for unknown plugin {n!r}; installed plugins: "
                f"{sorted(available) or 'none'} ({meant or f'pip install toolwire-{n}?'}){by}",
                file=None if from_env else file,
                key=f"plugins.{n}",
            )
    names = [n for n in names if n not in set(cfg.disabled_plugins)]
    kw: dict[str, Any] = {
        "state": cfg.state or "memory://",
        "max_attempts": cfg.max_attempts,
        "default_timeout_s": cfg.default_timeout_s,
        "deadline_s": cfg.deadline_s,
        "close_grace_s": cfg.close_grace_s,
    }
    kw.update(overrides)
    kernel = kernel_cls(**kw)
    kernel.config = cfg
    for name, value in cfg._secrets.items():
        kernel.add_secret(value, name)
    for n in names:
        ep = available[n]
        factory = _load_factory(n, ep, explicit=explicit)
        if factory is _SKIPPED:
            continue
        plugin, pcfg, order = instantiate_plugin(
            n, factory, cfg.plugins.get(n, {}), file, cfg._env_sources, where=_where(ep)
        )
        if file is not None:
            warn_plain_secrets(pcfg, f"plugins.{n}", cfg)
        dist, version = _dist_of(ep)
        own_name = getattr(plugin, "name", None)
        if isinstance(own_name, str) and own_name != n:
            log.warning(
                "plugin %r (entry point of %s) calls itself %r: it is registered as %r, so "
                "lookups by its own name (kernel.get_plugin, TOOLWIRE_TRACE_PLUGINS, "
                "fallback sources) miss it; give the entry point and `name` the same value",
                n,
                dist or "an installed package",
                own_name,
                n,
            )
        kernel.plugins.register(
            plugin, name=n, order=order, version=version, dist=dist, config=pcfg
        )
    for i, ref in enumerate(cfg.tools.refs()):
        key = f"tools.modules[{i}]"
        try:
            module = _import(ref.module)
        except ImportError as exc:
            raise ConfigError(
                f"cannot import module {ref.module!r}: {exc}{_import_hint(ref.module, exc, file)}",
                file=file,
                key=key,
            ) from exc
        except Exception as exc:  # the module itself is broken: a SyntaxError, a failing import
            raise ConfigError(
                f"module {ref.module!r} failed while being imported: {type(exc).__name__}: {exc}",
                file=file,
                key=key,
            ) from exc
        try:
            kernel.add_tool(module, namespace=ref.namespace)
        except ToolCollisionError as exc:
            raise ConfigError(str(exc), file=file, key=key) from exc
        except (ValueError, TypeError) as exc:
            raise ConfigError(
                f"the tools of module {ref.module!r}: {exc}", file=file, key=key
            ) from exc
    return kernel


#: ``Field(json_schema_extra={NOT_SECRET: [...]})``: values of a secret field that
#: are settings, not credentials (the MCP plugin's ``auth = "oauth"``).
NOT_SECRET = "toolwire_not_secret"


def plain_secrets(value: Any, key: str, known: set[str]) -> list[str]:
    """The dotted keys under ``key`` whose ``SecretStr`` value is not a resolved secret."""
    out: list[str] = []
    if isinstance(value, pydantic.SecretStr):
        text = value.get_secret_value()
        if text and text not in known and _may_be_credential(text):
            out.append(key)
    elif isinstance(value, BaseModel):
        fields = type(value).model_fields
        for name, info in fields.items():
            v = getattr(value, name, None)
            extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
            ok = extra.get(NOT_SECRET) or ()
            if isinstance(v, pydantic.SecretStr) and v.get_secret_value() in ok:  # type: ignore[operator]
                continue
            out += plain_secrets(v, f"{key}.{info.alias or name}", known)
    elif isinstance(value, Mapping):
        for k, v in value.items():
            out += plain_secrets(v, f"{key}.{k}", known)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            out += plain_secrets(v, f"{key}[{i}]", known)
    return out


def _may_be_credential(text: str) -> bool:
    """False for a URL with no user:password and no query (a SearXNG address, say)."""
    if "://" not in text:
        return True
    try:
        parts = urlsplit(text)
    except ValueError:
        return True
    return bool(parts.password or parts.username or parts.query)


def warn_plain_secrets(model: Any, key: str, cfg: ToolwireConfig) -> None:
    """Warn about each ``SecretStr`` of ``model`` (the validated table at ``key``) that
    ``cfg``'s file gives in plain text: not by ``$secretRef``, not from the environment.

    The kernel does it for ``[plugins.<name>]``; a package validating another table
    with its own model (``toolwire serve``'s ``[server]``) calls it. The warning
    names the key, never the value. Nothing happens without a config file.
    """
    file = cfg.path
    if file is None:
        return
    env = cfg._env_sources
    for plain in plain_secrets(model, key, set(cfg._secrets.values())):
        if any(plain == k or plain.startswith((k + ".", k + "[")) for k in env):
            continue  # from the environment, which is where secrets belong
        log.warning(
            '%s: %s holds a credential in plain text; write {"$secretRef" = "NAME"} '
            "and set NAME in the environment or the secrets file",
            file,
            plain,
        )


def _import_hint(module: str, exc: ImportError, file: str | None) -> str:
    """What to do when a ``[tools] modules`` entry cannot be imported."""
    missing = getattr(exc, "name", None)
    if not isinstance(exc, ModuleNotFoundError) or not missing:
        return ""
    if missing != module and not module.startswith(missing + "."):
        return f" (a module it imports is missing: install the package that provides {missing!r})"
    top = module.split(".")[0]
    where = Path(file).resolve().parent if file is not None else Path.cwd()
    beside = (where / f"{top}.py").is_file() or (where / top).is_dir()
    if beside:
        return (
            f"; {top!r} is in {where}, which is not on Python's import path: modules are "
            f"imported like `import {module}`, from the installed packages and PYTHONPATH, "
            f"never from the config file's directory; set PYTHONPATH={where} (or install "
            "the module as a package) in the environment that runs toolwire"
        )
    return (
        f"; modules are imported like `import {module}`, from the installed packages and "
        "PYTHONPATH: install the package that provides it, or add the directory holding "
        "it to PYTHONPATH"
    )


def _import(module: str) -> Any:
    import importlib

    return importlib.import_module(module)
