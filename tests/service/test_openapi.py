"""The OpenAPI document: the checked-in copy is what the app serves, and the API keeps to it
under fuzzing (schemathesis, derandomized, capped) by every stateless check schemathesis has:
no 500, no response outside the schema, data the document calls valid accepted and data it calls
invalid refused, and nothing written by a request the API rejected."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import schemathesis
import sqlalchemy as sa
from conftest import LiveApi
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import CheckContext, not_a_server_error
from schemathesis.generation.modes import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    positive_data_acceptance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from sessionfold.core.policy import FoldPolicy
from sessionfold.service.openapi import openapi_document, render
from sessionfold.store.schema import metadata

CHECKED_IN = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"
#: Examples per operation and mode (positive, negative): 15 operations stay inside a minute.
MAX_EXAMPLES = 12
EXISTING = "fuzzed-1"
#: The refusals of data the document calls valid that no JSON Schema can state, and only
#: these, as (reason, words of the message): whether a tool_result answers the message before it
#: (which may be the ledger's last), a relation between two values (target_ratio below
#: trigger_ratio, a range that ends before it starts, cached tokens within the prompt, a
#: prompt's counts together), a leading system message that must be the session's own prompt,
#: an Idempotency-Key the session saw with other messages, two query parameters that
#: exclude each other, a guarded request the session's window cannot fit under its budget
#: (budget-exceeded), and a model call's error that says "too long" a second time
#: (context-overflow). Any other refusal of valid data fails.
BEYOND_SCHEMA = (
    ("tool-pairing", ""),
    ("invalid-input", "was used before for other messages"),
    ("invalid-policy", "target_ratio < trigger_ratio"),
    ("invalid-input", "ends before it starts"),
    ("invalid-usage", "which include them"),
    ("invalid-usage", "written tokens by lifetime, more than"),
    ("usage-unmeasurable", "more than any context window holds"),
    ("invalid-input", "fixed at creation"),
    ("invalid-input", "cache_breakpoints mark cache_control"),
    ("budget-exceeded", ""),
    ("context-overflow", ""),
)
#: Refusals that may leave writes behind: the hard cap folds the session inline before it
#: finds that one message cannot fit, and that fold stands (it is the session's own fold).
WRITES_BEFORE_REFUSING = ("budget-exceeded",)


def _reason(response: Any) -> str | None:
    try:
        reason = response.json()["error"]["reason"]
    except (ValueError, KeyError, TypeError):
        return None
    return reason if isinstance(reason, str) else None


def _beyond_schema(response: Any) -> bool:
    if response.status_code not in (400, 422):
        return False
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return any(error.get("reason") == reason and words in error.get("message", "")
               for reason, words in BEYOND_SCHEMA)


@schemathesis.check
def valid_data_accepted(ctx: CheckContext, response: Any, case: Any) -> bool | None:
    """``positive_data_acceptance``, but for the refusals of :data:`BEYOND_SCHEMA`."""
    if _beyond_schema(response):
        return None
    return positive_data_acceptance(ctx, response, case)


#: Every stateless check schemathesis has for a response: the document says what the server
#: enforces (valid data is accepted, invalid data refused), not only that nothing fails.
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_headers_conformance, response_schema_conformance, negative_data_rejection,
          valid_data_accepted]


def test_the_checked_in_openapi_document_is_what_the_app_serves(api: LiveApi) -> None:
    served = api.http().get("/openapi.json").json()
    assert served == openapi_document()
    assert CHECKED_IN.read_text(encoding="utf-8") == render(served), (
        "docs/openapi.json is stale: run `python -m sessionfold.service.openapi "
        "docs/openapi.json`")


def row_counts(api: LiveApi) -> dict[str, int]:
    with api.store.engine.connect() as conn:
        return {t.name: conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one()
                for t in metadata.sorted_tables}


def ensure_existing(api: LiveApi) -> None:
    sid = "tenant:fuzz/" + EXISTING
    if sid not in api.store.window_states([sid]):  # a fuzzed DELETE may have removed it
        api.store.create_session(sid, FoldPolicy(budget_tokens=4000), "fuzzing")
        api.store.append(sid, [{"role": "user", "content": "hello"}])


def check_case(api: LiveApi, key: str, case: Any) -> None:
    ensure_existing(api)
    params = case.path_parameters or {}
    if "session_id" in params and str(params["session_id"])[:1] in "abcdefghijklm":
        params["session_id"] = EXISTING  # half the cases reach a session that exists
    before = row_counts(api)
    # The key goes on the case itself: a case that left the header out is then judged as the
    # request it became (with it), not as one missing a required header.
    case.headers = {**(case.headers or {}), "Authorization": f"Bearer {key}"}
    response = case.call(base_url=api.url, timeout=30)
    case.validate_response(response, checks=CHECKS)
    if response.status_code >= 400 and _reason(response) not in WRITES_BEFORE_REFUSING:
        assert row_counts(api) == before, (
            f"{case.method} {case.formatted_path} answered {response.status_code} and wrote: "
            f"{response.text[:300]}")


def test_the_api_keeps_to_its_openapi_document_under_fuzzing(api: LiveApi) -> None:
    schema = schemathesis.openapi.from_url(f"{api.url}/openapi.json")
    key = api.key("fuzz")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 14
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            strategy = operation.as_strategy(generation_mode=mode)

            @given(strategy)
            @settings(max_examples=MAX_EXAMPLES, derandomize=True, deadline=None,
                      database=None, suppress_health_check=list(HealthCheck))
            def run(case: Any) -> None:
                check_case(api, key, case)

            try:
                run()
            except Unsatisfiable:
                # Nothing of this operation can be made invalid (no parameter, no body).
                assert mode is GenerationMode.NEGATIVE, operation.label
