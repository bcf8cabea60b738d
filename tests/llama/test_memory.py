"""A context's memory, checked before llama.cpp allocates it: the estimate against the KV cache
llama.cpp reports, and a context too large for the memory available refused with what fits."""

import re

import pytest

import specllm
from specllm.errors import ContextTooLarge
from specllm.llama import log, memory
from specllm.llama.model import Model
from specllm.llama.options import CTX_STEP, ModelOptions


def llama_cpp_buffers(path, n_ctx, capsys) -> tuple[str | None, float]:
    """llama.cpp's own log of a context of n_ctx tokens: its KV cache size as it prints it (MiB,
    two decimals; None: no KV cache) and its CPU compute buffer in MiB; and the estimate's widths."""
    capsys.readouterr()
    log.set_verbose(True)
    try:
        model = Model(path, ModelOptions(n_ctx=n_ctx, n_threads=1))
    finally:
        log.set_verbose(False)
    widths = model._kv_widths
    model.close()
    text = capsys.readouterr().err
    kv = re.search(r"llama_kv_cache: size = +([0-9.]+) MiB", text)
    compute = re.search(r"CPU compute buffer size = +([0-9.]+) MiB", text)
    assert compute, text[-2000:]
    return (kv.group(1) if kv else None), float(compute.group(1)), widths


def mib(n_bytes: int) -> str:
    return f"{n_bytes / 2**20:.2f}"


@pytest.mark.parametrize("n_ctx", [256, 4096, 65536])
def test_the_kv_estimate_is_llama_cpps_kv_cache(tiny_models, tiny_recurrent_models, tmp_path, capsys, n_ctx):
    """Exactly the size llama.cpp allocates: an attention model, one with fewer KV heads than
    heads (GQA), and a hybrid (Qwen3.5: every second layer attention); a Mamba has none."""
    import tiny_models as tm

    gqa = tm.write_model(tmp_path / "gqa.gguf", seed=0, n_head=4, n_head_kv=2, n_layer=3)
    for path in (tiny_models.target, gqa, tiny_recurrent_models.qwen35):
        kv, _, widths = llama_cpp_buffers(path, n_ctx, capsys)
        assert kv == mib(memory.context_bytes(widths, n_ctx, 0, len(widths))), path.name
    kv, _, widths = llama_cpp_buffers(tiny_recurrent_models.mamba, n_ctx, capsys)
    assert (kv, widths) == (None, None)


def test_the_mask_estimate_is_the_compute_buffer_that_grows_with_the_context(tiny_models, capsys):
    """A tiny model's compute buffer is almost all attention mask: n_ctx x n_batch F16 values."""
    _, compute, widths = llama_cpp_buffers(tiny_models.target, 65536, capsys)
    mask = memory.context_bytes(widths, 65536, 512, len(widths)) - memory.context_bytes(widths, 65536, 0, len(widths))
    assert mask == 65536 * 512 * 2
    assert mask / 2**20 <= compute < mask / 2**20 + 2


def test_a_context_too_large_for_the_memory_available_is_refused_before_llama_cpp(tiny_models, monkeypatch):
    """With 64 MiB available, a 1M-token context of the tiny model (512 MiB of KV cache, 1 GiB of
    mask) is refused with the sizes and the largest context that fits, which then loads."""
    monkeypatch.setattr(memory, "available_memory", lambda: 64 * 2**20)
    with pytest.raises(ContextTooLarge) as refused:
        Model(tiny_models.target, ModelOptions(n_ctx=2**20, n_threads=1))
    error = refused.value
    assert (error.n_ctx, error.fits) == (2**20, 43520)  # x (512 + 1024) bytes: 63.75 MiB; 43776 tokens: over 64
    assert str(error) == (
        "a context of 1048576 tokens for target.gguf needs about 1.6 GB of memory (KV cache 536.9 MB, "
        "attention mask 1.1 GB), and 67.1 MB is available, enough for 43520 tokens "
        "(SPECLLM_NO_MEMORY_CHECK=1 skips this check)"
    )
    Model(tiny_models.target, ModelOptions(n_ctx=error.fits, n_threads=1)).close()


