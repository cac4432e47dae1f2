"""B1's workloads beyond the seven (bench/b1/workloads.py) and the public-trace converter
(bench/b1/public_traces.py).

Every generated file must load as a B1 transcript, keep its tool pairs and ids whole (checked by
sessionfold's own message parser), stay inside the call ranges the workload declares, and come
out byte for byte the same from the same seed. The converter is checked on hand-written samples
of each source's format; nothing here needs the network or ``bench/.traces``.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

from b1 import workloads  # noqa: E402
from b1.counting import Counter  # noqa: E402
from b1.needed import (  # noqa: E402
    digest_summary,
    identifiers,
    message_text,
    named_identifiers,
    need_sets,
)
from b1.public_traces import (  # noqa: E402
    convert_all,
    convert_mini_swe_agent,
    convert_swe_agent,
    convert_tau_bench,
)
from b1.transcripts import DEFAULT_DIR, Transcript, load_transcripts  # noqa: E402
from sessionfold.core.messages import parse_messages  # noqa: E402

Json = dict[str, Any]
SEED = workloads.DEFAULT_SEED
GENERATED = ("days", "short", "dense")


@pytest.fixture(scope="module")
def generated() -> dict[str, workloads.Files]:
    return {name: workloads.generate(name, SEED) for name in GENERATED}


def _written(tmp_path: Path, files: workloads.Files) -> list[Transcript]:
    workloads.write(tmp_path, files)
    return load_transcripts(tmp_path)


def _tool_ids(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    return [str(b["id"]) for m in messages if isinstance(m["content"], list)
            for b in m["content"] if b.get("type") == "tool_use"]


def _valid(messages: Sequence[Mapping[str, Any]]) -> None:
    """sessionfold's parser: shapes, and every tool_result answering the call just before."""
    parse_messages(list(messages), check_pairing=True)


# --- every generated workload --------------------------------------------------------------

@pytest.mark.parametrize("name", GENERATED)
def test_every_generated_file_loads_as_a_transcript_with_intact_tool_pairs(
        name: str, generated: dict[str, workloads.Files], tmp_path: Path) -> None:
    transcripts = _written(tmp_path, generated[name])
    assert [t.id for t in transcripts] == sorted(stem for stem, _ in generated[name])
    for transcript in transcripts:
        assert transcript.messages[0]["role"] == "user"
        _valid(transcript.messages)
        ids = _tool_ids(transcript.messages)
        assert len(ids) == len(set(ids)), f"{transcript.id}: a tool id is used twice"


@pytest.mark.parametrize("name", GENERATED)
def test_the_same_seed_writes_the_same_bytes_and_another_seed_does_not(
        name: str, generated: dict[str, workloads.Files]) -> None:
    first = [workloads.encode(t) for _, t in generated[name]]
    again = [workloads.encode(t) for _, t in workloads.generate(name, SEED)]
    other = [workloads.encode(t) for _, t in workloads.generate(name, SEED + 1)]
    assert first == again
    assert first != other


def test_seven_is_the_shipped_transcripts_copied_byte_for_byte(tmp_path: Path) -> None:
    paths = workloads.write(tmp_path, workloads.seven(), copy_from=DEFAULT_DIR)
    assert sorted(p.name for p in paths) == sorted(p.name for p in DEFAULT_DIR.glob("*.json"))
    for path in paths:
        assert path.read_bytes() == (DEFAULT_DIR / path.name).read_bytes()


# --- days ----------------------------------------------------------------------------------

def _tasks(messages: Sequence[Mapping[str, Any]]) -> list[list[Mapping[str, Any]]]:
    """A day cut at its reports (an assistant message of text only that a task's first user
    message follows, or that ends the day)."""
    tasks: list[list[Mapping[str, Any]]] = [[]]
    for index, message in enumerate(messages):
        tasks[-1].append(message)
        following = messages[index + 1] if index + 1 < len(messages) else None
        if (message["role"] == "assistant" and not _tool_ids([message])
                and str(message["content"][0]["text"]).startswith("Report on ")
                and (following is None or "<pr_description>" in message_text(following))):
            tasks.append([])
    return [t for t in tasks if t]


