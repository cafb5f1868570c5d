"""Loom's tools, implemented in Python for the frameworks' runners (bench/realmodel/README.md).

The definitions (names, descriptions, JSON-schema parameters) are Loom's own, from
tools.json (capture_tools.py); the behaviour follows Loom's (crates/loom-tools): the same
result texts, the same refusals worded as `Error: ...`, every path confined to the
attempt's workspace. A failed call is a result the model reads, never an exception, so
every framework hands the model the same text. Standard library only.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TOOLS_JSON = HERE.parent / "tools.json"


class ToolsError(Exception):
    """tools.json is missing or lacks a tool a case asks for."""


def load_tool_specs(names: list[str] | None) -> list[dict]:
    """Loom's tool definitions (tools.json), in Loom's order, only the case's tools."""
    if not TOOLS_JSON.is_file():
        raise ToolsError(f"{TOOLS_JSON} is missing: run capture_tools.py first")
    specs = json.loads(TOOLS_JSON.read_text())
    known = {s["function"]["name"] for s in specs}
    if names is None:
        return specs
    missing = [n for n in names if n not in known]
    if missing:
        raise ToolsError(f"tools.json has no tool named {missing} (its tools: {sorted(known)})")
    return [s for s in specs if s["function"]["name"] in names]


class ToolFailure(Exception):
    """A failed call: the model reads `Error: <message>`, as Loom words its failures."""


READ_DEFAULT_LIMIT = 2000
READ_MAX_LINE = 2000
GREP_DEFAULT_MAX = 200
GREP_MAX_LINE = 300
GLOB_MAX = 1000
LIST_MAX = 1000
BASH_DEFAULT_TIMEOUT = 120
BASH_KEEP = 8000          # characters kept at each end of a long stream


def _clip(line: str, limit: int) -> str:
    return line if len(line) <= limit else line[:limit] + f"… [line cut at {limit} characters]"


def glob_to_regex(pattern: str) -> re.Pattern:
    """A glob as Loom's (globset with literal_separator): `*`, `?` stay within a path
    component, `**` crosses them, `[...]` classes and `{a,b}` alternatives."""
    out, i, n = [], 0, len(pattern)
    depth = 0
    while i < n:
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("/**", i) and i + 3 == n:
            out.append("(?:/.*)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            end = pattern.find("]", i + 2)
            if end < 0:
                out.append(re.escape(c))
                i += 1
            else:
                body = pattern[i + 1:end]
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append("[" + body.replace("\\", "\\\\") + "]")
                i = end + 1
        elif c == "{":
            out.append("(?:")
            depth += 1
            i += 1
        elif c == "}" and depth:
            out.append(")")
            depth -= 1
            i += 1
        elif c == "," and depth:
            out.append("|")
            i += 1
        else:
            out.append(re.escape(c))
            i += 1
    return re.compile("".join(out) + r"\Z")


