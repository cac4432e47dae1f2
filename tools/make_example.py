"""Write the bundled example session, ``cli/examples/ops-incident-acct-8842.json``.

The example is a tool-using operations agent working one billing incident from first report to
close-out: it reads a ticket, searches logs, queries the payments database, reads code and a
runbook, fixes a bug, issues refunds under an approval, and answers a late question about the
identifiers it met at the start (ACCT-8842, INV-2025-11-0042, OPS-1193, a commit, file paths).
Two tool outputs are large (a log search and a duplicate-charge report), and the whole session is
about 1.5× the default ``sessionfold compact`` budget, so compacting it at that budget folds.

The output is deterministic (a seeded ``random.Random``): running this script again rewrites the
committed file byte for byte. Run it from the repository root::

    python tools/make_example.py            # writes the file
    python tools/make_example.py --check    # exits 1 if the committed file differs
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "cli" / "examples" / "ops-incident-acct-8842.json"

SYSTEM = (
    "You are Relay, the on-call operations agent for the billing platform of Northwind Cloud. "
    "You investigate incidents with the tools you are given, keep the ticket updated, and never "
    "issue a refund, credit or configuration change without an approval id from finance or the "
    "service owner. Quote identifiers (account, invoice, ticket, charge ids, file paths, commit "
    "hashes) exactly. When you are done, summarise root cause, impact and follow-ups on the "
    "ticket."
)

rng = random.Random(8842)
LOG0 = datetime(2025, 11, 26, 0, 0, 7)    # where log searches start counting
DEPLOY = datetime(2025, 11, 26, 17, 5, 12)  # the deploy of the bad commit

AFFECTED = [  # account, invoice, amount in cents, ticket (None: nobody complained yet)
    ("ACCT-8842", "INV-2025-11-0042", 4198, "OPS-1193"),
    ("ACCT-9120", "INV-2025-11-0417", 12900, "OPS-1201"),
    ("ACCT-7310", "INV-2025-11-0388", 2599, "OPS-1207"),
    ("ACCT-6655", "INV-2025-11-0231", 8800, None),
    ("ACCT-1029", "INV-2025-11-0519", 1499, None),
    ("ACCT-4471", "INV-2025-11-0602", 31000, None),
]


def ts(base: datetime, minutes: float) -> str:
    return (base + timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def hexid(n: int) -> str:
    return "".join(rng.choice("0123456789abcdef") for _ in range(n))


def charge_id() -> str:
    return "ch_3P" + "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz23456789")
                             for _ in range(19))


#: The two charge ids of each affected account; filled by :func:`build` after reseeding.
CHARGES: dict[str, tuple[str, str]] = {}
#: Every invoice paid twice (account, invoice, cents, first charge at), as the SQL report lists
#: them; the postmortem's appendix repeats them.
DUPLICATES: list[tuple[str, str, int, str]] = []


# --- tool outputs ------------------------------------------------------------------------------

def ticket(tid: str, acct: str, inv: str, cents: int, opened: str, body: str) -> str:
    return json.dumps({
        "id": tid, "status": "open", "priority": "P2", "queue": "billing-ops",
        "opened_at": opened, "reporter": "support-bot", "account_id": acct, "invoice_id": inv,
        "subject": f"Customer charged twice for {inv}",
        "body": body,
        "amount": {"currency": "USD", "value": cents / 100},
        "links": [f"https://support.northwind.example/tickets/{tid}"],
        "comments": [],
    }, indent=2)


def log_search(acct: str, lines: int) -> str:
    """A billing-worker log search: mostly noise, with the double charge in the middle."""
    out = [f"# logs.search service=billing-worker query={acct!r} since=2025-11-26T00:00Z "
           f"({lines} of 2143 lines)"]
    workers = ["billing-worker-0", "billing-worker-1", "billing-worker-2", "billing-worker-3"]
    events = ["invoice.render ok", "dunning.check none-due", "usage.rollup ok rows=",
              "tax.quote ok provider=avalara ms=", "ledger.post ok entries=",
              "webhook.deliver ok endpoint=https://hooks.northwind.example/billing status=200"]
    inv = dict((a, i) for a, i, *_ in AFFECTED)[acct]
    first, second = CHARGES[acct]
    # The double charge lands on 2025-11-27 16:10 (minute 2410 after LOG0), in the middle.
    step = min(2410 / (lines // 2), 6.0)
    for i in range(lines):
        minute = 2410 + (i - lines // 2) * step
        w = rng.choice(workers)
        req = "req_" + hexid(12)
        if i == lines // 2:
            out += [
                f"{ts(LOG0, minute)} {w} INFO  charge.attempt account={acct} invoice={inv} "
                f"attempt=1 idempotency_key=ik_{hexid(16)} {req}",
                f"{ts(LOG0, minute + 0.5)} {w} WARN  payproc.timeout account={acct} invoice={inv} "
                f"after_ms=30000 endpoint=https://api.payproc.example/v1/charges {req}",
                f"{ts(LOG0, minute + 0.5)} {w} INFO  charge.retry account={acct} invoice={inv} "
                f"attempt=2 backoff_ms=2000 idempotency_key=ik_{hexid(16)} {req}",
                f"{ts(LOG0, minute + 0.6)} {w} INFO  payproc.webhook charge.succeeded "
                f"charge={first} account={acct} (late ack for attempt=1)",
                f"{ts(LOG0, minute + 0.6)} {w} INFO  charge.succeeded account={acct} invoice={inv} "
                f"charge={second} attempt=2 {req}",
                f"{ts(LOG0, minute + 0.7)} {w} ERROR ledger.post duplicate-payment invoice={inv} "
                f"charges=[{first},{second}] action=none (alerting disabled: "
                "BILLING_DUP_ALERT=false)",
            ]
            continue
        ev = rng.choice(events)
        if ev.endswith("="):
            ev += str(rng.randint(3, 900))
        out.append(f"{ts(LOG0, minute)} {w} INFO  {ev} account={acct} {req}")
    return "\n".join(out)


def duplicate_report(n_rows: int) -> str:
    """The SQL report of every invoice paid twice since the deploy."""
    head = ("account_id | invoice_id        | charge_1                 | charge_2              "
            "   | amount_usd | first_at                 | second_at")
    rows = [head, "-" * len(head)]
    listed = list(AFFECTED)
    while len(listed) < n_rows:  # accounts nobody has complained about yet
        acct = f"ACCT-{rng.randint(1000, 9999)}"
        listed.append((acct, f"INV-2025-11-{rng.randint(1, 999):04d}", rng.randint(500, 9900),
                       None))
    # One duplicate every ~17 minutes after the deploy; ACCT-8842's is the one in its logs.
    when = [1385 if acct == "ACCT-8842" else 3 + k * 17 for k, (acct, *_) in enumerate(listed)]
    for m, (acct, inv, cents, _) in sorted(zip(when, listed, strict=True)):
        c1, c2 = CHARGES.get(acct, (charge_id(), charge_id()))
        rows.append(f"{acct:<10} | {inv:<17} | {c1} | {c2} | {cents / 100:>10.2f} | "
                    f"{ts(DEPLOY, m)} | {ts(DEPLOY, m + 0.6)}")
        DUPLICATES.append((acct, inv, cents, ts(DEPLOY, m)))
    total = sum(cents for _, _, cents, _ in listed) / 100
    rows.append(f"({len(listed)} rows)  total_usd={total:.2f}")
    return "\n".join(rows)


CHARGE_PY = '''"""Charge an invoice through payproc, retrying transient failures."""
from __future__ import annotations

import logging
import uuid

from billing.config import RetryConfig
from billing.payproc import PayprocClient, PayprocTimeout, PayprocDeclined
from billing.ledger import post_payment

log = logging.getLogger("billing.worker.charge")


def charge_invoice(client: PayprocClient, invoice, cfg: RetryConfig) -> str:
    """Charge ``invoice`` once; returns the payproc charge id."""
    attempt = 0
    while True:
        attempt += 1
        # Regenerated per attempt since a1f9c3e ("fresh key per attempt avoids 409s").
        key = f"ik_{uuid.uuid4().hex[:16]}"
        log.info("charge.attempt account=%s invoice=%s attempt=%d idempotency_key=%s",
                 invoice.account_id, invoice.id, attempt, key)
        try:
            charge = client.create_charge(
                amount=invoice.amount_cents,
                currency=invoice.currency,
                customer=invoice.payproc_customer,
                idempotency_key=key,
                timeout=cfg.request_timeout_s,
            )
        except PayprocTimeout:
            if attempt >= cfg.max_attempts:
                raise
            log.warning("payproc.timeout account=%s invoice=%s", invoice.account_id, invoice.id)
            cfg.sleep_backoff(attempt)
            continue
        except PayprocDeclined as exc:
            log.info("charge.declined invoice=%s code=%s", invoice.id, exc.code)
            raise
        post_payment(invoice, charge.id)
        log.info("charge.succeeded account=%s invoice=%s charge=%s attempt=%d",
                 invoice.account_id, invoice.id, charge.id, attempt)
        return charge.id
'''

RETRY_YAML = """# /srv/billing/config/retry.yaml  (owner: payments-platform, reviewed 2025-10-02)
payproc:
  request_timeout_s: 30
  max_attempts: 3
  backoff:
    initial_ms: 2000
    multiplier: 2.0
    max_ms: 20000
  # Attempts after a timeout reuse the invoice's idempotency key so payproc
  # deduplicates them (see runbooks/billing/duplicate-charges.md).
  reuse_idempotency_key: true
