"""OpenAI-compatible annotator (the ``openai`` client) against a real HTTP server on loopback
with scripted replies: retries honouring ``Retry-After``, the json_schema ``response_format``,
the on-disk cache, and a ``KedroSession`` run whose key comes from a credentials file and leaks
nowhere."""

import base64
import io
import json
import logging
import threading
import time
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pandas as pd
import pytest
from kedro.framework.session import KedroSession
from mlflow.tracking import MlflowClient

from creditflow.chain.annotation.cache import DEFAULT_CACHE_DIR
from creditflow.chain.annotation.openai_backend import SCHEMA_NAME, OpenAIAnnotator
from creditflow.chain.annotation.schema import (
    ANNOTATION_COLUMNS,
    DIMENSIONS,
    annotation_json_schema,
)
from creditflow.hooks.run_manifest import MANIFEST_DIR
from tests.kedro_project import copy_project

GOOD = {
    "sharpness": 4,
    "exposure": 3,
    "noise": 5,
    "title_informativeness": 2,
    "relevance": 4,
    "overall": 3.6,
    "analysis": "Sharp, a little dark.",
}
GOOD_TEXT = "Here you go:\n```json\n" + json.dumps(GOOD) + "\n```"
MALFORMED = '{"sharpness": 4, "exposure": '
TIMEOUT_S = 0.3


class ScriptedServer(ThreadingHTTPServer):
    """Replies to each title with the next step of its script (the last step repeats).

    Steps: ("text", content) -> 200 with that message content; ("status", code) or ("status",
    code, headers); ("sleep", seconds, content) -> wait, then 200; ("body", bytes) -> 200 with a
    raw body; ("echo", code) -> that status with a body echoing the Authorization header, as
    some servers do.
    """

    daemon_threads = True

    def __init__(self, scripts):
        super().__init__(("127.0.0.1", 0), ScriptedHandler)
        self.scripts = scripts
        self.requests = []  # (path, headers, body) in arrival order
        self.arrivals = []  # time.monotonic() of each request, in the same order
        self.calls = defaultdict(int)
        self.lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def requests_for(self, title: str) -> int:
        return sum(title_of(body) == title for _, _, body in self.requests)


def title_of(body: dict) -> str:
    text = body["messages"][0]["content"][0]["text"]
    return next(line[len("Title: ") :] for line in text.splitlines() if line.startswith("Title: "))


class ScriptedHandler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # keep the test output clean
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        server = self.server
        with server.lock:
            server.requests.append((self.path, self.headers, body))  # case-insensitive
            server.arrivals.append(time.monotonic())
            title = title_of(body)
            script = server.scripts[title]
            step = script[min(server.calls[title], len(script) - 1)]
            server.calls[title] += 1
            server.in_flight += 1
            server.max_in_flight = max(server.max_in_flight, server.in_flight)
        try:
            self.reply(step)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (timeout): nobody is listening any more
        finally:
            with server.lock:
                server.in_flight -= 1

    def reply(self, step):
        kind = step[0]
        if kind == "status":
            headers = step[2] if len(step) > 2 else {}
            self.send(step[1], b'{"error": "scripted"}', headers)
            return
        if kind == "sleep":
            time.sleep(step[1])
            step = ("text", step[2])
        if kind == "body":
            self.send(200, step[1])
            return
        if kind == "echo":
            header = self.headers.get("Authorization", "")
            key = header.removeprefix("Bearer ")
            message = f"Incorrect API key provided: {key}. You sent '{header}'."
            self.send(step[1], json.dumps({"error": {"message": message}}).encode())
            return
        message = {"role": "assistant", "content": step[1]}
        completion = {
            "id": "c",
            "object": "chat.completion",
            "created": 0,
            "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
        }
        self.send(200, json.dumps(completion).encode())

    def send(self, code, payload: bytes, headers=None):
        self.send_response(code)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


@pytest.fixture
def serve():
    servers = []

    def start(scripts):
        server = ScriptedServer(scripts)
        # A short poll interval keeps shutdown() (and so each test) fast.
        threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def items_for(titles, catalogue) -> pd.DataFrame:
    rows = catalogue.head(len(titles)).copy()
    rows["title"] = titles
    return rows.reset_index(drop=True)


