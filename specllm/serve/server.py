"""`specllm serve`: an OpenAI-compatible HTTP API on FastAPI and uvicorn. A thin layer like cli.py:
validate a request (openai_api.py), build a generation config, run the engine, turn its events
into OpenAI objects; no generation logic of its own. It also serves the chat page (web/index.html)
at /, which reads the same API.

One engine serves one generation at a time (its models' KV caches are shared). The engine runs on
a thread of its own; requests take turns through an asyncio.Lock, whose waiters are woken first
come, first served, and a turn ends when the generation has ended on that thread: finished, failed,
or stopped because its client went away (checked after every step). A chat request renders the
conversation with the GGUF's chat template and reuses the previous generation's tokens as `chat`
does (engine/prompt_cache.py), so a conversation that grows turn by turn prefills only its new
tokens.
"""

import asyncio
import contextlib
import copy
import dataclasses
import enum
import hmac
import ipaddress
import json
import logging
import math
import re
import socket
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing
from dataclasses import dataclass
from functools import partial
from importlib import resources
from pathlib import Path
from typing import Any, Final, TypeVar

import numpy as np
from fastapi import Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect

from specllm.engine.functionary import asks_recipient
from specllm.engine.loop import (
    DRAFTERS,
    Engine,
    Generation,
    PreparedGrammar,
    Result,
    Step,
    describe_models,
    first_mask_seconds,
    gap_prompt,
    grammar_text,
    make_config,
    prepare_grammar,
    text_tokens,
)
from specllm.engine.names import Drafter
from specllm.engine.prompt_cache import PromptCache
from specllm.engine.reasoning import after_think_block, closing_marker
from specllm.engine.sampling import default_seed
from specllm.engine.saved_states import SavedStates
from specllm.errors import ChatTemplateFailed, GrammarInvalid, SpecllmError
from specllm.files import open_files_hint
from specllm.llama.embeddings import (
    describe_embeddings,
    embedding_limit,
    fitted_rerank_tokens,
    is_reranker,
    rerank_tokens,
    truncated,
)
from specllm.llama.model import Model
from specllm.llama.templates import CHATML_TEMPLATE
from specllm.serve import CACHE_RAM, GRAMMAR_BUDGET, MAX_WAITING, generic_tools
from specllm.serve.embeddings import (
    EmbeddingRequest,
    Prompt,
    RerankRequest,
    embeddings_response,
    llama_embeddings_response,
    normalized,
    rerank_response,
)
from specllm.serve.llama_api import (
    DetokenizeRequest,
    InfillRequest,
    NativeCompletionRequest,
    TokenizeRequest,
    check_ids,
    props,
    with_pieces,
)
from specllm.serve.messages_api import error_body, parse_messages
from specllm.serve.openai_api import (
    ApiError,
    BaseRequest,
    ChatReply,
    ChatRequest,
    CompletionRequest,
    Delta,
    Reply,
    ToolReply,
    check_schema,
    joined,
    parse,
    specllm_step,
    validated,
)
from specllm.serve.responses_api import parse_responses
from specllm.serve.tool_calls import ToolTemplate, inspect_template, text_arguments

log = logging.getLogger("specllm.serve")
T = TypeVar("T")

CLIENT_CLOSED = 499  # the status nginx logs for a client that closed its connection first
MIN_BODY_BYTES = 2**20
BODY_BYTES_PER_TOKEN = 64  # a token is ~4 characters; JSON escapes can make one character 6 bytes
PAGE_PATH = "/"
# The page is one file with its own inline script and style: it may load nothing else and talk
# only to this server, and no other site may frame it.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "img-src data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


@dataclass(frozen=True)
class ServeSettings:
    model: str  # the id /v1/models lists and responses carry (requests may name any model)
    drafter: str = Drafter.AUTO  # a request's default drafter and draft length
    gamma: int | None = None
    api_key: str | None = None  # when set, every request needs "Authorization: Bearer KEY"
    max_body_bytes: int | None = None  # default: room for a full context (body_limit)
    header_seconds: float = 30.0  # a request's headers must arrive within this (see _protocol)
    read_seconds: float = 30.0  # a response its client reads nothing of for this long is cut (_protocol)
    body_seconds: float = 60.0  # and its body within this after them (read_body)
    template_variables: dict | None = None  # every chat request's, under its own (serve --no-think, ...)
    embedding_model: str | None = None  # the embedding model's id in /v1/models (default: its file name)
    # Requests that may wait for the engine; each holds its body meanwhile, so more get a 503.
    max_waiting: int = MAX_WAITING
    # A grammar whose first mask over the vocabulary takes longer is refused (None: never): its
    # masks are computed on the engine's thread, and every other client waits meanwhile
    grammar_budget: float | None = GRAMMAR_BUDGET
    # Origins whose web pages may call the API from a browser (CORS; "*": any), as sent in Origin
    cors_origins: tuple[str, ...] = ()
    # Bytes of other conversations' KV caches kept in memory (engine/saved_states.py; 0: none)
    cache_ram: int = CACHE_RAM

    def __post_init__(self):
        if self.api_key is not None:
            check_api_key(self.api_key)
        object.__setattr__(self, "cors_origins", cors_origins(self.cors_origins))
        if self.grammar_budget is not None:
            check_grammar_budget(self.grammar_budget)


def cors_origins(given: Sequence[str]) -> tuple[str, ...]:
    """Origins as a browser sends them in its Origin header (scheme://host[:port], no path), a
    trailing slash taken off; "*" for any. Anything else is refused: it would match no page."""
    origins = []
    for origin in given:
        trimmed = origin.strip().removesuffix("/")
        if trimmed != "*" and not re.fullmatch(r"https?://[^/\s?#@]+", trimmed):
            raise SpecllmError(
                f"--cors {origin!r}: give an origin as a browser sends it, scheme://host[:port] "
                "(http://localhost:3000), or * for any page"
            )
        origins.append(trimmed)
    return tuple(dict.fromkeys(origins))


def check_api_key(key: str) -> None:
    """A key a client can send as `Authorization: Bearer KEY`: an empty one would leave the server
    open, and one with spaces (a line break read from a file, say) could never be matched."""
    if not key:
        raise SpecllmError("the API key is empty: give one, or none at all for a server without a key")
    if not key.isprintable() or any(c.isspace() for c in key):
        raise SpecllmError("the API key must have no spaces, line breaks or other control characters")


def check_grammar_budget(seconds: float) -> None:
    """A budget a mask can be within: a finite number of seconds above 0 (none: no budget)."""
    if not 0 < seconds < math.inf:
        raise SpecllmError(f"the grammar budget is a number of seconds above 0, not {seconds}")


def body_limit(n_ctx: int) -> int:
    """The largest request body: enough for a prompt that fills the context, and at least 1 MiB."""
    return max(MIN_BODY_BYTES, BODY_BYTES_PER_TOKEN * n_ctx)


# --- running the engine, one generation at a time ---------------------------------------------


class _End(enum.Enum):
    """The last item of a job's queue, after its steps and result."""

    END = enum.auto()


_END: Final = _End.END


def shutting_down() -> ApiError:
    return ApiError(503, "the server is shutting down", code="shutting_down")


def grammar_too_costly(seconds: float | None, budget: float) -> ApiError:
    """The 400 for a grammar whose first mask took `seconds` (None: it had not ended within the
    budget)."""
    took = f"{seconds:.2f} s" if seconds is not None else f"more than {budget:g} s"
    message = (
        f"the grammar is too costly to follow: masking the vocabulary once took {took}, past this "
        f"server's budget of {budget:g} s a mask (serve --grammar-budget)"
    )
    return ApiError(400, message, "grammar", "grammar_too_costly")


def busy_with_costly_grammars(running: int) -> ApiError:
    message = (
        f"the server is busy with costly grammars ({running} masks past the budget still running): try again later"
    )
    return ApiError(503, message, code="server_busy")


def too_many_waiting(limit: int) -> ApiError:
    return ApiError(503, f"the server is busy, its queue full ({limit} waiting): try again later", code="server_busy")


