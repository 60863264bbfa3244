"""Captures what LiteLLM's Anthropic endpoint (/v1/messages) streams when
the model behind it is OpenAI-compatible and answers with a tool call.

Run: python3 -m venv /tmp/litellm-venv && /tmp/litellm-venv/bin/pip install 'litellm[proxy]'
     /tmp/litellm-venv/bin/python tests/stream-captures/capture_litellm.py

It starts an OpenAI-compatible model on 127.0.0.1 that streams one tool call
the way llama.cpp's OpenAI-compatible server does (the id and name again
in every fragment, the arguments in small pieces, a last fragment of only
whitespace), puts `litellm` in front of it, asks /v1/messages
with stream=true, and writes the raw SSE body to litellm_split_tool_use.sse
beside this file, with the LiteLLM version in litellm_version.txt.
"""

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ARGS = '{"command": "ls -la /tmp && echo done", "timeout_secs": 30}'


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Model(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_POST(self):
        n = int(self.headers.get("content-length", 0))
        req = json.loads(self.rfile.read(n) or b"{}")
        with open(os.path.join(HERE, ".last_model_request.json"), "w") as f:
            json.dump(req, f)
        if not req.get("stream"):
            body = json.dumps({
                "id": "chatcmpl-cap", "object": "chat.completion", "created": 1,
                "model": "fake-model",
                "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                    "role": "assistant", "content": None,
                    "tool_calls": [{"id": "call_cap1", "type": "function",
                                    "function": {"name": "shell", "arguments": ARGS}}]}}],
                "usage": {"prompt_tokens": 20, "completion_tokens": 12, "total_tokens": 32},
            }).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()

        def chunk(delta, finish=None):
            body = {
                "id": "chatcmpl-cap",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": "fake-model",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
            self.wfile.write(f"data: {json.dumps(body)}\n\n".encode())
            self.wfile.flush()

        chunk({"role": "assistant", "content": None})
        chunk({"tool_calls": [{"index": 0, "id": "call_cap1", "type": "function",
                               "function": {"name": "shell", "arguments": ""}}]})
        pieces = [ARGS[i:i + 7] for i in range(0, len(ARGS), 7)]
        # As llama.cpp's server and llama-cpp-python stream a call: the id
        # and name again in every fragment, and a whitespace-only fragment
        # before the end.
        for p in pieces + [" "]:
            chunk({"tool_calls": [{"index": 0, "id": "call_cap1", "type": "function",
                                   "function": {"name": "shell", "arguments": p}}]})
        chunk({}, "tool_calls")
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


def main():
    mport, lport = free_port(), free_port()
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", mport), Model)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    litellm = os.path.join(os.path.dirname(sys.executable), "litellm")
    proc = subprocess.Popen(
        [litellm, "--model", "hosted_vllm/fake-model", "--api_base", f"http://127.0.0.1:{mport}/v1",
         "--port", str(lport), "--host", "127.0.0.1"],
        env={**os.environ, "OPENAI_API_KEY": "sk-capture", "LITELLM_MASTER_KEY": "sk-capture-master"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(240):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{lport}/health/liveliness", timeout=1)
                break
            except Exception:
                time.sleep(0.5)
        req = {
            "model": "fake-model", "max_tokens": 256, "stream": True,
            "messages": [{"role": "user", "content": "list /tmp"}],
            "tools": [{"name": "shell", "description": "run a command",
                       "input_schema": {"type": "object", "properties": {
                           "command": {"type": "string"}, "timeout_secs": {"type": "integer"}}}}],
        }
        r = urllib.request.Request(
            f"http://127.0.0.1:{lport}/v1/messages", data=json.dumps(req).encode(),
            headers={"content-type": "application/json", "x-api-key": "sk-capture-master",
                     "anthropic-version": "2023-06-01"})
        body = urllib.request.urlopen(r, timeout=60).read().decode()
        with open(os.path.join(HERE, "litellm_split_tool_use.sse"), "w") as f:
            f.write(body)
        import importlib.metadata
        with open(os.path.join(HERE, "litellm_version.txt"), "w") as f:
            f.write(f"litellm {importlib.metadata.version('litellm')}\n")
        print(body)
    finally:
        proc.terminate()
        srv.shutdown()


if __name__ == "__main__":
    main()
