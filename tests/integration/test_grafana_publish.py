"""``rankwatch grafana publish`` through grafana-client over real HTTP, against a small
stand-in of Grafana's dashboard and folder API (no Grafana runs here): the boards land
under their uids, a second publish changes nothing, a changed board gets a new version."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from rankwatch.cli import main
from rankwatch.grafana.boards import UIDS
from rankwatch.grafana.publish import PublishError, publish

pytestmark = pytest.mark.integration

TOKEN = "glsa_test_token"


class FakeGrafana:
    """Grafana's HTTP API as far as the publisher uses it, with a version per save."""

    def __init__(self) -> None:
        self.folders: dict[str, str] = {}
        self.dashboards: dict[str, dict[str, Any]] = {}
        self.saves: list[str] = []


def _handler(state: FakeGrafana) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _reply(self, status: int, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorised(self) -> bool:
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                self._reply(401, {"message": "Unauthorized"})
                return False
            return True

        def do_GET(self) -> None:
            if not self._authorised():
                return
            if self.path.startswith("/api/folders/"):
                uid = self.path.rsplit("/", 1)[1]
                if uid in state.folders:
                    self._reply(200, {"uid": uid, "title": state.folders[uid]})
                else:
                    self._reply(404, {"message": "folder not found"})
            elif self.path.startswith("/api/dashboards/uid/"):
                uid = self.path.rsplit("/", 1)[1]
                if uid in state.dashboards:
                    self._reply(200, state.dashboards[uid])
                else:
                    self._reply(404, {"message": "Dashboard not found"})
            else:
                self._reply(404, {"message": "no such route"})

        def do_POST(self) -> None:
            if not self._authorised():
                return
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path == "/api/folders":
                state.folders[body["uid"]] = body["title"]
                self._reply(200, {"uid": body["uid"], "title": body["title"]})
            elif self.path == "/api/dashboards/db":
                dash = body["dashboard"]
                uid = dash["uid"]
                version = state.dashboards.get(uid, {}).get("dashboard", {}).get("version", 0)
                stored = {**dash, "id": 7, "version": version + 1}
                url = f"/d/{uid}/x"
                meta = {"folderUid": body["folderUid"], "url": url}
                state.dashboards[uid] = {"dashboard": stored, "meta": meta}
                state.saves.append(body["message"])
                self._reply(200, {"uid": uid, "url": url, "version": version + 1, "id": 7})
            else:
                self._reply(404, {"message": "no such route"})

    return Handler


@pytest.fixture
def grafana() -> Iterator[tuple[str, FakeGrafana]]:
    state = FakeGrafana()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", state
    finally:
        server.shutdown()
        server.server_close()


def test_publish_creates_then_changes_nothing(grafana: tuple[str, FakeGrafana]) -> None:
    url, state = grafana
    first = publish(url, TOKEN)
    assert {p.uid for p in first} == set(UIDS.values())
    assert {p.action for p in first} == {"created"} and {p.version for p in first} == {1}
    assert state.folders == {"rankwatch": "rankwatch"}
    second = publish(url, TOKEN)
    assert {p.action for p in second} == {"unchanged"}
    assert len(state.saves) == len(UIDS)  # no new versions


def test_a_board_changed_in_grafana_is_overwritten_as_a_new_version(
    grafana: tuple[str, FakeGrafana],
) -> None:
    url, state = grafana
    publish(url, TOKEN)
    state.dashboards["rankwatch-job"]["dashboard"]["title"] = "edited by hand"
    results = {p.uid: p for p in publish(url, TOKEN)}
    assert results["rankwatch-job"].action == "updated"
    assert results["rankwatch-job"].version == 2
    assert state.dashboards["rankwatch-job"]["dashboard"]["title"] == "rankwatch / Job"
    assert state.saves[-1].startswith("rankwatch ")


def test_cli_publish_and_a_bad_token(
    grafana: tuple[str, FakeGrafana], capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = grafana
    assert main(["grafana", "publish", "--url", url, "--token", TOKEN]) == 0
    assert "rankwatch-workers: created (version 1)" in capsys.readouterr().out
    with pytest.raises(PublishError, match="401"):
        publish(url, "wrong")
    assert main(["grafana", "publish", "--url", url, "--token", "wrong"]) == 2
    assert "401" in capsys.readouterr().err
