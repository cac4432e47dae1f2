"""B1 workloads beyond the seven shipped transcripts: agent days, short tasks, dense identifiers.

    .venv/bin/python bench/b1/workloads.py --out DIR [--only NAME,...] [--seed N]

writes ``DIR/<workload>/*.json`` (each a transcript ``b1.transcripts.load_transcripts`` reads,
so ``bench/bench_replay.py --transcripts DIR/days`` replays it) and prints a table per file:
calls, messages, characters, tokens (``b1.counting.Counter``) and the peak request without
compaction. Everything is drawn from ``random.Random`` seeded with ``--seed`` and the workload's
name: the same seed writes the same bytes.

- ``seven``: the shipped transcripts, copied unchanged.
- ``days``: standing-agent days, several tasks one after another in one session. A task is a
  shipped run, whole or cut to a prefix of N calls (N drawn in 18-69: the run's first N-1 steps,
  then its report); each task ends with the agent's report (an assistant text, no tool call)
  and the next task arrives as the next run's first user message. Tool ids get the task's
  number (``toolu_t03_00012``). Eight days of 4-7 tasks and 170-300 calls, then two long days
  of six whole runs (the second one holds ``psf__requests-1142`` and its 868 K-character
  output).
- ``short``: short task sessions, two prefixes (18-69 calls, ended by the report) of each run.
- ``dense``: generated coding-agent sessions (THOUGHT + one bash call; grep, sed, git log,
  test and listing outputs) over a made-up repository, each output naming dozens of distinct
  paths, functions, classes, tickets, config keys and commits, and later THOUGHTs naming
  identifiers seen many calls before: what a 300-token summary cannot hold and the
  needed-context measure (``b1.needed``) counts.
- ``public``: real traces from public repositories (``b1.public_traces``), read from
  ``bench/.traces``; skipped, saying why, when that folder is absent.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``b1`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from b1.counting import Counter
from b1.needed import identifiers, mentioned
from b1.public_traces import DEFAULT_TRACES, convert_all
from b1.transcripts import DEFAULT_DIR

__all__ = [
    "DAY_CALLS",
    "DAY_TASKS",
    "DEFAULT_SEED",
    "DENSE_SPECS",
    "PREFIX_CALLS",
    "WORKLOADS",
    "Row",
    "days",
    "dense",
    "generate",
    "public",
    "seven",
    "short",
    "table",
    "write",
]

Json = dict[str, Any]
#: A workload's files: (file stem, transcript).
Files = list[tuple[str, Json]]

DEFAULT_SEED = 20261
#: Calls of a task prefix, its report included (inclusive).
PREFIX_CALLS = (18, 69)
#: Calls and tasks of a regular day (inclusive).
DAY_CALLS = (170, 300)
DAY_TASKS = (4, 7)
REGULAR_DAYS = 8
LONG_DAY_TASKS = 6
SHORT_PER_RUN = 2
#: The run whose last tool output is 868 K characters: whole only in the second long day.
HUGE_RUN = "psf__requests-1142"
SHIPPED_LICENCE = "MIT License, (c) 2025 Kilian A. Lieret and Carlos E. Jimenez"


# --- the shipped runs --------------------------------------------------------------------------

@dataclass(frozen=True)
class Run:
    """A shipped transcript as read from its file."""

    stem: str
    data: Json

    @property
    def messages(self) -> list[Json]:
        return list(self.data["messages"])

    @property
    def calls(self) -> int:
        return sum(1 for m in self.data["messages"] if m["role"] == "assistant")


def _shipped(directory: Path = DEFAULT_DIR) -> list[Run]:
    return [Run(p.stem, json.loads(p.read_text(encoding="utf-8")))
            for p in sorted(directory.glob("*.json"))]


def _blocks(message: Mapping[str, Any]) -> list[Json]:
    content = message["content"]
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)


def _answers_a_call(message: Mapping[str, Any]) -> bool:
    return message["role"] == "user" and any(b.get("type") == "tool_result"
                                             for b in _blocks(message))


def _end_after_steps(messages: Sequence[Json], steps: int) -> int:
    """The index just past the user message that answers the run's ``steps``-th call."""
    seen = 0
    for index, message in enumerate(messages):
        if message["role"] == "assistant":
            seen += 1
            if seen == steps:
                return index + 2
    raise ValueError(f"the run has fewer than {steps} calls")


def _prefix_end(run: Run, calls: int) -> tuple[int, int]:
    """(message end, calls) of a prefix of about ``calls`` calls (its report included) that
    ends on a tool result, not on a format reminder: the nearest such cut within
    :data:`PREFIX_CALLS`."""
    messages = run.messages
    low, high = PREFIX_CALLS
    for delta in (0, -1, 1, -2, 2, -3, 3, -4, 4):
        want = calls + delta
        if not low <= want <= high or want - 1 >= run.calls:
            continue
        end = _end_after_steps(messages, want - 1)
        if end <= len(messages) and _answers_a_call(messages[end - 1]):
            return end, want
    raise ValueError(f"{run.stem}: no prefix of about {calls} calls ends on a tool result")


def _instance(run: Run) -> str:
    return str(run.data.get("id", run.stem)).rsplit("/", 1)[-1]


_NOT_PROJECT_DIRS = frozenset({"usr", "bin", "tmp", "dev", "proc", "etc", "s", "opt"})


