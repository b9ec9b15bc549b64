"""`GET /v1/models`: the deployment's model registry in OpenAI's shapes."""

import httpx
import openai
import pytest

from app.config import ServedModel, Settings
from tests.harness import running_server
from tests.spec import assert_error


def test_models_list_and_retrieve(
    client: openai.OpenAI, settings: Settings, http: httpx.Client
) -> None:
    models = client.models.list()
    assert [m.id for m in models] == [m.name for m in settings.models]
    assert all(m.object == "model" and m.owned_by == "overnight" for m in models)
    assert all(isinstance(m.created, int) and m.created > 0 for m in models)
    raw = http.get("/v1/models").json()
    assert raw["object"] == "list" and set(raw["data"][0]) == {
        "id",
        "object",
        "created",
        "owned_by",
        "endpoints",
    }
    assert {m["id"]: m["endpoints"] for m in raw["data"]} == {
        "SmolLM2-135M-Instruct": [
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/responses",
            "/v1/messages",
        ],
        "all-MiniLM-L6-v2": ["/v1/embeddings", "/v1/score", "/v1/rerank"],
    }
    first = settings.models[0].name
    assert client.models.retrieve(first).id == first
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")
    assert_error(http.get("/v1/models/gpt-4o"), 404, param="model")


def test_models_follow_the_configured_registry(settings: Settings) -> None:
    custom = settings.model_copy(
        update={"models": [ServedModel(name="org/my-model", endpoints=["/v1/embeddings"])]}
    )
    with running_server(custom) as server, httpx.Client(timeout=60, base_url=server.url) as http:
        assert [m["id"] for m in http.get("/v1/models").json()["data"]] == ["org/my-model"]
        assert http.get("/v1/models/org/my-model").json()["id"] == "org/my-model"