@dataclass
class Plan:
    """A request ready to generate: its prompt and the engine's generation (not started)."""

    text: str | None  # the prompt as text (None: token ids), remembered for the next request
    tokens: list[int]
    seed: int
    generation: Generation
    continues: bool = False  # the prompt extends the previous request's whole transcript
    left_out: int = 0  # a gap's code cut to leave room for the reply (Engine.infill_prompt)
    read: ChatReply | None = None  # a chat reply: splits its reasoning off, reads its tool calls
    piece: Callable[[int], bytes] | None = None  # a generated token's bytes (the target's), to count reasoning tokens

    def delta(self, step: Step) -> Delta:
        """What a step adds to the reply: its reasoning, text and calls, in order."""
        text = step.accepted_text + step.token_text
        if self.read is not None:
            return self.read.feed(text)
        return [{"text": text}] if text else []

    def finish(self, result: Result) -> Delta:
        """What only the end of the reply decides: text held back as maybe a call or a marker;
        and the count of its reasoning tokens."""
        if self.read is None:
            return []
        if self.piece is not None:
            self.read.count_reasoning(map(self.piece, result.tokens))
        return self.read.finish()

    def reported(self, result: Result) -> Result:
        """The result as a client is told it. The KV cache is one for all clients: the part of a
        prompt that another request left in it is reported as evaluated, not as cached, or its
        size would tell this client, token by token, what another one sent. A prompt that goes on
        from the previous request's whole transcript (a conversation continued) has its reuse
        reported: all it learns is that its guess of that whole transcript, prompt and reply, was
        right, which the time its prefill takes tells as well."""
        if self.continues:
            return result
        stats = dataclasses.replace(result.stats, prefill_tokens=max(0, result.stats.prompt_tokens - 1))
        return dataclasses.replace(result, stats=stats)


@dataclass
class Ready:
    """What a request's preparation made before its turn, beside the engine (EngineWorker.ready):
    its prompt as text with that text's own tokens, the reader of a chat reply, its structured
    output (GenerationConfig's fields) and grammar."""

    structure: dict
    text: str | None = None  # None: token ids, or a gap to fill
    read: ChatReply | None = None
    tokens: list[int] | None = None  # the text's own tokens (the prompt cache reuses them or not), or a gap's prompt
    left_out: int = 0  # a gap's code cut to leave room for the reply
    grammar: PreparedGrammar | None = None
    answer_grammar: str | None = None  # the GBNF the answer follows (grammar_text's), timed (check_cost)


AHEAD = 4  # steps the engine may take before the client's side has taken the earlier ones
# Requests prepared at once (their chat template rendered, their prompt tokenized, their grammar
# made), beside the engine: a heavy one (20,000 messages take seconds) holds one of these threads,
# not the engine nor the requests prepared beside it.
PREPARING_THREADS = 4
# Grammars' first masks given up on past the budget (GrammarCost): while more than these still run,
# each on a core of its own, a grammar is refused (503) rather than timed on yet another thread
GIVEN_UP_MASKS = 4


class Job:
    """One generation on the engine thread; its steps, then its result, reach the event loop
    through a queue. `cancel()` (the client went away) stops it after the step under way, or
    within a long prompt's prefill; `result` stays None then. The engine runs at
    most AHEAD steps ahead of the response: when a client goes away, what it would not read is not
    generated (it was: 3 to 341 tokens past a closed stream), and the response, which sees the
    connection closed only when it waits for a step, cannot fall far behind."""

    def __init__(self, loop: asyncio.AbstractEventLoop, generation: Generation):
        self.loop, self.generation, self.cancelled = loop, generation, threading.Event()
        self.queue: asyncio.Queue[Step | Result | Exception | _End] = asyncio.Queue()
        self.room = threading.Semaphore(AHEAD)
        self.result: Result | None = None  # set on the event loop once the steps have all come

    def cancel(self) -> None:
        self.cancelled.set()
        self.generation.cancel()  # a prefill under way stops at its next batch
        self.room.release()  # an engine waiting for room sees it

    def stop(self) -> None:
        """The server is shutting down: cancel, and end the steps now rather than when the step
        under way ends (a batch of a long prompt's prefill takes seconds on a CPU). Safe from a
        signal handler or another thread."""
        self.cancel()
        self.loop.call_soon_threadsafe(self.queue.put_nowait, _END)

    def run(self, on_result: Callable[[Result], None], on_end: Callable[[], object]) -> None:
        """On the engine thread: step the engine, handing each step over, then the result
        (given to `on_result` first, still on the engine thread)."""
        generation = self.generation
        try:
            with generation:  # closing ends the engine's generation: it is free for the next
                for step in generation:
                    self.room.acquire()
                    if self.cancelled.is_set():
                        return
                    # The engine's stats change on as it runs ahead of the response (AHEAD): each
                    # step carries them as they were after it, copied here on the engine's thread.
                    self._put(dataclasses.replace(step, stats=copy.deepcopy(step.stats)))
                if not generation.finished:  # cancelled before a step came
                    return
                on_result(generation.result)
                self._put(generation.result)
        except Exception as e:  # given to the request, which reports it
            self._put(e)
        finally:
            self._put(_END)
            on_end()

    def _put(self, item: Step | Result | Exception | _End) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the event loop is closed: the server is shutting down
            self.cancel()

    async def steps(self) -> AsyncIterator[Step]:
        """The generation's steps as they come; then `result` is set, unless it was stopped."""
        while (item := await self.queue.get()) is not _END:
            if isinstance(item, Exception):
                raise item
            if isinstance(item, Result):
                self.result = item
                continue
            self.room.release()
            yield item


class Lane:
    """A thread for work beside the generation (EngineWorker.beside), one job at a time, and how
    many wait for it."""

    def __init__(self, name: str, threads: int = 1):
        self.thread = ThreadPoolExecutor(threads, thread_name_prefix=name)
        self.waiting = 0


class GrammarCost:
    """Times grammars' first masks (first_mask_seconds), each on a thread of its own, `lanes` at once.
    llama.cpp's call cannot be stopped: a mask still running once the budget has passed is given
    up on, its lane free at once for the next grammar (a cheap one waits for no costly one), its
    thread left to end alone. Those threads are daemons: the process may end under them, which
    frees the models they read (serve leaves them to it). Past `limit` given-up masks still
    running, a grammar gets a 503 rather than another thread beside them on the cores they hold."""

    def __init__(self, lanes: int = PREPARING_THREADS, limit: int = GIVEN_UP_MASKS):
        self.lanes = asyncio.Semaphore(lanes)
        self.limit = limit
        self.threads: list[threading.Thread] = []  # every mask's, pruned as they end
        self.given_up: list[threading.Thread] = []  # those past their budget, pruned as they end

    def running(self) -> bool:
        """Whether a mask's thread is still reading the vocabulary."""
        self._forget_ended()
        return bool(self.threads)

    def _forget_ended(self) -> None:
        self.threads = [t for t in self.threads if t.is_alive()]
        self.given_up = [t for t in self.given_up if t.is_alive()]

    async def seconds(self, measure: Callable[[], float], budget: float) -> float | None:
        """What `measure` returns, or None once `budget` seconds have passed without it. It waits
        for a lane first (behind at most `lanes` grammars, each for at most the budget)."""
        async with self.lanes:
            self._forget_ended()
            if len(self.given_up) > self.limit:
                raise busy_with_costly_grammars(len(self.given_up))
            loop = asyncio.get_running_loop()
            ended: asyncio.Future[float] = loop.create_future()
            thread = threading.Thread(
                target=self._measure, args=(measure, loop, ended), name="specllm-grammar-cost", daemon=True
            )
            self.threads.append(thread)
            thread.start()
            try:
                await asyncio.wait((ended,), timeout=budget)
            finally:
                if ended.cancel():  # not ended within the budget, or the request is gone: given up on
                    self.given_up.append(thread)
            return None if ended.cancelled() else ended.result()

    @staticmethod
    def _measure(measure: Callable[[], float], loop: asyncio.AbstractEventLoop, ended: asyncio.Future) -> None:
        try:
            outcome: tuple = (measure(), None)
        except Exception as e:
            outcome = (None, e)
        with contextlib.suppress(RuntimeError):  # the event loop has closed meanwhile: no one waits
            loop.call_soon_threadsafe(_settle, ended, *outcome)

    def join(self) -> None:
        """Wait for every mask's thread to end (before its models are freed)."""
        for thread in list(self.threads):
            thread.join()