def _paths_in_commands(messages: Sequence[Json]) -> list[str]:
    """File paths the segment's commands named, most recently named last."""
    found: dict[str, None] = {}
    for message in messages:
        for block in _blocks(message):
            if block.get("type") != "tool_use":
                continue
            command = str(block.get("input", {}).get("command", ""))
            for name in identifiers(command):
                if name.split("/", 1)[0] in _NOT_PROJECT_DIRS:
                    continue  # /usr/bin/python3, a sed expression s/old/new/
                if "/" in name or re.search(r"\.(py|rst|txt|cfg|toml|ini|json|ya?ml)$", name):
                    found.pop(name, None)
                    found[name] = None
    return list(found)


def _listing(names: Sequence[str], cap: int) -> str:
    shown = ", ".join(f"`{n}`" for n in names[:cap])
    return shown + (f" and {len(names) - cap} more" if len(names) > cap else "")


def _report(run: Run, segment: Sequence[Json], whole: bool) -> Json:
    """The agent's closing report on one task: a short assistant text, no tool call."""
    name = _instance(run)
    if whole:
        last = "\n".join(str(b.get("content", "")) for b in _blocks(segment[-1])
                         if b.get("type") == "tool_result")
        changed = list(dict.fromkeys(re.findall(r"^diff --git a/(\S+) b/", last, re.M)))
        text = (f"Report on {name}: done, the fix is submitted (the final diff above). "
                f"Changed: {_listing(changed, 6) or 'nothing'}. Closing this task.")
    else:
        steps = sum(1 for m in segment if m["role"] == "assistant")
        paths = _paths_in_commands(segment)[-4:]
        where = f" I was last working in {_listing(paths, 4)}." if paths else ""
        text = (f"Report on {name}: pausing after {steps} steps to take the next task; "
                f"nothing is submitted yet.{where} I will pick it up from here later.")
    return {"role": "assistant", "content": [{"type": "text", "text": text}]}


def _task(run: Run, calls: int | None) -> tuple[list[Json], int, str]:
    """One task of a session: the run whole (``calls`` None) or a prefix, then its report;
    (messages, calls, how it was cut)."""
    if calls is None:
        segment = run.messages
        return [*segment, _report(run, segment, True)], run.calls + 1, "whole run"
    end, calls = _prefix_end(run, calls)
    segment = run.messages[:end]
    return [*segment, _report(run, segment, False)], calls, "prefix"


def _renumber(messages: Sequence[Json], task: int) -> list[Json]:
    """``messages`` with every tool id carrying the task's number (unique in the day)."""
    def new(old: str) -> str:
        return f"toolu_t{task:02d}_{old.removeprefix('toolu_')}"

    out = copy.deepcopy(list(messages))
    for message in out:
        if isinstance(message["content"], str):
            continue
        for block in message["content"]:
            if block.get("type") == "tool_use":
                block["id"] = new(str(block["id"]))
            elif block.get("type") == "tool_result":
                block["tool_use_id"] = new(str(block["tool_use_id"]))
    return out


# --- seven, days, short ------------------------------------------------------------------------

def seven(directory: Path = DEFAULT_DIR) -> Files:
    """The shipped transcripts as they are (written back byte for byte by :func:`write`)."""
    return [(run.stem, run.data) for run in _shipped(directory)]


def _day(number: int, plan: Sequence[tuple[Run, int | None]], seed: int) -> tuple[str, Json]:
    messages: list[Json] = []
    parts = []
    for task, (run, calls) in enumerate(plan, start=1):
        segment, made, how = _task(run, calls)
        messages += _renumber(segment, task)
        parts.append(f"{task}. {_instance(run)}, {how}, {made} calls")
    first = plan[0][0]
    stem = f"day-{number:02d}"
    source = (f"standing-agent day made by bench/b1/workloads.py (seed {seed}): the shipped "
              f"transcripts (tests/data/transcripts; {SHIPPED_LICENCE}) one after another in "
              f"one session, each task closed by the agent's report (an assistant text) and "
              f"the next arriving as its first user message; tool ids renumbered per task: "
              + "; ".join(parts))
    return stem, {"id": f"days/{stem}", "source": source,
                  "model": f"{first.data.get('model', '')}, chained",
                  "system": first.data.get("system", ""), "messages": messages}


def _regular_plan(rng: random.Random, runs: Sequence[Run]) -> list[tuple[Run, int | None]]:
    """4-7 tasks, at most two of them whole (never the huge run), 170-300 calls in all."""
    while True:
        chosen = rng.sample(list(runs), rng.randint(*DAY_TASKS))
        wholes = rng.choice((0, 1, 1, 2))
        eligible = [i for i, r in enumerate(chosen) if r.stem != HUGE_RUN]
        whole = set(rng.sample(eligible, min(wholes, len(eligible))))
        plan = [(run, None if i in whole else rng.randint(*PREFIX_CALLS))
                for i, run in enumerate(chosen)]
        total = sum(_task(run, calls)[1] for run, calls in plan)
        if DAY_CALLS[0] <= total <= DAY_CALLS[1]:
            return plan


def days(seed: int = DEFAULT_SEED, directory: Path = DEFAULT_DIR) -> Files:
    """Eight regular days and two long days (six whole runs each)."""
    rng = random.Random(f"{seed}:days")
    runs = _shipped(directory)
    out = [_day(n, _regular_plan(rng, runs), seed) for n in range(1, REGULAR_DAYS + 1)]
    tame = [r for r in runs if r.stem != HUGE_RUN]
    long_one = rng.sample(tame, LONG_DAY_TASKS)
    huge = next(r for r in runs if r.stem == HUGE_RUN)
    long_two = [*rng.sample(tame, LONG_DAY_TASKS - 1), huge]
    rng.shuffle(long_two)
    for n, chosen in enumerate((long_one, long_two), start=REGULAR_DAYS + 1):
        out.append(_day(n, [(run, None) for run in chosen], seed))
    return out


