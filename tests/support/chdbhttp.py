"""ClickHouse's HTTP interface, answered by chDB in a process of its own.

Why: a deployed worker stores into a ClickHouse server, so the engine's work is not in the
worker's process; embedded chDB (``chdb://``) puts it there, and allows one process per
data path. This endpoint gives tests and benchmarks the deployed shape on this machine:
the store's ``http://`` path exercised through clickhouse-connect's HTTP client, a
worker's CPU measured without the engine's, and several processes sharing one store.

**It is not a ClickHouse server.** It answers the part of the HTTP interface that
clickhouse-connect uses: a statement in the ``query`` parameter, the body or both (an
INSERT's data follows its statement), ``database``, ``default_format``, settings as
parameters (applied with ``SET`` when the engine knows them), and an insert body's
``Content-Encoding``. Statements run on one chDB connection, one at a time. Errors come
back as a server's do: status 500, ``X-ClickHouse-Exception-Code`` and the message.
Responses are not compressed.

For tests of a busy server, :meth:`ChdbHttp.refuse_inserts` makes the next inserts fail
with a given ClickHouse error code, as a loaded server refuses them (TOO_MANY_PARTS...);
:meth:`ChdbHttp.hang_inserts` makes them wait before they run and are answered, as a
hung server does.

    python tests/support/chdbhttp.py --path DIR [--port 0] [--port-file F]

A test helper, not part of the wheel (importable as ``support.chdbhttp`` under pytest).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

_INSERT = re.compile(rb"^\s*(INSERT\s+INTO\s.*?)\s+FORMAT\s+(\w+)\s*?(?:\n|$)", re.I | re.S)
_FORMAT = re.compile(r"\sFORMAT\s+(\w+)\s*;?\s*$", re.I)
_CODE = re.compile(r"Code:\s*(\d+)")
_NOT_SETTINGS = frozenset(
    {"query", "database", "default_format", "query_id", "session_id", "session_timeout"}
    | {"session_check", "compress", "decompress", "enable_http_compression", "user"}
    | {"password", "wait_end_of_query", "send_progress_in_http_headers", "buffer_size"}
    | {"http_headers_progress_interval_ms", "client_protocol_version", "quota_key"}
)
"""Request parameters that are part of the HTTP protocol, not engine settings."""


def _decompress(data: bytes, encoding: str) -> bytes:
    """An insert body as sent: the store's clickhouse-connect sends LZ4 here (the zstd and
    brotli it can also use are refused, with a clear error)."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return data
    if encoding == "lz4":
        import lz4.frame

        return bytes(lz4.frame.decompress(data))
    if encoding in ("gzip", "deflate"):
        return zlib.decompress(data, 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS)
    raise ValueError(f"Content-Encoding {encoding!r} not supported")


class Engine:
    """One chDB connection, a statement at a time."""

    def __init__(self, path: str) -> None:
        import chdb

        self._conn = chdb.connect(path)
        self._lock = threading.Lock()
        self._settings: frozenset[str] | None = None
        self._database = "default"

    def run(
        self,
        sql: str,
        fmt: str,
        database: str | None,
        settings: Mapping[str, str],
        values: Mapping[str, str] | None = None,
    ) -> bytes:
        """The statement's output in ``fmt`` (a FORMAT clause in it wins); ``values``
        bind its ``{name:Type}`` placeholders."""
        with self._lock:
            if database and database != self._database:
                self._conn.query(f"USE `{database}`", "TabSeparated")
                self._database = database
            for name, value in settings.items():
                if name in self._known_settings():
                    quoted = value.replace("\\", "\\\\").replace("'", "\\'")
                    self._conn.query(f"SET {name} = '{quoted}'", "TabSeparated")
            return self._conn.query(sql, fmt, params=dict(values or {})).bytes() or b""

    def _known_settings(self) -> frozenset[str]:
        if self._settings is None:
            out = self._conn.query("SELECT name FROM system.settings", "TabSeparated")
            self._settings = frozenset((out.bytes() or b"").decode().split())
        return self._settings

    def close(self) -> None:
        self._conn.close()


