"""An accepted answer must fit the server's requested schema (MCP: flat objects of primitives)."""

import pytest

from sessions_app.runtime.engine import InvalidAnswer, validate_answer

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 5},
        "email": {"type": "string", "format": "email"},
        "day": {"type": "string", "format": "date"},
        "drink": {"type": "string", "enum": ["coffee", "tea"]},
        "size": {
            "type": "string",
            "oneOf": [{"const": "s", "title": "Small"}, {"const": "l", "title": "Large"}],
        },
        "cups": {"type": "integer", "minimum": 1, "maximum": 3},
        "ratio": {"type": "number", "maximum": 1.5},
        "sugar": {"type": "boolean"},
        "extras": {"type": "array", "items": {"type": "string", "enum": ["milk", "lemon"]}, "maxItems": 1},
    },
    "required": ["name", "drink"],
}


def problems(content):
    with pytest.raises(InvalidAnswer) as raised:
        validate_answer(SCHEMA, content)
    return raised.value.errors


def test_a_fitting_answer_passes_unchanged():
    answer = {
        "name": "Ann",
        "email": "ann@example.org",
        "day": "2026-12-01",
        "drink": "tea",
        "size": "l",
        "cups": 2,
        "ratio": 0.5,
        "sugar": False,
        "extras": ["milk"],
    }
    assert validate_answer(SCHEMA, answer) == answer


def test_missing_required_fields_are_named():
    assert problems({"cups": 1}) == {
        "name": ["This field is required."],
        "drink": ["This field is required."],
    }


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("name", 7, "Must be a string."),
        ("name", "", "at least 1"),
        ("name", "toolong", "at most 5"),
        ("email", "not-an-address", "email"),
        ("day", "yesterday", "date"),
        ("drink", "beer", "one of: coffee, tea"),
        ("size", "m", "one of: s, l"),
        ("cups", "2", "Must be a number."),
        ("cups", True, "Must be a number."),
        ("cups", 1.5, "whole number"),
        ("cups", 9, "at most 3"),
        ("ratio", 2.0, "at most 1.5"),
        ("sugar", "yes", "true or false"),
        ("extras", ["milk", "lemon"], "at most 1"),
        ("extras", ["sugar"], "one of: milk, lemon"),
        ("extras", "milk", "list of strings"),
    ],
)
def test_each_kind_of_field_is_checked(field, value, message):
    errors = problems({"name": "Ann", "drink": "tea", field: value})
    assert list(errors) == [field]
    assert message in " ".join(errors[field])


def test_unknown_fields_and_non_objects_are_refused():
    assert problems({"name": "Ann", "drink": "tea", "admin": True}) == {
        "admin": ["The request did not ask for this field."]
    }
    assert list(problems(["Ann"])) == ["content"]
