"""Loaders of every dataset on the committed samples, and one clear error naming file, record and field.

Bad input through ``python -m qgmem_train build`` is checked to end in exit code 2 and one stderr line.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from qgmem_train.__main__ import main
from qgmem_train.errors import InputError
from qgmem_train.memory.loaders import load_conversations, load_convomem, load_locomo
from qgmem_train.memory.store import MemoryStore
from qgmem_train.memory.windows import annotated_content, session_windows

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "samples"


def test_locomo_sample_keeps_ids_and_session_dates() -> None:
    (conv,) = load_conversations("locomo", SAMPLES / "locomo_sample.json")
    assert conv.id == "conv-26"
    assert [s.id for s in conv.sessions] == ["session_1", "session_2", "session_3", "session_4"]
    assert conv.sessions[0].time == "2023-05-08T13:56:00"
    assert conv.sessions[0].turns[2].id == "D1:3" and conv.sessions[0].turns[2].speaker == "Caroline"


def test_beam_folder_loads_every_chat_with_batch_dates_and_message_ids() -> None:
    convs = load_conversations("beam", SAMPLES / "beam")
    assert [c.id for c in convs] == ["beam-1", "beam-2"]
    first = convs[0].sessions[0]
    assert first.time == "2024-03-15" and first.turns[0].id == "0" and first.turns[0].speaker == "user"
    assert load_conversations("beam", SAMPLES / "beam" / "1" / "chat.json", ["beam-1"])[0].id == "beam-1"


def test_convomem_reads_both_case_layouts() -> None:
    convs = {c.id: c for c in load_conversations("convomem", SAMPLES / "convomem")}
    assert {"basic_facts_0", "temporal_0", "evidence_items_multi_session_1-0", "evidence_items_multi_session_1-1"} == set(convs)
    case = convs["basic_facts_0"]
    assert [s.id for s in case.sessions] == ["locomo_0_session_1", "locomo_0_session_2", "locomo_0_session_3"]
    assert all(s.time is None for s in case.sessions)
    assert case.sessions[0].turns[0].id == "locomo_0_session_1:1"


def test_plain_format_sample() -> None:
    (conv,) = load_conversations("jsonl", SAMPLES / "plain_chat.jsonl")
    assert conv.id == "alex" and [s.time for s in conv.sessions] == ["2024-03-02T18:30:00", "2024-04-15"]


def test_windows_step_and_overlap_marking() -> None:
    (conv,) = load_conversations("locomo", SAMPLES / "locomo_sample.json")
    session = conv.sessions[0]  # 18 turns
    windows = session_windows(session, window=6, overlap=2)
    assert [len(w.new) for w in windows] == [6, 4, 4, 4]
    assert [len(w.overlap) for w in windows] == [0, 2, 2, 2]
    assert windows[1].turn_ids == [f"D1:{i}" for i in range(5, 11)]
    text = annotated_content(windows[1], session.time)
    new_part, overlap_part = text.split("OVERLAP_FROM_PREVIOUS_WINDOW")
    assert new_part.startswith("NEW_IN_THIS_WINDOW\n[D1:7] time: 2023-05-08T13:56:00 Caroline:")
    assert "[D1:5]" in overlap_part and "[D1:5]" not in new_part


def _write(tmp_path: Path, name: str, data: object) -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return path


def _locomo_bad(tmp_path: Path) -> Path:
    data = json.loads((SAMPLES / "locomo_sample.json").read_text())
    del data[0]["conversation"]["session_2"][3]["speaker"]
    return _write(tmp_path, "locomo.json", data)


def _beam_bad(tmp_path: Path) -> Path:
    data = json.loads((SAMPLES / "beam" / "1" / "chat.json").read_text())
    data[1]["turns"][0][1]["content"] = 42
    return _write(tmp_path, "7/chat.json", data)


def _convomem_bad(tmp_path: Path) -> Path:
    data = json.loads((SAMPLES / "convomem" / "evidence_items_multi_session_1.json").read_text())
    del data["evidence_items"][1]["conversations"][0]["messages"][2]["text"]
    return _write(tmp_path, "case.json", data)


def _plain_bad(tmp_path: Path) -> Path:
    good = (SAMPLES / "plain_chat.jsonl").read_text().strip()
    bad = json.loads(good)
    bad["id"] = "bo"
    bad["sessions"][1]["time"] = "sometime in spring"
    return _write(tmp_path, "chats.jsonl", good + "\n" + json.dumps(bad) + "\n")


@pytest.mark.parametrize(
    ("dataset", "make", "expected"),
    [
        ("locomo", _locomo_bad, "locomo.json: sample conv-26.conversation.session_2[3].speaker: missing field"),
        ("beam", _beam_bad, "chat.json: batch 1.turns[0][1].content: expected str, got int"),
        ("convomem", _convomem_bad, "case.json: evidence_items[1].conversations[0].messages[2].text: missing field"),
        ("jsonl", _plain_bad, "chats.jsonl: line 2 (bo).sessions[1].time: unrecognised date 'sometime in spring'"),
    ],
)
def test_bad_record_names_file_record_and_field(tmp_path: Path, dataset: str, make, expected: str) -> None:
    with pytest.raises(InputError) as info:
        load_conversations(dataset, make(tmp_path))
    assert str(info.value).endswith(expected)


@pytest.mark.parametrize(
    ("dataset", "name", "content", "expected"),
    [
        ("locomo", "chat.json", "{not json", "chat.json: not valid JSON"),
        ("beam", "chat.json", "{not json", "chat.json: not valid JSON"),
        ("convomem", "chat.json", "{not json", "chat.json: not valid JSON"),
        ("jsonl", "chat.json", "{not json", "chat.json: not valid JSON"),
        ("jsonl", "chat.jsonl", (SAMPLES / "plain_chat.jsonl").read_text().strip() + "\n{not json\n", "chat.jsonl: line 2: not valid JSON"),
    ],
)
def test_unreadable_json_is_an_input_error(tmp_path: Path, dataset: str, name: str, content: str, expected: str) -> None:
    path = _write(tmp_path, name, content)
    with pytest.raises(InputError, match=expected):
        load_conversations(dataset, path)


def test_jsonl_lines_are_split_on_newlines_only(tmp_path: Path) -> None:
    record = json.loads((SAMPLES / "plain_chat.jsonl").read_text())
    record["sessions"][0]["turns"][0]["text"] = "Biscuit\u2028naps\x85a lot"
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps(record, ensure_ascii=False) + "\r\n", encoding="utf-8")
    (conv,) = load_conversations("jsonl", path)
    assert conv.sessions[0].turns[0].text == "Biscuit\u2028naps\x85a lot"


def _cli_error(args: list[str], capsys) -> str:
    """Run ``python -m qgmem_train build`` in process; expects exit code 2 and returns its one stderr line."""
    assert main(["build", *args, "--units", "turns"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err
    return err


def test_bad_utf8_in_jsonl_names_the_line(tmp_path: Path, capsys) -> None:
    good = (SAMPLES / "plain_chat.jsonl").read_bytes().strip()
    path = tmp_path / "chats.jsonl"
    path.write_bytes(good + b"\n" + good.replace(b"Biscuit", "Bisc\u00fcit".encode("latin-1"), 1) + b"\n")
    err = _cli_error(["--dataset", "jsonl", "--input", str(path), "--store", str(tmp_path / "store")], capsys)
    assert f"{path}: line 2: not valid UTF-8" in err
    assert not (tmp_path / "store").exists()


def test_bad_utf8_in_json_names_the_file(tmp_path: Path, capsys) -> None:
    path = tmp_path / "locomo.json"
    path.write_bytes((SAMPLES / "locomo_sample.json").read_bytes().replace(b"Caroline", "Carol\u00efne".encode("latin-1"), 1))
    err = _cli_error(["--dataset", "locomo", "--input", str(path), "--store", str(tmp_path / "store")], capsys)
    assert f"{path}: line " in err and "not valid UTF-8" in err


def test_a_folder_where_a_file_is_expected(tmp_path: Path, capsys) -> None:
    (tmp_path / "chats.jsonl").mkdir()
    err = _cli_error(["--dataset", "jsonl", "--input", str(tmp_path / "chats.jsonl"), "--store", str(tmp_path / "store")], capsys)
    assert err.endswith("chats.jsonl: expected a file, got a folder")


def test_an_input_without_read_permission() -> None:
    """As root, where permissions do not block reads, the CLI runs as the unprivileged ``nobody`` (util-linux setpriv)."""
    drop: list[str] = []
    if os.geteuid() == 0:
        nobody = _user("nobody")
        if shutil.which("setpriv") is None or nobody is None:
            pytest.skip("running as root, where file permissions do not block reads, with no setpriv and 'nobody' user to run as")
        drop = ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups"]
    folder = Path(tempfile.mkdtemp(prefix="qgmem-unreadable-"))  # under the system temp folder, which every user can traverse
    try:
        folder.chmod(0o755)
        path = folder / "chats.jsonl"
        shutil.copy(SAMPLES / "plain_chat.jsonl", path)
        path.chmod(0)
        command = [*drop, sys.executable, "-m", "qgmem_train", "build", "--dataset", "jsonl", "--input", str(path), "--store", str(folder / "store"), "--units", "turns"]
        result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "HOME": str(folder)}, timeout=300)
    finally:
        shutil.rmtree(folder)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip() == f"error: {path}: cannot read: Permission denied"


def _user(name: str) -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        return None


def test_session_times_with_a_zone_or_fraction_keep_the_wall_clock_time(tmp_path: Path, capsys) -> None:
    record = json.loads((SAMPLES / "plain_chat.jsonl").read_text())
    record["sessions"][0]["time"] = "2024-03-02T18:30:00.250+02:00"
    record["sessions"][1]["time"] = "2024-04-15T23:45:10Z"
    path = tmp_path / "chats.jsonl"
    path.write_text(json.dumps(record) + "\n")
    (conv,) = load_conversations("jsonl", path)
    assert [s.time for s in conv.sessions] == ["2024-03-02T18:30:00", "2024-04-15T23:45:10"]
    config = tmp_path / "cfg.yaml"
    config.write_text("pipeline:\n  construction:\n    traces: false\n")
    store = tmp_path / "store"
    assert main(["build", "--dataset", "jsonl", "--input", str(path), "--store", str(store), "--units", "turns", "--config", str(config)]) == 0
    assert "units 7 (7 new)" in capsys.readouterr().out
    with MemoryStore.open(store) as opened:
        times = {u.session_id: u.utterance_time for u in opened.load_namespace("alex").units}
    assert times == {"s1": "2024-03-02T18:30:00", "s2": "2024-04-15T23:45:10"}


def test_duplicate_turn_ids_and_unknown_conversation_are_input_errors(tmp_path: Path) -> None:
    record = {"id": "c", "sessions": [{"turns": [{"id": 1, "speaker": "a", "text": "x"}, {"id": 1, "speaker": "b", "text": "y"}]}]}
    with pytest.raises(InputError, match="turn 1: duplicate turn id"):
        load_conversations("jsonl", _write(tmp_path, "dup.json", record))
    with pytest.raises(InputError, match="--conversation conv-99: no such conversation"):
        load_conversations("locomo", SAMPLES / "locomo_sample.json", ["conv-99"])


def test_convomem_locomo_sessions_get_their_speakers_names_and_dates_back_where_the_turns_match(tmp_path: Path) -> None:
    from qgmem_train.memory.loaders import restore_locomo

    locomo = tmp_path / "locomo.json"
    locomo.write_text(json.dumps([{"sample_id": "conv-1", "conversation": {
        "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [{"dia_id": "D1:1", "speaker": "Caroline", "text": "I went to a support group."},
                      {"dia_id": "D1:2", "speaker": "Melanie", "text": "Look at this!", "blip_caption": "a sunset"}],
        "session_2_date_time": "9 May, 2023",
        "session_2": [{"dia_id": "D2:1", "speaker": "Caroline", "text": "Hi."}]}}]))  # fmt: skip
    repacked = [{"id": "locomo_0_session_1", "messages": [{"speaker": "User", "text": "I went to a support group."}, {"speaker": "Assistant", "text": "Look at this!"}]},
                {"id": "locomo_0_session_2", "messages": [{"speaker": "User", "text": "Something else."}]},
                {"id": "chat_7", "messages": [{"speaker": "User", "text": "Hello."}]}]  # fmt: skip
    (tmp_path / "case.json").write_text(json.dumps({"conversations": repacked, "evidenceItems": []}))
    conversations, found = restore_locomo(load_convomem(tmp_path / "case.json"), load_locomo(locomo))
    first, second, other = conversations[0].sessions
    assert [t.speaker for t in first.turns] == ["Caroline", "Melanie"] and first.time == "2023-05-08T13:56:00", "names and date restored"
    assert [t.text for t in first.turns] == ["I went to a support group.", "Look at this!"], "the turns' own text kept"
    assert (second.turns[0].speaker, second.time) == ("User", None) and (other.turns[0].speaker, other.time) == ("User", None)
    assert found == {"restored": 1, "not_locomo": 1, "turns_differ": 1}, "what could not be restored is counted"
