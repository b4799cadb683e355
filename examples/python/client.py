#!/usr/bin/env python3
"""A client of agentloop's public API (OrchestratorService), in Python.

It starts an invocation, follows its committed events (WatchInvocation), resolves each
approval the invocation waits for (approves, or denies with --deny), then prints the
terminal reason and exits 0 only if the invocation completed.

    python3 examples/python/client.py --orchestrator 127.0.0.1:50051 \\
        --script examples/python/script.json --goal "Reserve 2 widget-7 for order-1001"

With --script the model's decisions are read from a scripted-model file (sent as
StartInvocationRequest.scripted_model_json), so no model provider is needed. With
--token-file every call carries `authorization: Bearer <token>` (an orchestrator with
`[auth] mode = "jwt"`; approving then needs the approver role in the token).
"""

import argparse
import pathlib
import sys
import time
import uuid

import grpc

import stubs

# Reconnects of a watch that lost its stream, before giving up.
MAX_RECONNECTS = 5


def name(enum, value, prefix):
    """TERMINAL_REASON_COMPLETED -> completed."""
    return enum.Name(value).removeprefix(prefix).lower()


class Client:
    def __init__(self, pb, channel, args):
        self.pb, self.args = pb, args
        self.api = pb.orchestrator_grpc.OrchestratorServiceStub(channel)
        self.metadata = []
        if args.token_file:
            token = pathlib.Path(args.token_file).read_text().strip()
            self.metadata.append(("authorization", f"Bearer {token}"))
        self.deadline = time.monotonic() + args.timeout

    def call(self, method, request):
        """A unary call with the caller's token, bounded by the overall deadline."""
        return method(request, metadata=self.metadata, timeout=self.remaining())

    def remaining(self):
        return max(self.deadline - time.monotonic(), 0.001)

    def start(self):
        o = self.pb.orchestrator
        script = pathlib.Path(self.args.script).read_text() if self.args.script else ""
        response = self.call(self.api.StartInvocation, o.StartInvocationRequest(
            # The same key returns the same invocation: a start is safe to retry.
            idempotency_key=self.args.idempotency_key or str(uuid.uuid4()),
            goal=self.args.goal,
            allowed_tools=self.args.tool,
            scripted_model_json=script,
        ))
        invocation = response.invocation
        again = "" if response.created else " (it existed: same idempotency key)"
        print(f"invocation {invocation.invocation_id}{again}", flush=True)
        return invocation.invocation_id

    def follow(self, invocation_id):
        """Prints every committed event until the last one, resolving waits on the way.
        Returns False when the run stopped for something this client does not do."""
        next_seq, reconnects = 1, 0
        while True:
            request = self.pb.orchestrator.WatchInvocationRequest(
                invocation_id=invocation_id, from_seq=next_seq)
            try:
                for item in self.api.WatchInvocation(request, metadata=self.metadata,
                                                     timeout=self.remaining()):
                    event = item.event
                    next_seq = event.seq + 1
                    self.show(event)
                    if event.WhichOneof("body") == "ended" and event.ended.HasField("wait_until"):
                        if not self.resolve(invocation_id, event.ended):
                            return False
                # The stream ends after the final InvocationEnded.
                return True
            except grpc.RpcError as error:
                # A lost stream is resumed from the next event; nothing is seen twice.
                if error.code() != grpc.StatusCode.UNAVAILABLE or reconnects == MAX_RECONNECTS:
                    raise
                reconnects += 1
                print(f"watch lost ({error.details()}); reconnecting from seq {next_seq}",
                      file=sys.stderr)
                time.sleep(min(0.2 * 2 ** reconnects, 5))

    def resolve(self, invocation_id, ended):
        c, o = self.pb.common, self.pb.orchestrator
        if ended.reason != c.TERMINAL_REASON_APPROVAL_REQUIRED:
            print("  it waits for an answer, which this client does not give "
                  f"(agentloop answer {invocation_id} TEXT)")
            return False
        invocation = self.call(self.api.GetInvocation, o.GetInvocationRequest(
            invocation_id=invocation_id)).invocation
        pending = invocation.pending_approval
        if pending.proposal_digest != ended.proposal_digest:
            print("  already resolved by someone else")
            return True
        # The digest binds the verdict to exactly these calls: show them.
        print(f"  approval asked: {pending.summary}")
        for call in pending.calls:
            print(f"    {call.call_id}: {call.tool} {call.arguments_json}")
        verdict = c.APPROVAL_VERDICT_DENY if self.args.deny else c.APPROVAL_VERDICT_APPROVE
        try:
            self.call(self.api.ResolveApproval, o.ResolveApprovalRequest(
                invocation_id=invocation_id,
                proposal_digest=pending.proposal_digest,
                verdict=verdict,
                # With authentication on, the approver is the token's caller: send none.
                actor="" if self.args.token_file else self.args.actor,
                comment="resolved by examples/python/client.py",
            ))
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.FAILED_PRECONDITION:
                raise
            # Someone resolved it first (or it was cancelled); the log will say.
            print(f"  not resolved: {error.details()}")
        return True

    def show(self, event):
        c = self.pb.common
        kind = event.WhichOneof("body")
        if kind in ("turn", "batch_started"):
            turn = getattr(event, kind)
            decision = turn.decision.WhichOneof("kind")
            print(f"turn {turn.turn}: {decision}" + (" (writes starting)" if kind == "batch_started" else ""))
            if turn.HasField("rejection"):
                print(f"  not carried out: {turn.rejection.message}")
            for result in turn.results:
                outcome = result.WhichOneof("outcome")
                if outcome == "output":
                    print(f"  {result.call_id}: {result.output.output_json}")
                elif outcome == "error":
                    error = result.error
                    print(f"  {result.call_id}: {name(c.ErrorType, error.error_type, 'ERROR_TYPE_')}"
                          f": {error.message}")
                else:
                    print(f"  {result.call_id}: {outcome}")
        elif kind == "ended":
            waits = "waiting: " if event.ended.HasField("wait_until") else "ended: "
            print(waits + name(c.TerminalReason, event.ended.reason, "TERMINAL_REASON_"))
        elif kind == "approval_resolved":
            resolved = event.approval_resolved
            print(f"approval {name(c.ApprovalVerdict, resolved.verdict, 'APPROVAL_VERDICT_')}"
                  f" by {resolved.actor}")
        elif kind == "clarification_answered":
            print(f"answered by {event.clarification_answered.actor}")
        sys.stdout.flush()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--orchestrator", default="127.0.0.1:50051",
                        help="host:port of the orchestrator (http:// may be given)")
    parser.add_argument("--goal", default="Reserve 2 units of widget-7 for order-1001")
    parser.add_argument("--script", help="a scripted-model JSON file (docs/models.md)")
    parser.add_argument("--tool", action="append", default=[],
                        help="narrow the profile's tools to these (repeatable)")
    parser.add_argument("--token-file", help="a caller token (JWT) to send as a bearer")
    parser.add_argument("--actor", default="python-client",
                        help="who approves, without authentication")
    parser.add_argument("--deny", action="store_true", help="deny approvals instead")
    parser.add_argument("--idempotency-key", help="default: a new random key")
    parser.add_argument("--timeout", type=float, default=120,
                        help="seconds to give the whole run")
    parser.add_argument("--stubs", help="directory of the generated stubs (see stubs.py)")
    args = parser.parse_args()
    pb = stubs.load(args.stubs)

    target = args.orchestrator.removeprefix("http://")
    with grpc.insecure_channel(target) as channel:
        client = Client(pb, channel, args)
        try:
            invocation_id = client.start()
            followed = client.follow(invocation_id)
            invocation = client.call(client.api.GetInvocation, pb.orchestrator.GetInvocationRequest(
                invocation_id=invocation_id)).invocation
        except grpc.RpcError as error:
            print(f"client.py: {error.code().name}: {error.details()}", file=sys.stderr)
            return 1
    reason = name(pb.common.TerminalReason, invocation.terminal_reason, "TERMINAL_REASON_")
    print(f"terminal reason: {reason}")
    if invocation.HasField("answer"):
        print(f"answer: {invocation.answer}")
    elif invocation.terminal_detail:
        print(f"detail: {invocation.terminal_detail}")
    completed = followed and invocation.terminal_reason == pb.common.TERMINAL_REASON_COMPLETED
    return 0 if completed else 1


if __name__ == "__main__":
    sys.exit(main())
