"""Durable atomic outputs: content is on disk before its name, and a replaced folder is never missing."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from qgmem_train import fileio
from qgmem_train.graph.local_graph import LocalGraph
from qgmem_train.trajectory import TrajectoryExample, read_trajectory_dataset, write_trajectory_dataset


def example(case: str, answer: str) -> TrajectoryExample:
    graph = LocalGraph(node_labels=["Alice", "Paris"], edge_src=[0], edge_dst=[1], edge_labels=["moved to"], edge_unit_labels=["F1"])
    return TrajectoryExample(
        case_id=case, question_id=f"{case}/q0", source_dataset="convomem/user_evidence", namespace=case,
        question="Where does Alice live?", question_time="", context="[F1] Alice | moved to | Paris",
        answer=answer, reasoning_path="F1", graph=graph, unit_ids=["u1"],
    )  # fmt: skip


def _record_syncs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Log ("fsync", inode) and ("replace", inode of the source) in call order."""
    events: list[tuple[str, int]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append(("fsync", os.fstat(fd).st_ino))
        real_fsync(fd)

    def replace(src, dst) -> None:
        events.append(("replace", os.stat(src).st_ino))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return events


def test_a_file_is_flushed_before_its_rename_and_the_folder_after(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "out" / "report.json"
    events = _record_syncs(monkeypatch)
    fileio.write_json_atomic(target, {"a": 1})
    file_inode, folder_inode = target.stat().st_ino, target.parent.stat().st_ino
    replaced = events.index(("replace", file_inode))
    assert ("fsync", file_inode) in events[:replaced]
    assert ("fsync", folder_inode) in events[replaced + 1 :]
    assert target.read_text() == '{\n  "a": 1\n}\n'


def _watch_dataset(path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """After every rename or folder removal, note it when ``path`` holds no complete dataset."""
    gaps: list[str] = []
    real_replace, real_rmtree = os.replace, shutil.rmtree

    def check(step: str) -> None:
        if not (path / "dataset_dict.json").exists():
            gaps.append(step)

    def replace(src, dst) -> None:
        real_replace(src, dst)
        check(f"replace {Path(src).name} -> {Path(dst).name}")

    def rmtree(target, *args, **kwargs) -> None:
        real_rmtree(target, *args, **kwargs)
        check(f"rmtree {Path(target).name}")

    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(shutil, "rmtree", rmtree)
    return gaps


def test_replacing_a_trajectory_dataset_never_leaves_the_path_without_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "dataset"
    write_trajectory_dataset({"train": [example("c1", "Paris")]}, path)
    gaps = _watch_dataset(path, monkeypatch)
    write_trajectory_dataset({"train": [example("c1", "Lyon")], "test": [example("c2", "Nice")]}, path)
    assert gaps == []
    loaded = read_trajectory_dataset(path)
    assert [ex.answer for ex in loaded["train"]] == ["Lyon"] and [ex.answer for ex in loaded["test"]] == ["Nice"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dataset"]


def test_without_an_atomic_swap_the_old_folder_goes_only_after_the_new_one_is_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "dataset"
    write_trajectory_dataset({"train": [example("c1", "Paris")]}, path)
    monkeypatch.setattr(fileio, "_exchange", lambda a, b: False)
    write_trajectory_dataset({"train": [example("c1", "Lyon")]}, path)
    assert [ex.answer for ex in read_trajectory_dataset(path)["train"]] == ["Lyon"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dataset"]

    real_replace, failed = os.replace, []

    def fail_to_move_in(src, dst) -> None:
        if Path(dst) == path and not failed:
            failed.append(src)
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", fail_to_move_in)
    with pytest.raises(OSError, match="No space left"):
        write_trajectory_dataset({"train": [example("c1", "Nice")]}, path)
    monkeypatch.setattr(os, "replace", real_replace)
    assert [ex.answer for ex in read_trajectory_dataset(path)["train"]] == ["Lyon"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dataset"]


def test_a_cached_folder_is_written_once_and_a_failed_write_leaves_nothing(tmp_path: Path) -> None:
    final = tmp_path / "cache" / "derived"
    calls: list[Path] = []

    def write(staging: Path) -> None:
        calls.append(staging)
        (staging / "out.txt").write_text("done")

    assert fileio.publish_folder_once(final, write) == final and (final / "out.txt").read_text() == "done"
    assert fileio.publish_folder_once(final, write) == final and len(calls) == 1 and not calls[0].exists()

    def fail(staging: Path) -> None:
        (staging / "half.txt").write_text("half")
        raise RuntimeError("export failed")

    with pytest.raises(RuntimeError, match="export failed"):
        fileio.publish_folder_once(tmp_path / "cache" / "other", fail)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["derived"]



def test_a_cached_folder_written_under_a_group_writable_umask_is_still_used(tmp_path: Path) -> None:
    """Entries others can write are written again, so the writer seals what it publishes whatever the umask."""
    final = tmp_path / "cache" / "derived"
    calls: list[Path] = []

    def write(staging: Path) -> None:
        calls.append(staging)
        (staging / "sub").mkdir()
        (staging / "sub" / "out.txt").write_text("done")

    previous = os.umask(0o002)
    try:
        fileio.publish_folder_once(final, write)
        fileio.publish_folder_once(final, write)
    finally:
        os.umask(previous)
    assert len(calls) == 1 and fileio.trusted_cache_entry(final)

def test_a_set_of_checksums_has_one_short_digest_over_its_sha256sum_listing(tmp_path: Path) -> None:
    import hashlib

    from qgmem_train.fileio import checksums_digest, file_sha256

    (tmp_path / "a.json").write_text("{}")
    (tmp_path / "b.bin").write_bytes(b"\0" * 10)
    sums = {name: file_sha256(tmp_path / name) for name in ("a.json", "b.bin")}
    listing = f"{sums['a.json']}  a.json\n{sums['b.bin']}  b.bin\n"
    assert checksums_digest(sums) == hashlib.sha256(listing.encode()).hexdigest()[:16]
    assert checksums_digest({**sums, "b.bin": file_sha256(tmp_path / "a.json")}) != checksums_digest(sums)
