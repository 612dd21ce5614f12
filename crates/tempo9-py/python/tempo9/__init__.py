"""Tempo9 in-process: load a local model and chat with it — no server, no port.

    import tempo9
    llm = tempo9.Model("smollm2-135m-instruct-q4_1.gguf")
    for ev in llm.chat([{"role": "user", "content": "Hi!"}], stream=True, temperature=0):
        if ev.type == "text":
            print(ev.text, end="")

The same engine and chat pipeline as `tempo9 serve`: messages and tools are
OpenAI chat-completion dicts, options are that request's fields
(`temperature`, `max_tokens`, `stop`, `tool_choice`, `response_format`, ...),
and a request gets the answer the server gives. A `Model` is shared by
threads and asyncio tasks (their requests batch together and share one prefix
cache); the GIL is released while waiting for tokens. Closing a stream, or
dropping it, cancels its request.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Dict, Iterator, List, Optional, Sequence, Union

from . import _tempo9
from ._tempo9 import (
    BadFileError,
    BadRequestError,
    ContextOverflowError,
    EngineError,
    InvalidSchemaError,
    QueueFullError,
    Tempo9Error,
    UnsupportedArchitectureError,
)

__version__ = _tempo9.__version__

__all__ = [
    "Model", "Event", "ToolCall", "Usage", "ChatResponse", "ChatStream", "AsyncChatStream",
    "Tempo9Error", "BadFileError", "UnsupportedArchitectureError", "ContextOverflowError",
    "InvalidSchemaError", "BadRequestError", "QueueFullError", "EngineError",
]


@dataclass(frozen=True)
class Usage:
    """Token counts of a request; `cached_tokens` of the prompt came from the prefix cache."""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0


@dataclass(frozen=True)
class ToolCall:
    """A complete tool call; `arguments` is JSON text (an object)."""
    name: str
    arguments: str
    index: int = 0

    def parsed_arguments(self) -> Any:
        """The arguments as Python values."""
        return json.loads(self.arguments)


@dataclass(frozen=True)
class Event:
    """One event of an answer.

    type: "text" / "reasoning" (a delta in `text`), "tool_call" (`tool_call`),
    "token" (completions: `token_id` and `text`), "done" (last: `stop`, `usage`,
    and `detail` for stop strings and errors).
    """
    type: str
    text: str = ""
    tool_call: Optional[ToolCall] = None
    token_id: Optional[int] = None
    stop: Optional[str] = None
    detail: Optional[str] = None
    usage: Optional[Usage] = None


@dataclass
class ChatResponse:
    """A whole answer."""
    text: str = ""
    reasoning: str = ""
    tool_calls: List[ToolCall] = field(default_factory=list)
    stop: str = ""
    detail: Optional[str] = None
    usage: Usage = field(default_factory=Usage)


def _event(raw: str) -> Event:
    v = json.loads(raw)
    t = v["type"]
    if t in ("text", "reasoning"):
        return Event(type=t, text=v["text"])
    if t == "tool_call":
        return Event(type=t, tool_call=ToolCall(name=v["name"], arguments=v["arguments"], index=v["index"]))
    if t == "token":
        return Event(type=t, text=v["text"], token_id=v["id"])
    u = v["usage"]
    return Event(type="done", stop=v["stop"], detail=v.get("detail"),
                 usage=Usage(prompt_tokens=u["prompt_tokens"], cached_tokens=u["cached_tokens"],
                             completion_tokens=u["completion_tokens"],
                             reasoning_tokens=u.get("reasoning_tokens", 0)))


def _collect(events: Sequence[Event]) -> ChatResponse:
    r = ChatResponse()
    for e in events:
        _add(r, e)
    return r


def _add(r: ChatResponse, e: Event) -> None:
    if e.type == "text":
        r.text += e.text
    elif e.type == "reasoning":
        r.reasoning += e.text
    elif e.type == "tool_call" and e.tool_call is not None:
        r.tool_calls.append(e.tool_call)
    elif e.type == "done":
        r.stop, r.detail, r.usage = e.stop or "", e.detail, e.usage or Usage()


class ChatStream:
    """The events of one request, blocking (the GIL is released while waiting).
    Iterate it; `close()` (or leaving a `with` block) cancels the request."""

    def __init__(self, native: "_tempo9.Stream") -> None:
        self._native = native

    def __iter__(self) -> Iterator[Event]:
        return self

    def __next__(self) -> Event:
        return _event(self._native.next_json())

    def close(self) -> None:
        """Cancels the request if it is still running."""
        self._native.close()

    def __enter__(self) -> "ChatStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def collect(self) -> ChatResponse:
        """Reads the rest of the answer."""
        return _collect(list(self))


def _next_or_none(native: "_tempo9.Stream") -> Optional[str]:
    # StopIteration cannot cross into an asyncio future (it becomes a TypeError
    # there and the future never completes): the end is None instead.
    try:
        return native.next_json()
    except StopIteration:
        return None


class AsyncChatStream:
    """The events of one request for asyncio: each wait runs in a worker thread
    (the GIL released), so the event loop keeps running. `aclose()` cancels."""

    def __init__(self, native: "_tempo9.Stream") -> None:
        self._native = native

    def __aiter__(self) -> "AsyncChatStream":
        return self

    async def __anext__(self) -> Event:
        try:
            raw = await asyncio.get_running_loop().run_in_executor(None, _next_or_none, self._native)
        except asyncio.CancelledError:
            self._native.close()
            raise
        if raw is None:
            raise StopAsyncIteration
        return _event(raw)

    async def aclose(self) -> None:
        """Cancels the request if it is still running."""
        self._native.close()

    async def __aenter__(self) -> "AsyncChatStream":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self._native.close()

    async def collect(self) -> ChatResponse:
        """Reads the rest of the answer."""
        r = ChatResponse()
        async for e in self:
            _add(r, e)
        return r


Message = Dict[str, Any]
Tool = Dict[str, Any]


class Model:
    """A loaded model (GGUF path or Ollama model name) with its running engine.

    Load options (all optional): threads, context, kv_budget_bytes, page_tokens,
    max_running, deterministic, chat_template, speculation_k, device ("cpu",
    "cuda", or "auto": a GPU when libggml-cuda.so loads from backend_dir,
    TEMPO9_BACKEND_DIR or the executable's directory, else the CPU), backend_dir,
    gpu_layers, and ssd (False to turn the SSD tier off, or {"dir": ...,
    "budget_bytes": ..., "persist": ...}). Defaults are `tempo9 serve`'s.
    """

    def __init__(self, source: str, **options: Any) -> None:
        self._native = _tempo9.Model(str(source), json.dumps(options) if options else None)

    def _start(self, messages: Sequence[Message], tools: Optional[Sequence[Tool]],
               options: Dict[str, Any]) -> "_tempo9.Stream":
        return self._native.chat(json.dumps(list(messages)), json.dumps(list(tools or [])),
                                 json.dumps(options))

    def chat(self, messages: Sequence[Message], tools: Optional[Sequence[Tool]] = None, *,
             stream: bool = False, **options: Any) -> Union[ChatResponse, ChatStream]:
        """Chat: OpenAI-shaped messages and tools; options are the fields of an
        OpenAI chat completion (temperature, max_tokens, stop, tool_choice,
        parallel_tool_calls, response_format, seed, ...; unset ones take the
        server's defaults). Returns the whole answer, or with stream=True a
        ChatStream of events."""
        s = ChatStream(self._start(messages, tools, options))
        return s if stream else s.collect()

    async def achat(self, messages: Sequence[Message], tools: Optional[Sequence[Tool]] = None, *,
                    stream: bool = False, **options: Any) -> Union[ChatResponse, AsyncChatStream]:
        """`chat` for asyncio: awaits the whole answer, or with stream=True
        returns an AsyncChatStream (`async for ev in ...`)."""
        loop = asyncio.get_running_loop()
        native = await loop.run_in_executor(None, self._start, messages, tools, options)
        s = AsyncChatStream(native)
        return s if stream else await s.collect()

    def complete(self, tokens: Sequence[int], **options: Any) -> ChatStream:
        """Plain completion of token ids (no chat template): events of type
        "token", then "done". Options: max_tokens (16), stop_at_eog (True),
        stop, temperature (greedy when unset), top_k, top_p, min_p, seed."""
        return ChatStream(self._native.complete(list(tokens), json.dumps(options)))

    def tokenize(self, text: str) -> List[int]:
        """Token ids of `text` (special-token text parsed, BOS added when the model wants one)."""
        return self._native.tokenize(text)

    def detokenize(self, tokens: Sequence[int]) -> str:
        """The text of token ids."""
        return self._native.detokenize(list(tokens))

    def stats(self) -> Dict[str, Any]:
        """Engine counters as of its last step: running, waiting, kv_pages_used,
        kv_pages_cached, prefix_hit_tokens, ssd, ..."""
        return json.loads(self._native.stats_json())

    @property
    def max_context(self) -> int:
        """Per-request context limit in tokens (prompt plus output)."""
        return self._native.max_context()

    def shutdown(self) -> None:
        """Stops the engine now (the SSD tier flushes); later requests fail."""
        self._native.shutdown()
