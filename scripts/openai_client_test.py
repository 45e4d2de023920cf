#!/usr/bin/env python3
"""Drives a running peagle-serve with the official `openai` package: models, completions, chat
and responses, plain and streamed, structured output (a JSON schema and a structural tag), n,
seeds, stop strings, logprobs, penalties and logit_bias, the per-request speculation switch
and error statuses. Prints one line per check and exits non-zero if any check fails.

    python3 scripts/openai_client_test.py --base-url http://127.0.0.1:8000/v1 [--api-key KEY]
"""

import argparse
import json
import re
import sys
import time
import traceback

import openai
from openai import OpenAI

# vLLM-style extensions travel in extra_body.
RUN_TO_LENGTH = {"ignore_eos": True}


def greedy_completion(client, model, prompt, max_tokens, **extra):
    return client.completions.create(
        model=model,
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=0,
        extra_body={**RUN_TO_LENGTH, **extra},
    )


def check_models(client, model):
    ids = [m.id for m in client.models.list().data]
    assert model in ids, ids


def check_completion(client, model):
    r = greedy_completion(client, model, "def fibonacci(n):", 8)
    assert r.object == "text_completion", r
    choice = r.choices[0]
    assert isinstance(choice.text, str) and choice.text, r
    assert choice.finish_reason == "length", r
    assert r.usage.completion_tokens == 8, r.usage
    assert r.usage.total_tokens == r.usage.prompt_tokens + 8, r.usage


def check_completion_stream(client, model):
    plain = greedy_completion(client, model, "import os", 12).choices[0].text
    stream = client.completions.create(
        model=model,
        prompt="import os",
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=RUN_TO_LENGTH,
    )
    text, finish, usage = "", None, None
    for chunk in stream:
        for choice in chunk.choices:
            text += choice.text
            finish = choice.finish_reason or finish
        usage = chunk.usage or usage
    assert text == plain, (text, plain)
    assert finish == "length", finish
    assert usage is not None and usage.completion_tokens == 12, usage


def chat(client, model, **kwargs):
    return client.chat.completions.create(
        model=model,
        messages=[
            {"role": "system", "content": "You write Python."},
            {"role": "user", "content": "Reverse a string."},
        ],
        temperature=0,
        extra_body=RUN_TO_LENGTH,
        **kwargs,
    )


def check_chat(client, model):
    r = chat(client, model, max_tokens=10)
    assert r.object == "chat.completion", r
    message = r.choices[0].message
    assert message.role == "assistant" and isinstance(message.content, str), message
    assert r.choices[0].finish_reason == "length", r
    assert r.usage.completion_tokens == 10, r.usage


def check_chat_stream(client, model):
    plain = chat(client, model, max_completion_tokens=10).choices[0].message.content
    text, roles, finish = "", [], None
    for chunk in chat(client, model, max_completion_tokens=10, stream=True):
        assert chunk.object == "chat.completion.chunk", chunk
        for choice in chunk.choices:
            if choice.delta.role:
                roles.append(choice.delta.role)
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    assert roles == ["assistant"], roles
    assert text == plain, (text, plain)
    assert finish == "length", finish


def respond(client, model, **kwargs):
    return client.responses.create(
        model=model,
        instructions="You write Python.",
        input="Reverse a string.",
        temperature=0,
        max_output_tokens=10,
        extra_body=RUN_TO_LENGTH,
        **kwargs,
    )


def check_responses(client, model):
    r = respond(client, model)
    assert r.object == "response" and r.status == "incomplete", r
    assert r.incomplete_details.reason == "max_output_tokens", r
    assert r.output_text == chat(client, model, max_tokens=10).choices[0].message.content, r
    assert r.usage.output_tokens == 10 and r.usage.input_tokens > 0, r.usage
    types = []
    with respond(client, model, stream=True) as events:
        for event in events:
            types.append(event.type)
    assert types[:2] == ["response.created", "response.in_progress"], types
    assert types[-1] == "response.incomplete", types
    # The SDK's stream helper wants a response that completes: one held to a JSON schema ends.
    order = {"type": "json_schema", "name": "order", "schema": {"enum": ["ascending", "descending"]}}
    streamed = client.responses.stream(
        model=model, input="Sort a list.", temperature=0, max_output_tokens=20, text={"format": order}
    )
    with streamed as stream:
        text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert final.status == "completed" and text == final.output_text, final
    assert json.loads(text) in ["ascending", "descending"], text


