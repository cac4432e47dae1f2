"""Command output shown in the docs, produced by the commands themselves.

A fenced block that shows what a command prints is marked by the line just before it::

    <!-- output: sessionfold compact cli/examples/ops-incident-acct-8842.json --report -->
    ```text
    ...what the command printed...
    ```

``--write`` runs every marked command and rewrites its block with what it printed; ``--check``
runs them and exits 1, naming each block, when one no longer matches. Run it from the
repository root with the virtualenv's interpreter::

    .venv/bin/python tools/excerpts.py --check            # every block
    .venv/bin/python tools/excerpts.py --check --cheap    # not the ones that start the pipeline
    .venv/bin/python tools/excerpts.py --write [FILE...]  # rewrite (README.md, docs/, bench/)

How a command runs. Offline, in a scratch folder that no setting from the caller's environment
reaches (``SESSIONFOLD_*``, ``DATABASE_URL``, ``REDIS_URL``, ``ANTHROPIC_*``, ``OPENAI_*`` are
dropped), with the repository's ``cli/examples`` linked in, this interpreter's ``bin`` first on
``PATH`` and ``bash -c COMMAND`` (so a block may show ``... | head -n 12``). Most commands
read the *example store* the folder holds (:func:`make_example_store`): the session of
``cli/examples/ops-incident-acct-8842.json`` at a 32,000-token budget, folded once by the fold
procedure the workers run (offline summarizer); ``parallel-tools``, a turn of three parallel
tool calls (one output empty, one an error); and ``billing-agent-7``, paused. Two commands
are run their own way (:data:`PIPELINE`):

- ``sessionfold up`` runs until it prints its ``metrics`` line, then gets Ctrl-C; the block
  is what it printed from ``sessionfold up: the pipeline is running`` to that line.
- ``sessionfold demo`` varies from run to run (folds land when the workers get to them), so
  its block is an excerpt of the report (from its first table's title to ``report as
  JSON:``; a table of more than :data:`ELIDE_OVER` rows keeps its first
  :data:`ELIDE_KEEP` and its last, ``…`` between), and ``--check`` compares the *shape* of a
  quick run's report (:data:`QUICK_DEMO`): the same tables with the same columns, the same
  lines (:func:`shape`). The suite's demo test compares the shape of the run it makes.

What is shown is what was printed, with four substitutions that make it read as it would on
the reader's machine (:func:`as_shown`): the scratch folder is ``/home/you/sessionfold``, the
free ports ``up`` and ``demo`` were given are the defaults (5555, 9464), the Flower password
is cut to four characters and ``…``, and trailing spaces go. What may differ between two runs
of the same command is then normalized before two outputs are compared (:data:`NORMALIZE`):
timestamps, process ids, the Flower password, the demo's run id, UUIDs.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: The command the mark names is on the line before the fence.
MARK = re.compile(r"^<!-- output: (?P<command>.+?) -->$")
FENCE = re.compile(r"^(?P<ticks>`{3,})(?P<info>[^`]*)$")

#: Where the scratch folder is said to be, in what the docs show.
SHOWN_HOME = "/home/you/sessionfold"
#: The ports the docs show for Flower and the metrics endpoint (the settings' defaults).
SHOWN_FLOWER_PORT, SHOWN_METRICS_PORT = 5555, 9464

#: What may differ between two runs of one command, and what it is compared as.
NORMALIZE: tuple[tuple[re.Pattern[str], str], ...] = (
    # 2026-12-06 22:58:51, 2026-12-06T22:58:51+00:00, 2026-12-06 22:58:51,262
    (re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:[+-]\d{2}:\d{2}|Z)?"),
     "<time>"),
    (re.compile(r"\bpid \d+"), "pid <pid>"),
    # Flower's login, made at each start: `basic auth sessionfold:Xq3v…`
    (re.compile(r"(basic auth [^:\s]+:)[^\s,)]+"), r"\1<secret>"),
    # The demo names its sessions demo-<6 hex of the run>-ops-agent-NN.
    (re.compile(r"\bdemo-[0-9a-f]{6}-"), "demo-<run>-"),
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"), "<uuid>"),
)

#: The demo's options for ``--check``: the smallest fleet that still folds (the suite's demo
#: test runs the same).
QUICK_DEMO = "sessionfold demo --agents 2 --turns 40 --budget 8000"
#: A demo table of more rows than this is elided in the docs: its first ELIDE_KEEP rows, a
#: ``…`` row, its last row.
ELIDE_OVER, ELIDE_KEEP = 5, 2
#: The first line of the demo's report (its first table's title).
DEMO_REPORT_STARTS = "Billed input tokens per agent"
#: Report lines that appear only in some runs (the shape check leaves them out).
OPTIONAL_LINES = re.compile(r"^(without sessionfold, |error: )")

EXAMPLE = REPO / "cli" / "examples" / "ops-incident-acct-8842.json"
EXAMPLE_SESSION = "ops-incident-acct-8842"


@dataclass(frozen=True)
class Block:
    """One marked block: its file, the command, the fence's lines (0-based, the fences
    themselves excluded) and its text."""

    path: Path
    command: str
    start: int
    end: int
    text: str

    @property
    def where(self) -> str:
        shown = self.path.relative_to(REPO) if self.path.is_relative_to(REPO) else self.path
        return f"{shown}:{self.start}"


def documents() -> list[Path]:
    """Every markdown file whose blocks this tool keeps: the README, docs/, bench/README.md."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
            REPO / "bench" / "README.md"]


