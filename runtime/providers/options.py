"""What every provider's constructor checks of its options, in one place."""

from __future__ import annotations

from sessionfold.core.errors import InvalidInputError

__all__ = ["check_options"]


def check_options(*, client_and_pieces: bool, model: str, max_tokens: int, context_tokens: int,
                  timeout: float) -> None:
    """InvalidInputError naming the first option a provider cannot work with.

    ``client_and_pieces``: both a ready client and pieces to build one (key, URL, HTTP client)
    were given, and one of them would be silently ignored.
    """
    if client_and_pieces:
        raise InvalidInputError("pass either client or api_key/base_url/http_client, not both")
    if not model.strip():
        raise InvalidInputError("model must name a model")
    if max_tokens < 1:
        raise InvalidInputError(f"max_tokens must be at least 1, got {max_tokens}")
    if context_tokens < 1000:
        raise InvalidInputError(f"context_tokens must be at least 1000, got {context_tokens}")
    if not timeout > 0:
        raise InvalidInputError(f"timeout must be positive seconds, got {timeout}")