def short(seed: int = DEFAULT_SEED, directory: Path = DEFAULT_DIR) -> Files:
    """Two prefixes of each shipped run, each closed by the agent's report."""
    rng = random.Random(f"{seed}:short")
    out: Files = []
    for run in _shipped(directory):
        for _ in range(SHORT_PER_RUN):
            messages, calls, _how = _task(run, rng.randint(*PREFIX_CALLS))
            stem = f"short-{len(out) + 1:02d}-{_instance(run)}"
            source = (f"short task session made by bench/b1/workloads.py (seed {seed}): the "
                      f"first {calls - 1} steps of the shipped {_instance(run)} "
                      f"(tests/data/transcripts; {SHIPPED_LICENCE}), then the agent's report")
            out.append((stem, {"id": f"short/{stem}", "source": source,
                               "model": run.data.get("model", ""),
                               "system": run.data.get("system", ""), "messages": messages}))
    return out


# --- dense: a made-up repository and an agent exploring it --------------------------------------

NOUNS = (
    "ledger", "refund", "invoice", "payout", "settlement", "webhook", "tenant", "quota", "shard",
    "replica", "cursor", "snapshot", "manifest", "schema", "migration", "token", "session",
    "cache", "queue", "worker", "scheduler", "backoff", "audit", "export", "report", "metric",
    "alert", "policy", "account", "balance", "charge", "dispute", "currency", "window",
    "batch", "chunk", "segment", "partition", "index", "lease", "fence", "epoch", "journal",
    "record", "event", "stream", "channel", "route", "handler", "payload", "envelope", "digest",
    "checksum", "bundle", "artifact", "release", "rollout", "canary", "probe", "endpoint",
    "adapter", "gateway", "registry", "catalog", "price", "discount", "coupon", "cart", "order",
    "shipment", "carrier", "warehouse", "stock", "profile", "grant", "scope", "secret",
    "credential", "bucket", "upload", "thumbnail", "template", "locale", "timezone", "calendar",
    "deadline", "timeout", "budget", "limit", "threshold", "cluster", "node", "volume", "claim",
)
VERBS = (
    "compute", "apply", "resolve", "validate", "normalize", "reconcile", "dispatch", "enqueue",
    "flush", "merge", "split", "render", "parse", "load", "store", "fetch", "sync", "rotate",
    "expire", "refresh", "build", "collect", "emit", "encode", "decode", "serialize", "hydrate",
    "compact", "prune", "schedule", "acquire", "replay", "restore", "migrate", "verify", "sign",
    "redact", "estimate", "allocate", "settle", "capture", "issue", "publish", "subscribe",
    "match", "rank", "score", "filter", "group", "aggregate", "format", "patch", "drain",
)
QUALIFIERS = ("pending", "partial", "stale", "legacy", "default", "max", "next", "last", "raw",
              "safe", "bulk", "cached", "local", "remote", "primary", "fallback", "active")
KINDS = ("Adapter", "Service", "Manager", "Client", "Handler", "Repository", "Builder",
         "Resolver", "Validator", "Policy", "Config", "Error", "Result", "Snapshot", "Planner",
         "Worker", "Store", "Gateway", "Registry", "Tracker")
AUTHORS = ("a.okafor", "m.lindqvist", "r.tanaka", "s.haddad", "j.moreau", "k.novak", "p.ivanova",
           "d.oyelaran", "t.brennan", "l.castillo")


def _camel(*words: str) -> str:
    return "".join(w[:1].upper() + w[1:] for w in words)


def _words(name: str) -> list[str]:
    """The lower-case words of a snake_case, camelCase or CamelCase name."""
    return [w.lower() for w in re.findall(r"[A-Z]?[a-z]+", name)]


@dataclass(frozen=True)
class Dialect:
    """How one language spells the repository: files, functions, tests, tools."""

    name: str
    ext: str
    roots: tuple[str, ...]
    test_root: str

    def function(self, verb: str, noun: str, extra: str) -> str:
        if self.name == "python":
            return f"{verb}_{noun}_{extra}" if extra else f"{verb}_{noun}"
        if self.name == "go":
            return _camel(verb, noun, extra)
        return verb + _camel(noun, extra)

    def file(self, noun: str, extra: str) -> str:
        if self.name == "typescript":
            return noun + _camel(extra) + self.ext
        return f"{noun}_{extra}{self.ext}"

    def test_file(self, path: str) -> str:
        stem, _, _ = path.rpartition("/")[2].partition(".")
        folder = path.rpartition("/")[0]
        if self.name == "python":
            return f"{self.test_root}/{folder.split('/', 1)[-1]}/test_{stem}.py"
        if self.name == "go":
            return f"{folder}/{stem}_test.go"
        return f"{folder}/__tests__/{stem}.test.ts"

    def test_name(self, function: str, qualifier: str) -> str:
        if self.name == "python":
            return f"test_{function.lstrip('_')}_{qualifier}"
        return f"Test{_camel(function)}{_camel(qualifier)}" if self.name == "go" else \
            f"{function}{_camel(qualifier)}"


DIALECTS = {
    "python": Dialect("python", ".py", ("services", "libs", "workers"), "tests/unit"),
    "go": Dialect("go", ".go", ("internal", "pkg", "cmd"), ""),
    "typescript": Dialect("typescript", ".ts", ("packages", "apps"), ""),
}


@dataclass
class Function:
    name: str
    path: str
    line: int
    calls: list[str] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    tests: list[str] = field(default_factory=list)


@dataclass
class Commit:
    sha: str
    ticket: str
    author: str
    subject: str
    files: list[str]


