"""The official A2A Python SDK (a2a-sdk) as a real client of omicos's A2A
endpoint, driven by tests/tests/a2a.rs.

argv[1] is a JSON plan: {"url": base URL, "alice": token, "bob": token}.
Each step's observations are printed as one JSON object on stdout; the Rust
test asserts on them. A step that raises records the error's class and
message instead of stopping the run.
"""

import asyncio
import json
import sys
import uuid

import httpx

from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.types.a2a_pb2 import (
    AgentCard,
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    TaskState,
)


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


def client(card, token, streaming, polling=False):
    http = httpx.AsyncClient(
        headers={"Authorization": f"Bearer {token}"}, timeout=60.0
    )
    config = ClientConfig(streaming=streaming, polling=polling, httpx_client=http)
    return ClientFactory(config).create(card)


async def send_once(c, msg):
    events = []
    async for ev in c.send_message(SendMessageRequest(message=msg)):
        if ev.HasField("task"):
            events.append({"task": task_summary(ev.task)})
        elif ev.HasField("status_update"):
            u = ev.status_update
            events.append(
                {
                    "status": TaskState.Name(u.status.state),
                    "task_id": u.task_id,
                    "context_id": u.context_id,
                }
            )
        elif ev.HasField("artifact_update"):
            a = ev.artifact_update
            events.append(
                {
                    "artifact": "".join(p.text for p in a.artifact.parts),
                    "task_id": a.task_id,
                    "last_chunk": a.last_chunk,
                }
            )
        elif ev.HasField("message"):
            events.append({"message": "".join(p.text for p in ev.message.parts)})
    return events


async def main(plan):
    url, alice, bob = plan["url"], plan["alice"], plan["bob"]
    out = {}
    async with httpx.AsyncClient(timeout=60.0) as anon:
        card = await A2ACardResolver(anon, url).get_agent_card()
    out["card"] = {
        "name": card.name,
        "streaming": card.capabilities.streaming,
        "skills": [s.id for s in card.skills],
        "schemes": sorted(card.security_schemes.keys()),
        "interfaces": [
            [i.protocol_binding, i.protocol_version, i.url]
            for i in card.supported_interfaces
        ],
    }

    # message/send (blocking): one turn, answered as a completed task.
    a_send = client(card, alice, streaming=False)
    events = await send_once(a_send, message("first question"))
    out["send"] = events
    first = events[-1]["task"]

    # message/stream in the same context: status updates, then the artifact.
    a_stream = client(card, alice, streaming=True)
    out["stream"] = await send_once(
        a_stream, message("second question", first["context_id"])
    )

    # tasks/get of the first task.
    t = await a_send.get_task(GetTaskRequest(id=first["id"]))
    out["get"] = task_summary(t)

    # A running task cancelled: sent without waiting, then tasks/cancel.
    a_poll = client(card, alice, streaming=False, polling=True)
    running = (await send_once(a_poll, message("a long one", first["context_id"])))[-1]["task"]
    out["running"] = running
    cancelled = await a_send.cancel_task(CancelTaskRequest(id=running["id"]))
    out["cancel"] = task_summary(cancelled)
    try:
        await a_send.cancel_task(CancelTaskRequest(id=running["id"]))
        out["cancel_again"] = {"error": None}
    except Exception as e:  # noqa: BLE001
        out["cancel_again"] = error(e)

    # Bob reaches none of Alice's context or tasks.
    b = client(card, bob, streaming=False)
    for name, call in [
        ("bob_send", lambda: send_once(b, message("let me in", first["context_id"]))),
        ("bob_get", lambda: b.get_task(GetTaskRequest(id=first["id"]))),
        ("bob_cancel", lambda: b.cancel_task(CancelTaskRequest(id=running["id"]))),
    ]:
        try:
            r = await call()
            out[name] = {"error": None, "result": str(r)}
        except Exception as e:  # noqa: BLE001
            out[name] = error(e)

    # The 0.3 binding, through the SDK's compatibility transport: the card
    # with its 0.3 interface only.
    legacy = AgentCard()
    legacy.CopyFrom(card)
    keep = [i for i in card.supported_interfaces if i.protocol_version.startswith("0.3")]
    del legacy.supported_interfaces[:]
    legacy.supported_interfaces.extend(keep)
    a_legacy = client(legacy, alice, streaming=False)
    out["legacy_transport"] = type(a_legacy._transport).__name__
    out["legacy_send"] = await send_once(a_legacy, message("third question"))
    a_legacy_stream = client(legacy, alice, streaming=True)
    out["legacy_stream"] = await send_once(a_legacy_stream, message("fourth question"))
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
