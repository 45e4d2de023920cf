"""Generate the harmony (gpt-oss chat format) reference fixtures under tests/fixtures/harmony/.

Everything here comes from OpenAI's own `openai-harmony` package (the Rust renderer/parser
behind it, encoding HarmonyEncodingName.HARMONY_GPT_OSS), so peagle's Rust renderer and
parser can be tested against it without Python at test time:

  renders.json  OpenAI chat-completions requests (messages, reasoning_effort, tools,
                tool_choice; SCHEMA_TOOLS covers the JSON Schema shapes harmony renders) and
                the prompt that harmony renders for them, as decoded text ending in
                "<|start|>assistant", plus its o200k_harmony token ids.
  parses.json   completions as the model emits them (the text after "<|start|>assistant"),
                their token ids, the messages harmony's parser recovers from them (role,
                channel, recipient, content type, text), the per-token state of the
                streaming parser, the harmony special tokens with their ids, and the stop
                tokens.

How an OpenAI request becomes harmony messages follows vLLM's gpt-oss chat-completions
serving (vllm/entrypoints/openai/parser/harmony_utils.py, _make_request_with_harmony), as of
its "GPT-OSS instruction rendering" and "Autodrop reasoning" fixes:

  * tools are offered unless tool_choice is "none" (vLLM's --exclude-tools-when-tool-choice-none;
    by default vLLM renders them even then).
  * system message: harmony's SystemContent defaults (model identity "You are ChatGPT, a
    large language model trained by OpenAI.", knowledge cutoff 2024-06, valid channels
    analysis/commentary/final, required), with the request's reasoning_effort when given
    (harmony's default is medium, so "Reasoning: medium" when the request has none) and the
    conversation start date. vLLM uses $VLLM_SYSTEM_START_DATE or the server's local date
    (datetime.now().strftime("%Y-%m-%d")); the fixtures pin START_DATE below.
  * the first request message, when it is "system" or "developer", is peeled off and becomes
    the instructions of one harmony developer message ("# Instructions\\n\\n<text>"), which
    also carries the function tools; no developer message at all when there are neither
    instructions nor tools. A later "system"/"developer" message becomes a developer message
    of its own, in place.
  * "user" messages map as they are (a list of text parts becomes text contents rendered
    back to back, no separator).
  * an "assistant" message with tool_calls maps to its text content (if any) as a
    `commentary` message, its reasoning (vLLM reads "reasoning"; this script also accepts
    "reasoning_content") as an `analysis` message, then one `commentary` message per call
    with recipient "functions.<name>" and content type "json" (vLLM's choice, rendered as
    " json", not " <|constrain|>json"); one without, to its reasoning as `analysis` and its
    text content (if non-empty) as a `final` message.
  * a "tool" message becomes a message from author "functions.<name>" (the name found through
    tool_call_id) to "assistant" on `commentary`.
  * then every `analysis` message before the last assistant `final` message is dropped (the
    reasoning of completed turns; the current turn's reasoning, e.g. before a pending tool
    call, is kept), and the conversation is rendered for completion by an assistant with
    harmony's own auto_drop_analysis off (its filter only drops analysis before the first
    final, and only when the last assistant message is final: a subset of vLLM's).

Needs `pip install openai-harmony==0.0.8` and the o200k_base BPE file, which the package
downloads at run time unless $TIKTOKEN_ENCODINGS_BASE names a directory holding
o200k_base.tiktoken (sha256 checked by the package). Offline, the crates.io crate tiktoken-rs
ships it (assets/o200k_base.tiktoken); this script looks for it under ~/.cargo/registry/src
when the variable is unset. Run from anywhere:

    TIKTOKEN_ENCODINGS_BASE=/path/to/dir python3 scripts/make_harmony_fixtures.py
"""

import glob
import hashlib
import json
import os
import sys
from pathlib import Path

OUT_DIR = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "harmony"

O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
START_DATE = "2025-06-28"


def _locate_encodings() -> None:
    base = os.environ.get("TIKTOKEN_ENCODINGS_BASE")
    if not base:
        pattern = os.path.expanduser("~/.cargo/registry/src/*/tiktoken-rs-*/assets/o200k_base.tiktoken")
        found = sorted(glob.glob(pattern))
        if not found:
            sys.exit(
                "set TIKTOKEN_ENCODINGS_BASE to a directory holding o200k_base.tiktoken "
                "(e.g. the assets/ folder of the tiktoken-rs crate from crates.io)"
            )
        base = os.path.dirname(found[-1])
        os.environ["TIKTOKEN_ENCODINGS_BASE"] = base
    path = Path(base) / "o200k_base.tiktoken"
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != O200K_SHA256:
        sys.exit(f"{path}: sha256 {digest}, expected {O200K_SHA256}")