SCRIPTS = {
    "valid": [("text", GOOD_TEXT)],
    "malformed then valid": [("text", MALFORMED), ("text", GOOD_TEXT)],
    "500 then valid": [("status", 500), ("text", GOOD_TEXT)],
    "slow then valid": [("sleep", 3 * TIMEOUT_S, GOOD_TEXT), ("text", GOOD_TEXT)],
    "always malformed": [("text", "I think it is a nice video, 4/5.")],
    "bad envelope then valid": [("body", b"<html>oops</html>"), ("text", GOOD_TEXT)],
    "not found": [("status", 404)],
}


def make(server, tmp_path, **options) -> OpenAIAnnotator:
    settings = dict(
        model="qwen-vl-test",
        api_key="secret-token",
        max_concurrency=4,
        timeout_s=TIMEOUT_S,
        max_retries=2,
        reply_retries=2,
        cache_dir=tmp_path / "cache",
    )
    return OpenAIAnnotator(server.base_url, **{**settings, **options})


def test_scripted_failures_and_recoveries(serve, tmp_path, catalogue):
    server = serve(SCRIPTS)
    items = items_for(list(SCRIPTS), catalogue)
    frame = make(server, tmp_path).annotate(items).set_index("item_id")
    assert tuple(frame.reset_index().columns) == ANNOTATION_COLUMNS
    by_title = dict(zip(items["title"], items["item_id"], strict=True))

    def row(title):
        return frame.loc[by_title[title]]

    expected_attempts = {
        "valid": 1,
        "malformed then valid": 2,
        "500 then valid": 2,
        "slow then valid": 2,
        "bad envelope then valid": 2,
    }
    for title, attempts in expected_attempts.items():
        assert row(title)["status"] == "ok", (title, row(title)["error"])
        assert row(title)["attempts"] == attempts, title
        assert [row(title)[d] for d in DIMENSIONS] == [GOOD[d] for d in DIMENSIONS]
        assert row(title)["overall"] == GOOD["overall"] and row(title)["raw_text"] == GOOD_TEXT
        assert server.requests_for(title) == attempts
    failed = row("always malformed")
    assert failed["status"] == "failed" and failed["attempts"] == 3  # 1 + reply_retries
    assert failed["raw_text"] == "I think it is a nice video, 4/5."
    assert "unparsable output" in failed["error"] and "no JSON object" in failed["error"]
    assert failed[list(DIMENSIONS)].isna().all() and pd.isna(failed["overall"])
    # A 404 cannot be fixed by asking again.
    assert row("not found")["status"] == "failed" and row("not found")["attempts"] == 1
    assert "HTTP 404" in row("not found")["error"]


def test_request_carries_image_model_and_key(serve, tmp_path, catalogue):
    server = serve({"valid": [("text", GOOD_TEXT)]})
    items = items_for(["valid"], catalogue)
    make(server, tmp_path).annotate(items)
    ((path, headers, body),) = server.requests
    assert path == "/v1/chat/completions"
    assert body["model"] == "qwen-vl-test"
    assert headers["Authorization"] == "Bearer secret-token"
    text_part, image_part = body["messages"][0]["content"]
    assert text_part["type"] == "text" and "Category: " + items["category"][0] in text_part["text"]
    assert '"title_informativeness"' in text_part["text"]  # the schema instructions
    assert image_part["type"] == "image_url"
    prefix = "data:image/png;base64,"
    url = image_part["image_url"]["url"]
    assert url.startswith(prefix)
    assert base64.b64decode(url[len(prefix) :]) == items["image_png"][0]


