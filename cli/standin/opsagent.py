"""A scripted operations agent: long, tool-using conversations generated for the demo.

Each session is a standing agent on an on-call shift: it reads logs, queries tickets, runs SQL
against a billing replica and reads config files, one tool call per assistant message. Early in
the shift it meets identifiers (an account number, a ticket id, a file path), works on them for a
while, moves on to another incident, and is asked about them again many turns later — the demo
checks whether those late questions can still be answered from the (compacted) window.

Everything is deterministic for a given ``(agent, turns, seed)``.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

from sessionfold.core.errors import InvalidInputError
from sessionfold.core.messages import Conversation, parse_messages

__all__ = ["SYSTEM_PROMPT", "LateQuestion", "OpsSession", "generate_session"]

SYSTEM_PROMPT = (
    "You are an on-call operations agent for a payments company. You have four tools: "
    "read_logs(service, since), query_ticket(ticket_id), run_sql(query) against the read-only "
    "billing replica, and read_file(path). Investigate before acting, one tool call at a time, "
    "and keep the identifiers of every open incident (account numbers, ticket ids, file paths) "
    "at hand: the shift lead will ask about them."
)

_SERVICES = ("ledger-api", "card-auth", "payout-worker", "fx-rates", "kyc-gateway", "webhooks")
_HOSTS = ("ip-10-4-1-17", "ip-10-4-2-33", "ip-10-4-3-8", "ip-10-4-1-90")
_ERRORS = (
    "timeout talking to upstream {svc} after 30000ms",
    "deadlock detected while updating ledger_entries for {acct}",
    "card network returned code 05 (do not honor) for {acct}",
    "retry budget exhausted for payout {payout} ({acct})",
    "schema mismatch: field 'settlement_currency' missing in event {event}",
)
_CONFIGS = (
    "/etc/payments/ledger-api/limits.yaml",
    "/etc/payments/card-auth/routing.toml",
    "/srv/payout-worker/config/retry_policy.json",
    "/opt/fx-rates/conf/providers.yaml",
)


@dataclass(frozen=True)
class LateQuestion:
    """A question asked at ``seq`` about an identifier first seen at ``first_seen_seq``."""

    seq: int
    identifier: str
    first_seen_seq: int


@dataclass
class OpsSession:
    """One generated session: the conversation and the late questions it contains."""

    name: str
    conversation: Conversation
    late_questions: list[LateQuestion] = field(default_factory=list)


# Incidents and background noise draw their identifiers from disjoint ranges, so a log line about
# some other account can never name an incident's account by chance.
def _acct(rng: random.Random, *, noise: bool = False) -> str:
    return f"ACCT-{rng.randint(5000, 9999) if noise else rng.randint(1000, 4999)}"


def _ticket(rng: random.Random, *, noise: bool = False) -> str:
    return f"INC-{rng.randint(60000, 99999) if noise else rng.randint(20000, 59999)}"


def _log_output(rng: random.Random, svc: str, acct: str, lines: int) -> str:
    out = []
    for i in range(lines):
        level = rng.choice(("INFO", "INFO", "INFO", "WARN", "ERROR"))
        msg = (rng.choice(_ERRORS) if level != "INFO" else "handled request in {ms}ms").format(
            svc=rng.choice(_SERVICES), acct=acct if rng.random() < 0.3 else _acct(rng, noise=True),
            payout=f"po_{rng.getrandbits(40):010x}", event=f"evt_{rng.getrandbits(48):012x}",
            ms=rng.randint(3, 900),
        )
        out.append(f"2026-11-29T{8 + i // 3600 % 12:02d}:{i // 60 % 60:02d}:{i % 60:02d}Z "
                   f"{rng.choice(_HOSTS)} {svc} [{level}] {msg}")
    return "\n".join(out)


def _ticket_output(rng: random.Random, ticket: str, acct: str) -> str:
    return json.dumps({
        "id": ticket, "status": rng.choice(("open", "investigating", "waiting-on-customer")),
        "account": acct, "priority": rng.choice(("P1", "P2", "P3")),
        "summary": f"Customer {acct} reports failed payouts since the last deploy",
        "comments": [{"author": rng.choice(("maria", "sam", "jon", "li")),
                      "text": rng.choice(("Seeing more retries on payout-worker.",
                                          "Customer escalated via account manager.",
                                          "Possibly related to the fx-rates provider switch."))}
                     for _ in range(rng.randint(2, 6))],
    }, indent=2)


def _sql_output(rng: random.Random, acct: str, rows: int) -> str:
    header = "payout_id          | account   | amount_cents | currency | status   | attempts"
    body = [f"po_{rng.getrandbits(40):010x} | {acct} | {rng.randint(100, 900000):>12} | "
            f"{rng.choice(('USD', 'EUR', 'GBP'))}      | {rng.choice(('failed', 'paid', 'retry'))}"
            f"   | {rng.randint(1, 9)}" for _ in range(rows)]
    return "\n".join([header, "-" * len(header), *body, f"({rows} rows)"])


def _file_output(rng: random.Random, path: str) -> str:
    keys = ("max_attempts", "backoff_ms", "timeout_ms", "circuit_breaker_threshold", "batch_size")
    return "\n".join(f"{k}: {rng.randint(1, 5000)}" for k in keys for _ in range(rng.randint(1, 4)))


@dataclass(frozen=True)
class _Incident:
    """What the agent is working on: an account, its ticket, and the config file involved."""

    acct: str
    ticket: str
    path: str


def _tool_step(rng: random.Random, kind: str, focus: _Incident,
               configs: tuple[str, ...]) -> tuple[str, dict[str, Any], str]:
    """(thought, tool input, tool output) of one step of work on ``focus``.

    ``configs`` are the files the agent may read; the incident's own is read only when among them.
    """
    svc = rng.choice(_SERVICES)
    if kind == "read_logs":
        output = _log_output(rng, svc, focus.acct, rng.randint(20, 70))
        return (f"Checking recent {svc} logs for errors related to {focus.acct}.",
                {"service": svc, "since": f"{rng.randint(5, 120)}m"}, output)
    if kind == "query_ticket":
        tid = focus.ticket if rng.random() < 0.4 else _ticket(rng, noise=True)
        output = _ticket_output(rng, tid,
                                focus.acct if tid == focus.ticket else _acct(rng, noise=True))
        return f"Looking up {tid} for context.", {"ticket_id": tid}, output
    if kind == "run_sql":
        query = (f"SELECT payout_id, account, amount_cents, currency, status, attempts FROM "
                 f"payouts WHERE account = '{focus.acct}' ORDER BY created_at DESC LIMIT 40")
        return (f"Querying the billing replica for {focus.acct}'s recent payouts.",
                {"query": query}, _sql_output(rng, focus.acct, rng.randint(10, 40)))
    p = focus.path if focus.path in configs and rng.random() < 0.3 else rng.choice(configs)
    return f"Reading {p} to check the retry settings.", {"path": p}, _file_output(rng, p)


def generate_session(agent: int, turns: int = 160, seed: int = 7) -> OpsSession:
    """An operations-agent session of ``turns`` tool steps (two messages each, plus questions).

    The shift has three phases. Routine checks on unrelated accounts until the shift lead
    escalates a first incident (an account and its ticket, in user text at step 3); the agent
    investigates it, reading its config file at step 6; at about a third of the shift the lead
    hands it a second incident and the first is never mentioned again — until the late
    questions (at 70 %, 85 % and the end of the shift) ask for the first incident's account,
    ticket and config file. Only a window that kept them from the early turns can answer.
    """
    if turns < 10:
        raise InvalidInputError(f"turns must be at least 10, got {turns}")
    rng = random.Random(f"{seed}:{agent}")
    first = _Incident(_acct(rng), _ticket(rng), rng.choice(_CONFIGS))
    second = first
    while second.acct == first.acct or second.ticket == first.ticket:
        second = _Incident(_acct(rng), _ticket(rng),
                           rng.choice([c for c in _CONFIGS if c != first.path]))
    # Files the agent reads when not looking at its incident's own: never the first incident's,
    # so that file is only ever named while that incident is the focus.
    other_configs = tuple(c for c in _CONFIGS if c != first.path)
    # The task names none of the identifiers: they arrive mid-shift (an escalation in user text,
    # a file the agent decides to read), so only a window that kept them can answer later.
    raw: list[dict[str, Any]] = [{"role": "user", "content": (
        f"Shift handover for agent {agent}: payouts are failing for some customers since the "
        "last deploy. Watch the payout-worker logs; the shift lead will send escalations.")}]
    questions: list[LateQuestion] = []
    first_seen: dict[str, int] = {}
    escalate_at, config_at = 3, 6
    handover_at = max(config_at + 4, int(turns * 0.35))
    ask_acct = int(turns * 0.7)
    ask_ticket = max(ask_acct + 1, int(turns * 0.85))
    ask_path = min(turns - 1, max(ask_ticket + 1, turns - 3))
    ask_at = {ask_acct: first.acct, ask_ticket: first.ticket, ask_path: first.path}
    for step in range(turns):
        tool_id = f"toolu_{agent:02d}_{step:04d}"
        kind = rng.choice(("read_logs", "read_logs", "query_ticket", "run_sql", "read_file"))
        if step == config_at:
            first_seen[first.path] = len(raw)  # the assistant message about to be appended
            thought = f"The payout retry settings live in {first.path}; reading it."
            tool_input: dict[str, Any] = {"path": first.path}
            output = _file_output(rng, first.path)
            kind = "read_file"
        elif step <= escalate_at:  # routine: an unrelated account each step
            routine = _Incident(_acct(rng, noise=True), _ticket(rng, noise=True),
                                rng.choice(other_configs))
            thought, tool_input, output = _tool_step(rng, kind, routine, other_configs)
        elif step <= handover_at:  # its config file only once the agent has found it
            configs = _CONFIGS if step > config_at else other_configs
            thought, tool_input, output = _tool_step(rng, kind, first, configs)
        else:
            thought, tool_input, output = _tool_step(rng, kind, second, other_configs)
        raw.append({"role": "assistant", "content": [
            {"type": "text", "text": thought},
            {"type": "tool_use", "id": tool_id, "name": kind, "input": tool_input}]})
        result: list[dict[str, Any]] = [{"type": "tool_result", "tool_use_id": tool_id,
                                         "content": output,
                                         **({"is_error": True} if rng.random() < 0.05 else {})}]
        if step == escalate_at:
            first_seen[first.acct] = first_seen[first.ticket] = len(raw)
            result.append({"type": "text", "text": (
                f"Escalation from the shift lead: account {first.acct} opened ticket "
                f"{first.ticket}; their payouts have failed since yesterday. Keep both at hand.")})
        if step == handover_at:
            result.append({"type": "text", "text": (
                "Shift lead: park the first escalation, it waits on the customer now. New one: "
                f"account {second.acct}, ticket {second.ticket}; start with {second.path}.")})
        if step in ask_at:
            ident = ask_at[step]
            questions.append(LateQuestion(seq=len(raw), identifier=ident,
                                          first_seen_seq=first_seen[ident]))
            what = {first.acct: "the account number of the first escalation",
                    first.ticket: "the ticket id of the first escalation",
                    first.path: "the retry config file you read for it"}[ident]
            result.append({"type": "text", "text": (
                f"Shift lead here: remind me, what was {what} early in your shift? Answer from "
                "your notes before continuing.")})
        raw.append({"role": "user", "content": result})
    raw.append({"role": "assistant", "content": [{"type": "text", "text": (
        f"Summary for the shift lead: {first.ticket} on {first.acct} is parked; {first.path} "
        f"needs review. {second.ticket} on {second.acct} is in progress.")}]})
    conv = Conversation(system=SYSTEM_PROMPT, messages=parse_messages(raw))
    return OpsSession(name=f"ops-agent-{agent:02d}", conversation=conv, late_questions=questions)
