"""toolwire: an embeddable, plugin-based middleware kernel for AI-agent tool calls.

The public API is what ``__all__`` lists; modules starting with ``_`` are private.
"""

from __future__ import annotations

from ._background import BackgroundTask
from ._clock import Clock, SystemClock
from ._config import (
    ToolwireConfig,
    installed_plugins,
    load_config,
    looked_for,
    plugin_not_loaded,
    read_secrets_file,
    warn_plain_secrets,
)
from ._discovery import export_tool
from ._errors import ConfigError, KernelError, PluginError, ToolCallError, ToolCollisionError
from ._events import CallEvent, EventBus
from ._image import IMAGE_FILE_EXTRA, IMG_PATH_KEY, Image, sniff_image_type
from ._kernel import Kernel
from ._retry_after import parse_retry_after
from ._terminal import TERMINAL_EXTENSION, Terminal
from ._tool import ToolSet, build_tool, tool, tools_from_module
from ._types import (
    Attempt,
    CallContext,
    CallRejected,
    Decision,
    ErrorInfo,
    ErrorKind,
    Fallback,
    Recover,
    ResultMeta,
    Retry,
    Tool,
    ToolAnnotations,
    ToolCall,
    ToolError,
    ToolResult,
    normalize_content,
)
from ._validate import ArgsError, describe_validation_error, validate_json_schema
from .hookspecs import hookimpl
from .state import StateStore, open_store

__version__ = "0.1.0"

__all__ = [
    "IMAGE_FILE_EXTRA",
    "IMG_PATH_KEY",
    "ArgsError",
    "Attempt",
    "BackgroundTask",
    "CallContext",
    "CallEvent",
    "CallRejected",
    "Clock",
    "ConfigError",
    "Decision",
    "ErrorInfo",
    "ErrorKind",
    "EventBus",
    "Image",
    "Fallback",
    "Kernel",
    "KernelError",
    "PluginError",
    "Recover",
    "ResultMeta",
    "Retry",
    "StateStore",
    "SystemClock",
    "TERMINAL_EXTENSION",
    "Terminal",
    "Tool",
    "ToolAnnotations",
    "ToolCall",
    "ToolCallError",
    "ToolCollisionError",
    "ToolError",
    "ToolResult",
    "ToolSet",
    "ToolwireConfig",
    "__version__",
    "build_tool",
    "describe_validation_error",
    "export_tool",
    "hookimpl",
    "installed_plugins",
    "load_config",
    "parse_retry_after",
    "plugin_not_loaded",
    "normalize_content",
    "open_store",
    "looked_for",
    "read_secrets_file",
    "sniff_image_type",
    "tool",
    "tools_from_module",
    "validate_json_schema",
    "warn_plain_secrets",
]
