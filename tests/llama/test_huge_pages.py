"""Weights read into huge-page memory (huge_pages.weights_on_huge_pages): when it applies, that the
advice reaches the kernel, and that the model computes exactly what the memory-mapped one does."""

import mmap
import sys
from pathlib import Path

import numpy as np
import pytest

from specllm.engine import calibration
from specllm.llama import huge_pages, log
from specllm.llama import model as llama_model
from specllm.llama.model import Model
from specllm.llama.options import ModelOptions

linux_with_thp = pytest.mark.skipif(
    sys.platform != "linux" or huge_pages.thp_mode() in (None, "never"),
    reason="transparent huge pages are a Linux feature, switched on here",
)

MAPS = """\
55d0c0a00000-55d0c0a21000 r--p 00000000 08:01 1234   /usr/bin/python3.11
55d0c1e00000-55d0c5e00000 rw-p 00000000 00:00 0      [heap]
7f0000000000-7f0040000000 rw-p 00000000 00:00 0
7f0040000000-7f0041000000 r--p 00000000 00:00 0
7f0041000000-7f0042000000 rw-s 00000000 00:05 77     /dev/shm/x
7f0042000000-7f0043000000 rw-p 00001000 08:01 999    /models/target.gguf
"""


def test_only_private_writable_anonymous_mappings_are_listed():
    # the heap has a name, the r--p one is read-only, rw-s is shared, the last one is a file
    assert huge_pages._anonymous_mappings(MAPS) == [(0x7F0000000000, 0x7F0040000000)]


@linux_with_thp
def test_a_cpu_model_that_fits_goes_on_huge_pages(tiny_models, monkeypatch):
    assert huge_pages.weights_on_huge_pages(tiny_models.target, n_gpu_layers=0)
    assert not huge_pages.weights_on_huge_pages(tiny_models.target, n_gpu_layers=1)  # its weights are the GPU's
    size = tiny_models.target.stat().st_size
    monkeypatch.setattr(huge_pages, "_available_memory", lambda: int(size / huge_pages.HUGE_PAGE_RAM_SHARE) - 1)
    assert not huge_pages.weights_on_huge_pages(tiny_models.target, n_gpu_layers=0)  # a copy would not fit
    monkeypatch.setattr(huge_pages, "_available_memory", lambda: None)
    assert not huge_pages.weights_on_huge_pages(tiny_models.target, n_gpu_layers=0)


@linux_with_thp
def test_advice_marks_large_anonymous_mappings_and_keeps_their_content():
    size = 2 * huge_pages.HUGE_PAGE_REGION_MIN
    region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    region[:5] = b"hello"
    start = np.frombuffer(region, dtype=np.uint8).ctypes.data
    assert huge_pages.advise_huge_pages() >= size
    assert region[:5] == b"hello"
    assert "hg" in _vm_flags(start)  # VM_HUGEPAGE: the kernel took the advice
    region.close()


def _vm_flags(address: int) -> list[str]:
    """The VmFlags of the mapping that holds `address`, from /proc/self/smaps."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        first = line.split()[0]
        if "-" in first and ":" not in first:
            lo, hi = (int(x, 16) for x in first.split("-"))
            inside = lo <= address < hi
        elif inside and line.startswith("VmFlags:"):
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


def test_weights_read_into_memory_compute_what_mapped_weights_do(tiny_models, monkeypatch):
    prompt = "def add(a, b): return a + b"
    read = Model(tiny_models.target, ModelOptions(n_ctx=256, n_threads=1))
    expected_read = sys.platform == "linux" and huge_pages.thp_mode() not in (None, "never")
    assert huge_pages.weights_on_huge_pages(tiny_models.target, 0) == expected_read
    logits_read = read.eval(read.tokenize(prompt), 4).copy()
    read.close()
    monkeypatch.setattr(huge_pages, "weights_on_huge_pages", lambda path, n_gpu_layers: False)
    mapped = Model(tiny_models.target, ModelOptions(n_ctx=256, n_threads=1))
    logits_mapped = mapped.eval(mapped.tokenize(prompt), 4).copy()
    mapped.close()
    np.testing.assert_array_equal(logits_read, logits_mapped)


@linux_with_thp
def test_a_binding_without_load_modes_reads_the_weights_with_use_mmap_off(tiny_models, monkeypatch):
    # llama-cpp-python before 0.3.35 says "read, do not map" with use_mmap: it has no load_mode
    prompt = "def add(a, b): return a + b"
    current = Model(tiny_models.target, ModelOptions(n_ctx=256, n_threads=1))
    expected = current.eval(current.tokenize(prompt), 4).copy()
    current.close()
    monkeypatch.delattr(llama_model.L, "LLAMA_LOAD_MODE_NONE")
    loads = []
    load = llama_model.L.llama_model_load_from_file
    monkeypatch.setattr(llama_model.L, "llama_model_load_from_file", lambda *a: loads.append(a[1]) or load(*a))
    older = Model(tiny_models.target, ModelOptions(n_ctx=256, n_threads=1))
    assert older.on_huge_pages and loads[0].use_mmap is False
    np.testing.assert_array_equal(older.eval(older.tokenize(prompt), 4), expected)
    older.close()


def test_calibration_is_cached_apart_for_weights_on_huge_pages(tiny_models):
    # the same file, threads and GPU layers cost less per call on huge pages: a cached table of
    # mapped weights must not price a model whose weights are read in, or the other way round
    options = ModelOptions(n_threads=1)
    on, off = (calibration.model_key(tiny_models.target, options, huge) for huge in (True, False))
    assert on != off
    model = Model(tiny_models.target, ModelOptions(n_ctx=256, n_threads=1))
    assert calibration.model_key(tiny_models.target, options) == (on if model.on_huge_pages else off)
    model.close()


@linux_with_thp
def test_ctrl_c_while_loading_is_an_interrupt_not_a_bad_file(tiny_models, monkeypatch):
    # Ctrl-C lands while the load callback runs Python code: ctypes would only report it and
    # abort the load, which would read as "cannot load ...: truncated, corrupt or unsupported"
    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(huge_pages, "advise_huge_pages", interrupted)
    with pytest.raises(KeyboardInterrupt):
        Model(tiny_models.target, ModelOptions(n_ctx=256, n_threads=1))


class _RaisingStream:
    """A stderr whose writes are interrupted: what a Ctrl-C landing in llama.cpp's log callback
    looks like to that callback."""

    def write(self, _text):
        raise KeyboardInterrupt

    def flush(self):
        pass


def test_ctrl_c_while_a_context_is_created_is_an_interrupt(tiny_models, monkeypatch):
    model = Model(tiny_models.target, ModelOptions(n_ctx=256, n_threads=1))
    monkeypatch.setattr(log, "_verbose", True)  # the log callback writes every line
    monkeypatch.setattr(log.sys, "stderr", _RaisingStream())
    with pytest.raises(KeyboardInterrupt):
        model.sibling()
    monkeypatch.undo()
    model.close()
