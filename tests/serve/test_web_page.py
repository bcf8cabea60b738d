"""The chat page `specllm serve` serves at /, in a real headless Chromium (Debian's package, driven
by Playwright) against a real `specllm serve` on the tiny models; and the streamed per-step
`specllm` field the page reads. Without Chromium or Playwright these tests fail with one line
saying how to get them, unless SPECLLM_SKIP_BROWSER is set (then the browser tests skip)."""

import contextlib
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlsplit

import openai
import pytest
import tiny_models as tm
import tool_templates

SPECLLM = [sys.executable, "-m", "specllm"]
KEY = "page-key"
MAX_TOKENS = 40
REPLY_SECONDS = 60  # a tiny model's reply takes well under a second; a busy machine is slower


def chromium() -> str | None:
    """Debian's Chromium (or the browser SPECLLM_CHROMIUM names): Playwright drives it as it is."""
    for name in (os.environ.get("SPECLLM_CHROMIUM"), "chromium", "chromium-browser"):
        if name and (path := shutil.which(name)):
            return path
    return None


@contextlib.contextmanager
def serving(tiny_models, log: Path, key: str | None, ctx_size: int = 2048):
    """`specllm serve` drafting with the draft model, so that every reply has accepted, rejected and
    target tokens; its log goes to a file (a pipe nobody reads fills). Yields the page's address
    and the process."""
    args = [
        "serve",
        "--target",
        tiny_models.target,
        "--draft",
        tiny_models.draft,
        "--drafter",
        "model",
        "--threads",
        1,
        "--ctx-size",
        ctx_size,
        "--port",
        0,
    ]
    env = {**os.environ, "SPECLLM_API_KEY": key} if key else os.environ
    with open(log, "w") as out:
        proc = subprocess.Popen(SPECLLM + list(map(str, args)), stderr=out, env=env)
    try:
        deadline = time.monotonic() + 60
        while not (found := re.search(r"chat page: (http://127\.0\.0\.1:\d+/)", log.read_text())):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        yield found[1], proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(30)


@pytest.fixture(scope="module")
def server(tiny_models, tmp_path_factory):
    """The server the page's tests share, with an API key."""
    with serving(tiny_models, tmp_path_factory.mktemp("serve") / "serve.log", KEY) as (url, _):
        yield url


try:  # Playwright's waits are locators: the page's Content-Security-Policy forbids what
    # wait_for_function does (evaluating a string in the page)
    from playwright.sync_api import expect, sync_playwright
except ImportError:
    expect = sync_playwright = None


@pytest.fixture(scope="module")
def browser():
    path = chromium()
    missing = None if path else "Chromium is not installed"
    if sync_playwright is None:
        missing = "Playwright is not installed"
    if missing:
        if os.environ.get("SPECLLM_SKIP_BROWSER"):
            pytest.skip(f"{missing} (SPECLLM_SKIP_BROWSER is set)")
        pytest.fail(f"{missing}: run bash scripts/setup.sh, or set SPECLLM_SKIP_BROWSER=1 to skip", pytrace=False)
    with sync_playwright() as playwright:
        chrome = playwright.chromium.launch(executable_path=path)
        yield chrome
        chrome.close()


@contextlib.contextmanager
def opened(browser, url: str):
    """A fresh tab on the page at `url`; a script error in it fails the test."""
    context = browser.new_context()
    tab = context.new_page()
    errors = []
    tab.on("pageerror", lambda error: errors.append(str(error)))
    tab.goto(url)
    yield tab
    context.close()
    assert errors == []


@pytest.fixture
def page(browser, server):
    with opened(browser, server) as tab:
        yield tab


# A reply that a test stops: minutes at a tiny model's speed, so that it is still coming when the
# test reaches Stop however fast or busy the machine (2,000 tokens could end first)
LONG_REPLY = 60000


@pytest.fixture(scope="module")
def long_server(tiny_models, tmp_path_factory):
    """A server with the key, and a context with room for LONG_REPLY."""
    with serving(tiny_models, tmp_path_factory.mktemp("long") / "serve.log", KEY, ctx_size=65536) as (url, _):
        yield url


@pytest.fixture
def long_page(browser, long_server):
    with opened(browser, long_server) as tab:
        yield tab