_locate_encodings()

from openai_harmony import (  # noqa: E402
    Author,
    Conversation,
    DeveloperContent,
    HarmonyEncodingName,
    Message,
    ReasoningEffort,
    RenderConversationConfig,
    Role,
    StreamableParser,
    SystemContent,
    TextContent,
    ToolDescription,
    load_harmony_encoding,
)

ENC = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)

EFFORT = {"low": ReasoningEffort.LOW, "medium": ReasoningEffort.MEDIUM, "high": ReasoningEffort.HIGH}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}

# Parameter schemas of every shape harmony's TypeScript rendering distinguishes: each JSON
# type, enums, defaults (strings with and without an enum, numbers, objects), nullable, type
# lists, oneOf at the top and at a property (descriptions shared or not, defaults, nullable
# variants), titles, examples, nested objects and arrays, multi-line descriptions, keys in
# non-alphabetical order, and schemas with no type at all.
SCHEMA_TOOLS = [
    {"type": "function", "function": {"name": "get_location", "description": "Gets the location of the user."}},
    {"type": "function", "function": {"name": "no_description", "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {"name": "untyped", "description": "Takes anything.", "parameters": {}}},
    {
        "type": "function",
        "function": {
            "name": "kinds",
            "description": "Line one of the tool.\nLine two of the tool.",
            "parameters": {
                "type": "object",
                "description": "The arguments.",
                "properties": {
                    "zeta": {"type": "integer", "description": "an int"},
                    "alpha": {"type": "number", "default": 1.5},
                    "flag": {"type": "boolean", "default": False},
                    "mode": {"type": "string", "enum": ["fast", "slow"], "default": "fast", "description": "how"},
                    "name": {"type": "string", "default": "anon"},
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "points": {
                        "type": "array",
                        "items": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
                    },
                    "loose": {"type": "array"},
                    "nested": {
                        "type": "object",
                        "description": "a nested object",
                        "properties": {"y": {"type": "string", "description": "why"}, "z": {"type": ["number", "null"]}},
                    },
                    "bag": {"type": "object"},
                    "maybe": {"type": ["string", "null"]},
                    "nullable_count": {"type": "integer", "nullable": True},
                    "either": {"anyOf": [{"type": "string"}, {"type": "null"}], "description": "any of two"},
                    "fixed": {"const": "x"},
                    "anything": {},
                    "options": {"type": "object", "default": {"b": 1, "a": [True, None]}},
                    "multi": {"type": "string", "description": "line one\nline two"},
                    "titled": {"type": "string", "title": "A Title", "examples": ["e1", "e2"]},
                    "weird": {"type": "date"},
                },
                "required": ["zeta", "flag", "points"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "unions",
            "description": "oneOf at a property.",
            "parameters": {
                "type": "object",
                "properties": {
                    "shared": {
                        "description": "same",
                        "oneOf": [{"type": "string", "description": "same"}, {"type": "integer", "description": "other"}],
                    },
                    "own": {
                        "description": "the property",
                        "default": "d",
                        "oneOf": [
                            {"type": "string", "description": "text", "default": "t"},
                            {"type": "number", "nullable": True, "default": 2},
                            {"type": "string", "enum": ["p", "q"], "default": "p"},
                        ],
                    },
                    "bare": {"oneOf": [{"type": "boolean"}, {"type": "object", "properties": {"k": {"type": "string"}}}]},
                },
                "required": ["shared"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "top_union",
            "description": "oneOf at the top.",
            "parameters": {
                "oneOf": [
                    {"type": "object", "properties": {"a": {"type": "string"}}, "description": "first", "default": "x"},
                    {"type": "string", "enum": ["e"], "default": "e", "nullable": True},
                    {"type": "number", "default": 3},
                ]
            },
        },
    },
]

RENDER_CASES = [
    {
        "name": "single_user_default_effort",
        "messages": [{"role": "user", "content": "What is 2+2?"}],
        "reasoning_effort": None,
    },
    {
        "name": "system_user_effort_high",
        "messages": [
            {"role": "system", "content": "You are a concise assistant."},
            {"role": "user", "content": "Name three primes."},
        ],
        "reasoning_effort": "high",
    },
    {
        "name": "developer_multi_turn_effort_low",
        "messages": [
            {"role": "developer", "content": "Answer in French.\nKeep it short."},
            {"role": "user", "content": "Hi!"},
            {"role": "assistant", "content": "Bonjour !"},
            {"role": "user", "content": "How are you?"},
        ],
        "reasoning_effort": "low",
    },
    {
        # The reasoning of a completed turn is dropped: only the final answer stays.
        "name": "prior_assistant_with_reasoning",
        "messages": [
            {"role": "user", "content": "Pick a number."},
            {
                "role": "assistant",
                "content": "I picked 7.",
                "reasoning_content": "The user wants a number. 7 is fine.",
            },
            {"role": "user", "content": "Double it."},
        ],
        "reasoning_effort": None,
    },
    {
        # Two completed turns with reasoning: both analyses dropped (harmony's own filter
        # would keep the second one; vLLM's drops every analysis before the last final).
        "name": "two_prior_turns_with_reasoning",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "A", "reasoning_content": "upper-case a"},
            {"role": "user", "content": "b"},
            {"role": "assistant", "content": "B", "reasoning_content": "upper-case b"},
            {"role": "user", "content": "c"},
        ],
        "reasoning_effort": "medium",
    },
    {
        # A system message after the first becomes a developer message in place.
        "name": "later_system_message",
        "messages": [
            {"role": "system", "content": "First rule."},
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": "Hi there."},
            {"role": "system", "content": "Second rule."},
            {"role": "user", "content": "Again"},
        ],
        "reasoning_effort": None,
    },
    {
        "name": "user_content_parts",
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "Part one. "}, {"type": "text", "text": "Part two."}],
            }
        ],
        "reasoning_effort": None,
    },
    {
        # Function tools: the developer message carries them, the system message gains the
        # "Calls to these tools must go to the commentary channel" line. The turn is in
        # progress (no final after the tool call), so its reasoning is kept.
        "name": "tool_call_in_progress",
        "messages": [
            {"role": "system", "content": "Use tools when useful."},
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "Need the weather tool.",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c":21}'},
        ],
        "reasoning_effort": None,
        "tools": [WEATHER_TOOL],
    },
    {
        # Tools without instructions: the developer message holds the tools alone.
        "name": "tool_schemas",
        "messages": [{"role": "user", "content": "Use any tool."}],
        "reasoning_effort": "low",
        "tools": SCHEMA_TOOLS,
    },
    {
        # tool_choice "none": the tools are not offered, and neither line about them is there.
        "name": "tool_choice_none",
        "messages": [
            {"role": "system", "content": "Be helpful."},
            {"role": "user", "content": "Weather in Paris?"},
        ],
        "reasoning_effort": None,
        "tools": [WEATHER_TOOL],
        "tool_choice": "none",
    },
    {
        # A finished turn of two calls, with a preamble and reasoning, then the answer: the
        # reasoning before that final answer is dropped, the calls and results stay.
        "name": "completed_tool_turn",
        "messages": [
            {"role": "user", "content": "Weather in Paris and Rome?"},
            {
                "role": "assistant",
                "content": "Checking both cities.",
                "reasoning_content": "Two calls needed.",
                "tool_calls": [
                    {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
                    {"id": "b", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome", "unit": "celsius"}'}},
                ],
            },
            {"role": "tool", "tool_call_id": "a", "content": "21"},
            {"role": "tool", "tool_call_id": "b", "content": [{"type": "text", "text": "2"}, {"type": "text", "text": "5"}]},
            {"role": "assistant", "content": "Paris 21, Rome 25.", "reasoning_content": "Both known."},
            {"role": "user", "content": "Thanks. And Oslo?"},
        ],
        "reasoning_effort": "high",
        "tools": [WEATHER_TOOL],
        "tool_choice": "auto",
    },
]

PARSE_CASES = [
    {"name": "final_only", "completion": "<|channel|>final<|message|>Hello!<|return|>"},
    {
        "name": "analysis_then_final",
        "completion": "<|channel|>analysis<|message|>User says hi. Respond politely.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Hello! How can I help?<|return|>",
    },
    {
        "name": "analysis_then_tool_call",
        "completion": "<|channel|>analysis<|message|>Need weather for Tokyo.<|end|>"
        '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Tokyo"}<|call|>',
    },
    {
        # Recipient before the channel, as harmony itself renders tool calls in history.
        "name": "tool_call_recipient_first",
        "completion": '<|channel|>commentary to=functions.get_weather<|constrain|>json<|message|>{"city":"Oslo","unit":"celsius"}<|call|>',
    },
    {
        "name": "preamble_then_tool_call",
        "completion": "<|channel|>commentary<|message|>Let me check the weather.<|end|>"
        '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Rome"}<|call|>',
    },
    {
        # No stop token (max_tokens reached): the open message is closed at end of stream.
        "name": "truncated_in_analysis",
        "completion": "<|channel|>analysis<|message|>Let me think about",
    },
    {
        "name": "unicode_final",
        "completion": "<|channel|>analysis<|message|>Greet in Japanese.<|end|><|start|>assistant<|channel|>final<|message|>こんにちは 🌸 héllo<|return|>",
    },
]


# ---------------------------------------------------------------------------------------------
# OpenAI request -> harmony messages (vLLM's mapping)
# ---------------------------------------------------------------------------------------------


def _flatten(content):
    if content is None or isinstance(content, str):
        return content
    texts = [p if isinstance(p, str) else p.get("text") for p in content]
    texts = [t for t in texts if t is not None]
    return "".join(texts) if texts else None


def _developer_message(instructions, tools):
    dev = DeveloperContent.new()
    if instructions is not None:
        dev = dev.with_instructions(instructions)
    fn_tools = [t for t in (tools or []) if t.get("type") == "function"]
    if fn_tools:
        dev = dev.with_function_tools(
            [
                ToolDescription.new(
                    name=t["function"]["name"],
                    description=t["function"].get("description") or "",
                    parameters=t["function"].get("parameters"),
                )
                for t in fn_tools
            ]
        )
    return Message.from_role_and_content(Role.DEVELOPER, dev)


def _reasoning(msg):
    return msg.get("reasoning_content") or msg.get("reasoning")


def _convert(msg, tool_names):
    role = msg["role"]
    out = []
    if role == "assistant" and msg.get("tool_calls"):
        content = _flatten(msg.get("content"))
        if content:
            out.append(Message.from_role_and_content(Role.ASSISTANT, content).with_channel("commentary"))
        if _reasoning(msg):
            out.append(Message.from_role_and_content(Role.ASSISTANT, _reasoning(msg)).with_channel("analysis"))
        for call in msg["tool_calls"]:
            fn = call.get("function", {})
            out.append(
                Message.from_role_and_content(Role.ASSISTANT, fn.get("arguments") or "")
                .with_channel("commentary")
                .with_recipient(f"functions.{fn.get('name', '')}")
                .with_content_type("json")
            )
        return out
    if role == "tool":
        name = tool_names.get(msg.get("tool_call_id", ""), "")
        content = _flatten(msg.get("content")) or ""
        return [
            Message.from_author_and_content(Author.new(Role.TOOL, f"functions.{name}"), content)
            .with_channel("commentary")
            .with_recipient("assistant")
        ]
    if role == "assistant" and _reasoning(msg):
        out.append(Message.from_role_and_content(Role.ASSISTANT, _reasoning(msg)).with_channel("analysis"))
    content = msg.get("content") or ""
    if isinstance(content, str):
        contents = [TextContent(text=content)]
    else:
        contents = [TextContent(text=p.get("text", "")) for p in content]
    if role == "assistant":
        if contents and contents[0].text:
            out.append(Message.from_role_and_contents(Role.ASSISTANT, contents).with_channel("final"))
    elif role in ("system", "developer"):
        instructions = _flatten(msg.get("content"))
        if instructions is not None:
            out.append(_developer_message(instructions, None))
    else:
        out.append(Message.from_role_and_contents(Role(role), contents))
    return out


def _drop_completed_analysis(msgs):
    last_final = -1
    for i in range(len(msgs) - 1, -1, -1):
        if msgs[i].author.role == Role.ASSISTANT and msgs[i].channel == "final":
            last_final = i
            break
    return [m for i, m in enumerate(msgs) if not (i < last_final and m.channel == "analysis")]


def request_to_harmony(messages, reasoning_effort, tools, tool_choice=None):
    # vLLM offers the tools only where tool_choice is not "none".
    if tool_choice == "none":
        tools = None
    messages = list(messages)
    instructions = None
    if messages and messages[0]["role"] in ("system", "developer"):
        instructions = _flatten(messages[0].get("content"))
        messages = messages[1:]

    system = SystemContent.new()
    if reasoning_effort is not None:
        system = system.with_reasoning_effort(EFFORT[reasoning_effort])
    system = system.with_conversation_start_date(START_DATE)
    out = [Message.from_role_and_content(Role.SYSTEM, system)]
    if instructions or tools:
        out.append(_developer_message(instructions, tools))

    tool_names = {}
    for m in messages:
        for call in m.get("tool_calls") or []:
            tool_names[call.get("id")] = call.get("function", {}).get("name")
    body = []
    for m in messages:
        body.extend(_convert(m, tool_names))
    return out + _drop_completed_analysis(body)


def render_case(case):
    tools = case.get("tools")
    harmony = request_to_harmony(case["messages"], case["reasoning_effort"], tools, case.get("tool_choice"))
    ids = ENC.render_conversation_for_completion(
        Conversation.from_messages(harmony),
        Role.ASSISTANT,
        config=RenderConversationConfig(auto_drop_analysis=False),
    )
    rendered = ENC.decode_utf8(ids)
    assert rendered.endswith("<|start|>assistant")
    return {
        "name": case["name"],
        "messages": case["messages"],
        "reasoning_effort": case["reasoning_effort"],
        "tools": tools,
        "tool_choice": case.get("tool_choice"),
        "rendered": rendered,
        "prompt_token_ids": ids,
    }


# ---------------------------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------------------------


def _message_json(m):
    return {
        "role": m.author.role.value,
        "name": m.author.name,
        "channel": m.channel,
        "recipient": m.recipient,
        "content_type": m.content_type,
        "content": "".join(c.text for c in m.content),
    }


def parse_case(case):
    ids = ENC.encode(case["completion"], allowed_special="all")
    assert ENC.decode_utf8(ids) == case["completion"]
    messages = ENC.parse_messages_from_completion_tokens(ids, Role.ASSISTANT)

    parser = StreamableParser(ENC, Role.ASSISTANT)
    stream = []
    for t in ids:
        parser.process(t)
        stream.append(
            {
                "token": t,
                "state": parser.state.value,
                "channel": parser.current_channel,
                "recipient": parser.current_recipient,
                "delta": parser.last_content_delta,
            }
        )
    parser.process_eos()
    assert [_message_json(m) for m in parser.messages] == [_message_json(m) for m in messages]
    return {
        "name": case["name"],
        "completion": case["completion"],
        "completion_token_ids": ids,
        "messages": [_message_json(m) for m in messages],
        "stream": stream,
    }


def special_tokens():
    names = [
        "<|startoftext|>",
        "<|endoftext|>",
        "<|return|>",
        "<|constrain|>",
        "<|channel|>",
        "<|start|>",
        "<|end|>",
        "<|message|>",
        "<|call|>",
    ]
    out = {}
    for name in names:
        ids = ENC.encode(name, allowed_special="all")
        assert len(ids) == 1 and ENC.is_special_token(ids[0]), name
        out[name] = ids[0]
    return out


def main():
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    renders = [render_case(c) for c in RENDER_CASES]
    specials = special_tokens()
    reserved = {i: ENC.decode_utf8([i]) for i in (200000, 200001, 200004, 200009, 200013, 200014, 201088)}
    parses = {
        "encoding": str(HarmonyEncodingName.HARMONY_GPT_OSS),
        "special_tokens": specials,
        "reserved_examples": {v: k for k, v in reserved.items()},
        "stop_tokens": sorted(ENC.stop_tokens()),
        "stop_tokens_for_assistant_actions": sorted(ENC.stop_tokens_for_assistant_actions()),
        "cases": [parse_case(c) for c in PARSE_CASES],
    }
    for r in renders:
        r["conversation_start_date"] = START_DATE
    (OUT_DIR / "renders.json").write_text(_dumps(renders) + "\n", encoding="utf-8")
    (OUT_DIR / "parses.json").write_text(_dumps({"openai_harmony": _harmony_version(), **parses}) + "\n", encoding="utf-8")
    print(f"wrote {len(renders)} render cases and {len(parses['cases'])} parse cases to {OUT_DIR}")


def _dumps(value, indent=""):
    """JSON with one key or item a line, but lists of numbers and small objects on one line."""
    inner = indent + " "
    flat = json.dumps(value, ensure_ascii=False)
    if not isinstance(value, (dict, list)) or len(flat) <= 160 or (
        isinstance(value, list) and all(isinstance(v, int) for v in value)
    ):
        return flat
    if isinstance(value, dict):
        items = [f"{inner}{json.dumps(k)}: {_dumps(v, inner)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    items = [inner + _dumps(v, inner) for v in value]
    return "[\n" + ",\n".join(items) + "\n" + indent + "]"


def _harmony_version():
    from importlib.metadata import version

    return version("openai-harmony")


if __name__ == "__main__":
    main()
