#!/usr/bin/env python3
"""The benchmark's suite through a hand-written agent loop over the `openai` client: what
a user writes when they pick no framework (bench/realmodel/README.md).

    python frameworks/bare_loop.py suite.toml --base-url URL --model NAME --repeat N --json OUT

The loop: send the conversation with the case's tools (Loom's definitions, tools.json);
run every call of the answer in order and send the results back; an answer without calls
is the final answer. Ten model turns at most (the case's max_steps), then MAX_STEPS.
No temperature is sent: the server's default, as Loom does.
"""

import os
import sys

from openai import NOT_GIVEN, AsyncOpenAI

import harness


async def run(attempt: harness.Attempt) -> harness.Outcome:
    client = AsyncOpenAI(base_url=attempt.base_url, api_key=os.environ.get("OPENAI_API_KEY") or "local",
                         http_client=attempt.http_client)
    messages = [
        {"role": "system", "content": attempt.instructions},
        {"role": "user", "content": attempt.case.prompt},
    ]
    last_text = None
    for _ in range(attempt.max_steps):
        response = await client.chat.completions.create(
            model=attempt.model, messages=messages, tools=attempt.tools.specs or NOT_GIVEN)
        message = response.choices[0].message
        calls = message.tool_calls or []
        last_text = message.content
        if not calls:
            return harness.Outcome(harness.DONE, answer=message.content or "")
        messages.append({
            "role": "assistant",
            "content": message.content,
            "tool_calls": [{"id": c.id, "type": "function",
                            "function": {"name": c.function.name, "arguments": c.function.arguments}}
                           for c in calls],
        })
        for call in calls:
            # Unknown names and bad arguments come back as an error text the model can act on.
            result = await attempt.tools.acall(call.function.name, call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return harness.Outcome(harness.MAX_STEPS, answer=last_text)


if __name__ == "__main__":
    sys.exit(harness.main("bare-loop", run))