def settings(page, **fields):
    if not page.locator("#settings").evaluate("details => details.open"):
        page.click("#settings summary")
    for name, value in fields.items():
        page.fill(f"#{name.replace('_', '-')}", str(value))


def send(page, message: str) -> tuple[list[dict], dict]:
    """Type and send a message; wait for the reply's last line. Returns the stream's chunks as the
    browser received them, and the request the page sent."""
    replies = page.locator(".msg.assistant").count()
    with page.expect_response("**/v1/chat/completions") as response:
        page.fill("#input", message)
        page.press("#input", "Enter")
    last_line = page.locator(".msg.assistant .stats").nth(replies)
    expect(last_line).to_have_text(re.compile(r"^\[\w+\] "), timeout=REPLY_SECONDS * 1000)
    expect(page.locator("#error")).to_have_text("")  # the reply ended whole
    return events(response.value.text()), response.value.request.post_data_json


def events(stream: str) -> list[dict]:
    data = [line[len("data: ") :] for line in stream.split("\n") if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def streamed_text(chunks: list[dict]) -> str:
    return "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])


def percent(fraction: float) -> str:
    return f"{int(100 * fraction + 0.5)}%"  # as JavaScript's Math.round, which the page uses


def test_the_page_streams_a_reply_coloured_by_step_with_its_stats(page):
    settings(page, api_key=KEY, temperature=0, max_tokens=MAX_TOKENS)
    chunks, _ = send(page, "def f(x):")
    steps = [c["specllm"] for c in chunks if "source" in c.get("specllm", {})]
    last = chunks[-1]["specllm"]
    # Every piece of every step, in order, as a span of its kind; a rejected newline as ⏎.
    expected = [
        (kind, step[kind].replace("\n", "⏎") if kind == "rejected" else step[kind])
        for step in steps
        for kind in ("accepted", "rejected", "target")
        if step[kind]
    ]
    spans = "spans => spans.map(span => [span.className, span.textContent])"
    shown = page.eval_on_selector_all(".msg.assistant .text > *", spans)
    assert [tuple(s) for s in shown] == expected
    assert {kind for kind, _ in shown} == {"accepted", "rejected", "target"}  # this pair at greedy has all three
    reply = "".join(text for kind, text in shown if kind != "rejected")
    assert reply == streamed_text(chunks) and len(steps) == last["stats"]["target_calls"]
    stats = last["stats"]
    line = page.inner_text(".msg.assistant .stats")
    assert line.startswith(f"[{last['stop_reason']}] {stats['tokens_per_second']:.1f} tok/s · {MAX_TOKENS} tokens")
    assert f" · acceptance {percent(stats['acceptance_rate'])} · " in line
    assert " · drafts: n-gram 0%, model 100%, none 0% of steps · " in line  # the server drafts with the model


def test_the_conversation_is_kept_in_the_page_and_shown_as_text(page):
    """The second request sends the first turn back; a message's markup stays text."""
    settings(page, api_key=KEY, temperature=0, max_tokens=8)
    first = "<b id=planted>bold?</b> & <script>no</script>"
    chunks, request = send(page, first)
    assert request["messages"] == [{"role": "user", "content": first}]
    assert request["stream"] is True and request["specllm_steps"] is True and request["temperature"] == 0
    assert page.locator("#planted").count() == 0 and page.inner_text(".msg.user .text") == first
    _, request = send(page, "and again")
    assert request["messages"] == [
        {"role": "user", "content": first},
        {"role": "assistant", "content": streamed_text(chunks)},
        {"role": "user", "content": "and again"},
    ]
    assert page.locator(".msg.assistant").count() == 2
    page.click("#new-chat")
    _, request = send(page, "fresh")
    assert request["messages"] == [{"role": "user", "content": "fresh"}]


def test_the_settings_numbers_are_sent_as_the_browser_reads_them(page):
    """A number field takes "1e1" as 10; its value is sent as the number it shows."""
    settings(page, api_key=KEY, max_tokens="1e1", temperature="5e-1")
    chunks, request = send(page, "def f(x):")
    assert request["max_tokens"] == 10 and request["temperature"] == 0.5
    settings(page, temperature=0.05)  # any temperature, not only tenths
    _, request = send(page, "def f(x):")
    assert request["temperature"] == 0.05
    assert chunks[-1]["specllm"]["stats"]["generated_tokens"] == 10


def test_a_refused_setting_is_named_rather_than_sending_nothing(page):
    """The browser refuses a max tokens of 0 before anything is sent; with Settings closed, the page
    opens them and says why, and the message waits in its field."""
    settings(page, api_key=KEY, max_tokens=0)
    page.click("#settings summary")  # closed again
    page.fill("#input", "hello")
    page.press("#input", "Enter")
    expect(page.locator("#error")).to_have_text(re.compile(r"^max tokens: .*1"))
    assert page.locator("#settings").evaluate("details => details.open")
    assert page.locator(".msg").count() == 0 and page.input_value("#input") == "hello"
    settings(page, max_tokens=4)
    page.fill("#input", "")
    send(page, "hello")


def test_a_conversation_that_outgrows_the_context_says_new_chat_goes_on(page):
    """Every message sends the whole conversation: once it no longer fits, the server's refusal
    names the prompt's size, and the page adds that only a new chat can go on."""
    settings(page, api_key=KEY, temperature=0, max_tokens=4)
    send(page, "x" * 1100)  # a token a character: more than half the 2048-token context
    page.fill("#input", "y" * 1100)
    page.press("#input", "Enter")
    expect(page.locator("#error")).to_have_text(
        re.compile(r"^the prompt is \d+ tokens but the context holds 2048: .*New chat")
    )
    page.click("#new-chat")
    send(page, page.input_value("#input"))  # the message taken back goes alone


def test_a_double_click_on_send_sends_rather_than_stopping_at_once(long_page):
    """Stop appears where Send was: the double click's second click lands on it, and must not stop
    the reply that its first click sent. A single click on Stop still stops."""
    page = long_page
    settings(page, api_key=KEY, temperature=0, max_tokens=8)
    page.fill("#input", "hello")
    page.dblclick("#send")
    expect(page.locator(".msg.assistant .stats")).to_have_text(re.compile(r"^\[max_tokens\] "))
    settings(page, max_tokens=LONG_REPLY)
    page.fill("#input", "a long one")
    page.click("#send")
    expect(page.locator(".msg.assistant").nth(1).locator(".text > *").nth(3)).to_be_attached()
    page.click("#stop")
    expect(page.locator(".msg.assistant .stats").nth(1)).to_have_text(re.compile(r" · stopped$"))


def test_send_and_stop_from_the_keyboard_leave_the_focus_on_the_message_field(long_page):
    """Send is hidden while a reply comes, and Stop once it ends: the focus a hidden button had
    goes to the message field, where the next message is typed, rather than to nothing (keys
    then went nowhere)."""
    page = long_page
    settings(page, api_key=KEY, temperature=0, max_tokens=LONG_REPLY)
    page.focus("#input")
    page.keyboard.type("a long one")
    page.keyboard.press("Tab")
    expect(page.locator("#send")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.locator(".msg.assistant .text > *").first).to_be_attached(timeout=REPLY_SECONDS * 1000)
    expect(page.locator("#input")).to_be_focused()
    page.keyboard.press("Tab")
    expect(page.locator("#stop")).to_be_focused()
    page.keyboard.press("Space")
    expect(page.locator(".msg.assistant .stats")).to_have_text(re.compile(r" · stopped$"))
    expect(page.locator("#input")).to_be_focused()


def test_a_long_word_wraps_in_its_bubble_rather_than_widening_the_page(page):
    """A URL or a pasted hash is one word: the user's bubble breaks it as the reply's text does."""
    settings(page, api_key=KEY, temperature=0, max_tokens=4)
    send(page, "https://example.com/" + "x" * 300)
    log_width = "log => [log.scrollWidth, log.clientWidth]"
    scroll_width, client_width = page.locator("#log").evaluate(log_width)
    assert scroll_width == client_width


def test_the_page_is_served_without_the_key_and_asks_for_it(page, server):
    netloc = urlsplit(server).netloc
    for method in ("GET", "HEAD"):
        conn = http.client.HTTPConnection(netloc, timeout=10)
        conn.request(method, "/")
        response = conn.getresponse()
        body = response.read()
        assert response.status == 200 and response.getheader("Content-Type").startswith("text/html")
        assert "connect-src 'self'" in response.getheader("Content-Security-Policy")
        assert (b"<title>specllm chat</title>" in body) if method == "GET" else body == b""
        conn.close()
    conn = http.client.HTTPConnection(netloc, timeout=10)
    conn.request("GET", "/v1/models")
    assert conn.getresponse().status == 401  # the API still needs the key
    conn.close()
    expect(page.locator("#model")).to_have_text("(API key needed: see Settings)")
    page.fill("#input", "hello")
    page.press("#input", "Enter")
    expect(page.locator("#error")).to_have_text("this server needs its API key: enter it under Settings")
    # The turn is taken back, ready to send again, and the key field is open.
    assert page.locator(".msg").count() == 0 and page.input_value("#input") == "hello"
    assert page.locator("#settings").evaluate("details => details.open")
    settings(page, api_key="not-" + KEY)
    page.press("#input", "Enter")
    expect(page.locator("#error")).to_have_text("this server refused the API key: check it under Settings")
    settings(page, api_key=KEY, max_tokens=4)
    page.fill("#input", "")
    send(page, "hello")
    assert page.inner_text("#error") == "" and page.locator(".msg.assistant .text > *").count() > 0
    expect(page.locator("#model")).to_have_text("target.gguf")


def test_a_key_that_is_not_ascii_is_sent_as_its_utf8_bytes(browser, tiny_models, tmp_path):
    """The server takes a key that is not ASCII as its UTF-8 bytes, as clients send it: the page
    sends it so too. The browser refuses a header with a character beyond U+00FF, and the page
    said the server could not be reached."""
    key = "clé-ключ"
    with serving(tiny_models, tmp_path / "serve.log", key) as (url, _), opened(browser, url) as tab:
        settings(tab, api_key=key, max_tokens=4)
        tab.locator("#api-key").dispatch_event("change")
        expect(tab.locator("#model")).to_have_text("target.gguf")
        send(tab, "hello")


def test_a_server_that_goes_away_is_said_in_words(browser, tiny_models, tmp_path):
    """A server killed in the middle of a reply, then no server at all: the page says so, rather
    than the browser's "network error" and "Failed to fetch"."""
    with (
        serving(tiny_models, tmp_path / "serve.log", key=None, ctx_size=4096) as (url, proc),
        opened(browser, url) as tab,
    ):
        settings(tab, max_tokens=4000, temperature=0)  # seconds of reply: it is killed well before its end
        tab.fill("#input", "def f(x):")
        tab.press("#input", "Enter")
        expect(tab.locator(".msg.assistant .text > *").nth(5)).to_be_attached(timeout=REPLY_SECONDS * 1000)
        proc.kill()
        proc.wait(30)
        expect(tab.locator("#error")).to_have_text("the connection to the server broke off before the reply ended")
        tab.fill("#input", "again")
        tab.press("#input", "Enter")
        expect(tab.locator("#error")).to_have_text("could not reach the server: is specllm serve still running?")
        assert tab.input_value("#input") == "again"  # taken back, to send once the server is back


# --- the stream the page reads ---------------------------------------------------------------


def test_steps_are_streamed_only_when_asked_for(server):
    client = openai.OpenAI(base_url=server + "v1", api_key=KEY, max_retries=0, timeout=60)
    ask = dict(model="x", messages=[{"role": "user", "content": "def f(x):"}], max_tokens=MAX_TOKENS, temperature=0)
    plain = [c.to_dict() for c in client.chat.completions.create(**ask, stream=True)]
    assert [c for c in plain[:-1] if "specllm" in c] == [] and "stop_reason" in plain[-1]["specllm"]
    steps_asked = {"stream": True, "extra_body": {"specllm_steps": True}}
    detailed = [c.to_dict() for c in client.chat.completions.create(**ask, **steps_asked)]
    steps = detailed[1:-1]
    assert all("source" in c["specllm"] for c in steps) and "stop_reason" in detailed[-1]["specllm"]
    for chunk in steps:  # a chunk's text is its step's accepted and target text
        step = chunk["specllm"]
        assert chunk["choices"][0]["delta"].get("content", "") == step["accepted"] + step["target"]
        assert step["source"] == "model" and set(step["stats"]["sources"]) == {"model"}
    # Each step's stats are as they were after it, not as the engine had them when it was sent.
    assert [c["specllm"]["stats"]["target_calls"] for c in steps] == list(range(1, len(steps) + 1))
    assert steps[-1]["specllm"]["stats"]["n_accepted"] == detailed[-1]["specllm"]["stats"]["n_accepted"]
    assert streamed_text(detailed) == streamed_text(plain)
    completion = client.completions.create(model="x", prompt="def f(x):", max_tokens=8, **steps_asked)
    for chunk in list(completion)[:-1]:
        step = chunk.to_dict()["specllm"]
        assert chunk.choices[0].text == step["accepted"] + step["target"]
    with pytest.raises(openai.BadRequestError, match="specllm_steps"):
        client.chat.completions.create(**ask, stream=True, extra_body={"specllm_steps": "yes"})


def test_the_draft_mix_adds_up_to_100_as_the_terminals_does(page):
    """Shares rounded each on its own can add up to 101% (12.5, 12.5, 75); the page takes the
    terminal's rule (bench's whole_percents), so both show the same figures."""
    from specllm.bench.view import whole_percents

    cases = [[1 / 8, 1 / 8, 3 / 4], [1 / 3, 1 / 3, 1 / 3], [0.004, 0.996, 0.0], [1 / 6, 1 / 6, 2 / 3, 0.0], [1.0, 0, 0]]
    for shares in cases:
        shown = page.evaluate("shares => wholePercents(shares)", shares)
        assert shown == whole_percents(shares) and sum(shown) == 100, shares


def test_the_page_offers_only_the_drafters_the_server_has(page):
    """A llama target has no MTP layers: the server refuses `mtp`, and the page does not offer it."""
    settings(page, api_key=KEY)
    page.locator("#api-key").dispatch_event("change")  # as leaving the field does: the page asks again
    expect(page.locator("#drafter option:text-is('mtp')")).to_be_disabled()
    offered = "select => [...select.options].filter(o => !o.disabled).map(o => o.value)"
    assert page.locator("#drafter").evaluate(offered) == ["", "auto", "model", "ngram", "none"]


def test_a_refused_drafter_makes_the_page_offer_the_drafters_the_server_has_now(page):
    """The page asked /health when it opened; a server restarted since with other models offers
    other drafters. Its refusal of one the page still offered makes the page ask again, so that
    the drafters its message names can be chosen."""
    stale = json.dumps({"status": "ok", "busy": False, "waiting": 0, "drafters": ["auto", "mtp", "ngram", "none"]})
    page.route("**/health", lambda route: route.fulfill(content_type="application/json", body=stale))
    # The key last, then left: the page asks the server once. Filled first, leaving it for the next
    # field asked too, and that second /health could come after the route was gone.
    settings(page, max_tokens=4, api_key=KEY)
    page.locator("#api-key").blur()
    expect(page.locator("#drafter option:text-is('model')")).to_be_disabled()  # as the server was
    page.unroute("**/health")
    page.select_option("#drafter", "mtp")
    page.fill("#input", "hello")
    page.press("#input", "Enter")
    expect(page.locator("#error")).to_have_text(re.compile(r"^drafter 'mtp' needs a target with MTP layers"))
    expect(page.locator("#drafter option:text-is('mtp')")).to_be_disabled()
    offered = "select => [...select.options].filter(o => !o.disabled).map(o => o.value)"
    assert page.locator("#drafter").evaluate(offered) == ["", "auto", "model", "ngram", "none"]


@pytest.fixture(scope="module")
def thinking_server(tiny_models, tmp_path_factory):
    """A server whose target has Qwen3.5's template: its prompt opens a think block, which the
    tiny model's reply never closes (all of it is reasoning)."""
    where = tmp_path_factory.mktemp("thinking")
    target = tm.write_model(where / "qwen35_templated.gguf", seed=0, chat_template=tool_templates.QWEN35)
    with serving(SimpleNamespace(target=target, draft=tiny_models.draft), where / "serve.log", None) as (url, _):
        yield url


def test_a_thinking_models_reasoning_is_shown_apart_and_sent_back(browser, thinking_server):
    with opened(browser, thinking_server) as tab:
        settings(tab, temperature=0, max_tokens=12)
        chunks, _ = send(tab, "Why?")
        reasoning = "".join(c["choices"][0]["delta"].get("reasoning_content", "") for c in chunks if c["choices"])
        assert reasoning and streamed_text(chunks) == ""
        assert tab.text_content(".msg.assistant .reasoning .thoughts") == reasoning
        assert tab.text_content(".msg.assistant .text") == ""  # no raw step, no <think> tag
        _, request = send(tab, "And then?")
        assert request["messages"][1] == {"role": "assistant", "content": "", "reasoning_content": reasoning}


def test_the_answer_after_a_think_block_is_coloured_by_step(browser, thinking_server):
    """The tiny model never closes its think block: the server's stream is given a reply that
    does (its steps and deltas as serve splits them), ending with the real stream's last chunk.
    The step that closes the block is shown as neither; the answer's start comes as text, then
    its steps coloured."""
    steps = [
        ({"accepted": "Hmm, ", "rejected": "x", "target": "so"}, {"reasoning_content": "Hmm, so"}),
        ({"accepted": "\n</think>", "rejected": "", "target": "\n\n"}, {}),
        ({"accepted": "Par", "rejected": "", "target": "is"}, {"content": "Paris"}),
        ({"accepted": " is", "rejected": " was", "target": " big"}, {"content": " is big"}),
    ]

    def reply(route):
        real = events(route.fetch().text())
        first, *_, last = real
        made = (
            [first]
            + [
                dict(
                    last,
                    choices=[dict(last["choices"][0], delta=delta, finish_reason=None)],
                    specllm=dict(step, source="model", stats=last["specllm"]["stats"]),
                )
                for step, delta in steps
            ]
            + [last]
        )
        route.fulfill(
            content_type="text/event-stream",
            body="".join(f"data: {json.dumps(c)}\n\n" for c in made) + "data: [DONE]\n\n",
        )

    with opened(browser, thinking_server) as tab:
        settings(tab, temperature=0, max_tokens=4)
        tab.route("**/v1/chat/completions", reply)
        send(tab, "Where?")
        tab.unroute("**/v1/chat/completions")
        assert tab.text_content(".msg.assistant .reasoning .thoughts") == "Hmm, so"
        assert not tab.locator(".msg.assistant .reasoning").evaluate("details => details.open")  # folded away
        spans = "spans => spans.map(span => [span.className, span.textContent])"
        shown = tab.eval_on_selector_all(".msg.assistant .text > *", spans)
        assert [tuple(s) for s in shown] == [("accepted", " is"), ("rejected", " was"), ("target", " big")]
        assert tab.text_content(".msg.assistant .text") == "Paris is was big"
        _, request = send(tab, "And then?")
        assert request["messages"][1] == {
            "role": "assistant",
            "content": "Paris is big",
            "reasoning_content": "Hmm, so",
        }


def test_an_answer_that_writes_the_end_tag_goes_back_with_empty_reasoning(browser, thinking_server):
    """Qwen3.5's template looks for reasoning in a reply up to its </think> when the message has
    none: an answer that writes the tag (with --no-think, say) would lose all before it."""

    def reply(route):
        first, *_, last = events(route.fetch().text())
        answer = dict(last, choices=[dict(last["choices"][0], delta={"content": "a </think> b"}, finish_reason=None)])
        body = "".join(f"data: {json.dumps(c)}\n\n" for c in (first, answer, last)) + "data: [DONE]\n\n"
        route.fulfill(content_type="text/event-stream", body=body)

    with opened(browser, thinking_server) as tab:
        settings(tab, temperature=0, max_tokens=4)
        tab.route("**/v1/chat/completions", reply)
        send(tab, "Where?")
        tab.unroute("**/v1/chat/completions")
        _, request = send(tab, "And then?")
        assert request["messages"][1] == {"role": "assistant", "content": "a </think> b", "reasoning_content": ""}