def test_the_check_can_be_skipped_and_knows_nothing_of_models_without_attention(
    tiny_models, tiny_recurrent_models, monkeypatch
):
    monkeypatch.setattr(memory, "available_memory", lambda: 64 * 2**20)
    Model(tiny_recurrent_models.mamba, ModelOptions(n_ctx=2**20, n_threads=1)).close()  # nothing grows
    monkeypatch.setenv(memory.SKIP_VARIABLE, "1")
    Model(tiny_models.target, ModelOptions(n_ctx=2**20, n_threads=1)).close()


def test_the_python_api_raises_a_specllm_error(tiny_models):
    """An absurd context with the real memory: one error a caller catches, never llama.cpp's."""
    with pytest.raises(specllm.SpecllmError, match=r"^a context of 2147483392 tokens for target.gguf needs about"):
        specllm.load(tiny_models.target, n_ctx=2**31 - CTX_STEP, n_threads=1)


def metadata(values: dict):
    return lambda key: values.get(key)


@pytest.mark.parametrize(
    "values, recurrent, widths",
    [
        # plain attention: n_head_kv x (key_length + value_length), key_length n_embd / n_head by default
        ({"block_count": "2", "embedding_length": "64", "attention.head_count": "4"}, False, (128, 128)),
        (
            {"block_count": "2", "embedding_length": "64", "attention.head_count": "8", "attention.head_count_kv": "2"},
            False,
            (32, 32),
        ),
        (
            {"block_count": "1", "embedding_length": "64", "attention.head_count": "4", "attention.key_length": "32",
             "attention.value_length": "16"},
            False,
            (192,),
        ),
        # a hybrid naming its attention layers by their KV heads (Granite 4, LFM2), or by an interval (Qwen3.5)
        (
            {"block_count": "4", "embedding_length": "64", "attention.head_count": "[4, 4, 4, 4]",
             "attention.head_count_kv": "[0, 2, 0, 2]"},
            True,
            (0, 64, 0, 64),
        ),
        (
            {"block_count": "4", "embedding_length": "64", "attention.head_count": "4", "full_attention_interval": "4"},
            True,
            (0, 0, 0, 128),
        ),
        # multi-head latent attention: K alone (key_length = kv_lora_rank + rope dimensions)
        (
            {"block_count": "2", "embedding_length": "64", "attention.head_count": "16", "attention.head_count_kv": "1",
             "attention.key_length": "576", "attention.value_length": "512", "attention.key_length_mla": "192"},
            False,
            (576, 576),
        ),
        # not enough said: no heads (Mamba), a layer count the arrays do not match
        ({"block_count": "2", "embedding_length": "64"}, True, None),
        ({"block_count": "3", "embedding_length": "64", "attention.head_count": "[4, 4]"}, False, None),
        ({"embedding_length": "64", "attention.head_count": "4"}, False, None),
    ],
)  # fmt: skip
def test_kv_widths_read_the_metadata_as_llama_cpp_does(values, recurrent, widths):
    meta = metadata({"general.architecture": "arch", **{f"arch.{key}": value for key, value in values.items()}})
    assert memory.kv_widths(meta, recurrent) == widths


def test_only_the_layers_left_on_the_cpu_count():
    widths = (100, 100, 100, 100)
    assert memory.context_bytes(widths, 1024, 512, 4) == 4 * 100 * 1024 * 2 + 1024 * 512 * 2
    assert memory.context_bytes(widths, 1024, 512, 1) == 100 * 1024 * 2 + 1024 * 512 * 2
    assert memory.context_bytes(widths, 1024, 512, 0) == 0  # every layer offloaded
    assert memory.context_bytes((0, 0), 1024, 512, 2) == 0  # no attention: no mask either


@pytest.mark.parametrize("available", [0, 10**6, 10**9, 123_456_789_012])
@pytest.mark.parametrize("n_batch", [512, 2**20])  # an embedding model's batch is its whole context
def test_the_largest_context_is_the_last_step_that_fits(available, n_batch):
    widths = (256, 0, 256)
    fits = memory.largest_context(widths, n_batch, 3, available)
    assert fits % CTX_STEP == 0
    assert fits == 0 or memory.context_bytes(widths, fits, n_batch, 3) <= available
    assert memory.context_bytes(widths, fits + CTX_STEP, n_batch, 3) > available