def blocks(path: Path) -> list[Block]:
    """The marked blocks of ``path``; a mark not followed by a fence is an error."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    for i, line in enumerate(lines):
        mark = MARK.match(line)
        if mark is None:
            continue
        opened = FENCE.match(lines[i + 1]) if i + 1 < len(lines) else None
        if opened is None:
            raise ValueError(f"{path}:{i + 1}: an output mark must be followed by a fence")
        ticks = opened["ticks"]
        end = next((j for j in range(i + 2, len(lines)) if lines[j].rstrip() == ticks), None)
        if end is None:
            raise ValueError(f"{path}:{i + 2}: the fence is never closed")
        found.append(Block(path, mark["command"], i + 2, end, "\n".join(lines[i + 2:end])))
    return found


# --- running a command -----------------------------------------------------------------------


def is_demo(command: str) -> bool:
    return command.split()[:2] == ["sessionfold", "demo"]


def is_up(command: str) -> bool:
    return command.split()[:2] == ["sessionfold", "up"]


#: Commands that start the whole pipeline: seconds each, skipped by ``--cheap``.
PIPELINE: tuple[Callable[[str], bool], ...] = (is_demo, is_up)


def clean_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The caller's environment without any sessionfold or provider setting, with this
    interpreter's scripts first on ``PATH``."""
    drop = ("SESSIONFOLD_", "ANTHROPIC_", "OPENAI_", "PROMETHEUS_MULTIPROC_DIR",
            "prometheus_multiproc_dir")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(drop) and k not in ("DATABASE_URL", "REDIS_URL")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return {**env, **(extra or {})}


