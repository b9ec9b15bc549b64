"""The published OpenAPI document, shaped like OpenAI's so generated clients look alike.

Operation ids come from OpenAI's spec (`createFile`, `retrieveBatch`, …). Component
names follow the operations that use them (`OpenAIFile`, `Batch`, `ListFilesResponse`),
whatever the Python classes are called. Request bodies documented inline (bodies read
with `read_json`) are moved into components, and the 422 responses FastAPI adds are
replaced by OpenAI's error envelope, which is what the API really returns.
"""

import json
import re
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute

from app.schemas.message_batches import ANTHROPIC_PATHS

OPERATION_IDS = {
    ("POST", "/v1/files"): "createFile",
    ("GET", "/v1/files"): "listFiles",
    ("GET", "/v1/files/{}"): "retrieveFile",
    ("GET", "/v1/files/{}/content"): "downloadFile",
    ("DELETE", "/v1/files/{}"): "deleteFile",
    ("POST", "/v1/uploads"): "createUpload",
    ("POST", "/v1/uploads/{}/parts"): "addUploadPart",
    ("POST", "/v1/uploads/{}/complete"): "completeUpload",
    ("POST", "/v1/uploads/{}/cancel"): "cancelUpload",
    ("POST", "/v1/batches"): "createBatch",
    ("GET", "/v1/batches"): "listBatches",
    ("GET", "/v1/batches/{}"): "retrieveBatch",
    ("POST", "/v1/batches/{}/cancel"): "cancelBatch",
    ("GET", "/v1/models"): "listModels",
    ("GET", "/v1/models/{}"): "retrieveModel",
}
RESPONSE_NAMES = {
    "createFile": "OpenAIFile",
    "retrieveFile": "OpenAIFile",
    "listFiles": "ListFilesResponse",
    "deleteFile": "DeleteFileResponse",
    "createUpload": "Upload",
    "addUploadPart": "UploadPart",
    "completeUpload": "Upload",
    "cancelUpload": "Upload",
    "createBatch": "Batch",
    "retrieveBatch": "Batch",
    "cancelBatch": "Batch",
    "listBatches": "ListBatchesResponse",
    "listModels": "ListModelsResponse",
    "retrieveModel": "Model",
    "listProjects": "ListProjectsResponse",
    "listApiKeys": "ListApiKeysResponse",
    "listWorkers": "ListWorkersResponse",
}
REQUEST_NAMES = {
    "createFile": "CreateFileRequest",
    "createUpload": "CreateUploadRequest",
    "addUploadPart": "AddUploadPartRequest",
    "completeUpload": "CompleteUploadRequest",
    "createBatch": "CreateBatchRequest",
}
# Nested shapes whose OpenAI names differ from our class names.
CLASS_NAMES = {
    "ExpiresAfter": "FileExpirationAfter",
    "OutputExpiresAfter": "BatchFileExpirationAfter",
}
ERROR_SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "properties": {
            "code": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "message": {"type": "string"},
            "param": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "type": {"type": "string"},
        },
        "required": ["type", "message", "param", "code"],
    },
    "ErrorResponse": {
        "type": "object",
        "properties": {"error": {"$ref": "#/components/schemas/Error"}},
        "required": ["error"],
    },
    "AnthropicErrorResponse": {
        "type": "object",
        "properties": {
            "type": {"type": "string", "enum": ["error"]},
            "error": {
                "type": "object",
                "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
                "required": ["type", "message"],
            },
        },
        "required": ["type", "error"],
    },
}

REF = "#/components/schemas/"


def operation_id(route: APIRoute) -> str:
    """OpenAI's id for its endpoints; camelCase of the function name for our own."""
    shape = re.sub(r"\{[^}]+\}", "{}", route.path_format)
    for method in sorted(route.methods):
        if (method, shape) in OPERATION_IDS:
            return OPERATION_IDS[(method, shape)]
    head, *rest = route.name.split("_")
    return head + "".join(word.title() for word in rest)


