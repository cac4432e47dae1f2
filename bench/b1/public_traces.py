"""Real agent traces from public repositories, converted to B1 transcripts (``public`` workload).

The raw files are not part of this repository (they are other projects' data, and large): they
are read from ``bench/.traces/<source>/`` (git-ignored), where :func:`extract` or the commands
below put them, and converted here into ``{"id", "source", "model", "system", "messages"}``
files in the Anthropic shape that ``b1.transcripts.load_transcripts`` reads.

Sources (every licence allows this use; each converted file's ``source`` repeats its line):

- ``tau-bench``: sierra-research/tau-bench at 59a200c6d575d595120f1cb70fea53cef0632f6b,
  ``historical_trajectories/gpt-4o-airline.json``, MIT (c) 2024 Sierra. A GPT-4o airline
  customer-service agent talking to a simulated customer, with tools (look-ups, bookings).
  Used: trial 0, every task whose run made 10 calls or more (34 sessions, 10-30 calls).
  The repository's other three files (retail, Sonnet) are 4 MiB or more and not in its snapshot.
- ``swe-agent``: SWE-agent/SWE-agent at 3ea751c087f32b16e039a2233dd6eefecef325d5, the ``.traj``
  files named in :data:`SWE_AGENT_FILES` (``trajectories/demonstrations/`` and one SWE-bench
  run under ``tests/test_data/trajectories/``), MIT (c) 2024 John Yang, Carlos E. Jimenez et al.
  Coding and CTF (security) tasks, 4-21 calls; one session per distinct task.
- ``mini-swe-agent``: gruckion/mini-swe-agent at d12a71affd95403b036b2bdbd827349b77bfffb9,
  ``swebench_results/20251118_gemini-3-pro-74pct/trajs/<id>/<id>.traj.json`` for the ids in
  :data:`MINI_SWE_AGENT_IDS`, MIT (c) 2025 Kilian A. Lieret and Carlos E. Jimenez. The same
  public Gemini 3 Pro run as the shipped seven, on other repositories: 14 short sessions
  (18-95 calls) and two long ones (115 and 132).

To obtain them: ``fetch`` (the search tool) ``github:sierra-research/tau-bench``,
``github:SWE-agent/SWE-agent`` and ``github:gruckion/mini-swe-agent``; each lands as a bare git
directory ``/work/.mirror/<owner>+<name>/repo``. Then::

    .venv/bin/python bench/b1/public_traces.py extract --mirror /work/.mirror [--dry-run]

runs (``--dry-run``: prints) one command per source, for tau-bench::

    git --git-dir=/work/.mirror/sierra-research+tau-bench/repo archive \
        59a200c6d575d595120f1cb70fea53cef0632f6b LICENSE \
        historical_trajectories/gpt-4o-airline.json | tar -x -C bench/.traces/tau-bench

and the same with the other sources' commit, licence file and paths. Then convert::

    .venv/bin/python bench/b1/public_traces.py convert --out /tmp/public

(``bench/b1/workloads.py --only public`` does the same into ``<out>/public``).

How each format becomes the Anthropic shape: an assistant message is its text plus one
``tool_use`` per call (OpenAI ``tool_calls``; or, for the text-action agents, the one command
its text holds, as a ``bash`` call); the tool outputs (OpenAI ``tool`` messages, or the user
message that follows a text action) become ``tool_result`` blocks of the next user message. Tool
ids are rewritten ``toolu_00001``... in order: tau-bench repeats a call id within a session.
A call the source left unanswered mid-session gets a result saying so; empty text is dropped.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_TRACES",
    "MINI_SWE_AGENT_IDS",
    "SOURCES",
    "SWE_AGENT_FILES",
    "TAU_MIN_CALLS",
    "Source",
    "TranscriptBuilder",
    "convert_all",
    "convert_mini_swe_agent",
    "convert_swe_agent",
    "convert_tau_bench",
    "extract",
]

Json = dict[str, Any]

DEFAULT_TRACES = Path(__file__).resolve().parents[1] / ".traces"

TAU_FILE = "historical_trajectories/gpt-4o-airline.json"
#: tau-bench runs shorter than this are a greeting and one look-up: not a session to compact.
TAU_MIN_CALLS = 10
TAU_TRIAL = 0

#: One file per distinct task (the marshmallow demonstration exists in several agent
#: configurations; the function-calling one is kept).
SWE_AGENT_FILES = (
    "trajectories/demonstrations/ctf/crypto/BabyEncryption.traj",
    "trajectories/demonstrations/ctf/crypto/BabyTimeCapsule.traj",
    "trajectories/demonstrations/ctf/crypto/eps.traj",
    "trajectories/demonstrations/ctf/crypto/katy.traj",
    "trajectories/demonstrations/ctf/forensics/flash.traj",
    "trajectories/demonstrations/ctf/misc/networking_1.traj",
    "trajectories/demonstrations/ctf/pwn/warmup.traj",
    "trajectories/demonstrations/ctf/rev/rock.traj",
    "trajectories/demonstrations/ctf/web/i_got_id_demo.traj",
    "trajectories/demonstrations/human_thought__swe-bench-HumanEvalFix-python__lcb__t-0.00__"
    "p-0.95__c-4.00__install-0/humanevalfix-python-0.traj",
    "trajectories/demonstrations/replay__marshmallow-code__marshmallow-1867__function_calling_"
    "replace_from_source/marshmallow-code__marshmallow-1867.traj",
    "tests/test_data/trajectories/gpt4__swe-bench-dev-easy_first_only__default__t-0.00__p-0.95__"
    "c-3.00__install-1/pydicom__pydicom-1458.traj",
)

MINI_DIR = "swebench_results/20251118_gemini-3-pro-74pct/trajs"
#: Repositories the shipped seven do not come from, spread over run lengths, and two long runs.
MINI_SWE_AGENT_IDS = (
    "astropy__astropy-7336", "matplotlib__matplotlib-24026", "pallets__flask-5014",
    "pydata__xarray-7233", "astropy__astropy-7671", "scikit-learn__scikit-learn-10297",
    "scikit-learn__scikit-learn-13124", "matplotlib__matplotlib-25479", "pydata__xarray-3993",
    "mwaskom__seaborn-3187", "scikit-learn__scikit-learn-25102", "matplotlib__matplotlib-25960",
    "matplotlib__matplotlib-20826", "matplotlib__matplotlib-25775", "django__django-11138",
    "sympy__sympy-19040",
)


# --- building one transcript -----------------------------------------------------------------

class TranscriptBuilder:
    """Accumulates Anthropic-shape messages from a source's events, keeping tool pairs intact.

    Source call ids are mapped to fresh ``toolu_NNNNN`` ids, one per call, so a source that
    reuses an id (tau-bench does) still gives unique ids.
    """

    def __init__(self) -> None:
        self.messages: list[Json] = []
        self._count = 0
        #: Calls of the last assistant message still waiting for a result: new id, in order,
        #: with the source's id (or None) for each.
        self._pending: list[tuple[str, str | None]] = []

    def user_text(self, text: str) -> None:
        if not text.strip():
            return
        self._close_pending()
        last = self.messages[-1] if self.messages else None
        if last is not None and last["role"] == "user":
            last["content"].append({"type": "text", "text": text})
        else:
            self.messages.append({"role": "user", "content": [{"type": "text", "text": text}]})

    def assistant(self, text: str, calls: Sequence[tuple[str, Mapping[str, Any], str | None]]
                  ) -> None:
        """One model answer: its text and its tool calls ``(name, input, source id)``."""
        self._close_pending()
        blocks: list[Json] = [{"type": "text", "text": text}] if text.strip() else []
        for name, arguments, source_id in calls:
            self._count += 1
            new_id = f"toolu_{self._count:05d}"
            blocks.append({"type": "tool_use", "id": new_id, "name": name,
                           "input": dict(arguments)})
            self._pending.append((new_id, source_id))
        if not blocks:
            return
        last = self.messages[-1] if self.messages else None
        if last is not None and last["role"] == "assistant":
            # Two answers in a row (no user turn between): one model call produced both.
            last["content"].extend(blocks)
        else:
            self.messages.append({"role": "assistant", "content": blocks})

    def tool_result(self, content: str, *, source_id: str | None = None,
                    is_error: bool | None = None) -> bool:
        """Answer a pending call (the one with ``source_id``, else the oldest pending);
        False when no call is waiting (the caller then treats ``content`` as user text)."""
        if not self._pending:
            return False
        index = 0
        if source_id is not None:
            index = next((i for i, (_, s) in enumerate(self._pending) if s == source_id), 0)
        new_id, _ = self._pending.pop(index)
        block: Json = {"type": "tool_result", "tool_use_id": new_id, "content": content}
        if is_error is not None:
            block["is_error"] = is_error
        last = self.messages[-1]
        if last["role"] == "user":
            last["content"].append(block)
        else:
            self.messages.append({"role": "user", "content": [block]})
        return True

    def _close_pending(self) -> None:
        while self._pending:
            self.tool_result("(the source records no output for this call)")

    def finish(self) -> list[Json]:
        """The messages; a call left open by the very last message stays open (mid-call)."""
        if not self.messages or self.messages[0]["role"] != "user":
            raise ValueError("a transcript starts with the user's task")
        return self.messages


def _transcript(id_: str, source: str, model: str, system: str, messages: list[Json]) -> Json:
    return {"id": id_, "source": source, "model": model, "system": system,
            "messages": messages}


def _text(content: Any) -> str:
    """A source message's content as text (a string, or OpenAI-style parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content
                         if isinstance(p, Mapping) and p.get("type") in (None, "text"))
    return str(content)


