"""Two small random-weight models with a real model's vocabulary, as target and draft: the loop's
host work per step on rows of a real vocabulary's size (the default pair's 151,936 tokens), with
llama.cpp's calls so short (about a millisecond) that the CPU's caches stay warm between them, as
they do while a GPU computes. The draft's weights differ from the target's, so it is rejected at
once: every step reads its draft rows and one or two of the target's.

    python benchmarks/random_pair.py SOURCE.gguf OUTDIR        # OUTDIR/target.gguf, OUTDIR/draft.gguf
    python benchmarks/overhead.py OUTDIR/target.gguf OUTDIR/draft.gguf --drafter model --gamma 4 -n 128
"""

import argparse
from pathlib import Path

import gguf
import numpy as np

N_EMBD, N_HEAD, N_FF = 64, 4, 128


def write_random_model(source: Path, dest: Path, seed: int = 0) -> Path:
    """A one-layer llama model with random F16 weights and `source`'s tokenizer, copied field by
    field (so it passes specllm's vocabulary check against `source`)."""
    reader = gguf.GGUFReader(source)
    n_vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    dest.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(dest, "llama")
    for add, value in (
        (writer.add_block_count, 1),
        (writer.add_context_length, 4096),
        (writer.add_embedding_length, N_EMBD),
        (writer.add_feed_forward_length, N_FF),
        (writer.add_head_count, N_HEAD),
        (writer.add_head_count_kv, N_HEAD),
        (writer.add_rope_dimension_count, N_EMBD // N_HEAD),
        (writer.add_layer_norm_rms_eps, 1e-5),
    ):
        add(value)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for field in reader.fields.values():
        if field.name.startswith("tokenizer."):
            sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(field.name, field.contents(), field.types[0], sub_type)
    rng = np.random.default_rng(seed)
    shapes = {
        "token_embd.weight": (n_vocab, N_EMBD),
        "output_norm.weight": (N_EMBD,),
        "output.weight": (n_vocab, N_EMBD),
        "blk.0.attn_norm.weight": (N_EMBD,),
        "blk.0.ffn_norm.weight": (N_EMBD,),
        **{f"blk.0.attn_{x}.weight": (N_EMBD, N_EMBD) for x in ("q", "k", "v", "output")},
        "blk.0.ffn_gate.weight": (N_FF, N_EMBD),
        "blk.0.ffn_up.weight": (N_FF, N_EMBD),
        "blk.0.ffn_down.weight": (N_EMBD, N_FF),
    }
    for name, shape in shapes.items():
        data = np.ones(shape) if name.endswith("norm.weight") else rng.standard_normal(shape) * 0.02
        writer.add_tensor(name, data.astype(np.float16 if len(shape) == 2 else np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", type=Path, help="a GGUF whose vocabulary the pair takes")
    ap.add_argument("out", type=Path, help="the folder for target.gguf and draft.gguf")
    args = ap.parse_args()
    for name, seed in (("target", 0), ("draft", 1)):
        print(write_random_model(args.source, args.out / f"{name}.gguf", seed))


if __name__ == "__main__":
    main()
