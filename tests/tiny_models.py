"""Tiny, real GGUF models for the test-suite, written with the `gguf` package.

No downloads and no mocks: `write_model` produces a file that llama.cpp loads and runs like any other
model of its architecture, only with random weights (64-dim, ~570 tokens, 0.6-1.2 MB, all F32; the
BERT family's 183 tokens, 0.4 MB). This module is pure `gguf` + `numpy`; it never imports llama_cpp.

Architectures (`write_model(..., arch=...)`, see ARCHS):

    "llama"   (default) 2 layers, 4 heads, SwiGLU FFN.
    "qwen35"  Qwen3.5 hybrid (llama.cpp `qwen35`, llm_arch_is_hybrid and
              llm_arch_supports_rs_rollback): 4 layers, every full_attention_interval-th (default
              2nd) one gated full attention (4 Q heads, 2 KV heads, head_dim 16, Q/K RMS norm,
              sigmoid output gate, interleaved M-RoPE), the others gated delta net "linear
              attention" (2 K heads, 4 V heads of 16, conv kernel 4); post-attention norm + SwiGLU
              FFN in every layer. Keys and tensor names follow llama.cpp's loader
              (src/models/qwen35.cpp); the new keys are written as plain strings, so any `gguf`
              release works. n_nextn=1 appends one MTP ("nextn") block (blk.N.nextn.eh_proj,
              enorm, hnorm, shared_head_norm plus a full-attention block; qwen35.nextn_predict_layers
              = 1): llama_model_n_layer_nextn() is 1, and a model loaded with params.load_mtp = True
              opens a context with ctx_type = LLAMA_CONTEXT_TYPE_MTP. (Loading without load_mtp and
              then opening an MTP context aborts the process in llama.cpp.) The trunk weights do not
              depend on n_nextn, so with and without MTP the main model's logits are identical.
    "mamba"   Mamba 1, fully recurrent (llm_arch_is_recurrent): 2 layers, d_inner 128, d_state 16,
              dt_rank 4, conv kernel 4. llama.cpp clamps its n_rs_seq to 0: no partial rollback.
    "bert"    an embedding model as bge and all-MiniLM convert (llama.cpp `bert`, src/models/bert.cpp):
              non-causal, 2 layers, 4 heads, learned position embeddings for a training context of
              512, token type embeddings, Q/K/V with biases, post-norm LayerNorms (with biases),
              GELU FFN; no output layer. WordPiece vocabulary (BERT_VOCAB, below).
    "nomic-bert" nomic-embed-text's (llama.cpp `nomic-bert`): the same graph with RoPE (base 1000)
              instead of position embeddings, a fused QKV and a SwiGLU FFN, no biases; a training
              context of 2048.

Tokenizer (the BERT family): WordPiece (`tokenizer.ggml.model = "bert"`, llama.cpp's WPM tokenizer),
written as llama.cpp's converter writes one (a piece that begins a word gets "▁", a "##" piece
loses its "##"): 0 [PAD] 1 [UNK] 2 [CLS] 3 [SEP] 4 [MASK] (CONTROL), then a piece that begins a
word and one that continues it for every letter and digit, "▁" and each ASCII punctuation mark,
whole English words and a few suffixes. llama.cpp lowercases the text and, with add_special, writes
[CLS] before it and [SEP] after it.

Tokenizer (the others): SentencePiece style (`tokenizer.ggml.model = "llama"`, llama.cpp's SPM tokenizer):

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
tensor, from `noise_seed`): that is how a draft model that mostly agrees with its target is made
(DRAFT_NOISE suits every arch; DRAFT_NOISES[arch] names it per arch).
The scales below were tuned against llama.cpp 0.3.36 (20 prompts x 32 greedy tokens, seeds 0-3):
greedy output has ~29 distinct tokens in 32 and never emitted EOS/EOT; at temperature 1 the median
top-1 probability is ~0.4 and top-5 ~0.8; the top-2 logit gap is < 1e-3 at ~0.1% of positions and
< 1e-2 at ~0.3-1%; the draft (noise=DRAFT_NOISE) agrees with the target's greedy token 81-87% of
the time. One-token vs multi-token decode calls differ by up to ~7e-3 in a logit with llama.cpp's
default F16 KV cache (median ~3e-6), and by < 2e-5 with an F32 KV cache (type_k = type_v = 0).
The same measurement for qwen35: >= 27 distinct tokens in 32 (median 30-31), no EOS/EOT, top-1 ~0.4,
top-5 ~0.8, draft agreement 78-81%, one-token vs 40-token decode calls differ by up to ~2e-3
(median ~8e-6); for mamba: >= 23 distinct (median 30-31), no EOS/EOT, top-1 ~0.42, top-5 ~0.8,
draft agreement 78-83% (it is more sensitive to noise: 0.05 gives 27-47%), one-token vs batched
decode calls differ by < 2e-5.
tests/test_tiny_models.py checks these properties.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

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
    "DRAFT_NOISES",
    "ARCHS",
    "BERT_ARCHS",
    "PAD_ID",
    "BERT_UNK_ID",
    "CLS_ID",
    "SEP_ID",
    "MASK_ID",
    "BERT_VOCAB",
    "VOCABS",
    "FIM_PIECES",
    "CODELLAMA_FIM_PIECES",
    "HARMONY_PIECES",
    "MARKUP_PIECES",
    "QWEN_PIECES",
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

BERT_ARCHS = ("bert", "nomic-bert")
ARCHS = ("llama", "qwen35", "mamba", *BERT_ARCHS)
# Per-arch draft noise (target agreement ~80% for each; see the module docstring).
DRAFT_NOISES = {"llama": DRAFT_NOISE, "qwen35": DRAFT_NOISE, "mamba": DRAFT_NOISE}

VOCABS = ("standard", "incompatible", "extended", "code", "codellama", "harmony", "markup", "qwen")
# "code" vocab: the standard one and Qwen2.5-Coder's fill-in-the-middle control tokens after it,
# which llama.cpp finds by their text (as in the real Qwen2.5-Coder files, whose GGUFs name none);
# "codellama": CodeLlama's, which has no repository-level tokens.
FIM_PIECES = ["<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"]
CODELLAMA_FIM_PIECES = ["<PRE>", "<SUF>", "<MID>"]
# "harmony" vocab: gpt-oss's message markup, control tokens in its GGUFs, which llama.cpp finds by
# their text: it writes the first five as text, and ends generation at <|return|> and <|call|>.
HARMONY_PIECES = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|constrain|>", "<|return|>", "<|call|>"]
# "markup" vocab: markup that tokenizers hold as control tokens: think blocks' markers (Magistral's,
# Gemma 4's) and calls' (Gemma 4's, Mistral's)
MARKUP_PIECES = [
    "[THINK]", "[/THINK]", "<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", '<|"|>',
    "[TOOL_CALLS]", "[ARGS]",
]  # fmt: skip

# "qwen" vocab: Qwen3.5's think block's and calls' markers, user-defined tokens of its tokenizer
# (text, never control): extra_scale sets how often they come
QWEN_PIECES = ["<think>", "</think>", "<tool_call>", "</tool_call>"]

SPACE = "\u2581"  # "▁", SentencePiece's escaped space

# Words that come with a leading "▁" (they follow a space), words that also come bare, fragments.
_SPACE_WORDS = [
    "the",
    "and",
    "of",
    "to",
    "in",
    "is",
    "for",
    "that",
    "it",
    "with",
    "as",
    "on",
    "be",
    "this",
    "are",
    "not",
    "or",
    "by",
    "from",
    "at",
    "an",
    "you",
    "we",
    "can",
    "if",
    "else",
    "def",
    "return",
    "import",
    "class",
    "self",
    "print",
    "None",
    "True",
    "False",
    "while",
    "int",
    "str",
    "list",
    "value",
    "data",
    "name",
    "Hello",
    "world",
    "let",
    "new",
    "get",
    "len",
    "range",
]
_BARE_WORDS = ["the", "and", "in", "is", "if", "def", "return", "self", "print", "None", "True", "int", "str"]
_FRAGMENTS = [
    "():",
    "):",
    "==",
    "->",
    "+=",
    "//",
    "__",
    "self.",
    "▁▁",
    "▁▁▁",
    "▁▁▁▁",
    "▁=",
    "▁==",
    "▁+",
    "▁(",
    "▁#",
    "▁0",
    "▁1",
]
# "extended" vocab: these, appended after the standard vocab (each one's prefix is a token).
_EXTRA_PIECES = [
    "▁the▁",
    "▁self.",
    "▁return▁",
    "▁def▁",
    "▁if▁",
    "▁in▁",
    "▁is▁",
    "▁and▁",
    "▁▁▁▁▁",
    "▁▁▁▁▁▁",
    "▁▁▁▁▁▁▁",
    "▁▁▁▁▁▁▁▁",
    "():▁",
    "==▁",
    "->▁",
    "▁print(",
    "▁None▁",
    "▁True▁",
    "▁for▁",
    "▁import▁",
]
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
    elif vocab == "code":
        normal = _STANDARD + FIM_PIECES
    elif vocab == "codellama":
        normal = _STANDARD + CODELLAMA_FIM_PIECES
    elif vocab == "harmony":
        normal = _STANDARD + HARMONY_PIECES
    elif vocab == "markup":
        normal = _STANDARD + MARKUP_PIECES
    elif vocab == "qwen":
        normal = _STANDARD + QWEN_PIECES
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
        elif text in FIM_PIECES or text in CODELLAMA_FIM_PIECES or text in HARMONY_PIECES or text in MARKUP_PIECES:
            scores.append(0.0)
            types.append(gguf.TokenType.CONTROL)
        elif text in QWEN_PIECES:
            scores.append(0.0)
            types.append(gguf.TokenType.USER_DEFINED)
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


def _rng(seed: int):
    def normal(key: int, shape: tuple[int, ...], std: float) -> np.ndarray:
        return np.random.default_rng([seed, key]).standard_normal(shape) * std

    return normal


def _vocab_rows(normal, key: int, n_vocab_std: int, n_vocab: int, n_embd: int, std: float) -> np.ndarray:
    rows = normal(key, (n_vocab_std, n_embd), std)
    if n_vocab > n_vocab_std:  # extra ids from their own stream: shared ids stay identical
        rows = np.concatenate([rows, normal(key + 1, (n_vocab - n_vocab_std, n_embd), std)])
    return rows[:n_vocab]


def _output_rows(
    normal, n_vocab_std: int, n_vocab: int, n_embd: int, byte_bias: bool, extra_scale: float, logit_std: float = 4.0
) -> np.ndarray:
    out = _vocab_rows(normal, 3, n_vocab_std, n_vocab, n_embd, logit_std / np.sqrt(n_embd))
    out[:FIRST_BYTE_ID] *= _SPECIAL_ROW_SCALE
    if byte_bias:
        for b, scale in _BYTE_BIAS.items():
            out[byte_token_id(b)] *= scale
    out[n_vocab_std:] *= extra_scale
    return out


def _weights(
    seed: int,
    n_vocab_std: int,
    n_vocab: int,
    n_layer: int,
    n_embd: int,
    n_ff: int,
    byte_bias: bool,
    extra_scale: float = 1.0,
) -> dict[str, np.ndarray]:
    # head_count_kv == head_count, so Q, K, V and the attention output are all n_embd x n_embd.
    normal = _rng(seed)
    w: dict[str, np.ndarray] = {}
    w["token_embd.weight"] = _vocab_rows(normal, 1, n_vocab_std, n_vocab, n_embd, 1.0)
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
    w["output.weight"] = _output_rows(normal, n_vocab_std, n_vocab, n_embd, byte_bias, extra_scale, _LOGIT_STD)
    return w


# qwen35 scales (tuned like the llama ones; see module docstring).
_Q35_Q_NORM = 2.0  # attn_q_norm weight: Q and K are RMS-normalised per head, this sharpens attention
_Q35_DT_BIAS = -2.0  # gated delta net: decay = exp(softplus(alpha + dt_bias) * ssm_a) ~ 0.6 .. 0.95
_Q35_A = (0.5, 4.0)  # -ssm_a, spread over the value heads
_Q35_CONV_STD = 0.5
# mamba scales
_MAMBA_DT = (0.05, 1.0)  # softplus(dt_bias) log-uniform in this range (Mamba itself uses 0.001 .. 0.1)
_MAMBA_CONV_STD = 0.5
_MAMBA_X_GAIN = 2.0  # ssm_x (dt, B, C projection) gain: a stronger scan, so output is not a loop
_MAMBA_D = 1.0  # ssm_d: the skip connection around the scan


def _qwen35_dims(n_embd: int, n_head: int, n_head_kv: int) -> dict[str, int]:
    head_dim = n_embd // n_head
    return dict(
        head_dim=head_dim,
        n_head=n_head,
        n_head_kv=n_head_kv,
        d_state=head_dim,  # head_k_dim == head_v_dim == ssm.state_size
        n_k_heads=2,
        n_v_heads=4,  # ssm.group_count, ssm.time_step_rank
        d_inner=head_dim * 4,
        d_conv=4,
    )


def _qwen35_attn_block(
    normal, w: dict[str, np.ndarray], p: str, k: int, n_embd: int, n_ff: int, d: dict[str, int]
) -> None:
    hd, nh, nkv = d["head_dim"], d["n_head"], d["n_head_kv"]
    w[p + "attn_norm.weight"] = np.ones(n_embd)
    # attn_q holds, per head, head_dim query rows then head_dim output-gate rows
    w[p + "attn_q.weight"] = normal(k + 1, (2 * hd * nh, n_embd), 1.0 / np.sqrt(n_embd))
    w[p + "attn_k.weight"] = normal(k + 2, (hd * nkv, n_embd), 1.0 / np.sqrt(n_embd))
    w[p + "attn_v.weight"] = normal(k + 3, (hd * nkv, n_embd), 1.0 / np.sqrt(n_embd))
    w[p + "attn_q_norm.weight"] = np.full(hd, _Q35_Q_NORM)
    w[p + "attn_k_norm.weight"] = np.ones(hd)
    w[p + "attn_output.weight"] = normal(k + 4, (n_embd, hd * nh), 1.0 / np.sqrt(hd * nh))
    _qwen35_ffn(normal, w, p, k, n_embd, n_ff)


def _qwen35_ffn(normal, w: dict[str, np.ndarray], p: str, k: int, n_embd: int, n_ff: int) -> None:
    w[p + "post_attention_norm.weight"] = np.ones(n_embd)
    w[p + "ffn_gate.weight"] = normal(k + 5, (n_ff, n_embd), _FFN_GAIN / np.sqrt(n_embd))
    w[p + "ffn_up.weight"] = normal(k + 6, (n_ff, n_embd), _FFN_GAIN / np.sqrt(n_embd))
    w[p + "ffn_down.weight"] = normal(k + 7, (n_embd, n_ff), 1.0 / np.sqrt(n_ff))


def _qwen35_weights(
    seed: int,
    n_vocab_std: int,
    n_vocab: int,
    n_layer: int,
    n_nextn: int,
    n_embd: int,
    n_ff: int,
    d: dict[str, int],
    recurrent: list[bool],
    byte_bias: bool,
    extra_scale: float,
    mtp_mimic: bool = False,
) -> dict[str, np.ndarray]:
    normal = _rng(seed)
    hd, nv = d["d_state"], d["n_v_heads"]
    conv_dim = 2 * d["d_state"] * d["n_k_heads"] + d["d_inner"]  # q, k (n_k_heads each), v (n_v_heads)
    w: dict[str, np.ndarray] = {}
    w["token_embd.weight"] = _vocab_rows(normal, 1, n_vocab_std, n_vocab, n_embd, 1.0)
    for il in range(n_layer):
        k = 100 * (il + 1)
        p = f"blk.{il}."
        if not recurrent[il]:
            _qwen35_attn_block(normal, w, p, k, n_embd, n_ff, d)
            continue
        # gated delta net ("linear attention") block
        w[p + "attn_norm.weight"] = np.ones(n_embd)
        w[p + "attn_qkv.weight"] = normal(k + 11, (conv_dim, n_embd), 1.0 / np.sqrt(n_embd))  # q, k, v
        w[p + "attn_gate.weight"] = normal(k + 12, (d["d_inner"], n_embd), 1.0 / np.sqrt(n_embd))  # z
        w[p + "ssm_conv1d.weight"] = normal(k + 13, (conv_dim, d["d_conv"]), _Q35_CONV_STD)
        w[p + "ssm_dt.bias"] = np.full(nv, _Q35_DT_BIAS)
        w[p + "ssm_a"] = -np.geomspace(_Q35_A[0], _Q35_A[1], nv)  # -exp(A_log)
        w[p + "ssm_beta.weight"] = normal(k + 14, (nv, n_embd), 1.0 / np.sqrt(n_embd))
        w[p + "ssm_alpha.weight"] = normal(k + 15, (nv, n_embd), 1.0 / np.sqrt(n_embd))
        w[p + "ssm_norm.weight"] = np.ones(hd)
        w[p + "ssm_out.weight"] = normal(k + 16, (n_embd, d["d_inner"]), 1.0 / np.sqrt(d["d_inner"]))
        _qwen35_ffn(normal, w, p, k, n_embd, n_ff)
    w["output_norm.weight"] = np.ones(n_embd)
    w["output.weight"] = _output_rows(normal, n_vocab_std, n_vocab, n_embd, byte_bias, extra_scale, _LOGIT_STD)
    # MTP ("nextn") blocks last: a model with them has the same trunk (even with noise) as one without
    for il in range(n_layer, n_layer + n_nextn):
        k = 100 * (il + 1)
        p = f"blk.{il}."
        _qwen35_attn_block(normal, w, p, k, n_embd, n_ff, d)
        w[p + "nextn.eh_proj.weight"] = normal(k + 21, (n_embd, 2 * n_embd), 1.0 / np.sqrt(2 * n_embd))
        w[p + "nextn.enorm.weight"] = np.ones(n_embd)
        w[p + "nextn.hnorm.weight"] = np.ones(n_embd)
        w[p + "nextn.shared_head_norm.weight"] = np.ones(n_embd)
    if mtp_mimic:
        _make_mtp_mimic(w, n_layer, n_embd)
    return w


_MIMIC_BLOCK_GAIN = 0.3  # mtp_mimic: every block's output scaled down, so a model is mostly a bigram


def _make_mtp_mimic(w: dict[str, np.ndarray], n_layer: int, n_embd: int) -> None:
    """An MTP head that predicts well: the blocks add little to the token's own embedding (the
    model is close to a bigram of its last token), and the MTP block's input projection passes the
    token's embedding through, so from token t+1 it predicts what the model will predict there."""
    for name in w:
        if name.endswith(("attn_output.weight", "ssm_out.weight", "ffn_down.weight")):
            w[name] = w[name] * _MIMIC_BLOCK_GAIN
    eh = w[f"blk.{n_layer}.nextn.eh_proj.weight"]  # (n_embd, 2 n_embd): the embedding, then the hidden state
    w[f"blk.{n_layer}.nextn.eh_proj.weight"] = np.concatenate([np.eye(n_embd), 0.1 * eh[:, n_embd:]], axis=1)


