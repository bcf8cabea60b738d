"""specllm/engine/reasoning.py on fixed replies: where the think block is, and streaming split at every chunk
boundary giving what the whole reply gives."""

import random

import pytest

from specllm.engine.reasoning import (
    THINK_MARKERS,
    ReasoningSplitter,
    Split,
    after_think_block,
    closing_marker,
    opens_thinking,
    reasoning_tokens,
    split_reasoning,
    without_empty_block,
    without_opening,
)

ANALYSIS = "<|channel|>analysis<|message|>"
HELLO = "Hello, world!\nWhat's up?"
K3_ANSWER = "<|open|>response<|sep|>Hello!\nUp?<|close|>response<|sep|><|close|>message<|sep|>"
NEXT = "<|end|><|start|>assistant<|channel|>"
FINAL = NEXT + "final<|message|>"
ARGS = '{"city": "Paris"}'
CALL = "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>" + ARGS + "<|call|>"

# (the reply, whether the prompt opened the think block (or the marker that closes it), the reasoning
# and the answer expected)
CASES = [
    ("Let me see.\n</think>\n\nParis.", True, "Let me see.", "Paris."),
    ("\n</think>\n\nParis.", True, "", "Paris."),  # an empty block (a template's, or the model's)
    ("</think>Paris.", True, "", "Paris."),
    ("I wonder.\nMaybe Paris", True, "I wonder.\nMaybe Paris", ""),  # left open: max_tokens
    ("I wonder.\n</thi", True, "I wonder.\n</thi", ""),  # a closing tag cut short is reasoning
    ("", True, "", ""),
    ("<think>\nHmm.\n</think>\n\nParis.", False, "Hmm.", "Paris."),  # the model opens it itself
    ("\n\n<think>Hmm.</think>Paris.", False, "Hmm.", "Paris."),
    ("<think>\nHmm, 2 < 3", False, "Hmm, 2 < 3", ""),
    ("Paris.", False, "", "Paris."),  # no block: the answer exactly as generated
    ("  Paris.\n", False, "", "  Paris.\n"),
    ("\n", False, "", "\n"),
    ("<thin", False, "", "<thin"),
    # a turn without reasoning that begins with a bare closing marker, where the prompt opened no
    # block: an empty one (MiniMax M3's, llama.cpp's tests' reply)
    ("</mm:think>Hello, world!\nWhat's up?", False, "", "Hello, world!\nWhat's up?"),
    ("\n</think>\n\nParis.", False, "", "Paris."),
    ("</mm:thin", False, "", "</mm:thin"),  # cut short: answer as written
    ("Paris.</think>", False, "", "Paris.</think>"),  # not at the start: answer
    ("Paris. <think>x</think>", False, "", "Paris. <think>x</think>"),  # a block later on is answer
    ("a</think>b</think>c", True, "a", "b</think>c"),  # one block: the first closing tag ends it
    # other models' markers: Magistral's, Gemma 4's, Command A's, Seed-OSS's; a block ends at its own
    # closing marker, or at any pair's where the prompt opened one it does not name
    ("[THINK]Hmm.[/THINK]Paris.", False, "Hmm.", "Paris."),
    ("Hmm.\n[/THINK]\n\nParis.", True, "Hmm.", "Paris."),
    ("<|channel>thought\nHmm.<channel|>Paris.", False, "Hmm.", "Paris."),
    ("<|START_THINKING|>Hmm.<|END_THINKING|>\n\nParis.", False, "Hmm.", "Paris."),
    ("<seed:think>Hmm.</seed:think>Paris.", False, "Hmm.", "Paris."),
    ("[THINK]a</think>b[/THINK]c", False, "a</think>b", "c"),
    # MiniMax M3's and Hunyuan 3's; Apriel 1.6's prompt opens its reasoning with a sentence, which
    # the model ends with a line (llama.cpp's tests' replies)
    ("<mm:think>Hmm.</mm:think>Paris.", False, "Hmm.", "Paris."),
    # Kimi K3's sections: its prompt opens the think section, or the response section without thinking
    (f"I'm thinking<|close|>think<|sep|>{K3_ANSWER}", "<|close|>think<|sep|>", "I'm thinking", "Hello!\nUp?"),
    (K3_ANSWER, False, "", "Hello!\nUp?"),
    ("Hello!\nUp?<|close|>response<|sep|><|close|>message<|sep|>", False, "", "Hello!\nUp?"),
    ("Use the response tag, then message.<|close|>response<|sep|>", False, "", "Use the response tag, then message."),
    ("Still thinking", "<|close|>think<|sep|>", "Still thinking", ""),
    ("Cut short<|close|>resp", False, "", "Cut short<|close|>resp"),
    # ... whose think section ends at the response section's opener where the model writes no closer,
    # as llama.cpp reads it: it was reasoning to the end
    (f"I'm thinking{K3_ANSWER}", "<|close|>think<|sep|>", "I'm thinking", "Hello!\nUp?"),
    (f"<|open|>think<|sep|>I'm thinking\n{K3_ANSWER}", False, "I'm thinking", "Hello!\nUp?"),
    (
        "Hmm <|open|>response<|sep|> x</think>Paris.",
        "</think>",
        "Hmm <|open|>response<|sep|> x",
        "Paris.",
    ),  # not Kimi's
    # Cohere2 MoE's reasoning ends at its text or its calls where it writes no <|END_THINKING|>
    ("I'm\nthinking<|START_TEXT|>Hello!<|END_TEXT|>", "<|END_THINKING|>", "I'm\nthinking", "Hello!"),
    ("Hmm.<|START_ACTION|>[", "<|END_THINKING|>", "Hmm.", "<|START_ACTION|>["),
    ("Hmm.<|START_TE", "<|END_THINKING|>", "Hmm.<|START_TE", ""),  # cut short: reasoning
    # its answer, and Command R7B's and A's, inside markup that llama.cpp leaves out of the content
    (f"I'm\nthinking<|END_THINKING|><|START_TEXT|>{HELLO}<|END_TEXT|>", "<|END_THINKING|>", "I'm\nthinking", HELLO),
    (f"<|START_THINKING|>Hmm.<|END_THINKING|><|START_RESPONSE|>{HELLO}<|END_RESPONSE|>", False, "Hmm.", HELLO),
    (f"<|START_RESPONSE|>{HELLO}<|END_RESPONSE|>", False, "", HELLO),
    ("Cut <|END_RESP", False, "", "Cut <|END_RESP"),
    ("Hmm.</think:opensource>Paris.", "</think:opensource>", "Hmm.", "Paris."),
    ("<think:opensource>Hmm.</think:opensource>Paris.", False, "Hmm.", "Paris."),
    (
        "I'm\nthinking\n[BEGIN FINAL RESPONSE]\nHello, world!\nWhat's up?",
        "[BEGIN FINAL RESPONSE]",
        "I'm\nthinking",
        "Hello, world!\nWhat's up?",
    ),
    (
        "<think>Magistral's ends at [/THINK], Gemma 4's at <channel|>.</think>Paris.",
        False,
        "Magistral's ends at [/THINK], Gemma 4's at <channel|>.",
        "Paris.",
    ),
    ("Ends at [/THINK] or <channel|>?\n</think>\n\nParis.", "</think>", "Ends at [/THINK] or <channel|>?", "Paris."),
    ("Hmm. [/THIN", "[/THINK]", "Hmm. [/THIN", ""),
    ("<|channel>", False, "", "<|channel>"),  # a channel, but no thought: answer
    ("<|channel>final", False, "", "<|channel>final"),
    ("  spaced  \n  out \n</think>  \n answer  ", True, "spaced  \n  out", "answer  "),
    ("Grüße 🙂</think>Ünïcode", True, "Grüße 🙂", "Ünïcode"),
    # gpt-oss (harmony): the analysis channel is reasoning, every other message answer
    (f"{ANALYSIS}We need the weather.{FINAL}It is sunny.", False, "We need the weather.", "It is sunny."),
    (f"{ANALYSIS}Still thinking", False, "Still thinking", ""),  # max_tokens
    (f"{ANALYSIS} a \n{NEXT}analysis<|message|> b {FINAL}Done.", False, "a\n\nb", "Done."),
    (f"{ANALYSIS}Plan.{NEXT}commentary<|message|>Checking.{FINAL}Sunny.", False, "Plan.", "Checking.\n\nSunny."),
    (f"{ANALYSIS}{NEXT}commentary<|message|>{FINAL}Sunny.", False, "", "Sunny."),  # empty messages: no gaps
    (
        f"{ANALYSIS}Need the tool.{NEXT}commentary to=functions.get_weather <|constrain|>json<|message|>{ARGS}",
        False,
        "Need the tool.",
        CALL,
    ),
    (f" to=functions.get_weather<|channel|>commentary json<|message|>{ARGS}", False, "", CALL),  # in the role header
    (
        f"{ANALYSIS}R{NEXT}commentary to=functions.get_weather json<|message|>{ARGS}<|end|>{NEXT}final<|message|>OK",
        False,
        "R",
        CALL + "OK",
    ),
    ("<|channel|>commentary to=assistant<|channel|>analysis<|message|>R<|end|>", False, "R", ""),  # stray header
    ("<|start|>assistant<|channel|>final<|message|>Hi", False, "", "Hi"),
    (f"{ANALYSIS}R{NEXT}fin", False, "R", ""),  # a later header cut short: left out
    (f"{ANALYSIS}R<|end|>Then prose.", False, "R", "Then prose."),  # text that begins no header: shown
    ("<|channel|>final<|message|>Hi.<|end|>And more", False, "", "Hi.\n\nAnd more"),
    (f"{ANALYSIS}R<|end|><|<|message|>x", False, "R", "<|<|message|>x"),  # only a part of "<|start|>"
    # the first header cut short (max_tokens, a stop string): no message, as llama-server's parser reads it
    ("<|channel|>analysis", False, "", ""),
    ("<|channel|>analy", False, "", ""),
    ("<|start|>assistant<|channel|>final <|constrain|>js", False, "", ""),
    (" to=functions.get_wea", False, "", ""),
    (" to=functions.get_weather<|channel|>comm", False, "", ""),
    ("to=5 is the answer", False, "", "to=5 is the answer"),  # text, no markup after the "recipient": as written
    # Muse Glimmer's: no channels, a recipient ("self" reasoning, "user" answer), two more ends
    (" to=user<|message|>Hello, world!\nWhat's up?<|eot|>", False, "", "Hello, world!\nWhat's up?"),
    (" to=self<|message|>Need JSON<|eom|><|start|>assistant to=user<|message|>{}<|eot|>", False, "Need JSON", "{}"),
    (" to=self<|message|>Still thinking<|eo", False, "Still thinking<|eo", ""),  # max_tokens
    ("<|channel|>analysis then\nprose<|message|>x", False, "", "<|channel|>analysis then\nprose<|message|>x"),
    ("<|channel|>" + "x" * 300 + "<|message|>y", False, "", "<|channel|>" + "x" * 300 + "<|message|>y"),
    (f"{ANALYSIS}x <|en", False, "x <|en", ""),
    (f"{ANALYSIS}Grüße 🙂{FINAL}Ünïcode", False, "Grüße 🙂", "Ünïcode"),
    ("to be or not", False, "", "to be or not"),  # not a recipient: plain text
    ("to", False, "", "to"),
]