def test_cache_serves_reruns_without_requests(serve, tmp_path, catalogue):
    server = serve(
        {
            "valid": [("text", GOOD_TEXT)],
            "500 then valid": [("status", 500), ("text", GOOD_TEXT)],
            "always malformed": [("text", MALFORMED)],
        }
    )
    items = items_for(["valid", "500 then valid", "always malformed"], catalogue)
    first = make(server, tmp_path).annotate(items)
    assert first["status"].tolist() == ["ok", "ok", "failed"]
    assert len(list((tmp_path / "cache").glob("*.json"))) == 2  # failures are not cached
    n_before = len(server.requests)

    second = make(server, tmp_path).annotate(items)
    new_titles = [title_of(body) for _, _, body in server.requests[n_before:]]
    assert new_titles == ["always malformed"] * 3  # only the failure is asked again
    assert second["attempts"].tolist() == [0, 0, 3]
    cols = ["status", "overall", *DIMENSIONS, "analysis", "raw_text"]
    pd.testing.assert_frame_equal(second.loc[:1, cols], first.loc[:1, cols])

    # Another model is another cache key; without an api_key no Authorization header is sent.
    make(server, tmp_path, model="other-model", api_key=None).annotate(items.head(1))
    _, headers, body = server.requests[-1]
    assert title_of(body) == "valid" and body["model"] == "other-model"
    assert "Authorization" not in headers


def test_concurrency_is_bounded(serve, tmp_path, catalogue):
    titles = [f"item {i}" for i in range(6)]
    server = serve({t: [("sleep", 0.1, GOOD_TEXT)] for t in titles})
    frame = make(server, tmp_path, max_concurrency=2, cache_dir=None).annotate(
        items_for(titles, catalogue)
    )
    assert (frame["status"] == "ok").all()
    assert server.max_in_flight == 2


def test_429_with_retry_after_is_retried_after_the_wait_asked(serve, tmp_path, catalogue):
    """The client waits what ``Retry-After`` says (1 s here, not its 0.5 s backoff), asks
    again, and the item is annotated from the second reply; the request carries the
    annotation schema as a strict json_schema ``response_format``."""
    server = serve({"limited": [("status", 429, {"Retry-After": "1"}), ("text", GOOD_TEXT)]})
    frame = make(server, tmp_path).annotate(items_for(["limited"], catalogue))
    assert frame["status"].tolist() == ["ok"] and frame["attempts"].tolist() == [2]
    assert frame["overall"].tolist() == [GOOD["overall"]]
    first, second = server.arrivals
    assert second - first >= 0.95
    for _, _, body in server.requests:
        assert body["response_format"] == {
            "type": "json_schema",
            "json_schema": {
                "name": SCHEMA_NAME,
                "schema": annotation_json_schema(),
                "strict": True,
            },
        }
        assert body["temperature"] == 0.0 and body["max_tokens"] == 512


def test_structured_output_can_be_switched_off(serve, tmp_path, catalogue):
    server = serve({"valid": [("text", GOOD_TEXT)]})
    make(server, tmp_path, structured_output=False).annotate(items_for(["valid"], catalogue))
    ((_, _, body),) = server.requests
    assert "response_format" not in body


def test_cache_is_on_by_default(serve, tmp_path, catalogue, monkeypatch):
    """Without a cache_dir option the cache lives under the working directory (the project
    root under ``kedro run``): a second annotator makes no request."""
    monkeypatch.chdir(tmp_path)
    server = serve({"valid": [("text", GOOD_TEXT)]})
    annotator = OpenAIAnnotator(server.base_url, "qwen-vl-test")
    items = items_for(["valid"], catalogue)
    annotator.annotate(items)
    assert len(list((tmp_path / DEFAULT_CACHE_DIR).glob("*.json"))) == 1
    again = OpenAIAnnotator(server.base_url, "qwen-vl-test").annotate(items)
    assert len(server.requests) == 1 and again["attempts"].tolist() == [0]
    assert again["status"].tolist() == ["ok"]


def test_unreachable_server_fails_without_raising(tmp_path, catalogue):
    with ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler) as closed:
        port = closed.server_address[1]  # bound then closed: nothing listens there
    annotator = OpenAIAnnotator(
        f"http://127.0.0.1:{port}/v1/", "m", timeout_s=TIMEOUT_S, max_retries=1, cache_dir=None
    )
    assert annotator.url == f"http://127.0.0.1:{port}/v1/chat/completions"
    frame = annotator.annotate(items_for(["valid"], catalogue))
    assert frame["status"].tolist() == ["failed"] and frame["attempts"].tolist() == [2]
    assert "connection failed" in frame["error"][0]


