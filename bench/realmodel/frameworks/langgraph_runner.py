#!/usr/bin/env python3
"""The benchmark's suite through LangGraph's prebuilt ReAct agent (bench/realmodel/README.md).

    python frameworks/langgraph_runner.py suite.toml --base-url URL --model NAME --repeat N --json OUT

Wiring: `langgraph.prebuilt.create_react_agent` over langchain-openai's `ChatOpenAI`
(Chat Completions, not streamed, no temperature: the server's default) whose AsyncOpenAI
client uses the harness's metered HTTP client. The model is bound to Loom's tool
definitions as they are (tools.json, passed through `bind(tools=...)`: `bind_tools`
would re-derive the schemas and drop parts of them); the agent's ToolNode runs one
`StructuredTool` per tool, which hands the arguments to the harness.

The step limit: left to itself the prebuilt agent counts graph steps (a model turn is
one, a round of tool calls another) and, when fewer than two remain, replaces the model's
calls with "Sorry, need more steps to process this request." — the last turn's calls
would never run, and an odd limit would buy the model one more turn than the others get.
So the model is handed over by a function (create_react_agent's dynamic model) that
refuses the turn after the last allowed one (MAX_STEPS), and the recursion limit is set
one step above what max_steps turns and their tool rounds need, so it never cuts first.
"""

import os
import sys
import warnings

from langchain_core.messages import AIMessage
from langchain_core.tools import StructuredTool
from langchain_openai import ChatOpenAI
from langgraph.errors import GraphRecursionError
from langgraph.prebuilt import create_react_agent

import harness

# LangGraph 1.x marks create_react_agent as moved to langchain.agents.create_agent (another
# package); the prebuilt one is still LangGraph's own and what this runner measures.
warnings.filterwarnings("ignore", message="create_react_agent has been moved")


class StepLimit(Exception):
    pass


def _tool(toolbox: harness.Toolbox, spec: dict) -> StructuredTool:
    name = spec["function"]["name"]

    async def call(**arguments):
        return await toolbox.acall(name, arguments)

    return StructuredTool(name=name, description=spec["function"].get("description", ""),
                          args_schema=spec["function"].get("parameters", {"type": "object"}),
                          coroutine=call)


def _final_text(messages) -> str | None:
    for message in reversed(messages):
        if isinstance(message, AIMessage):
            content = message.content
            if isinstance(content, list):
                content = "".join(part.get("text", "") if isinstance(part, dict) else str(part)
                                  for part in content)
            return content
    return None


async def run(attempt: harness.Attempt) -> harness.Outcome:
    model = ChatOpenAI(model=attempt.model, base_url=attempt.base_url,
                       api_key=os.environ.get("OPENAI_API_KEY") or "local",
                       http_async_client=attempt.http_client)
    tools = [_tool(attempt.tools, spec) for spec in attempt.tools.specs]
    # bind(), not bind_tools(): bind_tools re-derives each schema (dropping, for one, the
    # parameters' own description), and the model must see Loom's definitions as they are.
    bound = model.bind(tools=attempt.tools.specs) if tools else model
    turns = 0

    def next_turn(state, runtime):
        nonlocal turns
        turns += 1
        if turns > attempt.max_steps:
            raise StepLimit(f"the model had its {attempt.max_steps} turns")
        return bound

    agent = create_react_agent(next_turn, tools, prompt=attempt.instructions)
    try:
        state = await agent.ainvoke({"messages": [("user", attempt.case.prompt)]},
                                    config={"recursion_limit": 2 * attempt.max_steps + 1})
    except StepLimit as err:
        return harness.Outcome(harness.MAX_STEPS, error=str(err))
    except GraphRecursionError as err:
        return harness.Outcome(harness.MAX_STEPS, error=str(err).splitlines()[0])
    return harness.Outcome(harness.DONE, answer=_final_text(state["messages"]))


if __name__ == "__main__":
    sys.exit(harness.main("langgraph", run))
