"""The published OpenAPI document: committed, current, and shaped like OpenAI's."""

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.api.openapi import OPERATION_IDS

ROOT = Path(__file__).resolve().parent.parent
# The project's shared folder sits beside the checkout (CI too); /work/shared on developers'.
SUBSET = "shared/reference/openai-openapi-subset.yaml"
OPENAI_SUBSET = next(
    (p for p in (ROOT.parent / SUBSET, Path("/work") / SUBSET) if p.exists()), ROOT.parent / SUBSET
)


def _generator() -> Any:
    spec = importlib.util.spec_from_file_location("generate", ROOT / "openapi" / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _operations(doc: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (method.upper(), path): op
        for path, item in doc["paths"].items()
        for method, op in item.items()
    }


def test_committed_document_matches_the_code() -> None:
    committed = (ROOT / "openapi" / "openapi.json").read_text()
    assert committed == _generator().render(), (
        "openapi/openapi.json is out of date: run `.venv/bin/python openapi/generate.py`"
    )


def test_operation_ids_and_schema_names_are_openai_s() -> None:
    doc = json.loads((ROOT / "openapi" / "openapi.json").read_text())
    ops = _operations(doc)
    by_id = {op["operationId"]: key for key, op in ops.items()}
    assert len(by_id) == len(ops), "operation ids must be unique"
    expected = set(OPERATION_IDS.values())
    assert expected <= set(by_id)
    assert len(expected) == 15
    schemas = doc["components"]["schemas"]
    for op_id, name in {
        "retrieveFile": "OpenAIFile",
        "listFiles": "ListFilesResponse",
        "deleteFile": "DeleteFileResponse",
        "createUpload": "Upload",
        "addUploadPart": "UploadPart",
        "retrieveBatch": "Batch",
        "listBatches": "ListBatchesResponse",
        "listModels": "ListModelsResponse",
        "retrieveModel": "Model",
    }.items():
        response = ops[by_id[op_id]]["responses"]["200"]["content"]["application/json"]["schema"]
        assert response == {"$ref": f"#/components/schemas/{name}"}, op_id
        assert name in schemas
    for op_id, name in {
        "createBatch": "CreateBatchRequest",
        "createUpload": "CreateUploadRequest",
        "completeUpload": "CompleteUploadRequest",
    }.items():
        body = ops[by_id[op_id]]["requestBody"]["content"]["application/json"]["schema"]
        assert body == {"$ref": f"#/components/schemas/{name}"}, op_id
    # Errors are OpenAI's envelope (Anthropic's on its routes), never FastAPI's 422.
    for (method, path), op in ops.items():
        assert "422" not in op["responses"], (method, path)
        if path.startswith("/v1/"):
            envelope = (
                "AnthropicErrorResponse" if path.startswith("/v1/messages/") else "ErrorResponse"
            )
            assert op["responses"]["4XX"]["content"]["application/json"]["schema"] == {
                "$ref": f"#/components/schemas/{envelope}"
            }
    # Internal pages stay out of the API description.
    assert not any(path.startswith(("/dashboard", "/metrics")) for _m, path in ops)


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return found + [r for value in node.values() for r in _refs(value)]
    if isinstance(node, list):
        return [r for value in node for r in _refs(value)]
    return []


def test_every_reference_resolves() -> None:
    doc = json.loads((ROOT / "openapi" / "openapi.json").read_text())
    schemas = doc["components"]["schemas"]
    for ref in _refs(doc):
        assert ref.startswith("#/components/schemas/"), ref
        assert ref.removeprefix("#/components/schemas/") in schemas, ref


def test_paths_and_required_fields_cover_openai_s_spec() -> None:
    """Against OpenAI's own spec (the copy in shared/reference): same ids, same required keys."""
    if not OPENAI_SUBSET.exists():
        pytest.skip(f"{OPENAI_SUBSET} is not here")
    reference = yaml.safe_load(OPENAI_SUBSET.read_text())
    ours = json.loads((ROOT / "openapi" / "openapi.json").read_text())
    our_ops = _operations(ours)
    for path, item in reference["paths"].items():
        for method, op in item.items():
            mine = our_ops[(method.upper(), "/v1" + path)]
            assert mine["operationId"] == op["operationId"], path
    for name in ("OpenAIFile", "Batch", "Upload", "UploadPart", "ListFilesResponse"):
        required = set(reference["components"]["schemas"][name].get("required", []))
        properties = set(ours["components"]["schemas"][name]["properties"])
        assert required <= properties, (name, required - properties)