def _arguments(raw: Any) -> Json:
    """An OpenAI call's arguments (a JSON string, usually) as a tool_use input object."""
    if isinstance(raw, Mapping):
        return dict(raw)
    try:
        value = json.loads(raw) if isinstance(raw, str) and raw.strip() else {}
    except json.JSONDecodeError:
        return {"arguments": raw}
    return value if isinstance(value, dict) else {"arguments": value}


def _openai_calls(message: Mapping[str, Any]) -> list[tuple[str, Json, str | None]]:
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function", {})
        calls.append((str(function.get("name", "tool")), _arguments(function.get("arguments")),
                      call.get("id")))
    return calls


def _openai_messages(builder: TranscriptBuilder, messages: Iterable[Mapping[str, Any]]) -> str:
    """Feed OpenAI chat messages to ``builder``; returns the system prompt."""
    system: list[str] = []
    for message in messages:
        role = message.get("role")
        text = _text(message.get("content"))
        if role == "system":
            system.append(text)
        elif role == "assistant":
            builder.assistant(text, _openai_calls(message))
        elif role == "tool":
            ids = message.get("tool_call_ids") or [message.get("tool_call_id")]
            if not builder.tool_result(text, source_id=ids[0]):
                builder.user_text(text)
        else:
            builder.user_text(text)
    return "\n\n".join(system)


