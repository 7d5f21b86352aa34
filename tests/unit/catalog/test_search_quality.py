"""Ranking quality on a fixed catalog: what a model types finds what it means.

A catalog of 30 realistic capabilities and the queries a model writes for them, each with the
capability that must rank first or within the first three. Each query is its own test, so the count
of passing cases is the quality figure: 9 of 20 passed before inflections matched (no stemming: the
plural, ``-ing`` and ``-ed`` forms found nothing), 20 of 20 after.
"""

from __future__ import annotations

import pytest

from codemode.catalog.search import SearchEntry, SearchIndex

CATALOG: list[tuple[str, str, tuple[str, ...]]] = [
    ("hass.list_entities", "List the entities of the home, with their state.", ()),
    ("hass.get_entity_state", "Get the current state of one entity.", ()),
    ("hass.call_service", "Call a Home Assistant service on an entity (turn on a light, lock a door).", ()),
    ("hass.list_areas", "List the areas (rooms) of the home.", ()),
    ("hass.get_history", "Get the state history of an entity over a time range.", ()),
    ("records.create", "Create a record with a title, body and tags.", ()),
    ("records.get", "Get one of your records by id.", ()),
    ("records.search", "List your records, optionally filtered by text and/or an exact tag.", ()),
    ("records.update", "Update the title, body or tags of a record.", ()),
    ("records.delete", "Delete one of your records.", ()),
    ("billing.create_invoice", "Create a draft invoice for a customer.", ("bill",)),
    ("billing.list_invoices", "List invoices, newest first, filtered by status.", ()),
    ("billing.send_invoice", "Send a finalized invoice to the customer by email.", ()),
    ("billing.refund_payment", "Refund a payment, fully or partly.", ("money back",)),
    ("crm.create_contact", "Create a contact person for a company.", ()),
    ("crm.find_contacts", "Find contacts by name, email or company.", ()),
    ("crm.merge_companies", "Merge two duplicate companies into one.", ()),
    ("calendar.schedule_meeting", "Schedule a meeting with attendees at a given time.", ()),
    ("calendar.cancel_meeting", "Cancel a scheduled meeting and notify its attendees.", ()),
    ("calendar.list_events", "List calendar events between two dates.", ()),
    ("weather.forecast", "Daily weather forecast for a city, up to 7 days ahead.", ()),
    ("weather.current", "Current weather conditions for a city.", ()),
    ("github.create_issue", "Open a new issue in a repository.", ()),
    ("github.list_pull_requests", "List pull requests of a repository by state.", ()),
    ("github.merge_pull_request", "Merge a pull request.", ()),
    ("files.upload", "Upload a file to a folder.", ()),
    ("files.list_folder", "List the files and subfolders of a folder.", ()),
    ("users.deactivate", "Deactivate a user account so it can no longer sign in.", ()),
    ("users.list_deleted", "List user accounts that were deleted in the last 30 days.", ()),
    ("notify.send_message", "Send a chat message to a channel.", ()),
]

# (query, expected capability, within the first n results)
CASES: list[tuple[str, str, int]] = [
    ("entity", "hass.list_entities", 3),
    ("entities", "hass.list_entities", 1),
    ("creating invoices", "billing.create_invoice", 1),
    ("created records", "records.create", 1),
    ("deleted users", "users.list_deleted", 1),
    ("delete record", "records.delete", 1),
    ("merge pull requests", "github.merge_pull_request", 1),
    ("forecasts", "weather.forecast", 1),
    ("scheduling a meeting", "calendar.schedule_meeting", 1),
    ("cancelled meetings", "calendar.cancel_meeting", 1),
    ("weather", "weather.forecast", 3),
    ("refund", "billing.refund_payment", 1),
    ("contacts", "crm.find_contacts", 1),
    ("contact", "crm.create_contact", 3),
    ("uploading files", "files.upload", 1),
    ("area", "hass.list_areas", 1),
    ("sending messages", "notify.send_message", 1),
    ("invoice status", "billing.list_invoices", 1),
    ("deactivated accounts", "users.deactivate", 1),
    ("updating tags", "records.update", 1),
]


@pytest.fixture(scope="module")
def index() -> SearchIndex:
    return SearchIndex(SearchEntry(n, f"{n}()", s, "", list(t)) for n, s, t in CATALOG)


@pytest.mark.parametrize(("query", "expected", "within"), CASES, ids=[c[0] for c in CASES])
def test_the_expected_capability_ranks_high_enough(
    index: SearchIndex, query: str, expected: str, within: int
) -> None:
    names = [r.name for r in index.search(query).results]
    assert expected in names[:within], f"{query!r}: {names[:5]}"


def test_the_ranking_is_the_same_every_time() -> None:
    first = SearchIndex(SearchEntry(n, f"{n}()", s, "", list(t)) for n, s, t in CATALOG)
    again = SearchIndex(SearchEntry(n, f"{n}()", s, "", list(t)) for n, s, t in reversed(CATALOG))
    for query, _, _ in CASES:
        assert first.search(query).to_dict() == again.search(query).to_dict()
