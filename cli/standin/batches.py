"""Both providers' batch APIs for the stand-in model, with a configurable delay.

:class:`BatchDesk` answers, in front of any function that answers one request (the stand-in's
``FakeProvider.handle``, so a batched request is counted, scripted and faulted as a live one):

- **Anthropic's Message Batches**: ``POST /v1/messages/batches`` (``requests``: ``custom_id``
  and ``params``), ``GET /v1/messages/batches/{id}``, ``POST …/{id}/cancel`` and
  ``GET …/{id}/results`` (JSONL: ``succeeded`` with the message, ``errored`` with the error a
  live call would have met, ``canceled``, ``expired``);
- **OpenAI's Batch API with its Files API**: ``POST /v1/files`` (multipart, purpose
  ``batch``: the JSONL of requests), ``POST /v1/batches``, ``GET /v1/batches/{id}``,
  ``POST …/{id}/cancel``, ``GET /v1/files/{id}`` and ``GET /v1/files/{id}/content`` (the
  output file: ``response`` with ``status_code`` and ``body``; non-2xx answers and expired
  requests in the error file).

A batch ends ``delay_s`` seconds (on ``clock``) after it was created; its requests are answered
then, at the first look after. :meth:`BatchDesk.script` makes the next batches end otherwise:
``"expired"`` (no request ran), ``"cancelled"`` (the provider stopped it), ``"failed"`` (OpenAI:
the input was refused; Anthropic: every request errored). A batch cancelled before it ended
answers none of its requests, as both APIs do::

    provider = FakeProvider()
    provider.batches.delay_s = 2.0
    provider.batches.script("expired")          # the next batch expires
"""

from __future__ import annotations

import email.parser
import email.policy
import json
import re
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from sessionfold.core.errors import InvalidInputError

__all__ = ["BatchAnswer", "BatchDesk", "BatchOutcome"]

#: How the next batch ends, instead of answering its requests.
BatchOutcome = Literal["expired", "cancelled", "failed"]
#: Answers one request: ``(path, body) -> (status, headers, JSON body)``.
AnswerFn = Callable[[str, Mapping[str, Any]], tuple[int, dict[str, str], dict[str, Any]]]

_ANTHROPIC = re.compile(r"^/v1/messages/batches(?:/(?P<id>[^/]+)(?:/(?P<verb>cancel|results))?)?$")
_OPENAI_BATCH = re.compile(r"^/v1/batches(?:/(?P<id>[^/]+)(?:/(?P<verb>cancel))?)?$")
_OPENAI_FILE = re.compile(r"^/v1/files(?:/(?P<id>[^/]+)(?:/(?P<verb>content))?)?$")
_JSONL = "application/x-jsonl"


@dataclass(frozen=True)
class BatchAnswer:
    """One answer of the desk: status, headers, the body's bytes and its content type."""

    status: int
    headers: dict[str, str]
    content: bytes
    content_type: str = "application/json"


def _json(status: int, body: Any) -> BatchAnswer:
    return BatchAnswer(status, {}, json.dumps(body).encode())


@dataclass
class _Batch:
    id: str
    api: Literal["anthropic", "openai"]
    requests: list[tuple[str, dict[str, Any]]]
    created: float
    created_at: datetime
    outcome: BatchOutcome | None = None
    input_file_id: str = ""
    cancelled_at: datetime | None = None
    ended_at: datetime | None = None
    #: custom id -> (status, body) of each request answered (set when the batch ends).
    answers: dict[str, tuple[int, dict[str, Any]]] = field(default_factory=dict)
    output_file_id: str | None = None
    error_file_id: str | None = None


@dataclass
class _File:
    id: str
    filename: str
    purpose: str
    content: bytes
    created_at: datetime


