"""Check response bodies against OpenAI's official OpenAPI component schemas.

`tests/openai_spec/` holds a verbatim subset of openai/openai-openapi (MIT, © OpenAI);
OpenAPI 3.1 schemas are JSON Schema 2020-12, so jsonschema validates them directly,
resolving `$ref`s within the document.

One relaxation: the spec leaves optional properties non-nullable, yet the live API
sends `null` for them (`"status_details": null`, the `expires_at` of a file that never
expires) and the SDK types them `Optional`. So a property that is not `required` also
accepts `null`; required properties, types and enums stay strict.
"""

from functools import cache
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator

SPEC_PATH = Path(__file__).parent / "openai_spec" / "openai-openapi-subset.yaml"


def _optional_nullable(node: Any) -> Any:
    if isinstance(node, list):
        return [_optional_nullable(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _optional_nullable(value) for key, value in node.items()}
    properties = out.get("properties")
    if isinstance(properties, dict):
        required = set(out.get("required", []))
        out["properties"] = {
            name: schema if name in required else {"anyOf": [schema, {"type": "null"}]}
            for name, schema in properties.items()
        }
    return out


@cache
def _spec() -> dict[str, Any]:
    with SPEC_PATH.open() as f:
        spec: dict[str, Any] = _optional_nullable(yaml.safe_load(f))
    return spec


@cache
def schema_validator(name: str) -> Draft202012Validator:
    """A validator for `#/components/schemas/{name}` of the official spec."""
    spec = _spec()
    if name not in spec["components"]["schemas"]:
        raise KeyError(f"no component schema named {name!r} in {SPEC_PATH.name}")
    return Draft202012Validator({**spec, "$ref": f"#/components/schemas/{name}"})


def schema_errors(body: Any, name: str) -> list[str]:
    errors = schema_validator(name).iter_errors(body)
    return sorted(f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in errors)


def assert_matches_schema(body: Any, name: str) -> None:
    """Fail unless `body` (parsed JSON) is valid against the official schema `name`."""
    errors = schema_errors(body, name)
    assert not errors, f"response does not match {name}:\n" + "\n".join(errors)


def assert_error(
    response: Any, status: int, *, param: Any = ..., message: str = ""
) -> dict[str, Any]:
    """An OpenAI error envelope: the status, all four keys, a request id, no retry hint for 4xx.

    `response` is an httpx response; returns the inner `error` object.
    """
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers.get("x-request-id", "").startswith("req_")
    body = response.json()
    assert_matches_schema(body, "ErrorResponse")
    error: dict[str, Any] = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert message in error["message"], error
    if param is not ...:
        assert error["param"] == param, error
    if status < 500 and status not in (408, 409, 429):
        assert response.headers.get("x-should-retry") == "false"
    return error