def _settle(future: asyncio.Future, result: Any, error: Exception | None) -> None:
    if future.done():  # given up on
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class EngineWorker:
    """The engine, its thread, and the queue of requests waiting for it; the embedding model,
    where there is one."""

    def __init__(self, engine: Engine, settings: ServeSettings, embedder: Model | None = None):
        self.engine, self.settings, self.embedder = engine, settings, embedder
        self.thread = ThreadPoolExecutor(1, thread_name_prefix="specllm-engine")
        # Tokenizing and rendering the chat template, for the utilities (beside)
        self.vocab = Lane("specllm-vocab")
        # The embedding model's own: a batch of texts to embed waits for no generation, and the
        # utilities wait for no batch
        self.embedding = Lane("specllm-embed")
        # A generating request's preparation (ready), before it waits for the engine
        self.preparing = Lane("specllm-prepare", PREPARING_THREADS)
        # Timing a grammar's first mask (check_cost): a costly one holds its own thread until
        # llama.cpp returns (C code cannot be stopped), not the threads that prepare other requests
        self.grammar_cost = GrammarCost()
        self.lock = asyncio.Lock()  # first come, first served
        self.waiting = 0
        self.job: Job | None = None  # the generation under way
        self.stopping = False  # the server is shutting down: no new generations
        self.stopped = asyncio.Event()  # set with stopping, on the event loop: wakes the waiting requests
        self.loop: asyncio.AbstractEventLoop | None = None  # the event loop, once a request has come
        # The previous generation's prompt + generated text and its tokens, for the next prompt.
        self.cache = PromptCache(engine)
        # Other conversations' KV caches, so that a side request costs the conversation no prefill
        self.states = SavedStates(settings.cache_ram) if settings.cache_ram else None
        # what a request may ask for: those a refusal offers instead
        self.drafters = tuple(
            d for d in DRAFTERS if (d != Drafter.MODEL or engine.has_draft) and (d != Drafter.MTP or engine.mtp)
        )
        self._tool_template: ToolTemplate | None = None  # found on the first request that needs it
        engine.on_draft_dropped = self.draft_dropped  # said in the server's log, not on a line of its own

    async def start(self, request, left: Callable[[], Awaitable[None]]) -> tuple[Plan, Job] | None:
        """Wait for the engine, then start generating for `request` on the engine thread; None
        when the client has `left` (returns once it has) before its turn: nothing is prefilled
        for it, and it no longer counts as waiting. Bad input raises ApiError, before anything
        is generated: most of it before the request waits for the engine (ready)."""
        self.loop = loop = asyncio.get_running_loop()
        if self.waiting >= self.settings.max_waiting:
            raise too_many_waiting(self.settings.max_waiting)
        self.waiting += 1  # from its preparation on: it holds its body, and a full queue refuses at once
        try:
            ready = await self.beside(partial(self.ready, request), self.preparing)
            await self.check_cost(ready.answer_grammar)
            ours = await self.turn(left)  # raises once the server is stopping
        finally:
            self.waiting -= 1
        if not ours:
            return None
        try:
            plan = await loop.run_in_executor(self.thread, self.prepare, request, ready)
        except SpecllmError as e:
            self.lock.release()
            raise self.refusal(e) from None
        except BaseException:
            self.lock.release()
            raise
        self.job = job = Job(loop, plan.generation)
        remember = partial(self.cache.remember, plan.text, plan.tokens)
        self.thread.submit(job.run, remember, partial(loop.call_soon_threadsafe, self.lock.release))
        return plan, job

    async def check_cost(self, grammar: str | None) -> None:
        """Refuse a grammar (GBNF, Ready.answer_grammar) whose first mask over the vocabulary takes
        longer than the budget (ApiError 400): generation computes its masks on the engine's
        thread, every other client waiting meanwhile, and some grammars take seconds to minutes a
        mask inside llama.cpp. The mask is timed on a thread of its own (GrammarCost); the request
        waits for it at most the budget from when it begins, and is refused then if it has not
        ended: the thread goes on until llama.cpp returns, holding only itself (the grammar is used
        by nothing else, and freed once it ends), and the next grammar is timed at once."""
        budget = self.settings.grammar_budget
        if grammar is None or budget is None:
            return
        try:
            seconds = await self.grammar_cost.seconds(partial(first_mask_seconds, self.engine.target, grammar), budget)
        except SpecllmError as e:  # one not made before (a prompt of token ids, a gap): it does not parse
            raise self.refusal(e) from None
        if seconds is None or seconds > budget:
            raise grammar_too_costly(seconds, budget)

    async def turn(self, left: Callable[[], Awaitable[None]]) -> bool:
        """Wait until the engine is this request's (the lock: first come, first served: True),
        until its client has `left` (False: the lock goes to the next), or until the server
        stops: the generation under way may take long to end its step (a long prefill), and a
        request still waiting is answered at once (ApiError 503)."""
        turn, stopped = asyncio.ensure_future(self.lock.acquire()), asyncio.ensure_future(self.stopped.wait())
        gone = asyncio.ensure_future(left())
        try:
            await asyncio.wait((turn, stopped, gone), return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            self.give_up(turn)
            raise
        finally:
            stopped.cancel()
            gone.cancel()
        if self.stopping:
            self.give_up(turn)
            raise shutting_down()
        if gone.done() and not gone.cancelled():  # left, maybe just as its turn came
            self.give_up(turn)
            return False
        return True

    def give_up(self, turn: asyncio.Future) -> None:
        """Leave the engine's lock as if `turn` had never asked for it."""
        if turn.done() and not turn.cancelled():
            self.lock.release()
        else:
            turn.cancel()  # an acquire cancelled before it takes the lock leaves it to the next waiter

    async def beside(self, work: Callable[[], T], lane: Lane | None = None) -> T:
        """Run `work` on a lane's thread (the vocabulary's by default), beside the generation under
        way rather than after it: tokenizing and rendering the chat template read the target's
        vocabulary and template, never its context or KV cache; embedding uses a model and a
        context of its own. llama.cpp's vocabulary is read-only once loaded (llama-server tokenizes
        on its HTTP threads while its main loop decodes), Model.tokenize and piece use only it, as
        does parsing a grammar (llama.cpp's parser tokenizes its <token>s), and the models are
        freed only once these threads have ended (serve). One at a time a lane, so
        a large body takes one core at most; as many may wait as for the engine."""
        lane = lane or self.vocab
        if self.stopping:
            raise shutting_down()
        if lane.waiting >= self.settings.max_waiting:
            raise too_many_waiting(self.settings.max_waiting)
        lane.waiting += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(lane.thread, work)
        except SpecllmError as e:
            raise self.refusal(e) from None
        finally:
            lane.waiting -= 1

    def tokenize(self, request: TokenizeRequest) -> dict:
        """/tokenize: the content's tokens as llama-server gives them (a first text gets the BOS
        that add_special asks for; ids stay as they are), maybe with their pieces."""
        target, tokens = self.engine.target, []
        for i, part in enumerate(request.parts()):
            if isinstance(part, int):
                check_ids([part], target.n_vocab, "content")
                tokens.append(part)
            else:
                add_special = request.add_special and i == 0
                tokens += target.tokenize(part, add_special=add_special, parse_special=request.parse_special)
        if not request.with_pieces:
            return {"tokens": tokens}
        return {"tokens": with_pieces(tokens, [target.piece(t, special=True) for t in tokens])}

    def detokenize(self, request: DetokenizeRequest) -> dict:
        """/detokenize: the tokens' text, control tokens written out, as llama-server gives it."""
        target = self.engine.target
        check_ids(request.tokens, target.n_vocab, "tokens")
        return {"content": target.detokenize(request.tokens, special=True).decode("utf-8", errors="replace")}

    def apply_template(self, request: ChatRequest) -> dict:
        """/apply-template: the prompt the chat endpoint would generate from for this request."""
        return {"prompt": self.render_chat(request)[0]}

    def count_tokens(self, request: ChatRequest) -> int:
        """/v1/messages/count_tokens: the tokens of the prompt the request would generate from."""
        return len(text_tokens(self.engine.target, self.render_chat(request)[0]))

    def embed(self, request: EmbeddingRequest, left: threading.Event) -> tuple[list[np.ndarray], int] | None:
        """/v1/embeddings and /embedding, on the embedding lane: each input's embedding, normalised
        as the request asks, and the tokens read. Every input is checked before any is embedded; a
        client that has `left` (or a server stopping) ends the batch at the next input (None)."""
        embedder = self.embedder
        assert embedder is not None
        if is_reranker(embedder):
            name = embedder.path.name
            message = f"{name} is a reranker: it scores documents against a query (POST /rerank), it embeds no text"
            raise ApiError(400, message, code="model_not_supported")
        request.check_dimensions(embedder.n_embd_out)
        prompts = enumerate(request.prompts())
        inputs = [self.embedding_tokens(prompt, f"input[{i}]", bool(request.truncate)) for i, prompt in prompts]
        embeddings = self.pooled(inputs, left)
        if embeddings is None:
            return None
        return [normalized(e, request.embd_normalize) for e in embeddings], sum(map(len, inputs))

    def rerank(self, request: RerankRequest, left: threading.Event) -> tuple[list[float], int] | None:
        """/rerank, on the embedding lane: each document's score against the query, as the
        reranker gives it (llama-server's: the head's first output, not normalised), and the
        tokens read; None as for embed."""
        reranker = self.embedder
        assert reranker is not None
        if not is_reranker(reranker):
            message = (
                f"{reranker.path.name} is an embedding model, not a reranker (pooling type rank, as "
                "bge-reranker and Qwen3-Reranker): start specllm serve with --embedding-model RERANKER to rerank"
            )
            raise ApiError(400, message, code="model_not_supported")
        documents = request.document_list()
        limit = embedding_limit(reranker)
        if len(alone := rerank_tokens(reranker, request.query, "")) > limit:  # no document can fit: say why
            message = f"query is {len(alone)} tokens with the pair's markup but the reranker's context holds {limit}"
            raise ApiError(400, message, "query", "context_length_exceeded")
        if request.truncate:
            pairs = [fitted_rerank_tokens(reranker, request.query, document, limit) for document in documents]
        else:
            pairs = [rerank_tokens(reranker, request.query, document) for document in documents]
        for i, tokens in enumerate(pairs):
            if len(tokens) > limit:
                message = (
                    f"documents[{i}] is {len(tokens)} tokens with the query but the reranker's context holds {limit}"
                )
                raise ApiError(400, message, "documents", "context_length_exceeded")
        scores = self.pooled(pairs, left)
        if scores is None:
            return None
        return [float(score[0]) for score in scores], sum(map(len, pairs))

    def pooled(self, inputs: list[list[int]], left: threading.Event) -> list[np.ndarray] | None:
        """What the embedding model pools each input into, one input at a time; None once the
        client has `left` (or the server is stopping)."""
        embedder = self.embedder
        assert embedder is not None
        pooled = []
        for tokens in inputs:
            if left.is_set() or self.stopping:
                return None
            try:
                pooled.append(embedder.embed(tokens))
            except SpecllmError as e:  # the server's model failed, not the request
                raise generation_failed(e, self.without_paths, "embedding") from None
        return pooled

    @property
    def embedding_name(self) -> str:
        """The embedding model's id: /v1/models lists it, its responses carry it."""
        return self.settings.embedding_model or (self.embedder.path.name if self.embedder else "")

    def embedding_tokens(self, prompt: Prompt, field: str, truncate: bool = False) -> list[int]:
        """An input's tokens, as llama-server's tokenize_mixed reads its texts and ids: a text
        first with the model's BOS (and EOS or SEP where it adds one), a text after anything
        without them, control tokens written in a text read as such, ids as they are; within the
        embedding model's context: a longer input is refused, or cut to its first tokens that fit
        if the request says `truncate` (a text's closing special token kept: `truncated`)."""
        embedder = self.embedder
        assert embedder is not None
        tokens: list[int] = []
        for at, part in enumerate(prompt):
            if isinstance(part, str):
                tokens += embedder.tokenize(part, add_special=at == 0, parse_special=True)
            elif 0 <= part < embedder.n_vocab:
                tokens.append(part)
            else:  # most often another tokenizer's ids (LangChain's OpenAIEmbeddings sends tiktoken's)
                message = f"{field}: token id {part} (at {at}) is not in 0..{embedder.n_vocab - 1}: {FOREIGN_IDS}"
                raise ApiError(400, message, field)
        if not tokens:
            raise ApiError(400, f"{field} is empty: it has no tokens to embed", "input")
        if len(tokens) > (limit := embedding_limit(embedder)) and truncate:
            return truncated(embedder, tokens, limit, one_text=len(prompt) == 1 and isinstance(prompt[0], str))
        if len(tokens) > limit:
            message = f"{field} is {len(tokens)} tokens but the embedding model's context holds {limit}"
            raise ApiError(400, message, "input", "context_length_exceeded")
        return tokens

    def props(self) -> dict:
        target = self.engine.target
        templates = (target.chat_template() or CHATML_TEMPLATE, target.chat_template("tool_use"))
        return props(self.settings.model, target.n_ctx, *templates)

    def refusal(self, error: SpecllmError) -> ApiError:
        """The 4xx (or 500) for a library error, without the server's paths."""
        refused = ApiError.of(error, self.drafters)
        refused.message = self.without_paths(refused.message)
        return refused

    def without_paths(self, message: str) -> str:
        """An error for a client: the server's model files named by their file names only."""
        engine = self.engine
        paths: list[str | Path] = [engine.target.path]
        if self.embedder is not None:
            paths.append(self.embedder.path)
        if engine.draft:
            paths.append(engine.draft.path)
        if engine.draft_file:  # a draft not loaded yet
            paths.append(engine.draft_file[0])
        for path in paths:
            for form in {str(path), str(Path(path).resolve())}:
                message = message.replace(form, Path(path).name)
        return message

    def stop(self) -> None:
        """Shutting down: stop the generation under way after its step, and start no other."""
        self.stopping = True
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.stopped.set)
        if self.job is not None:
            self.job.stop()

    def ready(self, request) -> Ready:
        """Beside the engine, before the request waits for it: what reads only the target's
        vocabulary and chat template (see beside): the chat template rendered, the text's tokens,
        the structured output asked (chat_structure, which prepare uses too) and its grammar. A bad
        request is refused here as prepare would refuse it, but for its grammar, which prepare makes
        again to refuse it in its turn (after a prompt too long, say)."""
        if isinstance(request, ChatRequest):
            text, read = self.render_chat(request)  # refuses a bad request before chat_structure does
            ready = Ready(self.chat_structure(request), text, read)
        else:
            gap = request.gap()
            given = request.prompt if isinstance(request.prompt, str) and gap is None else None
            ready = Ready(request.structure, given)
            if gap is not None:
                target, wanted = self.engine.target, request.requested_tokens
                infill = gap_prompt(target, gap.prefix, gap.suffix, files=gap.files, line=gap.line, max_tokens=wanted)
                ready.tokens, ready.left_out = infill.tokens, infill.left_out
        if ready.text is not None:
            ready.tokens = text_tokens(self.engine.target, ready.text)
        with contextlib.suppress(SpecllmError):  # refused in its turn, in the same words
            config = make_config(**ready.structure)
            if ready.tokens is not None:
                ready.grammar = prepare_grammar(self.engine.target, ready.tokens, config)
                ready.answer_grammar = ready.grammar.text if ready.grammar is not None else None
            else:  # token ids: checked in its turn, its grammar made then
                ready.answer_grammar = grammar_text(config)
        return ready

    def prepare(self, request, ready: Ready) -> Plan:
        """On the engine thread, holding the engine: the prompt's tokens (what the prompt cache
        reuses of `ready`'s) and the engine's stream."""
        engine, chat = self.engine, isinstance(request, ChatRequest)
        text, read, wanted, continues = ready.text, ready.read, request.requested_tokens, False
        if text is not None:
            prompt = self.cache.prompt(text, ready.tokens)
            tokens, continues = prompt.tokens, prompt.extended
        elif ready.tokens is not None:  # a gap's
            tokens = ready.tokens
        else:
            tokens = request.prompt
            if not all(0 <= t < engine.target.n_vocab for t in tokens):
                raise ApiError(400, f"prompt: token ids must be in 0..{engine.target.n_vocab - 1}", "prompt")
        room = engine.target.n_ctx - len(tokens)
        if room < 1:
            raise ApiError(
                400,
                f"the prompt is {len(tokens)} tokens but the context holds {engine.target.n_ctx}",
                "messages" if chat else "prompt",
                "context_length_exceeded",
            )
        seed = default_seed(request.seed)
        # A reply fits room + 1 tokens (its last needs no KV slot of its own). Asked for more, or
        # for none, the engine ends it as context_full, as run's.
        beyond = room + 2
        config = make_config(
            max_tokens=min(wanted or beyond, beyond),
            drafter=request.drafter or self.settings.drafter,
            gamma=request.gamma if request.gamma is not None else self.settings.gamma,
            stop=request.stops + (engine.target.chat_stops if chat else ()),
            seed=seed,
            **request.sampler,
            **request.limits,
            **ready.structure,
        )
        if self.states is not None:  # the KV cache as the prompt would have it: another conversation's, maybe
            self.states.switch(tokens, engine.target, [engine.draft] if engine.draft is not None else [])
        generation = engine.start(tokens, config, prepared=ready.grammar)  # refuses what the engine cannot do, now
        # The KV cache changes from the first step (a refusal above leaves it as it was, for the
        # conversation to go on from); Job.run remembers the finished generation.
        self.cache.forget()
        return Plan(text, tokens, seed, generation, continues, ready.left_out, read, engine.target.piece)

    def render_chat(self, request: ChatRequest) -> tuple[str, ChatReply]:
        """The prompt of a chat request, through the target's chat template with its tools and
        the request's chat_template_kwargs, and the reader of the reply: its reasoning when the
        prompt opens a think block (or the reply does), its calls when tools are offered. A call
        that must be made is begun in the prompt (ToolTemplate.prefill), so the model goes on
        with it. A template that renders no tools gets them in the generic format (generic_tools.py)."""
        offered = request.offered_tools
        uses_tools = offered or any(m.tool_calls for m in request.messages)
        form = self.tool_template() if uses_tools else ToolTemplate(False)
        generic = uses_tools and not form.renders_tools
        messages = [m.to_template(form.object_arguments) for m in request.messages]
        tools = [t.to_template() for t in offered] or None
        if generic:
            messages = self.generic_messages(request, messages, tools)
        try:
            text = self.engine.target.render_chat(
                messages,
                tools=None if generic else tools,
                variables=request.template_variables(self.settings.template_variables),
            )
        except ChatTemplateFailed as e:
            blamed = self.blame_arguments(request, form, e)
            if blamed is None:
                raise
            raise blamed from None
        closing = closing_marker(text)
        opened, recipient = closing or False, asks_recipient(text)
        if not offered:
            return text, ChatReply(opened, recipient=recipient)
        names = [t.function.name for t in offered]
        parallel = request.parallel_tool_calls is not False
        if generic:  # the grammar makes the reply a call or an answer: nothing to begin it with
            return text, ChatReply(opened, ToolReply(names, parallel, generic=True), recipient=recipient)
        # A call that must be made begins after the think block: not inside one the prompt opened
        prefill = after_think_block(form.prefill(request.forced_tool), closing) if request.call_required else ""
        reply = ToolReply(names, parallel, text_arguments(tools or []))
        return text + prefill, ChatReply(opened, reply, prefill, form.call_openings, recipient)

    @staticmethod
    def generic_messages(request: ChatRequest, messages: list[dict], tools: list[dict] | None) -> list[dict]:
        """The conversation for a template that renders no tools: earlier calls and results as
        text, and the offered tools told in the system message."""
        parallel = request.parallel_tool_calls is not False
        messages = generic_tools.in_text(messages, parallel)
        if not tools:
            return messages
        told = generic_tools.instructions(tools, request.forced_tool, request.call_required, parallel)
        return generic_tools.with_system_text(messages, told)

    def chat_structure(self, request: ChatRequest) -> dict:
        """GenerationConfig's structured output for a chat request. Beside offered tools the
        reply may be a call, which the structure does not apply to: a call made to begin in the
        prompt (tool_choice "required" or a named function) leaves none; with tool_choice "auto"
        the answer is the structure's or a call, told apart by the call's opening as the
        template writes it, or a fenced JSON call naming an offered tool, which the reply reader
        reads as a call too (engine/constrained.py). A template that renders no tools gets the
        generic format's schema, a JSON schema's structure as its answer."""
        structure = request.structure
        if request.offered_tools and not self.tool_template().renders_tools:
            return {"json_schema": self.generic_schema(request)}
        if not structure or not request.offered_tools:
            return structure
        if request.call_required:
            return {}
        calls = self.tool_template().call_openings  # a call that may begin inside the reasoning ends it
        names = tuple(tool.function.name for tool in request.offered_tools)
        return structure | {"call_opening": self.call_opening(), "calls_in_reasoning": calls, "call_names": names}

    @staticmethod
    def generic_schema(request: ChatRequest) -> dict:
        """The generic format's reply schema for the request, checked to make a grammar. A GBNF
        grammar cannot hold the call beside its answer: refused."""
        structure = request.structure
        if "grammar" in structure:
            message = (
                "a grammar cannot be given beside tools to this model: its chat template renders no tools, "
                "so its reply is JSON (a call or an answer); give a json_schema or response_format instead"
            )
            raise ApiError(400, message, "grammar")
        answer = structure.get("json_schema")
        answer = (answer or generic_tools.ANY_OBJECT) if answer is not None else None  # {}: any object
        tools = [tool.to_template() for tool in request.offered_tools]
        parallel = request.parallel_tool_calls is not False
        schema = generic_tools.reply_schema(tools, request.forced_tool, request.call_required, parallel, answer)
        check_schema(schema, "tools")
        return schema

    def call_opening(self) -> str:
        """What the template's calls begin with, refused where they have nothing of their own
        (functionary v3.2's prompt ends where its call's name begins). gpt-oss's ("to=functions.")
        is a harmony message's header: the engine allows a call's message beside the final one."""
        opening = self.tool_template().call_marker
        if opening:
            return opening
        why = "its calls have no opening of their own"
        message = f"tools cannot be offered with a response_format or grammar to this model: {why}"
        raise ApiError(400, message, "tools")

    @staticmethod
    def blame_arguments(request: ChatRequest, form: ToolTemplate, error: ChatTemplateFailed) -> ApiError | None:
        """A template that failed on an earlier call's arguments that are not a JSON object
        (Qwen3.5's reads them with |items): the 400 names that field, not only the template's
        own words ("Can only get item pairs from a mapping"). None when no call is to blame."""
        field = request.arguments_not_an_object() if form.object_arguments else None
        if field is None:
            return None
        return ApiError(400, f"{field} must be a JSON object for this model's chat template ({error})", field)

    def tool_template(self) -> ToolTemplate:
        if self._tool_template is None:
            target = self.engine.target
            self._tool_template = inspect_template(
                lambda messages, tools, prompt: target.render_chat(messages, tools=tools, add_generation_prompt=prompt)
            )
        return self._tool_template

    def status(self) -> dict:
        drafters = [d.value for d in self.drafters]  # what a request may ask for: the chat page offers these
        status = {"status": "ok", "busy": self.lock.locked(), "waiting": self.waiting, "drafters": drafters}
        if (reason := self.engine.draft_unavailable) is not None:  # auto goes on without it
            status["draft_unavailable"] = self.without_paths(reason)
        return status

    @staticmethod
    def draft_dropped(reason: str) -> None:
        log.warning("the draft model could not be loaded: drafter auto goes on without it (%s)", reason)


