#!/usr/bin/env python3
# audit-deps: python .venv-s3 (scripts/setup-s3 installs what this imports)
"""Self-test of tests/support/s3_server.py, the S3 endpoint the S3 data-source tests read from:
moto's server must really check SigV4 (the right key and secret read byte-exact objects and
ranges; a wrong secret, an unknown key, a signature made for another path, Host or Range header,
and an unsigned request are refused with S3's codes), and the CLI mode must start, publish its
credentials and stop cleanly. Needs .venv-s3 (scripts/setup-s3):

    .venv-s3/bin/python tests/scripts/s3_server_test.py [-v] [S3ServerTest.test_name]

A case is one test_ method; raw (non-boto3) requests go through raw_get(), signed by botocore's
S3SigV4Auth exactly as our C++ signer should sign them, so a case can change one thing after
signing and expect the refusal.
"""
import hashlib
import http.client
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
SERVER_PY = os.path.join(HERE, "..", "support", "s3_server.py")
sys.path.insert(0, os.path.join(HERE, "..", "support"))
from s3_server import S3Server  # noqa: E402

from botocore.auth import S3SigV4Auth  # noqa: E402
from botocore.awsrequest import AWSRequest  # noqa: E402
from botocore.credentials import Credentials  # noqa: E402
from botocore.exceptions import ClientError  # noqa: E402

BUCKET = "crucible-data"
BIG_KEY = "shards/train-000.bin"
ODD_KEY = "odd names/a b+c=d&e,f;g@h~é.bin"  # what URI-encoding in the canonical path must handle


def sign(creds, region, method, url, headers=None):
    """The headers of a SigV4-signed S3 request (Authorization, X-Amz-Date,
    X-Amz-Content-SHA256 and the given ones). `url` holds the already URI-encoded path."""
    req = AWSRequest(method=method, url=url, headers=dict(headers or {}))
    S3SigV4Auth(Credentials(*creds), "s3", region).add_auth(req)
    return dict(req.headers.items())


def raw_get(endpoint, path, headers):
    """Sends GET `path` (sent byte for byte) with exactly these headers (http.client adds Host
    unless it is among them); returns (status, body bytes)."""
    u = urllib.parse.urlsplit(endpoint)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    try:
        conn.putrequest("GET", path, skip_host="Host" in headers, skip_accept_encoding=True)
        for k, v in headers.items():
            conn.putheader(k, v)
        conn.endheaders()
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def quote_key(key):
    return urllib.parse.quote(key, safe="/~")  # SigV4 for S3: every byte but unreserved and '/'


