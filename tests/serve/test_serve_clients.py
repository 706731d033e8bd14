"""What ordinary clients send, through the official ``openai`` client: ``stream_options`` (a
usage chunk), ``max_completion_tokens``, a system message, and OpenAI's fields a flow model
cannot honour at their neutral values (null, ``temperature`` 1, penalties 0, ...) are accepted
and change nothing; a value that would change the answer is refused naming its field."""

from __future__ import annotations

import pytest
from serve_prompts import PROMPTS

pytest.importorskip("uvicorn", reason="elfreg serve needs the serve extra")
openai = pytest.importorskip("openai", reason="the serving tests speak through the openai client (dev extra)")


SYSTEM = "Be brief."
USER = "Zoe has 5 shells and 6 more."
NEUTRAL = {"temperature": 1, "top_p": 1.0, "presence_penalty": 0, "frequency_penalty": 0.0, "logprobs": False}
NULLS = {"temperature": None, "top_p": None, "logprobs": None}



def test_chat_with_a_system_message_max_completion_tokens_and_stream_options(running):
    # the system message is prepended to the user's turn, a blank line apart, inside the
    # checkpoint's prompt format (the toy tasks': the text and a newline)
    full = running.model.generate([f"{SYSTEM}\n\n{USER}\n"], seed=1)[0]
    tok = running.model.models.frozen.tokenizer
    assert len(tok.encode(full, add_special_tokens=False)) > 4  # so that 4 tokens cut it
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]
    whole = running.client.chat.completions.create(model="tiny", messages=messages, seed=1, **NEUTRAL)
    assert whole.choices[0].message.content == full and whole.choices[0].finish_reason in ("stop", "length")
    assert whole.usage.prompt_tokens == len(f"{SYSTEM}\n\n{USER}\n")  # one token a character
    cut = running.client.chat.completions.create(model="tiny", messages=messages, seed=1, max_completion_tokens=4,
                                                 **NULLS)
    assert cut.choices[0].message.content == tok.decode(tok.encode(full, add_special_tokens=False)[:4])
    assert cut.choices[0].finish_reason == "length" and cut.usage.completion_tokens == 4
    chunks = list(running.client.chat.completions.create(
        model="tiny", messages=messages, seed=1, max_completion_tokens=4, stream=True,
        stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == cut.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 4
    assert chunks[-1].usage.prompt_tokens == cut.usage.prompt_tokens
    assert all(c.usage is None for c in chunks[:-1])
    # a developer message is a system message by its newer name
    developer = running.client.chat.completions.create(
        model="tiny", messages=[{"role": "developer", "content": [{"type": "text", "text": SYSTEM}]},
                                {"role": "user", "content": [{"type": "text", "text": USER}]}], seed=1)
    assert developer.choices[0].message.content == full


def test_completions_with_stream_options_and_neutral_fields(running):
    expected = running.model.generate(PROMPTS[:1], samples=2, seed=3)
    chunks = list(running.client.completions.create(
        model="tiny", prompt=PROMPTS[0], n=2, seed=3, stream=True, stream_options={"include_usage": True},
        echo=False, best_of=1, **NEUTRAL))
    texts = ["".join(c.choices[0].text for c in chunks if c.choices and c.choices[0].index == k) for k in (0, 1)]
    assert texts == expected
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage.prompt_tokens == 2 * len(PROMPTS[0])
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens > usage.prompt_tokens


@pytest.mark.parametrize("field, value", [("temperature", 0.7), ("top_p", 0.5), ("presence_penalty", 1.0),
                                          ("frequency_penalty", -0.5), ("logprobs", True)])
def test_a_value_a_flow_model_cannot_honour_is_refused_naming_its_field(running, field, value):
    with pytest.raises(openai.BadRequestError) as refused:
        running.client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": USER}],
                                               **{field: value})
    assert refused.value.param == field and "neutral value" in refused.value.message
