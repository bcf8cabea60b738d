"""specllm's own caches (the auto policy's calibration, passed vocabulary checks): a damaged file is
rebuilt, never a traceback; concurrent writers lose nothing; entries of gone files are dropped."""

import json
import multiprocessing
import os

import pytest

import specllm
from specllm.engine import calibration
from specllm.engine.policy import CostTable
from specllm.files import file_identity
from specllm.llama import vocab as verdicts

GOOD = {"step_seconds": 0.02, "V": {"2": 1.5}}
DAMAGED = {
    "V is a list": {"step_seconds": 0.02, "V": []},
    "a step of no time": {"step_seconds": 0, "V": {"2": 1.5}},
    "a width of 0": {"step_seconds": 0.02, "V": {"0": 1.5}},
    "a negative step": {"step_seconds": -1.4, "V": {"2": 1.5}},
    "NaN": {"step_seconds": 0.02, "V": {"2": float("nan")}},
    "a string": {"step_seconds": "fast", "V": {"2": 1.5}},
    "not a table": [1, 2, 3],
}


@pytest.mark.parametrize("case", DAMAGED)
def test_a_damaged_cost_entry_is_measured_again(tiny_models, case):
    engine = specllm.load(str(tiny_models.target), n_ctx=256, n_threads=1)
    key = engine._key(engine.target)
    calibration.cache_path().parent.mkdir(parents=True, exist_ok=True)
    calibration.cache_path().write_text(json.dumps({"version": 1, "models": {key: DAMAGED[case]}}))
    result = engine.generate("Hello world", max_tokens=8, temperature=0)
    assert result.stats.policy["calibration"]["measured"] == ["target"]
    assert calibration.load_costs(key).step_seconds > 0  # written back whole
    engine.close()


def test_a_cache_nested_too_deeply_to_parse_is_rebuilt(tiny_models):
    deep = "[" * 100_000 + "]" * 100_000
    calibration.cache_path().parent.mkdir(parents=True, exist_ok=True)
    calibration.cache_path().write_text(deep)
    (calibration.cache_path().parent / verdicts.FILE_NAME).write_text(deep)
    engine = specllm.load(str(tiny_models.target), str(tiny_models.draft), n_ctx=256, n_threads=1)
    assert engine.generate("Hello world", max_tokens=8, temperature=0).stats.policy["calibration"]["measured"]
    engine.close()
    assert verdicts.known_compatible(tiny_models.target, tiny_models.draft)


def test_costs_that_cannot_be_read_back_are_refused():
    for entry in DAMAGED.values():
        with pytest.raises((ValueError, TypeError, KeyError, AttributeError)):
            CostTable.from_dict(entry)
    assert CostTable.from_dict(GOOD).V == {2: 1.5}


def _save_many(folder, files, tag):
    os.environ["SPECLLM_CACHE"] = folder
    for i, path in enumerate(files):
        calibration.save_costs({f"{file_identity(path)}|{tag}": CostTable(0.01 + i * 1e-5, {2: 1.5})})


def test_two_processes_saving_at_once_keep_every_entry(tmp_path):
    files = []
    for i in range(120):
        files.append(tmp_path / f"model{i}.gguf")
        files[-1].write_bytes(b"GGUF")
    folder = str(tmp_path / "cache")
    context = multiprocessing.get_context("spawn")
    writers = [context.Process(target=_save_many, args=(folder, files, tag)) for tag in ("a", "b")]
    for w in writers:
        w.start()
    for w in writers:
        w.join(120)
        assert w.exitcode == 0
    saved = json.loads((tmp_path / "cache" / calibration.CACHE_FILE).read_text())["models"]
    assert len(saved) == 240


def test_entries_of_files_that_are_gone_are_dropped_and_temp_files_of_killed_writers_removed(tmp_path):
    kept, gone = tmp_path / "kept.gguf", tmp_path / "gone.gguf"
    kept.write_bytes(b"GGUF")
    gone.write_bytes(b"GGUF")
    calibration.save_costs({f"{file_identity(gone)}|x": CostTable(0.01, {})})
    stale = calibration.cache_path().with_name(f".{calibration.CACHE_FILE}.999999.tmp")
    stale.write_text("half a cache")
    gone.unlink()
    calibration.save_costs({f"{file_identity(kept)}|x": CostTable(0.01, {})})
    saved = json.loads(calibration.cache_path().read_text())["models"]
    assert list(saved) == [f"{file_identity(kept)}|x"]
    assert not stale.exists()
