"""Hand-built episode records for tests of the readers (summary, pairing, replay), stand-ins for a model, and a stand-in
OpenAI-compatible chat server."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from rir_runtime.memory import MemorySnapshot
from rir_runtime.trace import EpisodeRecord, Event


def episode_record(*events: Event, **fields: Any) -> EpisodeRecord:
    """A record with neutral defaults; `fields` override any of them."""
    values: dict[str, Any] = dict(
        env="builtin", task="workshop-3", split="dev", variation=0, method="rir", controller="heuristic",
        policy="noisy-expert", success=False, score=0.0, agent_calls=10, controller_calls=0, rollbacks=0,
        recoveries=0, env_steps=10, prompt_tokens=0, completion_tokens=0, wall_s=0.0, parse_failures=0,
        restore_divergences=0, oracle_env_steps=0, first_error_step=None, stop_reason="lost",
        memory=MemorySnapshot(), events=tuple(events), episode_id="e1", seed=0, budget_agent=60, budget_rollback=5,
    )  # fmt: skip
    values.update(fields)
    return EpisodeRecord(**values)


class ChatHandler(BaseHTTPRequestHandler):
    """Answers every chat.completions request with `content` and fixed usage; `received` sees each body
    first (a subclass records or delays there)."""

    content = "Action: go north"
    usage = {"prompt_tokens": 17, "completion_tokens": 5, "total_tokens": 22}

    def received(self, body: dict[str, Any]) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.received(body)
        choice = {"index": 0, "message": {"role": "assistant", "content": self.content}, "finish_reason": "stop"}
        reply = {
            "id": "x",
            "object": "chat.completion",
            "model": body["model"],
            "choices": [choice],
            "usage": self.usage,
        }
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def chat_server(handler: type[ChatHandler], monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A local server of `handler` for the block; yields its address (an API key set, no proxy)."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()


# --- stand-ins for a model ------------------------------------------------------------------------------
@dataclass
class FakeCompletion:
    text: str
    prompt_tokens: int = 10
    completion_tokens: int = 5


class ScriptedBackend:
    """Replies from a fixed list (then repeats the last): a narrow stand-in for a model."""

    supports_scoring = False
    name = "scripted"

    def __init__(self, replies: list[str]) -> None:
        self.replies, self.calls = replies, 0

    def generate(self, prompts, **kwargs):
        reply = self.replies[min(self.calls, len(self.replies) - 1)]
        self.calls += 1
        return [FakeCompletion(reply) for _ in prompts]


@dataclass
class Margin:
    """Scores recover vs continue with a fixed log-odds margin: a narrow stand-in for a model."""

    margin: float
    name: str = "margin"
    supports_scoring: bool = True

    def score(self, prompt, continuations):
        return [self.margin if "recover" in c else 0.0 for c in continuations]
