"""Evaluation prompt sets load offline from their wheels."""

from spd.eval.prompts import load


def test_prompt_sets_have_their_published_sizes_and_are_chat_messages():
    sizes = {name: len(load(name)) for name in ("mtbench", "gsm8k", "humaneval")}
    assert sizes == {"mtbench": 80, "gsm8k": 1319, "humaneval": 164}
    first = load("gsm8k", limit=1)[0]
    assert first[0]["role"] == "user" and "Janet" in first[0]["content"]
