"""A remote A2A agent built with the official A2A Python SDK (a2a-sdk), the
peer of omicos's A2A client in tests/tests/a2a_client.rs.

Usage: server.py PORT RECORD_FILE [TOKEN]

Its executor records every message it receives (one JSON line in
RECORD_FILE) and answers by what the text starts with:
- `fail:<reason>`: the task fails with <reason> as its status message;
- `huge:<n>`: an artifact of <n> characters;
- `slow:`: works until cancelled (records the cancel);
- anything else: an artifact "remote says: <the text reversed>".
With TOKEN, the JSON-RPC endpoint answers 401 to a request without
`Authorization: Bearer TOKEN` (the card stays open, as A2A expects).

With A2A_TEST_PROTOCOL=0.3 in its environment it is an agent of A2A 0.3:
its card is a 0.3 card (`protocolVersion: 0.3.0`, `url`, no
`supportedInterfaces`) and its JSON-RPC endpoint runs with the SDK's 0.3
compatibility (`message/send`, `tasks/get`, `tasks/cancel`). It records
the method of every JSON-RPC request, so a test sees which dialect came.
"""

import asyncio
import json
import os
import sys

import uvicorn
from starlette.applications import Starlette
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.responses import JSONResponse

from a2a.helpers.proto_helpers import get_message_text, new_text_message
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes.agent_card_routes import create_agent_card_routes
from a2a.server.routes.jsonrpc_routes import create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Part,
    Role,
    Task,
    TaskState,
    TaskStatus,
)

PORT = int(sys.argv[1])
RECORD = sys.argv[2]
TOKEN = sys.argv[3] if len(sys.argv) > 3 else ""
V03 = os.environ.get("A2A_TEST_PROTOCOL") == "0.3"


def record(entry):
    with open(RECORD, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")


class Reverser(AgentExecutor):
    async def execute(self, context: RequestContext, event_queue: EventQueue):
        text = get_message_text(context.message)
        record({"event": "message", "text": text, "task_id": context.task_id})
        if not context.current_task:
            await event_queue.enqueue_event(
                Task(
                    id=context.task_id,
                    context_id=context.context_id,
                    status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED),
                    history=[context.message],
                )
            )
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        await updater.start_work()
        if text.startswith("fail:"):
            reason = text[len("fail:") :].strip()
            await updater.failed(
                new_text_message(
                    reason,
                    context_id=context.context_id,
                    task_id=context.task_id,
                    role=Role.ROLE_AGENT,
                )
            )
            return
        if text.startswith("slow:"):
            await asyncio.sleep(600)
            return
        if text.startswith("huge:"):
            n = int(text[len("huge:") :].strip())
            answer = "".join(chr(ord("a") + i % 26) for i in range(n))
        else:
            answer = "remote says: " + text[::-1]
        await updater.add_artifact([Part(text=answer)], name="answer")
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue):
        record({"event": "cancel", "task_id": context.task_id})
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        await updater.cancel()


class Bearer(BaseHTTPMiddleware):
    async def dispatch(self, request, call_next):
        if (
            TOKEN
            and request.url.path == "/a2a"
            and request.headers.get("authorization") != f"Bearer {TOKEN}"
        ):
            record({"event": "unauthorized"})
            return JSONResponse({"error": "unauthorized"}, status_code=401)
        if request.url.path == "/a2a" and request.method == "POST":
            try:
                method = json.loads(await request.body()).get("method")
            except Exception:
                method = None
            record({"event": "rpc", "method": method})
        return await call_next(request)


card = AgentCard(
    name="reverser",
    description="Reverses what it is told (a test agent on the official A2A SDK).",
    version="1.0.0",
    supported_interfaces=[
        AgentInterface(
            url=f"http://127.0.0.1:{PORT}/a2a",
            protocol_binding="JSONRPC",
            protocol_version="1.0",
        )
    ],
    capabilities=AgentCapabilities(streaming=True),
    default_input_modes=["text/plain"],
    default_output_modes=["text/plain"],
    skills=[
        AgentSkill(
            id="reverse",
            name="Reverse text",
            description="Answers with the text it got, reversed.",
            tags=["text"],
        )
    ],
)

handler = DefaultRequestHandler(
    agent_executor=Reverser(), task_store=InMemoryTaskStore(), agent_card=card
)

async def card_v03(_request):
    """The same agent described as A2A 0.3 describes one."""
    return JSONResponse(
        {
            "protocolVersion": "0.3.0",
            "name": card.name,
            "description": card.description,
            "url": f"http://127.0.0.1:{PORT}/a2a",
            "preferredTransport": "JSONRPC",
            "version": card.version,
            "capabilities": {"streaming": True},
            "defaultInputModes": ["text/plain"],
            "defaultOutputModes": ["text/plain"],
            "skills": [
                {"id": s.id, "name": s.name, "description": s.description, "tags": list(s.tags)}
                for s in card.skills
            ],
        }
    )


if V03:
    from starlette.routing import Route

    routes = [Route("/.well-known/agent-card.json", card_v03)] + create_jsonrpc_routes(
        handler, "/a2a", enable_v0_3_compat=True
    )
else:
    routes = create_agent_card_routes(card) + create_jsonrpc_routes(handler, "/a2a")
app = Starlette(routes=routes)
app.add_middleware(Bearer)

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=PORT, log_level="warning")