def _mamba_weights(
    seed: int,
    n_vocab_std: int,
    n_vocab: int,
    n_layer: int,
    n_embd: int,
    d: dict[str, int],
    byte_bias: bool,
    extra_scale: float,
) -> dict[str, np.ndarray]:
    normal = _rng(seed)
    d_inner, d_state, dt_rank, d_conv = d["d_inner"], d["d_state"], d["dt_rank"], d["d_conv"]
    w: dict[str, np.ndarray] = {}
    w["token_embd.weight"] = _vocab_rows(normal, 1, n_vocab_std, n_vocab, n_embd, 1.0)
    for il in range(n_layer):
        k = 100 * (il + 1)
        p = f"blk.{il}."
        w[p + "attn_norm.weight"] = np.ones(n_embd)
        w[p + "ssm_in.weight"] = normal(k + 1, (2 * d_inner, n_embd), 1.0 / np.sqrt(n_embd))  # x, z
        w[p + "ssm_conv1d.weight"] = normal(k + 2, (d_inner, d_conv), _MAMBA_CONV_STD)
        w[p + "ssm_conv1d.bias"] = normal(k + 3, (d_inner,), 0.1)
        w[p + "ssm_x.weight"] = normal(k + 4, (dt_rank + 2 * d_state, d_inner), _MAMBA_X_GAIN / np.sqrt(d_inner))
        w[p + "ssm_dt.weight"] = normal(k + 5, (d_inner, dt_rank), 1.0 / np.sqrt(dt_rank))
        u = np.random.default_rng([seed, k + 6]).random(d_inner)
        dt = np.exp(np.log(_MAMBA_DT[0]) + u * (np.log(_MAMBA_DT[1]) - np.log(_MAMBA_DT[0])))
        w[p + "ssm_dt.bias"] = dt + np.log(-np.expm1(-dt))  # softplus^-1(dt)
        w[p + "ssm_a"] = -np.tile(np.arange(1, d_state + 1, dtype=np.float64), (d_inner, 1))  # -exp(A_log)
        w[p + "ssm_d"] = np.full(d_inner, _MAMBA_D)
        w[p + "ssm_out.weight"] = normal(k + 7, (n_embd, d_inner), 1.0 / np.sqrt(d_inner))
    w["output_norm.weight"] = np.ones(n_embd)
    w["output.weight"] = _output_rows(normal, n_vocab_std, n_vocab, n_embd, byte_bias, extra_scale, _LOGIT_STD)
    return w


