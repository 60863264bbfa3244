"""The official A2A Python SDK (a2a-sdk, with grpcio: both pinned in
requirements.txt) as a gRPC client of omicos's A2A binding
(`lf.a2a.v1.A2AService` on the orchestrator's port), driven by
tests/tests/a2a_grpc.rs.

argv[1] is a JSON plan: {"url": base URL, "alice": token, "bob": token}.
The card (read over HTTP) names the gRPC address; every client below is
made by the SDK's ClientFactory from that card with gRPC as its only
binding. Each step's observations are printed as one JSON object on stdout;
a step that raises records the error's class and message.
"""

import asyncio
import json
import sys
import uuid

import grpc
import httpx

from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
    TaskPushNotificationConfig,
    TaskState,
)


def with_bearer(d, token):
    md = grpc.aio.Metadata(*(list(d.metadata or ()) + [("authorization", f"Bearer {token}")]))
    return grpc.aio.ClientCallDetails(d.method, d.timeout, md, d.credentials, d.wait_for_ready)


# Two classes: grpc.aio files an interceptor under the first kind it is.
class BearerUnary(grpc.aio.UnaryUnaryClientInterceptor):
    """Adds `authorization: Bearer <token>` to unary calls."""

    def __init__(self, token):
        self.token = token

    async def intercept_unary_unary(self, continuation, d, request):
        return await continuation(with_bearer(d, self.token), request)


class BearerStream(grpc.aio.UnaryStreamClientInterceptor):
    """Adds `authorization: Bearer <token>` to server-streaming calls."""

    def __init__(self, token):
        self.token = token

    async def intercept_unary_stream(self, continuation, d, request):
        return await continuation(with_bearer(d, self.token), request)


def message(text, context_id=""):
    return Message(
        message_id=str(uuid.uuid4()),
        role=Role.ROLE_USER,
        parts=[Part(text=text)],
        context_id=context_id,
    )


def task_summary(task):
    return {
        "id": task.id,
        "context_id": task.context_id,
        "state": TaskState.Name(task.status.state),
        "artifacts": ["".join(p.text for p in a.parts) for a in task.artifacts],
        "history_roles": [Role.Name(m.role) for m in task.history],
    }


def error(e):
    return {"error": type(e).__name__, "message": str(e)}


def event(ev):
    if ev.HasField("task"):
        return {"task": task_summary(ev.task)}
    if ev.HasField("status_update"):
        u = ev.status_update
        return {"status": TaskState.Name(u.status.state), "task_id": u.task_id, "context_id": u.context_id}
    if ev.HasField("artifact_update"):
        a = ev.artifact_update
        return {
            "artifact": "".join(p.text for p in a.artifact.parts),
            "task_id": a.task_id,
            "last_chunk": a.last_chunk,
        }
    return {"message": "".join(p.text for p in ev.message.parts)}


def client(card, token, streaming, polling=False):
    """A client the SDK's factory makes from the card, over gRPC only."""
    interceptors = [BearerUnary(token), BearerStream(token)] if token is not None else []
    config = ClientConfig(
        streaming=streaming,
        polling=polling,
        supported_protocol_bindings=["GRPC"],
        grpc_channel_factory=lambda url: grpc.aio.insecure_channel(url, interceptors=interceptors),
    )
    return ClientFactory(config).create(card)


async def send_once(c, msg):
    return [event(ev) async for ev in c.send_message(SendMessageRequest(message=msg))]


async def attempt(call):
    try:
        r = await call()
        return {"error": None, "result": str(r)[:300]}
    except Exception as e:  # noqa: BLE001
        return error(e)