# --- the HTTP layer -----------------------------------------------------------------------------


class EventStream(StreamingResponse):
    """Server-sent events whose generation is stopped when the response ends for any reason: sent
    to the end, or cut off by a client that went away (Starlette then cancels the body)."""

    def __init__(self, chunks: AsyncGenerator[str, None], job: Job):
        super().__init__(_paced(chunks), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.job = job

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.cancel()


async def _paced(chunks: AsyncGenerator[str, None]) -> AsyncIterator[str]:
    """The events, the event loop let run after each. A response that lags behind its engine has
    several queued, and wrote them in one burst: a client that reset its connection meanwhile was
    seen only after it (asyncio's connection_lost runs soon after the write that failed), and
    asyncio logged "socket.send() raised exception." for every write past the fifth."""
    async with aclosing(chunks):  # cancelled here, the stream's own ending (its log line) runs now
        async for chunk in chunks:
            yield chunk
            await asyncio.sleep(0)


def create_app(engine: Engine, settings: ServeSettings, embedder: Model | None = None) -> FastAPI:
    """The FastAPI app serving `engine`, and `embedder` on /v1/embeddings (an embedding model:
    llama/embeddings.py); run it with uvicorn (see `serve`)."""
    worker = EngineWorker(engine, settings, embedder)
    limit = settings.max_body_bytes or body_limit(engine.target.n_ctx)
    embeddings_limit = settings.max_body_bytes or max(limit, EMBEDDINGS_BODY_BYTES)

    # async: FastAPI runs a plain function on a thread pool's thread, one per request at a time
    # (a burst left 40 threads behind)
    async def require_key(request: Request) -> None:
        if request.url.path != PAGE_PATH:  # the page holds no data; it asks for the key itself
            check_key(settings.api_key, request)

    # no /docs, /redoc or /openapi.json: they would answer without the key and load scripts from elsewhere
    app = FastAPI(
        title="specllm",
        dependencies=[Depends(require_key)],
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        redirect_slashes=False,  # "/v1/models/" is a 404 like any unknown path, not a redirect to the Host given
    )
    app.state.worker = worker
    if settings.cors_origins:  # a browser's preflight carries no key: answered before require_key
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.cors_origins),
            allow_methods=["GET", "HEAD", "POST"],
            allow_headers=["*"],  # what the page's client sends: a key in either header, Anthropic's versions
            max_age=600,
        )

    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError):
        access(request, error.status, error.message)
        body = error_body(error) if is_messages_path(request.url.path) else error.body()
        return JSONResponse(body, status_code=error.status, headers=_auth_header(error))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException):  # unknown path, wrong method
        message = f"{error.detail}: {request.method} {request.url.path}"
        response = await api_error(request, ApiError(error.status_code, message))
        response.headers.update(error.headers or {})  # a 405's Allow: the methods the path takes
        return response

    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health(request: Request):
        access(request, 200, "")
        return worker.status()

    @app.api_route("/v1/models", methods=["GET", "HEAD"])
    async def models(request: Request):
        access(request, 200, "")
        listed = [model_entry(settings.model, engine.target.n_ctx)]
        if embedder is not None:
            listed.append(model_entry(worker.embedding_name, embedding_limit(embedder)))
        return {"object": "list", "data": listed}

    @app.api_route(PAGE_PATH, methods=["GET", "HEAD"], response_class=HTMLResponse)
    async def page(request: Request):
        access(request, 200, "")
        return HTMLResponse(page_html(), headers=PAGE_HEADERS)

    def generating(kind: type[BaseRequest]):
        async def endpoint(request: Request):
            body = await read_body(request, limit, settings.body_seconds)
            # off the event loop: turning a JSON schema into a grammar may take seconds
            return await generate(worker, request, await asyncio.to_thread(parse, kind, body, worker.drafters))

        return endpoint

    # OpenAI's endpoints, and llama-server's own (llama_api.py)
    for path, kind in GENERATING.items():
        app.add_api_route(path, generating(kind), methods=["POST"])

    async def responses(request: Request):  # translated into a chat request (responses_api.py)
        body = await read_body(request, limit, settings.body_seconds)
        return await generate(worker, request, await asyncio.to_thread(parse_responses, body, worker.drafters))

    for path in RESPONSES_PATHS:
        app.add_api_route(path, responses, methods=["POST"])

    @app.post(MESSAGES_PATH)
    async def messages(request: Request):  # translated into a chat request (messages_api.py)
        body = await read_body(request, limit, settings.body_seconds)
        return await generate(worker, request, await asyncio.to_thread(parse_messages, body, worker.drafters))

    @app.post(f"{MESSAGES_PATH}/count_tokens")
    async def count_tokens(request: Request):
        body = await read_body(request, limit, settings.body_seconds)
        counted = await asyncio.to_thread(parse_messages, body, worker.drafters, counting=True)
        tokens = await worker.beside(partial(worker.count_tokens, counted))
        access(request, 200, f"{tokens} tokens")
        return {"input_tokens": tokens}

    @app.post("/tokenize")
    async def tokenize(request: Request):
        body = validated(TokenizeRequest, await read_body(request, limit, settings.body_seconds))
        answer = await worker.beside(partial(worker.tokenize, body))
        access(request, 200, f"{len(answer['tokens'])} tokens")
        return answer

    @app.post("/detokenize")
    async def detokenize(request: Request):
        body = validated(DetokenizeRequest, await read_body(request, limit, settings.body_seconds))
        answer = await worker.beside(partial(worker.detokenize, body))
        access(request, 200, f"{len(body.tokens)} tokens")
        return answer

    @app.post("/apply-template")
    async def apply_template(request: Request):
        body = parse(ChatRequest, await read_body(request, limit, settings.body_seconds), worker.drafters)
        assert isinstance(body, ChatRequest)
        answer = await worker.beside(partial(worker.apply_template, body))
        access(request, 200, "")
        return answer

    async def on_embedding_lane(request: Request, job: Callable[[threading.Event], Any], made: str):
        """job(left) on the embedding model's thread, `left` set if the client goes away (the job
        then ends early, None): its answer, or the 499 logged for a client that left before its
        `made` were made."""
        left = threading.Event()
        watch = asyncio.create_task(client_left(request))
        watch.add_done_callback(lambda _: left.set())
        try:
            answer = await worker.beside(partial(job, left), worker.embedding)
        finally:
            watch.cancel()
        if answer is None and worker.stopping:
            raise shutting_down()
        if answer is None:
            access(request, CLIENT_CLOSED, f"the client went away before its {made} were made")
            return Response(status_code=CLIENT_CLOSED)  # nobody reads it
        return answer

    def embeddings(openai_path: bool):
        async def endpoint(request: Request):
            body = await read_body(request, embeddings_limit, settings.body_seconds)
            if embedder is None:
                raise no_embedding_model()
            wanted = validated(EmbeddingRequest, body)
            answer = await on_embedding_lane(request, partial(worker.embed, wanted), "embeddings")
            if isinstance(answer, Response):
                return answer
            vectors, n_tokens = answer
            count = len(vectors)
            access(request, 200, f"{count} embedding{'s' if count > 1 else ''} · {n_tokens} tokens")
            if openai_path and wanted.openai_shaped:  # llama-server answers `content` in its own shape
                name = wanted.model if wanted.model is not None else worker.embedding_name
                return JSONResponse(embeddings_response(name, vectors, n_tokens, wanted.encoding_format))
            return JSONResponse(llama_embeddings_response(vectors))

        return endpoint

    # OpenAI's, and llama-server's own (its answer's shape: llama_embeddings_response)
    for path, openai_path in EMBEDDINGS_PATHS.items():
        app.add_api_route(path, embeddings(openai_path), methods=["POST"])

    async def rerank(request: Request):
        body = await read_body(request, embeddings_limit, settings.body_seconds)
        if embedder is None:
            raise no_embedding_model("RERANKER", "a reranker's GGUF, such as bge-reranker or Qwen3-Reranker")
        wanted = validated(RerankRequest, body)
        answer = await on_embedding_lane(request, partial(worker.rerank, wanted), "scores")
        if isinstance(answer, Response):
            return answer
        scores, n_tokens = answer
        access(request, 200, f"{len(scores)} document{'s' if len(scores) > 1 else ''} · {n_tokens} tokens")
        name = wanted.model if wanted.model is not None else worker.embedding_name
        return JSONResponse(rerank_response(wanted, name, scores, n_tokens))

    for path in RERANK_PATHS:  # llama-server's paths for /rerank
        app.add_api_route(path, rerank, methods=["POST"])

    @app.api_route("/props", methods=["GET", "HEAD"])
    async def get_props(request: Request):
        answer = await worker.beside(worker.props)
        access(request, 200, "")
        return answer

    return app