alerts:
  duplicate_payment: false   # TEMP: muted during the 2025-11-20 ledger migration (OPS-1088)
"""

RUNBOOK = """# Duplicate charges (runbooks/billing/duplicate-charges.md)

1. Confirm the duplicate in `payments` (two succeeded charges for one invoice_id).
2. Find the cause before refunding: payproc retries must reuse the invoice's idempotency key
   (`ik_<invoice_id>`); a fresh key per attempt turns every timeout into a second charge.
3. Refunds need an approval id from finance (FIN-APPROVAL-*) and go through
   `payments.refund` with `reason=duplicate`, never through the payproc dashboard.
4. Refunds above USD 250.00 need the service owner's sign-off as well (currently Dana Okafor).
5. Comment on every customer ticket with the refund id, then link them to the incident.
6. Re-enable `alerts.duplicate_payment` if it was muted, and file a follow-up for the alert gap.
"""


def pytest_out(failed: bool) -> str:
    lines = ["============================= test session starts ==============================",
             "platform linux -- Python 3.11.9, pytest-8.3.3, pluggy-1.5.0",
             "rootdir: /srv/billing", "collected 14 items", ""]
    if failed:
        lines += [
            "tests/worker/test_charge.py ....F.........                                  [100%]",
            "", "=================================== FAILURES ===================================",
            "________________ test_retry_after_timeout_reuses_idempotency_key ________________",
            "    def test_retry_after_timeout_reuses_idempotency_key(fake_payproc, invoice):",
            "        fake_payproc.fail_next_with(PayprocTimeout())",
            "        charge_invoice(fake_payproc, invoice, RetryConfig(max_attempts=3))",
            ">       assert len(set(fake_payproc.keys_seen)) == 1",
            "E       AssertionError: assert 2 == 1",
            "E        +  where 2 = len({'ik_4be19a07c2d1f0e3', 'ik_9d03e1a4b7c65f12'})",
            "", "tests/worker/test_charge.py:88: AssertionError",
            "=========================== short test summary info ============================",
            "FAILED tests/worker/test_charge.py::test_retry_after_timeout_reuses_idempotency_key",
            "========================= 1 failed, 13 passed in 2.31s =========================",
        ]
    else:
        lines += [
            "tests/worker/test_charge.py ..............                                  [100%]",
            "", "============================== 14 passed in 2.18s ==============================",
        ]
    return "\n".join(lines)


def git_log() -> str:
    entries = [
        ("a1f9c3e", "Ming Zhao", "2025-11-26 16:40", "worker: fresh idempotency key per attempt "
         "avoids 409s from payproc (#2291)"),
        ("77c02bd", "Dana Okafor", "2025-11-20 10:12", "ledger: migrate payments to "
         "ledger_v2 (OPS-1088)"),
        ("5e8d4a1", "Priya Raman", "2025-11-12 14:03", "worker: structured logging for charge "
         "attempts"),
        ("c90b2f7", "Ming Zhao", "2025-10-30 09:55", "payproc: 30 s request timeout"),
    ]
    return "\n".join(f"commit {h}{hexid(33)}\nAuthor: {a}\nDate:   {d}\n\n    {s}\n"
                     for h, a, d, s in entries)


def metrics_table() -> str:
    rows = ["hour (UTC)          | charges | payproc_timeouts | retries | duplicates",
            "--------------------+---------+------------------+---------+-----------"]
    for h in range(48):
        start = datetime(2025, 11, 26, 16) + timedelta(hours=h)
        charges = rng.randint(380, 900)
        timeouts = rng.randint(0, 4) + (9 if 14 <= h % 24 <= 17 else 0)
        rows.append(f"{start:%Y-%m-%d %H:00}    | {charges:>7} | {timeouts:>16} | "
                    f"{timeouts:>7} | {rng.randint(0, timeouts) if timeouts else 0:>10}")
    return "\n".join(rows)


PAYPROC_PY = '''"""A thin client for the payproc charges API."""
from __future__ import annotations

import httpx

BASE_URL = "https://api.payproc.example/v1"


class PayprocError(Exception):
    """Base of payproc errors."""


class PayprocTimeout(PayprocError):
    """No answer within the request timeout. The charge MAY have been created."""


class PayprocDeclined(PayprocError):
    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


class PayprocConflict(PayprocError):
    """409: the idempotency key was used before with different parameters."""


class PayprocClient:
    def __init__(self, api_key: str, *, http: httpx.Client | None = None) -> None:
        self._http = http or httpx.Client(base_url=BASE_URL)
        self._auth = {"Authorization": f"Bearer {api_key}"}

    def create_charge(self, *, amount: int, currency: str, customer: str,
                      idempotency_key: str, timeout: float) -> "Charge":
        try:
            r = self._http.post("/charges", headers={**self._auth,
                                "Idempotency-Key": idempotency_key},
                                json={"amount": amount, "currency": currency,
                                      "customer": customer}, timeout=timeout)
        except httpx.TimeoutException as exc:
            raise PayprocTimeout(str(exc)) from exc
        if r.status_code == 409:
            raise PayprocConflict(r.json().get("error", {}).get("message", ""))
        if r.status_code == 402:
            raise PayprocDeclined(r.json()["error"]["code"])
        r.raise_for_status()
        return Charge.from_json(r.json())
'''

PR_2291 = json.dumps({
    "number": 2291, "title": "worker: fresh idempotency key per attempt avoids 409s from payproc",
    "author": "ming.zhao", "merged_at": "2025-11-26T16:40:55Z", "merge_commit": "a1f9c3e",
    "body": "Since the proration fix (#2240) some invoices are re-rendered with a new amount "
            "between attempts, and payproc answers 409 because the key was used with a "
            "different amount. Generating a fresh key per attempt makes the 409s go away.",
    "reviews": [{"by": "priya.raman", "state": "approved", "body": "LGTM"}],
    "comments": [
        {"by": "dana.okafor", "body": "Doesn't this break dedup on timeouts? The runbook says "
                                      "retries must reuse the key."},
        {"by": "ming.zhao", "body": "Timeouts are rare (<0.1%), and the 409s page us daily. "
                                    "Will follow up with a proper fix (key per invoice+amount)."},
    ],
    "files": ["billing/worker/charge.py"],
}, indent=2)

REPRO_PY = '''"""Reproduce OPS-1193 against the payproc sandbox: a timeout, then a retry.

