"""SPDClient against an in-process fake SPD servicer: results, retries, stream replay, errors, deadlines."""

from __future__ import annotations

import json
import threading
import time
from argparse import Namespace
from concurrent import futures

import grpc
import pytest

from spd_client import Chunk, SPDClient, SPDError, StreamDivergedError
from spd_client.v1 import spd_pb2, spd_pb2_grpc

TOKENS = list(range(100, 110))  # what the fake service generates, one token per chunk
WORDS = [f"w{t} " for t in TOKENS]  # the text delta of each token


def final_stats() -> spd_pb2.Stats:
    return spd_pb2.Stats(n=4, generated_tokens=len(TOKENS), cycles=5, alpha=2.0, theoretical_speedup=8.0)


class FakeSPD(spd_pb2_grpc.SPDServicer):
    """Deterministic service; `script` decides per call number how it misbehaves."""

    def __init__(self, fail_first: int = 0, die_after: int | None = None, fail_code=grpc.StatusCode.UNAVAILABLE,
                 hold: threading.Event | None = None, tokens=None):
        self.fail_first, self.die_after, self.fail_code = fail_first, die_after, fail_code
        self.hold, self.tokens = hold, tokens or (lambda call: TOKENS)  # hold: answer only once it is set
        self.calls, self.requests, self.lock = 0, [], threading.Lock()

    def _begin(self, request, context) -> int:
        with self.lock:
            self.calls += 1
            self.requests.append(request)
            call = self.calls
        if self.hold is not None:
            self.hold.wait(timeout=60)  # a server that does not answer (until the test lets it go)
        if call <= self.fail_first:
            context.abort(self.fail_code, f"fake failure {call}")
        return call

    def Generate(self, request, context):
        self._begin(request, context)
        if not request.prompt:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "exactly one of prompt and messages must be non-empty")
        ids = self.tokens(self.calls)
        return spd_pb2.GenerateResponse(text="".join(WORDS), token_ids=ids, finish_reason="length", stats=final_stats())

    def GenerateStream(self, request, context):
        call = self._begin(request, context)
        ids = self.tokens(call)
        for i, t in enumerate(ids):
            if self.die_after is not None and call == 1 and i == self.die_after:
                context.abort(grpc.StatusCode.UNAVAILABLE, "worker died")
            last = i == len(ids) - 1
            yield spd_pb2.GenerateChunk(token_ids=[t], text=f"w{t} ", finish_reason="length" if last else "",
                                        stats=final_stats() if last else None)


@pytest.fixture
def serve():
    servers = []

    def start(servicer) -> str:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        spd_pb2_grpc.add_SPDServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        return f"127.0.0.1:{port}"

    yield start
    for s in servers:
        s.stop(grace=None)


def client(address, **kw) -> SPDClient:
    kw = {"timeout": 10.0, "backoff": 0.01, "max_backoff": 0.05, "seed": 0, **kw}
    return SPDClient(address, **kw)


def test_unary_generate_returns_text_ids_reason_and_stats(serve):
    fake = FakeSPD()
    with client(serve(fake)) as c:
        r = c.generate("hello", max_tokens=10, temperature=0.5, top_p=0.9, seed=7, stop=["."], request_id="q1")
    assert (r.text, r.token_ids, r.finish_reason) == ("".join(WORDS), TOKENS, "length")
    assert r.stats["generated_tokens"] == 10 and r.stats["theoretical_speedup"] == 8.0 and "ttft_ms" in r.stats
    sent = fake.requests[0]
    assert (sent.prompt, sent.max_tokens, sent.seed, list(sent.stop), sent.request_id) == ("hello", 10, 7, ["."], "q1")
    assert sent.top_p == pytest.approx(0.9) and sent.HasField("top_p")


def test_unset_params_stay_unset_and_messages_are_sent(serve):
    fake = FakeSPD()
    with client(serve(fake)) as c:
        list(c.stream(messages=[{"role": "system", "content": "s"}, ("user", "u")]))
    sent = fake.requests[0]
    assert not sent.HasField("max_tokens") and not sent.HasField("top_p")
    assert [(m.role, m.content) for m in sent.messages] == [("system", "s"), ("user", "u")]