# --- the BERT family (arch "bert", "nomic-bert") ---

BERT_SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PAD_ID, BERT_UNK_ID, CLS_ID, SEP_ID, MASK_ID = range(len(BERT_SPECIAL_TOKENS))
BERT_TOKEN_TYPES = 2  # "sentence A" and "sentence B", as bert-base's type_vocab_size
_BERT_WORDS = [w.lower() for w in _SPACE_WORDS] + [
    "embedding", "model", "text", "search", "query", "document", "sentence", "vector", "quick", "brown",
    "fox", "jumps", "over", "lazy", "dog", "question", "answer", "code", "file",
]  # fmt: skip
_BERT_SUFFIXES = ["s", "es", "ed", "ing", "er", "ly", "tion"]


def _bert_vocab() -> list[str]:
    """The WordPiece vocabulary in the converter's form: "▁x" begins a word, "x" continues one."""
    chars = "abcdefghijklmnopqrstuvwxyz0123456789"
    marks = [chr(c) for c in range(0x21, 0x7F) if not chr(c).isalnum()]  # each one a word of its own
    pieces = BERT_SPECIAL_TOKENS + [SPACE + c for c in chars] + list(chars) + [SPACE + m for m in marks]
    pieces += [SPACE + w for w in _BERT_WORDS] + _BERT_SUFFIXES
    return list(dict.fromkeys(pieces))  # each once: llama.cpp refuses a piece given twice


