"""The OpenAI-compatible HTTP API (`spd http`) in front of a real tiny pipeline: the same tokens as
the gRPC SDK, OpenAI's response, streaming and error shapes, and auth passed through."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from cluster_util import address, running_cluster
from spd.http_api.app import make_app
from spd.models.loading import resolve_model
from spd.models.tiny import make_tiny_model
from spd_client import SPDClient

pytestmark = pytest.mark.processes  # starts worker processes: runs serially (scripts/test.sh)

TOKEN = "sekrit"
NAME = "tiny-chat"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    model = make_tiny_model(tmp_path_factory.mktemp("http") / "tiny", "llama", vocab_size=49152, num_layers=4,
                            hidden_size=64, tokenizer_from=resolve_model(None), init_std=0.5)
    with running_cluster(tmp_path_factory.mktemp("http-logs"), n=2, model=str(model), draft="random",
                         extra_orchestrator_args=["--token", TOKEN]) as c:
        yield c


@pytest.fixture(scope="module")
def http(cluster):
    with TestClient(make_app(address(cluster), NAME)) as client:
        client.headers["Authorization"] = f"Bearer {TOKEN}"
        yield client


def _events(response) -> list:
    lines = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines), lines
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[6:]) for line in lines[:-1]]


def test_chat_completion_has_the_sdks_text_openais_shape_usage_and_spd_figures(cluster, http):
    with SPDClient(address(cluster), token=TOKEN) as sdk:
        want = sdk.generate(messages=[{"role": "user", "content": "hello there"}], max_tokens=12, temperature=0)
    r = http.post("/v1/chat/completions", json={"model": NAME, "messages": [{"role": "user", "content": "hello there"}],
                                                "max_tokens": 12, "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-") and body["model"] == NAME
    (choice,) = body["choices"]
    assert choice["message"] == {"role": "assistant", "content": want.text}
    assert choice["finish_reason"] == ("length" if want.finish_reason == "length" else "stop")
    usage = body["usage"]
    assert usage["completion_tokens"] == len(want.token_ids) and usage["prompt_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert body["spd"]["cycles"] > 0 and body["timings"]["predicted_n"] == len(want.token_ids)


def test_streamed_chat_ends_with_a_usage_chunk_and_done_and_concatenates_to_the_unary_text(http):
    req = {"messages": [{"role": "user", "content": "tell me a story"}], "max_completion_tokens": 16, "temperature": 0}
    unary = http.post("/v1/chat/completions", json=req).json()["choices"][0]["message"]["content"]
    with http.stream("POST", "/v1/chat/completions",
                     json={**req, "stream": True, "stream_options": {"include_usage": True}}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = _events(r)
    assert all(e["object"] == "chat.completion.chunk" for e in events)
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"]) == unary
    assert [e["choices"][0]["finish_reason"] for e in events if e["choices"]][-1] in ("stop", "length")
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 16


def test_text_completion_continues_the_raw_prompt(http):
    r = http.post("/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0, "seed": 1})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion" and body["choices"][0]["logprobs"] is None
    assert body["usage"]["completion_tokens"] == 8


def test_sampling_with_a_seed_is_reproducible_over_http(http):
    req = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10, "temperature": 0.8, "top_p": 0.9, "seed": 7}
    a, b = (http.post("/v1/chat/completions", json=req).json()["choices"][0]["message"]["content"] for _ in range(2))
    assert a == b


@pytest.mark.parametrize("body, param", [
    ({"messages": [{"role": "user", "content": "x"}], "n": 2}, "n"),
    ({"messages": [{"role": "user", "content": "x"}], "logprobs": True}, "logprobs"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": -1}, "temperature"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, None),
])
def test_unsupported_or_invalid_requests_get_openais_error_json_with_400(http, body, param):
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"]
    if param:
        assert err["param"] == param


def test_a_bad_token_is_401_an_unknown_model_404_and_models_lists_the_served_one(cluster, http):
    r = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]},
                  headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    r = http.post("/v1/chat/completions", json={"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    (card,) = http.get("/v1/models").json()["data"]
    assert card["id"] == NAME and card["spd"]["n"] == 2 and card["spd"]["context_length"] > 0
    assert http.get("/health").status_code == 200 and http.get("/live").status_code == 200


def test_spd_up_http_port_serves_it_and_a_disconnected_stream_frees_the_pipeline(tmp_path_factory):
    import httpx

    from spd.runtime.topology import free_ports

    model = make_tiny_model(tmp_path_factory.mktemp("http2") / "tiny", "llama", vocab_size=49152, num_layers=4,
                            hidden_size=64, tokenizer_from=resolve_model(None), init_std=0.5)
    (port,) = free_ports(1)
    with running_cluster(tmp_path_factory.mktemp("http2-logs"), n=2, model=str(model), draft="random",
                         http_port=port) as c:
        base = f"http://127.0.0.1:{port}"
        req = {"messages": [{"role": "user", "content": "tell me a long story"}], "max_tokens": 400, "temperature": 0}
        with httpx.Client(timeout=60) as client:
            with client.stream("POST", f"{base}/v1/chat/completions", json={**req, "stream": True}) as r:
                for i, _ in enumerate(r.iter_lines()):
                    if i == 3:
                        break  # hang up mid-stream
            nxt = client.post(f"{base}/v1/chat/completions", json={**req, "max_tokens": 4}).json()
        assert nxt["usage"]["completion_tokens"] == 4
        assert nxt["spd"]["queue_ms"] < 2000, "the abandoned request kept the pipeline busy"
        assert any(p.role == "http" for p in c.procs)
