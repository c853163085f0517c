"""Schemathesis against the Worker's own OpenAPI document (as it serves it)
and the running Worker: generated requests, valid and invalid, over real HTTP
must never get a 5xx or a response that breaks the document."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import positive_data_acceptance

from .conftest import TOKEN, Host

AUTH = {"Authorization": f"Bearer {TOKEN}"}
UNSAYABLE = {
    "invalid_cron",
    "unknown_timezone",
    "unknown_dependency",
    "too_many_dependents",
    "too_many_edges",
}
"""422s no JSON Schema can rule out beforehand: a cron expression's grammar
(numbers in range per field, ranges in order, days a month has), the zone
database, whether the ids a push's `after` names are jobs there and how
many jobs wait for each already, and the ids named by all of a request's
jobs together. The Worker checks them and says which; every other check
holds for these answers too (documented status and shape, no 5xx)."""
EXAMPLES = 40  # per operation and mode: 17 operations x 2 modes x 40 > 1,000


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_the_api_keeps_its_document(host: Host, mode: GenerationMode) -> None:
    schema = schemathesis.openapi.from_dict(host.api("GET", "/v1/openapi.json").json())
    sent: Counter[str] = Counter()
    statuses: Counter[int] = Counter()
    for result in schema.get_all_operations():
        operation = result.ok()

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def check(case: Any) -> None:
            sent[case.operation.label] += 1
            # Schemathesis fills the bearer token's place from the security
            # scheme; a negative case may have left it out on purpose, and
            # then the request must go without one (and be refused).
            has_auth = "Authorization" in (case.headers or {})
            response = case.call(base_url=host.url, headers=AUTH if has_auth else {})
            excluded = []
            if (
                mode is GenerationMode.POSITIVE
                and response.status_code == 422
                and _error_code(response) in UNSAYABLE
            ):
                excluded = [positive_data_acceptance]
            case.validate_response(response, excluded_checks=excluded)
            statuses[response.status_code] += 1

        try:
            check()
        except Unsatisfiable:
            # Negative mode: an operation with nothing to get wrong
            # (GET /v1/queues has no parameters and no body).
            assert mode is GenerationMode.NEGATIVE and sent[operation.label] == 0, operation.label
    host.reset()
    # Operations without parameters have few distinct requests; the rest
    # make up the count.
    assert sum(sent.values()) >= 500, sent
    print(f"schemathesis {mode.value}: {sum(sent.values())} requests, statuses {dict(statuses)}")
    if mode is GenerationMode.POSITIVE:
        assert statuses[401] == 0, "valid requests carry the token"
        assert sum(n for s, n in statuses.items() if s < 300) > sum(sent.values()) / 2


def _error_code(response: Any) -> str:
    try:
        return str(response.json()["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return ""
