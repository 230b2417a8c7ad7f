"""Which policy applies to a tool, and which rule decided it."""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import Mapping
from dataclasses import dataclass

from toolwire import Tool

from ._config import ANNOTATION_HINTS, ApprovalConfig, Policy, parse_policy

__all__ = ["Resolution", "RuleSet"]

log = logging.getLogger("toolwire.approval")

_GLOB_CHARS = frozenset("*?[")


@dataclass(frozen=True, slots=True)
class Resolution:
    """The policy for one tool and the rule that decided it.

    ``rule`` is the config key path (``tools.send_email``, ``tools."send_*"``,
    ``tool settings``, ``tags.payments``, ``sources."mcp:*"``,
    ``annotations.destructiveHint``, ``default``).
    """

    policy: Policy
    rule: str

    def describe(self) -> str:
        """The rule as a config line, e.g. ``plugins.approval.tools.send_email = "REQUIRED"``."""
        if self.rule == "tool settings":
            return f'the tool\'s own setting approval = "{self.policy}"'
        return f'plugins.approval.{self.rule} = "{self.policy}"'


def _quoted(key: str) -> str:
    if key.replace("_", "").replace("-", "").isalnum():
        return key
    return '"' + key.replace('"', '\\"') + '"'


def _is_glob(pattern: str) -> bool:
    return any(c in _GLOB_CHARS for c in pattern)


def _specificity(pattern: str) -> int:
    """Literal characters of a glob: the more, the more specific."""
    return sum(1 for c in pattern if c not in _GLOB_CHARS)


def _glob_table(table: Mapping[str, Policy]) -> list[tuple[str, Policy]]:
    """The glob entries, most specific first (ties: file order)."""
    globs = [(k, v) for k, v in table.items() if _is_glob(k)]
    order = {k: i for i, (k, _) in enumerate(globs)}
    return sorted(globs, key=lambda kv: (-_specificity(kv[0]), order[kv[0]]))


class RuleSet:
    """The configured rules, compiled once; ``resolve(tool)`` is cached per tool object.

    Precedence, first match wins:

    1. ``tools`` exact name;
    2. ``tools`` globs, most literal characters first (ties: file order);
    3. the tool's own ``approval`` setting (``use_tool_settings``);
    4. ``tags``: the strictest policy among the tool's matching tags;
    5. ``sources``: exact source, then globs like ``tools``;
    6. ``annotations``: the strictest policy among the hints the tool sets to true;
    7. ``default``.
    """

    def __init__(self, config: ApprovalConfig) -> None:
        self.config = config
        self._exact_tools = {k: v for k, v in config.tools.items() if not _is_glob(k)}
        self._glob_tools = _glob_table(config.tools)
        # Rules written in lower case also match a tool whose name differs only in case:
        # environment variables give lower-case keys, and a rule set that way for
        # `sendEmail` (TOOLWIRE_PLUGINS__APPROVAL__TOOLS__SENDEMAIL) otherwise matched nothing,
        # leaving the tool without the approval it was meant to need.
        self._folded_tools = [
            (k, v) for k, v in config.tools.items() if k == k.lower() and k != k.upper()
        ]
        self._exact_sources = {k: v for k, v in config.sources.items() if not _is_glob(k)}
        self._glob_sources = _glob_table(config.sources)
        self._cache: dict[str, tuple[Tool, Resolution]] = {}

    def resolve(self, tool: Tool) -> Resolution:
        """The policy of ``tool`` and the rule that decided it."""
        hit = self._cache.get(tool.name)
        if hit is not None and hit[0] is tool:
            return hit[1]
        res = self._resolve(tool)
        self._cache[tool.name] = (tool, res)
        return res

    @staticmethod
    def _folded(key: str, name: str, policy: Policy) -> Resolution:
        log.warning(
            "approval: rule tools.%s applies to tool %r, whose name differs in case (keys "
            "from environment variables are lower-case); write the tool's exact name in the "
            "config file",
            _quoted(key),
            name,
        )
        return Resolution(policy, f"tools.{_quoted(key)}")

    def _resolve(self, tool: Tool) -> Resolution:
        cfg = self.config
        name = tool.name
        if name in self._exact_tools:
            return Resolution(self._exact_tools[name], f"tools.{_quoted(name)}")
        folded = name.lower() if name != name.lower() else None
        if folded is not None:  # an exact rule in lower case: still an exact rule
            for key, policy in self._folded_tools:
                if key == folded:
                    return self._folded(key, name, policy)
        for pattern, policy in self._glob_tools:
            if fnmatch.fnmatchcase(name, pattern):
                return Resolution(policy, f"tools.{_quoted(pattern)}")
        if folded is not None:
            for key, policy in self._folded_tools:
                if _is_glob(key) and fnmatch.fnmatchcase(folded, key):
                    return self._folded(key, name, policy)
        if cfg.use_tool_settings and "approval" in tool.settings:
            raw = tool.settings["approval"]
            try:
                return Resolution(parse_policy(raw), "tool settings")
            except ValueError:
                log.warning(
                    "approval: tool %r has an invalid approval setting %r (expected NONE, LAZY "
                    "or REQUIRED); treating it as REQUIRED",
                    name,
                    raw,
                )
                return Resolution(Policy.REQUIRED, "tool settings")
        best: Resolution | None = None
        for tag, policy in cfg.tags.items():
            if tag in tool.tags and (best is None or policy.strictness > best.policy.strictness):
                best = Resolution(policy, f"tags.{_quoted(tag)}")
        if best is not None:
            return best
        source = tool.source
        if source in self._exact_sources:
            return Resolution(self._exact_sources[source], f"sources.{_quoted(source)}")
        for pattern, policy in self._glob_sources:
            if fnmatch.fnmatchcase(source, pattern):
                return Resolution(policy, f"sources.{_quoted(pattern)}")
        hints = tool.annotations
        for hint in ANNOTATION_HINTS:
            policy_for_hint = cfg.annotations.get(hint)
            if policy_for_hint is None or getattr(hints, hint) is not True:
                continue
            if best is None or policy_for_hint.strictness > best.policy.strictness:
                best = Resolution(policy_for_hint, f"annotations.{hint}")
        if best is not None:
            return best
        return Resolution(cfg.default, "default")
