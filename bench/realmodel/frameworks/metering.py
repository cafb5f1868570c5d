"""The model's traffic of one attempt, counted at the HTTP layer (bench/realmodel/README.md).

Every framework's OpenAI client sends its requests through MeteredTransport, so model
calls, prompt and completion tokens (from the usage each response reports, streamed or
not) and the tool names the model asked for are counted the same way for all of them,
whatever a framework keeps to itself or retries.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import httpx2

@dataclass
class ModelCall:
    status_code: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tool_names: list[str] = field(default_factory=list)
    finished: bool = False


class Meter:
    """What one attempt sent the model and got back, counted from the HTTP traffic."""

    def __init__(self, keep_bodies: bool = False):
        self.calls: list[ModelCall] = []
        self.bodies: list[dict] = []
        self.keep_bodies = keep_bodies

    @property
    def prompt_tokens(self) -> int:
        return sum(c.prompt_tokens for c in self.calls)

    @property
    def completion_tokens(self) -> int:
        return sum(c.completion_tokens for c in self.calls)

    @property
    def steps(self) -> int:
        """Model turns: calls the server answered."""
        return sum(1 for c in self.calls if 200 <= c.status_code < 300)

    @property
    def tools_called(self) -> list[str]:
        return [name for c in self.calls for name in c.tool_names]


class _Recording(httpx2.AsyncByteStream):
    """Passes a response body through unchanged and reads usage and tool calls from it
    once it has been read (plain JSON or server-sent events alike)."""

    def __init__(self, inner, call: ModelCall, streamed: bool):
        self.inner, self.call, self.streamed = inner, call, streamed
        self.parts: list[bytes] = []

    async def __aiter__(self):
        async for chunk in self.inner:
            self.parts.append(chunk)
            yield chunk
        self._finish()

    async def aclose(self):
        self._finish()
        await self.inner.aclose()

    def _finish(self):
        if self.call.finished:
            return
        self.call.finished = True
        raw = b"".join(self.parts)
        try:
            if self.streamed:
                _read_sse(raw, self.call)
            else:
                _read_json(json.loads(raw), self.call)
        except (ValueError, KeyError, TypeError, AttributeError):
            pass  # an error body or a cut stream: nothing to count


def _usage_into(usage: dict | None, call: ModelCall):
    if usage:
        call.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        call.completion_tokens = int(usage.get("completion_tokens") or 0)


def _read_json(data: dict, call: ModelCall):
    _usage_into(data.get("usage"), call)
    for choice in data.get("choices") or []:
        for tc in (choice.get("message") or {}).get("tool_calls") or []:
            call.tool_names.append((tc.get("function") or {}).get("name") or "")


def _read_sse(raw: bytes, call: ModelCall):
    names: dict[int, str] = {}
    for line in raw.decode("utf-8", "replace").splitlines():
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if not payload or payload == "[DONE]":
            continue
        chunk = json.loads(payload)
        if chunk.get("usage"):
            _usage_into(chunk["usage"], call)
        for choice in chunk.get("choices") or []:
            for tc in (choice.get("delta") or {}).get("tool_calls") or []:
                name = (tc.get("function") or {}).get("name")
                if name:  # a name may come in pieces; each call has its own index
                    index = tc.get("index", 0)
                    names[index] = names.get(index, "") + name
    call.tool_names.extend(names[i] for i in sorted(names))


class MeteredTransport(httpx2.AsyncBaseTransport):
    """The HTTP transport under every framework's OpenAI client: it sees each chat
    request and its response, whatever the framework makes of them."""

    def __init__(self, meter: Meter):
        self.meter = meter
        self.inner = httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request):
        if not request.url.path.endswith("/chat/completions"):
            return await self.inner.handle_async_request(request)
        body = {}
        try:
            body = json.loads(await request.aread() or b"{}")
        except ValueError:
            pass
        if self.meter.keep_bodies:
            self.meter.bodies.append(body)
        call = ModelCall()
        self.meter.calls.append(call)
        response = await self.inner.handle_async_request(request)
        call.status_code = response.status_code
        streamed = "text/event-stream" in response.headers.get("content-type", "")
        return httpx2.Response(
            status_code=response.status_code, headers=response.headers,
            stream=_Recording(response.stream, call, streamed),
            extensions=response.extensions, request=request,
        )

    async def aclose(self):
        await self.inner.aclose()