class BatchDesk:
    """Anthropic's and OpenAI's batch APIs over ``answer`` (see the module doc). Thread-safe."""

    def __init__(self, answer: AnswerFn, *, delay_s: float = 0.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if delay_s < 0:
            raise InvalidInputError(f"delay_s must not be negative, got {delay_s}")
        self.answer = answer
        self.delay_s = delay_s
        self.clock = clock
        self._lock = threading.RLock()
        self._batches: dict[str, _Batch] = {}
        self._files: dict[str, _File] = {}
        self._script: deque[BatchOutcome] = deque()
        #: Batches created, and cancel requests received.
        self.created = 0
        self.cancels = 0

    def script(self, *outcomes: BatchOutcome) -> None:
        """The next ``len(outcomes)`` batches end so, in order (see the module doc)."""
        with self._lock:
            self._script.extend(outcomes)

    def owns(self, path: str) -> bool:
        """Whether ``path`` is one of the batch APIs' routes."""
        route = path.split("?", 1)[0].rstrip("/")
        return bool(_ANTHROPIC.match(route) or _OPENAI_BATCH.match(route)
                    or _OPENAI_FILE.match(route))

    def handle(self, method: str, path: str, body: bytes,
               content_type: str | None = None) -> BatchAnswer:
        """Answer one request to a batch route (:meth:`owns`)."""
        route = path.split("?", 1)[0].rstrip("/")
        method = method.upper()
        with self._lock:
            if m := _ANTHROPIC.match(route):
                return self._anthropic(method, m["id"], m["verb"], body)
            if m := _OPENAI_BATCH.match(route):
                return self._openai(method, m["id"], m["verb"], body)
            if m := _OPENAI_FILE.match(route):
                return self._file(method, m["id"], m["verb"], body, content_type)
        return _not_found(path)

    # --- Anthropic ----------------------------------------------------------------------------

    def _anthropic(self, method: str, batch_id: str | None, verb: str | None,
                   body: bytes) -> BatchAnswer:
        if batch_id is None:
            if method != "POST":
                return _not_found("/v1/messages/batches")
            request = _loads(body)
            requests = request.get("requests") if isinstance(request, Mapping) else None
            if not isinstance(requests, list) or not requests or not all(
                    isinstance(r, Mapping) and isinstance(r.get("custom_id"), str)
                    and isinstance(r.get("params"), Mapping) for r in requests):
                return _json(400, _anthropic_error(
                    "invalid_request_error", "requests: each needs a custom_id and params"))
            made = self._new("anthropic", [(str(r["custom_id"]), dict(r["params"]))
                                           for r in requests], prefix="msgbatch_")
            return _json(200, self._message_batch(made))
        batch = self._batches.get(batch_id)
        if batch is None or batch.api != "anthropic":
            return _json(404, _anthropic_error("not_found_error", f"no batch {batch_id}"))
        if verb == "cancel" and method == "POST":
            self._cancel(batch)
        elif verb == "results":
            self._settle(batch)
            if batch.ended_at is None:
                return _json(400, _anthropic_error("invalid_request_error",
                                                   f"batch {batch_id} has not ended"))
            lines = [json.dumps({"custom_id": cid, "result": self._anthropic_result(batch, cid)})
                     for cid, _ in batch.requests]
            return BatchAnswer(200, {}, ("\n".join(lines) + "\n").encode(), _JSONL)
        return _json(200, self._message_batch(batch))

    def _message_batch(self, batch: _Batch) -> dict[str, Any]:
        self._settle(batch)
        ended = batch.ended_at is not None
        counts = {"processing": 0 if ended else len(batch.requests), "succeeded": 0,
                  "errored": 0, "canceled": 0, "expired": 0}
        if ended:
            for cid, _ in batch.requests:
                counts[self._anthropic_result(batch, cid)["type"]] += 1
        status = ("ended" if ended else "canceling" if batch.cancelled_at is not None
                  else "in_progress")
        return {"id": batch.id, "type": "message_batch", "processing_status": status,
                "request_counts": counts, "created_at": _iso(batch.created_at),
                "expires_at": _iso(batch.created_at + timedelta(hours=24)),
                "ended_at": _iso(batch.ended_at) if batch.ended_at else None,
                "archived_at": None,
                "cancel_initiated_at": (_iso(batch.cancelled_at) if batch.cancelled_at
                                        else None),
                "results_url": f"/v1/messages/batches/{batch.id}/results" if ended else None}

    def _anthropic_result(self, batch: _Batch, custom_id: str) -> dict[str, Any]:
        answered = batch.answers.get(custom_id)
        if answered is None:
            return {"type": "expired" if batch.outcome == "expired" else "canceled"}
        status, body = answered
        if status == 200:
            return {"type": "succeeded", "message": body}
        error: Any = body.get("error")
        if not isinstance(error, Mapping):
            error = {"type": "api_error", "message": "error"}
        return {"type": "errored", "error": {"type": "error", "error": dict(error)}}

    # --- OpenAI -------------------------------------------------------------------------------

    def _openai(self, method: str, batch_id: str | None, verb: str | None,
                body: bytes) -> BatchAnswer:
        if batch_id is None:
            if method != "POST":
                return _not_found("/v1/batches")
            request = _loads(body)
            if not isinstance(request, Mapping):
                return _json(400, _openai_error("invalid_request", "body is not an object"))
            source = self._files.get(str(request.get("input_file_id")))
            if source is None:
                return _json(400, _openai_error("invalid_request",
                                                "input_file_id names no uploaded file"))
            if request.get("endpoint") != "/v1/chat/completions":
                return _json(400, _openai_error("invalid_request",
                                                "the stand-in batches /v1/chat/completions"))
            requests = []
            for raw in source.content.decode().splitlines():
                if raw.strip():
                    line = json.loads(raw)
                    requests.append((str(line["custom_id"]), dict(line["body"])))
            made = self._new("openai", requests, prefix="batch_")
            made.input_file_id = source.id
            return _json(200, self._openai_batch(made, request.get("metadata")))
        batch = self._batches.get(batch_id)
        if batch is None or batch.api != "openai":
            return _json(404, _openai_error("not_found", f"no batch {batch_id}"))
        if verb == "cancel" and method == "POST":
            self._cancel(batch)
        return _json(200, self._openai_batch(batch))

    def _openai_batch(self, batch: _Batch, metadata: Any = None) -> dict[str, Any]:
        self._settle(batch)
        ended = batch.ended_at is not None
        if not ended:
            status = "cancelling" if batch.cancelled_at is not None else "in_progress"
        elif batch.outcome in ("expired", "failed"):
            status = batch.outcome
        elif batch.outcome == "cancelled" or batch.cancelled_at is not None:
            status = "cancelled"
        else:
            status = "completed"
        done = [s for s, _ in batch.answers.values()]
        created = int(batch.created_at.timestamp())
        at = int(batch.ended_at.timestamp()) if batch.ended_at else None
        return {"id": batch.id, "object": "batch", "endpoint": "/v1/chat/completions",
                "errors": None, "input_file_id": batch.input_file_id,
                "completion_window": "24h", "status": status,
                "output_file_id": batch.output_file_id, "error_file_id": batch.error_file_id,
                "created_at": created, "in_progress_at": created,
                "expires_at": created + 24 * 3600,
                "completed_at": at if status == "completed" else None,
                "failed_at": at if status == "failed" else None,
                "expired_at": at if status == "expired" else None,
                "cancelled_at": at if status == "cancelled" else None,
                "request_counts": {"total": len(batch.requests),
                                   "completed": sum(s == 200 for s in done),
                                   "failed": sum(s != 200 for s in done)},
                "metadata": metadata}

    def _file(self, method: str, file_id: str | None, verb: str | None, body: bytes,
              content_type: str | None) -> BatchAnswer:
        if file_id is None:
            if method != "POST":
                return _not_found("/v1/files")
            parts = _multipart(body, content_type or "")
            upload = parts.get("file")
            if upload is None or parts.get("purpose", (None, b""))[1] != b"batch":
                return _json(400, _openai_error("invalid_request",
                                                "upload a file with purpose batch"))
            filename, content = upload
            return _json(200, _file_object(self._store(filename or "batch.jsonl", "batch",
                                                       content)))
        stored = self._files.get(file_id)
        if stored is None:
            return _json(404, _openai_error("not_found", f"no file {file_id}"))
        if verb == "content":
            return BatchAnswer(200, {}, stored.content, "application/octet-stream")
        return _json(200, _file_object(stored))

    # --- the batches' lives -------------------------------------------------------------------

    def _new(self, api: Literal["anthropic", "openai"], requests: list[tuple[str, dict[str, Any]]],
             *, prefix: str) -> _Batch:
        batch = _Batch(id=f"{prefix}{uuid.uuid4().hex[:24]}", api=api, requests=requests,
                       created=self.clock(), created_at=datetime.now(UTC),
                       outcome=self._script.popleft() if self._script else None)
        self._batches[batch.id] = batch
        self.created += 1
        return batch

    def _cancel(self, batch: _Batch) -> None:
        self.cancels += 1
        if batch.ended_at is None and batch.cancelled_at is None:
            batch.cancelled_at = datetime.now(UTC)
            self._end(batch, answer=False)

    def _settle(self, batch: _Batch) -> None:
        """End ``batch`` if its delay has run out (its requests are answered now)."""
        if batch.ended_at is None and self.clock() - batch.created >= self.delay_s:
            self._end(batch, answer=batch.outcome is None or batch.outcome == "failed")

    def _end(self, batch: _Batch, *, answer: bool) -> None:
        batch.ended_at = datetime.now(UTC)
        if answer and batch.outcome != "failed":
            for custom_id, params in batch.requests:
                path = "/v1/messages" if batch.api == "anthropic" else "/v1/chat/completions"
                status, _, body = self.answer(path, params)
                batch.answers[custom_id] = (status, body)
        elif answer and batch.api == "anthropic":  # "failed": every request errored
            for custom_id, _ in batch.requests:
                batch.answers[custom_id] = (500, {"type": "error", "error": {
                    "type": "api_error", "message": "Internal server error"}})
        if batch.api == "openai":
            self._openai_files(batch)

    def _openai_files(self, batch: _Batch) -> None:
        ok: list[dict[str, Any]] = []
        errors: list[dict[str, Any]] = []
        for custom_id, _ in batch.requests:
            answered = batch.answers.get(custom_id)
            if answered is None:
                if batch.outcome == "expired":
                    errors.append({"id": f"batch_req_{uuid.uuid4().hex[:16]}",
                                   "custom_id": custom_id, "response": None,
                                   "error": {"code": "batch_expired",
                                             "message": "This request could not be executed "
                                                        "before the completion window "
                                                        "expired."}})
                continue
            status, body = answered
            line = {"id": f"batch_req_{uuid.uuid4().hex[:16]}", "custom_id": custom_id,
                    "response": {"status_code": status,
                                 "request_id": uuid.uuid4().hex, "body": body},
                    "error": None}
            (ok if status == 200 else errors).append(line)
        if ok:
            batch.output_file_id = self._store(f"{batch.id}_output.jsonl", "batch_output",
                                               _lines(ok)).id
        if errors:
            batch.error_file_id = self._store(f"{batch.id}_error.jsonl", "batch_output",
                                              _lines(errors)).id

    def _store(self, filename: str, purpose: str, content: bytes) -> _File:
        stored = _File(id=f"file-{uuid.uuid4().hex[:24]}", filename=filename, purpose=purpose,
                       content=content, created_at=datetime.now(UTC))
        self._files[stored.id] = stored
        return stored


def _lines(rows: list[dict[str, Any]]) -> bytes:
    return ("\n".join(json.dumps(r) for r in rows) + "\n").encode()


def _file_object(stored: _File) -> dict[str, Any]:
    return {"id": stored.id, "object": "file", "bytes": len(stored.content),
            "created_at": int(stored.created_at.timestamp()), "filename": stored.filename,
            "purpose": stored.purpose, "status": "processed", "expires_at": None,
            "status_details": None}


def _multipart(body: bytes, content_type: str) -> dict[str, tuple[str | None, bytes]]:
    """The fields of a multipart/form-data body: name -> (filename, bytes)."""
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode()
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
    fields: dict[str, tuple[str | None, bytes]] = {}
    if not message.is_multipart():
        return fields
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if isinstance(name, str):
            payload = part.get_payload(decode=True)
            fields[name] = (part.get_filename(), payload if isinstance(payload, bytes) else b"")
    return fields


def _loads(body: bytes) -> Any:
    try:
        return json.loads(body or b"{}")
    except ValueError:
        return None


def _iso(at: datetime) -> str:
    return at.isoformat().replace("+00:00", "Z")


def _anthropic_error(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


def _openai_error(code: str, message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": None,
                      "code": code}}


def _not_found(path: str) -> BatchAnswer:
    return _json(404, {"type": "error", "error": {"type": "not_found_error",
                                                  "message": f"no route {path}"}})