def streamed(pieces: list[str], opened: bool | str, call_openings: tuple[str, ...] = (), recipient=False) -> Split:
    splitter = ReasoningSplitter(opened, call_openings, recipient)
    reasoning, answer = "", ""
    for piece in [*pieces, None]:
        split = splitter.feed(piece) if piece is not None else splitter.finish()
        reasoning, answer = reasoning + split.reasoning, answer + split.answer
    return Split(reasoning, answer)


@pytest.mark.parametrize("reply,opened,reasoning,answer", CASES, ids=range(len(CASES)))
def test_a_reply_split_whole(reply, opened, reasoning, answer):
    assert split_reasoning(reply, opened) == Split(reasoning, answer)


@pytest.mark.parametrize("reply,opened,reasoning,answer", CASES, ids=range(len(CASES)))
def test_any_split_into_chunks_gives_the_same(reply, opened, reasoning, answer):
    whole = Split(reasoning, answer)
    for cut in range(len(reply) + 1):
        assert streamed([reply[:cut], reply[cut:]], opened) == whole, cut
    assert streamed(list(reply), opened) == whole
    rng = random.Random(0)
    for _ in range(20):
        cuts = sorted(rng.sample(range(len(reply) + 1), min(4, len(reply) + 1)))
        assert streamed([reply[a:b] for a, b in zip([0, *cuts], [*cuts, len(reply)])], opened) == whole