BERT_VOCAB = _bert_vocab()
# bge's and nomic-embed-text's LayerNorm epsilon
_BERT_NORM_EPS = 1e-12
_BERT_CONTEXTS = {"bert": 512, "nomic-bert": 2048}
RANK_POOLING = 4  # llama.cpp's LLAMA_POOLING_TYPE_RANK


def _bert_weights(
    seed: int, arch: str, n_layer: int, n_embd: int, n_ff: int, n_ctx_train: int
) -> dict[str, np.ndarray]:
    """Post-norm encoder blocks: attention, add, LayerNorm, FFN, add, LayerNorm. bert: Q, K, V,
    output and FFN with biases, GELU, learned positions; nomic-bert: fused QKV, SwiGLU, no biases
    (RoPE positions)."""
    normal = _rng(seed)
    w: dict[str, np.ndarray] = {}
    w["token_embd.weight"] = normal(1, (len(BERT_VOCAB), n_embd), 1.0)
    w["token_types.weight"] = normal(2, (BERT_TOKEN_TYPES, n_embd), 0.1)
    if arch == "bert":
        w["position_embd.weight"] = normal(3, (n_ctx_train, n_embd), 0.5)
    w["token_embd_norm.weight"] = np.ones(n_embd)
    w["token_embd_norm.bias"] = normal(4, (n_embd,), 0.1)
    for il in range(n_layer):
        k = 100 * (il + 1)
        p = f"blk.{il}."
        if arch == "bert":
            for j, name in enumerate(("attn_q", "attn_k", "attn_v")):
                w[p + name + ".weight"] = normal(k + 1 + j, (n_embd, n_embd), _QK_GAIN / np.sqrt(n_embd))
                w[p + name + ".bias"] = normal(k + 11 + j, (n_embd,), 0.1)
        else:
            w[p + "attn_qkv.weight"] = normal(k + 1, (3 * n_embd, n_embd), _QK_GAIN / np.sqrt(n_embd))
        w[p + "attn_output.weight"] = normal(k + 4, (n_embd, n_embd), 1.0 / np.sqrt(n_embd))
        w[p + "attn_output_norm.weight"] = np.ones(n_embd)
        w[p + "attn_output_norm.bias"] = normal(k + 14, (n_embd,), 0.1)
        w[p + "ffn_up.weight"] = normal(k + 6, (n_ff, n_embd), _FFN_GAIN / np.sqrt(n_embd))
        if arch == "nomic-bert":
            w[p + "ffn_gate.weight"] = normal(k + 5, (n_ff, n_embd), _FFN_GAIN / np.sqrt(n_embd))
        w[p + "ffn_down.weight"] = normal(k + 7, (n_embd, n_ff), 1.0 / np.sqrt(n_ff))
        if arch == "bert":
            w[p + "attn_output.bias"] = normal(k + 15, (n_embd,), 0.1)
            w[p + "ffn_up.bias"] = normal(k + 16, (n_ff,), 0.1)
            w[p + "ffn_down.bias"] = normal(k + 17, (n_embd,), 0.1)
        w[p + "layer_output_norm.weight"] = np.ones(n_embd)
        w[p + "layer_output_norm.bias"] = normal(k + 18, (n_embd,), 0.1)
    return w


