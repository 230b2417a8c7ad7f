"""toolwire-a2a: other agents as tools, over the Agent2Agent (A2A) protocol 1.0.

``A2APlugin`` (entry point ``a2a``) is a tool source: every agent configured in
``[plugins.a2a]`` (by card URL, or from a registry listing filtered by a
selector) becomes two tools:

- ``agent_<nickname>`` — ``{query, hands_off=false, context_id?, task_id?}``:
  a blocking ``SendMessage`` (streamed, with progress, when the card allows it)
  returning the agent's answer; with ``hands_off=true`` the task is handed over
  (``returnImmediately``) and the result carries its ``task_id``,
  ``context_id`` and ``state``. Interrupted tasks (``input-required``,
  ``auth-required``) come back with ``interrupted: true``; calling again with
  the ``context_id`` continues the conversation.
- ``agent_<nickname>_task`` — ``{task_id, wait_s=0, cancel=false}``: the
  task's state and outcome later (``GetTask``), optionally waiting, or
  ``CancelTask``.

Failures raise ``toolwire.ToolError`` with a kind: unreachable ->
``unavailable``, JSON-RPC -32001 -> ``not_found``, HTTP 401/403 -> ``auth``,
-32603 -> ``tool_error`` with the agent's text. See the README and docs/a2a.md.
"""

from __future__ import annotations

from ._config import A2AConfig, AgentConfig, RegistryConfig, Selector, card_url_for
from ._plugin import A2APlugin

__all__ = [
    "A2AConfig",
    "A2APlugin",
    "AgentConfig",
    "RegistryConfig",
    "Selector",
    "__version__",
    "card_url_for",
]
__version__ = "0.1.0"