def check_stored_responses(client, model):
    first = respond(client, model)
    assert client.responses.retrieve(first.id).output_text == first.output_text, first
    second = client.responses.create(
        model=model, previous_response_id=first.id, input="Now in place.", temperature=0, max_output_tokens=4,
        extra_body=RUN_TO_LENGTH,
    )
    assert second.previous_response_id == first.id and second.usage.input_tokens > first.usage.input_tokens, second
    # A response lists its own input items; the SDK's pager walks them a page at a time, by
    # the `after` cursor.
    own = [item.content[0].text for item in client.responses.input_items.list(second.id)]
    assert own == ["Now in place."], own
    said = ["Sort a list.", "Use sorted().", "Now in place."]
    turns = [{"role": role, "content": text} for role, text in zip(["user", "assistant", "user"], said)]
    third = client.responses.create(model=model, input=turns, temperature=0, max_output_tokens=2, extra_body=RUN_TO_LENGTH)
    paged = [item.content[0].text for item in client.responses.input_items.list(third.id, limit=1, order="asc")]
    assert paged == said, paged
    client.responses.delete(first.id)
    try:
        client.responses.retrieve(first.id)
        raise AssertionError("a deleted response was found")
    except openai.NotFoundError:
        pass


def check_background_responses(client, model):
    # Polled until it ends, as the SDK's users poll; its events streamed again from a sequence
    # number; a cancel of one that ended gives it back as it ended.
    queued = respond(client, model, background=True)
    assert queued.status == "queued" and queued.background, queued
    deadline = time.monotonic() + 60
    polled = client.responses.retrieve(queued.id)
    while polled.status in ("queued", "in_progress"):
        assert time.monotonic() < deadline, polled
        time.sleep(0.05)
        polled = client.responses.retrieve(queued.id)
    assert polled.status == "incomplete" and polled.output_text == respond(client, model).output_text, polled
    events = list(client.responses.retrieve(queued.id, stream=True, starting_after=1))
    assert events[0].sequence_number == 2 and events[-1].type == "response.incomplete", events
    assert events[-1].response.output_text == polled.output_text, events[-1]
    assert client.responses.cancel(queued.id).status == "incomplete"