@pytest.mark.slow
def test_the_kv_estimate_of_the_real_default_pair(capsys):
    """Qwen2.5-Coder 1.5B and 0.5B, GQA with two KV heads: 112 and 48 MiB at 4096 tokens."""
    from specllm.models.hub import resolve_models

    target, draft, _ = resolve_models(progress=False)
    assert [llama_cpp_buffers(path, 4096, capsys)[0] for path in (target, draft)] == ["112.00", "48.00"]


GIB = 2**30


def machine(tmp_path, monkeypatch, *, meminfo: str, cgroup: str, groups: dict[str, dict[str, str]]):
    """A Linux machine's memory files under tmp_path: /proc/meminfo, /proc/self/cgroup and the
    cgroup folders (`groups`: a folder under the cgroup mount, its files' contents)."""
    (tmp_path / "meminfo").write_text(meminfo)
    (tmp_path / "cgroup").write_text(cgroup)
    for folder, files in groups.items():
        (tmp_path / "fs" / folder).mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (tmp_path / "fs" / folder / name).write_text(text)
    monkeypatch.setattr(memory.sys, "platform", "linux")
    monkeypatch.setattr(memory, "MEMINFO", tmp_path / "meminfo")
    monkeypatch.setattr(memory, "PROC_CGROUP", tmp_path / "cgroup")
    monkeypatch.setattr(memory, "CGROUP_ROOT", tmp_path / "fs")


MEMINFO = f"MemTotal:       {64 * GIB // 1024} kB\nMemFree:        1000 kB\nMemAvailable:   {20 * GIB // 1024} kB\n"
V1_UNLIMITED = {"memory.limit_in_bytes": "9223372036854771712\n", "memory.usage_in_bytes": f"{5 * GIB}\n"}


