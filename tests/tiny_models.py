"""Tiny, real llama-architecture GGUF models for the test-suite, written with the `gguf` package.

No downloads and no mocks: `write_model` produces a file that llama.cpp loads and runs like any other
llama model, only with random weights (2 layers, 64-dim, ~570 tokens, ~0.5 MB, all F32). This module
is pure `gguf` + `numpy`; it never imports llama_cpp.

Tokenizer: SentencePiece style (`tokenizer.ggml.model = "llama"`, llama.cpp's SPM tokenizer):

    0 <unk> (UNKNOWN)   1 <s> (CONTROL, BOS)   2 </s> (CONTROL, EOS by default)
    3 <|im_start|> (CONTROL)   4 <|im_end|> (CONTROL, written as the EOT token)
    5 .. 260   <0x00> .. <0xFF> (BYTE, the fallback for anything not in the vocab, e.g. "\\n")
    261 ..     NORMAL pieces: "▁", printable ASCII, "▁"+letter, then words and code fragments

llama.cpp's SPM tokenizer only merges two adjacent symbols when their concatenation is itself a
token, so every word piece comes with all of its prefixes ("▁r", "▁re", "▁ret", ... "▁return").
Scores grow with piece length, so longer pieces win. llama.cpp treats ids 2 (EOS) and 4 (EOT, and
it also recognises the text "<|im_end|>" on its own) as end-of-generation.

Weights are drawn from `numpy.random.default_rng` keyed by (seed, tensor), so a model is a pure
function of its arguments, and the vocab-sized tensors of the "extended" vocabulary agree with the
standard one on the shared ids. `noise > 0` adds gaussian noise of that relative size (to every
tensor, from `noise_seed`): that is how a draft model that mostly agrees with its target is made.
The scales below were tuned against llama.cpp 0.3.36 (20 prompts x 32 greedy tokens, seeds 0-3):
greedy output has ~29 distinct tokens in 32 and never emitted EOS/EOT; at temperature 1 the median
top-1 probability is ~0.4 and top-5 ~0.8; the top-2 logit gap is < 1e-3 at ~0.1% of positions and
< 1e-2 at ~0.3-1%; the draft (noise=DRAFT_NOISE) agrees with the target's greedy token 81-87% of
the time. One-token vs multi-token decode calls differ by up to ~7e-3 in a logit with llama.cpp's
default F16 KV cache (median ~3e-6), and by < 2e-5 with an F32 KV cache (type_k = type_v = 0).
tests/test_tiny_models.py checks these properties.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

import gguf

__all__ = [
    "CHATML_TEMPLATE",
    "BOS_ID",
    "EOS_ID",
    "EOT_ID",
    "IM_START_ID",
    "IM_END_ID",
    "UNK_ID",
    "FIRST_BYTE_ID",
    "FIRST_NORMAL_ID",
    "N_EXTRA_TOKENS",
    "DRAFT_NOISE",
    "VOCABS",
    "byte_token_id",
    "vocab_pieces",
    "vocab_size",
    "write_model",
]

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

UNK_ID, BOS_ID, EOS_ID, IM_START_ID, IM_END_ID = 0, 1, 2, 3, 4
EOT_ID = IM_END_ID
FIRST_BYTE_ID = 5
FIRST_NORMAL_ID = FIRST_BYTE_ID + 256  # 261
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]

# Relative noise that makes a draft agree with its target's greedy choice ~80% of the time
# (agreement falls fast with noise: 0.02 -> ~0.82, 0.05 -> ~0.6, 0.1 -> ~0.4).
DRAFT_NOISE = 0.02

VOCABS = ("standard", "incompatible", "extended")

SPACE = "\u2581"  # "▁", SentencePiece's escaped space

# Words that come with a leading "▁" (they follow a space), words that also come bare, fragments.
_SPACE_WORDS = """the and of to in is for that it with as on be this are not or by from at an you we can
if else def return import class self print None True False while int str list value data name Hello
world let new get len range""".split()
_BARE_WORDS = "the and in is if def return self print None True int str".split()
_FRAGMENTS = ["():", "):", "==", "->", "+=", "//", "__", "self.", "▁▁", "▁▁▁", "▁▁▁▁",
              "▁=", "▁==", "▁+", "▁(", "▁#", "▁0", "▁1"]
# "extended" vocab: these, appended after the standard vocab (each one's prefix is a token).
_EXTRA_PIECES = ["▁the▁", "▁self.", "▁return▁", "▁def▁", "▁if▁", "▁in▁", "▁is▁", "▁and▁",
                 "▁▁▁▁▁", "▁▁▁▁▁▁", "▁▁▁▁▁▁▁", "▁▁▁▁▁▁▁▁", "():▁", "==▁", "->▁", "▁print(",
                 "▁None▁", "▁True▁", "▁for▁", "▁import▁"]
N_EXTRA_TOKENS = len(_EXTRA_PIECES)


def _standard_normal_pieces() -> list[str]:
    base = [SPACE]
    base += [chr(c) for c in range(0x21, 0x7F)]  # printable ASCII except space (escaped to "▁")
    base += [SPACE + c for c in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"]
    pieces = {SPACE + w for w in _SPACE_WORDS} | set(_BARE_WORDS) | set(_FRAGMENTS)
    closure = {p[:i] for p in pieces for i in range(2, len(p) + 1)}
    seen = set(base)
    words = sorted((p for p in closure if p not in seen), key=lambda p: (len(p), p))
    return base + words


_STANDARD = _standard_normal_pieces()


def vocab_pieces(vocab: str = "standard") -> list[str]:
    """Texts of all tokens (ids 0..n-1) of the named vocabulary."""
    if vocab == "standard":
        normal = list(_STANDARD)
    elif vocab == "extended":
        assert not set(_EXTRA_PIECES) & set(_STANDARD)
        normal = _STANDARD + _EXTRA_PIECES
    elif vocab == "incompatible":
        # Same pieces, same size, reversed order: every id from FIRST_NORMAL_ID on has another text.
        normal = _STANDARD[::-1]
    else:
        raise ValueError(f"unknown vocab {vocab!r}; expected one of {VOCABS}")
    return SPECIAL_TOKENS + [f"<0x{b:02X}>" for b in range(256)] + normal


def vocab_size(vocab: str = "standard") -> int:
    return len(vocab_pieces(vocab))


def byte_token_id(b: int) -> int:
    """Token id of the byte-fallback token <0xXX> (the same in every vocab here)."""
    return FIRST_BYTE_ID + b


def _scores_and_types(pieces: list[str]) -> tuple[list[float], list[int]]:
    scores: list[float] = []
    types: list[int] = []
    for i, text in enumerate(pieces):
        if i == UNK_ID:
            scores.append(0.0)
            types.append(gguf.TokenType.UNKNOWN)
        elif i < FIRST_BYTE_ID:
            scores.append(0.0)
            types.append(gguf.TokenType.CONTROL)
        elif i < FIRST_NORMAL_ID:
            scores.append(0.0)
            types.append(gguf.TokenType.BYTE)
        else:
            # SPM merges the highest-scoring pair first: prefer longer pieces, then lower ids.
            scores.append(float(len(text)) - i * 1e-4)
            types.append(gguf.TokenType.NORMAL)
    return scores, types


# byte_bias: output-row scale per favoured byte: UTF-8 continuation bytes, lead bytes of 2-, 3- and
# 4-byte sequences, and 0xFF (never valid in UTF-8).
_BYTE_BIAS = {**{b: 1.8 for b in range(0x80, 0xC0)}, 0xC3: 2.6, 0xE2: 2.6, 0xF0: 2.6, 0xFF: 2.0}

# Scales (tuned; see module docstring). Embeddings ~N(0,1); projections ~N(0, gain^2 / fan_in).
_QK_GAIN = 2.0  # sharper attention: the next token depends on more than the last one
_FFN_GAIN = 1.0
_LOGIT_STD = 4.0  # std of the output logits (output rows ~N(0, (LOGIT_STD^2 / n_embd)))
_SPECIAL_ROW_SCALE = 0.4  # ids 0..4: rarely the argmax, so EOS / EOT are rare


def _weights(seed: int, n_vocab_std: int, n_vocab: int, n_layer: int, n_embd: int, n_ff: int,
             byte_bias: bool, extra_scale: float = 1.0) -> dict[str, np.ndarray]:
    # head_count_kv == head_count, so Q, K, V and the attention output are all n_embd x n_embd.
    def normal(key: int, shape: tuple[int, ...], std: float) -> np.ndarray:
        return np.random.default_rng([seed, key]).standard_normal(shape) * std

    def vocab_rows(key: int, std: float) -> np.ndarray:
        rows = normal(key, (n_vocab_std, n_embd), std)
        if n_vocab > n_vocab_std:  # extra ids from their own stream: shared ids stay identical
            rows = np.concatenate([rows, normal(key + 1, (n_vocab - n_vocab_std, n_embd), std)])
        return rows[:n_vocab]

    w: dict[str, np.ndarray] = {}
    w["token_embd.weight"] = vocab_rows(1, 1.0)
    for il in range(n_layer):
        k = 100 * (il + 1)
        p = f"blk.{il}."
        w[p + "attn_norm.weight"] = np.ones(n_embd)
        w[p + "attn_q.weight"] = normal(k + 1, (n_embd, n_embd), _QK_GAIN / np.sqrt(n_embd))
        w[p + "attn_k.weight"] = normal(k + 2, (n_embd, n_embd), _QK_GAIN / np.sqrt(n_embd))
        w[p + "attn_v.weight"] = normal(k + 3, (n_embd, n_embd), 1.0 / np.sqrt(n_embd))
        w[p + "attn_output.weight"] = normal(k + 4, (n_embd, n_embd), 1.0 / np.sqrt(n_embd))
        w[p + "ffn_norm.weight"] = np.ones(n_embd)
        w[p + "ffn_gate.weight"] = normal(k + 5, (n_ff, n_embd), _FFN_GAIN / np.sqrt(n_embd))
        w[p + "ffn_up.weight"] = normal(k + 6, (n_ff, n_embd), _FFN_GAIN / np.sqrt(n_embd))
        w[p + "ffn_down.weight"] = normal(k + 7, (n_embd, n_ff), 1.0 / np.sqrt(n_ff))
    w["output_norm.weight"] = np.ones(n_embd)
    out = vocab_rows(3, _LOGIT_STD / np.sqrt(n_embd))
    out[:FIRST_BYTE_ID] *= _SPECIAL_ROW_SCALE
    if byte_bias:
        for b, scale in _BYTE_BIAS.items():
            out[byte_token_id(b)] *= scale
    out[n_vocab_std:] *= extra_scale
    w["output.weight"] = out
    return w


def write_model(
    path: str | Path,
    *,
    seed: int = 0,
    noise: float = 0.0,
    noise_seed: int = 1,
    vocab: str = "standard",
    eos_token_id: int = EOS_ID,
    chat_template: str | None = CHATML_TEMPLATE,
    byte_bias: bool = False,
    extra_scale: float = 1.0,
    n_layer: int = 2,
    n_embd: int = 64,
    n_head: int = 4,
    n_ff: int = 128,
    n_ctx_train: int = 4096,
    split_max_tensors: int = 0,
) -> Path:
    """Write a tiny llama GGUF model (all F32) to `path` and return the path.

    seed         weights (deterministic; the same seed gives the same model)
    noise        > 0: the seed's weights plus N(0, (noise * rms(tensor))^2) noise from noise_seed
    vocab        "standard", "incompatible" (same size, other texts from id 261 on) or
                 "extended" (standard + N_EXTRA_TOKENS normal pieces)
    eos_token_id tokenizer.ggml.eos_token_id (a normal id makes that token end generation)
    chat_template a Jinja chat template stored as tokenizer.chat_template; None stores none
    byte_bias    output layer strongly favours byte tokens 0x80-0xBF, 0xC3, 0xE2, 0xF0, 0xFF,
                 so generated text is partial / invalid UTF-8
    extra_scale  output-row scale of the ids appended by the "extended" vocab: > 1 makes the model
                 produce them often (to exercise a pair whose vocabularies differ)
    split_max_tensors > 0: split the model as llama.cpp's gguf-split does, at most this many
                 tensors a file, into STEM-00001-of-0000N.gguf, ... beside `path` (split.no,
                 split.count and split.tensors.count in each header); returns the first part
    """
    path = Path(path)
    if n_embd % n_head:
        raise ValueError("n_embd must be a multiple of n_head")
    pieces = vocab_pieces(vocab)
    n_vocab = len(pieces)
    if not 0 <= eos_token_id < n_vocab:
        raise ValueError(f"eos_token_id {eos_token_id} outside the vocab (0..{n_vocab - 1})")
    scores, types = _scores_and_types(pieces)

    weights = _weights(seed, vocab_size("standard"), n_vocab, n_layer, n_embd, n_ff, byte_bias, extra_scale)
    if noise > 0:
        rng = np.random.default_rng(noise_seed)
        for name, t in weights.items():
            rms = float(np.sqrt(np.mean(t * t)))
            weights[name] = t + rng.standard_normal(t.shape) * (noise * rms)

    w = gguf.GGUFWriter(path, "llama", split_max_tensors=split_max_tensors)
    w.add_name(f"specllm-tiny-seed{seed}" + (f"-noise{noise:g}" if noise > 0 else ""))
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_context_length(n_ctx_train)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head)
    w.add_rope_dimension_count(n_embd // n_head)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)

    w.add_tokenizer_model("llama")
    w.add_token_list(pieces)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(UNK_ID)
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(eos_token_id)
    w.add_eot_token_id(EOT_ID)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(True)
    if chat_template is not None:
        w.add_chat_template(chat_template)

    for name, t in weights.items():
        w.add_tensor(name, np.ascontiguousarray(t, dtype=np.float32))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    parts = w.format_shard_names(path)
    return parts[0]