# --- tau-bench ---------------------------------------------------------------------------------

def convert_tau_bench(runs: Sequence[Mapping[str, Any]], *, label: str, model: str,
                      trial: int = TAU_TRIAL, min_calls: int = TAU_MIN_CALLS) -> list[Json]:
    """tau-bench's historical trajectories (a list of ``{"task_id", "trial", "traj", ...}``,
    each ``traj`` OpenAI chat messages): the runs of ``trial`` with ``min_calls`` calls or
    more, in task order."""
    out = []
    for run in sorted(runs, key=lambda r: int(r["task_id"])):
        traj = run["traj"]
        if int(run.get("trial", 0)) != trial:
            continue
        if sum(1 for m in traj if m.get("role") == "assistant") < min_calls:
            continue
        builder = TranscriptBuilder()
        system = _openai_messages(builder, traj)
        task = int(run["task_id"])
        out.append(_transcript(
            f"tau-bench/{label}/task-{task:02d}/trial-{trial}",
            f"tau-bench {label} (sierra-research/tau-bench, {TAU_FILE}, task {task}, trial "
            f"{trial}, reward {run.get('reward')}); MIT License, (c) 2024 Sierra; converted "
            "by bench/b1/public_traces.py",
            model, system, builder.finish()))
    return out


# --- SWE-agent ---------------------------------------------------------------------------------