@pytest.mark.parametrize("opening,closing", THINK_MARKERS, ids=range(len(THINK_MARKERS)))
def test_a_reply_that_begins_with_any_pairs_bare_closing_marker_has_an_empty_block(opening, closing):
    """Whichever pair's: the marker is no part of the answer, however the reply comes."""
    reply = f"{closing}\n\nParis."
    for cut in range(len(reply) + 1):
        assert streamed([reply[:cut], reply[cut:]], False) == Split("", "Paris."), cut


# (the reply, `opened`, the call openings that end the think block, the reasoning and the answer
# expected): Ling 3.0 and Qwen3.5 may call before they close the block, and llama.cpp reads that call
CALLS_IN_THE_BLOCK = [
    ("I need it.\n<tool_call>get_time", "</think>", ("<tool_call>",), "I need it.", "<tool_call>get_time"),
    ("<think>A\n\n<tool_call>B", False, ("<tool_call>",), "A", "<tool_call>B"),  # a block the model opened
    ("A</think>B<tool_call>C", True, ("<tool_call>",), "A", "B<tool_call>C"),  # after the block: answer
    ("Wait <tool_ca", "</think>", ("<tool_call>",), "Wait <tool_ca", ""),  # cut short: reasoning
    ("Hmm <tool_call> x</think>Sunny", "</think>", (), "Hmm <tool_call> x", "Sunny"),  # other models: reasoning
]