def scratch(root: Path) -> Path:
    """A scratch folder with the repository's examples where the docs' commands expect them."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "cli").mkdir(exist_ok=True)
    examples = root / "cli" / "examples"
    if not examples.exists():
        examples.symlink_to(REPO / "cli" / "examples")
    return root


def make_example_store(folder: Path) -> None:
    """The store the docs' ``list``, ``inspect``, ``recall``... read (see the module doc), in
    ``folder/.sessionfold/sessionfold.db``, as a pipeline would have left it."""
    from sessionfold.cli.files import load_conversation_file
    from sessionfold.core import ExtractiveSummarizer, FoldPolicy
    from sessionfold.runtime.fold_procedure import FoldJob, run_fold
    from sessionfold.store import SessionStore

    data = folder / ".sessionfold"
    data.mkdir(parents=True, exist_ok=True)
    conv = load_conversation_file(EXAMPLE)
    with SessionStore.from_url(f"sqlite:///{data / 'sessionfold.db'}") as store:
        store.migrate()
        store.create_session(EXAMPLE_SESSION, FoldPolicy(budget_tokens=32_000),
                             system=conv.system)
        store.append(EXAMPLE_SESSION, conv.messages)
        report = run_fold(store, ExtractiveSummarizer(),
                          FoldJob(EXAMPLE_SESSION, "fold-1", trigger="manual"))
        assert report.outcome == "folded", report  # the example is 1.5x its budget
        store.create_session("parallel-tools", FoldPolicy(budget_tokens=16_000),
                             system="You keep the payment services running.")
        store.append("parallel-tools", [
            {"role": "user", "content": "Why does card-auth fail to start?"},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Reading its log, config and unit file at once."},
                {"type": "tool_use", "id": "toolu_A", "name": "read_file",
                 "input": {"path": "/var/log/card-auth/stderr.log"}},
                {"type": "tool_use", "id": "toolu_B", "name": "read_file",
                 "input": {"path": "/etc/card-auth/service.toml"}},
                {"type": "tool_use", "id": "toolu_C", "name": "read_file",
                 "input": {"path": "/etc/systemd/system/card-auth.service"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_A", "content": ""},
                {"type": "tool_result", "tool_use_id": "toolu_B", "content": "port = 8080"},
                {"type": "tool_result", "tool_use_id": "toolu_C", "content": "no such file",
                 "is_error": True}]},
        ])
        store.create_session("billing-agent-7", FoldPolicy(budget_tokens=64_000),
                             system="You are the billing operations agent. Cite ticket ids.")
        store.append("billing-agent-7", [
            {"role": "user", "content": "Reconcile yesterday's refunds for ACCT-8842."}])
        store.set_paused("billing-agent-7", True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Printed:
    """What a command printed, and what to show in its place (see :func:`as_shown`)."""

    text: str
    folder: Path
    ports: dict[int, int]


def run_plain(command: str, folder: Path) -> Printed:
    """Run ``command`` to its end in ``folder``; its standard output."""
    proc = subprocess.run(["bash", "-c", command], cwd=folder, env=clean_environment(),
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"`{command}` exited {proc.returncode}: {proc.stderr[-2000:]}")
    return Printed(proc.stdout, folder, {})


def run_up(command: str, folder: Path) -> Printed:
    """Run ``sessionfold up`` until it says where everything listens, then Ctrl-C it."""
    ports = {free_port(): SHOWN_FLOWER_PORT, free_port(): SHOWN_METRICS_PORT}
    flower, metrics_port = list(ports)
    env = clean_environment({"SESSIONFOLD_FLOWER_PORT": str(flower),
                             "SESSIONFOLD_METRICS_PORT": str(metrics_port)})
    proc = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=folder, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("  metrics "):
                break
        else:
            raise RuntimeError(f"`{command}` ended before saying where it listens:\n"
                               + "\n".join(lines[-20:]))
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    start = next(i for i, line in enumerate(lines)
                 if line.startswith("sessionfold up: the pipeline is running"))
    return Printed("\n".join(lines[start:]) + "\n", folder, ports)


def run_demo(command: str, folder: Path) -> Printed:
    """Run the demo; its report (see the module doc), not yet elided."""
    ports = {free_port(): SHOWN_FLOWER_PORT, free_port(): SHOWN_METRICS_PORT}
    flower, metrics_port = list(ports)
    env = clean_environment({"SESSIONFOLD_FLOWER_PORT": str(flower),
                             "SESSIONFOLD_METRICS_PORT": str(metrics_port)})
    proc = subprocess.run(["bash", "-c", command], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"`{command}` exited {proc.returncode}: {proc.stderr[-2000:]}")
    return Printed(demo_report(proc.stdout), folder, ports)


def demo_report(stdout: str) -> str:
    """The report part of the demo's output: its first table's title (what comes before says
    where the pipeline listens, and the progress lines) to its ``report as JSON:`` line."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(DEMO_REPORT_STARTS))
    end = max(i for i, line in enumerate(lines) if line.startswith("report as JSON:"))
    return "\n".join(lines[start:end + 1]) + "\n"


