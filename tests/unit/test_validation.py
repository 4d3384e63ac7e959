"""Validation messages name the field, what was given and what was expected.

The worker (pydantic) and the client (JSON Schema from the catalog) must
both tell a model enough to correct its call in one go.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import pydantic
import pytest
from pydantic import Field

from toolexec.redaction import Secret, secret_names
from toolexec.registry import Registry, ToolSpec, tool
from toolexec.validation import describe_validation_error, validate_against_schema


@pytest.fixture
def weather(registry: Registry) -> ToolSpec:
    @tool(registry=registry)
    def get_weather(
        city: Annotated[str, Field(min_length=1)],
        days: Annotated[int, Field(ge=1, le=14)] = 3,
        units: Literal["metric", "imperial"] = "metric",
    ) -> dict[str, Any]:
        """Forecast for a city."""
        return {"city": city, "days": days, "units": units}

    spec = registry.get("get_weather")
    assert spec is not None
    return spec


def _pydantic_message(spec: ToolSpec, arguments: dict[str, Any]) -> str:
    with pytest.raises(pydantic.ValidationError) as caught:
        spec.arguments.model_validate(arguments)
    return describe_validation_error(caught.value)


def _schema_message(spec: ToolSpec, arguments: dict[str, Any]) -> str:
    message = validate_against_schema(arguments, spec.json_schema())
    assert message is not None, f"{arguments} passed the schema"
    return message


def test_valid_arguments_pass_the_schema(weather: ToolSpec) -> None:
    assert validate_against_schema({"city": "Oslo", "days": 2}, weather.json_schema()) is None
    assert validate_against_schema({"city": "Oslo"}, weather.json_schema()) is None


def test_pydantic_message_names_each_bad_field_with_what_was_given_and_expected(
    weather: ToolSpec,
) -> None:
    message = _pydantic_message(weather, {"city": "Oslo", "days": 30, "units": "kelvin"})
    assert message.startswith("invalid arguments: ")
    days, units = message.removeprefix("invalid arguments: ").split("; ")
    assert days.startswith("days: ") and "less than or equal to 14" in days
    assert days.endswith("(given 30)")
    assert units.startswith("units: ") and "'metric' or 'imperial'" in units
    assert units.endswith('(given "kelvin")')


def test_pydantic_message_for_a_wrong_type(weather: ToolSpec) -> None:
    message = _pydantic_message(weather, {"city": "Oslo", "days": "a week"})
    assert "days: " in message and "valid integer" in message
    assert '(given "a week")' in message


def test_pydantic_message_for_a_missing_field(weather: ToolSpec) -> None:
    assert _pydantic_message(weather, {"days": 2}) == (
        "invalid arguments: city: required but missing"
    )


def test_pydantic_refuses_an_unknown_field_by_name(weather: ToolSpec) -> None:
    message = _pydantic_message(weather, {"city": "Oslo", "country": "NO"})
    assert message == "invalid arguments: country: not an argument of this tool"


def test_pydantic_message_shortens_a_huge_given_value(weather: ToolSpec) -> None:
    message = _pydantic_message(weather, {"city": "Oslo", "days": "9" * 1000 + "x"})
    assert len(message) < 300 and "…" in message


def test_schema_message_names_each_bad_field_with_what_was_given_and_expected(
    weather: ToolSpec,
) -> None:
    message = _schema_message(weather, {"city": "Oslo", "days": 30, "units": "kelvin"})
    days, units = message.removeprefix("invalid arguments: ").split("; ")
    assert days == "days: 30 is greater than the maximum of 14 (given 30)"
    assert units.startswith("units: ") and "['metric', 'imperial']" in units
    assert units.endswith('(given "kelvin")')


def test_schema_message_for_a_wrong_type(weather: ToolSpec) -> None:
    message = _schema_message(weather, {"city": 12})
    assert message == "invalid arguments: city: 12 is not of type 'string' (given 12)"


def test_schema_message_for_a_missing_field(weather: ToolSpec) -> None:
    message = _schema_message(weather, {"days": 2})
    assert "'city' is a required property" in message


def test_schema_refuses_an_unknown_field_by_name(weather: ToolSpec) -> None:
    message = _schema_message(weather, {"city": "Oslo", "country": "NO"})
    assert "'country' was unexpected" in message


def test_schema_and_pydantic_agree_on_what_is_invalid(weather: ToolSpec) -> None:
    """The client's early check must not refuse what the worker would accept, or let through
    what it would refuse."""
    cases: list[dict[str, Any]] = [
        {"city": "Oslo"},
        {"city": ""},
        {"city": "Oslo", "days": 0},
        {"city": "Oslo", "days": 14, "units": "imperial"},
        {"city": "Oslo", "extra": 1},
        {},
    ]
    for arguments in cases:
        by_schema = validate_against_schema(arguments, weather.json_schema()) is None
        try:
            weather.arguments.model_validate(arguments)
            by_pydantic = True
        except pydantic.ValidationError:
            by_pydantic = False
        assert by_schema == by_pydantic, arguments


@pytest.fixture
def login(registry: Registry) -> ToolSpec:
    @tool(registry=registry)
    def sign_in(user: str, token: Annotated[str, Secret], headers: dict[str, str]) -> None:
        """Sign in."""

    spec = registry.get("sign_in")
    assert spec is not None
    return spec


SECRET = "tok-7f3a9c-very-secret"


def test_a_secret_argument_that_fails_validation_is_not_quoted_by_the_worker(
    login: ToolSpec,
) -> None:
    """Validation messages reach logs and Flower; a secret's value must not."""
    bad = {"user": "ann", "token": [SECRET], "headers": {"Authorization": [SECRET]}}
    with pytest.raises(pydantic.ValidationError) as caught:
        login.arguments.model_validate(bad)
    message = describe_validation_error(caught.value, secret_names(login.json_schema()))
    assert SECRET not in message
    assert "token:" in message and "a hidden value" in message
    assert "headers.Authorization" in message


def test_a_secret_argument_that_fails_validation_is_not_quoted_by_the_client(
    login: ToolSpec,
) -> None:
    """The client validates against the catalog's schema, which marks the secret."""
    bad = {"user": "ann", "token": 12345678, "headers": {"Authorization": 987654321}}
    message = validate_against_schema(bad, login.json_schema())
    assert message is not None
    assert "12345678" not in message and "987654321" not in message
    assert "token: does not satisfy type" in message
    assert "a hidden value" in message