@pytest.mark.parametrize(
    "reply,opened,openings,reasoning,answer", CALLS_IN_THE_BLOCK, ids=range(len(CALLS_IN_THE_BLOCK))
)
def test_a_call_ends_the_think_block_where_it_is_one_of_the_call_openings(reply, opened, openings, reasoning, answer):
    whole = Split(reasoning, answer)
    assert split_reasoning(reply, opened, openings) == whole
    for cut in range(len(reply) + 1):
        assert streamed([reply[:cut], reply[cut:]], opened, openings) == whole, cut
    assert streamed(list(reply), opened, openings) == whole


def test_functionarys_reply_is_handed_out_as_soon_as_it_is_decided():
    """Held back: a recipient line until its end, and what may be the start of ">>>"."""
    splitter = ReasoningSplitter(False, recipient=True, tools=True)
    assert splitter.feed("al") == Split("", "")
    assert splitter.feed("l\nOne >") == Split("", "One ")
    assert splitter.feed("> two>>") == Split("", ">> two")
    assert splitter.feed(">get_weather") == Split("", "")
    call = "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
    assert splitter.feed('\n{"a": ">') == Split("", call + '{"a": ">')  # in a string: no recipient mark
    assert splitter.feed('"}>') == Split("", '"}')
    assert splitter.finish() == Split("", "><|call|>")


# (functionary v3.2's reply where no tools were offered, what chat, run and serve show of it)
FUNCTIONARY_WITHOUT_TOOLS = [
    ("all\nHello, world!", "Hello, world!"),  # the text's recipient line is left out
    ('all\nLet me check.\n>>>get_weather\n{"city": "Paris"}', 'Let me check.\n>>>get_weather\n{"city": "Paris"}'),
    ('get_weather\n{"city": "Paris"}', '>>>get_weather\n{"city": "Paris"}'),  # a call: as functionary writes one
    ('get_weather\n{"city": "Paris"}\n>>>all\nDone.', '>>>get_weather\n{"city": "Paris"}\n>>>all\nDone.'),
    ("Hello, world!", "Hello, world!"),  # no recipient: as written
    ("all", "all"),  # cut short before its recipient line ended
]


