#!/usr/bin/env python3
"""A small MCP server over stdio for agentloop-mcp's tests, with ways to misbehave.

Standard library only, so the tests need nothing but python3. The first argument picks
how it behaves from the start:

  normal      a well-behaved server (the default)
  banner      writes a line that is not JSON to stdout before anything else
  many-tools  lists 5000 tools, 1000 a page
  paged       lists its tools two a page

Its tools (normal and paged):

  echo           {"text": str} -> the text (read-only)
  meta           -> the request's _meta, as structured content
  fail           -> a result with isError: true
  sleep          {"seconds": number} -> waits; a cancelled call is recorded, not answered
  cancellations  -> {"started": [ids], "cancelled": [{"id": id, "reason": str}]}
  big_output     -> a text result of 2 MiB (within a message, beyond an output)
  huge_line      -> one message line of 5 MiB
  garbage        -> a line that is not JSON instead of an answer
"""

import json
import sys
import threading

MODE = sys.argv[1] if len(sys.argv) > 1 else "normal"
OUT = threading.Lock()
STATE = threading.Lock()
STARTED = []
CANCELLED = []
WAITING = {}


def write_line(text):
    with OUT:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()


def send(message):
    write_line(json.dumps(message))


def result(request_id, value):
    send({"jsonrpc": "2.0", "id": request_id, "result": value})


def text(value, is_error=False):
    return {"content": [{"type": "text", "text": value}], "isError": is_error}


def tool(name, read_only=False, properties=None):
    return {
        "name": name,
        "description": "the fake server's " + name,
        "inputSchema": {"type": "object", "properties": properties or {}},
        "annotations": {"readOnlyHint": read_only},
    }


TOOLS = [
    tool("echo", read_only=True, properties={"text": {"type": "string"}}),
    tool("meta", read_only=True),
    tool("fail"),
    tool("sleep", read_only=True, properties={"seconds": {"type": "number"}}),
    tool("cancellations", read_only=True),
    tool("big_output", read_only=True),
    tool("huge_line", read_only=True),
    tool("garbage", read_only=True),
]


def list_tools(request_id, params):
    cursor = int((params or {}).get("cursor") or 0)
    if MODE == "many-tools":
        page = [tool("t%d" % i) for i in range(cursor, cursor + 1000)]
        more = cursor + 1000 < 5000
    elif MODE == "paged":
        page = TOOLS[cursor : cursor + 2]
        more = cursor + 2 < len(TOOLS)
    else:
        page, more = TOOLS, False
    answer = {"tools": page}
    if more:
        answer["nextCursor"] = str(cursor + len(page))
    result(request_id, answer)


def sleep(request_id, seconds):
    event = threading.Event()
    with STATE:
        WAITING[json.dumps(request_id)] = event
        STARTED.append(request_id)
    cancelled = event.wait(seconds)
    with STATE:
        WAITING.pop(json.dumps(request_id), None)
    if not cancelled:
        result(request_id, text("slept"))


def call(request_id, params):
    name = params.get("name")
    arguments = params.get("arguments") or {}
    if name == "echo":
        result(request_id, text(arguments.get("text", "")))
    elif name == "meta":
        answer = text("meta")
        answer["structuredContent"] = params.get("_meta") or {}
        result(request_id, answer)
    elif name == "fail":
        result(request_id, text("it failed on purpose", is_error=True))
    elif name == "sleep":
        worker = threading.Thread(target=sleep, args=(request_id, float(arguments.get("seconds", 60))))
        worker.daemon = True
        worker.start()
    elif name == "cancellations":
        with STATE:
            value = {"started": list(STARTED), "cancelled": list(CANCELLED)}
        answer = text(json.dumps(value))
        answer["structuredContent"] = value
        result(request_id, answer)
    elif name == "big_output":
        result(request_id, text("x" * (2 * 1024 * 1024)))
    elif name == "huge_line":
        result(request_id, text("y" * (5 * 1024 * 1024)))
    elif name == "garbage":
        write_line("this is not JSON")
    else:
        send({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32602, "message": "Unknown tool: %s" % name}})


def cancelled(params):
    request_id = params.get("requestId")
    with STATE:
        CANCELLED.append({"id": request_id, "reason": params.get("reason")})
        event = WAITING.get(json.dumps(request_id))
    if event is not None:
        event.set()


def main():
    sys.stderr.write("fake MCP server starting in mode %s\n" % MODE)
    sys.stderr.flush()
    if MODE == "banner":
        write_line("Fake MCP server ready!")
    for line in sys.stdin:
        if not line.strip():
            continue
        message = json.loads(line)
        method = message.get("method")
        request_id = message.get("id")
        params = message.get("params") or {}
        if method == "initialize":
            result(request_id, {
                "protocolVersion": params.get("protocolVersion", "2025-06-18"),
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "fake", "version": "1"},
            })
        elif method == "ping":
            result(request_id, {})
        elif method == "tools/list":
            list_tools(request_id, params)
        elif method == "tools/call":
            call(request_id, params)
        elif method == "notifications/cancelled":
            cancelled(params)
        elif request_id is not None:
            send({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32601, "message": "no " + str(method)}})


if __name__ == "__main__":
    main()
