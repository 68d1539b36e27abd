#!/usr/bin/python3
"""tests/support/fault_proxy.py and nginx_server.py hold: nginx serves the bytes and ranges a
test wrote, the proxy passes requests and answers through unchanged, each fault does what it says
to an http.client client, and a seed repeats its faults.

One nginx serves a temporary folder of seeded random files for the whole module; each test starts
its own proxy. To add a case: write a test_* method that starts FaultProxy(NGINX.url, ...) (or
the echo upstream below, to see what reached the server) and asserts on status, bytes and stats().

    /usr/bin/python3 tests/scripts/fault_proxy_test.py [unittest options]
"""
import contextlib
import errno
import hashlib
import http.client
import http.server
import io
import json
import os
import random
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import unittest

SUPPORT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support")
sys.path.insert(0, SUPPORT)
from fault_proxy import KINDS, FaultProxy  # noqa: E402
from nginx_server import NginxServer  # noqa: E402
from tls_certs import make_certificates  # noqa: E402

BIG = random.Random(1).randbytes(4 * 1024 * 1024)
SMALL = random.Random(2).randbytes(64 * 1024)
NGINX = None
TMP = None


def setUpModule():
    global NGINX, TMP
    TMP = tempfile.TemporaryDirectory(prefix="fault-proxy-test-")
    for name, data in (("big.bin", BIG), ("small.bin", SMALL), ("forbidden/x", b"secret")):
        path = os.path.join(TMP.name, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
    NGINX = NginxServer(TMP.name)
    NGINX.start()


def tearDownModule():
    NGINX.stop()
    TMP.cleanup()


def connect(url, timeout=10):
    host, port = url[len("http://"):].rsplit(":", 1)
    return http.client.HTTPConnection(host, int(port), timeout=timeout)


def fetch(conn, path, method="GET", headers=None):
    """(status, headers, body) on a connection that stays open."""
    conn.request(method, path, headers=headers or {})
    r = conn.getresponse()
    return r.status, r.headers, r.read()


def get(url, path, method="GET", headers=None, timeout=10):
    conn = connect(url, timeout)
    try:
        return fetch(conn, path, method, headers)
    finally:
        conn.close()


def wait_for_file(path, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear in {timeout} s")
        time.sleep(0.01)
    with open(path) as f:
        return f.read()


class Echo(http.server.BaseHTTPRequestHandler):
    """An upstream that answers with what reached it: method, raw target, headers in order, body.
    /chunked answers with a chunked body, /close with a body delimited by the connection's end."""
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        if "chunked" in self.headers.get("Transfer-Encoding", ""):
            body = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b""):
                        pass
                    break
                body += self.rfile.read(size)
                self.rfile.readline()
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        seen = json.dumps({"method": self.command, "target": self.requestline.split()[1],
                           "headers": list(self.headers.items()), "body_len": len(body),
                           "body_sha256": hashlib.sha256(body).hexdigest()}).encode()
        if self.path == "/chunked":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for piece in (b"abc", b"x" * 300000, b"end"):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.write(b"0\r\n\r\n")
            return
        if self.path == "/close":
            self.send_response(200)
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(b"until the end")
            self.close_connection = True
            return
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Multi", "one")
        self.send_header("X-Multi", "two")
        self.send_header("Content-Length", str(len(seen)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(seen)

    do_HEAD = do_PUT = do_POST = do_DELETE = do_GET


class EchoServer:
    def __enter__(self):
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Echo)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


class Nginx(unittest.TestCase):
    def test_full_and_range_gets_return_the_files_bytes(self):
        status, headers, body = get(NGINX.url, "/big.bin")
        self.assertEqual((status, body), (200, BIG))
        status, headers, body = get(NGINX.url, "/big.bin", headers={"Range": "bytes=1000-1999"})
        self.assertEqual(status, 206)
        self.assertEqual(headers["Content-Range"], f"bytes 1000-1999/{len(BIG)}")
        self.assertEqual(body, BIG[1000:2000])
        entry = NGINX.access_entries()[-1]
        self.assertEqual((entry["status"], entry["bytes"], entry["range"]), (206, 1000, "bytes=1000-1999"))

    def test_forbidden_is_403_even_for_a_file_that_exists(self):
        self.assertEqual(get(NGINX.url, "/forbidden/x")[0], 403)
        self.assertEqual(get(NGINX.url, "/missing.bin")[0], 404)

    def test_moved_is_302_to_the_path_without_it_and_loop_is_302_to_itself(self):
        status, headers, _ = get(NGINX.url, "/moved/small.bin")
        self.assertEqual((status, headers["Location"]), (302, NGINX.url + "/small.bin"))
        status, headers, _ = get(NGINX.url, "/loop/small.bin")
        self.assertEqual((status, headers["Location"]), (302, NGINX.url + "/loop/small.bin"))

    def test_https_with_a_test_made_certificate_trusted_only_through_its_authority(self):
        with tempfile.TemporaryDirectory() as tmp:
            certs = make_certificates(tmp)
            with NginxServer(TMP.name, tls=(certs["cert"], certs["key"])) as https:
                self.assertTrue(https.url.startswith("https://127.0.0.1:"), https.url)
                host, port = https.url[len("https://"):].rsplit(":", 1)
                trusted = ssl.create_default_context(cafile=certs["ca"])
                conn = http.client.HTTPSConnection(host, int(port), context=trusted, timeout=10)
                try:
                    status, headers, body = fetch(conn, "/big.bin", headers={"Range": "bytes=10-19"})
                    self.assertEqual((status, body), (206, BIG[10:20]))
                finally:
                    conn.close()
                for cafile in (None, certs["other_ca"]):  # the system's authorities, another one
                    context = ssl.create_default_context(cafile=cafile)
                    conn = http.client.HTTPSConnection(host, int(port), context=context, timeout=10)
                    with self.assertRaises(ssl.SSLCertVerificationError):
                        fetch(conn, "/small.bin")
                    conn.close()

    def test_cli_writes_the_port_and_stops_on_sigterm(self):
        with tempfile.TemporaryDirectory() as tmp:
            port_file = os.path.join(tmp, "port")
            proc = subprocess.Popen([sys.executable, os.path.join(SUPPORT, "nginx_server.py"), TMP.name,
                                     "--port-file", port_file], stderr=subprocess.PIPE)
            try:
                port = int(wait_for_file(port_file))
                self.assertEqual(get(f"http://127.0.0.1:{port}", "/small.bin")[2], SMALL)
                proc.send_signal(signal.SIGTERM)
                self.assertEqual(proc.wait(timeout=10), 0, proc.stderr.read())
                with self.assertRaises(ConnectionRefusedError):  # nginx went with it
                    get(f"http://127.0.0.1:{port}", "/small.bin")
            finally:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
                proc.stderr.close()


class Passthrough(unittest.TestCase):
    def test_statuses_headers_and_bytes_match_nginx_direct(self):
        with FaultProxy(NGINX.url) as proxy:
            cases = [("GET", "/big.bin", {}), ("GET", "/big.bin", {"Range": "bytes=4000000-"}),
                     ("GET", "/big.bin", {"Range": "bytes=0-0"}), ("HEAD", "/big.bin", {}),
                     ("GET", "/forbidden/x", {}), ("GET", "/missing.bin", {}),
                     ("GET", "/big.bin", {"If-None-Match": get(NGINX.url, "/big.bin", "HEAD")[1]["ETag"]})]  # 304
            for method, path, headers in cases:
                with self.subTest(method=method, path=path, headers=headers):
                    direct = get(NGINX.url, path, method, headers)
                    through = get(proxy.url, path, method, headers)
                    self.assertEqual(through[0], direct[0])
                    self.assertEqual(through[2], direct[2])
                    ignore = {"Date", "Last-Modified", "ETag"}  # the same file's, but compared below
                    self.assertEqual([h for h in through[1].items() if h[0] not in ignore],
                                     [h for h in direct[1].items() if h[0] not in ignore])
            status, headers, body = get(proxy.url, "/big.bin", "HEAD")
            self.assertEqual((status, headers["Content-Length"], body), (200, str(len(BIG)), b""))
            self.assertEqual(headers["ETag"], get(NGINX.url, "/big.bin", "HEAD")[1]["ETag"])
            self.assertEqual(get(proxy.url, "/big.bin", headers={"Range": "bytes=10-19"})[1]["Content-Range"],
                             f"bytes 10-19/{len(BIG)}")
            stats = proxy.stats()
            self.assertEqual(stats["requests"], len(cases) + 2)
            self.assertEqual(stats["forwarded"], stats["requests"])
            self.assertEqual(stats["503"] + stats["reset"] + stats["truncate"] + stats["delay"], 0)

    def test_many_requests_share_one_keep_alive_connection_each_side(self):
        with FaultProxy(NGINX.url) as proxy:
            before = len(NGINX.access_log())
            conn = connect(proxy.url)
            fetch(conn, "/small.bin")
            sock = conn.sock
            for i in range(60):
                lo = i * 1000
                status, headers, body = fetch(conn, "/big.bin", headers={"Range": f"bytes={lo}-{lo + 65535}"})
                self.assertEqual((status, body), (206, BIG[lo:lo + 65536]))
            self.assertIs(conn.sock, sock, "http.client reconnected: the proxy closed the connection")
            conn.close()
            self.assertEqual(proxy.stats()["connections"], 1)
            entries = NGINX.access_entries(min_lines=before + 61)[before:]
            self.assertEqual(len(entries), 61)
            self.assertEqual(len({e["connection"] for e in entries}), 1,
                             "the proxy opened several upstream connections")
            self.assertEqual([e["connection_requests"] for e in entries], list(range(1, 62)))

    def test_concurrent_connections(self):
        with FaultProxy(NGINX.url) as proxy:
            errors = []

            def client(k):
                try:
                    conn = connect(proxy.url)
                    for i in range(10):
                        lo = (k * 10 + i) * 4096
                        status, _, body = fetch(conn, "/big.bin", headers={"Range": f"bytes={lo}-{lo + 99999}"})
                        if (status, body) != (206, BIG[lo:lo + 100000]):
                            errors.append((k, i, status, len(body)))
                    fetch(conn, "/big.bin")
                    conn.close()
                except Exception as e:  # reported in the main thread
                    errors.append((k, repr(e)))

            threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            self.assertEqual(errors, [])
            stats = proxy.stats()
            self.assertEqual((stats["connections"], stats["requests"], stats["forwarded"]), (8, 88, 88))
            self.assertEqual(stats["bytes"], 80 * 100000 + 8 * len(BIG))

    def test_method_target_headers_and_body_reach_the_upstream_unchanged(self):
        body = random.Random(3).randbytes(300000)
        with EchoServer() as echo, FaultProxy(echo) as proxy:
            conn = connect(proxy.url)
            # Host is the signed S3 host, not the proxy's; a duplicate header keeps both copies.
            sent = [("Host", "bucket.s3.example.com:9000"),
                    ("Authorization", "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20260101/us-east-1/s3/aws4_request, "
                                      "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, Signature=abc123"),
                    ("x-amz-date", "20260101T000000Z"), ("x-amz-content-sha256", hashlib.sha256(body).hexdigest()),
                    ("Range", "bytes=0-99"), ("X-Dup", "a"), ("X-Dup", "b"), ("Content-Length", str(len(body)))]
            for method, target in (("PUT", "/bucket/key%20x?partNumber=1&uploadId=u-1"), ("POST", "//bucket//k"),
                                   ("DELETE", "/bucket/key?versionId=3")):
                with self.subTest(method=method):
                    conn.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
                    for k, v in sent:
                        conn.putheader(k, v)
                    conn.endheaders(body)
                    r = conn.getresponse()
                    self.assertEqual(r.status, 201)
                    self.assertEqual(r.headers.get_all("X-Multi"), ["one", "two"])
                    seen = json.loads(r.read())
                    self.assertEqual(seen["method"], method)
                    self.assertEqual(seen["target"], target)
                    self.assertEqual([tuple(h) for h in seen["headers"]], sent)
                    self.assertEqual((seen["body_len"], seen["body_sha256"]),
                                     (len(body), hashlib.sha256(body).hexdigest()))
            # A chunked request body, as libcurl sends an upload of unknown size.
            conn.request("PUT", "/bucket/stream", body=iter([body[:1000], body[1000:]]), encode_chunked=True)
            seen = json.loads(conn.getresponse().read())
            self.assertEqual(seen["body_sha256"], hashlib.sha256(body).hexdigest())
            self.assertIn(("Transfer-Encoding", "chunked"), [tuple(h) for h in seen["headers"]])
            status, headers, data = fetch(conn, "/x", "HEAD")
            self.assertEqual((status, data), (201, b""))
            self.assertGreater(int(headers["Content-Length"]), 0)
            # A chunked answer is passed on chunked; one delimited by the connection's end ends it.
            status, headers, data = fetch(conn, "/chunked")
            self.assertEqual((status, headers["Transfer-Encoding"], data),
                             (200, "chunked", b"abc" + b"x" * 300000 + b"end"))
            status, headers, data = fetch(conn, "/close")
            self.assertEqual((status, data), (200, b"until the end"))
            self.assertIsNone(conn.sock, "the client connection should end with a body delimited by close")
            conn.close()
            self.assertEqual(proxy.stats()["forwarded"], 7)

    def test_upstream_down_is_502(self):
        with EchoServer() as echo:
            pass
        with FaultProxy(echo) as proxy, contextlib.redirect_stderr(io.StringIO()) as stderr:
            self.assertEqual(get(proxy.url, "/x")[0], 502)
            self.assertEqual(proxy.stats()["upstream_errors"], 1)
        self.assertIn("ConnectionRefusedError", stderr.getvalue())

    def test_bad_arguments_are_refused(self):
        for kwargs in ({"kinds": ("bogus",)}, {"kinds": ()}, {"error_rate": 1.5}, {"latency_ms": -1}):
            with self.subTest(**kwargs), self.assertRaises(ValueError):
                FaultProxy(NGINX.url, **kwargs)
        with self.assertRaises(ValueError):
            FaultProxy("https://127.0.0.1:1")


class Faults(unittest.TestCase):
    def test_503_is_s3_slowdown_and_keeps_the_connection(self):
        logged = len(NGINX.access_log())
        with FaultProxy(NGINX.url, error_rate=1.0, kinds=("503",)) as proxy:
            conn = connect(proxy.url)
            status, headers, body = fetch(conn, "/big.bin")
            self.assertEqual(status, 503)
            self.assertIn(b"<Code>SlowDown</Code>", body)
            self.assertEqual(int(headers["Content-Length"]), len(body))
            sock = conn.sock
            status, headers, body = fetch(conn, "/big.bin", "HEAD")
            self.assertEqual((status, body), (503, b""))
            self.assertEqual(fetch(conn, "/small.bin")[0], 503)
            self.assertIs(conn.sock, sock)
            conn.close()
            stats = proxy.stats()
            self.assertEqual((stats["requests"], stats["503"], stats["forwarded"]), (3, 3, 0))
        self.assertEqual(len(NGINX.access_log()), logged, "a 503 reached nginx")

    def test_reset_is_a_tcp_rst_before_any_byte(self):
        with FaultProxy(NGINX.url, error_rate=1.0, kinds=("reset",)) as proxy:
            for method in ("GET", "HEAD"):
                with self.subTest(method=method):
                    conn = connect(proxy.url)
                    with self.assertRaises(ConnectionResetError) as caught:
                        fetch(conn, "/big.bin", method)
                    # An RST is ECONNRESET from recv; a FIN would be RemoteDisconnected.
                    self.assertNotIsInstance(caught.exception, http.client.RemoteDisconnected)
                    self.assertEqual(caught.exception.errno, errno.ECONNRESET)
                    conn.close()
            stats = proxy.stats()
            self.assertEqual((stats["requests"], stats["reset"], stats["forwarded"], stats["bytes"]), (2, 2, 0, 0))

    def test_truncate_sends_full_headers_and_half_the_body(self):
        with FaultProxy(NGINX.url, error_rate=1.0, kinds=("truncate",)) as proxy:
            conn = connect(proxy.url)
            conn.request("GET", "/big.bin")
            r = conn.getresponse()
            self.assertEqual((r.status, int(r.headers["Content-Length"])), (200, len(BIG)))
            with self.assertRaises(http.client.IncompleteRead) as caught:
                r.read()
            self.assertEqual(caught.exception.partial, BIG[:len(BIG) // 2])
            conn.close()
            # A Range answer is cut the same way; a HEAD has no body to cut: it is reset.
            conn = connect(proxy.url)
            conn.request("GET", "/big.bin", headers={"Range": "bytes=0-0"})
            r = conn.getresponse()
            self.assertEqual((r.status, r.headers["Content-Length"]), (206, "1"))
            with self.assertRaises(http.client.IncompleteRead) as caught:
                r.read()
            self.assertEqual(caught.exception.partial, b"")
            conn.close()
            with self.assertRaises(ConnectionResetError):
                get(proxy.url, "/big.bin", "HEAD")
            stats = proxy.stats()
            self.assertEqual((stats["truncate"], stats["reset"], stats["bytes"]), (2, 1, len(BIG) // 2))

    def test_delay_times_out_an_impatient_client_and_serves_a_patient_one(self):
        with FaultProxy(NGINX.url, error_rate=1.0, kinds=("delay",), delay_s=0.5) as proxy:
            with self.assertRaises(TimeoutError):
                get(proxy.url, "/big.bin", timeout=0.2)
            start = time.monotonic()
            status, _, body = get(proxy.url, "/big.bin")
            self.assertGreaterEqual(time.monotonic() - start, 0.5)
            self.assertEqual((status, body), (200, BIG))
            stats = proxy.stats()
            self.assertEqual((stats["requests"], stats["delay"]), (2, 2))

    def test_latency_is_added_to_every_request(self):
        with FaultProxy(NGINX.url, latency_ms=20) as proxy:
            conn = connect(proxy.url)
            start = time.monotonic()
            for _ in range(10):
                self.assertEqual(fetch(conn, "/small.bin")[2], SMALL)
            self.assertGreaterEqual(time.monotonic() - start, 0.2)
            conn.close()
        with FaultProxy(NGINX.url, latency_ms=20, error_rate=1.0, kinds=("503",)) as proxy:
            start = time.monotonic()
            self.assertEqual(get(proxy.url, "/small.bin")[0], 503)
            self.assertGreaterEqual(time.monotonic() - start, 0.02)

    def run_sequence(self, seed, n=200):
        """Sends n GETs one at a time; returns the fault each met ("-" for none), checking that
        what the client saw matches what the proxy counted."""
        delay_s = 0.02
        kinds = []
        with FaultProxy(NGINX.url, seed=seed, error_rate=0.3, delay_s=delay_s) as proxy:
            conn = None
            for i in range(n):
                before = proxy.stats()
                conn = conn or connect(proxy.url)
                start = time.monotonic()
                try:
                    status, _, body = fetch(conn, "/small.bin")
                    seen = "503" if status == 503 else ("ok" if (status, body) == (200, SMALL) else f"bad {status}")
                except http.client.IncompleteRead as e:
                    seen = "truncate" if len(e.partial) == len(SMALL) // 2 else f"bad cut {len(e.partial)}"
                except ConnectionResetError as e:
                    seen = "reset" if not isinstance(e, http.client.RemoteDisconnected) else "bad FIN"
                elapsed = time.monotonic() - start
                if seen in ("truncate", "reset"):
                    conn.close()
                    conn = None
                after = proxy.stats()
                counted = [k for k in KINDS if after[k] != before[k]]
                self.assertLessEqual(len(counted), 1, f"request {i}: {counted}")
                kind = counted[0] if counted else "-"
                expected = {"-": "ok", "delay": "ok"}.get(kind, kind)
                self.assertEqual(seen, expected, f"request {i}: the proxy counted {kind}")
                if kind == "delay":
                    self.assertGreaterEqual(elapsed, delay_s)
                kinds.append(kind)
            if conn:
                conn.close()
            stats = proxy.stats()
        self.assertEqual(stats["requests"], n)
        self.assertEqual(stats["forwarded"], kinds.count("-") + kinds.count("delay"))
        return kinds

    def test_a_seed_repeats_its_faults_at_the_rate_asked(self):
        first = self.run_sequence(7)
        counts = {k: first.count(k) for k in KINDS}
        faults = sum(counts.values())
        self.assertTrue(40 <= faults <= 80, f"{faults} faults in 200 requests at rate 0.3: {counts}")
        for k in KINDS:
            self.assertTrue(5 <= counts[k] <= 30, f"{counts[k]} of kind {k} among {faults} faults: {counts}")
        self.assertEqual(self.run_sequence(7), first)
        self.assertNotEqual(self.run_sequence(8), first)

    def test_cli_writes_port_and_stats_and_stops_on_sigterm(self):
        with tempfile.TemporaryDirectory() as tmp:
            port_file, stats_file = os.path.join(tmp, "port"), os.path.join(tmp, "stats.json")
            proc = subprocess.Popen([sys.executable, os.path.join(SUPPORT, "fault_proxy.py"), "--upstream", NGINX.url,
                                     "--seed", "3", "--error-rate", "0", "--kinds", "503,reset", "--latency-ms", "1",
                                     "--port-file", port_file, "--stats-file", stats_file],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            try:
                text = wait_for_file(port_file)
                self.assertTrue(text.endswith("\n"))
                url = f"http://127.0.0.1:{int(text)}"
                self.assertEqual(get(url, "/big.bin", headers={"Range": "bytes=5-9"})[2], BIG[5:10])
                deadline = time.monotonic() + 5
                while True:
                    stats = json.loads(wait_for_file(stats_file))
                    if stats["requests"] == 1 or time.monotonic() > deadline:
                        break
                    time.sleep(0.01)
                self.assertEqual((stats["requests"], stats["forwarded"], stats["bytes"]), (1, 1, 5))
                start = time.monotonic()
                proc.send_signal(signal.SIGTERM)
                self.assertEqual(proc.wait(timeout=5), 0)
                self.assertLess(time.monotonic() - start, 2.0)
                self.assertEqual(proc.stdout.read(), b"")
                self.assertEqual(proc.stderr.read(), b"")
                self.assertEqual(json.loads(wait_for_file(stats_file))["requests"], 1)
            finally:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
                proc.stdout.close()
                proc.stderr.close()


if __name__ == "__main__":
    unittest.main()
