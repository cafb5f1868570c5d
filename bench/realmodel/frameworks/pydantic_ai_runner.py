#!/usr/bin/env python3
"""The benchmark's suite through pydantic-ai (bench/realmodel/README.md).

    python frameworks/pydantic_ai_runner.py suite.toml --base-url URL --model NAME --repeat N --json OUT

Wiring: an `OpenAIChatModel` (Chat Completions) on an `OpenAIProvider` whose AsyncOpenAI
client uses the harness's metered HTTP client; one `Tool.from_schema` per tool of the case,
with Loom's name, description and JSON schema (tools.json) and a function that calls the
harness's implementation. `agent.run` (not streamed), no model settings (no temperature:
the server's default), `UsageLimits(request_limit=max_steps)`: the request after the
last allowed turn raises UsageLimitExceeded, reported as MAX_STEPS. pydantic-ai's retries
(an unknown tool name, arguments that are not JSON, an empty answer) are raised to the
step limit, so that, as in Loom, the step limit ends a run and not a retry budget of 1.
"""

import os
import sys

from pydantic_ai import Agent, Tool
from pydantic_ai.exceptions import UsageLimitExceeded
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.usage import UsageLimits
from openai import AsyncOpenAI

import harness


def _tool(toolbox: harness.Toolbox, spec: dict) -> Tool:
    name = spec["function"]["name"]

    async def call(**arguments):
        return await toolbox.acall(name, arguments)

    return Tool.from_schema(call, name=name, description=spec["function"].get("description"),
                            json_schema=spec["function"].get("parameters", {"type": "object"}))


async def run(attempt: harness.Attempt) -> harness.Outcome:
    client = AsyncOpenAI(base_url=attempt.base_url, api_key=os.environ.get("OPENAI_API_KEY") or "local",
                         http_client=attempt.http_client)
    model = OpenAIChatModel(attempt.model, provider=OpenAIProvider(openai_client=client))
    agent = Agent(model, instructions=attempt.instructions,
                  tools=[_tool(attempt.tools, spec) for spec in attempt.tools.specs],
                  retries=attempt.max_steps)
    try:
        result = await agent.run(attempt.case.prompt,
                                 usage_limits=UsageLimits(request_limit=attempt.max_steps))
    except UsageLimitExceeded as err:
        return harness.Outcome(harness.MAX_STEPS, error=str(err))
    return harness.Outcome(harness.DONE, answer=str(result.output))


if __name__ == "__main__":
    sys.exit(harness.main("pydantic-ai", run))
