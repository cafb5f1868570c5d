#!/usr/bin/env python3
"""Loom MCP fixture server: a tiny, misbehaving-on-purpose MCP server.

Standard library only. Speaks the MCP stdio transport: newline-delimited
JSON-RPC 2.0 messages on stdin/stdout, diagnostics on stderr.

    python3 tests/mcp/fixture_server.py

Environment:
    LOOM_FIXTURE_LOG  if set, a file to which the server appends one line per
                      event, flushed at once:
                        method <name>                 each message with a method
                        cancelled <requestId> <reason> each notifications/cancelled
                      (<reason> is "-" when the notification carries none)

Tools (see TOOLS below for the input schemas):
    echo {text}        text content equal to `text`
    hang {}            never answers; the server keeps reading stdin
    crash {}           one line to stderr, then exit code 3 without answering
    flood {bytes}      ~1 MiB of junk lines to stderr, then `bytes` 'x' chars
    fork_child {}      spawns `sleep 300` in the server's process group,
                       answers "child <pid>"
    bad_schema {}      its inputSchema is not a valid JSON Schema
    env {}             the environment as sorted NAME=VALUE lines
    add_tool {}        adds the tool `added`, sends
                       notifications/tools/list_changed, then answers
    error_result {}    isError: true, text "it failed"
    sleep {seconds}    answers "slept <seconds>" after sleeping (in a thread)

Every tools/call runs in its own thread, so the server keeps reading stdin
(and answering ping, tools/list, other calls, cancellations) meanwhile. A call
that was cancelled with notifications/cancelled before it finished gets no
response. Unknown method: error -32601. Unknown tool or bad arguments: -32602.
The server exits 0 when stdin reaches EOF.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time

SUPPORTED_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
DEFAULT_VERSION = "2025-06-18"

_out_lock = threading.Lock()
_log_lock = threading.Lock()
_state_lock = threading.Lock()
_cancelled = set()  # request ids (as JSON text) cancelled by the client
_children = []  # Popen objects of fork_child, kept so they are not collected


def _empty_schema():
    return {"type": "object", "properties": {}}


TOOLS = [
    {
        "name": "echo",
        "description": "Returns the given text unchanged.",
        "inputSchema": {
            "type": "object",
            "properties": {"text": {"type": "string", "description": "Text to echo"}},
            "required": ["text"],
        },
    },
    {
        "name": "hang",
        "description": "Never answers (until cancelled).",
        "inputSchema": _empty_schema(),
    },
    {
        "name": "crash",
        "description": "Exits the server with code 3 in the middle of the call.",
        "inputSchema": _empty_schema(),
    },
    {
        "name": "flood",
        "description": "Writes ~1 MiB to stderr, then returns `bytes` 'x' characters.",
        "inputSchema": {
            "type": "object",
            "properties": {"bytes": {"type": "integer", "minimum": 0}},
            "required": ["bytes"],
        },
    },
    {
        "name": "fork_child",
        "description": "Starts `sleep 300` in the server's process group; returns 'child <pid>'.",
        "inputSchema": _empty_schema(),
    },
    {
        "name": "bad_schema",
        "description": "A tool whose inputSchema is not a valid JSON Schema.",
        "inputSchema": {
            "type": "object",
            "properties": {"x": {"type": "not-a-type"}},
        },
    },
    {
        "name": "env",
        "description": "Returns the server's environment as sorted NAME=VALUE lines.",
        "inputSchema": _empty_schema(),
    },
    {
        "name": "add_tool",
        "description": "Adds the tool 'added' and sends notifications/tools/list_changed.",
        "inputSchema": _empty_schema(),
    },
    {
        "name": "error_result",
        "description": "Returns a tool result with isError: true.",
        "inputSchema": _empty_schema(),
    },
    {
        "name": "sleep",
        "description": "Answers after sleeping the given number of seconds.",
        "inputSchema": {
            "type": "object",
            "properties": {"seconds": {"type": "number", "minimum": 0}},
            "required": ["seconds"],
        },
    },
]

ADDED_TOOL = {
    "name": "added",
    "description": "Exists only after add_tool was called.",
    "inputSchema": _empty_schema(),
}


class ToolError(Exception):
    """Raised by a tool to answer with a JSON-RPC error."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message


# ---------------------------------------------------------------- output


