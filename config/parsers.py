"""Request-body parsing limits shared by REST (DRF parser) and WebSocket client frames.

JSON nested deeper than `settings.XAGENT_JSON_MAX_DEPTH` is refused before it is parsed:
`json.loads`, and every recursive walk after it (serializers, JSONField encoding), would
otherwise hit Python's recursion limit and answer 500 (REST) or close 1011 (WebSocket).
Kept apart from `config.api`, which DRF's settings import while loading this parser.
"""

from __future__ import annotations

import codecs
import re

from django.conf import settings
from rest_framework import exceptions, parsers
from rest_framework.utils import json  # DRF's: strict_constant refuses NaN/Infinity

# Where structure can change: a bracket, or the quote that opens a string.
_JSON_STRUCTURE = re.compile(r'[\[\]{}"]')
# The rest of a string after its opening quote, escapes included (linear: no nested choices).
_JSON_STRING_REST = re.compile(r'[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)


def json_depth_exceeds(text: str, limit: int) -> bool:
    """Whether `text` nests arrays/objects deeper than `limit`, found without parsing it.

    Iterative and linear, stopping at the first level past the limit, so nesting that would
    make `json.loads` (or any recursive walk after it) hit the recursion limit never reaches it.
    """
    if text.count("[") + text.count("{") <= limit:
        return False
    depth, position = 0, 0
    while match := _JSON_STRUCTURE.search(text, position):
        token, position = match.group(), match.end()
        if token == '"':
            rest = _JSON_STRING_REST.match(text, position)
            if rest is None:
                return False  # an unterminated string: json.loads refuses it where it starts
            position = rest.end()
        elif token in "[{":
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


def json_max_depth() -> int:
    return settings.XAGENT_JSON_MAX_DEPTH


class JSONParser(parsers.JSONParser):
    """DRF's JSON parser, refusing (400 `malformed_body`) JSON nested deeper than the limit."""

    def parse(self, stream, media_type=None, parser_context=None):
        encoding = parsers.get_encoding(parser_context or {})
        try:
            text = codecs.decode(stream.read(), encoding)
        except (UnicodeDecodeError, LookupError) as exc:
            raise exceptions.ParseError(
                f"JSON parse error - the body is not valid {encoding}: {exc}"
            ) from None
        limit = json_max_depth()
        if json_depth_exceeds(text, limit):
            raise exceptions.ParseError(f"JSON parse error - nested deeper than {limit} levels.")
        try:
            parse_constant = json.strict_constant if self.strict else None
            return json.loads(text, parse_constant=parse_constant)
        except (ValueError, RecursionError) as exc:
            raise exceptions.ParseError(f"JSON parse error - {exc}") from None