def test_stream_yields_each_token_and_stats_on_the_last_chunk(serve):
    with client(serve(FakeSPD())) as c:
        chunks = list(c.stream("hello"))
    assert [t for ch in chunks for t in ch.token_ids] == TOKENS
    assert "".join(ch.text for ch in chunks) == "".join(WORDS)
    assert [ch.finish_reason for ch in chunks] == [None] * 9 + ["length"]
    assert chunks[-1].stats["cycles"] == 5 and all(ch.stats is None for ch in chunks[:-1])


def test_closing_a_stream_early_cancels_the_call_on_the_server(serve):
    cancelled = threading.Event()

    class Unfinished(FakeSPD):
        def GenerateStream(self, request, context):
            context.add_callback(cancelled.set)
            for i in range(5):
                yield spd_pb2.GenerateChunk(token_ids=[i], text=str(i))
            cancelled.wait(timeout=60)  # the stream stays open (no last chunk) until the client cancels it

    with client(serve(Unfinished())) as c:
        stream = c.stream("hello")
        assert [next(stream).token_ids for _ in range(3)] == [[0], [1], [2]]
        stream.close()
        assert cancelled.wait(timeout=30), "closing the stream did not cancel the call on the server"


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED])
def test_unary_succeeds_after_two_retryable_failures(serve, code):
    fake = FakeSPD(fail_first=2, fail_code=code)
    with client(serve(fake)) as c:
        assert c.generate("hello").token_ids == TOKENS
    assert fake.calls == 3


def test_the_async_client_generates_streams_and_retries_a_full_queue(serve):
    import asyncio

    from spd_client.aio import AsyncSPDClient

    fake = FakeSPD(fail_first=1, fail_code=grpc.StatusCode.RESOURCE_EXHAUSTED)
    address = serve(fake)

    async def main():
        async with AsyncSPDClient(address, timeout=30, backoff=0.01) as c:
            unary = await c.generate("hello", max_tokens=5)
            chunks = [chunk async for chunk in c.stream("hello")]
        return unary, chunks

    unary, chunks = asyncio.run(main())
    assert unary.token_ids == TOKENS and fake.calls == 3
    assert [t for ch in chunks for t in ch.token_ids] == TOKENS and chunks[-1].finish_reason == "length"


def test_stream_that_dies_after_three_chunks_resumes_without_repeating_tokens(serve):
    fake = FakeSPD(die_after=3)
    with client(serve(fake)) as c:
        chunks = list(c.stream("hello", seed=3))
    assert fake.calls == 2 and fake.requests[0] == fake.requests[1]
    assert [t for ch in chunks for t in ch.token_ids] == TOKENS
    assert "".join(ch.text for ch in chunks) == "".join(WORDS)
    assert chunks[-1].finish_reason == "length"


def test_a_replay_with_different_tokens_raises_instead_of_yielding_them(serve):
    changed = lambda call: TOKENS if call == 1 else [100, 999] + TOKENS[2:]  # noqa: E731
    with client(serve(FakeSPD(die_after=3, tokens=changed))) as c:
        seen = []
        with pytest.raises(StreamDivergedError, match="changed the token at position 1: 999 instead of 101"):
            for ch in c.stream("hello"):
                seen += ch.token_ids
    assert seen == TOKENS[:3]


def test_invalid_argument_is_not_retried_and_carries_the_server_message(serve):
    fake = FakeSPD(fail_first=1, fail_code=grpc.StatusCode.INVALID_ARGUMENT)
    with client(serve(fake)) as c:
        with pytest.raises(SPDError) as e:
            c.generate("hello")
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and e.value.details == "fake failure 1"
        assert fake.calls == 1
        with pytest.raises(SPDError, match="exactly one of prompt and messages"):
            c.generate("")
        assert c.generate("hello").token_ids == TOKENS  # the next valid request succeeds