@pytest.mark.parametrize(
    "cgroup, groups, available",
    [
        # no limit: MemAvailable (cgroup v2's "max"; v1's largest int64)
        ("0::/user.slice\n", {"user.slice": {"memory.max": "max\n", "memory.current": "123\n"}}, 20 * GIB),
        ("4:memory:/user.slice\n0::/\n", {"memory/user.slice": V1_UNLIMITED}, 20 * GIB),
        # a container with cgroup v2 (its own group at the mount's root): the limit less what it holds,
        # its inactive file pages aside
        (
            "0::/\n",
            {".": {"memory.max": f"{4 * GIB}\n", "memory.current": f"{3 * GIB}\n",
                   "memory.stat": f"anon {2 * GIB}\ninactive_file {GIB // 2}\nactive_file 7\n"}},
            4 * GIB - (3 * GIB - GIB // 2),
        ),
        # a limit on a parent group (a systemd slice) binds its children too; the tightest room wins
        (
            "0::/app.slice/run.scope\n",
            {"app.slice": {"memory.max": f"{2 * GIB}\n", "memory.current": f"{GIB}\n"},
             "app.slice/run.scope": {"memory.max": f"{8 * GIB}\n", "memory.current": f"{GIB // 4}\n"}},
            GIB,
        ),
        # cgroup v1 in a container without a cgroup namespace: /proc names the host's path, which is
        # not under the mount; the limit is the mount's root's
        (
            "12:cpu,cpuacct:/docker/abc\n11:memory:/docker/abc\n0::/\n",
            {"memory": {"memory.limit_in_bytes": f"{3 * GIB}\n", "memory.usage_in_bytes": f"{GIB}\n",
                        "memory.stat": f"cache {GIB}\ntotal_inactive_file {GIB // 4}\n"}},
            3 * GIB - (GIB - GIB // 4),
        ),
        # more held than the limit (page cache charged late): no room, never a negative one
        ("0::/\n", {".": {"memory.max": f"{GIB}\n", "memory.current": f"{GIB + 4096}\n"}}, 0),
        # unreadable: MemAvailable alone
        ("0::/\n", {".": {"memory.max": "lots\n", "memory.current": "1\n"}}, 20 * GIB),
        ("garbage\n", {}, 20 * GIB),
    ],
)  # fmt: skip
def test_the_memory_available_is_the_tighter_of_memavailable_and_the_cgroup_limit(
    tmp_path, monkeypatch, cgroup, groups, available
):
    machine(tmp_path, monkeypatch, meminfo=MEMINFO, cgroup=cgroup, groups=groups)
    assert memory.available_memory() == available


def test_without_memavailable_the_cgroup_limit_alone_is_known(tmp_path, monkeypatch):
    """A kernel before 3.14 has no MemAvailable: the check then knows a container's limit, or nothing."""
    old_kernel = "MemTotal:       1000 kB\nMemFree:        1000 kB\n"
    limited = {".": {"memory.max": f"{GIB}\n", "memory.current": "0\n"}}
    machine(tmp_path, monkeypatch, meminfo=old_kernel, cgroup="0::/\n", groups=limited)
    assert memory.available_memory() == GIB
    machine(tmp_path, monkeypatch, meminfo=old_kernel, cgroup="0::/\n", groups={".": {"memory.max": "max\n"}})
    assert memory.available_memory() is None


def test_a_context_beyond_the_containers_limit_is_refused(tiny_models, tmp_path, monkeypatch):
    """20 GiB available to the machine, 64 MiB left to the container: the container's room decides."""
    limited = {".": {"memory.max": f"{GIB}\n", "memory.current": f"{GIB - 64 * 2**20}\n"}}
    machine(tmp_path, monkeypatch, meminfo=MEMINFO, cgroup="0::/\n", groups=limited)
    with pytest.raises(ContextTooLarge) as refused:
        Model(tiny_models.target, ModelOptions(n_ctx=2**20, n_threads=1))
    assert refused.value.fits == 43520  # as with 64 MiB available (the test above)


@pytest.mark.parametrize("arch", ["bert", "nomic-bert"])
def test_an_encoder_has_no_kv_cache_only_its_mask(tmp_path, monkeypatch, capsys, arch):
    """llama.cpp gives a BERT no KV cache: its context's memory is the mask over one micro-batch
    (here the whole context, 4096 x 4096 F16: 32 MiB), so 33 MiB available is enough (the KV
    cache a decoder of its shape would have, 2 MiB more, is not asked for)."""
    import tiny_models as tm

    from specllm.llama.embeddings import open_embedding_model

    path = tm.write_model(tmp_path / f"{arch}.gguf", arch=arch, seed=0, n_ctx_train=8192, pooling_type=1)
    monkeypatch.setattr(memory, "available_memory", lambda: 33 * 2**20)
    capsys.readouterr()
    log.set_verbose(True)
    try:
        model = open_embedding_model(path, ModelOptions(n_ctx=4096, n_threads=1))
    finally:
        log.set_verbose(False)
    model.close()
    text = capsys.readouterr().err
    assert "llama_kv_cache: size" not in text
    compute = float(re.search(r"CPU compute buffer size = +([0-9.]+) MiB", text).group(1))
    mask = memory.context_bytes(model._kv_widths, 4096, 4096, 2, kv_cache=False)
    assert mask == 4096 * 4096 * 2
    assert mask / 2**20 <= compute < mask / 2**20 + 12  # and 4096 tokens x 64 values of activations
    monkeypatch.setattr(memory, "available_memory", lambda: 31 * 2**20)
    with pytest.raises(ContextTooLarge, match=r"KV cache 0 B, attention mask 33\.6 MB\), and 32\.5 MB is available"):
        open_embedding_model(path, ModelOptions(n_ctx=4096, n_threads=1))


def test_without_a_kv_cache_the_mask_is_one_micro_batch_square():
    """A BERT of 128 positions: a context of 256 tokens, micro-batches of 128."""
    assert memory.context_bytes((64, 64), 256, 128, 2, kv_cache=False) == 128 * 128 * 2
    assert memory.context_bytes((64, 64), 256, 128, 2) == 2 * 64 * 256 * 2 + 256 * 128 * 2