The sandbox's /charges endpoint sleeps past our 30 s timeout when the amount ends in 13 cents
(payproc's documented "slow" magic amount), then creates the charge anyway. With a fresh
idempotency key per attempt the retry creates a second charge; with one key per invoice payproc
answers the retry with the first charge.
"""
from __future__ import annotations

import os
import sys

from billing.config import RetryConfig
from billing.payproc import PayprocClient
from billing.worker.charge import charge_invoice
from tests.factories import make_invoice

SANDBOX = "https://sandbox.payproc.example/v1"


def main() -> int:
    client = PayprocClient(os.environ["PAYPROC_SANDBOX_KEY"], base_url=SANDBOX)
    invoice = make_invoice(account_id="ACCT-TEST-0001", id="INV-TEST-OPS1193",
                           amount_cents=4113, payproc_customer="cus_sandbox_ops1193")
    cfg = RetryConfig(max_attempts=3, request_timeout_s=5, backoff_initial_ms=100)
    charge_id = charge_invoice(client, invoice, cfg)
    charges = client.list_charges(customer=invoice.payproc_customer, created_gte="-10m")
    print(f"charge_invoice returned {charge_id}")
    print(f"payproc holds {len(charges)} charge(s) for {invoice.id}:")
    for c in charges:
        print(f"  {c.id} amount={c.amount} idempotency_key={c.idempotency_key} "
              f"created={c.created}")
    return 0 if len(charges) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
'''

TEST_PY = '''"""Retries of a charge must never charge twice (OPS-1193)."""
from __future__ import annotations

import pytest

from billing.config import RetryConfig
from billing.payproc import PayprocDeclined, PayprocTimeout
from billing.worker.charge import charge_invoice


def test_retry_after_timeout_reuses_idempotency_key(fake_payproc, invoice):
    fake_payproc.fail_next_with(PayprocTimeout())
    charge_invoice(fake_payproc, invoice, RetryConfig(max_attempts=3))
    assert len(set(fake_payproc.keys_seen)) == 1


def test_key_is_derived_from_the_invoice(fake_payproc, invoice):
    charge_invoice(fake_payproc, invoice, RetryConfig(max_attempts=3))
    assert fake_payproc.keys_seen == [f"ik_{invoice.id}"]


def test_timeout_then_late_success_yields_one_charge(fake_payproc, invoice):
    # payproc created the first charge but our client timed out before the answer came.
    fake_payproc.create_then_time_out_next()
    charge_invoice(fake_payproc, invoice, RetryConfig(max_attempts=3))
    assert len(fake_payproc.charges_for(invoice.payproc_customer)) == 1


def test_declines_are_not_retried(fake_payproc, invoice):
    fake_payproc.decline_next_with("card_declined")
    with pytest.raises(PayprocDeclined):
        charge_invoice(fake_payproc, invoice, RetryConfig(max_attempts=3))
    assert len(fake_payproc.keys_seen) == 1


def test_gives_up_after_max_attempts(fake_payproc, invoice):
    for _ in range(3):
        fake_payproc.fail_next_with(PayprocTimeout())
    with pytest.raises(PayprocTimeout):
        charge_invoice(fake_payproc, invoice, RetryConfig(max_attempts=3))
    assert len(fake_payproc.keys_seen) == 3
    assert len(set(fake_payproc.keys_seen)) == 1
'''

EMAIL = """Subject: We refunded a duplicate charge on your Northwind invoice {invoice}

Hello,

On {date} our billing system charged your card twice for invoice {invoice}
(USD {amount} each). The second charge was our mistake: a retry after a slow answer from
our payment processor was sent as a new payment instead of a repeat of the first one.

We have refunded the duplicate charge in full (refund {refund_id}). Depending on your bank it
can take 5 to 10 business days to appear on your statement. You do not need to do anything.

We have fixed the cause and added a check that alerts us if it ever happens again. We are
sorry for the trouble. If you have any question, reply to this email or quote ticket
{ticket} when you contact support.

The Northwind Cloud billing team
"""


def postmortem(version: int) -> str:
    """The incident write-up the agent drafts (v1) and revises after review (v2)."""
    parts = [
        "# Postmortem: duplicate charges after a retry change (2025-11-26 to 2025-11-28)",
        "",
        f"Status: {'draft' if version == 1 else 'in review'} · Incident: #inc-billing-4471 · "
        "Tickets: OPS-1193, OPS-1201, OPS-1207 · Follow-up: see Action items",
        "",
        "## Summary",
        "Between 2025-11-26T17:05Z and 2025-11-28T11:47Z the billing worker charged 140 invoices "
        "twice. Commit a1f9c3e (#2291) generated a fresh payproc idempotency key for every retry "
        "attempt instead of reusing one key per invoice. When a charge request timed out after "
        "30 s but payproc had in fact created the charge, the retry created a second one. "
        "Payproc had elevated latency in the same window, so timeouts were about ten times "
        "more frequent than usual. The duplicate-payment alert that would have caught this "
        "within minutes had been muted on 2025-11-20 for the ledger migration (OPS-1088) and "
        "never re-enabled.",
        "",
        "## Impact",
        f"- 140 invoices charged twice, USD {sum(c for _, _, c, _ in DUPLICATES) / 100:,.2f} "
        "in duplicate charges; all refunded by 2025-11-28 12:30Z.",
        "- 3 customers opened tickets (ACCT-8842, ACCT-9120, ACCT-7310); 137 had not noticed yet.",
        "- One duplicate above USD 250.00 (ACCT-4471, INV-2025-11-0602) needed the service "
        "owner's sign-off (OWNER-SIGNOFF-0917).",
        "",
        "## Timeline (UTC)",
        "- 2025-11-20 10:12 ledger migration 77c02bd; `alerts.duplicate_payment` muted (OPS-1088).",
        "- 2025-11-26 16:40 #2291 merged as a1f9c3e: fresh idempotency key per attempt.",
        "- 2025-11-26 17:05 billing-worker@2025.11.26-3 deployed with a1f9c3e.",
        "- 2025-11-26 17:08 first duplicate charge (see Appendix A).",
        "- 2025-11-27 16:10 ACCT-8842 charged twice for INV-2025-11-0042 "
        f"({CHARGES['ACCT-8842'][0]}, {CHARGES['ACCT-8842'][1]}).",
        "- 2025-11-28 08:51 OPS-1193 opened by support for ACCT-8842.",
        "- 2025-11-28 09:40 root cause found in billing/worker/charge.py; blast radius sized "
        "(140 invoices).",
        "- 2025-11-28 10:55 PR #2317 opened; finance approval FIN-APPROVAL-3381 received.",
        "- 2025-11-28 11:47 fix e41d7a0 deployed (billing-worker@2025.11.28-1).",
        "- 2025-11-28 12:30 all duplicates refunded (batch rb_20251128_0412 and 6 by hand).",
        "",
        "## Root cause",
        "`charge_invoice` in /srv/billing/billing/worker/charge.py built the idempotency key "
        "inside its retry loop. #2291 did this to stop 409 Conflict answers that appeared after "
        "the proration fix (#2240) changed invoice amounts between attempts. The 409s were "
        "payproc correctly refusing a reused key with a different amount; the right fix was a "
        "key per invoice *and amount*, which the PR discussion proposed as a follow-up.",
        "",
        "## Detection",
        "A customer noticed, 39 hours after the first duplicate. The ledger logged every duplicate "
        "as `ledger.post duplicate-payment ... action=none (alerting disabled: "
        "BILLING_DUP_ALERT=false)`.",
        "",
        "## Resolution",
        "PR #2317 (e41d7a0) derives the key from the invoice id, outside the retry loop, with "
        "regression tests. `alerts.duplicate_payment` is enabled again in "
        "/srv/billing/config/retry.yaml.",
        "",
        "## Action items",
        "- OPS-1214: muted alerts expire automatically after 72 h (owner: payments-platform).",
        "- Key per invoice and amount, so a changed amount after proration retries cleanly.",
        "- Alert when payproc timeouts exceed 1% of charges in 15 minutes.",
    ]
    if version == 2:
        parts += [
            "- Review checklist: any change to idempotency handling needs payments-platform "
            "review.",
            "",
            "## Customer communication",
            "The three customers with tickets got a comment with their refund id on their "
            "ticket. The other 137 get the email in /srv/billing/out/email_duplicate_refund.txt "
            "(sent by support, batch SUP-MAIL-5520), which names their invoice and refund id.",
            "",
            "## Why #2291 was merged",
            "The 409s paged the on-call engineer daily and timeouts were rare (<0.1% of "
            "charges). The reviewer approved without the runbook's rule in mind; the one "
            "comment that raised it (dana.okafor) was answered with a follow-up promise. "
            "Payproc's latency incident on Nov 26-28 turned a rare path into 140 charges.",
        ]
    parts += ["", "## Appendix A: invoices charged twice", "",
              "| account | invoice | amount USD | first charge at |", "|---|---|---:|---|"]
    parts += [f"| {a} | {i} | {c / 100:.2f} | {at} |" for a, i, c, at in DUPLICATES]
    return "\n".join(parts) + "\n"


DIFF = """diff --git a/billing/worker/charge.py b/billing/worker/charge.py
--- a/billing/worker/charge.py
+++ b/billing/worker/charge.py
@@ -14,12 +14,13 @@ def charge_invoice(client: PayprocClient, invoice, cfg: RetryConfig) -> str:
     \"\"\"Charge ``invoice`` once; returns the payproc charge id.\"\"\"
     attempt = 0
+    # One key per invoice: payproc deduplicates retries of the same charge by it, so a
+    # timeout followed by a retry can never charge twice (reverts a1f9c3e, see OPS-1193).
+    key = f"ik_{invoice.id}"
     while True:
         attempt += 1
-        # Regenerated per attempt since a1f9c3e ("fresh key per attempt avoids 409s").
-        key = f"ik_{uuid.uuid4().hex[:16]}"
         log.info("charge.attempt account=%s invoice=%s attempt=%d idempotency_key=%s",
"""


# --- the conversation ---------------------------------------------------------------------------

@dataclass
class Session:
    messages: list[dict[str, Any]] = field(default_factory=list)
    n_calls: int = 0

    def user(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})

    def step(self, thought: str, tool: str, args: dict[str, Any], output: str, *,
             is_error: bool = False, thinking: str | None = None,
             note: str | None = None) -> None:
        """One assistant tool call and the user message carrying its result."""
        self.n_calls += 1
        call_id = f"toolu_01{hexid(22)}"
        content: list[dict[str, Any]] = []
        if thinking:
            content.append({"type": "thinking", "thinking": thinking,
                            "signature": "EqQBCkYIBxgCKkA" + hexid(40)})
        content += [{"type": "text", "text": thought},
                    {"type": "tool_use", "id": call_id, "name": tool, "input": args}]
        self.messages.append({"role": "assistant", "content": content})
        result: dict[str, Any] = {"type": "tool_result", "tool_use_id": call_id,
                                  "content": output}
        if is_error:
            result["is_error"] = True
        reply: list[dict[str, Any]] = [result]
        if note:  # an operator typing beside the tool result
            reply.append({"type": "text", "text": note})
        self.messages.append({"role": "user", "content": reply})

    def say(self, text: str) -> None:
        self.messages.append({"role": "assistant", "content": [{"type": "text", "text": text}]})


def build() -> dict[str, Any]:
    # Reseed first so that every call writes the same session, whatever ran before.
    rng.seed(8842)
    CHARGES.clear()
    DUPLICATES.clear()
    CHARGES.update({acct: (charge_id(), charge_id()) for acct, *_ in AFFECTED})
    s = Session()
    acct, inv, cents, tid = AFFECTED[0]
    assert tid is not None
    s.user(
        f"New P2 from support: customer {acct} says they were charged twice for invoice {inv} "
        f"(USD {cents / 100:.2f} each) on Nov 27. Ticket {tid}. Find the root cause, check "
        "whether other accounts are hit, fix it if it is ours, and refund duplicates once "
        "finance approves. Keep the ticket updated. Incident channel: #inc-billing-4471."
    )
    s.step("I'll start with the ticket to get the exact account, invoice and timestamps.",
           "tickets.get", {"id": tid},
           ticket(tid, acct, inv, cents, "2025-11-28T08:51:40Z",
                  "Hi, my card shows two charges of $41.98 from Northwind on Nov 27 for the "
                  "same invoice. Please refund one. -- sent from the billing portal"),
           thinking="Two identical charges on one invoice usually means a retry without "
                    "idempotency, or a webhook replay. Logs first, then the payments table.")
    s.step(f"The ticket matches. Now the billing-worker logs for {acct} since the 26th.",
           "logs.search", {"service": "billing-worker", "query": acct,
                           "since": "2025-11-26T00:00Z", "limit": 420},
           log_search(acct, 420))
    c1, c2 = CHARGES[acct]
    s.step(
        "The log shows attempt 1 timing out after 30 s, a retry with a *different* "
        f"idempotency key, and payproc acknowledging both charges ({c1} and {c2}). Let me "
        "confirm in the payments table.",
        "sql.query", {"db": "billing", "sql": "SELECT id, invoice_id, payproc_charge_id, "
                      "amount_cents, status, idempotency_key, created_at FROM payments WHERE "
                      f"account_id = '{acct}' ORDER BY created_at DESC LIMIT 10"},
        "\n".join([
            "id      | invoice_id       | payproc_charge_id       | amount_cents | status    | "
            "idempotency_key     | created_at",
            f"p_91822 | {inv} | {c2} | {cents:>12} | succeeded | ik_{hexid(16)} | "
            "2025-11-27 16:11:05",
            f"p_91821 | {inv} | {c1} | {cents:>12} | succeeded | ik_{hexid(16)} | "
            "2025-11-27 16:10:34",
            f"p_88410 | INV-2025-10-0042 | {charge_id()} | {cents:>12} | succeeded | "
            "ik_INV-2025-10-0042 | 2025-10-27 16:09:58",
            "(3 rows)"]))
    s.step("Two succeeded payments, different keys. October's payment used the key "
           "`ik_INV-2025-10-0042`, November's are random. Checking the retry config.",
           "fs.read", {"path": "/srv/billing/config/retry.yaml"}, RETRY_YAML)
    s.step("Config says retries reuse the key, so the code must be ignoring it. Reading the "
           "charge path.", "fs.read", {"path": "/srv/billing/billing/worker/charge.py"},
           CHARGE_PY)
    s.step("The loop builds `key = f\"ik_{uuid.uuid4().hex[:16]}\"` on every attempt, so a "
           "retry after a timeout is a brand-new charge as far as payproc is concerned. Before "
           "I blame the code I want to see it happen: a small reproduction against the payproc "
           "sandbox, using its slow magic amount to force the timeout.", "fs.write",
           {"path": "/srv/billing/scratch/repro_ops1193.py", "content": REPRO_PY},
           json.dumps({"ok": True, "bytes_written": len(REPRO_PY)}))
    s.step("Running the reproduction against the sandbox.", "bash",
           {"command": "cd /srv/billing && PAYPROC_SANDBOX_KEY=$(vault read -field=key "
                       "secret/billing/payproc-sandbox) python scratch/repro_ops1193.py"},
           "\n".join([f"charge_invoice returned {charge_id()}",
                      "payproc holds 2 charge(s) for INV-TEST-OPS1193:",
                      f"  {charge_id()} amount=4113 idempotency_key=ik_{hexid(16)} "
                      "created=2025-11-28T09:31:02Z",
                      f"  {charge_id()} amount=4113 idempotency_key=ik_{hexid(16)} "
                      "created=2025-11-28T09:31:07Z"]), is_error=True)
    s.step("Reproduced: two charges, two keys, exit 1. Now, who changed the key handling, and "
           "when?",
           "bash", {"command": "cd /srv/billing && git log -n 4 -- billing/worker/charge.py "
                    "billing/ledger"}, git_log(),
           thinking="a1f9c3e landed 2025-11-26 16:40; the first duplicate I saw is the 27th. "
                    "Deploy time matters for the blast radius.")
    s.step("Commit a1f9c3e (#2291) moved key generation into the loop. Checking when it was "
           "deployed.", "deploy.history", {"service": "billing-worker", "limit": 3},
           json.dumps([
               {"release": "billing-worker@2025.11.26-3", "commit": "a1f9c3e",
                "deployed_at": "2025-11-26T17:05:12Z", "by": "ci-deployer"},
               {"release": "billing-worker@2025.11.20-1", "commit": "77c02bd",
                "deployed_at": "2025-11-20T11:30:40Z", "by": "ci-deployer"},
               {"release": "billing-worker@2025.11.12-2", "commit": "5e8d4a1",
                "deployed_at": "2025-11-12T15:01:09Z", "by": "ci-deployer"}], indent=2))
    s.step("Deployed 2025-11-26T17:05Z. Are there other tickets about double charges since "
           "then?", "tickets.search", {"query": "charged twice OR double charge OR duplicate",
                                        "opened_after": "2025-11-26"},
           json.dumps([{"id": t, "account_id": a, "invoice_id": i, "subject":
                        f"Customer charged twice for {i}"}
                       for a, i, _, t in AFFECTED if t], indent=2))
    for a, i, cts, t in AFFECTED[1:3]:
        assert t is not None
        opened = f"2025-11-28T09:{rng.randint(10, 40)}:0{rng.randint(0, 9)}Z"
        s.step(f"Reading {t} to compare with {tid}.", "tickets.get", {"id": t},
               ticket(t, a, i, cts, opened,
                      f"Charged twice ({cts / 100:.2f} USD) for {i}, please fix."))
        s.step(f"Same symptom. Checking the worker logs for {a} to confirm the same pattern.",
               "logs.search", {"service": "billing-worker", "query": a,
                               "since": "2025-11-26T00:00Z", "limit": 110},
               log_search(a, 110))
    s.step("Both show the timeout-then-retry pattern with two keys. Reading the payproc client to "
           "see what a 409 means there, since #2291 says it was about 409s.", "fs.read",
           {"path": "/srv/billing/billing/payproc/client.py"}, PAYPROC_PY)
    s.step("The 409 is payproc saying 'same key, different parameters'. Let me read #2291's "
           "discussion.", "git.pr_get", {"repo": "northwind/billing", "number": 2291},
           PR_2291)
    s.step("So the 409s came from amount changes after a proration fix, not from retries. How "
           "many 409s were there before the change?", "bash",
           {"command": "zgrep -c 'payproc.conflict status=409' "
                       "/var/log/billing/worker-*.log.2025-11-2[0-6].gz"},
           "\n".join(f"/var/log/billing/worker-{w}.log.2025-11-2{d}.gz:{rng.randint(0, 3)}"
                     for w in range(4) for d in range(7)))
    s.step("Two more tickets: OPS-1201 (ACCT-9120) and OPS-1207 (ACCT-7310). I'll size the whole "
           "blast radius with a query for every invoice paid twice since the deploy.",
           "sql.query", {"db": "billing", "sql": "SELECT account_id, invoice_id, min(...) ... "
                         "FROM payments WHERE status='succeeded' AND created_at >= "
                         "'2025-11-26 17:05' GROUP BY 1,2 HAVING count(*) > 1"},
           duplicate_report(140))
    s.step("140 invoices paid twice. Correlating with payproc timeouts per hour to be sure the "
           "timeouts are the trigger.", "metrics.query",
           {"query": "sum by (hour) (billing_charge_total, payproc_timeout_total, "
                     "billing_retry_total, billing_duplicate_payment_total)",
            "range": "48h"}, metrics_table())
    s.step("Duplicates track the afternoon timeout spikes exactly: payproc's slow hours turn "
           "into our duplicate hours. Posting a status update to the incident channel before "
           "going further, since this is now bigger than one customer.", "chat.send",
           {"channel": "#inc-billing-4471", "text":
            "Status 09:45Z: OPS-1193 is not a one-off. Since billing-worker@2025.11.26-3 "
            "(commit a1f9c3e, #2291, deployed 2025-11-26T17:05Z) every charge retry after a "
            "payproc timeout uses a new idempotency key, so payproc creates a second charge. "
            "140 invoices charged twice so far, USD 7,375.11 in total, across 140 accounts; "
            "3 have tickets (OPS-1193 ACCT-8842, OPS-1201 ACCT-9120, OPS-1207 ACCT-7310). "
            "The duplicate-payment alert was muted for OPS-1088 and never re-enabled, which "
            "is why nothing paged. Next: fix with a regression test, then refunds once finance "
            "approves. No config change or refund made yet."},
           json.dumps({"ok": True, "ts": "1732787102.000300"}))
    s.step("Reading the runbook before I change anything.", "fs.read",
           {"path": "/srv/runbooks/billing/duplicate-charges.md"}, RUNBOOK)
    s.step("Posting findings on the ticket before fixing.", "tickets.comment",
           {"id": tid, "body": f"Root cause: commit a1f9c3e (deployed 2025-11-26T17:05Z) "
            "regenerates the payproc idempotency key per retry, so a timeout followed by a "
            f"retry charges twice. {acct} was charged {c1} and {c2} for {inv}. 140 invoices "
            "affected so far; duplicate-payment alert was muted (OPS-1088). Fix in progress."},
           json.dumps({"ok": True, "comment_id": "cmt_55120"}))
    s.step("Writing the regression tests first: the retry must reuse the key, the key must "
           "come from the invoice, a timeout with a late success must leave one charge, and "
           "declines and the attempt cap must keep working.", "fs.write",
           {"path": "/srv/billing/tests/worker/test_charge_idempotency.py", "content": TEST_PY},
           json.dumps({"ok": True, "bytes_written": len(TEST_PY)}))
    s.step("Running it against the current code; it should fail.", "bash",
           {"command": "cd /srv/billing && python -m pytest -q tests/worker/test_charge.py"},
           pytest_out(True), is_error=True)
    s.step("Fails as expected. Applying the fix: one key per invoice, outside the loop.",
           "fs.patch", {"path": "/srv/billing/billing/worker/charge.py", "diff": DIFF},
           json.dumps({"ok": True, "hunks_applied": 1}))
    s.step("Re-running the tests.", "bash",
           {"command": "cd /srv/billing && python -m pytest -q tests/worker/test_charge.py"},
           pytest_out(False))
    s.step("Type-checking and linting the change.", "bash",
           {"command": "cd /srv/billing && ruff check billing/worker && mypy billing/worker"},
           "All checks passed!\nSuccess: no issues found in 9 source files")
    s.step("Opening the PR.", "git.pr_create",
           {"repo": "northwind/billing", "branch": "fix/ops-1193-idempotency-key",
            "title": "worker: reuse the invoice's idempotency key across retries (OPS-1193)",
            "body": "Reverts the key change of a1f9c3e (#2291). Adds a regression test."},
           json.dumps({"number": 2317, "url": "https://git.northwind.example/northwind/billing/"
                       "pull/2317", "checks": "pending"}),
           note="FYI the payproc status page says they had elevated latency Nov 26-28, that "
                "explains the timeouts. Go ahead with the PR, Ming will review.")
    s.say("Thanks, that matches the timeout spikes. PR #2317 is open for Ming. While it is in "
          "review I'll prepare the refund list; I won't issue anything until finance sends an "
          "approval id.")
    s.user("Finance approved refunds for the duplicates: FIN-APPROVAL-3381, covers every "
           "duplicate up to USD 250.00. Anything above that needs Dana's sign-off first. Start "
           "with the three customers who opened tickets.")
    for a, i, cts, t in AFFECTED:
        if cts > 25000:
            continue
        second = CHARGES[a][1]
        rid = "re_3P" + hexid(18)
        s.step(f"Refunding the second charge for {a} ({i}, USD {cts / 100:.2f}) under "
               "FIN-APPROVAL-3381.", "payments.refund",
               {"charge_id": second, "reason": "duplicate", "approval_id": "FIN-APPROVAL-3381",
                "amount_cents": cts},
               json.dumps({"refund_id": rid, "charge_id": second, "status": "succeeded",
                           "amount_cents": cts}))
        if t:
            s.step(f"Telling the customer on {t}.", "tickets.comment",
                   {"id": t, "body": f"We refunded the duplicate charge {second} "
                    f"(USD {cts / 100:.2f}) for {i}; refund {rid}. It can take 5-10 business "
                    "days to appear. Cause: a retry bug on our side, fixed in PR #2317."},
                   json.dumps({"ok": True, "comment_id": f"cmt_{rng.randint(55121, 55999)}"}))
    big = AFFECTED[5]
    s.step(f"{big[0]} ({big[1]}) is USD {big[2] / 100:.2f}, above the 250.00 limit: asking Dana "
           "before refunding.", "chat.send",
           {"channel": "#inc-billing-4471", "text": f"@dana.okafor {big[0]} was double charged "
            f"USD {big[2] / 100:.2f} for {big[1]}. FIN-APPROVAL-3381 only covers up to 250.00; "
            "OK to refund the duplicate?"},
           json.dumps({"ok": True, "ts": "1732792201.004200"}))
    s.step("While waiting: the remaining 134 duplicates. Exporting the list for a batch refund.",
           "sql.export", {"db": "billing", "query_id": "dup_since_a1f9c3e", "format": "csv",
                          "path": "/srv/billing/out/dup_refunds_2025-11-28.csv"},
           json.dumps({"ok": True, "rows": 140, "path":
                       "/srv/billing/out/dup_refunds_2025-11-28.csv"}))
    s.step("The 134 customers without tickets need to hear from us too. Drafting the email "
           "support will send with each refund id filled in.", "fs.write",
           {"path": "/srv/billing/out/email_duplicate_refund.txt", "content": EMAIL},
           json.dumps({"ok": True, "bytes_written": len(EMAIL)}))
    s.step("Dry run of the batch refund to catch anything above the limit.", "bash",
           {"command": "cd /srv/billing && python -m billing.tools.batch_refund --dry-run "
                       "--approval FIN-APPROVAL-3381 --max-usd 250 "
                       "out/dup_refunds_2025-11-28.csv"},
           "\n".join([f"would refund {charge_id()} account=ACCT-{rng.randint(1000, 9999)} "
                      f"usd={rng.randint(500, 9900) / 100:.2f}" for _ in range(60)]
                     + ["... 74 more", "skipped (over limit, needs owner sign-off): 1 "
                        f"({big[0]} {big[1]} usd={big[2] / 100:.2f})",
                        "skipped (already refunded): 5", "total: 134 refunds, usd=6851.24"]))
    s.step("Checking on PR #2317.", "git.pr_status", {"repo": "northwind/billing",
                                                      "number": 2317},
           json.dumps({"number": 2317, "state": "open", "reviews": [
               {"by": "ming.zhao", "state": "approved", "body": "LGTM, sorry about #2291"}],
               "checks": {"unit": "passed", "lint": "passed", "integration": "passed"}}),
           note="Dana says yes for ACCT-4471, her sign-off id is OWNER-SIGNOFF-0917.")
    second = CHARGES[big[0]][1]
    s.step(f"Refunding {big[0]} with both approvals.", "payments.refund",
           {"charge_id": second, "reason": "duplicate",
            "approval_id": "FIN-APPROVAL-3381+OWNER-SIGNOFF-0917", "amount_cents": big[2]},
           json.dumps({"refund_id": "re_3P" + hexid(18), "charge_id": second,
                       "status": "succeeded", "amount_cents": big[2]}))
    s.step("Running the batch refund for the rest.", "bash",
           {"command": "cd /srv/billing && python -m billing.tools.batch_refund "
                       "--approval FIN-APPROVAL-3381 --max-usd 250 "
                       "out/dup_refunds_2025-11-28.csv"},
           "refunded 134, failed 0, skipped 6 (already refunded)\nbatch id: rb_20251128_0412")
    s.step("Merging and deploying the fix.", "git.pr_merge",
           {"repo": "northwind/billing", "number": 2317, "method": "squash"},
           json.dumps({"merged": True, "sha": "e41d7a0"}))
    s.step("Watching the deploy.", "deploy.status", {"service": "billing-worker"},
           json.dumps({"release": "billing-worker@2025.11.28-1", "commit": "e41d7a0",
                       "state": "healthy", "replicas": "4/4",
                       "started_at": "2025-11-28T11:47:02Z"}))
    s.step("Re-enabling the muted duplicate-payment alert, per the runbook.", "fs.patch",
           {"path": "/srv/billing/config/retry.yaml",
            "diff": "-  duplicate_payment: false   # TEMP: muted during the 2025-11-20 ledger "
                    "migration (OPS-1088)\n+  duplicate_payment: true"},
           json.dumps({"ok": True, "hunks_applied": 1}))
    s.step("Verifying no new duplicates since the deploy.", "sql.query",
           {"db": "billing", "sql": "SELECT count(*) FROM (SELECT invoice_id FROM payments WHERE "
                                    "status='succeeded' AND created_at >= '2025-11-28 11:47' "
                                    "GROUP BY 1 HAVING count(*) > 1) d"},
           "count\n-----\n    0\n(1 row)")
    s.step("No new duplicates. Drafting the postmortem while the details are fresh, with the "
           "full list of affected invoices as an appendix.", "fs.write",
           {"path": "/srv/postmortems/2025-11-28-duplicate-charges.md",
            "content": postmortem(1)},
           json.dumps({"ok": True, "bytes_written": len(postmortem(1))}),
           note="Dana here: good draft. Please add how we told customers, and why #2291 got "
                "through review; keep the appendix.")
    s.step("Adding the customer communication and the review history, as Dana asked.",
           "fs.write", {"path": "/srv/postmortems/2025-11-28-duplicate-charges.md",
                        "content": postmortem(2)},
           json.dumps({"ok": True, "bytes_written": len(postmortem(2))}))
    s.step("Filing the follow-up for the alert gap.", "tickets.create",
           {"queue": "billing-ops", "priority": "P3",
            "subject": "Duplicate-payment alert stayed muted after OPS-1088 migration",
            "body": "The alert was muted on 2025-11-20 and never re-enabled, so 140 duplicate "
                    "charges went unnoticed for ~40 h. Add an expiry to muted alerts."},
           json.dumps({"id": "OPS-1214", "status": "open"}))
    s.step("Closing out the incident ticket.", "tickets.comment",
           {"id": tid, "body": "Resolved. Root cause a1f9c3e; fixed in PR #2317 (e41d7a0, "
            "deployed 11:47Z). 140 duplicates refunded (FIN-APPROVAL-3381; ACCT-4471 with "
            "OWNER-SIGNOFF-0917). Alert re-enabled; follow-up OPS-1214."},
           json.dumps({"ok": True, "comment_id": "cmt_56002"}))
    s.user("Before you close: for the postmortem, which account and invoice started this, what "
           "were the two charge ids, which file held the bug, and which commit introduced it?")
    s.say(f"{acct}, invoice {inv} (ticket {tid}): charges {c1} and {c2}, USD {cents / 100:.2f} "
          "each on 2025-11-27. The bug was in /srv/billing/billing/worker/charge.py, introduced "
          "by commit a1f9c3e (#2291, deployed 2025-11-26T17:05Z) and fixed by PR #2317 "
          "(e41d7a0).")
    return {"id": "example/ops-incident-acct-8842",
            "source": "written for sessionfold by tools/make_example.py (synthetic; no real "
                      "customer data)",
            "system": SYSTEM, "messages": s.messages}


def render() -> str:
    return json.dumps(build(), indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if the committed file differs from what this script writes")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        same = OUT.exists() and OUT.read_text(encoding="utf-8") == text
        print(f"{OUT}: {'up to date' if same else 'differs; rerun tools/make_example.py'}")
        return 0 if same else 1
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT} ({len(text):,} characters)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