def check_structured_output(client, model):
    def answer(response_format):
        r = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Answer as JSON."}],
            max_tokens=48,
            temperature=0,
            response_format=response_format,
        )
        assert r.choices[0].finish_reason == "stop", r
        return r.choices[0].message.content

    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    content = answer({"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}})
    assert isinstance(json.loads(content)["ok"], bool), content
    tag = {"type": "structural_tag", "format": {"type": "sequence", "elements": [
        {"type": "const_string", "value": "x = "}, {"type": "regex", "pattern": "[0-9]{1,3}"}]}}
    content = answer(tag)
    assert re.fullmatch(r"x = [0-9]{1,3}", content), content


def check_n_and_seed(client, model):
    def run():
        r = client.completions.create(
            model=model, prompt="class Stack:", max_tokens=12, n=3, seed=7, temperature=1.0, extra_body=RUN_TO_LENGTH
        )
        return [c.text for c in sorted(r.choices, key=lambda c: c.index)]

    first = run()
    assert len(first) == 3, first
    assert first == run(), "seeded choices did not repeat"


def check_stop(client, model):
    full = greedy_completion(client, model, "while True:", 40).choices[0].text
    assert len(full) >= 8, full
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    r = client.completions.create(
        model=model, prompt="while True:", max_tokens=40, temperature=0, stop=[stop], extra_body=RUN_TO_LENGTH
    )
    choice = r.choices[0]
    assert choice.text == full[: full.index(stop)], (choice.text, full, stop)
    assert choice.finish_reason == "stop", choice


def check_logprobs(client, model):
    r = chat(client, model, max_tokens=4, logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert len(content) == 4, content
    for token in content:
        assert token.logprob <= 0 and len(token.top_logprobs) == 2, token
    c = greedy_completion(client, model, "def g(", 4)
    r = client.completions.create(model=model, prompt="def g(", max_tokens=4, temperature=0, logprobs=2,
                                  extra_body=RUN_TO_LENGTH)
    assert r.choices[0].text == c.choices[0].text
    assert len(r.choices[0].logprobs.token_logprobs) == 4, r.choices[0].logprobs
    # The Responses API's: each of the message's tokens, as the SDK types them, whole and in
    # the text deltas.
    r = respond(client, model, include=["message.output_text.logprobs"], top_logprobs=2)
    entries = r.output[0].content[0].logprobs
    assert len(entries) == 10 and "".join(e.token for e in entries) == r.output_text, entries
    assert all(e.logprob <= 0 and len(e.top_logprobs) == 2 for e in entries), entries
    streamed = []
    with respond(client, model, stream=True, include=["message.output_text.logprobs"], top_logprobs=2) as events:
        for event in events:
            if event.type == "response.output_text.delta":
                streamed += [(e.token, e.logprob) for e in event.logprobs]
    assert streamed == [(e.token, e.logprob) for e in entries], (streamed, entries)


def check_speculation_switch(client, model):
    on = greedy_completion(client, model, "def main():", 16).choices[0].text
    off = greedy_completion(client, model, "def main():", 16, speculative=False).choices[0].text
    assert on == off, (on, off)


def check_penalties(client, model):
    plain = chat(client, model, max_tokens=24).choices[0].message.content
    kwargs = dict(max_tokens=24, frequency_penalty=1.0, presence_penalty=0.5)
    penalised = chat(client, model, **kwargs).choices[0].message.content
    assert penalised != plain, (penalised, plain)
    assert chat(client, model, **kwargs).choices[0].message.content == penalised
    # A bias of 100 makes greedy decoding repeat its token; echoing the token as a prompt of
    # ids shows its text.
    token = 300
    echoed = client.completions.create(model=model, prompt=[token], max_tokens=1, temperature=0, echo=True,
                                       logprobs=0, extra_body=RUN_TO_LENGTH)
    text = echoed.choices[0].logprobs.tokens[0]
    r = client.completions.create(model=model, prompt="def g(", max_tokens=3, temperature=0, logprobs=0,
                                  logit_bias={str(token): 100}, extra_body=RUN_TO_LENGTH)
    assert r.choices[0].logprobs.tokens == [text] * 3, (r.choices[0].logprobs.tokens, text)


def check_errors(client, model):
    cases = [
        (openai.BadRequestError, dict(model=model, prompt="x", max_tokens=0)),
        (openai.BadRequestError, dict(model=model, prompt="x", max_tokens=4, temperature=-1)),
        (openai.BadRequestError, dict(model=model, prompt="x", max_tokens=4, n=17)),
        (openai.NotFoundError, dict(model="no-such-model", prompt="x", max_tokens=4)),
    ]
    for error, kwargs in cases:
        try:
            client.completions.create(**kwargs)
        except error as e:
            assert e.body and e.body.get("message"), e.body
        else:
            raise AssertionError(f"no {error.__name__} for {kwargs}")


CHECKS = [
    check_models,
    check_completion,
    check_completion_stream,
    check_chat,
    check_chat_stream,
    check_responses,
    check_stored_responses,
    check_background_responses,
    check_structured_output,
    check_n_and_seed,
    check_stop,
    check_logprobs,
    check_penalties,
    check_speculation_switch,
    check_errors,
]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", required=True, help="the server's /v1 URL")
    parser.add_argument("--api-key", default="EMPTY")
    parser.add_argument("--model", help="default: the first model the server lists")
    args = parser.parse_args()
    client = OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=120)
    model = args.model or client.models.list().data[0].id
    failed = 0
    for check in CHECKS:
        try:
            check(client, model)
            print(f"ok   {check.__name__}")
        except Exception:
            failed += 1
            print(f"FAIL {check.__name__}\n{traceback.format_exc()}")
    print(f"openai_client_test: {len(CHECKS) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