def test_regular_days_chain_four_to_seven_tasks_into_170_to_300_calls(
        generated: dict[str, workloads.Files]) -> None:
    days = dict(generated["days"])
    regular = [days[f"day-{n:02d}"] for n in range(1, workloads.REGULAR_DAYS + 1)]
    for day in regular:
        calls = sum(m["role"] == "assistant" for m in day["messages"])
        tasks = _tasks(day["messages"])
        assert workloads.DAY_CALLS[0] <= calls <= workloads.DAY_CALLS[1], day["id"]
        assert workloads.DAY_TASKS[0] <= len(tasks) <= workloads.DAY_TASKS[1], day["id"]
        assert len(tasks) == day["source"].count(" calls")


def test_each_task_of_a_day_starts_with_a_shipped_task_and_ends_with_a_report(
        generated: dict[str, workloads.Files]) -> None:
    first_messages = [json.dumps(t.messages[0], sort_keys=True) for t in load_transcripts()]
    for _, day in generated["days"]:
        for number, task in enumerate(_tasks(day["messages"]), start=1):
            assert json.dumps(task[0], sort_keys=True) in first_messages
            assert task[-1]["role"] == "assistant" and not _tool_ids([task[-1]])
            assert all(i.startswith(f"toolu_t{number:02d}_") for i in _tool_ids(task))


def test_task_prefixes_of_a_day_hold_18_to_69_calls_and_the_long_days_six_whole_runs(
        generated: dict[str, workloads.Files]) -> None:
    runs = {t.id: t.calls for t in load_transcripts()}
    days = dict(generated["days"])
    for stem, day in days.items():
        for task in _tasks(day["messages"]):
            calls = sum(m["role"] == "assistant" for m in task)
            if "done, the fix is submitted" in message_text(task[-1]):
                assert calls - 1 in runs.values(), stem  # a whole run and its report
            else:
                assert workloads.PREFIX_CALLS[0] <= calls <= workloads.PREFIX_CALLS[1], stem
    for n in (workloads.REGULAR_DAYS + 1, workloads.REGULAR_DAYS + 2):
        tasks = _tasks(days[f"day-{n:02d}"]["messages"])
        assert len(tasks) == workloads.LONG_DAY_TASKS
        assert all("done, the fix is submitted" in message_text(t[-1]) for t in tasks)


# --- short ---------------------------------------------------------------------------------

def test_short_sessions_are_at_least_twelve_prefixes_of_18_to_69_calls_over_all_seven(
        generated: dict[str, workloads.Files]) -> None:
    shipped = {t.id: t for t in load_transcripts()}
    sessions = generated["short"]
    assert len(sessions) >= 12
    assert {stem.split("-", 2)[2] for stem, _ in sessions} == set(shipped)
    for stem, session in sessions:
        messages = session["messages"]
        calls = sum(m["role"] == "assistant" for m in messages)
        assert workloads.PREFIX_CALLS[0] <= calls <= workloads.PREFIX_CALLS[1], stem
        run = shipped[stem.split("-", 2)[2]]
        assert list(messages[:-1]) == list(run.messages[:len(messages) - 1])
        assert not _tool_ids([messages[-1]])


# --- dense ---------------------------------------------------------------------------------