# A batch of texts to embed may be larger than a prompt (LangChain sends 1,000 at once; OpenAI
# takes up to 300,000 tokens a request, about 1.2 MB of English).
EMBEDDINGS_BODY_BYTES = 8 * 2**20
EMBEDDINGS_PATHS = {"/v1/embeddings": True, "/embeddings": False, "/embedding": False}  # path: OpenAI's answer?
FOREIGN_IDS = "token ids are the embedding model's own; send text, not another tokenizer's ids"


def no_embedding_model(
    name: str = "MODEL", kind: str = "a GGUF of one, such as nomic-embed-text, bge or Qwen3-Embedding"
) -> ApiError:
    return ApiError(
        404,
        f"this server has no embedding model: start specllm serve with --embedding-model {name} ({kind})",
        code="model_not_found",
    )


RERANK_PATHS = ("/rerank", "/reranking", "/v1/rerank", "/v1/reranking")  # llama-server's


RESPONSES_PATHS = ("/v1/responses", "/responses")  # llama-server's paths for the Responses API
MESSAGES_PATH = "/v1/messages"  # Anthropic's Messages API, and its count_tokens under it


def is_messages_path(path: str) -> bool:
    """A path of Anthropic's API, whose clients read its errors in Anthropic's shape."""
    return path == MESSAGES_PATH or path.startswith(f"{MESSAGES_PATH}/")


