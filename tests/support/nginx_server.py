#!/usr/bin/python3
"""nginx serving a folder on 127.0.0.1 for tests: static files with keep-alive, sendfile and byte
ranges, over HTTP or (given a certificate and key, tls_certs.py makes them) HTTPS; a /forbidden/
location that answers 403, /moved/<path> that answers 302 to /<path>, /loop/<path> that answers
302 to itself forever; and an access log a test can read to count requests, see Range headers
and see which requests shared a connection.

In-process:
    with NginxServer(root) as nginx:
        base = nginx.url                  # also returned by start()
    NginxServer(root, tls=(cert_pem, key_pem)).start()   # "https://127.0.0.1:PORT"
        ...
        nginx.access_entries()            # [{"status": 206, "range": "bytes=0-99", ...}, ...]
CLI (runs until SIGTERM/SIGINT, then stops nginx):
    nginx_server.py ROOT --port-file F [--workers N] [--tls CERT KEY]

Everything nginx writes (config, pid, logs, temp folders) lives in a temporary prefix, removed
by stop(). Standard library only; needs /usr/sbin/nginx (Debian's nginx-light has all it uses).
"""
import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

NGINX = "/usr/sbin/nginx"
START_TIMEOUT_S = 10.0
BIND_TRIES = 5

# One line per request; quoted fields have nginx's escaping (a '"' becomes \x22).
LOG_FORMAT = ('$status $body_bytes_sent $connection $connection_requests $request_time '
              '"$request" "$http_range"')
LOG_LINE = re.compile(r'^(\d+) (\d+) (\d+) (\d+) ([\d.]+) "(.*)" "(.*)"$')

CONFIG = """\
daemon off;
worker_processes {workers};
{user}pid {pid};
error_log {error_log} warn;

events {{
    worker_connections 1024;
}}

http {{
    log_format crucible '{log_format}';
    access_log {access_log} crucible;
    client_body_temp_path {client_body_temp};
    proxy_temp_path {proxy_temp};
    fastcgi_temp_path {fastcgi_temp};
    uwsgi_temp_path {uwsgi_temp};
    scgi_temp_path {scgi_temp};

    default_type application/octet-stream;
    sendfile on;
    tcp_nopush on;
    keepalive_timeout 75s;
    keepalive_requests 100000;  # the default (1000) would close a benchmark's connections

    server {{
        listen 127.0.0.1:{port}{ssl};
{tls}        root {root};
        autoindex off;
        location /forbidden/ {{
            return 403;
        }}
        location /moved/ {{
            rewrite ^/moved/(.*)$ /$1 redirect;
        }}
        location /loop/ {{
            return 302 $uri;
        }}
    }}
}}
"""


