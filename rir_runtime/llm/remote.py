"""`OpenAIBackend`: a model behind an OpenAI-compatible server, through the `openai` SDK.

vLLM and SGLang serve models on GPUs, `transformers serve` on a CPU (docs/architecture.md, Servers).
The SDK retries connection errors, HTTP 408/409/429 and 5xx with exponential backoff (honouring a
server's Retry-After), so a rate-limited or briefly overloaded server slows a run instead of ending
it; what retrying cannot cure becomes one of this project's errors, naming the fix.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Literal, cast

from rir_runtime.errors import ModelLoadError, RIRError, ServerError, UnknownNameError, UserInputError
from rir_runtime.llm.base import Choice, Completion, Prompt, truncate_at_stop

Guided = Literal["auto", "vllm", "sglang", "off"]
GUIDED: tuple[Guided, ...] = ("auto", "vllm", "sglang", "off")
NO_KEY = "EMPTY"  # local servers take any key, and the SDK will not start without one
REGEX_SPECIAL = set("\\.^$*+?{}[]|()")


@dataclass(frozen=True)
class Usage:
    """What a backend has asked of its server so far (successful requests only)."""

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


def guided_choice_body(server: Literal["vllm", "sglang"], choices: list[str]) -> dict[str, Any]:
    """The request field that makes a server spell exactly one of `choices`. vLLM takes the list
    (`structured_outputs`, which replaced `guided_choice` in vLLM 0.12); SGLang takes a regex."""
    if server == "vllm":
        return {"structured_outputs": {"choice": choices}}
    alternatives = "|".join("".join("\\" + ch if ch in REGEX_SPECIAL else ch for ch in c) for c in choices)
    return {"regex": f"({alternatives})"}


class OpenAIBackend:
    """An OpenAI-compatible server: chat messages go to chat.completions, raw strings to completions;
    a batch is sent as concurrent requests.

    `extra_body` is merged into every request (server-specific sampling fields). `choose` needs
    guided decoding, which vLLM and SGLang offer and `transformers serve` does not: `guided="auto"`
    asks the server's model list who serves the model (`owned_by`), `vllm` / `sglang` force one
    dialect, `off` refuses. Servers return no prompt log-probabilities, so `score` always refuses.
    """

    supports_scoring = False

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key_env: str = "OPENAI_API_KEY",
        timeout: float = 120.0,
        max_retries: int = 4,
        max_workers: int = 8,
        extra_body: dict[str, Any] | None = None,
        guided: Guided = "auto",
    ) -> None:
        import openai

        if guided not in GUIDED:
            raise UnknownNameError("guided-decoding dialect", guided, list(GUIDED))
        base = base_url.rstrip("/")
        self.base_url = base if base.endswith("/v1") else base + "/v1"
        self.model, self.timeout, self.max_retries = model, timeout, max_retries
        self.max_workers, self.extra_body, self.guided = max(1, max_workers), dict(extra_body or {}), guided
        self.api_key_env = api_key_env
        self.name = f"openai:{model}@{self.base_url}"
        self.client = openai.OpenAI(
            base_url=self.base_url,
            api_key=os.environ.get(api_key_env) or NO_KEY,
            timeout=openai.Timeout(timeout, connect=min(timeout, 10.0)),
            max_retries=max_retries,
        )
        self.usage = Usage()
        self._lock = threading.Lock()
        self._owners: dict[str, str] | None = None  # served model id -> owned_by, read once

    # --- the Backend protocol ---------------------------------------------------------------------
    def generate(
        self,
        prompts: Sequence[Prompt],
        *,
        max_new_tokens: int,
        stop: list[str] | None = None,
        temperature: float = 0.0,
        hints: Sequence[Sequence[str]] | None = None,  # a server decodes as it does: no use for them
    ) -> list[Completion]:
        if len(prompts) <= 1:
            return [self._one(p, max_new_tokens, stop, temperature) for p in prompts]
        with ThreadPoolExecutor(min(self.max_workers, len(prompts))) as pool:
            return list(pool.map(lambda p: self._one(p, max_new_tokens, stop, temperature), prompts))

    def choose(
        self, prompt: Prompt, choices: list[str], penalties: Sequence[float] | None = None
    ) -> tuple[int, Completion]:
        """Greedy decoding limited to `choices` by the server's guided decoding (vLLM, SGLang)."""
        server = self._guided_server()
        if server is None:
            raise UserInputError(
                f"{self.name} cannot constrain decoding to a list of choices: guided decoding needs a vLLM or "
                f"SGLang server (guided='{self.guided}'); use generate mode (--policy_mode generate), such a "
                "server, or a local transformers model"
            )
        if penalties and any(penalties):
            raise UserInputError(
                f"{self.name} cannot take penalties off choices (server-side guided decoding has no per-choice "
                "weights): use memory_guidance hard or off, generate mode, or a local transformers model"
            )
        unique = list(dict.fromkeys(c for c in choices if c))
        if not unique:
            raise RIRError("constrained decoding needs at least one non-empty choice")
        longest = max(len(c.encode()) for c in unique)  # a token spells at least one byte
        completion = self._one(prompt, longest + 8, None, 0.0, guided_choice_body(server, unique))
        text = completion.text if completion.text in unique else completion.text.strip()
        if text not in unique:
            raise ServerError(
                f"{self.base_url} answered {completion.text[:80]!r}, which is not one of the choices: the server "
                f"ignored the {server} guided-decoding field; pass the right guided= dialect or use generate mode"
            )
        return choices.index(text), replace(completion, text=text)

    def choose_many(self, requests: Sequence[Choice]) -> list[tuple[int, Completion]]:
        """Each request's `choose`, sent concurrently: the server batches them."""
        if len(requests) <= 1:
            return [self.choose(*r) for r in requests]
        with ThreadPoolExecutor(min(self.max_workers, len(requests))) as pool:
            return list(pool.map(lambda r: self.choose(*r), requests))

    def score_many(self, requests: Sequence[tuple[Prompt, list[str]]]) -> list[list[float]]:
        return [self.score(prompt, continuations) for prompt, continuations in requests]

    def score(self, prompt: Prompt, continuations: list[str]) -> list[float]:
        raise UserInputError(
            f"{self.name} cannot score continuations (chat APIs return no prompt log-probabilities): "
            "use generate mode (--policy_mode generate) or a local transformers model"
        )

    # --- requests ---------------------------------------------------------------------------------
    def _one(
        self,
        prompt: Prompt,
        max_new_tokens: int,
        stop: list[str] | None,
        temperature: float,
        extra: dict[str, Any] | None = None,
    ) -> Completion:
        body = {**self.extra_body, **(extra or {})}
        common: dict[str, Any] = {
            "model": self.model,
            "max_tokens": max_new_tokens,
            "temperature": temperature,
            "extra_body": body or None,
        }
        if stop:
            common["stop"] = stop
        with self._errors():
            if isinstance(prompt, str):
                resp: Any = self.client.completions.create(prompt=prompt, **common)
                text = resp.choices[0].text or ""
            else:
                # plain role/content dicts: what the SDK's message TypedDicts describe
                resp = self.client.chat.completions.create(messages=cast(Any, prompt), **common)
                text = resp.choices[0].message.content or ""
        p_tok = int(resp.usage.prompt_tokens) if resp.usage else 0
        c_tok = int(resp.usage.completion_tokens) if resp.usage else 0
        with self._lock:
            self.usage = Usage(
                self.usage.requests + 1, self.usage.prompt_tokens + p_tok, self.usage.completion_tokens + c_tok
            )
        return Completion(truncate_at_stop(text, stop), p_tok, c_tok)

    def _guided_server(self) -> Literal["vllm", "sglang"] | None:
        if self.guided in ("vllm", "sglang"):
            return self.guided
        if self.guided == "off":
            return None
        try:
            with self._errors():
                owner = self._served().get(self.model)
        except ServerError:  # no model list to read the dialect from
            return None
        return owner if owner in ("vllm", "sglang") else None  # type: ignore[return-value]

    def _served(self) -> dict[str, str]:
        """{model id: owned_by} from the server's /models, asked once (vLLM and SGLang name themselves)."""
        if self._owners is None:
            page = self.client.with_options(max_retries=0).models.list()
            self._owners = {m.id: str(getattr(m, "owned_by", "") or "") for m in page.data}
        return self._owners

    # --- errors -----------------------------------------------------------------------------------
    @contextmanager
    def _errors(self) -> Iterator[None]:
        """The SDK's exceptions, after its retries, as one-line errors that name the fix."""
        import openai

        try:
            yield
        except openai.APITimeoutError:
            raise ModelLoadError(
                f"{self.base_url} did not answer within {self.timeout:g}s (tried {self.max_retries + 1} times): "
                "raise the backend's timeout, or check that the server is not overloaded"
            ) from None
        except openai.APIConnectionError as exc:
            raise ModelLoadError(
                f"cannot reach the OpenAI-compatible server at {self.base_url} ({exc.__cause__ or exc}): start it "
                "(vllm serve, python -m sglang.launch_server, transformers serve) or fix the URL in "
                "openai:<model>@<url>"
            ) from None
        except openai.APIStatusError as exc:
            self._raise_unknown_model(exc)
            message = f"{self.base_url} answered HTTP {exc.status_code}: {_detail(exc)}{self._hint(exc)}"
            raise ServerError(message) from None

    def _raise_unknown_model(self, exc: Any) -> None:
        """A 400/404 for a model the server does not serve (vLLM says 404, a pinned `transformers serve`
        400): list what it does serve."""
        if exc.status_code not in (400, 404):
            return
        try:
            served = self._served()
        except Exception:  # noqa: BLE001 - no model list: report the HTTP error itself
            return
        if served and self.model not in served:
            hint = "Use openai:<served model>@<url>."
            raise UnknownNameError(f"model on {self.base_url}", self.model, sorted(served), hint) from None

    def _hint(self, exc: Any) -> str:
        code, tries = exc.status_code, self.max_retries + 1
        if code in (401, 403):
            return f" (the server refused the API key: set ${self.api_key_env})"
        if code == 429:
            return f" (still rate-limited after {tries} tries: lower --concurrency or raise the backend's max_retries)"
        if code >= 500:
            return f" (still failing after {tries} tries: see the server's log)"
        if code in (400, 404, 422):
            return " (the server rejected the request: drop the fields it does not support from extra_body)"
        return ""


def _detail(exc: Any) -> str:
    """The server's own words: OpenAI and vLLM put them in `message`, FastAPI servers in `detail`."""
    body = exc.body
    if isinstance(body, dict):
        body = body.get("message") or body.get("detail") or body
    return " ".join(str(body or exc.message).split())[:300]