GENERATING: dict[str, type[BaseRequest]] = {
    "/v1/chat/completions": ChatRequest,
    "/v1/completions": CompletionRequest,
    "/infill": InfillRequest,
    "/completion": NativeCompletionRequest,
}


def model_entry(name: str, n_ctx: int) -> dict:
    """The model /v1/models lists: OpenAI's fields, and the context under the names clients read
    it by, to fit their prompts to it (vLLM's max_model_len: Continue's vllm provider;
    context_length: llama.vscode's agent, as OpenRouter names it)."""
    return {
        "id": name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "specllm",
        "max_model_len": n_ctx,
        "context_length": n_ctx,
    }


def page_html() -> str:
    """The chat page (specllm/serve/web/index.html): static, so any install serves the same bytes."""
    try:
        return resources.files("specllm.serve").joinpath("web/index.html").read_text(encoding="utf-8")
    except OSError:
        raise ApiError(
            404, "this installation of specllm has no page (specllm/serve/web/index.html is missing)"
        ) from None


def check_key(api_key: str | None, request: Request) -> None:
    """With an API key set, every request needs it, as a bearer token or in Anthropic's x-api-key
    header (either, as llama-server takes them), compared in constant time."""
    if api_key is None:
        return
    # Header values arrive as Latin-1 text: its bytes are what the client sent (UTF-8 for a key
    # that is not ASCII), and are compared with the key's UTF-8 bytes.
    if not any(hmac.compare_digest(given.encode("latin-1"), api_key.encode()) for given in offered_keys(request)):
        message = "missing or wrong API key: send the header Authorization: Bearer KEY (or x-api-key: KEY)"
        raise ApiError(401, message, code="invalid_api_key")


