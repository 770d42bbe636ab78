"""`OpenAIBackend` on the `openai` SDK: against a scripted stub (seconds) and a real `transformers serve`
on the packaged SmolLM2 (integration, a couple of minutes on a CPU)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from rir_runtime.errors import ModelLoadError, ServerError, UnknownNameError, UserInputError
from rir_runtime.llm import Completion, OpenAIBackend, make_backend
from rir_runtime.llm.remote import Usage, guided_choice_body

CHAT = [{"role": "user", "content": "Where next?"}]


# --- a scripted OpenAI-compatible stub ------------------------------------------------------------
@dataclass
class Script:
    """What the stub answers: `failures` are HTTP statuses sent, in order, before it answers properly."""

    failures: list[int] = field(default_factory=list)
    reply: str = "Action: go north\nThought: the hall"
    owned_by: str = "local"
    served: tuple[str, ...] = ("my/model",)
    delay: float = 0.0
    seen: list[dict] = field(default_factory=list)
    in_flight: int = 0
    most_in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def _answer(script: Script, path: str, body: dict) -> tuple[int, dict, dict[str, str]]:
    with script.lock:
        status = script.failures.pop(0) if script.failures else 200
    if status == 429:
        return 429, {"error": {"message": "Rate limit reached", "type": "rate_limit_error"}}, {"retry-after-ms": "10"}
    if status != 200:
        return status, {"error": {"message": f"scripted failure {status}"}}, {}
    if body["model"] not in script.served:  # what vLLM answers
        return 404, {"object": "error", "message": f"The model `{body['model']}` does not exist.", "code": 404}, {}
    usage = {"prompt_tokens": 17, "completion_tokens": 5, "total_tokens": 22}
    text = script.reply
    if "structured_outputs" in body:  # a vLLM-style guided choice: spell the last choice
        text = body["structured_outputs"]["choice"][-1]
    if path.endswith("/chat/completions"):
        message = {"role": "assistant", "content": text}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        return 200, {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                     "choices": [choice], "usage": usage}, {}  # fmt: skip
    choice = {"index": 0, "text": text, "finish_reason": "stop"}
    return 200, {"id": "x", "object": "text_completion", "created": 0, "model": body["model"],
                 "choices": [choice], "usage": usage}, {}  # fmt: skip


@contextmanager
def stub_server(script: Script) -> Iterator[str]:
    """A threaded local server speaking the OpenAI API as `script` says; yields its base URL."""

    class Handler(BaseHTTPRequestHandler):
        def _send(self, status: int, payload: dict, headers: dict[str, str] | None = None) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            for key, value in {"Content-Type": "application/json", **(headers or {})}.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            try:
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up first (the timeout test)
                pass

        def do_GET(self) -> None:  # noqa: N802
            cards = [{"id": m, "object": "model", "created": 0, "owned_by": script.owned_by} for m in script.served]
            self._send(200, {"object": "list", "data": cards}) if self.path == "/v1/models" else self._send(404, {})

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with script.lock:
                script.seen.append({"path": self.path, "auth": self.headers.get("Authorization"), **body})
                script.in_flight += 1
                script.most_in_flight = max(script.most_in_flight, script.in_flight)
            try:
                time.sleep(script.delay)
                self._send(*_answer(script, self.path, body))
            finally:
                with script.lock:
                    script.in_flight -= 1

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


# --- unit tests against the stub ------------------------------------------------------------------
def test_rate_limited_requests_are_retried_then_reported() -> None:
    script = Script(failures=[429, 429])
    with stub_server(script) as url:
        out = OpenAIBackend(url, "my/model", max_retries=2).generate([CHAT], max_new_tokens=8, stop=["\n"])
        assert out == [Completion("Action: go north", 17, 5)]
        assert len(script.seen) == 3  # two 429s, then the answer
        script.failures = [429, 429]
        with pytest.raises(ServerError, match="HTTP 429: Rate limit reached.*still rate-limited after 2 tries"):
            OpenAIBackend(url, "my/model", max_retries=1).generate([CHAT], max_new_tokens=8)


def test_chat_goes_to_chat_completions_raw_text_to_completions_with_extra_body(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    script = Script()
    with stub_server(script) as url:
        backend = make_backend(f"openai:my/model@{url}", extra_body={"top_k": 1, "repetition_penalty": 1.1})
        assert isinstance(backend, OpenAIBackend) and backend.name == f"openai:my/model@{url}/v1"
        out = backend.generate([CHAT, "raw prompt"], max_new_tokens=8, stop=["\n"], temperature=0.5)
    assert out == [Completion("Action: go north", 17, 5)] * 2
    by_path = {s["path"]: s for s in script.seen}
    assert set(by_path) == {"/v1/chat/completions", "/v1/completions"}
    assert by_path["/v1/chat/completions"]["messages"] == CHAT and by_path["/v1/completions"]["prompt"] == "raw prompt"
    for sent in script.seen:
        assert sent["model"] == "my/model" and sent["auth"] == "Bearer sk-test"
        assert sent["max_tokens"] == 8 and sent["stop"] == ["\n"] and sent["temperature"] == 0.5
        assert sent["top_k"] == 1 and sent["repetition_penalty"] == 1.1  # extra_body, merged into the request
    assert backend.usage == Usage(requests=2, prompt_tokens=34, completion_tokens=10)


def test_a_batch_is_sent_as_concurrent_requests() -> None:
    script = Script(delay=0.2)
    with stub_server(script) as url:
        out = OpenAIBackend(url, "my/model", max_workers=4).generate([CHAT] * 4, max_new_tokens=4)
    assert len(out) == 4 and len(script.seen) == 4
    assert script.most_in_flight > 1


def test_unreachable_server_and_timeout_are_clear_errors() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    backend = OpenAIBackend(f"http://127.0.0.1:{port}", "m", max_retries=0)
    with pytest.raises(ModelLoadError, match=r"cannot reach .*127.0.0.1:\d+/v1.*start it .*openai:<model>@<url>"):
        backend.generate([CHAT], max_new_tokens=4)
    with stub_server(Script(delay=1.0)) as url:
        slow = OpenAIBackend(url, "my/model", timeout=0.2, max_retries=0)
        with pytest.raises(ModelLoadError, match="did not answer within 0.2s .*raise the backend's timeout"):
            slow.generate([CHAT], max_new_tokens=4)


def test_a_model_the_server_does_not_serve_is_named_with_the_served_ones() -> None:
    script = Script(served=("Qwen/Qwen2.5-7B-Instruct", "other/model"))
    with stub_server(script) as url:
        with pytest.raises(
            UnknownNameError, match="'Qwen/Qwen2.5-7B-Instruc'.*Did you mean 'Qwen/Qwen2.5-7B-Instruct'"
        ):
            make_backend(f"openai:Qwen/Qwen2.5-7B-Instruc@{url}").generate([CHAT], max_new_tokens=4)
        script.failures = [422]
        with pytest.raises(ServerError, match="HTTP 422: scripted failure 422.*drop the fields"):
            OpenAIBackend(url, "other/model", max_retries=0, extra_body={"x": 1}).generate([CHAT], max_new_tokens=4)


@pytest.mark.parametrize("owner", ["vllm", "sglang", "local"])
def test_choose_uses_guided_decoding_where_the_server_offers_it(owner: str) -> None:
    choices = ["Action: go north", "Action: open door (north)", "Action: rollback"]
    script = Script(owned_by=owner, reply="Action: open door (north)")  # what an SGLang regex would allow
    with stub_server(script) as url:
        backend = OpenAIBackend(url, "my/model")
        if owner == "local":  # e.g. transformers serve: no guided decoding
            with pytest.raises(UserInputError, match="cannot constrain decoding.*vLLM or SGLang.*generate mode"):
                backend.choose(CHAT, choices)
            assert not script.seen
            return
        pick, completion = backend.choose(CHAT, choices, [0.0, 0.0, 0.0])
        with pytest.raises(UserInputError, match="cannot take penalties.*memory_guidance hard"):
            backend.choose(CHAT, choices, [0.0, 5.0, 0.0])
    sent = script.seen[0]
    assert {k: sent[k] for k in guided_choice_body(owner, choices)} == guided_choice_body(owner, choices)  # type: ignore[arg-type]
    assert sent["temperature"] == 0.0 and "stop" not in sent
    assert pick == (2 if owner == "vllm" else 1) and completion.text == choices[pick]
    assert guided_choice_body("sglang", ["a.b", "c"]) == {"regex": r"(a\.b|c)"}
    with pytest.raises(UserInputError, match="cannot score continuations"):
        backend.score(CHAT, ["a"])


# --- integration: a real server started from PyPI packages ----------------------------------------
SMOLLM2 = "smollm2-135m-instruct"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served_smollm2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """`transformers serve` on the packaged SmolLM2's local folder, offline: (model id, base URL)."""
    pytest.importorskip("fastapi", reason="the server needs the serve extra: pip install -e '.[serve]'")
    pytest.importorskip("uvicorn", reason="the server needs the serve extra: pip install -e '.[serve]'")
    from rir_runtime.llm.registry import local_path

    folder, port = str(local_path(SMOLLM2)), _free_port()
    log = tmp_path_factory.mktemp("serve") / "server.log"
    # One torch thread: on a CPU shared with other jobs, OpenMP threads spin-waiting on each other stall decoding.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "transformers.cli.transformers", "serve", folder]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--device", "cpu", "--dtype", "float32"]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        _wait_healthy(f"http://127.0.0.1:{port}/health", proc, log)
        yield folder, f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_healthy(url: str, proc: subprocess.Popen, log: Path, limit_s: float = 240.0) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"transformers serve exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(1.0)
    pytest.fail(f"transformers serve did not answer {url} within {limit_s:g}s:\n{log.read_text()[-3000:]}")