def _quote(path):
    return '"' + path.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class NginxServer:
    """nginx in the foreground (a child process and its workers) serving root_dir.

    Not thread-safe: start and stop from one thread. access_log() may be called any time before
    stop().
    """

    def __init__(self, root_dir, workers=1, tls=None):
        """tls: (certificate PEM, key PEM) to serve HTTPS instead of HTTP."""
        self.root = os.path.abspath(root_dir)
        if not os.path.isdir(self.root):
            raise ValueError(f"root_dir: expected a folder, found {root_dir!r}")
        self.workers = workers
        self.tls = tuple(os.path.abspath(p) for p in tls) if tls else None
        for p in self.tls or ():
            if not os.path.isfile(p):
                raise ValueError(f"tls: expected a PEM file, found no file {p!r}")
        self.url = None
        self.port = None
        self.prefix = None
        self._proc = None

    def start(self):
        """Starts nginx and waits until it accepts connections; returns http(s)://127.0.0.1:PORT.
        Raises RuntimeError with nginx's messages if it exits early."""
        self.prefix = tempfile.mkdtemp(prefix="crucible-nginx-")
        try:
            for attempt in range(BIND_TRIES):
                port = _free_port()
                error = self._try_start(port)
                if error is None:
                    self.port = port
                    self.url = f"{'https' if self.tls else 'http'}://127.0.0.1:{port}"
                    return self.url
                # The port was free when probed; someone may have taken it since.
                if "Address already in use" not in error or attempt == BIND_TRIES - 1:
                    raise RuntimeError(f"nginx did not start (config {self.prefix}/nginx.conf):\n{error}")
        except BaseException:
            self._remove_prefix()
            raise

    def _try_start(self, port):
        """None once nginx accepts connections on port, else its messages."""
        conf = os.path.join(self.prefix, "nginx.conf")
        # Run as root, nginx's workers switch to "nobody", which cannot read a test's files (a
        # mkdtemp folder is mode 0700): keep them root. As another user the directive is ignored
        # with a warning, so it is left out.
        user = "user root;\n" if os.geteuid() == 0 else ""
        with open(conf, "w", encoding="utf-8") as f:
            inside = {name: _quote(os.path.join(self.prefix, name.replace("_log", ".log")))
                      for name in ("error_log", "access_log", "client_body_temp", "proxy_temp", "fastcgi_temp",
                                   "uwsgi_temp", "scgi_temp")}
            tls = "" if not self.tls else (f"        ssl_certificate {_quote(self.tls[0])};\n"
                                           f"        ssl_certificate_key {_quote(self.tls[1])};\n")
            f.write(CONFIG.format(workers=self.workers, user=user, pid=_quote(os.path.join(self.prefix, "nginx.pid")),
                                  log_format=LOG_FORMAT, port=port, ssl=" ssl" if self.tls else "", tls=tls,
                                  root=_quote(self.root), **inside))
        for name in ("access.log", "error.log"):
            open(os.path.join(self.prefix, name), "w").close()
        stderr_path = os.path.join(self.prefix, "stderr.log")
        with open(stderr_path, "wb") as stderr:
            # -e: messages before the config is read go to stderr, not the built-in log path.
            # A session of its own: a terminal's Ctrl-C reaches the CLI, which stops nginx.
            self._proc = subprocess.Popen([NGINX, "-p", self.prefix + "/", "-c", conf, "-e", "stderr"],
                                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                          stderr=stderr, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                self._proc = None
                return self._messages()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
                return None
            except OSError:
                time.sleep(0.02)
        self._kill()
        return f"no connection on port {port} after {START_TIMEOUT_S} s\n" + self._messages()

    def _messages(self):
        out = []
        for name in ("stderr.log", "error.log"):
            try:
                with open(os.path.join(self.prefix, name), encoding="utf-8", errors="replace") as f:
                    out.append(f.read())
            except OSError:
                pass
        return "".join(out)

    def stop(self):
        """Stops nginx (fast shutdown, then SIGKILL after 5 s) and removes the prefix."""
        if self._proc is not None:
            self._kill()
        self._remove_prefix()

    def _kill(self):
        proc, self._proc = self._proc, None
        proc.terminate()  # the master stops its workers before it exits
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the session started above: nginx and its workers
            proc.wait()

    def _remove_prefix(self):
        if self.prefix is not None:
            shutil.rmtree(self.prefix, ignore_errors=True)
            self.prefix = None

    def running(self):
        return self._proc is not None and self._proc.poll() is None

    def access_log(self, min_lines=0, timeout=5.0):
        """The access log's lines (LOG_FORMAT). nginx writes a line after the response has gone
        out, so a client can have its answer before the line exists: min_lines waits for that
        many lines, up to timeout seconds, then returns what there is."""
        deadline = time.monotonic() + timeout
        while True:
            with open(os.path.join(self.prefix, "access.log"), encoding="utf-8", errors="replace") as f:
                lines = [l for l in f.read().split("\n") if l]
            if len(lines) >= min_lines or time.monotonic() >= deadline:
                return lines
            time.sleep(0.01)

    def access_entries(self, min_lines=0, timeout=5.0):
        """access_log() parsed: dicts with status, bytes (body bytes sent), connection (nginx's
        connection serial number), connection_requests (1 for a connection's first request),
        request_time (s), request ("GET /x HTTP/1.1"), range (the Range header, "" if none)."""
        out = []
        for line in self.access_log(min_lines, timeout):
            m = LOG_LINE.match(line)
            if not m:
                raise ValueError(f"access log: unexpected line {line!r}")
            out.append({"status": int(m[1]), "bytes": int(m[2]), "connection": int(m[3]),
                        "connection_requests": int(m[4]), "request_time": float(m[5]),
                        "request": m[6], "range": "" if m[7] == "-" else m[7]})
        return out

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("root")
    p.add_argument("--port-file", required=True, help="gets the port and a newline once nginx accepts")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--tls", nargs=2, metavar=("CERT", "KEY"), help="serve HTTPS with this certificate and key")
    a = p.parse_args()

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    server = NginxServer(a.root, workers=a.workers, tls=a.tls)
    try:
        server.start()
    except (RuntimeError, ValueError) as e:
        print(f"nginx_server: {e}", file=sys.stderr)
        return 1
    try:
        tmp = f"{a.port_file}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(f"{server.port}\n")
        os.replace(tmp, a.port_file)
        while not stop.wait(0.2):
            if not server.running():
                print(f"nginx_server: nginx exited:\n{server._messages()}", file=sys.stderr)
                return 1
        return 0
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