def offered_keys(request: Request) -> list[str]:
    """The keys a request offers: its bearer token, its x-api-key (Anthropic's clients send that)."""
    scheme, _, bearer = request.headers.get("authorization", "").partition(" ")
    offered = [bearer.strip()] if scheme.lower() == "bearer" else []
    return offered + [key.strip() for key in request.headers.getlist("x-api-key")]


def _auth_header(error: ApiError) -> dict | None:
    return {"WWW-Authenticate": "Bearer"} if error.status == 401 else None


async def read_body(request: Request, limit: int, seconds: float) -> bytes:
    """The request body, refused as soon as it is known to be longer than `limit` (413), or when
    it has not all come within `seconds` (408: a client that never finishes its body would hold
    its connection open for good)."""
    too_large = ApiError(413, f"the request body is larger than {limit} bytes", code="request_too_large")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    body = bytearray()

    async def receive() -> None:
        async for chunk in request.stream():
            body.extend(chunk)
            if len(body) > limit:
                raise too_large

    try:
        await asyncio.wait_for(receive(), seconds)
    except asyncio.TimeoutError:
        raise ApiError(408, f"the request body did not arrive within {seconds:g} s", code="request_timeout") from None
    # Closed before the body was read: nobody reads an answer, the log says so. (A client that
    # sends its whole body and closes at once is heard of as closed first: its body is lost.)
    except ClientDisconnect:
        raise ApiError(CLIENT_CLOSED, "the client went away before its request was read: nothing generated") from None
    return bytes(body)


async def generate(worker: EngineWorker, request: Request, body) -> Response:
    started = await worker.start(body, partial(client_left, request))
    if started is None:
        access(request, CLIENT_CLOSED, "the client went away before its turn: nothing generated")
        return Response(status_code=CLIENT_CLOSED)  # nobody reads it
    plan, job = started
    reply = body.reply(worker.settings.model, plan.left_out, len(plan.tokens))
    if body.stream:
        chunks = stream(reply, plan, job, body.include_usage, request, worker.without_paths, body.specllm_steps)
        return EventStream(chunks, job)
    generated = 0
    watch = asyncio.create_task(cancel_when_gone(request, job))
    try:
        async for step in job.steps():
            generated = step.stats.generated_tokens
            plan.delta(step)  # a reply read for calls is read as it comes, as when streamed
    except Exception as e:
        raise generation_failed(e, worker.without_paths) from None
    finally:
        watch.cancel()
        job.cancel()  # the client went away, or the server is shutting down
    result = job.result
    if result is None and worker.stopping:
        raise shutting_down()
    if result is None:
        access(request, CLIENT_CLOSED, stopped(generated, "the client went away"))
        return Response(status_code=CLIENT_CLOSED)  # nobody reads it
    plan.finish(result)
    access(request, 200, describe(result))
    return JSONResponse(reply.complete(plan.reported(result), plan.seed, plan.read))


def generation_failed(error: Exception, without_paths: Callable[[str], str], what: str = "generation") -> ApiError:
    """The 500 for a generation (or an embedding) that failed once under way: the server's fault,
    not the request's (a model whose computation broke down says so in its own words; anything
    else by its type). A grammar that allows no token at some point is the request's: a 400."""
    if isinstance(error, GrammarInvalid):
        return ApiError(400, str(error), "grammar")
    told = str(error) if isinstance(error, SpecllmError) else f"{type(error).__name__}: {error}"
    return ApiError(500, without_paths(f"{what} failed: {told}"))


async def client_left(request: Request) -> None:
    """Return once the client of a request whose body has all come goes away."""
    while (await request.receive())["type"] != "http.disconnect":
        pass  # nothing else arrives before the disconnect


async def cancel_when_gone(request: Request, job: Job) -> None:
    """Cancel `job` once the client of a request not streamed goes away, even during a long
    prefill, when no step comes to check on it (a streamed response watches on its own)."""
    await client_left(request)
    job.cancel()


async def stream(
    reply: Reply,
    plan: Plan,
    job: Job,
    include_usage: bool,
    request: Request,
    without_paths: Callable[[str], str],
    steps: bool = False,
) -> AsyncGenerator[str, None]:
    """The server-sent events of one streamed generation, ending with `data: [DONE]` (OpenAI's
    endpoints; llama-server's end with their last object: Reply.END_OF_STREAM). The status
    is sent already when something goes wrong: the error goes in the stream, as OpenAI's does.
    With `steps` every step is a chunk, with its draft in a `specllm` object (specllm_step)."""
    generated, outcome = 0, None
    try:
        for event in reply.opening():
            yield reply.sse(event)
        async for step in job.steps():
            generated = step.stats.generated_tokens
            delta = plan.delta(step)
            if steps:  # even a step that added no text: its rejected draft and stats are news
                yield reply.sse(reply.chunk(**joined(delta)) | {"specllm": specllm_step(step)})
            elif delta:
                for event in reply.deltas(delta):
                    yield reply.sse(event)
        result = job.result
        if result is None:  # the job was stopped, and not by this client: the server is stopping
            error = shutting_down()
            outcome = stopped(generated, error.message)
            for event in reply.failure(error):
                yield reply.sse(event)
        else:
            outcome = describe(result)
            ended = reply.deltas(delta) if (delta := plan.finish(result)) else []
            ended += reply.closing(plan.reported(result), plan.seed, plan.read, include_usage)
            for event in ended:
                yield reply.sse(event)
    except Exception as e:
        error = generation_failed(e, without_paths)
        outcome = error.message
        for event in reply.failure(error):
            yield reply.sse(event)
    finally:  # not reached above: cancelled, as Starlette does when the client goes away
        access(request, 200, outcome or stopped(generated, "the client went away"))
    if reply.END_OF_STREAM is not None:
        yield reply.sse(reply.END_OF_STREAM)


# --- logging ------------------------------------------------------------------------------------


def describe(result: Result) -> str:
    s = result.stats
    return (
        f"prompt {s.prompt_tokens} tokens ({s.prefill_tokens} prefilled) · {s.generated_tokens} tokens "
        f"({result.stop_reason}) · {s.tokens_per_second:.1f} tok/s · acceptance {s.acceptance_rate:.0%}"
    )


