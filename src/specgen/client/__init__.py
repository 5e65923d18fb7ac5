"""The OpenAI-compatible chat client: `ChatClient` → `ChatResponse` or a classified `ApiError`.

See docs/client.md for what is parsed, the error classes and the timeouts.
"""

from .chat import ChatClient, raise_open_file_limit
from .retry import backoff_delay, parse_rate_limit_reset, parse_retry_after
from .types import FATAL_FOR_RUN, RETRYABLE, ApiError, ChatResponse, ErrorClass, RawToolCall

__all__ = [
    "FATAL_FOR_RUN",
    "RETRYABLE",
    "ApiError",
    "ChatClient",
    "ChatResponse",
    "ErrorClass",
    "RawToolCall",
    "backoff_delay",
    "parse_rate_limit_reset",
    "parse_retry_after",
    "raise_open_file_limit",
]
