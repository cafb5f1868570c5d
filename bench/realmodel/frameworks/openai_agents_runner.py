#!/usr/bin/env python3
"""The benchmark's suite through the OpenAI Agents SDK (bench/realmodel/README.md).

    python frameworks/openai_agents_runner.py suite.toml --base-url URL --model NAME --repeat N --json OUT

Wiring: an `Agent` on `OpenAIChatCompletionsModel` (Chat Completions: the server has no
Responses API) over an AsyncOpenAI client that uses the harness's metered HTTP client;
tracing off (nothing leaves the machine). One `FunctionTool` per tool of the case with
Loom's name, description and JSON schema (tools.json) as `params_json_schema`,
`strict_json_schema=False` (the schema is sent as Loom sends it, not rewritten into
OpenAI's strict form); `on_invoke_tool` hands the raw argument text to the harness.
`Runner.run` (not streamed), default model settings (no temperature: the server's
default), `max_turns=max_steps`: MaxTurnsExceeded is MAX_STEPS. A call of a tool that
does not exist is answered to the model (`tool_not_found_behavior =
"return_error_to_model"`) instead of ending the run, as Loom answers it.
"""

import os
import sys

from agents import (Agent, FunctionTool, MaxTurnsExceeded, OpenAIChatCompletionsModel, RunConfig,
                    Runner, set_tracing_disabled)
from openai import AsyncOpenAI

import harness

set_tracing_disabled(True)


def _tool(toolbox: harness.Toolbox, spec: dict) -> FunctionTool:
    name = spec["function"]["name"]

    async def invoke(_context, arguments: str) -> str:
        return await toolbox.acall(name, arguments)

    return FunctionTool(name=name, description=spec["function"].get("description", ""),
                        params_json_schema=spec["function"].get("parameters", {"type": "object"}),
                        on_invoke_tool=invoke, strict_json_schema=False)


async def run(attempt: harness.Attempt) -> harness.Outcome:
    client = AsyncOpenAI(base_url=attempt.base_url, api_key=os.environ.get("OPENAI_API_KEY") or "local",
                         http_client=attempt.http_client)
    agent = Agent(name="agent", instructions=attempt.instructions,
                  model=OpenAIChatCompletionsModel(model=attempt.model, openai_client=client),
                  tools=[_tool(attempt.tools, spec) for spec in attempt.tools.specs])
    config = RunConfig(tracing_disabled=True, tool_not_found_behavior="return_error_to_model")
    try:
        result = await Runner.run(agent, attempt.case.prompt, max_turns=attempt.max_steps, run_config=config)
    except MaxTurnsExceeded as err:
        return harness.Outcome(harness.MAX_STEPS, error=str(err))
    output = result.final_output
    return harness.Outcome(harness.DONE, answer=None if output is None else str(output))


if __name__ == "__main__":
    sys.exit(harness.main("openai-agents", run))
