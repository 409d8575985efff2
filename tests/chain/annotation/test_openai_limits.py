"""The openai annotator against misbehaving servers on loopback: one that trickles its reply,
one that never answers, endless and oversized bodies, a compressed body and a wait asked past
the deadline. Each ends its item as failed, with an error naming the limit, within the
deadline (each server gives up after GIVE_UP_S, so a regression fails on time instead of
hanging the suite)."""

import doctest
import gzip
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from creditflow.chain.annotation import retry_policy
from creditflow.chain.annotation.openai_backend import DEFAULT_MAX_REPLY_BYTES, OpenAIAnnotator
from creditflow.chain.annotation.retry_policy import retry_wait
from tests.chain.annotation.test_openai_backend import GOOD, GOOD_TEXT, items_for

GIVE_UP_S = 20.0  # a hostile server stops misbehaving after this long
BOUND_S = 8.0  # generous wall-clock bound on a 1-2 s deadline (the machine is shared)


class HostileServer(ThreadingHTTPServer):
    """Reads each request, then lets ``behave(handler)`` answer it (or not)."""

    daemon_threads = True

    def __init__(self, behave):
        super().__init__(("127.0.0.1", 0), HostileHandler)
        self.behave = behave
        self.stop = threading.Event()  # set at teardown: handlers still misbehaving end
        self.requests = 0
        self.lock = threading.Lock()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class HostileHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        with self.server.lock:
            self.server.requests += 1
        try:
            self.server.behave(self)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client hung up: what a bounded client does


@pytest.fixture
def hostile():
    servers = []

    def start(behave):
        server = HostileServer(behave)
        threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop.set()
        server.shutdown()
        server.server_close()


def headers(handler, code=200, **extra):
    handler.send_response(code)
    handler.send_header("Content-Type", "application/json")
    for name, value in extra.items():
        handler.send_header(name.replace("_", "-"), value)
    handler.end_headers()
    handler.wfile.flush()


def trickle(handler):
    """Headers at once, then one byte every 0.2 s: no read waits long enough to time out."""
    headers(handler, Content_Length="1000000")
    started = time.monotonic()
    while time.monotonic() - started < GIVE_UP_S and not handler.server.stop.wait(0.2):
        handler.wfile.write(b" ")
        handler.wfile.flush()


def silent(handler):
    """Accepts the request and never answers."""
    handler.server.stop.wait(GIVE_UP_S)


def endless(handler):
    """A 200 whose chunked body never ends."""
    headers(handler, Transfer_Encoding="chunked")
    chunk = b"x" * 65536
    started = time.monotonic()
    while time.monotonic() - started < GIVE_UP_S and not handler.server.stop.is_set():
        handler.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))


def completion(content: str) -> bytes:
    message = {"role": "assistant", "content": content}
    choice = {"index": 0, "finish_reason": "stop", "message": message}
    body = {"id": "c", "object": "chat.completion", "created": 0, "model": "m"}
    return json.dumps({**body, "choices": [choice]}).encode()


def make(server, tmp_path, **options) -> OpenAIAnnotator:
    settings = dict(model="m", cache_dir=tmp_path / "cache", progress=False)
    return OpenAIAnnotator(server.base_url, **{**settings, **options})


def annotate_timed(annotator, items):
    started = time.monotonic()
    frame = annotator.annotate(items)
    return frame, time.monotonic() - started


def test_a_trickling_reply_ends_at_the_request_deadline(hostile, tmp_path, catalogue):
    """Before: timeout_s bounds each read, so a byte every 0.2 s kept the item waiting for the
    whole 1 MB body (about 55 hours). Now the item fails at request_deadline_s."""
    server = hostile(trickle)
    annotator = make(server, tmp_path, timeout_s=0.5, request_deadline_s=1.0)
    frame, elapsed = annotate_timed(annotator, items_for(["slow"], catalogue))
    assert frame["status"].tolist() == ["failed"] and frame["attempts"].tolist() == [1]
    error = frame["error"][0]
    assert "request_deadline_s=1 s passed while the reply was still arriving" in error, error
    assert 1.0 <= elapsed < BOUND_S


def test_a_silent_server_costs_the_request_deadline_not_the_retries(hostile, tmp_path, catalogue):
    """Before: the default timeout_s (30 s) times 1 + max_retries (3) tries plus backoff,
    ~123 s per item. Now each request's timeout is cut to what is left of the deadline."""
    server = hostile(silent)
    annotator = make(server, tmp_path, request_deadline_s=1.0)  # timeout_s 30, max_retries 3
    frame, elapsed = annotate_timed(annotator, items_for(["silent"], catalogue))
    assert frame["status"].tolist() == ["failed"]
    error = frame["error"][0]
    assert error.startswith("gave up: request_deadline_s=1 s passed (last: timed out"), error
    assert 1.0 <= elapsed < BOUND_S


def test_the_step_deadline_fails_the_rest_and_the_call_returns(hostile, tmp_path, catalogue):
    """Six items, two at a time, against a trickling server, with a generous per-item deadline
    and a step deadline of 1 s: the two in flight fail at the step deadline, the three whose
    turn comes later fail unsent, and the cached one is still served."""
    server = hostile(trickle)
    annotator = make(
        server,
        tmp_path,
        timeout_s=0.5,
        max_concurrency=2,
        request_deadline_s=30.0,
        step_deadline_s=1.0,
    )
    items = items_for([f"item {i}" for i in range(6)], catalogue)
    cached = items.iloc[-1]
    prompt = annotator.prompt(cached["title"], cached["category"])
    key = annotator.cache_key(cached["image_png"], cached["title"], prompt)
    annotator.cache.put(key, GOOD_TEXT, annotator.model)

    frame, elapsed = annotate_timed(annotator, items)
    assert frame["status"].tolist() == ["failed"] * 5 + ["ok"]
    assert frame["overall"].iloc[-1] == GOOD["overall"] and frame["attempts"].iloc[-1] == 0
    cut, unsent = frame["error"][:2].tolist(), frame["error"][2:5].tolist()
    assert all("step_deadline_s=1 s passed while the reply was still arriving" in e for e in cut)
    assert unsent == ["not sent: step_deadline_s=1 s had passed"] * 3
    assert frame["attempts"][:5].tolist() == [1, 1, 0, 0, 0] and server.requests == 2
    assert 1.0 <= elapsed < BOUND_S