@dataclass
class Repo:
    """A made-up repository: what every tool output is drawn from."""

    dialect: Dialect
    project: str
    files: dict[str, list[str]]  # path -> function names, in line order
    classes: dict[str, str]  # class -> path
    functions: dict[str, Function]
    keys: list[str]
    tickets: dict[str, str]  # ticket -> title
    commits: list[Commit]
    deps: list[tuple[str, str]]


def _unique(make: Callable[[], str], taken: set[str]) -> str:
    for _ in range(1000):
        name = make()
        if name not in taken:
            taken.add(name)
            return name
    raise RuntimeError("the word lists ran out of names")


def _file_path(rng: random.Random, dialect: Dialect, package: str) -> str:
    return f"{package}/" + dialect.file(rng.choice(NOUNS), rng.choice(NOUNS + QUALIFIERS))


def _repo(rng: random.Random, dialect: Dialect, project: str) -> Repo:
    taken: set[str] = set()
    files: dict[str, list[str]] = {}
    functions: dict[str, Function] = {}
    classes: dict[str, str] = {}
    packages = []
    for _ in range(rng.randint(7, 10)):
        depth = rng.randint(1, 3)
        package = "/".join([rng.choice(dialect.roots), project,
                            *rng.sample(NOUNS, depth)])
        packages.append(package)
    for package in packages:
        for _ in range(rng.randint(4, 7)):
            path = _unique(partial(_file_path, rng, dialect, package), taken)
            line = rng.randint(12, 40)
            names = []
            for _ in range(rng.randint(5, 10)):
                name = _unique(lambda: dialect.function(
                    rng.choice(VERBS), rng.choice(NOUNS),
                    rng.choice(("", *NOUNS, *QUALIFIERS))), taken)
                if dialect.name == "python" and rng.random() < 0.2:
                    name = "_" + name
                functions[name] = Function(name, path, line)
                names.append(name)
                line += rng.randint(9, 60)
            files[path] = names
            for _ in range(rng.randint(0, 2)):
                cls = _unique(lambda: _camel(rng.choice(NOUNS), rng.choice(NOUNS),
                                                  rng.choice(KINDS)), taken)
                classes[cls] = path
    keys = [_unique(lambda: "_".join(
        (project, rng.choice(NOUNS), rng.choice(NOUNS + QUALIFIERS),
         rng.choice(("DAYS", "SECONDS", "LIMIT", "RATIO", "ENABLED", "URL", "BYTES", "COUNT"))
         )).upper(), taken) for _ in range(rng.randint(20, 32))]
    names = list(functions)
    for function in functions.values():
        function.calls = rng.sample(names, rng.randint(1, 4))
        function.keys = rng.sample(keys, rng.randint(0, 2))
        function.tests = [dialect.test_name(function.name, q)
                          for q in rng.sample(QUALIFIERS, rng.randint(1, 3))]
    prefix = project[:3].upper() if len(project) >= 3 else project.upper()
    tickets = {}
    for _ in range(rng.randint(35, 60)):
        ticket = _unique(lambda: f"{prefix}-{rng.randint(1000, 9999)}", taken)
        tickets[ticket] = (f"{rng.choice(VERBS)} {rng.choice(QUALIFIERS)} {rng.choice(NOUNS)} "
                           f"in {rng.choice(names)}")
    paths = list(files)
    commits = []
    for _ in range(rng.randint(70, 110)):
        function = functions[rng.choice(names)]
        commits.append(Commit(
            sha=f"{rng.getrandbits(160):040x}", ticket=rng.choice(list(tickets)),
            author=rng.choice(AUTHORS),
            subject=f"{rng.choice(VERBS).capitalize()} {rng.choice(QUALIFIERS)} "
                    f"{rng.choice(NOUNS)} handling in {function.name}",
            files=[function.path, *rng.sample(paths, rng.randint(1, 10))]))
    deps = [(_unique(lambda: f"{rng.choice(NOUNS)}_{rng.choice(NOUNS)}"
                     if dialect.name == "python" else f"{rng.choice(NOUNS)}-{rng.choice(NOUNS)}",
                     taken),
             f"{rng.randint(0, 9)}.{rng.randint(0, 40)}.{rng.randint(0, 20)}")
            for _ in range(rng.randint(22, 40))]
    return Repo(dialect, project, files, classes, functions, keys, tickets, commits, deps)


@dataclass(frozen=True)
class Output:
    command: str
    text: str
    code: int
    #: The identifiers this call showed (what later THOUGHTs may refer back to).
    shown: tuple[str, ...]
    #: Why the agent runs the command, in the THOUGHT's words.
    intent: str = ""

    def __post_init__(self) -> None:
        # Only what the command or its output really spells counts as seen: a THOUGHT that
        # refers back to it then names something an earlier message named (b1.needed).
        said = self.command + "\n" + self.text
        object.__setattr__(self, "shown", tuple(
            i for i in dict.fromkeys(self.shown) if mentioned(said, i)))