def test_rejects_bad_settings():
    with pytest.raises(ValueError, match="placeholders"):
        OpenAIAnnotator("http://x", "m", prompt_template="Rate {item}")
    with pytest.raises(ValueError, match="max_concurrency"):
        OpenAIAnnotator("http://x", "m", max_concurrency=0)
    with pytest.raises(ValueError, match="timeout_s"):
        OpenAIAnnotator("http://x", "m", timeout_s=0)


def test_an_error_body_echoing_the_key_is_scrubbed(serve, tmp_path, catalogue, caplog):
    server = serve({"valid": [("echo", 401)], "retried": [("echo", 503)]})
    with caplog.at_level(logging.DEBUG, logger="creditflow"):
        frame = make(server, tmp_path, max_retries=1).annotate(
            items_for(["valid", "retried"], catalogue)
        )
    assert frame["status"].tolist() == ["failed", "failed"]
    assert frame["attempts"].tolist() == [1, 2]  # 401 is final, 503 is retried
    for error in frame["error"]:
        assert "Incorrect API key provided: [REDACTED]" in error
        assert "Bearer [REDACTED]" in error
    assert "secret-token" not in frame.to_json()
    assert "secret-token" not in caplog.text and "[REDACTED]" in caplog.text


KEY = "sk-test-0123456789abcdef"


@pytest.mark.filterwarnings("ignore:register_new_resolver:UserWarning")
def test_session_run_reads_the_key_from_credentials_and_writes_it_nowhere(
    serve, project_root: Path, tmp_path: Path, monkeypatch
):
    """``kedro run --pipelines annotation`` (two nodes) with the project's hooks, the key in a
    temporary conf/local/credentials.yml, and a server answering 401 with the key echoed: the
    header carried the key, and no file the run writes nor its log holds it."""
    server = serve(defaultdict(lambda: [("echo", 401)]))
    copy_project(project_root, tmp_path, monkeypatch)
    (tmp_path / "conf/local/credentials.yml").write_text(f"openai_annotator:\n  api_key: {KEY}\n")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    options = {"base_url": server.base_url, "model": "m", "credentials": "openai_annotator"}
    overrides = {
        "annotation": {
            "items": {"n_items": 3, "image_size": 32},
            "annotator": {"name": "openai", "options": options | {"max_retries": 0}},
        }
    }
    log = io.StringIO()
    handler = logging.StreamHandler(log)
    with KedroSession.create(project_path=tmp_path, runtime_params=overrides) as session:
        # After the session has configured logging (which would drop a handler added earlier).
        logging.getLogger().addHandler(handler)
        run_id = session.session_id
        try:
            session.run(
                pipeline_names=["annotation"], node_names=["generate_items", "annotate_items"]
            )
        finally:
            logging.getLogger().removeHandler(handler)

    assert [headers["Authorization"] for _, headers, _ in server.requests] == [f"Bearer {KEY}"] * 3
    saved = tmp_path / "data/04_feature/item_annotations.parquet" / run_id
    annotations = pd.read_parquet(saved / "item_annotations.parquet")
    assert annotations["status"].tolist() == ["failed"] * 3
    assert all("HTTP 401" in e and "[REDACTED]" in e for e in annotations["error"])
    manifest = json.loads((tmp_path / MANIFEST_DIR / f"{run_id}.json").read_text())
    assert manifest["parameters"]["annotation"]["annotator"]["options"]["credentials"] == (
        "openai_annotator"
    )
    client = MlflowClient(f"sqlite:///{tmp_path}/mlruns/mlflow.db")  # conf/base/mlflow.yml
    (run,) = client.search_runs([client.get_experiment_by_name("creditflow").experiment_id])
    params = run.data.params
    assert params["annotation.annotator.options.credentials"] == "openai_annotator"

    credentials_file = tmp_path / "conf/local/credentials.yml"
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p != credentials_file]
    assert saved in {p.parent for p in written} and any(MANIFEST_DIR in str(p) for p in written)
    leaks = [str(p.relative_to(tmp_path)) for p in written if KEY.encode() in p.read_bytes()]
    assert leaks == []
    assert KEY not in log.getvalue() and "annotated 3 items" in log.getvalue()