def convert_swe_agent(traj: Mapping[str, Any], *, name: str) -> Json:
    """A SWE-agent ``.traj``: its ``history`` (system, the task, then actions and
    observations). A text action (the ``action`` field) becomes a ``bash`` call; function-call
    histories carry OpenAI ``tool_calls`` and ``tool`` messages."""
    builder = TranscriptBuilder()
    system: list[str] = []
    for message in traj["history"]:
        role = message.get("role")
        text = _text(message.get("content"))
        if role == "system":
            system.append(text)
        elif role == "assistant":
            calls = _openai_calls(message)
            action = str(message.get("action") or "").strip()
            if not calls and action:
                calls = [("bash", {"command": action}, None)]
            builder.assistant(text, calls)
        elif role == "tool":
            ids = message.get("tool_call_ids") or [message.get("tool_call_id")]
            if not builder.tool_result(text, source_id=ids[0]):
                builder.user_text(text)
        elif not builder.tool_result(text):
            builder.user_text(text)
    return _transcript(
        f"swe-agent/{name}",
        f"SWE-agent trajectory {name} (SWE-agent/SWE-agent); MIT License, (c) 2024 John Yang, "
        "Carlos E. Jimenez, Alexander Wettig, Shunyu Yao, Karthik Narasimhan, Ofir Press; "
        "converted by bench/b1/public_traces.py",
        "SWE-agent (model not recorded in the file)", "\n\n".join(system), builder.finish())


# --- mini-swe-agent ----------------------------------------------------------------------------

_BASH_BLOCK = re.compile(r"```bash\s*\n(.*?)\n```", re.DOTALL)
_RETURN_CODE = re.compile(r"<returncode>(-?\d+)</returncode>")


def convert_mini_swe_agent(traj: Mapping[str, Any], *, name: str) -> Json:
    """A mini-swe-agent v1 ``.traj.json`` (``messages``: system, task, then answers each
    holding one bash block and the observations that follow). An answer with exactly one
    block is a ``bash`` call; one with none or several (the agent's format errors) stays text,
    and so does the reminder that answers it."""
    builder = TranscriptBuilder()
    system: list[str] = []
    for message in traj["messages"]:
        role = message.get("role")
        text = _text(message.get("content"))
        if role == "system":
            system.append(text)
        elif role == "assistant":
            blocks = _BASH_BLOCK.findall(text)
            calls = [("bash", {"command": blocks[0]}, None)] if len(blocks) == 1 else []
            builder.assistant(text, calls)
        else:
            code = _RETURN_CODE.search(text)
            if not builder.tool_result(text, is_error=bool(code and int(code.group(1)) != 0)):
                builder.user_text(text)
    model = str(traj.get("info", {}).get("config", {}).get("model", {}).get("model_name", ""))
    return _transcript(
        f"mini-swe-agent/{name}",
        f"mini-swe-agent v1.15 run of Gemini 3 Pro on SWE-bench Verified, {name} "
        "(gruckion/mini-swe-agent, swebench_results/20251118_gemini-3-pro-74pct); MIT License, "
        "(c) 2025 Kilian A. Lieret and Carlos E. Jimenez; converted by bench/b1/public_traces.py",
        model or "gemini-3-pro-preview", "\n\n".join(system), builder.finish())


# --- the sources -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Source:
    """A public repository the traces come from, and how to read them."""

    name: str
    repo: str
    commit: str
    licence: str
    licence_files: tuple[str, ...]
    paths: tuple[str, ...]
    #: (folder ``bench/.traces/<name>``) -> [(file stem, transcript)]
    read: Callable[[Path], list[tuple[str, Json]]]

    def mirror(self, root: Path) -> Path:
        """Where ``fetch github:<repo>`` puts the repository's git directory."""
        return root / self.repo.replace("/", "+") / "repo"


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read ({exc})") from None