class _Explorer:
    """An agent working a ticket in a :class:`Repo`: each call a command and its output."""

    def __init__(self, rng: random.Random, repo: Repo, ticket: str, focus: list[str]) -> None:
        self.rng = rng
        self.repo = repo
        self.ticket = ticket
        self.focus = focus
        #: Identifiers shown so far, with the call that first showed them.
        self.seen: dict[str, int] = {}
        self.recent: list[str] = []
        self.fixed = False

    # -- choosing what to look at ------------------------------------------------------------

    def pick(self, kind: Callable[[str], bool], *, old: bool = False) -> str:
        pool = [i for i in (self.seen if old else self.recent or self.seen) if kind(i)]
        if not pool:
            pool = [i for i in self.seen if kind(i)] or list(self.focus)
        return self.rng.choice(pool)

    def is_function(self, name: str) -> bool:
        return name in self.repo.functions

    def is_path(self, name: str) -> bool:
        return name in self.repo.files

    def is_ticket(self, name: str) -> bool:
        return name in self.repo.tickets

    def is_key(self, name: str) -> bool:
        return name in self.repo.keys

    def is_class(self, name: str) -> bool:
        return name in self.repo.classes

    # -- the tools ---------------------------------------------------------------------------

    def grep(self, name: str) -> Output:
        repo, rng = self.repo, self.rng
        target = repo.functions[name]
        lines, shown = [], [name, target.path]
        lines.append(f"{target.path}:{target.line}:{self._signature(target)}")
        callers = [f for f in repo.functions.values() if name in f.calls]
        others = rng.sample(list(repo.functions.values()), min(18, len(repo.functions)))
        for caller in (callers + others)[:rng.randint(16, 34)]:
            pool = [*caller.keys, *(c for c in caller.calls[:2] if c != name), "ctx"]
            args = ", ".join(rng.sample(pool, k=min(2, len(pool))))
            line = caller.line + rng.randint(2, 8)
            lines.append(f"{caller.path}:{line}:    {self._assign(caller.name)}{name}({args})")
            shown += [caller.path, *caller.keys, *caller.calls[:2]]
        for test in target.tests:
            path = repo.dialect.test_file(target.path)
            lines.append(f"{path}:{rng.randint(20, 400)}:{self._test_line(test, name)}")
            shown += [path, test]
        return Output(f'grep -rn "{name}" .', "\n".join(lines), 0, tuple(shown),
                      f"Let me see every use of `{name}`.")

    def show_file(self, path: str) -> Output:
        repo, rng = self.repo, self.rng
        names = repo.files[path]
        start = rng.randrange(max(1, len(names) - 3))
        chosen = names[start:start + rng.randint(3, 5)]
        first = repo.functions[chosen[0]].line
        body: list[str] = []
        shown = [path]
        for name in chosen:
            function = repo.functions[name]
            body.append(self._signature(function))
            ticket = rng.choice(list(repo.tickets))
            body.append(self._comment(f"{ticket}: {repo.tickets[ticket]}"))
            for key in function.keys:
                body.append(self._read_key(key))
            for callee in function.calls:
                args = ", ".join(dict.fromkeys(_words(function.name)[-2:] or ["value"]))
                body.append(f"    {self._assign(callee)}{callee}({args})")
            cls = rng.choice(list(repo.classes))
            body.append(self._raise(cls, function.name))
            body.append("" if repo.dialect.name == "python" else "}")
            shown += [name, ticket, *function.keys, *function.calls, cls]
        last = first + len(body)
        return Output(f"sed -n '{first},{last}p' {path}", "\n".join(body), 0, tuple(shown),
                      f"Reading {path} around `{chosen[0]}`.")

    def log(self, path: str) -> Output:
        commits = [c for c in self.repo.commits if path in c.files] or self.repo.commits
        picked = self.rng.sample(commits, min(len(commits), self.rng.randint(14, 30)))
        lines = [f"{c.sha[:7]} {c.ticket}: {c.subject}" for c in picked]
        shown = [path, *(c.ticket for c in picked),
                 *(w for c in picked for w in c.subject.split() if self.is_function(w))]
        return Output(f"git log --oneline -n 30 -- {path}", "\n".join(lines), 0, tuple(shown),
                      f"What changed recently in {path}?")

    def show_commit(self, ticket: str) -> Output:
        commits = [c for c in self.repo.commits if c.ticket == ticket] or self.repo.commits
        commit = self.rng.choice(commits)
        lines = [f"commit {commit.sha}", f"Author: {commit.author} <{commit.author}@example.com>",
                 "", f"    {commit.ticket}: {commit.subject}", "",
                 f"    Refs {', '.join(self.rng.sample(list(self.repo.tickets), 3))}", ""]
        total = 0
        for path in commit.files:
            changed = self.rng.randint(1, 80)
            total += changed
            lines.append(f" {path} | {changed} {'+' * min(changed, 30)}")
        lines.append(f" {len(commit.files)} files changed, {total} insertions(+)")
        shown = [ticket, *commit.files, *(w for w in commit.subject.split() if self.is_function(w))]
        return Output(f"git show --stat {commit.sha[:7]}", "\n".join(lines), 0, tuple(shown),
                      f"Let me look at the commit for {ticket}.")

    def tests(self, path: str) -> Output:
        repo, rng = self.repo, self.rng
        dialect = repo.dialect
        test_path = dialect.test_file(path)
        functions = [repo.functions[n] for n in repo.files[path]]
        failing = [] if self.fixed else [f for f in functions if f.name in self.focus] or \
            functions[:1]
        lines: list[str] = []
        shown = [test_path, path]
        for function in failing:
            test = function.tests[0]
            frames = [function, *(repo.functions[c] for c in function.calls)]
            if dialect.name == "python":
                lines.append(f"____ {test} ____")
                for frame in frames:
                    lines.append(f"{frame.path}:{frame.line + rng.randint(1, 9)}: in {frame.name}")
            elif dialect.name == "go":
                lines.append(f"--- FAIL: {test} (0.0{rng.randint(1, 9)}s)")
                for frame in frames:
                    lines.append(f"    {frame.path}:{frame.line}: {frame.name}() returned an "
                                 f"unexpected {rng.choice(NOUNS)}")
            else:
                lines.append(f"  ● {function.name} › {test}")
                for frame in frames:
                    lines.append(f"      at {frame.name} ({frame.path}:{frame.line}:"
                                 f"{rng.randint(3, 40)})")
            lines.append(f"{self._failure(function)}")
            shown += [test, *(f.name for f in frames), *(f.path for f in frames),
                      *function.keys]
        passed = [t for f in functions for t in f.tests if f not in failing]
        for test in passed:
            lines.append(self._passed(test_path, test))
        shown += passed
        summary = (f"{len(failing)} failed, {len(passed)} passed" if failing
                   else f"{len(passed)} passed")
        lines.append(f"==== {summary} in {rng.randint(1, 9)}.{rng.randint(10, 99)}s ====")
        command = {"python": f"python -m pytest {test_path} -q -rA",
                   "go": f"go test ./{path.rpartition('/')[0]}/... -v",
                   "typescript": f"npx jest {test_path} --verbose"}[dialect.name]
        return Output(command, "\n".join(lines), 1 if failing else 0, tuple(shown),
                      f"Running the tests for {path}.")

    def find(self) -> Output:
        paths = self.rng.sample(list(self.repo.files),
                                min(len(self.repo.files), self.rng.randint(30, 60)))
        root = paths[0].split("/", 1)[0]
        return Output(f"find {root} -name '*{self.repo.dialect.ext}' | sort | head -80",
                      "\n".join(sorted(paths)), 0, tuple(paths),
                      f"Listing the source files under {root}/ again.")

    def todos(self) -> Output:
        lines, shown = [], []
        for ticket in self.rng.sample(list(self.repo.tickets), self.rng.randint(14, 26)):
            function = self.repo.functions[self.rng.choice(list(self.repo.functions))]
            cls = self.rng.choice(list(self.repo.classes))
            lines.append(f"{function.path}:{function.line + 3}:{self._comment('')[:-1]}"
                         f"TODO({ticket}): {self.repo.tickets[ticket]} once {cls} handles it")
            shown += [function.path, ticket, cls,
                      *(w for w in self.repo.tickets[ticket].split() if self.is_function(w))]
        prefix = self.ticket.split("-")[0]
        return Output(f'grep -rn "TODO({prefix}-" --include="*{self.repo.dialect.ext}" .',
                      "\n".join(lines), 0, tuple(shown),
                      "Are there open TODOs tied to related tickets?")

    def config(self) -> Output:
        lines, shown = [], []
        for key in self.rng.sample(self.repo.keys, self.rng.randint(12, len(self.repo.keys))):
            users = [f.name for f in self.repo.functions.values() if key in f.keys][:3]
            note = f"  # read by {', '.join(users)}" if users else ""
            value = self.rng.choice(("30", "0.85", "true", "512", "https://internal.example"))
            lines.append(f"{key}={value}{note}")
            shown += [key, *users]
        return Output("cat deploy/config/app.env", "\n".join(lines), 0, tuple(shown),
                      "Which settings does the deployment set?")

    def deps(self) -> Output:
        lines = [f"{name}=={version}" if self.repo.dialect.name == "python"
                 else f"{name}@{version}" for name, version in self.repo.deps]
        command = {"python": "pip freeze", "go": "go list -m all",
                   "typescript": "npm ls --depth=0"}[self.repo.dialect.name]
        return Output(command, "\n".join(lines), 0, tuple(n for n, _ in self.repo.deps),
                      "Checking the pinned dependency versions.")

    def edit(self, name: str) -> Output:
        function = self.repo.functions[name]
        callee = self.rng.choice(function.calls)
        command = (f"sed -i '{function.line + 4}s/{callee}(/{callee}(ctx, /' {function.path} "
                   f"&& git diff --stat")
        text = f" {function.path} | 2 +-\n 1 file changed, 1 insertion(+), 1 deletion(-)"
        return Output(command, text, 0, (function.path,),
                      f"Changing the call to `{callee}` in `{name}` ({function.path}).")

    # -- spelling, per dialect ----------------------------------------------------------------

    def _signature(self, function: Function) -> str:
        dialect = self.repo.dialect.name
        if dialect == "python":
            return f"def {function.name}(ctx, {self._args(function)}):"
        if dialect == "go":
            return f"func {function.name}(ctx context.Context, {self._args(function)}) error {{"
        return f"export function {function.name}(ctx: Context, {self._args(function)}) {{"

    def _args(self, function: Function) -> str:
        names = ", ".join(dict.fromkeys(_words(function.name)[-2:] or ["value"]))
        return f"{names} string" if self.repo.dialect.name == "go" else names

    def _assign(self, name: str) -> str:
        words = _words(name)
        var = words[-1] if words else "result"
        return {"python": f"{var} = ", "go": f"{var}, err := ",
                "typescript": f"const {var} = "}[self.repo.dialect.name]

    def _comment(self, text: str) -> str:
        mark = "#" if self.repo.dialect.name == "python" else "//"
        return f"    {mark} {text}"

    def _read_key(self, key: str) -> str:
        var = key.split("_")[-2].lower()
        return {"python": f'    {var} = settings.get("{key}")',
                "go": f'    {var} := cfg.Int("{key}")',
                "typescript": f"    const {var} = config.get('{key}');"}[self.repo.dialect.name]

    def _raise(self, cls: str, name: str) -> str:
        return {"python": f'    raise {cls}("{name}: unexpected state")',
                "go": f'    return fmt.Errorf("{name}: %w", Err{cls})',
                "typescript": f"    throw new {cls}('{name}: unexpected state');"
                }[self.repo.dialect.name]

    def _test_line(self, test: str, name: str) -> str:
        return {"python": f"def {test}(ctx):  # covers {name}",
                "go": f"func {test}(t *testing.T) {{ // covers {name}",
                "typescript": f"  it('{test}', () => {{ /* covers {name} */"
                }[self.repo.dialect.name]

    def _failure(self, function: Function) -> str:
        key = function.keys[0] if function.keys else "threshold"
        return {"python": f"E   AssertionError: {function.name} returned 12.30, expected 12.31 "
                          f"(with {key})",
                "go": f"    expected {key} to be honoured by {function.name}",
                "typescript": f"    Expected: 1231  Received: 1230  ({function.name}, {key})"
                }[self.repo.dialect.name]

    def _passed(self, path: str, test: str) -> str:
        return {"python": f"PASSED {path}::{test}", "go": f"--- PASS: {test} (0.00s)",
                "typescript": f"  ✓ {test} ({self.rng.randint(1, 30)} ms)"
                }[self.repo.dialect.name]

    # -- one call ------------------------------------------------------------------------------

    def step(self, k: int, calls: int) -> tuple[str, Output]:
        """The THOUGHT and the command output of call ``k`` of ``calls``."""
        if k == 0:
            output = self.find()
        elif k == 1:
            output = self.grep(self.focus[0])
        elif k == calls - 3:
            self.fixed = True
            output = self.tests(self.repo.functions[self.focus[0]].path)
        else:
            output = self._explore(k, calls)
        thought = self._thought(k, output) if k > 1 else self._opening(k)
        for name in output.shown:
            self.seen.setdefault(name, k)
        self.recent = list(dict.fromkeys(output.shown))
        return thought, output

    def _explore(self, k: int, calls: int) -> Output:
        rng = self.rng
        roll = rng.random()
        old = rng.random() < 0.5  # half the time, go back to something seen long ago
        if k > calls * 0.6 and roll < 0.12:
            return self.edit(self.pick(self.is_function, old=old))
        if roll < 0.30:
            return self.grep(self.pick(self.is_function, old=old))
        if roll < 0.50:
            return self.show_file(self.pick(self.is_path, old=old))
        if roll < 0.62:
            return self.log(self.pick(self.is_path, old=old))
        if roll < 0.72:
            return self.show_commit(self.pick(self.is_ticket, old=old))
        if roll < 0.86:
            return self.tests(self.pick(self.is_path, old=old))
        return rng.choice((self.todos, self.config, self.deps, self.find))()

    def _opening(self, k: int) -> str:
        if k == 0:
            return (f"THOUGHT: {self.ticket} is about `{self.focus[0]}`. I'll start by listing "
                    "the source files to see how the repository is laid out.")
        return (f"THOUGHT: Let me find every use of `{self.focus[0]}` and the tests that "
                "cover it.")

    def _thought(self, k: int, output: Output) -> str:
        rng = self.rng
        f_new = self.pick(self.is_function)
        f_old = self.pick(lambda i: self.is_function(i) and i != f_new, old=True)
        p_old = self.pick(self.is_path, old=True)
        others = [self.pick(kind, old=True) for kind in
                  rng.sample((self.is_ticket, self.is_key, self.is_class, self.is_function,
                              self.is_path), 3)]
        extra = ", ".join(f"`{o}`" for o in dict.fromkeys(others))
        templates = (
            f"`{f_new}` is what the last output points at, and it looks like `{f_old}` in "
            f"{p_old} (seen earlier) has the same problem. Also relevant: {extra}.",
            f"Going back to `{f_old}` in {p_old}: it is called with the values that "
            f"`{f_new}` produces. I still need to check {extra}.",
            f"The failure path runs through `{f_new}` and then `{f_old}`; earlier I saw "
            f"{extra} involved, so the cause may sit in {p_old}.",
            f"Before changing `{f_old}` ({p_old}) I want to see how `{f_new}` uses it; "
            f"{extra} came up earlier in this investigation.",
        )
        return f"THOUGHT: {rng.choice(templates)} {output.intent}"

    def report(self) -> str:
        rng = self.rng
        functions = [i for i in self.seen if self.is_function(i)]
        touched = rng.sample(functions, min(6, len(functions)))
        paths = [self.repo.functions[f].path for f in touched]
        tickets = [i for i in self.seen if self.is_ticket(i)]
        keys = [i for i in self.seen if self.is_key(i)]
        return (f"Done with {self.ticket}: the fix is in {_listing(touched, 6)} "
                f"({_listing(list(dict.fromkeys(paths)), 6)}); the tests pass. Related "
                f"tickets to follow up: {_listing(rng.sample(tickets, min(4, len(tickets))), 4)}"
                f"; settings involved: {_listing(rng.sample(keys, min(3, len(keys))), 3)}.")


