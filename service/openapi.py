"""The API's OpenAPI document, as checked in at ``docs/openapi.json``.

Regenerate it after changing a route or a model (a test fails until the checked-in copy equals
what the app generates)::

    python -m sessionfold.service.openapi docs/openapi.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from sessionfold.runtime.settings import Settings

from .app import create_app

__all__ = ["openapi_document", "render"]


def openapi_document() -> dict[str, Any]:
    """The document the app serves at ``/openapi.json`` (no connection is made: the settings
    are only read when the app starts)."""
    document: dict[str, Any] = create_app(Settings.model_construct()).openapi()
    return document


def render(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    text = render(openapi_document())
    if not argv:
        sys.stdout.write(text)
        return 0
    Path(argv[0]).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