@pytest.mark.integration
def test_served_smollm2_answers_chat_and_raw_text_and_names_a_wrong_model(served_smollm2: tuple[str, str]) -> None:
    model, url = served_smollm2
    backend = make_backend(f"openai:{model}@{url}")
    question = [{"role": "user", "content": "What is the capital of France?"}]
    chat, raw = backend.generate([question, "The capital of France is"], max_new_tokens=12, stop=["\n"])
    print(f"\n[server] {backend.name}\n  chat: {chat}\n  raw:  {raw}")
    assert "Paris" in chat.text and "\n" not in chat.text and chat.completion_tokens > 0
    assert raw.text and raw.prompt_tokens < chat.prompt_tokens  # no chat template around the raw text
    assert isinstance(backend, OpenAIBackend) and backend.usage.requests == 2
    with pytest.raises(UnknownNameError, match=f"unknown model on {url}/v1 'smollm2'.*Valid: {model}"):
        make_backend(f"openai:smollm2@{url}").generate([question], max_new_tokens=4)
    with pytest.raises(UserInputError, match="cannot constrain decoding.*vLLM or SGLang"):
        backend.choose(question, ["Paris", "Rome"])  # transformers serve names itself `local`


@pytest.mark.integration
def test_served_smollm2_acts_as_a_policy_on_a_builtin_step(served_smollm2: tuple[str, str]) -> None:
    from rir_runtime.agent import AgentContext
    from rir_runtime.envs import TaskSpec, make_env
    from rir_runtime.envs.checkpoints import Step
    from rir_runtime.memory import ReflectionMemory
    from rir_runtime.policies import LLMPolicy

    model, url = served_smollm2
    backend = make_backend(f"openai:{model}@{url}")
    assert isinstance(backend, OpenAIBackend)
    env = make_env("builtin")
    first = env.reset(TaskSpec("builtin", "workshop-3", "dev", 0))
    opening = env.expert_actions()[0]
    result = env.step(opening)
    history = (Step(0, opening, result.observation, result.score),)
    ctx = AgentContext(
        "workshop-3", first.objective, ReflectionMemory(), history, result.observation, env.admissible_actions
    )
    action = LLMPolicy(backend, "generate").act(ctx)
    outcome = env.step(action.text) if action.kind == "task" else None
    print(f"\n[policy] {backend.usage.requests} request(s), {action}\n  env: {outcome and outcome.observation!r}")
    assert backend.usage.requests == 1 + action.parse_failure  # one reply, retried once when it names no action
    assert (action.prompt_tokens, action.completion_tokens) == (
        backend.usage.prompt_tokens,
        backend.usage.completion_tokens,
    )
    assert action.prompt_tokens > 0 and action.completion_tokens > 0
    assert action.kind in ("task", "rollback")
    if action.parse_failure:  # after two unparseable replies the policy falls back to the first action
        assert action.text == ctx.actions[0]


