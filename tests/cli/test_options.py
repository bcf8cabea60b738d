"""The CLI's shared options and the flag hints it adds to the library's typed errors."""

import re

import pytest

from specllm.cli.options import SAMPLER, LoadOptions, error_line
from specllm.engine.names import Drafter
from specllm.engine.sampling import SamplerSettings
from specllm.errors import (
    CannotTakeBack,
    ContextFull,
    DraftTooLong,
    NeedsDraftModel,
    NoMirror,
    NoMtpLayers,
    NotDownloaded,
    SpecllmError,
)


@pytest.mark.parametrize(
    "error,line",
    [
        (
            ContextFull(300, 256),
            "the prompt is 300 tokens but the context holds 256: raise --ctx-size or shorten the prompt",
        ),
        (
            NeedsDraftModel(),
            "drafter 'model' needs a draft model: give --draft or --pair, or use --drafter auto|mtp|ngram|none",
        ),
        (NeedsDraftModel("tiny"), "pair tiny has no draft model: use --drafter auto|mtp|ngram|none"),
        (
            NeedsDraftModel(none_fits="t.gguf"),
            "drafter 'model' needs a draft model, and none on disk fits t.gguf (`specllm models --drafts-for t.gguf` "
            "lists why): give --draft, or use --drafter auto|ngram|none",
        ),
        (
            NoMtpLayers("t.gguf"),
            "drafter 'mtp' needs a target with MTP layers (nextn), and t.gguf has none: "
            "use --drafter auto, ngram or model",
        ),
        (
            DraftTooLong(12, 8, "h.gguf", 2**20),
            "gamma (draft length) 12 is longer than the 8 recurrent-state snapshots h.gguf keeps to take back rejected "
            "tokens: use --gamma 8 or less, or --snapshots 12 (each snapshot costs 1.0 MB of memory)",
        ),
        (
            CannotTakeBack("cannot take them back: install llama-cpp-python 0.3.36 or later"),
            "cannot take them back: install llama-cpp-python 0.3.36 or later, or use --drafter none",
        ),
        (
            NotDownloaded("hf:org/repo/m.gguf"),
            "hf:org/repo/m.gguf is not downloaded yet, and offline mode is on (--offline or HF_HUB_OFFLINE)",
        ),
        (NoMirror("hf:org/repo/m.gguf"), "no mirror is known for hf:org/repo/m.gguf; use --source hub or auto"),
        (SpecllmError("no such file"), "no such file"),
    ],
)
def test_each_typed_error_gets_its_flag_hint_and_its_message_names_no_flag(error, line):
    assert error_line(error) == line
    # the library's own message is true for any caller: no flag, but for a whole `specllm ...` command
    assert "--" not in re.sub(r"`specllm [^`]*`", "", str(error))


def test_the_defaults_are_the_library_dataclasses():
    assert SamplerSettings() == SAMPLER
    assert LoadOptions().target_options().n_ctx == 4096


def test_load_options_picks_its_fields_from_a_commands_parameters():
    picked = LoadOptions.pick({"target": "t.gguf", "ctx_size": 512, "prompt": "hi", "verbose": True})
    assert (picked.target, picked.ctx_size, picked.verbose, picked.draft) == ("t.gguf", 512, True, None)


def test_drafter_names_compare_print_and_serialize_as_plain_strings():
    import json

    assert Drafter.AUTO == "auto" and f"{Drafter.NGRAM}" == "ngram" and str(Drafter.MODEL) == "model"
    assert json.dumps({"drafter": Drafter.MTP}) == '{"drafter": "mtp"}'
    assert [d.value for d in Drafter] == ["auto", "model", "mtp", "ngram", "none"]


def test_verbose_says_the_layers_go_to_the_rpc_servers(capsys):
    """With --rpc every layer is offloaded to the servers (rpc.md): -v said "GPU layers 0" on a
    machine without a GPU."""
    from specllm.cli.main import report_backend
    from specllm.llama.options import ModelOptions

    report_backend(1, ModelOptions(rpc="127.0.0.1:50052"))
    report_backend(1, ModelOptions(rpc="127.0.0.1:50052", n_gpu_layers=3))
    report_backend(1, ModelOptions(n_gpu_layers=0))
    lines = capsys.readouterr().err.splitlines()
    assert [line.rsplit(" · ", 1)[1] for line in lines] == [
        "GPU layers all (on the RPC servers)",
        "GPU layers 3 (on the RPC servers)",
        "GPU layers 0",
    ]


def test_a_deferred_draft_refused_for_memory_keeps_its_hint(tiny_models, monkeypatch):
    """The auto drafter (run's and chat's default) loads the draft when a reply first needs it:
    its context refused then named the --ctx-size that fits in neither the CLI's line nor the chat's."""
    import specllm
    from specllm.chat.repl import chat_hint
    from specllm.errors import DraftNotLoaded
    from specllm.llama import memory

    engine = specllm.load(str(tiny_models.target), str(tiny_models.draft), n_ctx=4096, n_threads=1, defer_draft=True)
    try:
        monkeypatch.setattr(memory, "available_memory", lambda: 2 * 2**20)  # after the target's context
        with pytest.raises(DraftNotLoaded) as refused:
            engine.generate("hi", max_tokens=2, drafter="model")
    finally:
        engine.close()
    fits = refused.value.cause.fits
    assert 0 < fits < 4096
    assert str(refused.value).startswith("a context of 4096 tokens for draft.gguf needs about")
    assert error_line(refused.value).endswith(
        f"(SPECLLM_NO_MEMORY_CHECK=1 skips this check): use --ctx-size {fits} or less"
    )
    assert chat_hint(refused.value) == f": start the chat with --ctx-size {fits} or less"
