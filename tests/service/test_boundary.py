"""The boundary of ``sessionfold serve`` over real sockets (issue 33): a caller without a key is
refused before its body is read, bodies and heads are bounded (413, 431, naming the limit), and
what is within the limits is read as sent. The server runs with the protocol and limits of
``sessionfold serve``, made small here so a test sends kilobytes, not megabytes."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from typing import Any

import pytest
from conftest import LiveApi
from sessionfold.runtime.settings import Settings

BODY_LIMIT = 256 * 1024
HEAD_LIMIT = 8 * 1024
MAX_HEADERS = 40
POLICY = {"budget_tokens": 4000}
MESSAGES = "/v1/sessions/agent-1/messages"


@pytest.fixture
def api_settings(make_settings: Callable[..., Settings], store_url: str) -> Settings:
    return make_settings(database_url=store_url, metrics_port=0, api_key_cache_s=0.0,
                         api_poll_interval_s=0.05, api_max_body_bytes=BODY_LIMIT,
                         api_max_header_bytes=HEAD_LIMIT, api_max_headers=MAX_HEADERS)


class Raw:
    """One HTTP/1.1 connection written by hand: what a hostile client sends."""

    def __init__(self, api: LiveApi) -> None:
        host, port = api.url.removeprefix("http://").split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.buffer = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def head(self, method: str, path: str, headers: dict[str, str]) -> None:
        lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1",
                 *(f"{k}: {v}" for k, v in headers.items()), "", ""]
        self.send("\r\n".join(lines).encode())

    def answer(self) -> tuple[int, dict[str, str], dict[str, Any]]:
        """The status, headers and JSON body of the next answer (10 s at most)."""
        while b"\r\n\r\n" not in self.buffer:
            self._read()
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
        length = int(headers["content-length"])
        while len(self.buffer) < length:
            self._read()
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return int(status_line.split()[1]), headers, json.loads(body)

    def _read(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection without an answer")
        self.buffer += chunk

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def raw(api: LiveApi) -> Any:
    opened: list[Raw] = []

    def connect() -> Raw:
        opened.append(Raw(api))
        return opened[-1]

    yield connect
    for connection in opened:
        connection.close()


def make_session(api: LiveApi, key: str) -> None:
    made = api.http(key).post("/v1/sessions", json={"id": "agent-1", "policy": POLICY})
    assert made.status_code == 201, made.text


def test_a_body_without_a_key_is_refused_before_any_of_it_is_sent(
        api: LiveApi, raw: Callable[[], Raw]) -> None:
    for authorization in ({}, {"Authorization": "Bearer sfk_000000000000_" + "A" * 43}):
        client = raw()
        client.head("POST", MESSAGES, {"Content-Type": "application/json",
                                        "Content-Length": str(100 * 1024 * 1024),
                                        **authorization})
        # Not a byte of the 100 MB declared is sent: the answer comes all the same.
        status, headers, body = client.answer()
        assert status == 401, body
        assert body["error"]["reason"] == "unauthorized"
        assert headers["www-authenticate"].startswith("Bearer")


def test_a_declared_body_over_the_limit_is_refused_before_it_is_read_naming_the_limit(
        api: LiveApi, raw: Callable[[], Raw]) -> None:
    key = api.key("acme")
    make_session(api, key)
    client = raw()
    client.head("POST", MESSAGES, {"Authorization": f"Bearer {key}",
                                    "Content-Type": "application/json",
                                    "Content-Length": str(BODY_LIMIT + 1)})
    status, _, body = client.answer()
    assert status == 413, body
    assert body["error"]["reason"] == "body-too-large"
    assert f"{BODY_LIMIT:,} bytes" in body["error"]["message"]
    assert "SESSIONFOLD_API_MAX_BODY_BYTES" in body["error"]["message"]
    assert api.store.get_session("tenant:acme/agent-1").ledger_len == 0


def test_a_chunked_body_is_refused_once_it_passes_the_limit(
        api: LiveApi, raw: Callable[[], Raw]) -> None:
    key = api.key("acme")
    make_session(api, key)
    client = raw()
    client.head("POST", MESSAGES, {"Authorization": f"Bearer {key}",
                                    "Content-Type": "application/json",
                                    "Transfer-Encoding": "chunked"})
    chunk = b"a" * 16384
    sent = 0
    client.sock.settimeout(0.2)
    while True:  # send until the answer comes: it must come without the body's end
        client.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        sent += len(chunk)
        assert sent <= 4 * BODY_LIMIT, "no answer long after the limit was passed"
        try:
            client._read()
            break
        except TimeoutError:
            continue
    client.sock.settimeout(10)
    status, _, body = client.answer()
    assert status == 413 and body["error"]["reason"] == "body-too-large", body
    assert sent > BODY_LIMIT
    assert api.store.get_session("tenant:acme/agent-1").ledger_len == 0


@pytest.mark.parametrize("chunked", [False, True])
def test_a_body_within_the_limit_is_read_as_sent(api: LiveApi, raw: Callable[[], Raw],
                                                 chunked: bool) -> None:
    key = api.key("acme")
    make_session(api, key)
    text = "x" * (BODY_LIMIT - 1024)
    body = json.dumps({"messages": [{"role": "user", "content": text}]}).encode()
    client = raw()
    framing = {"Transfer-Encoding": "chunked"} if chunked else {
        "Content-Length": str(len(body))}
    client.head("POST", MESSAGES, {"Authorization": f"Bearer {key}",
                                    "Content-Type": "application/json", **framing})
    if chunked:
        for start in range(0, len(body), 10_000):
            piece = body[start:start + 10_000]
            client.send(b"%x\r\n%s\r\n" % (len(piece), piece))
        client.send(b"0\r\n\r\n")
    else:
        client.send(body)
    status, _, answer = client.answer()
    assert status == 201, answer
    [entry] = api.http(key).get("/v1/sessions/agent-1/ledger").json()["entries"]
    assert entry["message"] == {"role": "user", "content": text}


@pytest.mark.parametrize("headers", [
    {"X-Big": "a" * (2 * 1024 * 1024)},                       # one 2 MB header
    {f"X-{i}": "1" for i in range(20_000)},                   # 20,000 headers
    {f"X-{i}": "1" for i in range(MAX_HEADERS + 1)},          # few bytes, too many fields
    {"X-Long": "b" * (HEAD_LIMIT + 100)},                     # just over the head's bytes
])
def test_a_head_past_its_limits_is_answered_431(api: LiveApi, raw: Callable[[], Raw],
                                                headers: dict[str, str]) -> None:
    key = api.key("acme")
    client = raw()
    client.head("GET", "/v1/sessions", {"Authorization": f"Bearer {key}", **headers})
    try:
        status, _, body = client.answer()
    except (ConnectionResetError, BrokenPipeError):  # pragma: no cover (depends on timing)
        pytest.fail("the connection was reset before the 431 could be read")
    assert status == 431, body
    assert body["error"]["reason"] == "headers-too-large"
    assert "SESSIONFOLD_API_MAX_HEADER" in body["error"]["message"]


def test_a_head_within_its_limits_is_served(api: LiveApi) -> None:
    key = api.key("acme")
    headers = {f"X-{i}": "v" * 50 for i in range(MAX_HEADERS - 10)}  # beside httpx's own
    assert api.http(key).get("/v1/sessions", headers=headers).status_code == 200