@dataclass(frozen=True)
class DenseSpec:
    name: str
    dialect: str
    project: str
    calls: tuple[int, int]


#: One session each; calls drawn from the range.
DENSE_SPECS = (
    DenseSpec("dense-01-billing-py", "python", "billing", (40, 60)),
    DenseSpec("dense-02-controller-go", "go", "fleet", (60, 90)),
    DenseSpec("dense-03-checkout-ts", "typescript", "checkout", (60, 90)),
    DenseSpec("dense-04-pipeline-py", "python", "ingest", (100, 130)),
    DenseSpec("dense-05-scheduler-go", "go", "sched", (135, 150)),
)

DENSE_SYSTEM = (
    "You are a software engineer working in a repository through a bash tool. Every answer is "
    "a THOUGHT paragraph, then exactly one bash command in a ```bash block, which is run for "
    "you; its output comes back as the tool result. When the task is done, answer with a short "
    "report and no command.")


def _observation(output: Output) -> str:
    return f"<returncode>{output.code}</returncode>\n<output>\n{output.text}\n</output>"


def _dense_session(spec: DenseSpec, seed: int) -> Json:
    rng = random.Random(f"{seed}:dense:{spec.name}")
    repo = _repo(rng, DIALECTS[spec.dialect], spec.project)
    calls = rng.randint(*spec.calls)
    ticket = rng.choice(list(repo.tickets))
    focus = rng.sample(list(repo.functions), 3)
    target = repo.functions[focus[0]]
    key = target.keys[0] if target.keys else repo.keys[0]
    cls = rng.choice(list(repo.classes))
    task = (f"Ticket {ticket}: {repo.tickets[ticket]}.\n\nSince the last release, "
            f"`{focus[0]}` ({target.path}) gives results one unit off when `{key}` is set, and "
            f"`{focus[1]}` raises `{cls}` for some inputs; `{focus[2]}` may be involved. Find "
            f"the cause, fix it, and make sure the tests around {target.path} pass.")
    explorer = _Explorer(rng, repo, ticket, focus)
    messages: list[Json] = [{"role": "user", "content": [{"type": "text", "text": task}]}]
    for k in range(calls - 1):
        thought, output = explorer.step(k, calls - 1)
        call_id = f"toolu_{k + 1:05d}"
        text = f"{thought}\n\n```bash\n{output.command}\n```"
        messages.append({"role": "assistant", "content": [
            {"type": "text", "text": text},
            {"type": "tool_use", "id": call_id, "name": "bash",
             "input": {"command": output.command}}]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": call_id, "content": _observation(output),
             "is_error": output.code != 0}]})
    messages.append({"role": "assistant",
                     "content": [{"type": "text", "text": explorer.report()}]})
    source = (f"generated by bench/b1/workloads.py (seed {seed}): a {spec.dialect} coding "
              f"agent working ticket {ticket} in a made-up repository whose tool outputs are "
              "dense in identifiers")
    return {"id": f"dense/{spec.name}", "source": source, "model": "generated",
            "system": DENSE_SYSTEM, "messages": messages}