@pytest.mark.integration
def test_served_smollm2_decides_as_a_prompted_controller(served_smollm2: tuple[str, str]) -> None:
    from rir_runtime.controllers import PromptedController, default_value
    from rir_runtime.decisions import parse
    from rir_runtime.envs import TaskSpec, make_env
    from rir_runtime.envs.checkpoints import Step
    from rir_runtime.prompts import DecisionContext

    model, url = served_smollm2
    backend = make_backend(f"openai:{model}@{url}")
    assert isinstance(backend, OpenAIBackend)
    env = make_env("builtin")
    first = env.reset(TaskSpec("builtin", "workshop-3", "dev", 0))
    steps = []
    for i, action in enumerate([*env.expert_actions()[:2], "eat the bench"]):
        r = env.step(action)
        steps.append(Step(i, action, r.observation, r.score))
    n = len(steps)
    ctx = DecisionContext(
        task="workshop-3", objective=first.objective, memory="", history=tuple(steps),
        observation=steps[-1].observation, score=steps[-1].score, trigger="error_signal",
        admissible=tuple(range(n + 1)), segments=((0, 2), (2, n + 1)), segment=(0, n + 1), restore_point=n - 1,
    )  # fmt: skip
    controller = PromptedController(backend, f"prompted:openai:{model}", max_new_tokens=64, rank=False)
    decisions = [controller.review(ctx), controller.locate_coarse(ctx), controller.locate_fine(ctx)]
    decisions.append(controller.reflect(ctx))
    print(f"\n[controller] {backend.name}: {backend.usage}")
    for d in decisions:
        how = "fallback" if d.meta.get("fallback") else f"parsed after {d.parse_failures} failure(s)"
        print(f"  {d.kind}: {how}, {d.model_calls} call(s), value={d.value!r}\n    raw={d.raw[:160]!r}")
    assert backend.usage.requests == sum(d.model_calls for d in decisions)
    for d in decisions:
        assert d.prompt_tokens > 0 and d.completion_tokens > 0 and 1 <= d.model_calls <= 2
        if d.meta.get("fallback"):  # two unparseable replies: the designed safe default
            assert d.parse_failures == 2 and d.value == default_value(d.kind, ctx)
        else:
            assert d.parse_failures == d.model_calls - 1 and d.value == parse(d.kind, d.raw)