def _operations(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [op for item in doc.get("paths", {}).values() for op in item.values()]


def _rewrite_refs(node: Any, mapping: dict[str, str]) -> None:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref in mapping:
            node["$ref"] = mapping[ref]
        for value in node.values():
            _rewrite_refs(value, mapping)
    elif isinstance(node, list):
        for value in node:
            _rewrite_refs(value, mapping)


def _hoist_inline_bodies(doc: dict[str, Any]) -> None:
    """Inline pydantic schemas carry `$defs` that only resolve inside them: make them components."""
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for op in _operations(doc):
        for media in op.get("requestBody", {}).get("content", {}).values():
            schema = media.get("schema", {})
            if "$ref" in schema or "properties" not in schema:
                continue
            for name, definition in schema.pop("$defs", {}).items():
                schemas.setdefault(name, definition)
            name = schema.get("title") or op["operationId"] + "Request"
            schemas.setdefault(name, schema)
            media["schema"] = {"$ref": REF + name}
    _rewrite_refs(doc, {f"#/$defs/{n}": REF + n for n in schemas})


def _rename(doc: dict[str, Any], old: str, new: str) -> None:
    schemas = doc["components"]["schemas"]
    if old == new or old not in schemas or new in schemas:
        return
    schemas[new] = schemas.pop(old)
    schemas[new]["title"] = new
    _rewrite_refs(doc, {REF + old: REF + new})


def _ref_of(container: dict[str, Any]) -> str | None:
    for media in container.get("content", {}).values():
        ref = media.get("schema", {}).get("$ref", "")
        if ref.startswith(REF):
            return str(ref[len(REF) :])
    return None


def _apply_openai_names(doc: dict[str, Any]) -> None:
    for op in _operations(doc):
        op_id = op.get("operationId", "")
        if op_id in RESPONSE_NAMES and (old := _ref_of(op.get("responses", {}).get("200", {}))):
            _rename(doc, old, RESPONSE_NAMES[op_id])
        if op_id in REQUEST_NAMES and (old := _ref_of(op.get("requestBody", {}))):
            _rename(doc, old, REQUEST_NAMES[op_id])
    for old, new in CLASS_NAMES.items():
        _rename(doc, old, new)


def _errors_and_security(doc: dict[str, Any]) -> None:
    components = doc["components"]
    components["schemas"].update(ERROR_SCHEMAS)
    for unused in ("HTTPValidationError", "ValidationError"):
        components["schemas"].pop(unused, None)
    components["securitySchemes"] = {"ApiKeyAuth": {"type": "http", "scheme": "bearer"}}
    for path, item in doc.get("paths", {}).items():
        anthropic = path.startswith(ANTHROPIC_PATHS)
        envelope = "AnthropicErrorResponse" if anthropic else "ErrorResponse"
        error = {
            "description": f"{'Anthropic' if anthropic else 'OpenAI'}'s error envelope.",
            "content": {"application/json": {"schema": {"$ref": REF + envelope}}},
        }
        for op in item.values():
            responses = op.setdefault("responses", {})
            responses.pop("422", None)
            if path.startswith("/v1/"):
                responses.setdefault("4XX", error)
                responses.setdefault("5XX", error)
                op["security"] = [{"ApiKeyAuth": []}]


def _drop_inline_enums(doc: dict[str, Any]) -> None:
    """Enums described in place (`inline_enum`) need no component of their own."""
    schemas = doc["components"]["schemas"]
    text = json.dumps(doc["paths"]) + json.dumps(schemas)
    for name in [n for n, s in schemas.items() if "enum" in s and f'"{REF}{n}"' not in text]:
        del schemas[name]


def build_openapi(app: FastAPI) -> dict[str, Any]:
    doc = get_openapi(
        title=app.title,
        version=app.version,
        summary=app.summary,
        description=app.description,
        routes=app.routes,
    )
    doc.setdefault("components", {}).setdefault("schemas", {})
    _hoist_inline_bodies(doc)
    _apply_openai_names(doc)
    _errors_and_security(doc)
    _drop_inline_enums(doc)
    return doc


class OpenAIStyleAPI(FastAPI):
    """The app, its operation ids and its OpenAPI document shaped as OpenAI's; the document is
    built once, when first asked for (every route is in by then)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(generate_unique_id_function=operation_id, **kwargs)

    def openapi(self) -> dict[str, Any]:
        if not self.openapi_schema:
            self.openapi_schema = build_openapi(self)
        return self.openapi_schema