def dense(seed: int = DEFAULT_SEED) -> Files:
    """The generated identifier-dense sessions, one per :data:`DENSE_SPECS` entry."""
    return [(spec.name, _dense_session(spec, seed)) for spec in DENSE_SPECS]


# --- public ------------------------------------------------------------------------------------

def public(traces: Path = DEFAULT_TRACES) -> Files:
    """Public agent traces converted by :mod:`b1.public_traces` (ValueError when absent)."""
    return convert_all(traces)


# --- writing and the table ---------------------------------------------------------------------

WORKLOADS = ("seven", "days", "short", "dense", "public")


def generate(name: str, seed: int = DEFAULT_SEED, traces: Path = DEFAULT_TRACES) -> Files:
    if name == "seven":
        return seven()
    if name == "days":
        return days(seed)
    if name == "short":
        return short(seed)
    if name == "dense":
        return dense(seed)
    if name == "public":
        return public(traces)
    raise ValueError(f"unknown workload {name!r}; have {', '.join(WORKLOADS)}")


def encode(transcript: Json) -> bytes:
    return (json.dumps(transcript, ensure_ascii=False) + "\n").encode("utf-8")


def write(folder: Path, files: Files, *, copy_from: Path | None = None) -> list[Path]:
    """Write ``files`` into ``folder`` (its old ``*.json`` removed first); with ``copy_from``,
    each file is that folder's file of the same stem, byte for byte."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.json"):
        old.unlink()
    paths = []
    for stem, transcript in files:
        path = folder / f"{stem}.json"
        if copy_from is not None:
            path.write_bytes((copy_from / f"{stem}.json").read_bytes())
        else:
            path.write_bytes(encode(transcript))
        paths.append(path)
    return paths


@dataclass(frozen=True)
class Row:
    workload: str
    file: str
    calls: int
    messages: int
    chars: int
    tokens: int
    peak: int


def _chars(message: Mapping[str, Any]) -> int:
    return sum(len(t) for t in _strings(message["content"]))


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def measure(workload: str, stem: str, transcript: Json, counter: Counter) -> Row:
    """One table row: the peak is the largest request (system + every earlier message) any
    call of the transcript sends when nothing is compacted."""
    messages = transcript["messages"]
    system = counter.system(str(transcript.get("system") or ""))
    running = peak = system
    calls = 0
    for message in messages:
        if message["role"] == "assistant":
            calls += 1
            peak = max(peak, running)
        running += counter.message(message)
    return Row(workload, stem, calls, len(messages),
               len(str(transcript.get("system") or "")) + sum(_chars(m) for m in messages),
               running, peak)


def table(rows: Sequence[Row]) -> str:
    lines = ["| workload | file | calls | messages | characters | tokens | peak request |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r.workload} | {r.file} | {r.calls} | {r.messages} | {r.chars:,} | "
                     f"{r.tokens:,} | {r.peak:,} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", default=",".join(WORKLOADS),
                        help=f"comma-separated, from {', '.join(WORKLOADS)}")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES,
                        help="raw public traces (see bench/b1/public_traces.py)")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload(s) {unknown}; have {', '.join(WORKLOADS)}")
    counter = Counter()
    rows: list[Row] = []
    for name in names:
        try:
            files = generate(name, args.seed, args.traces)
        except ValueError as exc:
            if name != "public":
                raise
            print(f"public: skipped: {exc}", file=sys.stderr)
            continue
        write(args.out / name, files, copy_from=DEFAULT_DIR if name == "seven" else None)
        rows += [measure(name, stem, t, counter) for stem, t in files]
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