def _read_tau(folder: Path) -> list[tuple[str, Json]]:
    runs = _read_json(folder / TAU_FILE)
    out = []
    for transcript in convert_tau_bench(runs, label="airline", model="gpt-4o"):
        task = transcript["id"].split("/")[2]
        out.append((f"tau-airline-{task}", transcript))
    return out


def _swe_agent_name(path: str) -> str:
    stem = Path(path).stem
    if "/ctf/" in path:
        kind = Path(path).parent.name
        return f"ctf-{kind}-{stem}"
    return stem


def _read_swe_agent(folder: Path) -> list[tuple[str, Json]]:
    out = []
    for path in SWE_AGENT_FILES:
        name = _swe_agent_name(path)
        out.append((f"sweagent-{name}", convert_swe_agent(_read_json(folder / path), name=name)))
    return out


def _read_mini(folder: Path) -> list[tuple[str, Json]]:
    out = []
    for name in MINI_SWE_AGENT_IDS:
        traj = _read_json(folder / MINI_DIR / name / f"{name}.traj.json")
        out.append((f"mini-gemini-{name}", convert_mini_swe_agent(traj, name=name)))
    return out


SOURCES = (
    Source("tau-bench", "sierra-research/tau-bench", "59a200c6d575d595120f1cb70fea53cef0632f6b",
           "MIT", ("LICENSE",), (TAU_FILE,), _read_tau),
    Source("swe-agent", "SWE-agent/SWE-agent", "3ea751c087f32b16e039a2233dd6eefecef325d5",
           "MIT", ("LICENSE",), SWE_AGENT_FILES, _read_swe_agent),
    Source("mini-swe-agent", "gruckion/mini-swe-agent",
           "d12a71affd95403b036b2bdbd827349b77bfffb9", "MIT", ("LICENSE.md",),
           tuple(f"{MINI_DIR}/{n}/{n}.traj.json" for n in MINI_SWE_AGENT_IDS), _read_mini),
)


def _archive_command(source: Source, mirror_root: Path) -> list[str]:
    return ["git", f"--git-dir={source.mirror(mirror_root)}", "archive", source.commit,
            *source.licence_files, *source.paths]


def extract(mirror_root: Path, traces: Path = DEFAULT_TRACES, *, dry_run: bool = False) -> None:
    """Copy each source's files out of its fetched snapshot into ``traces/<source>/``
    (``dry_run``: print the commands instead)."""
    for source in SOURCES:
        command = _archive_command(source, mirror_root)
        target = traces / source.name
        if dry_run:
            print(f"{shlex.join(command)} | tar -x -C {shlex.quote(str(target))}")
            continue
        if not source.mirror(mirror_root).is_dir():
            raise ValueError(f"{source.mirror(mirror_root)}: not fetched "
                             f"(fetch github:{source.repo})")
        target.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(command, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)


def convert_all(traces: Path = DEFAULT_TRACES) -> list[tuple[str, Json]]:
    """Every source's sessions as (file stem, transcript); ValueError naming what is missing
    when a source's folder is absent."""
    missing = [s.name for s in SOURCES if not (traces / s.name).is_dir()]
    if missing:
        raise ValueError(f"{traces}: no raw traces for {missing}; see bench/b1/public_traces.py "
                         "for how to obtain them")
    return [item for source in SOURCES for item in source.read(traces / source.name)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ext = sub.add_parser("extract", help="copy the raw files out of fetched snapshots")
    ext.add_argument("--mirror", type=Path, default=Path("/work/.mirror"))
    ext.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    ext.add_argument("--dry-run", action="store_true", help="print the commands only")
    conv = sub.add_parser("convert", help="write the converted transcripts")
    conv.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    conv.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        if args.command == "extract":
            extract(args.mirror, args.traces, dry_run=args.dry_run)
            return 0
        args.out.mkdir(parents=True, exist_ok=True)
        for stem, transcript in convert_all(args.traces):
            (args.out / f"{stem}.json").write_text(
                json.dumps(transcript, ensure_ascii=False) + "\n", encoding="utf-8")
    except (ValueError, subprocess.CalledProcessError) as exc:
        print(f"public_traces: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