def _send(message):
    data = (json.dumps(message, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")
    with _out_lock:
        try:
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
        except (BrokenPipeError, OSError):
            # The client is gone: nothing left to do.
            os._exit(0)


def _result(req_id, result):
    _send({"jsonrpc": "2.0", "id": req_id, "result": result})


def _error(req_id, code, message):
    _send({"jsonrpc": "2.0", "id": req_id, "error": {"code": code, "message": message}})


def _log(line):
    path = os.environ.get("LOOM_FIXTURE_LOG")
    if not path:
        return
    with _log_lock:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()


def _text(text, is_error=False):
    return {"content": [{"type": "text", "text": text}], "isError": is_error}


def _id_key(req_id):
    return json.dumps(req_id)


# ---------------------------------------------------------------- tools


def _arg(args, name, kinds, what):
    value = args.get(name)
    if not isinstance(value, kinds) or isinstance(value, bool):
        raise ToolError(-32602, "Invalid arguments: '%s' must be %s" % (name, what))
    return value


def tool_echo(req_id, args):
    return _text(_arg(args, "text", str, "a string"))


def tool_hang(req_id, args):
    return None  # never answered


def tool_crash(req_id, args):
    sys.stderr.write("loom-fixture: crashing on purpose\n")
    sys.stderr.flush()
    os._exit(3)


def tool_flood(req_id, args):
    n = _arg(args, "bytes", int, "a non-negative integer")
    if n < 0:
        raise ToolError(-32602, "Invalid arguments: 'bytes' must be a non-negative integer")
    line = "junk " + "z" * 58 + "\n"  # 64 bytes
    chunk = line * 1024  # 64 KiB
    for _ in range(16):  # 1 MiB in total
        sys.stderr.write(chunk)
    sys.stderr.flush()
    return _text("x" * n)


def tool_fork_child(req_id, args):
    child = subprocess.Popen(
        ["sleep", "300"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    with _state_lock:
        _children.append(child)
    return _text("child %d" % child.pid)


def tool_bad_schema(req_id, args):
    return _text("bad_schema called")


def tool_env(req_id, args):
    return _text("\n".join("%s=%s" % (k, v) for k, v in sorted(os.environ.items())))


def tool_add_tool(req_id, args):
    with _state_lock:
        if not any(t["name"] == "added" for t in TOOLS):
            TOOLS.append(ADDED_TOOL)
    _send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
    return _text("tool added")


def tool_added(req_id, args):
    return _text("added works")


def tool_error_result(req_id, args):
    return _text("it failed", is_error=True)


def tool_sleep(req_id, args):
    seconds = _arg(args, "seconds", (int, float), "a non-negative number")
    if seconds < 0:
        raise ToolError(-32602, "Invalid arguments: 'seconds' must be a non-negative number")
    time.sleep(seconds)
    return _text("slept %s" % seconds)


HANDLERS = {
    "echo": tool_echo,
    "hang": tool_hang,
    "crash": tool_crash,
    "flood": tool_flood,
    "fork_child": tool_fork_child,
    "bad_schema": tool_bad_schema,
    "env": tool_env,
    "add_tool": tool_add_tool,
    "added": tool_added,
    "error_result": tool_error_result,
    "sleep": tool_sleep,
}


def _tool_exists(name):
    with _state_lock:
        return any(t["name"] == name for t in TOOLS)


def _run_tool(req_id, name, args):
    try:
        result = HANDLERS[name](req_id, args)
    except ToolError as e:
        _error(req_id, e.code, e.message)
        return
    except Exception as e:  # a bug in the fixture: still answer
        _error(req_id, -32603, "Internal error: %r" % (e,))
        return
    if result is None:
        return
    with _state_lock:
        if _id_key(req_id) in _cancelled:
            return  # cancelled requests get no response
    _result(req_id, result)


# ---------------------------------------------------------------- dispatch


def _initialize(req_id, params):
    requested = params.get("protocolVersion") if isinstance(params, dict) else None
    version = requested if requested in SUPPORTED_VERSIONS else DEFAULT_VERSION
    _result(
        req_id,
        {
            "protocolVersion": version,
            "capabilities": {"tools": {"listChanged": True}},
            "serverInfo": {"name": "loom-fixture", "version": "1.0"},
        },
    )


def _tools_list(req_id, params):
    with _state_lock:
        tools = json.loads(json.dumps(TOOLS))
    _result(req_id, {"tools": tools})


def _tools_call(req_id, params):
    if not isinstance(params, dict) or not isinstance(params.get("name"), str):
        _error(req_id, -32602, "Invalid params: missing tool name")
        return
    name = params["name"]
    args = params.get("arguments")
    if args is None:
        args = {}
    if not isinstance(args, dict):
        _error(req_id, -32602, "Invalid params: arguments must be an object")
        return
    if name not in HANDLERS or not _tool_exists(name):
        _error(req_id, -32602, "Unknown tool: %s" % name)
        return
    threading.Thread(target=_run_tool, args=(req_id, name, args), daemon=True).start()


def _notification(method, params):
    if method == "notifications/cancelled":
        params = params if isinstance(params, dict) else {}
        req_id = params.get("requestId")
        reason = params.get("reason")
        with _state_lock:
            _cancelled.add(_id_key(req_id))
        _log("cancelled %s %s" % (req_id, reason if reason else "-"))
    # notifications/initialized and anything else: nothing to do


def _handle(message):
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
        _error(None, -32600, "Invalid Request")
        return
    method = message.get("method")
    if method is None:
        return  # a response to a request we never sent: ignore
    if not isinstance(method, str):
        _error(message.get("id"), -32600, "Invalid Request")
        return
    _log("method %s" % method)
    params = message.get("params")
    if "id" not in message:
        _notification(method, params)
        return
    req_id = message["id"]
    if method == "initialize":
        _initialize(req_id, params)
    elif method == "ping":
        _result(req_id, {})
    elif method == "tools/list":
        _tools_list(req_id, params)
    elif method == "tools/call":
        _tools_call(req_id, params)
    else:
        _error(req_id, -32601, "Method not found: %s" % method)


def main():
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    for raw in sys.stdin.buffer:
        line = raw.strip()
        if not line:
            continue
        try:
            message = json.loads(line.decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            _error(None, -32700, "Parse error")
            continue
        _handle(message)
    # stdin closed: the client is done with us.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
