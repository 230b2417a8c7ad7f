"""toolwire-search: ``web_search`` over Brave, Exa and SearXNG, and local knowledge bases.

The plugin (``search``, a tool source) contributes:

- ``web_search`` — walks ``chain_order`` (default brave -> exa -> searxng) over
  the backends that have keys; a failing backend falls over to the next one
  through the retry plugin;
- ``web_search_brave``, ``web_search_exa``, ``web_search_searxng`` — one
  backend only;
- ``search_<collection>`` — BM25 over the passages of a local folder.

All web tools share one input (``SearchQuery``) and one output
(``SearchOutput``: ``results``, ``served_by``, ``warnings``). API keys (and
SearXNG instance URLs) live in the ratelimit plugin's KeyPool, which rotates,
cools down, quarantines and suspends them; failures are classified by the
ratelimit plugin and decided by the retry plugin. Without any key the tools
still exist and answer ``config_error`` naming the variable to set
(``BRAVE_API_KEY``, ``EXA_API_KEY``, ``SEARXNG_URL``). See the README.
"""

from __future__ import annotations

from ._backend import (
    Backend,
    BackendPage,
    BackendRequest,
    Exhaustion,
    KeyExhausted,
    as_dict,
    as_list,
    http_error,
    relevant_headers,
)
from ._brave import BraveBackend
from ._config import BackendConfig, CollectionConfig, KeyEntry, SearchConfig, SearxngConfig
from ._exa import ExaBackend
from ._kb import Chunk, ChunkIndex, chunk_document
from ._models import SearchOutput, SearchQuery, SearchResult, make_result
from ._plugin import BUILTIN_BACKENDS, DEFAULT_CHAIN, SearchPlugin
from ._searxng import SearxngBackend
from ._text import strip_html, tokenize

__all__ = [
    "BUILTIN_BACKENDS",
    "DEFAULT_CHAIN",
    "Backend",
    "BackendConfig",
    "BackendPage",
    "BackendRequest",
    "BraveBackend",
    "Chunk",
    "ChunkIndex",
    "CollectionConfig",
    "ExaBackend",
    "Exhaustion",
    "KeyEntry",
    "KeyExhausted",
    "SearchConfig",
    "SearchOutput",
    "SearchPlugin",
    "SearchQuery",
    "SearchResult",
    "SearxngBackend",
    "SearxngConfig",
    "as_dict",
    "as_list",
    "chunk_document",
    "http_error",
    "make_result",
    "relevant_headers",
    "strip_html",
    "tokenize",
]
__version__ = "0.1.0"
