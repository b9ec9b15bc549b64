"""Which embedding lines take a template of their shape (`worker.engine_embeddings`).

That their answers are vLLM's own is proven on the real engine, against vLLM's own app:
`tests/test_worker_engine.py::test_embeddings_batch`.
"""

from worker.engine_embeddings import shape_of

MODEL = "all-MiniLM-L6-v2"


def test_lines_that_differ_only_in_their_text_share_a_shape() -> None:
    one = shape_of({"model": MODEL, "input": "a cat"})
    assert one == (("model", MODEL),)
    assert shape_of({"input": ["a dog", "a bird"], "model": MODEL}) == one
    floats = shape_of({"model": MODEL, "input": "a cat", "encoding_format": "float"})
    assert floats == (("encoding_format", "float"), ("model", MODEL))
    assert shape_of({"model": MODEL, "input": "x", "dimensions": 8}) != one


def test_lines_vllm_must_validate_whole_have_no_shape() -> None:
    unusual = [
        {"model": MODEL},
        {"model": MODEL, "input": ""},
        {"model": MODEL, "input": []},
        {"model": MODEL, "input": [101, 2023, 102]},
        {"model": MODEL, "input": ["fine", 7]},
        {"model": MODEL, "input": [{"role": "user", "content": "hi"}]},
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
        {"model": MODEL, "input": "x", "request_id": "mine"},
        {"model": MODEL, "input": "x", "mm_processor_kwargs": {"a": 1}},
        {"model": MODEL, "input": "x", "dimensions": [8]},
    ]
    for body in unusual:
        assert shape_of(body) is None, body