def test_retries_are_bounded(serve):
    fake = FakeSPD(fail_first=100)
    with client(serve(fake), retries=2) as c:
        with pytest.raises(SPDError) as e:
            c.generate("hello")
    assert e.value.code == grpc.StatusCode.UNAVAILABLE and fake.calls == 3


def test_deadline_is_respected_for_a_server_that_does_not_answer(serve):
    hold = threading.Event()
    try:
        with client(serve(FakeSPD(hold=hold))) as c:  # the client's own timeout is 10 s
            start = time.monotonic()
            with pytest.raises(SPDError) as e:
                c.generate("hello", timeout=0.3)
            elapsed = time.monotonic() - start
    finally:
        hold.set()
    assert e.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert elapsed < 5.0, f"the 0.3 s deadline took {elapsed:.1f} s"  # far below 10 s (client) and 60 s (server)


def test_deadline_bounds_retries_against_a_down_server(serve):
    with client(serve(FakeSPD(fail_first=10**6)), retries=10**6, backoff=0.05, max_backoff=0.05) as c:
        start = time.monotonic()
        with pytest.raises(SPDError) as e:
            list(c.stream("hello", timeout=0.5))
        elapsed = time.monotonic() - start
    assert e.value.code in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE)
    # retried until the 0.5 s deadline (not given up at once), and stopped there (not at the client's 10 s)
    assert 0.3 < elapsed < 5.0, f"the 0.5 s deadline took {elapsed:.1f} s"


def test_unreachable_address_fails_with_unavailable_after_retries():
    with SPDClient("127.0.0.1:1", timeout=5.0, retries=1, backoff=0.01, seed=0) as c:
        with pytest.raises(SPDError) as e:
            c.generate("hello")
    assert e.value.code == grpc.StatusCode.UNAVAILABLE


def test_remote_command_prints_the_same_json_keys_as_the_local_path(serve, capsys):
    from spd.commands.remote import run_remote

    args = Namespace(address=serve(FakeSPD()), prompt="hi", raw=False, max_tokens=10, temperature=0.0, top_k=0,
                     top_p=1.0, seed=0, stop=[], json=True)
    assert run_remote(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"text", "token_ids", "finish_reason", "engine", "stats"}
    assert out["token_ids"] == TOKENS and out["text"] == "".join(WORDS)


def test_remote_command_streams_text_and_reports_errors(serve, capsys):
    from spd.commands.remote import run_remote

    args = Namespace(address=serve(FakeSPD()), prompt="hi", raw=False, max_tokens=10, temperature=0.0, top_k=0,
                     top_p=1.0, seed=0, stop=[], json=False)
    assert run_remote(args) == 0
    captured = capsys.readouterr()
    assert captured.out == "".join(WORDS) + "\n" and "[length] 10 tokens in 5 pipeline cycles" in captured.err
    args.address = serve(FakeSPD(fail_first=1, fail_code=grpc.StatusCode.INVALID_ARGUMENT))
    assert run_remote(args) == 1
    assert "INVALID_ARGUMENT: fake failure 1" in capsys.readouterr().err


def test_replay_with_different_chunk_boundaries_yields_only_the_new_part():
    from spd_client.client import _Replay

    replay = _Replay()
    first = [replay.admit(spd_pb2.GenerateChunk(token_ids=ids, text=text))
             for ids, text in [([1], "a"), ([2, 3], "")]]  # the text of 2, 3 is still held back
    replay.restart()
    again = [replay.admit(spd_pb2.GenerateChunk(token_ids=ids, text=text, finish_reason=fin))
             for ids, text, fin in [([1, 2], "abc", ""), ([3, 4], "de", ""), ([], "", "stop")]]
    assert [(c.token_ids, c.text) for c in first] == [([1], "a"), ([2, 3], "")]
    assert again[0] == Chunk([], "bc") and again[1] == Chunk([4], "de")
    assert again[2].finish_reason == "stop" and again[2].token_ids == []
    assert replay.ids == [1, 2, 3, 4] and replay.text == "abcde"