async def main(plan):
    url, alice, bob = plan["url"], plan["alice"], plan["bob"]
    out = {}
    async with httpx.AsyncClient(timeout=60.0) as anon:
        card = await A2ACardResolver(anon, url).get_agent_card()
    out["interfaces"] = [[i.protocol_binding, i.protocol_version, i.url] for i in card.supported_interfaces]

    # SendMessage (blocking): a completed task with the model's answer.
    a_send = client(card, alice, streaming=False)
    out["transport"] = type(a_send._transport).__name__
    events = await send_once(a_send, message("first question"))
    out["send"] = events
    first = events[-1]["task"]

    # SendStreamingMessage in the same context.
    a_stream = client(card, alice, streaming=True)
    out["stream"] = await send_once(a_stream, message("second question", first["context_id"]))

    # GetTask of the first task.
    out["get"] = task_summary(await a_send.get_task(GetTaskRequest(id=first["id"])))

    # SubscribeToTask from a second client while the task runs: a task sent
    # without waiting, followed to its end by another channel.
    a_poll = client(card, alice, streaming=False, polling=True)
    slow = (await send_once(a_poll, message("a slow one")))[-1]["task"]
    out["slow_sent"] = slow
    a_sub = client(card, alice, streaming=True)
    out["subscribe"] = [event(ev) async for ev in a_sub.subscribe(SubscribeToTaskRequest(id=slow["id"]))]
    # Ended: nothing more to subscribe to.
    out["subscribe_ended"] = await attempt(
        lambda: a_sub.subscribe(SubscribeToTaskRequest(id=slow["id"])).__anext__()
    )

    # CancelTask of a running task, then again.
    running = (await send_once(a_poll, message("a long one")))[-1]["task"]
    out["running"] = running
    out["cancel"] = task_summary(await a_send.cancel_task(CancelTaskRequest(id=running["id"])))
    out["cancel_again"] = await attempt(lambda: a_send.cancel_task(CancelTaskRequest(id=running["id"])))

    # ListTasks: Alice's, paged by two.
    page = await a_send.list_tasks(ListTasksRequest(page_size=2, include_artifacts=True))
    ids = [t.id for t in page.tasks]
    pages = [[t.id for t in page.tasks]]
    while page.next_page_token:
        page = await a_send.list_tasks(ListTasksRequest(page_size=2, page_token=page.next_page_token))
        ids += [t.id for t in page.tasks]
        pages.append([t.id for t in page.tasks])
    out["list"] = {"ids": ids, "pages": pages, "total_size": page.total_size}
    done = await a_send.list_tasks(
        ListTasksRequest(status=TaskState.TASK_STATE_COMPLETED, context_id=first["context_id"], include_artifacts=True)
    )
    out["list_completed_in_first_context"] = [task_summary(t) for t in done.tasks]

    # Bob: his own task, listed alone; none of Alice's reachable.
    b = client(card, bob, streaming=False)
    b_stream = client(card, bob, streaming=True)
    out["bob_own"] = (await send_once(b, message("bob's question")))[-1]["task"]
    out["bob_list"] = [t.id for t in (await b.list_tasks(ListTasksRequest())).tasks]
    for name, call in [
        ("bob_send", lambda: send_once(b, message("let me in", first["context_id"]))),
        ("bob_send_task", lambda: send_once(b, Message(
            message_id="m", role=Role.ROLE_USER, parts=[Part(text="x")], task_id=first["id"]))),
        ("bob_get", lambda: b.get_task(GetTaskRequest(id=first["id"]))),
        ("bob_cancel", lambda: b.cancel_task(CancelTaskRequest(id=running["id"]))),
        ("bob_subscribe", lambda: b_stream.subscribe(SubscribeToTaskRequest(id=slow["id"])).__anext__()),
    ]:
        out[name] = await attempt(call)

    bob_sees = await b.list_tasks(ListTasksRequest(context_id=first["context_id"]))
    out["bob_list_alices_context"] = [t.id for t in bob_sees.tasks]

    # A wrong credential and none: UNAUTHENTICATED.
    for name, token in [("wrong_token", "wrong"), ("no_token", None)]:
        c = client(card, token, streaming=False)
        out[name] = await attempt(lambda: c.get_task(GetTaskRequest(id=first["id"])))

    # Push notifications are not supported.
    out["push"] = await attempt(
        lambda: a_send.create_task_push_notification_config(
            TaskPushNotificationConfig(task_id=first["id"], url="https://example.invalid/hook")
        )
    )
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