def as_shown(printed: Printed) -> str:
    """What the docs show of ``printed`` (the module doc's four substitutions)."""
    text = printed.text.replace(str(printed.folder.resolve()), SHOWN_HOME)
    text = text.replace(str(printed.folder), SHOWN_HOME)
    for real, shown in printed.ports.items():
        text = re.sub(rf":{real}\b", f":{shown}", text)
    text = re.sub(r"(basic auth [^:\s]+:)([^\s,)]{4})[^\s,)]*", r"\1\2…", text)
    return "\n".join(line.rstrip() for line in text.rstrip("\n").splitlines())


def elide(report: str) -> str:
    """The demo report with each long table cut to its first rows and its last."""
    out: list[str] = []
    rows: list[str] = []

    def flush() -> None:
        if len(rows) > ELIDE_OVER:
            cells = rows[0].split("│")
            gap = ["" if not c else " …" + " " * (len(c) - 2) if i == 1 else " " * len(c)
                   for i, c in enumerate(cells)]
            out.extend([*rows[:ELIDE_KEEP], "│".join(gap), rows[-1]])
        else:
            out.extend(rows)
        rows.clear()

    for line in report.splitlines():
        if line.startswith("│"):
            rows.append(line)
            continue
        flush()
        out.append(line)
    flush()
    return "\n".join(out)


# --- comparing -------------------------------------------------------------------------------


def normalized(text: str) -> str:
    """``text`` with what may differ between two runs replaced (:data:`NORMALIZE`)."""
    for pattern, replacement in NORMALIZE:
        text = pattern.sub(replacement, text)
    return "\n".join(line.rstrip() for line in text.rstrip("\n").splitlines())


def shape(report: str) -> list[str]:
    """What two demo reports must share, line by line: each table's title, its columns (the
    words of its header, however they wrap) and its borders (as many columns), one ``rows``
    line for each run of body rows whatever they hold, and each other line up to its first
    ``:`` or ``(`` with its numbers as ``N``. Lines only some runs print
    (:data:`OPTIONAL_LINES`) are left out."""
    out: list[str] = []
    header: list[str] = []
    for raw in normalized(report).splitlines():
        line = raw.strip()
        if line.startswith("┃"):
            header += line.replace("┃", " ").split()
            continue
        if header:
            out.append("┃ " + " ".join(sorted(header)))
            header = []
        if not line or OPTIONAL_LINES.match(line):
            continue
        if line.startswith("│"):
            row = f"rows of {line.count('│') - 1} columns"
            if not out or out[-1] != row:
                out.append(row)
        elif line[0] in "┏┡├└":
            out.append(re.sub(r"[━─]+", "", line))
        else:
            label = re.split(r"[:(]", line, maxsplit=1)[0].strip()
            if label:
                out.append(re.sub(r"\d[\d,]*(?:\.\d+)?", "N", label))
    if header:
        out.append("┃ " + " ".join(sorted(header)))
    return out


def shape_differences(shown: str, report: str) -> list[str]:
    """How the shape of ``report`` differs from that of the excerpt ``shown`` (empty: none).
    The excerpt's ``…`` rows are body rows like any."""
    want, got = shape(shown), shape(report)
    if want == got:
        return []
    return [f"  shown: {w!r}\n  run:   {g!r}" for w, g in zip(want, got, strict=False)
            if w != g][:5] or [f"  shown {len(want)} lines of shape, the run {len(got)}"]