class S3ServerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        rng = random.Random(1234)
        cls.big = rng.randbytes(1 << 20)
        cls.tree = tempfile.mkdtemp(prefix="s3-server-test-")
        cls.files = {"a.bin": rng.randbytes(1000), "sub/b.bin": b"", "sub/deeper/c.txt": b"hello\n"}
        for rel, data in cls.files.items():
            os.makedirs(os.path.dirname(os.path.join(cls.tree, rel)), exist_ok=True)
            with open(os.path.join(cls.tree, rel), "wb") as f:
                f.write(data)
        t0 = time.monotonic()
        cls.s3 = S3Server(region="us-east-1").start()
        cls.start_s = time.monotonic() - t0
        cls.keys = cls.s3.put_folder(cls.tree, BUCKET, "folder/")
        cls.s3.put(BUCKET, BIG_KEY, cls.big)
        cls.s3.put(BUCKET, ODD_KEY, b"odd")
        cls.c = cls.s3.client()

    @classmethod
    def tearDownClass(cls):
        cls.s3.stop()
        shutil.rmtree(cls.tree, ignore_errors=True)

    def error_of(self, call):
        with self.assertRaises(ClientError) as cm:
            call()
        e = cm.exception.response
        return e["ResponseMetadata"]["HTTPStatusCode"], e["Error"]["Code"]

    def signed(self, path, creds=None, headers=None):
        return sign(creds or self.s3.credentials, self.s3.region, "GET", self.s3.endpoint + path, headers)

    # -- what the server hands out ---------------------------------------------------------
    def test_endpoint_and_credentials(self):
        self.assertRegex(self.s3.endpoint, r"^http://127\.0\.0\.1:\d+$")
        key, secret = self.s3.credentials
        self.assertRegex(key, r"^AKIA[A-Z0-9]{16}$")
        self.assertGreaterEqual(len(secret), 30)
        self.assertLess(self.start_s, 15.0, "moto's server took too long to start")

    def test_put_folder_keys_and_bytes(self):
        self.assertEqual(self.keys, ["folder/a.bin", "folder/sub/b.bin", "folder/sub/deeper/c.txt"])
        listed = self.c.list_objects_v2(Bucket=BUCKET, Prefix="folder/")
        self.assertEqual(sorted((o["Key"], o["Size"]) for o in listed["Contents"]),
                         sorted((f"folder/{k}", len(v)) for k, v in self.files.items()))
        for rel, data in self.files.items():
            self.assertEqual(self.c.get_object(Bucket=BUCKET, Key=f"folder/{rel}")["Body"].read(), data)

    def test_put_folder_into_existing_bucket_without_prefix(self):
        self.assertEqual(self.s3.put_folder(os.path.join(self.tree, "sub"), BUCKET),
                         ["b.bin", "deeper/c.txt"])
        self.assertEqual(self.c.get_object(Bucket=BUCKET, Key="deeper/c.txt")["Body"].read(), b"hello\n")

    # -- the right key and secret ----------------------------------------------------------
    def test_get_is_byte_exact(self):
        r = self.c.get_object(Bucket=BUCKET, Key=BIG_KEY)
        self.assertEqual(r["ResponseMetadata"]["HTTPStatusCode"], 200)
        body = r["Body"].read()
        self.assertEqual(len(body), 1 << 20)
        self.assertEqual(hashlib.sha256(body).hexdigest(), hashlib.sha256(self.big).hexdigest())
        self.assertEqual(r["ETag"].strip('"'), hashlib.md5(self.big).hexdigest())

    def test_range_read_is_206_and_exact(self):
        r = self.c.get_object(Bucket=BUCKET, Key=BIG_KEY, Range="bytes=1000-1999")
        self.assertEqual(r["ResponseMetadata"]["HTTPStatusCode"], 206)
        self.assertEqual(r["ContentRange"], f"bytes 1000-1999/{1 << 20}")
        self.assertEqual(r["Body"].read(), self.big[1000:2000])
        tail = self.c.get_object(Bucket=BUCKET, Key=BIG_KEY, Range="bytes=-10")
        self.assertEqual(tail["ResponseMetadata"]["HTTPStatusCode"], 206)
        self.assertEqual(tail["Body"].read(), self.big[-10:])

    def test_head_gives_size(self):
        self.assertEqual(self.c.head_object(Bucket=BUCKET, Key=BIG_KEY)["ContentLength"], 1 << 20)

    def test_raw_signed_get_and_range(self):
        # The control for the refusals below: the same raw request, unchanged, is accepted.
        path = f"/{BUCKET}/{BIG_KEY}"
        self.assertEqual(raw_get(self.s3.endpoint, path, self.signed(path)), (200, self.big))
        h = self.signed(path, headers={"Range": "bytes=0-99"})
        self.assertEqual(raw_get(self.s3.endpoint, path, h), (206, self.big[:100]))

    def test_raw_signed_get_of_key_needing_uri_encoding(self):
        path = f"/{BUCKET}/{quote_key(ODD_KEY)}"
        self.assertIn("%20", path)
        self.assertEqual(raw_get(self.s3.endpoint, path, self.signed(path)), (200, b"odd"))
        self.assertEqual(self.c.get_object(Bucket=BUCKET, Key=ODD_KEY)["Body"].read(), b"odd")

    # -- refusals --------------------------------------------------------------------------
    def test_wrong_secret_is_403_signature_does_not_match(self):
        bad = self.s3.client(self.s3.credentials[0], self.s3.credentials[1][:-1] + "?")
        self.assertEqual(self.error_of(lambda: bad.get_object(Bucket=BUCKET, Key=BIG_KEY)),
                         (403, "SignatureDoesNotMatch"))

    def test_unknown_key_is_403_invalid_access_key_id(self):
        bad = self.s3.client("AKIAIOSFODNN7EXAMPLE", self.s3.credentials[1])
        self.assertEqual(self.error_of(lambda: bad.get_object(Bucket=BUCKET, Key=BIG_KEY)),
                         (403, "InvalidAccessKeyId"))

    def test_missing_object_is_404_no_such_key(self):
        self.assertEqual(self.error_of(lambda: self.c.get_object(Bucket=BUCKET, Key="shards/nope.bin")),
                         (404, "NoSuchKey"))
        head = self.error_of(lambda: self.c.head_object(Bucket=BUCKET, Key="shards/nope.bin"))
        self.assertEqual(head[0], 404)

    def test_missing_bucket_is_404_no_such_bucket(self):
        self.assertEqual(self.error_of(lambda: self.c.get_object(Bucket="no-such-bucket", Key=BIG_KEY)),
                         (404, "NoSuchBucket"))

    def test_signature_for_another_path_is_403(self):
        h = self.signed(f"/{BUCKET}/folder/a.bin")
        status, body = raw_get(self.s3.endpoint, f"/{BUCKET}/{BIG_KEY}", h)
        self.assertEqual(status, 403)
        self.assertIn(b"<Code>SignatureDoesNotMatch</Code>", body)

    def test_signature_over_unencoded_path_is_403(self):
        # Signing the decoded key (spaces as they are) while sending the encoded one must fail:
        # the canonical URI is the path as sent.
        sent = f"/{BUCKET}/{quote_key(ODD_KEY)}"
        h = self.signed(f"/{BUCKET}/{quote_key(ODD_KEY).replace('%2B', '+')}")
        self.assertEqual(raw_get(self.s3.endpoint, sent, h)[0], 403)

    def test_signature_for_another_host_is_403(self):
        path = f"/{BUCKET}/{BIG_KEY}"
        h = self.signed(path, headers={"Host": "127.0.0.1:1"})  # signed for another port
        h.pop("Host")  # http.client sends the real 127.0.0.1:PORT
        status, body = raw_get(self.s3.endpoint, path, h)
        self.assertEqual(status, 403)
        self.assertIn(b"<Code>SignatureDoesNotMatch</Code>", body)

    def test_changed_signed_range_header_is_403(self):
        path = f"/{BUCKET}/{BIG_KEY}"
        h = self.signed(path, headers={"Range": "bytes=0-9"})
        h["Range"] = "bytes=0-99"
        self.assertEqual(raw_get(self.s3.endpoint, path, h)[0], 403)

    def test_changed_query_is_403(self):
        h = self.signed(f"/{BUCKET}?list-type=2&prefix=folder%2F")
        self.assertEqual(raw_get(self.s3.endpoint, f"/{BUCKET}?list-type=2&prefix=folder%2F", h)[0], 200)
        self.assertEqual(raw_get(self.s3.endpoint, f"/{BUCKET}?list-type=2&prefix=shards%2F", h)[0], 403)

    @unittest.skipUnless(shutil.which("curl"), "no curl")
    def test_curl_aws_sigv4_is_accepted(self):
        # An independent signer: libcurl's own (CURLOPT_AWS_SIGV4, curl --aws-sigv4). S3 wants
        # x-amz-content-sha256; curl 7.88 signs it when given, and is refused without it.
        def curl(secret, *extra):
            r = subprocess.run(
                ["curl", "-s", "-o", "-", "-w", "\n%{http_code}",
                 "--aws-sigv4", f"aws:amz:{self.s3.region}:s3",
                 "--user", f"{self.s3.credentials[0]}:{secret}",
                 "-H", "x-amz-content-sha256: " + hashlib.sha256(b"").hexdigest(), *extra,
                 f"{self.s3.endpoint}/{BUCKET}/folder/sub/deeper/c.txt"],
                capture_output=True, timeout=30)
            body, _, code = r.stdout.rpartition(b"\n")
            return int(code), body
        self.assertEqual(curl(self.s3.credentials[1]), (200, b"hello\n"))
        self.assertEqual(curl(self.s3.credentials[1], "-r", "1-3"), (206, b"ell"))
        self.assertEqual(curl("wrong")[0], 403)

    def test_unsigned_get_is_403(self):
        # (moto refuses this through the object's private ACL even with checking off.)
        self.assertEqual(raw_get(self.s3.endpoint, f"/{BUCKET}/{BIG_KEY}", {})[0], 403)

    def test_other_account_cannot_create_buckets_either(self):
        bad = self.s3.client("AKIAIOSFODNN7EXAMPLE", "x" * 40)
        self.assertEqual(self.error_of(lambda: bad.create_bucket(Bucket="intruder"))[0], 403)
        self.assertEqual(self.error_of(lambda: self.c.head_bucket(Bucket="intruder"))[0], 404)


