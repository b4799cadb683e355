#!/usr/bin/env python3
"""A tool executor for agentloop in Python: the example to copy for your own tools.

It serves ToolExecutorService (proto/agentloop/v1/tool_executor.proto) for a small
warehouse, with two tools:

- py_inventory_lookup, read-only: how many of an item are in stock and still free.
- py_reserve, a write that needs a human's approval: reserves a quantity of an item
  for an order, exactly once per effect key.

Three rules every executor keeps (marked RULE 1-3 below):

1. Dedupe on the effect key. The executor owns the data, so it enforces the key: a
   second Execute with a key it applied returns the original result, changing nothing.
2. Record before you acknowledge. An applied write is appended to a JSON-lines file
   and fsynced before the reply, so a key that is not in the file was never applied.
3. Answer Reconcile from that file. The runtime asks when a write's reply was lost.

Failures the model should see (bad arguments, an unknown item, not enough stock) are
ToolResults with a structured ToolError, not gRPC errors: a gRPC error on a write
leaves its outcome unknown, and the runtime then has to reconcile it.

Run (the stubs are generated on the first run, see stubs.py):

    python3 examples/python/executor.py --listen 127.0.0.1:50071 --data-dir /tmp/py-executor

It prints `executor.py: listening on HOST:PORT` once it serves (with port 0, the port
it got), answers grpc.health.v1 with SERVING, and drains on SIGTERM or Ctrl-C.
"""

import argparse
import collections
import hmac
import json
import logging
import os
import signal
import sys
import threading
from concurrent import futures

import grpc
from google.protobuf import duration_pb2
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

import stubs

log = logging.getLogger("executor")

# Bounds on what a caller may send. Tool arguments are small JSON objects; ids and
# effect keys are identifiers, not payloads.
MAX_MESSAGE_BYTES = 1024 * 1024
MAX_ARGUMENTS_BYTES = 64 * 1024
MAX_ID_BYTES = 256
MAX_EFFECT_KEY_BYTES = 256
# How long calls in flight may take to finish after SIGTERM, in seconds.
DRAIN_SECONDS = 10

SERVICE = "agentloop.v1.ToolExecutorService"
LOOKUP = "py_inventory_lookup"
RESERVE = "py_reserve"
RECORD_FILE = "reservations.jsonl"

# The warehouse: SKU -> (name, units in stock). A real executor reads its own system.
STOCK = {
    "widget-7": ("Widget, size 7", 12),
    "gadget-2": ("Gadget, mark II", 3),
    "gizmo-1": ("Gizmo", 0),
}


# --- Argument schemas -------------------------------------------------------------
# One definition per tool gives both the JSON Schema that Describe publishes (policy
# validates calls against it before they are sent) and the executor's own check: an
# executor never trusts that every caller validated.


def string(min_length, max_length, description):
    return {"type": "string", "minLength": min_length, "maxLength": max_length,
            "description": description}


def integer(minimum, maximum, description):
    return {"type": "integer", "minimum": minimum, "maximum": maximum,
            "description": description}


def arguments(**properties):
    return {"type": "object", "properties": properties, "required": sorted(properties),
            "additionalProperties": False}


LOOKUP_SCHEMA = arguments(
    sku=string(1, 64, 'The item\'s SKU, e.g. "widget-7".'),
)
RESERVE_SCHEMA = arguments(
    sku=string(1, 64, 'The item\'s SKU, e.g. "widget-7".'),
    quantity=integer(1, 1000, "How many units to reserve."),
    order=string(1, 128, 'The order the units are reserved for, e.g. "order-1001".'),
)


def check_arguments(schema, text):
    """Parses `text` strictly against one of the schemas above: (arguments, None), or
    (None, reason) for the model to fix."""
    if len(text.encode()) > MAX_ARGUMENTS_BYTES:
        return None, f"arguments larger than {MAX_ARGUMENTS_BYTES} bytes"
    try:
        args = json.loads(text)
    except ValueError as error:
        return None, f"arguments are not JSON: {error}"
    if not isinstance(args, dict):
        return None, "arguments must be a JSON object"
    unknown = sorted(set(args) - set(schema["properties"]))
    if unknown:
        return None, f"unknown arguments: {', '.join(unknown)}"
    for name, spec in schema["properties"].items():
        if name not in args:
            return None, f"missing argument {name!r}"
        value = args[name]
        if spec["type"] == "string":
            if not isinstance(value, str):
                return None, f"{name!r} must be a string"
            if not spec["minLength"] <= len(value) <= spec["maxLength"]:
                return None, f"{name!r} must be {spec['minLength']} to {spec['maxLength']} characters"
        else:
            # bool is an int in Python; a float is refused even when whole (2.0),
            # which is stricter than JSON Schema and never wrong for a count.
            if type(value) is not int:
                return None, f"{name!r} must be an integer"
            if not spec["minimum"] <= value <= spec["maximum"]:
                return None, f"{name!r} must be {spec['minimum']} to {spec['maximum']}"
    return args, None


