"""specllm's own caches (the auto policy's calibration, passed vocabulary checks, the fastest drafts),
all written through files.JsonCache: a damaged file is rebuilt, never a traceback; concurrent
writers lose nothing; entries of gone files are dropped."""

import json
import multiprocessing
import os

import pytest

import specllm
from specllm.engine import calibration
from specllm.engine.policy import CostTable
from specllm.files import file_identity
from specllm.llama import vocab as verdicts
from specllm.models import winners

GOOD = {"step_seconds": 0.02, "V": {"2": 1.5}}
DAMAGED = {
    "V is a list": {"step_seconds": 0.02, "V": []},
    "a step of no time": {"step_seconds": 0, "V": {"2": 1.5}},
    "a width of 0": {"step_seconds": 0.02, "V": {"0": 1.5}},
    "a negative step": {"step_seconds": -1.4, "V": {"2": 1.5}},
    "NaN": {"step_seconds": 0.02, "V": {"2": float("nan")}},
    "a string": {"step_seconds": "fast", "V": {"2": 1.5}},
    "measured at no time": {"step_seconds": 0.02, "V": {"2": 1.5}, "measured_at": 0},
    "measured at NaN": {"step_seconds": 0.02, "V": {"2": 1.5}, "measured_at": float("nan")},
    "not a table": [1, 2, 3],
    "a step of ages": {"step_seconds": 1e300, "V": {"2": 1.5}, "measured_at": 1e300},
    "a step of no measurable time": {"step_seconds": 1e-300, "V": {"2": 1.5}, "measured_at": 1e-300},
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


def test_a_draft_made_to_look_dear_by_a_damaged_entry_is_measured_again(tiny_models):
    """A draft's costs are corrected only by drafting, which auto never did with a draft whose
    step read 1e300 s: it went undrafted, its entry written back as it was, run after run."""
    engine = specllm.load(str(tiny_models.target), str(tiny_models.draft), n_ctx=256, n_threads=1)
    engine.generate("Hello world", max_tokens=4, temperature=0)
    engine.close()
    saved = json.loads(calibration.cache_path().read_text())
    engine = specllm.load(str(tiny_models.target), str(tiny_models.draft), n_ctx=256, n_threads=1)
    saved["models"][engine._draft_key()].update(step_seconds=1e300, measured_at=1e300)
    calibration.cache_path().write_text(json.dumps(saved))
    result = engine.generate("Hello world", max_tokens=8, temperature=0)
    assert result.stats.policy["calibration"]["measured"] == ["draft"]
    assert calibration.load_costs(engine._draft_key()).step_seconds < 1
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


def test_a_cache_folder_that_is_a_file_is_said_once_and_costs_nothing_else(tmp_path, monkeypatch, capsys):
    """SPECLLM_CACHE naming a file: nothing is kept, and every run calibrated again without a word."""
    (tmp_path / "afile").write_text("mine")
    monkeypatch.setenv("SPECLLM_CACHE", str(tmp_path / "afile"))
    for i in range(3):
        calibration.save_costs({f"key{i}": CostTable(0.01, {2: 1.5})})
    notes = capsys.readouterr().err.splitlines()
    assert notes == [
        f"specllm: note: cannot write specllm's cache in {tmp_path / 'afile'} (it is a file): "
        "what it measures is not kept, so later runs measure it again"
    ]
    assert (tmp_path / "afile").read_text() == "mine"


def test_a_file_above_the_cache_folder_is_named(tmp_path, monkeypatch, capsys):
    """XDG_CACHE_HOME naming a file (the cache is a folder under it): the note names the file,
    where it said "Not a directory" of a folder that does not exist."""
    (tmp_path / "afile").write_text("mine")
    monkeypatch.delenv("SPECLLM_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "afile"))
    calibration.save_costs({"key": CostTable(0.01, {2: 1.5})})
    assert capsys.readouterr().err.splitlines() == [
        f"specllm: note: cannot write specllm's cache in {tmp_path / 'afile' / 'specllm'} "
        f"({tmp_path / 'afile'} is a file): what it measures is not kept, so later runs measure it again"
    ]


@pytest.mark.parametrize("damage", ["a folder", "a symlink to nowhere"])
def test_a_cache_file_in_the_way_is_named_in_the_note(tmp_path, monkeypatch, capsys, damage):
    """The note named the folder ("cannot write specllm's cache in FOLDER (it is a folder, not a
    regular file)"), which was fine: it names the file in the way."""
    monkeypatch.setenv("SPECLLM_CACHE", str(tmp_path))
    if damage == "a folder":
        calibration.cache_path().mkdir()
    else:
        calibration.cache_path().symlink_to(tmp_path / "gone" / "calibration.json")
    calibration.save_costs({"key": CostTable(0.01, {2: 1.5})})
    (note,) = capsys.readouterr().err.splitlines()
    assert note.startswith(f"specllm: note: cannot write specllm's cache file {calibration.cache_path()} (")
    assert calibration.load_costs("key") is None


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


def test_entries_of_files_whose_paths_hold_a_bar_are_kept(tmp_path):
    """Keys are file identities joined by "|": split there, a model in a folder named "a | b"
    read as gone, and its costs and passed checks were dropped whenever another model's were
    written."""
    folder = tmp_path / "models | 2025"
    folder.mkdir()
    target, draft = _files(folder, "t.gguf", "d.gguf")
    (other,) = _files(tmp_path, "o.gguf")
    calibration.save_costs({f"{file_identity(target)}|x": CostTable(0.01, {})})
    calibration.save_costs({f"{file_identity(other)}|x": CostTable(0.02, {})})
    assert calibration.load_costs(f"{file_identity(target)}|x") is not None
    verdicts._CACHE.update({verdicts._pair_key(target, draft): True})
    verdicts._CACHE.update({verdicts._pair_key(other, draft): True})
    assert verdicts.known_compatible(target, draft)
    target.write_bytes(b"GGUF changed")  # and gone once it changes, as any other
    calibration.save_costs({f"{file_identity(other)}|x": CostTable(0.03, {})})
    verdicts._CACHE.update({verdicts._pair_key(other, draft): True})
    assert list(json.loads(calibration.cache_path().read_text())["models"]) == [f"{file_identity(other)}|x"]
    assert list(verdicts._CACHE.read()) == [verdicts._pair_key(other, draft)]


def _files(folder, *names):
    paths = [folder / name for name in names]
    for path in paths:
        path.write_bytes(b"GGUF " + path.name.encode())
    return paths


def _costs(folder):
    (model,) = _files(folder, "model.gguf")
    key = f"{file_identity(model)}|x"
    return (
        calibration.CACHE_FILE,
        lambda: calibration.save_costs({key: CostTable(0.01, {})}),
        lambda: calibration.load_costs(key) is not None,
    )


def _verdicts(folder):
    target, draft = _files(folder, "t.gguf", "d.gguf")
    pass_ = verdicts._pair_key(target, draft)
    return (
        verdicts.FILE_NAME,
        lambda: verdicts._CACHE.update({pass_: True}),
        lambda: verdicts.known_compatible(target, draft),
    )


def _winners(folder):
    target, draft = _files(folder, "t.gguf", "d.gguf")
    fastest = winners.Winner(str(draft), "d", 80.0, 1.25, 0.75, 4, 2)
    return winners.FILE_NAME, lambda: winners.remember(target, fastest), lambda: winners.remembered(target) == fastest


@pytest.mark.parametrize("cache", [_costs, _verdicts, _winners], ids=["calibration", "compatible", "best_drafts"])
@pytest.mark.parametrize("damage", ['{"cut short', "[1, 2]", '{"version": 1, "models": [], "compatible": 7}', "null"])
def test_each_cache_reads_a_damaged_file_as_empty_and_rebuilds_it(tmp_path, cache, damage):
    name, write, holds = cache(tmp_path)
    write()
    assert holds()
    path = calibration.cache_path().with_name(name)
    path.write_text(damage)
    assert not holds()
    write()
    assert holds()


def test_a_pair_is_dropped_once_either_of_its_files_changes(tmp_path):
    target, draft, other = _files(tmp_path, "t.gguf", "d.gguf", "o.gguf")
    verdicts._CACHE.update({verdicts._pair_key(target, draft): True})
    draft.write_bytes(b"GGUF another draft now")
    verdicts._CACHE.update({verdicts._pair_key(target, other): True})
    assert list(verdicts._CACHE.read()) == [verdicts._pair_key(target, other)]


@pytest.mark.parametrize("path", [5, None, ["d.gguf"]])
def test_a_remembered_draft_with_a_damaged_path_is_measured_again(tmp_path, path):
    """An entry whose fields are of the wrong type is damage, as a file cut short is."""
    import json

    name, write, holds = _winners(tmp_path)
    write()
    cache = calibration.cache_path().with_name(name)
    entries = json.loads(cache.read_text())
    for entry in entries.values():
        if isinstance(entry, dict) and "path" in entry:
            entry["path"] = path
    cache.write_text(json.dumps(entries))
    assert not holds()
    write()
    assert holds()


@pytest.mark.parametrize(
    "field, value",
    [("speedup", "1.5"), ("acceptance", None), ("tokens_per_second", True)]
    + [("gamma", 4.5), ("measured", []), ("name", 5)]
    + [("tokens_per_second", float("nan")), ("speedup", float("inf")), ("tokens_per_second", -80.0)]
    + [("acceptance", 7.5), ("acceptance", -0.5), ("gamma", -3), ("measured", 0)],
)
def test_a_remembered_draft_with_a_damaged_field_is_measured_again(tmp_path, field, value):
    """A run formats the winner's figures in the line that names its draft: a damaged one was a
    traceback in every run of the target; NaN and Infinity were printed by `models --drafts-for
    --json` as JSON no strict parser reads."""
    target, draft = _files(tmp_path, "t.gguf", "d.gguf")
    winners.remember(target, winners.Winner(str(draft), "d", 80.0, 1.25, 0.75, 4, 2))
    cache = calibration.cache_path().with_name(winners.FILE_NAME)
    entries = json.loads(cache.read_text())
    for entry in entries.values():
        entry[field] = value
    cache.write_text(json.dumps(entries))
    assert winners.remembered(target) is None


def test_a_draft_measured_over_rpc_is_remembered_apart_from_the_local_one(tmp_path):
    """Over RPC servers a target step costs more and another draft may win: that measurement must
    not replace the one made on this machine, nor be dropped as stale by the next write."""
    target, near, far = _files(tmp_path, "t.gguf", "near.gguf", "far.gguf")
    local = winners.Winner(str(near), "near", 80.0, 1.25, 0.75, 4, 2)
    remote = winners.Winner(str(far), "far", 20.0, 1.6, 0.7, 8, 2)
    servers = ("192.168.1.20:50052",)
    winners.remember(target, local)
    winners.remember(target, remote, rpc=servers)
    assert winners.remembered(target) == local and winners.remembered(target, rpc=servers) == remote
    assert winners.remembered(target, rpc=("192.168.1.21:50052",)) is None
    winners.remember(target, local)  # a later write keeps the other entry
    assert winners.remembered(target, rpc=servers) == remote