def stopped(generated: int, why: str) -> str:
    return f"stopped after {generated} tokens: {why}"


def access(request: Request, status: int, detail: str) -> None:
    """The one log line of a request."""
    client = request.client.host if request.client else "-"
    path, detail = printable(request.url.path), printable(detail)
    log.info("%s %s %s %d%s", client, request.method, path, status, f" · {detail}" if detail else "")


def printable(text: str) -> str:
    """Text for the log with its control characters escaped: a client can put any in a URL's path
    (%1B), and the server's terminal would run them as escape sequences."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


# --- running the server -------------------------------------------------------------------------


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: a free one), or one clear error."""
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"  # not ":::8080" for an IPv6 host
    try:
        family, _, proto = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][:3]
        # proto IPPROTO_TCP, not 0: asyncio turns Nagle's algorithm off only on a socket that says
        # it is TCP (its connections inherit this one's), and with it on, each write after a
        # response's first waited for the client's delayed ACK (40 ms a request on a kept-alive
        # connection).
        sock = socket.socket(family, socket.SOCK_STREAM, proto)
    except OSError as e:
        raise SpecllmError(f"cannot listen on {where}: {e.strerror or e}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise SpecllmError(f"cannot listen on {where}: {e.strerror or e}") from None
    return sock


def address(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def describe_server(sock: socket.socket, engine: Engine, settings: ServeSettings, embedder: Model | None = None) -> str:
    """The startup line: where, what, how."""
    s, url = settings, address(sock)
    gamma = s.gamma or (engine.fixed_draft_length if s.drafter != Drafter.AUTO else "auto")
    variables = "".join(f"{name} {json.dumps(value)} · " for name, value in (s.template_variables or {}).items())
    embeddings = f"{describe_embeddings(embedder)} · " if embedder is not None else ""
    cors = f"pages of {', '.join(s.cors_origins)} may call it · " if s.cors_origins else ""
    saves = s.cache_ram and not engine.target.recurrent  # a recurrent state is not saved
    saved = f"other conversations kept in {s.cache_ram / 2**20:.0f} MiB · " if saves else ""
    return (
        f"specllm serve: {url}/v1 (chat page: {url}{PAGE_PATH}) · {describe_models(engine)} · "
        f"drafter {s.drafter} · gamma {gamma} · {variables}context {engine.target.n_ctx} tokens · {embeddings}"
        f"{saved}{'API key required' if s.api_key else 'no API key'} · {cors}one generation at a time · Ctrl-C stops"
    )


def exposure_warning(sock: socket.socket, settings: ServeSettings) -> str | None:
    """A line for a server other machines, or any web page its user opens (--cors *), can use
    with no API key. None for a loopback address or a server that needs its key."""
    host = sock.getsockname()[0]
    if settings.api_key:
        return None
    if not ipaddress.ip_address(host.split("%")[0]).is_loopback:
        return (
            f"warning: {address(sock)} takes requests from other machines and asks no API key: anyone who can "
            "reach it can use it (--api-key or SPECLLM_API_KEY sets one)"
        )
    if "*" in settings.cors_origins:
        return (
            "warning: --cors * lets any web page open in this machine's browser use the server, and it asks "
            "no API key (--api-key or SPECLLM_API_KEY sets one, or name the pages' origins instead of *)"
        )
    return None


def server(app: FastAPI):
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:  # Ctrl-C, SIGTERM
            app.state.worker.stop()  # streams end now, so uvicorn need not cut them
            super().handle_exit(sig, frame)

        async def serve(self, sockets=None) -> None:
            asyncio.get_running_loop().set_exception_handler(_AcceptFailures().handle)
            await super().serve(sockets)

    # uvicorn's own access log says nothing of tokens: `access` writes one line per request instead.
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=5,
        lifespan="off",
        http=_protocol(app.state.worker.settings.header_seconds, app.state.worker.settings.read_seconds),
    )
    return Server(config)


ACCEPT_NOTE_SECONDS = 60.0


class _AcceptFailures:
    """serve's event loop's exception handler. A connection that cannot be accepted (out of file
    descriptors, more clients than `ulimit -n` allows) waits in the listen queue until others
    close, and asyncio tries again each second, up to the queue's length at a time: its default
    handler wrote a traceback for every try, thousands a second (megabytes of log, and a server
    stalled on a log pipe nobody read fast enough). Here it is one line a minute at most; anything
    else goes to the default handler."""

    def __init__(self):
        self._told_at: float | None = None

    def handle(self, loop: asyncio.AbstractEventLoop, context: dict) -> None:
        error = context.get("exception")
        if not (isinstance(error, OSError) and context.get("message", "").startswith("socket.accept()")):
            loop.default_exception_handler(context)
            return
        now = time.monotonic()
        if self._told_at is None or now - self._told_at >= ACCEPT_NOTE_SECONDS:
            self._told_at = now
            why = f"{error.strerror or error}{open_files_hint(error)}"
            log.warning(f"cannot accept a connection: {why}; new ones wait until others close")


def _protocol(header_seconds: float, read_seconds: float):
    """uvicorn's HTTP/1.1 protocol, but a connection waiting for a request's headers (after it
    opens, or after a response) is closed when they have not all come within `header_seconds`:
    uvicorn would hold a half-sent request open for ever. And a response whose client has read
    nothing of it for `read_seconds` (its writes wait for room all that time) is cut, as it is at
    once when the server shuts down: a stream runs only a few steps ahead of what its client has
    read (Job), so a client that stops reading (a suspended process, a pager) would hold the
    engine, and every request waiting for it, for good."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class Protocol(H11Protocol):
        def connection_made(self, transport) -> None:
            self._unread: asyncio.TimerHandle | None = None
            super().connection_made(transport)
            self._headers_due()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if not self._waiting_for_headers():
                self._deadline.cancel()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._headers_due()

        def pause_writing(self) -> None:
            super().pause_writing()
            self._unread = self.loop.call_later(read_seconds, self._cut_if_unread)

        def resume_writing(self) -> None:
            super().resume_writing()
            if self._unread is not None:
                self._unread.cancel()

        def connection_lost(self, exc: Exception | None) -> None:
            super().connection_lost(exc)
            # A timer left waiting holds the connection (its protocol, transport, request and
            # response) for header_seconds after it closed: a busy server kept thousands of them.
            self._deadline.cancel()
            if self._unread is not None:
                self._unread.cancel()

        def _cut_if_unread(self) -> None:
            if self.flow.write_paused and not self.transport.is_closing():
                self.transport.abort()

        def shutdown(self) -> None:
            # Shutting down: a response its client is not reading (its writes wait for room)
            # cannot end, and uvicorn would cancel it after its graceful timeout, with a
            # traceback. Cut it now; the others end with the error event (EngineWorker.stop).
            if self.cycle is not None and not self.cycle.response_complete and self.flow.write_paused:
                self.transport.abort()
            else:
                super().shutdown()

        def _headers_due(self) -> None:
            self._deadline = self.loop.call_later(header_seconds, self._headers_too_slow)

        def _waiting_for_headers(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _headers_too_slow(self) -> None:
            if self._waiting_for_headers() and not self.transport.is_closing():
                self.transport.close()

    return Protocol


def serve(engine: Engine, settings: ServeSettings, sock: socket.socket, embedder: Model | None = None) -> None:
    """Serve until Ctrl-C (or SIGTERM); uvicorn stops accepting, gives streams under way 5 s, then
    cancels them, which stops their generations. Those end at once (EngineWorker.stop), and a
    stream whose client has stopped reading is cut (_protocol); a batch of embeddings ends at its
    next input."""
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
    app = create_app(engine, settings, embedder)
    worker = app.state.worker
    try:
        server(app).run(sockets=[sock])
    finally:
        # Then the caller may close the engine: nothing of these threads is still using its models.
        worker.thread.shutdown(wait=True)
        worker.vocab.thread.shutdown(wait=True)
        worker.embedding.thread.shutdown(wait=True)
        worker.preparing.thread.shutdown(wait=True)
        # But a grammar's mask may read the vocabulary for minutes more, and cannot be stopped:
        # not waited for, the models it reads are left to the process's end to free.
        if worker.grammar_cost.running():
            engine.leave_models()
        sock.close()
