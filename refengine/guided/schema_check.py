"""JSON-schema checks before xgrammar compiles a schema.

xgrammar compiles some keywords without enforcing them (measured with xgrammar 0.2.9: a schema
`{"not": {"type": "string"}}` still lets a string through, `allOf`'s second branch's `required` is
dropped); a guide with one of them would produce output that does not validate, so it is refused
by name instead. A schema that is not a valid JSON Schema (draft 2020-12 meta-schema) is refused
with jsonschema's reason.
"""

from __future__ import annotations

from typing import Any

from refengine.errors import InvalidRequestError
from refengine.guided.params import GUIDE_FIELD

UNENFORCED_KEYWORDS = frozenset({"not", "if", "then", "else", "allOf", "dependentSchemas", "unevaluatedProperties", "unevaluatedItems", "$dynamicRef"})


def check_json_schema(schema: Any) -> None:
    import jsonschema

    if not isinstance(schema, (dict, bool)):
        raise InvalidRequestError(GUIDE_FIELD, f"a JSON schema is an object or a boolean, got {type(schema).__name__}")
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as error:
        where = "/".join(str(part) for part in error.absolute_path) or "(root)"
        raise InvalidRequestError(GUIDE_FIELD, f"not a valid JSON schema at {where}: {error.message}") from None
    _refuse_unenforced(schema, "#")


def _refuse_unenforced(node: Any, where: str) -> None:
    if isinstance(node, list):
        for index, item in enumerate(node):
            _refuse_unenforced(item, f"{where}/{index}")
        return
    if not isinstance(node, dict):
        return
    for key, value in node.items():
        if key in UNENFORCED_KEYWORDS:
            raise InvalidRequestError(GUIDE_FIELD, f"the schema keyword {key!r} (at {where}) is not supported: xgrammar does not enforce it")
        if key == "$ref" and isinstance(value, str) and not value.startswith("#"):
            raise InvalidRequestError(GUIDE_FIELD, f"$ref {value!r} (at {where}) is not supported: only references inside the schema ('#/...')")
        if key not in ("enum", "const", "default", "examples"):  # their values are data, not schemas
            _refuse_unenforced(value, f"{where}/{key}")