def test_an_endless_body_is_cut_at_max_reply_bytes(hostile, tmp_path, catalogue):
    """Before: the client buffered the body until the process ran out of memory."""
    server = hostile(endless)
    annotator = make(server, tmp_path, max_reply_bytes=256 * 1024)
    frame, elapsed = annotate_timed(annotator, items_for(["endless"], catalogue))
    assert frame["status"].tolist() == ["failed"] and frame["attempts"].tolist() == [1]
    assert frame["error"][0].startswith("reply body over max_reply_bytes=262144 (cut off at ")
    assert elapsed < BOUND_S


def test_a_valid_50_mb_annotation_is_refused_at_the_default_cap(hostile, tmp_path, catalogue):
    """Before: accepted, and its 50 MB analysis became an ExpModel SFT target."""
    annotation = json.dumps({**GOOD, "analysis": "Sharp. " * 7_500_000})  # 52.5 MB
    body = completion(annotation)

    def huge(handler):
        headers(handler, Content_Length=str(len(body)))
        handler.wfile.write(body)

    server = hostile(huge)
    frame = make(server, tmp_path).annotate(items_for(["huge"], catalogue))
    assert frame["status"].tolist() == ["failed"] and frame["raw_text"].isna().all()
    announced = f"reply of {len(body)} bytes announced, over max_reply_bytes="
    assert frame["error"][0] == f"{announced}{DEFAULT_MAX_REPLY_BYTES}"
    assert list((tmp_path / "cache").glob("*.json")) == []


def test_a_compressed_reply_is_refused(hostile, tmp_path, catalogue):
    """Its size would only show once inflated (a small gzip body can inflate to gigabytes)."""
    body = gzip.compress(completion(GOOD_TEXT))

    def compressed(handler):
        headers(handler, Content_Encoding="gzip", Content_Length=str(len(body)))
        handler.wfile.write(body)

    server = hostile(compressed)
    frame = make(server, tmp_path).annotate(items_for(["gzip"], catalogue))
    assert frame["status"].tolist() == ["failed"]
    assert frame["error"][0].startswith("reply is compressed (gzip) although identity encoding")


def test_a_wait_asked_past_the_deadline_is_not_waited(hostile, tmp_path, catalogue):
    """Before: the client slept through a Retry-After of up to two minutes, deadline or not."""

    def limited(handler):
        body = b'{"error": "slow down"}'
        headers(handler, 429, Retry_After="100", Content_Length=str(len(body)))
        handler.wfile.write(body)

    server = hostile(limited)
    annotator = make(server, tmp_path, request_deadline_s=2.0)
    frame, elapsed = annotate_timed(annotator, items_for(["limited"], catalogue))
    assert frame["status"].tolist() == ["failed"] and frame["attempts"].tolist() == [1]
    error = frame["error"][0]
    assert error.startswith("gave up: request_deadline_s=2 s leaves no time for the 100 s wait")
    assert "HTTP 429" in error and elapsed < BOUND_S


@pytest.mark.parametrize("option", ["request_deadline_s", "step_deadline_s", "max_reply_bytes"])
@pytest.mark.parametrize("value", [0, -1, float("inf"), "60", True])
def test_bounds_are_checked(option, value):
    with pytest.raises(ValueError, match=option):
        OpenAIAnnotator("http://x", "m", **{option: value})


@pytest.mark.parametrize(
    ("status", "headers", "retries_taken", "expected"),
    [
        (None, {}, 0, 0.5),  # no reply: backoff 0.5 * 2^0
        (500, {}, 2, 2.0),  # 0.5 * 2^2
        (503, {}, 10, 8.0),  # capped at MAX_BACKOFF_S
        (408, {}, 0, 0.5),
        (409, {}, 0, 0.5),
        (400, {}, 0, None),  # repeating it cannot help
        (400, {"X-Should-Retry": "true"}, 0, 0.5),  # unless the server says so
        (503, {"x-should-retry": "false"}, 0, None),
        (429, {"retry-after-ms": "250", "Retry-After": "9"}, 0, 0.25),
        (429, {"Retry-After": "121"}, 0, None),  # past MAX_RETRY_AFTER_S: not retried
        (429, {"Retry-After": "inf"}, 0, None),
        (429, {"Retry-After": "0"}, 1, 1.0),  # no positive wait asked: the backoff
        (429, {"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}, 0, 0.5),  # a date passed
        (503, {}, 20, None),  # max_retries (20) spent
    ],
)
def test_retry_policy(status, headers, retries_taken, expected):
    wait = retry_wait(status, headers, retries_taken, max_retries=20, jitter=lambda: 0.0)
    assert wait == expected


def test_retry_policy_jitter_and_examples():
    assert retry_wait(500, {}, 1, 3, jitter=lambda: 1.0) == 0.75  # 1.0 less 25 %
    assert doctest.testmod(retry_policy).failed == 0