# --- The durable record (RULES 1-3) --------------------------------------------------


class Record:
    """The applied reservations: an append-only file of JSON lines, one per applied
    effect key, and an index of it in memory.

    Callers hold `lock` around looking a key up and appending it, so two concurrent
    requests with one key apply it once, and Reconcile never sees half an apply.
    """

    def __init__(self, data_dir):
        os.makedirs(data_dir, exist_ok=True)
        self.path = os.path.join(data_dir, RECORD_FILE)
        self.lock = threading.Lock()
        self.by_key = {}
        self.reserved = collections.Counter()  # SKU -> units reserved
        # Set when a failed append could not be undone: the file may hold a line that
        # was never acknowledged, so neither "applied" nor "not applied" is certain.
        self.in_doubt = None
        created = not os.path.exists(self.path)
        self.fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        if created:
            # Make the new file's name durable too, not only its contents.
            dir_fd = os.open(data_dir, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        self._load()

    def _load(self):
        with open(self.path, "rb") as file:
            data = file.read()
        *lines, torn = data.split(b"\n")
        for number, line in enumerate(lines, 1):
            try:
                self._index(json.loads(line))
            except (ValueError, KeyError, TypeError) as error:
                # A bad line before the last one is real damage: serving anyway could
                # forget an applied write and apply it again.
                raise SystemExit(f"{self.path}:{number}: corrupt record: {error}")
        if torn:
            # A crash cut the last append short. It was never fsynced, so never
            # acknowledged: forgetting it is correct. Cut it off so that the next
            # append starts on a line of its own.
            log.warning("dropping a torn last line of %s (%d bytes)", self.path, len(torn))
            os.ftruncate(self.fd, len(data) - len(torn))
            os.fsync(self.fd)

    def _index(self, entry):
        self.by_key[entry["effect_key"]] = entry
        self.reserved[entry["args"]["sku"]] += entry["args"]["quantity"]

    def append(self, entry):
        """Appends `entry` durably, then indexes it (RULE 2). The caller holds `lock`.
        Raises OSError when it could not, with the file as it was."""
        line = (json.dumps(entry, sort_keys=True, separators=(",", ":")) + "\n").encode()
        size = os.fstat(self.fd).st_size
        try:
            if os.write(self.fd, line) != len(line):
                raise OSError("short write")
            os.fsync(self.fd)
        except OSError as error:
            try:
                os.ftruncate(self.fd, size)
                os.fsync(self.fd)
            except OSError as undo:
                self.in_doubt = f"an append failed ({error}) and could not be undone ({undo})"
            raise
        self._index(entry)

    def available(self, sku):
        return STOCK[sku][1] - self.reserved[sku]

    def close(self):
        os.close(self.fd)


# --- The service -----------------------------------------------------------------------


def tool_error(pb, error_type, message, next_action, retryable=False):
    return pb.common.ToolError(error_type=error_type, message=message, retryable=retryable,
                               next_allowed_action=next_action)


class Executor:
    """ToolExecutorService. grpcio runs each call on a thread of the server's pool."""

    def __init__(self, pb, record):
        self.pb = pb
        self.record = record
        c = pb.common
        self.descriptors = [
            c.ToolDescriptor(
                name=LOOKUP,
                description=(
                    "Looks up an item of the warehouse by SKU. Returns {sku, name, in_stock, "
                    "reserved, available}. Read-only: safe to call again. An unknown SKU "
                    "fails with NOT_FOUND."),
                input_schema_json=json.dumps(LOOKUP_SCHEMA),
                side_effect=c.SIDE_EFFECT_READ_ONLY,
                timeout=duration_pb2.Duration(seconds=5),
            ),
            c.ToolDescriptor(
                name=RESERVE,
                description=(
                    "Reserves units of an item for an order. A real change, applied once per "
                    "effect key; the result carries the reservation's receipt. Needs a "
                    "human's approval. More units than are available is REJECTED."),
                input_schema_json=json.dumps(RESERVE_SCHEMA),
                side_effect=c.SIDE_EFFECT_WRITE,
                requires_approval=True,
                timeout=duration_pb2.Duration(seconds=10),
            ),
        ]

    def Describe(self, request, context):
        # Tools only; `verifiers` stays empty (see Verify).
        return self.pb.tool_executor.DescribeResponse(tools=self.descriptors)

    def Execute(self, request, context):
        if not request.HasField("call"):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "call is required")
        call = request.call
        for field, value in (("invocation_id", request.invocation_id),
                             ("call.call_id", call.call_id), ("call.tool", call.tool)):
            if len(value.encode()) > MAX_ID_BYTES:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              f"{field} longer than {MAX_ID_BYTES} bytes")
        if call.tool == LOOKUP:
            outcome = self.lookup(call)
        elif call.tool == RESERVE:
            outcome = self.reserve(request, call, context)
        else:
            # The gateway's registry names the wrong executor: not the model's to fix.
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown tool {call.tool!r}")
        result = self.pb.common.ToolResult(call_id=call.call_id, **outcome)
        return self.pb.tool_executor.ToolExecutorServiceExecuteResponse(result=result)

    def lookup(self, call):
        c = self.pb.common
        args, bad = check_arguments(LOOKUP_SCHEMA, call.arguments_json)
        if bad:
            return {"error": tool_error(self.pb, c.ERROR_TYPE_INVALID_ARGUMENTS, bad,
                                        c.NEXT_ACTION_FIX_ARGUMENTS)}
        sku = args["sku"]
        if sku not in STOCK:
            return {"error": tool_error(self.pb, c.ERROR_TYPE_NOT_FOUND, f"no item {sku!r}",
                                        c.NEXT_ACTION_FIX_ARGUMENTS)}
        with self.record.lock:
            reserved, available = self.record.reserved[sku], self.record.available(sku)
        name, in_stock = STOCK[sku]
        value = {"sku": sku, "name": name, "in_stock": in_stock, "reserved": reserved,
                 "available": available}
        return {"output": c.ToolOutput(output_json=json.dumps(value))}

    def reserve(self, request, call, context):
        c = self.pb.common
        # A write without an effect key cannot be deduped: a bad request from the
        # gateway, refused before anything else.
        key = request.effect_key
        if not key or len(key.encode()) > MAX_EFFECT_KEY_BYTES:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"{RESERVE} is a write and needs an effect key of 1 to "
                          f"{MAX_EFFECT_KEY_BYTES} bytes")
        args, bad = check_arguments(RESERVE_SCHEMA, call.arguments_json)
        if bad:
            return {"error": tool_error(self.pb, c.ERROR_TYPE_INVALID_ARGUMENTS, bad,
                                        c.NEXT_ACTION_FIX_ARGUMENTS)}
        with self.record.lock:
            # RULE 1, before any business check: once applied, the stock has changed,
            # and a retry must still get the first answer, not a refusal.
            done = self.record.by_key.get(key)
            if done is not None:
                if done["args"] != args:
                    # Answering with the first receipt would hide a caller's bug;
                    # applying again would break the rule.
                    return {"error": tool_error(
                        self.pb, c.ERROR_TYPE_CONFLICT,
                        f"effect key {key!r} was applied with other arguments",
                        c.NEXT_ACTION_STOP)}
                log.info("duplicate %s: original receipt %s", key, done["receipt"])
                return {"output": c.ToolOutput(output_json=done["output_json"],
                                               receipt=done["receipt"])}
            if self.record.in_doubt:
                context.abort(grpc.StatusCode.UNAVAILABLE, self.record.in_doubt)
            sku, quantity = args["sku"], args["quantity"]
            if sku not in STOCK:
                return {"error": tool_error(self.pb, c.ERROR_TYPE_NOT_FOUND,
                                            f"no item {sku!r}", c.NEXT_ACTION_FIX_ARGUMENTS)}
            available = self.record.available(sku)
            if quantity > available:
                # A business refusal: understood, and the answer is no. Nothing is
                # recorded, so Reconcile says NOT_APPLIED, which is true.
                return {"error": tool_error(
                    self.pb, c.ERROR_TYPE_REJECTED,
                    f"only {available} of {sku!r} available, {quantity} asked",
                    c.NEXT_ACTION_NONE)}
            # Start no change the caller no longer wants (it may have timed out while we
            # waited for the lock). From here on the append runs to its end.
            if not context.is_active():
                context.abort(grpc.StatusCode.CANCELLED, "the caller gave up")
            receipt = f"rsv-{len(self.record.by_key) + 1:06d}"
            output = json.dumps({"reservation": receipt, "sku": sku, "quantity": quantity,
                                 "order": args["order"], "available": available - quantity})
            entry = {"effect_key": key, "invocation_id": request.invocation_id,
                     "call_id": call.call_id, "attempt": request.attempt, "args": args,
                     "receipt": receipt, "output_json": output}
            try:
                self.record.append(entry)  # RULE 2: durable before the reply
            except OSError as error:
                context.abort(grpc.StatusCode.UNAVAILABLE, f"cannot record the reservation: {error}")
        log.info("applied %s: %s", key, receipt)
        return {"output": c.ToolOutput(output_json=output, receipt=receipt)}

    def Reconcile(self, request, context):
        c, te = self.pb.common, self.pb.tool_executor
        if request.tool == LOOKUP:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"{LOOKUP} is read-only and has no effects to reconcile")
        if request.tool != RESERVE:
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown tool {request.tool!r}")
        key = request.effect_key
        if not key or len(key.encode()) > MAX_EFFECT_KEY_BYTES:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"effect_key must be 1 to {MAX_EFFECT_KEY_BYTES} bytes")
        # RULE 3: the record is the truth. Under the lock, an apply of this key in
        # flight is either finished (APPLIED) or not begun (and will be deduped).
        with self.record.lock:
            if self.record.in_doubt:
                return te.ToolExecutorServiceReconcileResponse(
                    status=c.RECONCILE_STATUS_UNKNOWN, detail=self.record.in_doubt)
            entry = self.record.by_key.get(key)
        if entry is None:
            return te.ToolExecutorServiceReconcileResponse(
                status=c.RECONCILE_STATUS_NOT_APPLIED,
                detail="no reservation recorded under this effect key")
        return te.ToolExecutorServiceReconcileResponse(
            status=c.RECONCILE_STATUS_APPLIED, receipt=entry["receipt"],
            output_json=entry["output_json"],
            detail=f"applied by attempt {entry['attempt']} of call {entry['call_id']}")

    def ExecuteStage(self, request, context):
        # Optional: UNIMPLEMENTED makes the gateway send each call of a stage as an
        # Execute of its own.
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "calls come one by one")

    def Verify(self, request, context):
        # This executor serves no verifier; UNIMPLEMENTED makes a check that names one
        # fail closed.
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "this executor serves no verifier")


