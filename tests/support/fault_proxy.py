#!/usr/bin/python3
"""An HTTP/1.1 reverse proxy for tests that injects faults between a client (libcurl, Python) and
an upstream server (nginx, an S3 endpoint such as moto): 503 SlowDown, a TCP reset, a body cut
short, a stall. Faults come from one seeded stream, drawn in request arrival order, so a run
whose requests are sent one at a time repeats exactly. Standard library only.

In-process:
    with FaultProxy("http://127.0.0.1:8080", seed=7, error_rate=0.05) as proxy:
        base = proxy.url          # also returned by start()
        ...
        proxy.stats()             # {"requests": .., "forwarded": .., "503": .., ...}
CLI (runs until SIGTERM/SIGINT):
    fault_proxy.py --upstream http://127.0.0.1:P --seed N --error-rate 0.05 \\
        [--kinds 503,reset,truncate,delay] [--latency-ms 20] [--delay-s 2] \\
        --port-file F [--stats-file F]

Requests pass through unchanged: method, request target, every header in order (Host too: S3
signatures cover it) and the body; so do the upstream's status, headers and body. Each client
connection has its own keep-alive connection upstream.
"""
import argparse
import errno
import fcntl
import http.client
import http.server
import json
import os
import random
import select
import signal
import socket
import struct
import sys
import threading
import time
import urllib.parse

KINDS = ("503", "reset", "truncate", "delay")
# Asked for by name only: the body arrives whole, its length right, one byte flipped (what a
# checksum must catch: a truncation check cannot).
EXTRA_KINDS = ("corrupt",)
CHUNK = 256 * 1024  # bytes per read/write when relaying a body
SMALL = 64 * 1024  # a first piece up to this size goes out in the same send as the headers
UPSTREAM_TIMEOUT_S = 60.0
PIPE_BYTES = 1 << 20  # the splice pipe's capacity (Linux's default limit for an unprivileged process)

SLOWDOWN = ('<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
            '<Message>Please reduce your request rate.</Message>'
            '<RequestId>fault-proxy-{n}</RequestId></Error>\n')