def _outputs(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    return [message_text(m) for m in messages if m["role"] == "user"
            and any(b.get("type") == "tool_result" for b in m["content"])]


def test_dense_sessions_are_at_least_four_coding_sessions_of_40_to_150_calls(
        generated: dict[str, workloads.Files]) -> None:
    sessions = generated["dense"]
    assert len(sessions) >= 4
    for stem, session in sessions:
        messages = session["messages"]
        calls = sum(m["role"] == "assistant" for m in messages)
        assert 40 <= calls <= 150, stem
        steps = [m for m in messages[1:-1] if m["role"] == "assistant"]
        assert all(str(m["content"][0]["text"]).startswith("THOUGHT: ") for m in steps)
        assert all([b["name"] for b in m["content"][1:]] == ["bash"] for m in steps)


def test_dense_outputs_name_far_more_identifiers_than_a_300_token_summary_can_list(
        generated: dict[str, workloads.Files]) -> None:
    counter = Counter()
    for stem, session in generated["dense"]:
        messages = session["messages"]
        per_output = [len(identifiers(text)) for text in _outputs(messages)]
        assert statistics.median(per_output) >= 20, stem
        named = named_identifiers(messages)
        digest = digest_summary("\n".join(message_text(m) for m in messages), 300,
                                counter=counter, only=named)
        listed = [i for i in named if i in digest]
        assert len(named) >= 8 * len(listed), stem


def test_dense_thoughts_need_identifiers_first_shown_many_calls_earlier(
        generated: dict[str, workloads.Files]) -> None:
    for stem, session in generated["dense"]:
        messages = session["messages"]
        need = need_sets(messages)
        assert sum(len(n) for n in need) >= 4 * len(need), stem
        first_call: dict[str, int] = {}
        far = 0
        call = 0
        for message in messages:
            found = identifiers(message_text(message))
            if message["role"] == "assistant":
                far += sum(1 for i in need[call] if call - first_call.get(i, call) > 20)
                call += 1
            for i in found:
                first_call.setdefault(i, call)
        assert far >= len(need), f"{stem}: too few identifiers needed from far back"


# --- the CLI -------------------------------------------------------------------------------

def test_the_cli_writes_each_workload_folder_and_prints_a_row_per_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert workloads.main(["--out", str(tmp_path), "--only", "dense,seven"]) == 0
    printed = capsys.readouterr().out
    written = sorted(tmp_path.glob("*/*.json"))
    assert len(written) == len(workloads.DENSE_SPECS) + len(list(DEFAULT_DIR.glob("*.json")))
    for path in written:
        assert f"| {path.parent.name} | {path.stem} |" in printed


def test_the_public_workload_is_skipped_with_a_reason_when_no_raw_traces_are_there(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="no raw traces"):
        convert_all(tmp_path / "absent")
    out = tmp_path / "out"
    assert workloads.main(["--out", str(out), "--only", "public",
                           "--traces", str(tmp_path / "absent")]) == 0
    assert "public: skipped" in capsys.readouterr().err
    assert not list(out.glob("public/*.json"))


# --- the public converter, on hand-written samples --------------------------------------------

def _assert_transcript(transcript: Json, tmp_path: Path) -> Transcript:
    (tmp_path / "sample.json").write_text(json.dumps(transcript), encoding="utf-8")
    [loaded] = load_transcripts(tmp_path)
    _valid(loaded.messages)
    ids = _tool_ids(loaded.messages)
    assert len(ids) == len(set(ids))
    assert set(transcript) == {"id", "source", "model", "system", "messages"}
    return loaded


def _call(name: str, call_id: str, **arguments: Any) -> Json:
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)}}


def test_a_tau_bench_run_becomes_a_transcript_with_fresh_ids_for_reused_call_ids(
        tmp_path: Path) -> None:
    traj = [
        {"role": "system", "content": "Airline policy: be kind."},
        {"role": "user", "content": "Hi, cancel reservation ZZ9QQ7 please."},
        {"role": "assistant", "content": None,
         "tool_calls": [_call("get_reservation_details", "call_same", reservation_id="ZZ9QQ7")]},
        {"role": "tool", "tool_call_id": "call_same", "name": "get_reservation_details",
         "content": '{"reservation_id": "ZZ9QQ7", "status": "booked"}'},
        {"role": "assistant", "content": None, "tool_calls": [_call("think", "call_same")]},
        {"role": "tool", "tool_call_id": "call_same", "name": "think", "content": ""},
        {"role": "assistant", "content": "Shall I cancel ZZ9QQ7? (yes/no)"},
        {"role": "user", "content": "yes"},
        {"role": "assistant", "content": "Done.",
         "tool_calls": [_call("cancel_reservation", "call_x", reservation_id="ZZ9QQ7")]},
        {"role": "tool", "tool_call_id": "call_x", "name": "cancel_reservation",
         "content": '{"status": "cancelled"}'},
    ]
    runs = [{"task_id": 4, "trial": 0, "reward": 1.0, "info": {}, "traj": traj},
            {"task_id": 4, "trial": 1, "reward": 0.0, "info": {}, "traj": traj},
            {"task_id": 5, "trial": 0, "reward": 1.0, "info": {}, "traj": traj[:4]}]
    [transcript] = convert_tau_bench(runs, label="airline", model="gpt-4o", min_calls=3)
    loaded = _assert_transcript(transcript, tmp_path)
    assert transcript["system"] == "Airline policy: be kind."
    assert loaded.task == "Hi, cancel reservation ZZ9QQ7 please."
    assert loaded.calls == 4
    assert _tool_ids(loaded.messages) == ["toolu_00001", "toolu_00002", "toolu_00003"]
    assert loaded.messages[1]["content"][0]["input"] == {"reservation_id": "ZZ9QQ7"}