class S3ServerCliTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="s3-server-cli-")
        os.makedirs(os.path.join(self.dir, "in", "x"))
        with open(os.path.join(self.dir, "in", "x", "y.bin"), "wb") as f:
            f.write(b"\x00\x01cli")
        self.creds_file = os.path.join(self.dir, "creds.json")
        self.port_file = os.path.join(self.dir, "port")
        self.proc = None

    def tearDown(self):
        if self.proc:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.proc.stdout.close()
            self.proc.stderr.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def start_cli(self):
        self.proc = subprocess.Popen(
            [sys.executable, SERVER_PY, "--port-file", self.port_file, "--creds-file", self.creds_file,
             "--put-folder", os.path.join(self.dir, "in"), "--bucket", "cli-bucket", "--prefix", "p/q",
             "--region", "eu-west-1"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 30
        while not os.path.exists(self.creds_file):
            self.assertIsNone(self.proc.poll(), self.proc.stderr.read().decode()
                              if self.proc.poll() is not None else "")
            self.assertLess(time.monotonic(), deadline, "no creds file after 30 s")
            time.sleep(0.02)
        with open(self.creds_file) as f:
            return json.load(f)

    def port_answers(self, port):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False

    def check_serving(self, creds):
        self.assertEqual(sorted(creds), ["access_key_id", "endpoint", "region", "secret_access_key"])
        self.assertEqual(creds["region"], "eu-west-1")
        with open(self.port_file) as f:
            port = int(f.read())
        self.assertEqual(creds["endpoint"], f"http://127.0.0.1:{port}")
        path = "/cli-bucket/p/q/x/y.bin"
        h = sign((creds["access_key_id"], creds["secret_access_key"]), "eu-west-1", "GET",
                 creds["endpoint"] + path)
        self.assertEqual(raw_get(creds["endpoint"], path, h), (200, b"\x00\x01cli"))
        h = sign((creds["access_key_id"], "wrong"), "eu-west-1", "GET", creds["endpoint"] + path)
        self.assertEqual(raw_get(creds["endpoint"], path, h)[0], 403)
        return port

    def stop_with(self, sig, port):
        self.proc.send_signal(sig)
        out, err = self.proc.communicate(timeout=10)
        self.assertEqual(self.proc.returncode, 0, err.decode())
        self.assertEqual(out, b"", "the server must print nothing to stdout")
        self.assertFalse(os.path.exists(self.creds_file))
        self.assertFalse(os.path.exists(self.port_file))
        self.assertFalse(self.port_answers(port), "moto's server outlived the CLI")

    def test_cli_serves_then_stops_on_sigterm(self):
        port = self.check_serving(self.start_cli())
        self.stop_with(signal.SIGTERM, port)

    def test_cli_stops_on_sigint(self):
        port = self.check_serving(self.start_cli())
        self.stop_with(signal.SIGINT, port)

    def test_server_dies_with_a_killed_cli(self):
        port = self.check_serving(self.start_cli())
        self.proc.kill()
        self.proc.wait()
        deadline = time.monotonic() + 10
        while self.port_answers(port):
            self.assertLess(time.monotonic(), deadline, "moto's server outlived a SIGKILLed CLI")
            time.sleep(0.05)

    def test_cli_put_folder_needs_bucket(self):
        r = subprocess.run([sys.executable, SERVER_PY, "--put-folder", self.dir],
                           capture_output=True, timeout=30)
        self.assertEqual(r.returncode, 2)
        self.assertIn(b"--put-folder needs --bucket", r.stderr)


if __name__ == "__main__":
    unittest.main()