# A client that went away (or an upstream that timed out): not worth a traceback.
GONE = (ConnectionError, TimeoutError)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, proxy):
        self.proxy = proxy
        super().__init__(("127.0.0.1", 0), _Handler)

    def handle_error(self, request, client_address):
        e = sys.exc_info()[1]
        if isinstance(e, GONE) or (isinstance(e, OSError) and e.errno == errno.EBADF):
            return
        print(f"fault_proxy: {client_address[0]}:{client_address[1]}: {type(e).__name__}: {e}", file=sys.stderr)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.proxy = self.server.proxy
        self.upstream = None  # http.client.HTTPConnection, this client connection's own
        self.buf = memoryview(bytearray(CHUNK))
        self.pipe = None  # (read fd, write fd) for splice, made on first use
        self.proxy._connection_opened(self.connection)

    def finish(self):
        self._drop_upstream()
        if self.pipe is not None:
            for fd in self.pipe:
                os.close(fd)
            self.pipe = None
        self.proxy._connection_closed(self.connection)
        try:
            super().finish()
        except OSError:
            pass  # the socket was reset on purpose, or the client went away

    def log_message(self, format, *args):
        pass  # one line per request on stdout would drown a test's output

    def log_error(self, format, *args):
        print("fault_proxy: " + format % args, file=sys.stderr)

    def do_GET(self):
        try:
            self._relay()
        finally:
            self.proxy._request_done()

    do_HEAD = do_PUT = do_POST = do_DELETE = do_OPTIONS = do_PATCH = do_GET

    def _relay(self):
        body = self._read_body()
        kind = self.proxy._draw()
        if self.proxy.latency_s:
            time.sleep(self.proxy.latency_s)
        if kind == "503":
            self.proxy._count("503")
            return self._slowdown()
        if kind == "reset":
            self.proxy._count("reset")
            return self._reset()
        if kind == "delay":
            self.proxy._count("delay")
            time.sleep(self.proxy.delay_s)
        try:
            resp = self._forward(body)
        except (OSError, http.client.HTTPException) as e:
            print(f"fault_proxy: upstream {self.proxy.upstream}: {type(e).__name__}: {e}", file=sys.stderr)
            self.proxy._count("upstream_errors")
            return self._simple(502, f"fault_proxy: upstream failed: {type(e).__name__}: {e}\n".encode())
        self._respond(resp, truncate=(kind == "truncate"), corrupt=(kind == "corrupt"))

    # The request body is read in full first, so that every fault leaves the client connection
    # in a known state (a 503 keeps it usable).
    def _read_body(self):
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return self._read_chunked_raw()
        n = int(self.headers.get("Content-Length") or 0)
        if n == 0:
            return None
        body = self.rfile.read(n)
        if len(body) != n:
            raise ConnectionResetError(f"request body cut short: {len(body)} of {n} bytes")
        return body

    def _read_chunked_raw(self):
        """The chunked body as it came, framing and trailers included: forwarded byte for byte
        under the request's own Transfer-Encoding header."""
        parts = []
        while True:
            line = self.rfile.readline(65537)
            if not line.endswith(b"\n"):
                raise ConnectionResetError("chunked request body cut short")
            parts.append(line)
            size = int(line.split(b";", 1)[0].strip(), 16)
            if size == 0:
                while True:  # trailers, up to the empty line
                    line = self.rfile.readline(65537)
                    if not line.endswith(b"\n"):
                        raise ConnectionResetError("chunked request trailers cut short")
                    parts.append(line)
                    if line in (b"\r\n", b"\n"):
                        return b"".join(parts)
            data = self.rfile.read(size + 2)
            if len(data) != size + 2:
                raise ConnectionResetError("chunked request body cut short")
            parts.append(data)

    def _forward(self, body):
        # The raw target, not self.path: http.server folds a leading "//" into "/", and an S3
        # key may start with "/".
        target = self.requestline.split()[1]
        for attempt in range(2):
            if self.upstream is None:
                self.upstream = http.client.HTTPConnection(self.proxy.host, self.proxy.port,
                                                           timeout=UPSTREAM_TIMEOUT_S)
            conn = self.upstream
            reused = conn.sock is not None
            try:
                conn.putrequest(self.command, target, skip_host=True, skip_accept_encoding=True)
                for k, v in self.headers.items():
                    conn.putheader(k, v)
                conn.endheaders(body)
                return conn.getresponse()
            except (ConnectionError, http.client.BadStatusLine):
                self._drop_upstream()
                # An idle keep-alive connection the upstream closed: once more on a fresh one.
                if not reused or attempt:
                    raise

    def _drop_upstream(self):
        if self.upstream is not None:
            self.upstream.close()
            self.upstream = None

    def _respond(self, resp, truncate, corrupt=False):
        head = [f"HTTP/1.1 {resp.status} {resp.reason}\r\n"]
        for k, v in resp.msg.items():
            head.append(f"{k}: {v}\r\n")
            if k.lower() == "connection" and "close" in v.lower():
                self.close_connection = True
        head = "".join(head).encode("latin-1") + b"\r\n"

        if resp.chunked:
            framing = "chunked"
        elif resp.length is None:
            framing = "close"  # the body runs to the end of the upstream connection
            self.close_connection = True
        elif resp.length == 0:  # HEAD, 204, 304 or an empty body
            framing = "none"
        else:
            framing = "length"
        if truncate and framing in ("none", "close"):
            # Nothing to cut short that a client could notice: reset instead.
            self._drop_upstream()
            self.proxy._count("reset")
            return self._reset()

        corrupt = corrupt and framing == "length"
        if truncate:
            self.proxy._count("truncate")
        else:
            self.proxy._count("corrupt" if corrupt else "forwarded")
        if framing == "none":
            resp.read()
            return self._send(head)
        if framing == "length" and not truncate and not corrupt:
            return self._splice_body(resp, head)

        # Truncation sends the full headers, then at most half the body (at least one byte short),
        # then closes: the client sees the connection end early.
        limit = resp.length // 2 if truncate and framing == "length" else None
        pending = head  # the headers go out with the first piece of the body when it is small
        sent = 0
        while limit is None or sent < limit:
            want = CHUNK if limit is None else min(CHUNK, limit - sent)
            n = resp.readinto(self.buf[:want])
            if n == 0:
                break
            data = self.buf[:n]
            if corrupt and sent == 0:
                data[0] ^= 0xFF
            if framing == "chunked":
                keep = n // 2 if truncate else n
                self._send(pending + b"%x\r\n" % n + bytes(data[:keep]) + (b"" if truncate else b"\r\n"), keep)
                pending = b""
                if truncate:
                    break
            elif n <= SMALL:
                self._send(pending + bytes(data), n)
                pending = b""
            else:
                if pending:
                    self._send(pending)
                    pending = b""
                self._send(data, n)
            sent += n
        if pending:
            self._send(pending)
        if truncate:
            self._drop_upstream()
            self.close_connection = True
        elif framing == "chunked":
            self._send(b"0\r\n\r\n")  # the upstream's trailers, if any, are dropped

    def _splice_body(self, resp, head):
        """A whole body of known length, moved from the upstream socket to the client's in the
        kernel (splice through a pipe): the proxy stands for a network's latency, and copying every
        byte through Python would cost the cores the client under test runs on (bench/
        remote_vs_local runs both on one machine)."""
        left = resp.length
        buffered = resp.fp.peek(1)[:left]  # what http.client read past the headers
        if buffered:
            resp.fp.read(len(buffered))
            self._send(head + bytes(buffered), len(buffered))
            left -= len(buffered)
        else:
            self._send(head)
        if self.pipe is None:
            self.pipe = os.pipe()
            try:
                fcntl.fcntl(self.pipe[1], fcntl.F_SETPIPE_SZ, PIPE_BYTES)
            except OSError:
                pass  # a smaller pipe moves the same bytes in more calls
        r, w = self.pipe
        src, dst = resp.fp.fileno(), self.connection.fileno()  # resp.fp: the upstream socket, also when
        # the upstream said "Connection: close" (http.client has then let go of its own reference)
        poller = select.poll()
        poller.register(src, select.POLLIN)
        while left > 0:
            try:
                n = os.splice(src, w, min(left, PIPE_BYTES))
            except BlockingIOError:  # the upstream socket is non-blocking (it has a timeout)
                if not poller.poll(UPSTREAM_TIMEOUT_S * 1000):
                    raise TimeoutError(f"upstream sent nothing for {UPSTREAM_TIMEOUT_S:.0f} s")
                continue
            if n == 0:
                raise ConnectionResetError(f"upstream closed with {left} body bytes to go")
            self.proxy._count("bytes", n)
            left -= n
            while n > 0:
                n -= os.splice(r, dst, n)
        resp.length = 0
        resp._close_conn()  # the body is consumed: the upstream connection stays reusable

    def _send(self, data, body_bytes=0):
        if body_bytes:
            self.proxy._count("bytes", body_bytes)  # before the write, as every counter
        self.connection.sendall(data)

    def _slowdown(self):
        body = SLOWDOWN.format(n=self.proxy._stats["requests"]).encode()
        head = (f"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n"
                f"Content-Length: {len(body)}\r\n")
        if self.close_connection:
            head += "Connection: close\r\n"
        head = head.encode() + b"\r\n"
        if self.command == "HEAD":
            self._send(head)
        else:
            self._send(head + body, len(body))

    def _simple(self, status, body):
        head = (f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\nContent-Type: text/plain\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
        self.close_connection = True
        self._send(head if self.command == "HEAD" else head + body)

    def _reset(self):
        # SO_LINGER on with a zero timeout: close() sends an RST, not a FIN. The descriptor is
        # detached first: the handler's rfile/wfile hold references that would delay the close.
        self.close_connection = True
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.proxy._connection_closed(self.connection)
        os.close(self.connection.detach())


class FaultProxy:
    """A fault-injecting reverse proxy on 127.0.0.1, in a background thread (one more per client
    connection).

    Thread-safe: stats() may be called while requests run. Each request draws from
    random.Random(seed) under one lock once it has been read in full, so requests sent one at a
    time meet the same faults on every run; concurrent ones meet them in arrival order.
    on_request: called with no arguments after each request, on the handler's thread.
    """

    def __init__(self, upstream, seed=0, error_rate=0.0, kinds=KINDS, latency_ms=0, delay_s=2.0,
                 on_request=None):
        u = urllib.parse.urlsplit(upstream)
        if u.scheme != "http" or not u.hostname or u.path not in ("", "/") or u.query:
            raise ValueError(f"upstream: expected http://HOST:PORT, found {upstream!r}")
        if not 0.0 <= error_rate <= 1.0:
            raise ValueError(f"error_rate: expected 0..1, found {error_rate}")
        kinds = tuple(kinds)
        bad = [k for k in kinds if k not in KINDS + EXTRA_KINDS]
        if not kinds or bad:
            raise ValueError(f"kinds: expected a non-empty subset of {KINDS + EXTRA_KINDS}, found {kinds}")
        if latency_ms < 0 or delay_s < 0:
            raise ValueError("latency_ms and delay_s must be >= 0")
        self.upstream = upstream
        self.host, self.port = u.hostname, u.port or 80
        self.error_rate = error_rate
        self.kinds = kinds
        self.latency_s = latency_ms / 1000.0
        self.delay_s = delay_s
        self.on_request = on_request
        self.url = None
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._stats = {"requests": 0, "forwarded": 0, "503": 0, "reset": 0, "truncate": 0, "delay": 0,
                       "bytes": 0, "connections": 0, "upstream_errors": 0, "corrupt": 0}
        self._open = set()  # client sockets, shut down by stop()
        self._server = None
        self._thread = None

    def start(self):
        """Listens on an ephemeral port; returns the base URL http://127.0.0.1:PORT."""
        self._server = _Server(self)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fault_proxy", daemon=True)
        self._thread.start()
        return self.url

    def stop(self):
        """Stops accepting and ends every open client connection."""
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            open_now = list(self._open)
        for s in open_now:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._thread.join()
        self._server = None

    def stats(self):
        """A copy of the counters: {"requests", "forwarded", "503", "reset", "truncate", "delay",
        "bytes", "connections", "upstream_errors"}, as defined above _count."""
        with self._lock:
            return dict(self._stats)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    # Counters. requests: requests read; forwarded: upstream responses relayed in full (delayed
    # ones too); 503/reset/truncate/delay: faults injected (a truncate with no body to cut becomes
    # a reset); bytes: response body bytes sent to clients, fault bodies included; connections:
    # client connections accepted; upstream_errors: requests answered 502. Each is counted before
    # the client can see its effect, so a client that has its answer reads an up-to-date count.
    def _count(self, key, n=1):
        with self._lock:
            self._stats[key] += n

    def _draw(self):
        with self._lock:
            self._stats["requests"] += 1
            if self._rng.random() < self.error_rate:
                return self.kinds[self._rng.randrange(len(self.kinds))]
            return None

    def _request_done(self):
        if self.on_request is not None:
            self.on_request()

    def _connection_opened(self, sock):
        with self._lock:
            self._stats["connections"] += 1
            self._open.add(sock)

    def _connection_closed(self, sock):
        with self._lock:
            self._open.discard(sock)


def write_atomically(path, text):
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--upstream", required=True, help="http://HOST:PORT")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--error-rate", type=float, default=0.0)
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--latency-ms", type=float, default=0.0)
    p.add_argument("--delay-s", type=float, default=2.0)
    p.add_argument("--port-file", required=True, help="gets the port and a newline once listening")
    p.add_argument("--stats-file", help="gets the stats JSON after every request and at exit")
    a = p.parse_args()

    stats_lock = threading.Lock()

    def write_stats():
        if a.stats_file:
            with stats_lock:
                write_atomically(a.stats_file, json.dumps(proxy.stats()) + "\n")

    try:
        proxy = FaultProxy(a.upstream, seed=a.seed, error_rate=a.error_rate,
                           kinds=[k for k in a.kinds.split(",") if k], latency_ms=a.latency_ms,
                           delay_s=a.delay_s, on_request=write_stats)
    except ValueError as e:
        p.error(str(e))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    url = proxy.start()
    write_stats()
    write_atomically(a.port_file, url.rsplit(":", 1)[1] + "\n")
    while not stop.wait(0.5):
        pass
    proxy.stop()
    write_stats()
    return 0


if __name__ == "__main__":
    sys.exit(main())