@pytest.mark.parametrize("reply,answer", FUNCTIONARY_WITHOUT_TOOLS, ids=range(len(FUNCTIONARY_WITHOUT_TOOLS)))
def test_functionarys_reply_without_tools_is_text_after_its_first_recipient(reply, answer):
    """As llama.cpp reads it without tools: what follows "all\\n" is text, calls and all; a call
    that begins the reply is shown with the ">>>" its prompt wrote. "all\\n" was shown."""
    whole = Split("", answer)
    assert split_reasoning(reply, recipient=True) == whole
    for cut in range(len(reply) + 1):
        assert streamed([reply[:cut], reply[cut:]], False, (), recipient=True) == whole, cut


def test_text_is_handed_out_as_soon_as_it_is_decided():
    """Held back: only what may be the start of a marker, and the reasoning's trailing spaces."""
    splitter = ReasoningSplitter(True)
    assert splitter.feed("one two</th") == Split("one two", "")
    assert splitter.feed("ink>\n\nthree ") == Split("", "three ")
    assert splitter.feed("four") == Split("", "four")
    fresh = ReasoningSplitter(False)
    assert fresh.feed("  <thi") == Split("", "") and fresh.feed("s") == Split("", "  <this")


def test_a_prompt_opens_thinking_when_it_ends_inside_a_think_block():
    assert opens_thinking("<|im_start|>assistant\n<think>\n")
    assert opens_thinking("<｜Assistant｜><think>\n")
    assert not opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n")  # enable_thinking false
    assert not opens_thinking("<|im_start|>assistant\n")
    assert not opens_thinking("<|im_start|>user\nwhat is <think>?<|im_end|>\n<|im_start|>assistant\n")


# (a call's start as a template writes it, the marker that closes the think block the prompt
# opened (None: it opened none), the start placed after the prompt's block)
CALL_STARTS = [
    ("\n</think>\n\n<tool_call>", "</think>", "\n</think>\n\n<tool_call>"),  # Qwen3.5's closes the block
    ("<think></think>\n<tool_call>", "</think>", "</think>\n<tool_call>"),  # Nemotron 3's: no second opening
    ("</think><tool_call>", "</think>", "</think><tool_call>"),  # GLM 4.7's
    ("\n<minimax:tool_call>", "</think>", "</think>\n\n<minimax:tool_call>"),  # MiniMax M2's: none of its own
    ('{"name": "', "</think>", '</think>\n\n{"name": "'),
    ("[TOOL_CALLS]", "[/THINK]", "[/THINK]\n\n[TOOL_CALLS]"),  # the block's own closing marker
    ("\n</think>\n\n<tool_call>", None, "<tool_call>"),  # the prompt closed the block itself
    ("<think></think>\n<tool_call>", None, "<tool_call>"),
    ("[THINK][/THINK][TOOL_CALLS]", None, "[TOOL_CALLS]"),
    ('{"name": "', None, '{"name": "'),
]


@pytest.mark.parametrize("start,closing,placed", CALL_STARTS, ids=range(len(CALL_STARTS)))
def test_a_call_begun_after_the_prompt_is_after_its_think_block(start, closing, placed):
    """A forced call's start: a prompt that opened a think block has it closed first, so that the
    call is the answer's, not reasoning; one that closed it gets no second end tag."""
    assert after_think_block(start, closing) == placed
    answer = placed.partition(closing)[2].lstrip() if closing else placed
    assert split_reasoning(placed + "Paris", closing is not None) == Split("", answer + "Paris")