class Toolbox:
    """Loom's tools over one attempt's workspace. Every path is resolved beneath the root
    and refused outside it (links followed only while they stay inside)."""

    def __init__(self, root: Path, names: list[str] | None):
        self.root = Path(os.path.realpath(root))
        self.specs = load_tool_specs(names)
        self.names = [s["function"]["name"] for s in self.specs]
        self._schemas = {s["function"]["name"]: s["function"].get("parameters", {}) for s in self.specs}
        self._procs: set[subprocess.Popen] = set()
        self._lock = threading.Lock()

    # -- dispatch ------------------------------------------------------------------------

    async def acall(self, name: str, arguments: Any) -> str:
        """The result text of one call, as the model will read it. Never raises for a
        failure of the call: the model gets the error as text, as Loom sends it."""
        if name not in self._schemas:
            return (f"Error: there is no tool named '{name}'. Available tools: {', '.join(self.names)}. "
                    "Call one of them by its exact name.")
        if isinstance(arguments, (str, bytes)):
            text = arguments.decode() if isinstance(arguments, bytes) else arguments
            try:
                arguments = json.loads(text) if text.strip() else {}
            except ValueError as err:
                return (f"Error: the arguments for '{name}' are not valid JSON ({err}). "
                        "Send the arguments as one JSON object matching the tool's schema.")
        if not isinstance(arguments, dict):
            return f"Error: invalid arguments for '{name}': expected a JSON object"
        problem = self._validate(name, arguments)
        if problem:
            return f"Error: invalid arguments for '{name}': {problem}"
        try:
            # Off the event loop: a slow command must not stall the model's stream or
            # the attempt's time limit.
            return await asyncio.to_thread(getattr(self, "_" + name), **arguments)
        except ToolFailure as err:
            return f"Error: {err}"
        except Exception as err:  # a fault here, not in the call
            return f"Error: tool '{name}' crashed ({type(err).__name__}: {err}). This is a fault in the tool, not in your call; try another approach."

    def _validate(self, name: str, args: dict) -> str | None:
        """The checks Loom's typed arguments make: required fields, no unknown ones,
        JSON types and minimums."""
        schema = self._schemas[name]
        props = schema.get("properties", {})
        for key in schema.get("required", []):
            if key not in args:
                return f"missing field `{key}`"
        for key, value in args.items():
            if key not in props:
                return f"unknown field `{key}`, expected one of {', '.join('`%s`' % p for p in props)}"
            want = props[key].get("type")
            ok = {
                "string": isinstance(value, str),
                "integer": isinstance(value, int) and not isinstance(value, bool),
                "boolean": isinstance(value, bool),
                "array": isinstance(value, list),
                None: True,
            }.get(want, True)
            if want == "integer" and value is None:
                ok = True  # an explicit null is "not given"
            if not ok:
                return f"invalid type for `{key}`: expected {want}, got {json.dumps(value)}"
            minimum = props[key].get("minimum")
            if minimum is not None and isinstance(value, int) and value < minimum:
                return f"`{key}` must be at least {minimum}"
        return None

    def kill_all(self) -> None:
        """Stop every command still running (an attempt that timed out)."""
        with self._lock:
            procs = list(self._procs)
        for proc in procs:
            _kill_group(proc)

    # -- paths ---------------------------------------------------------------------------

    def _resolve(self, requested: str) -> Path:
        full = os.path.normpath(os.path.join(self.root, requested))
        for candidate in (full, os.path.realpath(full)):
            if candidate != str(self.root) and not candidate.startswith(str(self.root) + os.sep):
                raise ToolFailure(f"cannot use '{requested}': it is outside the workspace {self.root}")
        return Path(full)

    def _shown(self, path: Path) -> str:
        rel = os.path.relpath(path, self.root)
        return "." if rel == "." else Path(rel).as_posix()

    def _walk(self, base: Path):
        """Files beneath base, hidden ones (and hidden folders) skipped, as Loom's walk."""
        if base.is_file():
            yield base
            return
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for name in sorted(filenames):
                if not name.startswith("."):
                    yield Path(dirpath) / name

    @staticmethod
    def _io_error(action: str, shown: str, err: OSError) -> ToolFailure:
        hint = ""
        if isinstance(err, FileNotFoundError):
            hint = " (it does not exist; list the directory or use glob to find the right path)"
        elif isinstance(err, PermissionError):
            hint = " (permission denied)"
        elif isinstance(err, IsADirectoryError):
            hint = " (it is a directory; use list_dir)"
        return ToolFailure(f"cannot {action} '{shown}': {err.strerror or err}{hint}")

    # -- the tools -----------------------------------------------------------------------

    def _read_file(self, path: str, offset: int | None = None, limit: int | None = None) -> str:
        full = self._resolve(path)
        shown = self._shown(full)
        if full.is_dir():
            raise ToolFailure(f"'{shown}' is a directory; use list_dir to see what it holds")
        try:
            data = full.read_bytes()
        except OSError as err:
            raise self._io_error("read", shown, err)
        if b"\0" in data[:8192]:
            raise ToolFailure(f"'{shown}' looks like a binary file; read_file shows text files only")
        lines = data.split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()
        total = len(lines)
        if total == 0:
            return f"'{shown}' is empty (0 lines)."
        first = max(offset or 1, 1)
        count = max(limit or READ_DEFAULT_LIMIT, 1)
        if first > total:
            raise ToolFailure(f"offset {first} is past the end of '{shown}', which has {total} lines")
        out, last = [], first - 1
        for number in range(first, min(total, first + count - 1) + 1):
            text = lines[number - 1].decode("utf-8", "replace").removesuffix("\r")
            out.append(f"{number:>6}\t{_clip(text, READ_MAX_LINE)}\n")
            last = number
        if first > 1 or last < total:
            more = f"; call read_file with offset={last + 1} to read more" if last < total else ""
            out.append(f"[lines {first}-{last} of {total} in '{shown}'{more}]\n")
        return "".join(out)

    def _write_file(self, path: str, content: str, append: bool = False) -> str:
        full = self._resolve(path)
        shown = self._shown(full)
        if full.is_dir():
            raise ToolFailure(f"'{shown}' is a directory; give a file path")
        existed = full.exists()
        try:
            full.parent.mkdir(parents=True, exist_ok=True)
            with open(full, "a" if append else "w", encoding="utf-8", newline="") as f:
                f.write(content)
        except OSError as err:
            raise self._io_error("append to" if append else "write", shown, err)
        verb = ("Appended to" if append else "Replaced") if existed else "Created"
        return f"{verb} '{shown}': {len(content.encode())} bytes, {len(content.splitlines())} lines."

    def _edit_file(self, path: str, old_string: str, new_string: str) -> str:
        full = self._resolve(path)
        shown = self._shown(full)
        if old_string == "":
            raise ToolFailure("old_string is empty; to create or replace a whole file use write_file")
        if old_string == new_string:
            raise ToolFailure("old_string and new_string are the same; nothing would change")
        try:
            text = full.read_text(encoding="utf-8")
        except OSError as err:
            raise self._io_error("edit", shown, err)
        count = text.count(old_string)
        if count == 0:
            raise ToolFailure(f"old_string was not found in '{shown}'. Read the file and copy the exact text, including indentation and line breaks")
        if count > 1:
            raise ToolFailure(f"old_string occurs {count} times in '{shown}'; include more surrounding text so it matches exactly once")
        start = text.find(old_string)
        first_line = text[:start].count("\n") + 1
        with open(full, "w", encoding="utf-8", newline="") as f:
            f.write(text.replace(old_string, new_string, 1))
        last_line = first_line + new_string.count("\n")
        return f"Edited '{shown}': replaced 1 occurrence; the new text is on lines {first_line}-{last_line}."

    def _list_dir(self, path: str = ".") -> str:
        full = self._resolve(path)
        shown = self._shown(full)
        if full.is_file():
            raise ToolFailure(f"'{shown}' is a file, not a directory; use read_file")
        try:
            entries = list(os.scandir(full))
        except OSError as err:
            raise self._io_error("list", shown, err)
        dirs, files = [], []
        for entry in entries:
            try:
                if entry.is_dir():
                    dirs.append(entry.name + "/")
                else:
                    files.append(f"{entry.name} ({entry.stat().st_size} bytes)")
            except OSError:
                files.append(f"{entry.name} (broken link)")
        dirs.sort()
        files.sort()
        if not dirs and not files:
            return f"'{shown}' is empty."
        out = [f"{shown}/ ({len(dirs)} directories, {len(files)} files)\n"]
        out += [e + "\n" for e in (dirs + files)[:LIST_MAX]]
        if len(dirs) + len(files) > LIST_MAX:
            out.append(f"[{len(dirs) + len(files) - LIST_MAX} more entries not shown]\n")
        return "".join(out)

    def _glob(self, pattern: str, path: str = ".") -> str:
        base = self._resolve(path)
        try:
            matcher = glob_to_regex(pattern)
        except re.error as err:
            raise ToolFailure(f"invalid glob pattern '{pattern}': {err}")
        found = []
        for file in self._walk(base):
            if matcher.match(Path(os.path.relpath(file, base)).as_posix()):
                found.append(self._shown(file))
        if not found:
            return f"No files match '{pattern}' under '{self._shown(base)}'.\n"
        found.sort()
        out = "\n".join(found[:GLOB_MAX]) + "\n"
        if len(found) > GLOB_MAX:
            out += f"[{len(found) - GLOB_MAX} more matches not shown; narrow the pattern]\n"
        return out

    def _grep(self, pattern: str, path: str = ".", glob: str | None = None,
              case_insensitive: bool = False, max_results: int | None = None) -> str:
        base = self._resolve(path)
        try:
            regex = re.compile(pattern, re.IGNORECASE if case_insensitive else 0)
        except re.error as err:
            raise ToolFailure(f"invalid regular expression: {err}")
        matcher = glob_to_regex(glob) if glob else None
        limit = max(max_results or GREP_DEFAULT_MAX, 1)
        out, shown, more, files_with = [], 0, 0, 0
        for file in self._walk(base):
            if matcher is not None:
                rel = Path(os.path.relpath(file, base)).as_posix()
                if not matcher.match(rel) and not matcher.match(file.name):
                    continue
            try:
                data = file.read_bytes()
            except OSError:
                continue
            if b"\0" in data[:8192]:
                continue
            matched = False
            for number, raw in enumerate(data.split(b"\n"), 1):
                text = raw.decode("utf-8", "replace")
                if not regex.search(text):
                    continue
                matched = True
                if shown < limit:
                    out.append(f"{self._shown(file)}:{number}: {_clip(text.rstrip(chr(13)), GREP_MAX_LINE)}\n")
                    shown += 1
                else:
                    more += 1
            files_with += matched
        if shown == 0:
            return f"No matches for /{pattern}/ under '{self._shown(base)}'.\n"
        tail = f"; {more} not shown, narrow the search or raise max_results" if more else ""
        out.append(f"[{shown + more} matching lines in {files_with} files{tail}]\n")
        return "".join(out)

    def _bash(self, command: str, timeout_secs: int | None = None) -> str:
        limit = timeout_secs or BASH_DEFAULT_TIMEOUT
        env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
        started = time.monotonic()
        try:
            # Its own session: a time-out, or the attempt's end, stops every process it started.
            proc = subprocess.Popen(["bash", "-c", command], cwd=self.root, env=env,
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True)
        except OSError as err:
            raise ToolFailure(f"could not start bash: {err}")
        with self._lock:
            self._procs.add(proc)
        timed_out = False
        try:
            try:
                out, err = proc.communicate(timeout=limit)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc)
                out, err = proc.communicate()
        finally:
            _kill_group(proc)
            with self._lock:
                self._procs.discard(proc)
        elapsed = time.monotonic() - started
        if timed_out:
            status, ok = f"timed out after {limit} s: the command and every process it started were stopped", False
        elif proc.returncode < 0:
            status, ok = f"killed by signal {-proc.returncode}", False
        else:
            status, ok = f"exit code {proc.returncode}", proc.returncode == 0
        text = f"{status} · {elapsed:.1f} s\n"
        for name, data in (("stdout", out), ("stderr", err)):
            shown = data.decode("utf-8", "replace")
            if not shown:
                continue
            dropped = 0
            if len(shown) > 2 * BASH_KEEP:
                dropped = len(shown) - 2 * BASH_KEEP
                shown = shown[:BASH_KEEP] + f"\n[… {dropped} characters dropped …]\n" + shown[-BASH_KEEP:]
            text += f"--- {name}" + (f" ({dropped} characters dropped)" if dropped else "") + " ---\n"
            text += shown if shown.endswith("\n") else shown + "\n"
        if not out and not err:
            text += "(no output)\n"
        if not ok:
            raise ToolFailure(text)
        return text


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