def _classifier_head(seed: int, n_embd: int) -> dict[str, np.ndarray]:
    """A reranker's head, as llama.cpp's converter writes bge-reranker's (XLM-RoBERTa's
    classifier): [CLS]'s row through a dense layer, tanh, and a projection to one score."""
    normal = _rng(seed)
    return {
        "cls.weight": normal(901, (n_embd, n_embd), 1.0 / np.sqrt(n_embd)),
        "cls.bias": normal(902, (n_embd,), 0.1),
        "cls.output.weight": normal(903, (1, n_embd), 1.0),
        "cls.output.bias": normal(904, (1,), 0.1),
    }


def _write_bert(
    path: Path, arch: str, seed: int, n_layer: int, n_embd: int, n_head: int, n_ff: int, n_ctx_train: int,
    pooling_type: int | None, rerank_template: str | None = None,
) -> Path:  # fmt: skip
    """A BERT-family embedding model, with the keys llama.cpp's converter writes for bge (bert) and
    nomic-embed-text (nomic-bert): not causal, its pooling type, [CLS] as BOS and [SEP] as EOS."""
    w = gguf.GGUFWriter(path, arch)
    w.add_name(f"specllm-tiny-{arch}-seed{seed}")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_context_length(n_ctx_train)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_layer_norm_eps(_BERT_NORM_EPS)
    w.add_causal_attention(False)
    if arch == "nomic-bert":
        w.add_rope_freq_base(1000.0)
    if pooling_type is not None:
        w.add_uint32(f"{arch}.pooling_type", pooling_type)
    w.add_token_type_count(BERT_TOKEN_TYPES)
    w.add_tokenizer_model("bert")
    w.add_token_list(BERT_VOCAB)
    control, normal = gguf.TokenType.CONTROL, gguf.TokenType.NORMAL
    w.add_token_types([control if p in BERT_SPECIAL_TOKENS else normal for p in BERT_VOCAB])
    w.add_bos_token_id(CLS_ID)
    w.add_eos_token_id(SEP_ID)
    w.add_unk_token_id(BERT_UNK_ID)
    w.add_sep_token_id(SEP_ID)
    w.add_pad_token_id(PAD_ID)
    w.add_uint32("tokenizer.ggml.cls_token_id", CLS_ID)
    w.add_mask_token_id(MASK_ID)
    if rerank_template is not None:
        w.add_string("tokenizer.chat_template.rerank", rerank_template)
    weights = _bert_weights(seed, arch, n_layer, n_embd, n_ff, n_ctx_train)
    if pooling_type == RANK_POOLING:  # a reranker: its head scores the text
        weights |= _classifier_head(seed, n_embd)
    for name, t in weights.items():
        w.add_tensor(name, np.ascontiguousarray(t, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_model(
    path: str | Path,
    *,
    arch: str = "llama",
    seed: int = 0,
    noise: float = 0.0,
    noise_seed: int = 1,
    vocab: str = "standard",
    eos_token_id: int = EOS_ID,
    chat_template: str | list[dict[str, str]] | None = CHATML_TEMPLATE,
    byte_bias: bool = False,
    extra_scale: float = 1.0,
    n_layer: int | None = None,
    n_embd: int = 64,
    n_head: int = 4,
    n_head_kv: int | None = None,
    n_ff: int = 128,
    n_nextn: int = 0,
    mtp_mimic: bool = False,
    full_attention_interval: int = 2,
    n_ctx_train: int | None = None,
    split_max_tensors: int = 0,
    tokenizer_model: str = "llama",
    tokenizer_pre: str | None = None,
    weight_type: str = "F32",
    pooling_type: int | None = None,
    rerank_template: str | None = None,
    add_eos: bool = False,
) -> Path:
    """Write a tiny GGUF model (F32, unless weight_type says otherwise) to `path`, return the path.

    arch         "llama" (default), "qwen35" (hybrid: gated delta net + gated full attention),
                 "mamba" (fully recurrent Mamba 1), or an embedding model of the BERT family,
                 "bert" or "nomic-bert" (WordPiece vocabulary; of the options below only seed,
                 n_layer, n_embd, n_head, n_ff, n_ctx_train and pooling_type apply); see the
                 module docstring
    seed         weights (deterministic; the same seed gives the same model)
    noise        > 0: the seed's weights plus N(0, (noise * rms(tensor))^2) noise from noise_seed
    vocab        "standard", "incompatible" (same size, other texts from id 261 on),
                 "extended" (standard + N_EXTRA_TOKENS normal pieces), "code" (standard +
                 FIM_PIECES, fill-in-the-middle control tokens), "codellama" (standard +
                 CODELLAMA_FIM_PIECES), "harmony" (standard + HARMONY_PIECES, gpt-oss's markup) or "markup"
                 (standard + MARKUP_PIECES, control tokens; extra_scale sets how often they come) or
                 "qwen" (standard + QWEN_PIECES, user-defined tokens; extra_scale likewise)
    eos_token_id tokenizer.ggml.eos_token_id (a normal id makes that token end generation)
    chat_template a Jinja chat template stored as tokenizer.chat_template; None stores none; a list
                 of {"name", "template"} stores "default" as that and the others by name
                 (tokenizer.chat_template.NAME), as a tokenizer_config.json's list is converted
    byte_bias    output layer strongly favours byte tokens 0x80-0xBF, 0xC3, 0xE2, 0xF0, 0xFF,
                 so generated text is partial / invalid UTF-8
    extra_scale  output-row scale of the ids appended by the "extended" vocab: > 1 makes the model
                 produce them often (to exercise a pair whose vocabularies differ)
    n_layer      trunk layers; default 2 (llama, mamba, the BERT family) or 4 (qwen35)
    n_ctx_train  <arch>.context_length; default 4096, but bert's 512 and nomic-bert's 2048
    n_head_kv    qwen35 only: KV heads of the attention layers (default 2; llama always uses n_head)
    n_nextn      qwen35 only: MTP ("nextn") blocks appended after the trunk (llama.cpp supports 1);
                 the trunk weights do not depend on it
    mtp_mimic    qwen35 with n_nextn=1: an MTP head that often predicts what the model will (see
                 _make_mtp_mimic), so MTP drafts are accepted often and rejected often
    full_attention_interval qwen35 only: every this-many-th layer is full attention, the others
                 gated delta net (default 2: layers 0, 2 recurrent, 1, 3 attention)
    split_max_tensors > 0: split the model as llama.cpp's gguf-split does, at most this many
                 tensors a file, into STEM-00001-of-0000N.gguf, ... beside `path` (split.no,
                 split.count and split.tensors.count in each header); returns the first part
    tokenizer_model tokenizer.ggml.model: "llama" (SentencePiece) or "gpt2" (BPE over the same
                 pieces, with one merge), which reads tokenizer_pre, tokenizer.ggml.pre (None
                 writes none, as GGUFs converted before llama.cpp had the key)
    weight_type  "F32", or a type gguf.quants quantizes ("Q8_0"): the matrices are stored in it,
                 the norms stay F32 (rows must be a multiple of the type's block: n_embd, n_ff)
    pooling_type <arch>.pooling_type, how an embeddings context pools a text's tokens (llama.cpp's
                 LLAMA_POOLING_TYPE_*: 0 none, 1 mean, 2 cls, 3 last, 4 rank); None writes none;
                 a BERT with rank pooling is a reranker in bge-reranker's shape (a classifier head
                 on [CLS] gives the pair's score)
    rerank_template BERT family only: tokenizer.chat_template.rerank, the text a reranker reads a
                 pair as ({query} and {document} put in: Qwen3-Reranker's way)
    add_eos      tokenizer.ggml.add_eos_token: a text read with special tokens ends with EOS
                 (Qwen3-Embedding's way, whose last-token pooling reads it)
    """
    path = Path(path)
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; expected one of {ARCHS}")
    if arch in BERT_ARCHS:
        if noise or n_nextn or vocab != "standard" or weight_type != "F32" or split_max_tensors:
            raise ValueError(f"{arch}: noise, n_nextn, vocab, weight_type and split_max_tensors are not written")
        n_ctx_train = _BERT_CONTEXTS[arch] if n_ctx_train is None else n_ctx_train
        dims = (n_layer or 2, n_embd, n_head, n_ff, n_ctx_train)
        return _write_bert(path, arch, seed, *dims, pooling_type, rerank_template)
    n_ctx_train = 4096 if n_ctx_train is None else n_ctx_train
    if n_nextn and arch != "qwen35":
        raise ValueError("n_nextn (MTP blocks) is only supported for arch='qwen35'")
    if not 0 <= n_nextn <= 1:
        raise ValueError("llama.cpp's qwen35 supports exactly one MTP block (n_nextn 0 or 1)")
    if n_layer is None:
        n_layer = 4 if arch == "qwen35" else 2
    if n_embd % n_head:
        raise ValueError("n_embd must be a multiple of n_head")
    pieces = vocab_pieces(vocab)
    n_vocab = len(pieces)
    if not 0 <= eos_token_id < n_vocab:
        raise ValueError(f"eos_token_id {eos_token_id} outside the vocab (0..{n_vocab - 1})")
    scores, types = _scores_and_types(pieces)
    if vocab in ("code", "codellama", "harmony"):  # control tokens (some end generation) are rarely the argmax
        extra_scale *= _SPECIAL_ROW_SCALE
    n_vocab_std = vocab_size("standard")

    if arch == "llama":
        weights = _weights(seed, n_vocab_std, n_vocab, n_layer, n_embd, n_ff, byte_bias, extra_scale)
    elif arch == "qwen35":
        q35 = _qwen35_dims(n_embd, n_head, 2 if n_head_kv is None else n_head_kv)
        if n_head % q35["n_head_kv"]:
            raise ValueError("n_head must be a multiple of n_head_kv")
        recurrent = [(il + 1) % full_attention_interval != 0 for il in range(n_layer)]
        if all(recurrent) or not any(recurrent):
            raise ValueError(
                "qwen35 needs at least one recurrent and one attention layer (n_layer >= full_attention_interval >= 2)"
            )
        if mtp_mimic and not n_nextn:
            raise ValueError("mtp_mimic needs n_nextn=1")
        weights = _qwen35_weights(
            seed,
            n_vocab_std,
            n_vocab,
            n_layer,
            n_nextn,
            n_embd,
            n_ff,
            q35,
            recurrent,
            byte_bias,
            extra_scale,
            mtp_mimic,
        )
    else:
        mamba = dict(d_inner=2 * n_embd, d_state=16, dt_rank=-(n_embd // -16), d_conv=4)
        weights = _mamba_weights(seed, n_vocab_std, n_vocab, n_layer, n_embd, mamba, byte_bias, extra_scale)
    if noise > 0:
        rng = np.random.default_rng(noise_seed)
        for name, t in weights.items():
            rms = float(np.sqrt(np.mean(t * t)))
            weights[name] = t + rng.standard_normal(t.shape) * (noise * rms)

    w = gguf.GGUFWriter(path, arch, split_max_tensors=split_max_tensors)
    name = f"specllm-tiny-seed{seed}" + (f"-noise{noise:g}" if noise > 0 else "")
    w.add_name(name if arch == "llama" else f"specllm-tiny-{arch}-seed{seed}" + name[len(f"specllm-tiny-seed{seed}") :])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_context_length(n_ctx_train)
    w.add_embedding_length(n_embd)
    if arch == "llama":
        w.add_block_count(n_layer)
        w.add_feed_forward_length(n_ff)
        w.add_head_count(n_head)
        w.add_head_count_kv(n_head)
        w.add_rope_dimension_count(n_embd // n_head)
        w.add_rope_freq_base(10000.0)
    elif arch == "qwen35":
        # keys as plain strings: older `gguf` releases lack the writer helpers for some of them
        w.add_block_count(n_layer + n_nextn)
        w.add_feed_forward_length(n_ff)
        w.add_head_count(n_head)
        w.add_head_count_kv(q35["n_head_kv"])
        w.add_uint32(f"{arch}.attention.key_length", q35["head_dim"])
        w.add_uint32(f"{arch}.attention.value_length", q35["head_dim"])
        w.add_rope_dimension_count(q35["head_dim"])
        w.add_array(f"{arch}.rope.dimension_sections", _rope_sections(q35["head_dim"]))
        w.add_rope_freq_base(10000.0)
        w.add_uint32(f"{arch}.ssm.conv_kernel", q35["d_conv"])
        w.add_uint32(f"{arch}.ssm.state_size", q35["d_state"])
        w.add_uint32(f"{arch}.ssm.group_count", q35["n_k_heads"])
        w.add_uint32(f"{arch}.ssm.time_step_rank", q35["n_v_heads"])
        w.add_uint32(f"{arch}.ssm.inner_size", q35["d_inner"])
        w.add_uint32(f"{arch}.full_attention_interval", full_attention_interval)
        if n_nextn:
            w.add_uint32(f"{arch}.nextn_predict_layers", n_nextn)
    else:
        w.add_block_count(n_layer)
        w.add_feed_forward_length(0)
        w.add_head_count(0)
        w.add_uint32(f"{arch}.ssm.conv_kernel", mamba["d_conv"])
        w.add_uint32(f"{arch}.ssm.inner_size", mamba["d_inner"])
        w.add_uint32(f"{arch}.ssm.state_size", mamba["d_state"])
        w.add_uint32(f"{arch}.ssm.time_step_rank", mamba["dt_rank"])
        w.add_bool(f"{arch}.ssm.dt_b_c_rms", False)
    w.add_layer_norm_rms_eps(1e-5 if arch != "qwen35" else 1e-6)
    if pooling_type is not None:
        w.add_uint32(f"{arch}.pooling_type", pooling_type)
    w.add_vocab_size(n_vocab)

    w.add_tokenizer_model(tokenizer_model)
    if tokenizer_model == "gpt2":
        w.add_token_merges(["▁ t"])  # (llama.cpp requires the key)
    if tokenizer_pre is not None:
        w.add_tokenizer_pre(tokenizer_pre)
    w.add_token_list(pieces)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(UNK_ID)
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(eos_token_id)
    w.add_eot_token_id(EOT_ID)
    w.add_add_bos_token(True)
    w.add_add_eos_token(add_eos)
    w.add_add_space_prefix(True)
    if chat_template is not None:
        w.add_chat_template(chat_template)

    for name, t in weights.items():
        _add_tensor(w, name, np.ascontiguousarray(t, dtype=np.float32), weight_type)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    parts = w.format_shard_names(path)
    return parts[0]


def _add_tensor(w, name: str, t: np.ndarray, weight_type: str) -> None:
    if weight_type == "F32" or t.ndim < 2:
        w.add_tensor(name, t)
        return
    qtype = gguf.GGMLQuantizationType[weight_type]
    w.add_tensor(name, gguf.quants.quantize(t, qtype), raw_dtype=qtype)


def _rope_sections(head_dim: int) -> list[int]:
    """qwen35's interleaved M-RoPE sections (t, h, w, e) over the head_dim / 2 rotated pairs: for
    text all four positions are equal, so they only need to be non-zero and add up."""
    half = head_dim // 2
    t = half - 2 * (half // 3)
    return [t, half // 3, half // 3, 0]


def with_nan_in(source: Path, path: Path, tensor: str, rows: slice = slice(None)) -> Path:
    """A copy of the F32 model `source` at `path` whose `tensor` holds NaN in `rows`: output_norm
    makes every logit NaN (as a computation that overflows does), rows of output the logits of
    those token ids alone."""
    path.write_bytes(source.read_bytes())
    reader = gguf.GGUFReader(path, "r+")
    (found,) = (t for t in reader.tensors if t.name == tensor)
    found.data[rows] = np.nan
    reader.data.flush()
    return path