def test_the_marker_that_closes_the_block_a_prompt_opened():
    assert closing_marker("<|im_start|>assistant\n<think>\n") == "</think>"
    assert closing_marker("[INST]Hi[/INST][THINK]") == "[/THINK]"
    assert closing_marker("<|turn>model\n<|channel>thought\n") == "<channel|>"
    assert closing_marker("<｜hy_Assistant:opensource｜><think:opensource>") == "</think:opensource>"
    assert closing_marker("\n<|begin_assistant|>\nHere are my reasoning steps:\n") == "[BEGIN FINAL RESPONSE]"
    assert closing_marker("<|im_start|>assistant\n") is None
    assert without_opening("<|turn>model\n<|channel>thought\n") == "<|turn>model\n"


def test_an_empty_think_block_at_the_prompts_end_is_taken_off():
    """Where a template turns thinking off with an empty block its own turns do not write."""
    assert without_empty_block("<|turn>model\n<|channel>thought\n<channel|>") == "<|turn>model\n"
    assert without_empty_block("x<think>\n\n</think>\n\n") == "x"
    assert without_empty_block("x<think>a</think>") == "x<think>a</think>"  # not empty
    assert without_empty_block("<|im_start|>assistant\n") == "<|im_start|>assistant\n"


def test_a_prompt_without_its_think_blocks_opening():
    assert without_opening("<|im_start|>assistant\n<think>\n") == "<|im_start|>assistant\n"
    assert without_opening("<|assistant|><think>") == "<|assistant|>"


def test_every_think_marker_is_shown_where_a_tokenizer_holds_it_as_a_control_token():
    """Text leaves control tokens out but those of SHOWN_CONTROL_TOKENS: every marker read here
    must be made of them and of plain text (Gemma 4's <|channel>thought, Kimi K3's
    <|open|>think<|sep|>); Apriel's are text."""
    from specllm.engine.reasoning import ANSWER_MARKUP, SUCCESSORS, TEXT_MARKERS, THINK_MARKERS
    from specllm.llama.model import SHOWN_CONTROL_TOKENS

    markers = {*(m for pair in set(THINK_MARKERS) - set(TEXT_MARKERS) for m in pair), *ANSWER_MARKUP}
    markers |= {successor for successors in SUCCESSORS.values() for successor in successors}
    assert all(markup.startswith("<|") for markup in ANSWER_MARKUP)  # the answer looks for "<|" before any
    for marker in markers:
        rest = marker
        for token in sorted(SHOWN_CONTROL_TOKENS, key=len, reverse=True):
            rest = rest.replace(token, "")
        assert rest != marker and not any(c in rest for c in "<>[]|"), marker


# Tokens' texts, and how many of them are reasoning: those the reply is inside its reasoning
# before or after (reasoning_tokens)
TOKEN_COUNTS = [
    (["<think>", "Hm", ".", "</think>", "\n\n", "Hi"], False, 4),  # the markers' tokens count
    (["Hm", ".</", "think>", "\n\nHi", "!"], True, 3),  # the marker split over two tokens
    (["Hm", ".</think>\n\nHi", "!"], True, 2),  # a token that ends the block and begins the answer
    (["\n", "<think>", "a", "</think>", "Hi"], False, 3),  # whitespace before the block: no reasoning
    (["Hm", ".", " more"], True, 3),  # a block left open: all of it
    (["Hi", " <think>", "x"], False, 0),  # no block: a marker later is text
    (["<|channel|>analysis<|message|>", "Hm", "<|end|>", "<|start|>assistant<|channel|>final<|message|>", "Hi"],
     False, 3),  # gpt-oss: the analysis message's tokens, the header that opens it and its end
]  # fmt: skip


@pytest.mark.parametrize("pieces,opened,expected", TOKEN_COUNTS, ids=range(len(TOKEN_COUNTS)))
def test_reasoning_tokens_are_those_inside_the_block(pieces, opened, expected):
    assert reasoning_tokens(pieces, opened) == expected


def test_text_before_the_tokens_is_read_but_not_counted():
    """A call the prompt begins after closing the block it opened: no generated token is reasoning."""
    pieces = ["get", "_weather", '", "arguments": {}}']
    assert reasoning_tokens(pieces, "</think>", before='</think>\n\n<tool_call>\n{"name": "') == 0
    assert reasoning_tokens(pieces, "</think>") == 3