def differences(block: Block, printed: Printed) -> list[str]:
    """Why ``block`` does not show ``printed`` (empty: it does)."""
    shown = as_shown(printed)
    if is_demo(block.command):
        return shape_differences(block.text, shown)
    want, got = normalized(block.text), normalized(shown)
    if want == got:
        return []
    lines = [f"  shown: {w!r}\n  run:   {g!r}" for w, g in
             zip(want.splitlines(), got.splitlines(), strict=False) if w != g][:5]
    return lines or [f"  shown {len(want.splitlines())} lines, the command printed "
                     f"{len(got.splitlines())}"]


# --- the tool --------------------------------------------------------------------------------


class Runner:
    """Runs the docs' commands: the plain ones in one folder with the example store, the
    pipeline's each in a fresh folder."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._store: Path | None = None
        self._fresh = 0

    def folder(self) -> Path:
        self._fresh += 1
        return scratch(self.root / f"run-{self._fresh}")

    def store_folder(self) -> Path:
        if self._store is None:
            self._store = scratch(self.root / "store")
            make_example_store(self._store)
        return self._store

    def run(self, command: str, *, check: bool) -> Printed:
        if is_up(command):
            return run_up(command, self.folder())
        if is_demo(command):
            return run_demo(QUICK_DEMO if check else command, self.folder())
        return run_plain(command, self.store_folder())


def selected(paths: Sequence[Path], cheap: bool) -> Iterator[Block]:
    for path in paths:
        for block in blocks(path):
            if cheap and any(test(block.command) for test in PIPELINE):
                continue
            yield block


def check(paths: Sequence[Path], *, cheap: bool = False) -> list[str]:
    """The problems of the marked blocks of ``paths`` (empty: every block shows its command)."""
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="sf-excerpts-") as tmp:
        runner = Runner(Path(tmp))
        for block in selected(paths, cheap):
            found = differences(block, runner.run(block.command, check=True))
            if found:
                problems.append(f"{block.where}: `{block.command}` prints otherwise "
                                f"(rewrite with tools/excerpts.py --write):\n"
                                + "\n".join(found))
    return problems


def write(paths: Sequence[Path], *, cheap: bool = False) -> int:
    """Rewrite every marked block of ``paths``; the number of blocks that changed."""
    changed = 0
    with tempfile.TemporaryDirectory(prefix="sf-excerpts-") as tmp:
        runner = Runner(Path(tmp))
        for path in paths:
            todo = list(selected([path], cheap))
            if not todo:
                continue
            lines = path.read_text(encoding="utf-8").splitlines()
            for block in reversed(todo):  # bottom up: earlier line numbers stay right
                shown = as_shown(runner.run(block.command, check=False))
                if is_demo(block.command):
                    shown = elide(shown)
                elif normalized(shown) == normalized(block.text):
                    continue  # only a time or an id moved: leave the block as it is
                if shown != block.text:
                    changed += 1
                lines[block.start:block.end] = shown.splitlines()
            path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return changed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="exit 1 if a block is stale")
    mode.add_argument("--write", action="store_true", help="rewrite every marked block")
    parser.add_argument("--cheap", action="store_true",
                        help="skip the blocks of commands that start the pipeline (up, demo)")
    parser.add_argument("files", nargs="*", type=Path,
                        help="markdown files (default: README.md, docs/*.md, bench/README.md)")
    args = parser.parse_args(argv)
    paths = [p.resolve() for p in args.files] or documents()
    if args.write:
        print(f"tools/excerpts.py: {write(paths, cheap=args.cheap)} block(s) rewritten")
        return 0
    problems = check(paths, cheap=args.cheap)
    for problem in problems:
        print(problem, file=sys.stderr)
    count = sum(1 for _ in selected(paths, args.cheap))
    print(f"tools/excerpts.py: {count - len(problems)} of {count} block(s) show their command")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