class Countdown:
    """What to do to the next inserts: a control file holds "value count [table]"
    (written by the test: the error code to refuse with, or the seconds to hang before
    answering; with a table, only inserts into it count)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def next(self, table: str = "") -> float | None:
        """The value for this insert (into ``table``), or None; counts down."""
        with self._lock:
            try:
                value, count, *only = self.path.read_text().split()
                left = int(count)
            except (OSError, ValueError):
                return None
            if left <= 0 or (only and only[0] != table):
                return None
            self.path.write_text(" ".join([value, str(left - 1), *only]))
            return float(value)


class Refused(Exception):
    """An insert refused on the test's request, with a server's error code."""

    def __init__(self, code: int) -> None:
        super().__init__(f"Code: {code}. DB::Exception: refused on request (chdbhttp). ")


def _handler(
    engine: Engine, spool: Path, refusals: Countdown, hangs: Countdown
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self._serve(b"")

        def do_POST(self) -> None:
            self._serve(self._body())

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                parts = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                            pass
                        break
                    parts.append(self.rfile.read(size))
                    self.rfile.readline()
                raw = b"".join(parts)
            else:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            return _decompress(raw, self.headers.get("Content-Encoding", ""))

        def _serve(self, body: bytes) -> None:
            params = dict(parse_qsl(urlsplit(self.path).query, keep_blank_values=True))
            query_id = params.get("query_id") or str(uuid.uuid4())
            try:
                output, fmt = self._execute(params, body)
            except Exception as exc:  # the engine's refusal, or a request it cannot read
                self._reply(500, str(exc).encode(), {"X-ClickHouse-Exception-Code": _code(exc)})
                return
            self._reply(
                200,
                output,
                {
                    "X-ClickHouse-Format": fmt,
                    "X-ClickHouse-Timezone": "UTC",
                    "X-ClickHouse-Query-Id": query_id,
                    "X-ClickHouse-Summary": json.dumps({"read_rows": "0", "written_rows": "0"}),
                },
            )

        def _execute(self, params: dict[str, str], body: bytes) -> tuple[bytes, str]:
            statement = params.get("query", "").encode()
            if statement and body:
                statement += b" " if not _INSERT.match(statement) else b"\n"
            text = statement + body
            values = {k[6:]: v for k, v in params.items() if k.startswith("param_")}
            settings = {
                k: v
                for k, v in params.items()
                if k not in _NOT_SETTINGS and not k.startswith("param_")
            }
            database = params.get("database")
            insert = _INSERT.match(text)
            if insert is not None:
                return self._insert(insert, text[insert.end() :], database, settings), ""
            sql = text.decode()
            fmt = params.get("default_format") or "TabSeparated"
            named = _FORMAT.search(sql)
            output = engine.run(sql, fmt, database, settings, values)
            return output, named[1] if named else fmt

        def _insert(
            self, head: re.Match[bytes], data: bytes, database: str | None, settings: Any
        ) -> bytes:
            statement, fmt = head[1].decode(), head[2].decode()
            hang = hangs.next(_table(statement))
            if hang is not None:  # a server that takes the insert and answers late
                time.sleep(hang)
            code = refusals.next()
            if code is not None:
                raise Refused(int(code))
            with tempfile.NamedTemporaryFile(dir=spool, suffix=".in", delete=False) as tmp:
                tmp.write(data)
            try:
                sql = f"{statement} FROM INFILE '{tmp.name}' FORMAT {fmt}"
                return engine.run(sql, "TabSeparated", database, settings)
            finally:
                os.unlink(tmp.name)

        def _reply(self, status: int, body: bytes, headers: Mapping[str, str]) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; charset=UTF-8")
            self.send_header("Content-Length", str(len(body)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

    return Handler


def _table(statement: str) -> str:
    """The table an ``INSERT INTO [db.]table ...`` statement names, unquoted."""
    words = statement.split()
    target = words[2] if len(words) > 2 else ""
    return target.split("(")[0].rpartition(".")[2].strip('`"')


def _code(exc: Exception) -> str:
    match = _CODE.search(str(exc))
    return match[1] if match else "1000"


def serve(path: Path, port: int, ready: Callable[[int], None]) -> None:
    """Serve ``path``'s chDB on ``port`` (0: any free one) until killed."""
    engine = Engine(str(path))
    spool = path / "http-spool"
    spool.mkdir(parents=True, exist_ok=True)
    refusals, hangs = Countdown(path.parent / "refuse"), Countdown(path.parent / "hang")
    server = ThreadingHTTPServer(("127.0.0.1", port), _handler(engine, spool, refusals, hangs))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # close chDB on the way out
    ready(server.server_address[1])
    try:
        server.serve_forever()
    finally:
        engine.close()


