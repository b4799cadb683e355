"""An A2A client no one here wrote, driving agentloop's A2A endpoint.

The official Python SDK (`a2a-sdk`) resolves the Agent Card, picks the JSON-RPC
interface and calls it. Each scenario prints what the client saw as one JSON object
on stdout; tests/tests/a2a.rs judges it.

    python3 client.py SCENARIO BASE_URL [TOKEN [OTHER_TENANTS_TOKEN]]
"""

import asyncio
import json
import sys
import uuid

import httpx
from a2a.client import A2AClientError, ClientConfig, create_client
from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import InvalidParamsError, TaskNotFoundError
from google.protobuf import json_format


def state(value):
    return pb.TaskState.Name(value)


def message(text=None, data=None, task_id=""):
    parts = []
    if text is not None:
        parts.append(pb.Part(text=text))
    if data is not None:
        part = pb.Part()
        part.data.struct_value.update(data)
        parts.append(part)
    return pb.SendMessageRequest(
        message=pb.Message(
            message_id=str(uuid.uuid4()), role=pb.ROLE_USER, parts=parts, task_id=task_id
        )
    )


def event_summary(event):
    """One stream event as [kind, state or artifact, words]."""
    kind = event.WhichOneof("payload")
    if kind == "task":
        return ["task", state(event.task.status.state), event.task.id]
    if kind == "status_update":
        status = event.status_update.status
        words = [p.text for p in status.message.parts if p.text]
        data = [json_format.MessageToDict(p.data) for p in status.message.parts if p.HasField("data")]
        return ["status", state(status.state), words, data]
    if kind == "artifact_update":
        artifact = event.artifact_update.artifact
        return ["artifact", artifact.artifact_id, [p.text for p in artifact.parts if p.text]]
    return [kind]


async def client(base, token=None, streaming=True):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    http = httpx.AsyncClient(headers=headers, timeout=60)
    config = ClientConfig(streaming=streaming, httpx_client=http)
    return await create_client(base, client_config=config)


async def collect(stream):
    return [event_summary(event) async for event in stream]


async def complete(base):
    """A task sent and answered, then the same task streamed, then sent again."""
    seen = {}
    blocking = await client(base, streaming=False)
    seen["card"] = json_format.MessageToDict(blocking._card)
    # A client given the endpoint as the agent's URL finds the same card under it.
    beside = await create_client(base + "/a2a")
    seen["card_under_endpoint"] = json_format.MessageToDict(beside._card)
    request = message("What is the profile and the policy?")
    [answer] = [event async for event in blocking.send_message(request)]
    task = answer.task
    seen["task"] = {
        "id": task.id,
        "state": state(task.status.state),
        "artifacts": [json_format.MessageToDict(a) for a in task.artifacts],
    }
    got = await blocking.get_task(pb.GetTaskRequest(id=task.id))
    seen["got"] = {"id": got.id, "state": state(got.status.state)}
    # The same message again (a retry after a lost answer) is the same task.
    [again] = [event async for event in blocking.send_message(request)]
    seen["again"] = again.task.id
    streaming = await client(base)
    seen["stream"] = await collect(streaming.send_message(message("And again, streamed.")))
    try:
        await blocking.get_task(pb.GetTaskRequest(id="not-a-task"))
        seen["bogus"] = "answered"
    except TaskNotFoundError:
        seen["bogus"] = "not found"
    listed = await blocking.list_tasks(pb.ListTasksRequest(history_length=0))
    seen["listed"] = [
        {"id": t.id, "state": state(t.status.state), "artifacts": len(t.artifacts),
         "history": len(t.history)}
        for t in listed.tasks
    ]
    try:
        await blocking.list_tasks(pb.ListTasksRequest(page_size=0))
        seen["page_size_0"] = "answered"
    except InvalidParamsError:
        seen["page_size_0"] = "invalid"
    return seen


async def input_required(base):
    """A question, then an approval, each answered by a reply message."""
    seen = {}
    agent = await client(base)
    first = await collect(agent.send_message(message("Move money for me.")))
    seen["asked"] = first
    task_id = first[0][2]
    seen["answered"] = await collect(agent.send_message(message("alice to bob", task_id=task_id)))
    approval = seen["answered"][-1][3][0]
    try:
        await collect(agent.send_message(message("approve", task_id=task_id)))
        seen["bare_approve"] = "accepted"
    except InvalidParamsError as error:
        seen["bare_approve"] = str(error)
    reply = {"verdict": "approve", "proposalDigest": approval["proposalDigest"]}
    seen["approved"] = await collect(agent.send_message(message(data=reply, task_id=task_id)))
    try:
        await collect(agent.send_message(message("once more", task_id=task_id)))
        seen["after_end"] = "accepted"
    except Exception as error:  # noqa: BLE001 - the kind is what is judged
        seen["after_end"] = type(error).__name__
    return seen


async def tenants(base, token, other):
    """Another tenant's task does not exist; no token is refused; the owner cancels."""
    seen = {}
    owner = await client(base, token)
    seen["card"] = json_format.MessageToDict(owner._card)
    request = message("Move money for me.")
    request.configuration.return_immediately = True
    starter = await client(base, token, streaming=False)
    [started] = [event async for event in starter.send_message(request)]
    task_id = started.task.id
    intruder = await client(base, other)
    refusals = {}
    calls = {
        "get": lambda: intruder.get_task(pb.GetTaskRequest(id=task_id)),
        "cancel": lambda: intruder.cancel_task(pb.CancelTaskRequest(id=task_id)),
        "subscribe": lambda: collect(intruder.subscribe(pb.SubscribeToTaskRequest(id=task_id))),
        "reply": lambda: collect(intruder.send_message(message("bob", task_id=task_id))),
    }
    for name, call in calls.items():
        try:
            await call()
            refusals[name] = "answered"
        except TaskNotFoundError:
            refusals[name] = "not found"
    seen["intruder"] = refusals
    listed = await intruder.list_tasks(pb.ListTasksRequest())
    seen["intruder_lists"] = [t.id for t in listed.tasks]
    anonymous = await client(base)
    try:
        await anonymous.get_task(pb.GetTaskRequest(id=task_id))
        seen["anonymous"] = "answered"
    except A2AClientError as error:
        seen["anonymous"] = str(error)
    seen["subscribed"] = await collect(owner.subscribe(pb.SubscribeToTaskRequest(id=task_id)))
    cancelled = await owner.cancel_task(pb.CancelTaskRequest(id=task_id))
    seen["cancelled"] = state(cancelled.status.state)
    try:
        await owner.cancel_task(pb.CancelTaskRequest(id=task_id))
        seen["cancel_again"] = "answered"
    except Exception as error:  # noqa: BLE001 - the kind is what is judged
        seen["cancel_again"] = type(error).__name__
    return seen


SCENARIOS = {"complete": complete, "input": input_required, "tenants": tenants}

if __name__ == "__main__":
    scenario, *args = sys.argv[1:]
    print(json.dumps(asyncio.run(SCENARIOS[scenario](*args))))