class RequireToken(grpc.ServerInterceptor):
    """Serves only callers that send `authorization: Bearer <token>` (the gateway's
    service token); health stays open so that probes need no secret."""

    def __init__(self, token):
        self.expected = f"Bearer {token}".encode()
        self.refuse = grpc.unary_unary_rpc_method_handler(
            lambda request, context: context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                                   "a valid service token is required"))

    def intercept_service(self, continuation, details):
        if details.method.startswith("/grpc.health.v1.Health/"):
            return continuation(details)
        sent = dict(details.invocation_metadata).get("authorization", "")
        if hmac.compare_digest(sent.encode(), self.expected):
            return continuation(details)
        return self.refuse


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", default="127.0.0.1:50071",
                        help="host:port to serve on; port 0 picks a free one")
    parser.add_argument("--data-dir", default="py-executor-data",
                        help=f"directory of the durable record ({RECORD_FILE})")
    parser.add_argument("--caller-token-file",
                        help="serve only callers that present this token as a bearer")
    parser.add_argument("--stubs", help="directory of the generated stubs (see stubs.py)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="executor.py %(levelname)s %(message)s")
    pb = stubs.load(args.stubs)

    host = args.listen.rsplit(":", 1)[0].strip("[]")
    interceptors = []
    if args.caller_token_file:
        with open(args.caller_token_file) as file:
            token = file.read().strip()
        if not token:
            raise SystemExit(f"{args.caller_token_file} holds no token")
        interceptors.append(RequireToken(token))
    elif host not in ("127.0.0.1", "localhost", "::1"):
        raise SystemExit("a non-loopback --listen needs --caller-token-file")

    record = Record(args.data_dir)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=8),
        interceptors=interceptors,
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            # grpcio shares a port with another process by default; fail instead.
            ("grpc.so_reuseport", 0),
        ],
    )
    pb.tool_executor_grpc.add_ToolExecutorServiceServicer_to_server(Executor(pb, record), server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        port = server.add_insecure_port(args.listen)
    except RuntimeError as error:
        raise SystemExit(f"cannot listen on {args.listen}: {error}")
    server.start()
    for service in ("", SERVICE):
        health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    print(f"executor.py: listening on {args.listen.rsplit(':', 1)[0]}:{port}", flush=True)

    stop.wait()
    # Drain: health turns NOT_SERVING so probes stop sending calls here, new calls are
    # refused, and calls in flight get DRAIN_SECONDS to finish (an append in progress
    # always finishes: it is never interrupted).
    log.info("draining")
    health_servicer.enter_graceful_shutdown()
    server.stop(grace=DRAIN_SECONDS).wait()
    record.close()
    log.info("stopped")


if __name__ == "__main__":
    main()
