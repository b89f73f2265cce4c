"""The summarizer client: one OpenAI-compatible chat endpoint, sync and async.

Used by the ``summary`` and ``parallel`` strategies. Works with any server speaking the
OpenAI Chat Completions protocol (OpenAI, vLLM, SGLang, llama.cpp, Ollama, LiteLLM…).
The ``openai`` SDK is imported only here, lazily (extra ``summarizer``).

Configuration comes from arguments, else from the environment:

=============================  ======================================  ==========
argument                       environment variable                    default
=============================  ======================================  ==========
``base_url``                   ``AGENTCOMPACT_SUMMARIZER_BASE_URL``    (required)
``model``                      ``AGENTCOMPACT_SUMMARIZER_MODEL``       (required)
``api_key``                    ``AGENTCOMPACT_SUMMARIZER_API_KEY``     ``"EMPTY"``
``timeout``                    ``AGENTCOMPACT_SUMMARIZER_TIMEOUT``     ``60`` s
``context_window``             ``AGENTCOMPACT_SUMMARIZER_WINDOW``      ``32000``
=============================  ======================================  ==========

``base_url`` is the OpenAI base URL, including ``/v1`` (``http://host:8000/v1``).

Retries: the SDK's own retry is disabled (``max_retries=0``) and this module retries
itself, so that every attempt is timed and the policy is the same sync and async:
connection errors, timeouts, dropped streams, 408/409/429 and 5xx are retried up to
``max_retries`` times with exponential backoff (``backoff_s * 2**attempt``, capped at
``backoff_max_s``); other 4xx (bad request, auth) fail at once. ``timeout`` bounds each
attempt (connect, and each read: a stream that stops sending fails after ``timeout``).
A context-length error is raised as :class:`SummarizerOverflow` (not retried here): the
strategy refits its prompt to a smaller window and tries once more.

Every call — successful or not — is reported through ``agentcompact_log_summary_call``
with a :class:`~agentcompact._events.SummaryCall` (prompt, output, usage, latency, error).

Recording for RL: a trained summarizer (``trained=True``: the policy writes its own
summaries) samples at the policy's settings — ``temperature`` defaults to 1.0 (not 0:
a greedy summary has no exploration and its logprobs would pair with a ratio computed at
another temperature), greedy is refused, ``top_p`` / ``top_k`` are sent when given — and
every ``SummaryCall`` records the settings it was sent with (``SummaryCall.request``) and
the summarizer's ``policy_version`` (the loop that updates the weights sets it). It asks
for ``logprobs`` by default (``logprobs=`` overrides), and with
``return_token_ids=True`` for vLLM's ``prompt_token_ids`` / ``token_ids`` (vLLM's
OpenAI-compatible server; OpenAI's own API rejects the field, so it is off by default).
What the server reports of its sampled tokens goes into the ``SummaryCall``, and the
exporter trains the summary's segment on those ids and logprobs as they are.
Clients are opened per :meth:`Summarizer.session` (one compaction) and closed after it,
so nothing leaks across event loops or threads.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ._events import SummaryCall
from .errors import ConfigError, SummarizerError, SummarizerOverflow
from .wire import SampledTokens, from_chat_chunks, from_chat_completion

if TYPE_CHECKING:
    import pluggy

__all__ = [
    "ENV_API_KEY",
    "ENV_BASE_URL",
    "ENV_MODEL",
    "ENV_TIMEOUT",
    "ENV_WINDOW",
    "CallInfo",
    "LocalSummarizer",
    "Summarizer",
    "SummarizerOverflow",
    "SummaryOutput",
]

ENV_BASE_URL = "AGENTCOMPACT_SUMMARIZER_BASE_URL"
ENV_MODEL = "AGENTCOMPACT_SUMMARIZER_MODEL"
ENV_API_KEY = "AGENTCOMPACT_SUMMARIZER_API_KEY"
ENV_TIMEOUT = "AGENTCOMPACT_SUMMARIZER_TIMEOUT"
ENV_WINDOW = "AGENTCOMPACT_SUMMARIZER_WINDOW"

_RETRY_STATUSES = frozenset({408, 409, 429})


class _Default:
    """The type of ``_DEFAULT``: an argument not given (``None`` means "not sent")."""

    def __repr__(self) -> str:
        return "<default>"


_DEFAULT = _Default()


@dataclass(frozen=True)
class SummaryOutput:
    """A summarizer answer: text, usage as the server reported it, wall time."""

    text: str
    usage: dict[str, Any] = field(default_factory=dict)
    latency_s: float = 0.0
    finish_reason: str | None = None
    #: what the server reported of its sampled tokens, when asked (``records_tokens``)
    sampled: SampledTokens | None = None


@dataclass(frozen=True)
class CallInfo:
    """Who is calling, for the ``SummaryCall`` log record."""

    strategy: str
    pm: pluggy.PluginManager | None = None
    episode_id: str | None = None
    block: int | None = None


class Summarizer:
    """An OpenAI-compatible summarizer endpoint (see module docstring).

    :param base_url: OpenAI base URL with ``/v1``; env ``AGENTCOMPACT_SUMMARIZER_BASE_URL``.
    :param model: model name; env ``AGENTCOMPACT_SUMMARIZER_MODEL``.
    :param api_key: env ``AGENTCOMPACT_SUMMARIZER_API_KEY`` (default ``"EMPTY"``).
    :param timeout: seconds per attempt; env ``AGENTCOMPACT_SUMMARIZER_TIMEOUT`` (60).
    :param max_retries: extra attempts after a retryable failure (default 2).
    :param backoff_s: first backoff; doubled each retry, capped at ``backoff_max_s``.
    :param stream: stream the answer (lower time-to-first-byte, stall detection per read).
    :param context_window: the summarizer model's window in tokens; prompts are fitted
        to it by the strategies (``prompt + max_tokens <= context_window``); env
        ``AGENTCOMPACT_SUMMARIZER_WINDOW`` (32000). Set it for small local models (an
        8k llama.cpp server): a prompt over the window fails there, not here.
    :param temperature: sampling temperature; default 0 (as deterministic as the server
        allows), or 1.0 when ``trained`` (the policy's own sampling; 0 or ``None`` is then
        refused: give the temperature the policy samples at).
    :param top_p: nucleus sampling, sent when given.
    :param top_k: top-k sampling (vLLM / SGLang), sent in ``extra_body`` when given.
    :param extra_body: extra JSON fields for every request (e.g. vLLM's ``top_k``).
    :param max_tokens_param: ``"max_tokens"`` (default, widest support) or
        ``"max_completion_tokens"`` (OpenAI reasoning models).
    :param trained: the summaries are the policy's own samples (trained, SUPO-style).
    :param logprobs: ask for per-token ``logprobs`` (default: when ``trained``).
    :param return_token_ids: ask a vLLM server for the prompt and sampled token ids.
    :param policy_version: the version of the weights that sample the summaries, recorded
        on every ``SummaryCall`` (a training loop updates ``summarizer.policy_version``).
    """

    def __init__(
        self,
        base_url: str | None = None,
        model: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float | None = None,
        max_retries: int = 2,
        backoff_s: float = 0.5,
        backoff_max_s: float = 8.0,
        stream: bool = False,
        context_window: int | None = None,
        temperature: float | None | _Default = _DEFAULT,
        top_p: float | None = None,
        top_k: int | None = None,
        extra_body: dict[str, Any] | None = None,
        max_tokens_param: str = "max_tokens",
        trained: bool = False,
        logprobs: bool | None = None,
        return_token_ids: bool = False,
        policy_version: int = 0,
    ) -> None:
        self.base_url = base_url or os.environ.get(ENV_BASE_URL) or ""
        self.model = model or os.environ.get(ENV_MODEL) or ""
        if not self.base_url or not self.model:
            raise ConfigError(
                "summarizer needs base_url and model (arguments, or the environment "
                f"variables {ENV_BASE_URL} and {ENV_MODEL})")
        self._sampling_settings(temperature, top_p, top_k, trained, policy_version)
        self.api_key = api_key or os.environ.get(ENV_API_KEY) or "EMPTY"
        self.timeout = _env_number(timeout, ENV_TIMEOUT, 60.0, float)
        context_window = _env_number(context_window, ENV_WINDOW, 32_000, int)
        if max_retries < 0 or context_window <= 0:
            raise ConfigError(f"bad summarizer settings: max_retries={max_retries}, "
                              f"context_window={context_window}")
        if max_tokens_param not in ("max_tokens", "max_completion_tokens"):
            raise ConfigError(f"max_tokens_param must be max_tokens or max_completion_tokens, "
                              f"got {max_tokens_param!r}")
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self.stream = stream
        self.context_window = context_window
        self.extra_body = dict(extra_body or {})
        self.max_tokens_param = max_tokens_param
        self.logprobs = trained if logprobs is None else bool(logprobs)
        self.return_token_ids = bool(return_token_ids)
        self._log_lock = threading.Lock()

    def _sampling_settings(self, temperature: float | None | _Default, top_p: float | None,
                           top_k: int | None, trained: bool, policy_version: int) -> None:
        """``temperature`` (its default by ``trained``), ``top_p``, ``top_k``, ``trained``
        and ``policy_version``, checked: a trained summarizer samples."""
        if isinstance(temperature, _Default):
            temperature = 1.0 if trained else 0.0
        if trained and not temperature:
            raise ConfigError(
                f"a trained summarizer samples its summaries as the policy samples its turns: "
                f"temperature={temperature!r} is greedy or unknown; give the policy's "
                "temperature (e.g. 1.0), or trained=False for a frozen summarizer")
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int)):
            raise ConfigError(f"top_k must be an int, got {top_k!r}")
        self.temperature: float | None = temperature
        self.top_p = top_p
        self.top_k = top_k
        self.trained = trained
        self.policy_version = int(policy_version)

    def sampling(self) -> dict[str, Any]:
        """The sampling settings every request is sent with (what ``SummaryCall.request``
        records and the exporter writes as the summary row's ``sampling``): ``temperature``,
        ``top_p``, ``top_k`` — given here or in ``extra_body`` — when set."""
        out: dict[str, Any] = {}
        for key in ("temperature", "top_p", "top_k"):
            value = getattr(self, key)
            value = self.extra_body.get(key) if value is None else value
            if value is not None:
                out[key] = value
        return out

    def __repr__(self) -> str:  # never show the key
        return f"Summarizer(base_url={self.base_url!r}, model={self.model!r})"

    # --- sessions -------------------------------------------------------------------
    @contextmanager
    def session(self) -> Iterator[SyncSession]:
        """A sync client for one compaction (thread-safe; closed on exit)."""
        openai = _openai()
        client = openai.OpenAI(base_url=self.base_url, api_key=self.api_key,
                               timeout=self.timeout, max_retries=0)
        try:
            yield SyncSession(self, client)
        finally:
            client.close()

    @asynccontextmanager
    async def asession(self) -> AsyncIterator[AsyncSession]:
        """An async client for one compaction, bound to the running loop; closed on exit."""
        openai = _openai()
        client = openai.AsyncOpenAI(base_url=self.base_url, api_key=self.api_key,
                                    timeout=self.timeout, max_retries=0)
        try:
            yield AsyncSession(self, client)
        finally:
            await client.close()

    # --- shared pieces --------------------------------------------------------------
    def request_kwargs(self, prompt: list[dict[str, Any]], max_tokens: int) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"model": self.model, "messages": prompt,
                                  self.max_tokens_param: max(1, int(max_tokens))}
        if self.temperature is not None:
            kwargs["temperature"] = self.temperature
        if self.top_p is not None:
            kwargs["top_p"] = self.top_p
        if self.stream:
            kwargs["stream"] = True
            kwargs["stream_options"] = {"include_usage": True}
        if self.logprobs:
            kwargs["logprobs"] = True
        extra = {**self.extra_body, **({"top_k": self.top_k} if self.top_k is not None else {}),
                 **({"return_token_ids": True} if self.return_token_ids else {})}
        if extra:
            kwargs["extra_body"] = extra
        return kwargs

    @property
    def records_tokens(self) -> bool:
        """Whether answers are read for their sampled tokens (logprobs or ids asked for)."""
        return self.logprobs or self.return_token_ids

    def backoff(self, attempt: int) -> float:
        return float(min(self.backoff_max_s, self.backoff_s * (2 ** attempt)))

    def log(self, info: CallInfo, prompt: list[dict[str, Any]], output: SummaryOutput | None,
            latency: float, error: str | None) -> None:
        """Report one call through ``agentcompact_log_summary_call`` (serialized)."""
        if info.pm is None:
            return
        sampled = output.sampled if output is not None else None
        call = SummaryCall(
            episode_id=info.episode_id, strategy=info.strategy, prompt=prompt,
            output=output.text if output else "", usage=dict(output.usage) if output else {},
            model=self.model, block=info.block, latency_s=latency, error=error,
            trained=self.trained, request=self.sampling(), policy_version=self.policy_version,
            **(sampled.model_call_fields() if sampled else {}),
        )
        with self._log_lock:
            info.pm.hook.agentcompact_log_summary_call(call=call)


class _Call:
    """The retry policy of one ``summarize`` call — the same for both drivers below.

    A driver makes attempts; after each failure it asks :meth:`failed` how long to back
    off (the policy raises the final error, already logged, when there is no retry left);
    after a success it returns :meth:`done`. Drivers differ only in how they wait.
    """

    def __init__(self, summarizer: Summarizer, prompt: list[dict[str, Any]],
                 info: CallInfo) -> None:
        self.summarizer = summarizer
        self.prompt = prompt
        self.info = info
        self.attempt = 0
        self.t0 = time.perf_counter()

    def failed(self, exc: Exception) -> float:
        """The backoff before the next attempt; raises ``SummarizerError`` when final."""
        s = self.summarizer
        error = _classify(exc)
        if isinstance(error, _Retryable) and self.attempt < s.max_retries:
            delay = s.backoff(self.attempt)
            self.attempt += 1
            return delay
        s.log(self.info, self.prompt, None, time.perf_counter() - self.t0, str(error))
        raise _final(error, self.attempt) from exc

    def cancelled(self) -> None:
        self.summarizer.log(self.info, self.prompt, None, time.perf_counter() - self.t0,
                            "cancelled")

    def done(self, output: SummaryOutput) -> SummaryOutput:
        self.summarizer.log(self.info, self.prompt, output, output.latency_s, None)
        return output


class SyncSession:
    """Blocking calls on one client (safe to share between threads)."""

    def __init__(self, summarizer: Summarizer, client: Any) -> None:
        self.summarizer = summarizer
        self._client = client

    def summarize(self, prompt: list[dict[str, Any]], max_tokens: int,
                  info: CallInfo) -> SummaryOutput:
        """One summary; retries per the module policy; raises ``SummarizerError``."""
        call = _Call(self.summarizer, prompt, info)
        while True:
            try:
                output = self._once(prompt, max_tokens)
            except Exception as exc:  # classified by the policy; foreign errors become ours
                time.sleep(call.failed(exc))
                continue
            return call.done(output)

    def _once(self, prompt: list[dict[str, Any]], max_tokens: int) -> SummaryOutput:
        s = self.summarizer
        t0 = time.perf_counter()
        response = self._client.chat.completions.create(**s.request_kwargs(prompt, max_tokens))
        if not s.stream:
            return _from_completion(response, time.perf_counter() - t0, s.records_tokens)
        acc = _StreamAccumulator(s.records_tokens)
        for chunk in response:
            acc.add(chunk)
        return acc.output(time.perf_counter() - t0)


class AsyncSession:
    """Async calls on one client (bound to the loop that opened it)."""

    def __init__(self, summarizer: Summarizer, client: Any) -> None:
        self.summarizer = summarizer
        self._client = client

    async def summarize(self, prompt: list[dict[str, Any]], max_tokens: int,
                        info: CallInfo) -> SummaryOutput:
        """One summary; retries per the module policy; raises ``SummarizerError``."""
        call = _Call(self.summarizer, prompt, info)
        while True:
            try:
                output = await self._once(prompt, max_tokens)
            except asyncio.CancelledError:
                call.cancelled()
                raise
            except Exception as exc:
                await asyncio.sleep(call.failed(exc))
                continue
            return call.done(output)

    async def _once(self, prompt: list[dict[str, Any]], max_tokens: int) -> SummaryOutput:
        s = self.summarizer
        t0 = time.perf_counter()
        response = await self._client.chat.completions.create(
            **s.request_kwargs(prompt, max_tokens))
        if not s.stream:
            return _from_completion(response, time.perf_counter() - t0, s.records_tokens)
        acc = _StreamAccumulator(s.records_tokens)
        async for chunk in response:
            acc.add(chunk)
        return acc.output(time.perf_counter() - t0)


#: ``generate(prompt, max_tokens, sampling) -> SummaryOutput`` of a :class:`LocalSummarizer`
LocalGenerate = Callable[[list[dict[str, Any]], int, dict[str, Any]], SummaryOutput]


class LocalSummarizer(Summarizer):
    """A summarizer backed by a function of this process instead of an HTTP endpoint: the
    policy being trained writing its own summaries in a training loop (the model in
    memory, a trainer's inference engine), or any local model.

    ``generate(prompt, max_tokens, sampling)`` gets the chat prompt, the output budget and
    the sampling settings (:meth:`Summarizer.sampling`) and returns a
    :class:`SummaryOutput`; for training, its ``sampled`` holds the prompt ids, the sampled
    ids and their logprobs (``SampledTokens``), which the exporter trains on as they are.
    Every call is reported through ``agentcompact_log_summary_call`` as for a server (the
    settings, the policy version, the tokens); an exception of ``generate`` is reported
    and raised as ``SummarizerError`` (the engine then falls back to cliff). The settings
    and their checks are the :class:`Summarizer`'s (a trained one samples, never greedy).
    """

    def __init__(self, generate: LocalGenerate, *, model: str = "local",
                 context_window: int = 32_000, trained: bool = False,
                 temperature: float | None | _Default = _DEFAULT, top_p: float | None = None,
                 top_k: int | None = None, policy_version: int = 0) -> None:
        if context_window <= 0:
            raise ConfigError(f"context_window must be positive, got {context_window}")
        self._sampling_settings(temperature, top_p, top_k, trained, policy_version)
        self.generate = generate
        self.base_url, self.model, self.api_key = "local:", model, "EMPTY"
        self.timeout, self.max_retries, self.backoff_s, self.backoff_max_s = 0.0, 0, 0.0, 0.0
        self.stream, self.context_window, self.extra_body = False, context_window, {}
        self.max_tokens_param = "max_tokens"
        self.logprobs, self.return_token_ids = trained, False
        self._log_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"LocalSummarizer(model={self.model!r})"

    @contextmanager
    def session(self) -> Iterator[SyncSession]:
        yield _LocalSession(self, None)

    @asynccontextmanager
    async def asession(self) -> AsyncIterator[AsyncSession]:
        yield _LocalAsyncSession(self, None)

    def run(self, prompt: list[dict[str, Any]], max_tokens: int, info: CallInfo
            ) -> SummaryOutput:
        """One call of ``generate``, timed and reported."""
        t0 = time.perf_counter()
        try:
            output = self.generate(prompt, max(1, int(max_tokens)), self.sampling())
            output = _checked(output.text, dict(output.usage),
                              output.latency_s or time.perf_counter() - t0,
                              output.finish_reason, output.sampled)
        except Exception as exc:
            error = exc if isinstance(exc, SummarizerError) else SummarizerError(
                f"local summarizer failed: {type(exc).__name__}")
            self.log(info, prompt, None, time.perf_counter() - t0, str(error))
            raise error from exc
        self.log(info, prompt, output, output.latency_s, None)
        return output


class _LocalSession(SyncSession):
    summarizer: LocalSummarizer

    def summarize(self, prompt: list[dict[str, Any]], max_tokens: int,
                  info: CallInfo) -> SummaryOutput:
        return self.summarizer.run(prompt, max_tokens, info)


class _LocalAsyncSession(AsyncSession):
    summarizer: LocalSummarizer

    async def summarize(self, prompt: list[dict[str, Any]], max_tokens: int,
                        info: CallInfo) -> SummaryOutput:
        return self.summarizer.run(prompt, max_tokens, info)


# --- helpers ------------------------------------------------------------------------
class _Retryable(SummarizerError):
    """A failure worth another attempt (connection, timeout, 429, 5xx, dropped stream)."""


class _StreamAccumulator:
    def __init__(self, records_tokens: bool = False) -> None:
        self.parts: list[str] = []
        self.usage: dict[str, Any] = {}
        self.finish: str | None = None
        self.chunks: list[dict[str, Any]] | None = [] if records_tokens else None

    def add(self, chunk: Any) -> None:
        if self.chunks is not None:
            self.chunks.append(_dumped(chunk))
        usage = getattr(chunk, "usage", None)
        if usage is not None:
            self.usage = _usage_dict(usage)
        for choice in getattr(chunk, "choices", None) or ():
            content = getattr(choice.delta, "content", None)
            if content:
                self.parts.append(content)
            if choice.finish_reason:
                self.finish = choice.finish_reason

    def output(self, latency: float) -> SummaryOutput:
        if self.finish is None:
            raise _Retryable("summarizer stream ended without a finish reason (dropped)")
        sampled = from_chat_chunks(self.chunks) if self.chunks is not None else None
        return _checked("".join(self.parts), self.usage, latency, self.finish, sampled)


def _dumped(value: Any) -> dict[str, Any]:
    """An SDK response object as its JSON dict (vLLM's extra fields included)."""
    dump = getattr(value, "model_dump", None)
    out = dump() if callable(dump) else value
    return out if isinstance(out, dict) else {}


def _from_completion(response: Any, latency: float, records_tokens: bool = False
                     ) -> SummaryOutput:
    choices = getattr(response, "choices", None) or []
    if not choices:
        raise SummarizerError("summarizer returned no choices")
    usage = _usage_dict(response.usage) if getattr(response, "usage", None) else {}
    sampled = from_chat_completion(_dumped(response)) if records_tokens else None
    return _checked(choices[0].message.content or "", usage, latency, choices[0].finish_reason,
                    sampled)


def _checked(text: str, usage: dict[str, Any], latency: float, finish: str | None,
             sampled: SampledTokens | None = None) -> SummaryOutput:
    if not text.strip():
        raise SummarizerError(f"summarizer returned an empty summary (finish={finish})")
    return SummaryOutput(text.strip(), usage, latency, finish, sampled)


def _usage_dict(usage: Any) -> dict[str, Any]:
    dump = getattr(usage, "model_dump", None)
    return dict(dump()) if callable(dump) else dict(usage or {})


def _classify(exc: Exception) -> SummarizerError:
    """Map any failure to ``SummarizerOverflow``, ``_Retryable`` or ``SummarizerError``."""
    if isinstance(exc, SummarizerError):
        return exc
    openai = _openai()
    name = type(exc).__name__
    if isinstance(exc, openai.APITimeoutError):
        return _Retryable(f"summarizer timed out: {exc}")
    if isinstance(exc, openai.APIConnectionError):
        return _Retryable(f"summarizer connection failed: {exc}")
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        code = getattr(exc, "code", None)
        if code == "context_length_exceeded" or (
                status in (400, 413) and "context" in str(exc).lower()
                and ("length" in str(exc).lower() or "window" in str(exc).lower())):
            return SummarizerOverflow(f"summarizer context window exceeded ({status}): {exc}")
        if status in _RETRY_STATUSES or status >= 500:
            return _Retryable(f"summarizer HTTP {status}: {exc}")
        return SummarizerError(f"summarizer HTTP {status}: {exc}")
    # httpx/httpcore errors escaping a stream body (connection dropped mid-stream)
    module = type(exc).__module__
    if module.startswith(("httpx", "httpcore")) or isinstance(exc, (OSError, EOFError)):
        return _Retryable(f"summarizer transport error: {name}: {exc}")
    return SummarizerError(f"summarizer failed: {name}: {exc}")


def _final(error: SummarizerError, attempt: int) -> SummarizerError:
    """The error to raise once retries are exhausted (a plain ``SummarizerError``)."""
    if isinstance(error, _Retryable):
        tries = f" (after {attempt + 1} attempts)" if attempt else ""
        return SummarizerError(f"{error}{tries}")
    return error


def _env_number(value: Any, env: str, default: Any, kind: Any) -> Any:
    """``value``, else the environment variable ``env`` parsed by ``kind``, else ``default``."""
    if value is not None:
        return kind(value)
    text = os.environ.get(env)
    if text:
        try:
            return kind(text)
        except ValueError:
            raise ConfigError(f"{env}={text!r} is not a valid number") from None
    return default


def _openai() -> Any:
    try:
        import openai
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ConfigError(
            "the summary and parallel strategies need the 'summarizer' extra: "
            "pip install 'agentcompact[summarizer]'") from exc
    return openai