def test_a_swe_agent_text_action_trajectory_becomes_bash_calls_and_results(
        tmp_path: Path) -> None:
    traj = {"history": [
        {"role": "system", "content": "You are an autonomous programmer.", "agent": "primary"},
        {"role": "user", "content": "Here is a demonstration: ...", "is_demo": True},
        {"role": "user", "content": "ISSUE: parse_header drops the last field."},
        {"role": "assistant", "content": "Let me look.\n```\nopen src/parser.py\n```",
         "thought": "Let me look.", "action": "open src/parser.py\n"},
        {"role": "user", "content": "[File: src/parser.py (80 lines total)]\n1:import re"},
        {"role": "assistant", "content": "Done.\n```\nsubmit\n```", "action": "submit\n"},
        {"role": "user", "content": "diff --git a/src/parser.py b/src/parser.py"},
    ]}
    transcript = convert_swe_agent(traj, name="parser-fix")
    loaded = _assert_transcript(transcript, tmp_path)
    assert "ISSUE: parse_header drops the last field." in loaded.task
    assert loaded.calls == 2
    first = loaded.messages[1]["content"]
    assert first[1] == {"type": "tool_use", "id": "toolu_00001", "name": "bash",
                        "input": {"command": "open src/parser.py"}}
    assert loaded.messages[2]["content"][0]["tool_use_id"] == "toolu_00001"


def test_a_swe_agent_function_calling_trajectory_keeps_each_call_with_its_result(
        tmp_path: Path) -> None:
    traj = {"history": [
        {"role": "system", "content": "SETTING: a shell.", "message_type": "system_prompt"},
        {"role": "user", "content": "Fix the failing test in tests/test_dates.py."},
        {"role": "assistant", "content": "I'll run it.", "message_type": "action",
         "tool_calls": [_call("bash", "call_1", command="pytest tests/test_dates.py")],
         "action": "pytest tests/test_dates.py"},
        {"role": "tool", "content": "1 failed", "tool_call_ids": ["call_1"],
         "message_type": "observation"},
        {"role": "assistant", "content": "", "message_type": "action",
         "tool_calls": [_call("submit", "call_2")], "action": "submit"},
        {"role": "tool", "content": "submitted", "tool_call_ids": ["call_2"]},
    ]}
    loaded = _assert_transcript(convert_swe_agent(traj, name="dates"), tmp_path)
    assert [m["role"] for m in loaded.messages] == ["user", "assistant", "user", "assistant",
                                                    "user"]
    assert loaded.messages[3]["content"] == [
        {"type": "tool_use", "id": "toolu_00002", "name": "submit", "input": {}}]
    assert loaded.messages[4]["content"][0]["content"] == "submitted"


def test_a_mini_swe_agent_trajectory_keeps_format_errors_as_text_and_flags_failed_commands(
        tmp_path: Path) -> None:
    def answer(text: str) -> Json:
        return {"role": "assistant", "content": text}

    traj = {"info": {"config": {"model": {"model_name": "some/model"}}}, "messages": [
        {"role": "system", "content": "One bash block per answer."},
        {"role": "user", "content": "<pr_description>\nFix slugify.\n</pr_description>"},
        answer("THOUGHT: look around.\n\n```bash\nls src\n```"),
        {"role": "user", "content": "<returncode>0</returncode>\n<output>\nslug.py\n</output>"},
        answer("THOUGHT: two at once.\n\n```bash\nls\n```\n\n```bash\npwd\n```"),
        {"role": "user", "content": "Please always provide EXACTLY ONE action."},
        answer("THOUGHT: run it.\n\n```bash\npython -c 'import slug'\n```"),
        {"role": "user", "content": "<returncode>1</returncode>\n<output>\nboom\n</output>"},
    ]}
    transcript = convert_mini_swe_agent(traj, name="slug-1")
    loaded = _assert_transcript(transcript, tmp_path)
    assert transcript["model"] == "some/model"
    assert loaded.calls == 3
    assert [b["type"] for b in loaded.messages[3]["content"]] == ["text"]
    assert [b["type"] for b in loaded.messages[4]["content"]] == ["text"]
    assert loaded.messages[2]["content"][0]["is_error"] is False
    assert loaded.messages[6]["content"][0]["is_error"] is True
    assert loaded.messages[5]["content"][1]["input"] == {"command": "python -c 'import slug'"}