class ChdbHttp:
    """The endpoint as a child process (``start``, ``stop``; or ``with endpoint(dir)``)."""

    def __init__(self, directory: Path | str, start_timeout_s: float = 60.0) -> None:
        self.directory = Path(directory).resolve()
        self.start_timeout_s = start_timeout_s
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0

    def dsn(self, database: str = "rankwatch") -> str:
        return f"http://default:@127.0.0.1:{self.port}/{database}"

    def start(self) -> ChdbHttp:
        """Start serving; again after :meth:`stop`, on the same port and data (the
        DSN a worker holds works again)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        port_file = self.directory / "port"
        port_file.unlink(missing_ok=True)
        log = self.directory / "endpoint.log"
        argv = [sys.executable, __file__, "--path", str(self.directory / "data")]
        argv += ["--port-file", str(port_file), "--port", str(self.port)]
        from support.lifetime import tied  # here: this file also runs alone, as the endpoint

        with log.open("ab") as out:
            self.process = subprocess.Popen(
                tied(argv),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + self.start_timeout_s
        while not port_file.exists() or not port_file.read_text().strip():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"chDB endpoint did not start: see {log}")
            time.sleep(0.05)
        self.port = int(port_file.read_text())
        return self

    def refuse_inserts(self, code: int, count: int) -> None:
        """Refuse the next ``count`` inserts with ClickHouse error ``code``."""
        self._control("refuse", code, count)

    def refusals_left(self) -> int:
        return self._left("refuse")

    def hang_inserts(self, seconds: float, count: int, table: str = "") -> None:
        """Hold each of the next ``count`` inserts (into ``table``, if given) ``seconds``
        before running it and answering (other requests are answered meanwhile), as a
        hung server does."""
        self._control("hang", seconds, count, table)

    def hangs_left(self) -> int:
        return self._left("hang")

    def _control(self, name: str, value: float, count: int, table: str = "") -> None:
        tmp = self.directory / f"{name}.tmp"
        tmp.write_text(f"{value} {count} {table}".rstrip())
        tmp.replace(self.directory / name)

    def _left(self, name: str) -> int:
        try:
            return int((self.directory / name).read_text().split()[1])
        except (OSError, ValueError, IndexError):
            return 0

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@contextlib.contextmanager
def endpoint(directory: Path | str) -> Iterator[ChdbHttp]:
    """An endpoint serving ``directory`` for the ``with`` block."""
    running = ChdbHttp(directory).start()
    try:
        yield running
    finally:
        running.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--path", type=Path, required=True, help="chDB's data directory")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file", type=Path, help="written with the port once serving")

    def ready(port: int) -> None:
        if args.port_file:
            args.port_file.with_suffix(".tmp").write_text(str(port))
            args.port_file.with_suffix(".tmp").replace(args.port_file)
        print(f"serving chDB at {args.path} on http://127.0.0.1:{port}", flush=True)

    args = parser.parse_args()
    serve(args.path, args.port, ready)


if __name__ == "__main__":
    main()
