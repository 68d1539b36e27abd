#!/usr/bin/env python3
# audit-deps: python .venv-s3 (scripts/setup-s3 installs what this imports)
"""A real S3 endpoint for the tests: moto's server (moto[server], pinned in .venv-s3 by
scripts/setup-s3) in a child process on 127.0.0.1, a free port, path-style addressing, with its
IAM access control switched on, so every request must carry a valid SigV4 signature made with the
issued key's secret (wrong secret: 403 SignatureDoesNotMatch; unknown key: 403 InvalidAccessKeyId).
Run it with .venv-s3/bin/python; moto keeps everything in memory and is gone with the process.

In a test (Python):
    with S3Server(region="us-east-1") as s3:
        s3.put_folder("data/", "bucket", "train")     # data/a/b.bin -> s3://bucket/train/a/b.bin
        s3.put("bucket", "k", b"bytes")
        s3.endpoint, s3.credentials, s3.region        # "http://127.0.0.1:PORT", (key id, secret)

For a C++ test (CLI): start it, wait for --creds-file to appear (written last, atomically, once
the bucket is filled), read it, SIGTERM the process when done (it then removes both files):
    .venv-s3/bin/python tests/support/s3_server.py --creds-file F [--port-file F]
        [--region R] [--bucket B [--put-folder DIR [--prefix P]]]
    creds-file: {"endpoint": ..., "access_key_id": ..., "secret_access_key": ..., "region": ...}
Nothing goes to stdout; moto's own log goes to --log FILE (default: dropped).

How the checking is switched on: moto checks signatures and IAM policies once its
settings.INITIAL_NO_AUTH_ACTION_COUNT is reached (default: never). The server starts with it
unset, this creates an IAM user, an access key and a user policy allowing s3:* through the IAM
API, then POSTs "0" to /moto-api/reset-auth (what moto.core.set_initial_no_auth_action_count
does in server mode): from then on every request is checked. start() proves it with one request
signed with a wrong secret, which must be refused. moto recomputes the signature with botocore's
S3SigV4Auth over the method, the raw path and query, the signed headers (Host among them) and the
x-amz-content-sha256 header; it does not check the X-Amz-Date against the clock nor the scope's
region; with checking on, a presigned URL (query-string auth) and an unsigned request for a missing
key get 500 (moto expects an Authorization header there). A client must send (and sign)
x-amz-content-sha256, as S3 requires: libcurl 7.88's own CURLOPT_AWS_SIGV4 is refused without it.
moto's server (Werkzeug's) answers every request with `Connection: close`: no keep-alive here.
Speed (2 cores): start() ~0.5 s; ~300-400 sequential GETs/s of a 1 MiB object.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import urllib.request

_CHILD_FLAG = "--moto-child"
_SETUP_KEY = ("AKIDSETUPONLY0000000", "setup-only-secret")  # accepted only before auth is on
_USER = "crucible-test"
_POLICY = {"Version": "2012-10-17",
           "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}


def _child_main():
    """The moto process: serves on 127.0.0.1:<free port>, writes the port to stdout (its only
    output there), and exits on SIGTERM/SIGINT or when its stdin (a pipe from the parent)
    closes, so a parent that dies without stopping it leaves no server behind."""
    import logging
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    from moto.moto_server.threaded_moto_server import ThreadedMotoServer
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    port = server.get_host_and_port()[1]
    os.environ["MOTO_PORT"] = str(port)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())

    def watch_stdin():
        while sys.stdin.buffer.read(4096):
            pass
        done.set()
    threading.Thread(target=watch_stdin, daemon=True).start()
    sys.stdout.write(f"{port}\n")
    sys.stdout.flush()
    done.wait()
    os._exit(0)  # moto's state is in memory only; open keep-alive handlers need no goodbye


class S3Server:
    """One moto server process with IAM checking on, and boto3 clients signed with its one
    access key. Not thread-safe: use one object from one thread (the server itself is
    threaded and serves any number of concurrent clients)."""

    def __init__(self, region="us-east-1", log=None, start_timeout_s=60.0):
        self.region = region
        self._log = log  # path for moto's stderr; None drops it (kept for error messages)
        self._timeout = start_timeout_s
        self._proc = None
        self._errfile = None
        self._s3 = None
        self.endpoint = None
        self.credentials = None  # (access_key_id, secret_access_key)

    # -- lifetime --------------------------------------------------------------------------
    def start(self):
        if self._proc is not None:
            raise RuntimeError("S3Server: already started")
        if self._log:
            self._errfile = open(self._log, "ab")
        else:
            self._errfile = tempfile.TemporaryFile()
        env = dict(os.environ)
        env.pop("INITIAL_NO_AUTH_ACTION_COUNT", None)  # the setup below needs it unlimited
        env["PYTHONUNBUFFERED"] = "1"
        self._proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), _CHILD_FLAG],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=self._errfile, env=env, close_fds=True)
        try:
            port = self._read_port()
            self.endpoint = f"http://127.0.0.1:{port}"
            self._enable_auth()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self):
        """Stops the server (SIGTERM, then SIGKILL after 5 s). Safe to call twice."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            for f in (proc.stdin, proc.stdout):
                if f:
                    f.close()
        if self._errfile is not None:
            self._errfile.close()
            self._errfile = None
        self._s3 = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # -- data ------------------------------------------------------------------------------
    def client(self, access_key_id=None, secret_access_key=None, service="s3"):
        """A boto3 client for this server, path-style, SigV4, signed with the issued key unless
        other credentials are given (the tests use that to be refused)."""
        import boto3
        from botocore.config import Config
        key, secret = self.credentials or _SETUP_KEY
        return boto3.client(
            service, endpoint_url=self.endpoint, region_name=self.region,
            aws_access_key_id=access_key_id or key,
            aws_secret_access_key=secret_access_key or secret,
            config=Config(signature_version="s3v4", s3={"addressing_style": "path"},
                          retries={"max_attempts": 1}, connect_timeout=10, read_timeout=60))

    def create_bucket(self, bucket):
        """Creates the bucket unless this server already has it."""
        s3 = self._client()
        try:
            s3.head_bucket(Bucket=bucket)
            return
        except s3.exceptions.ClientError as e:
            if e.response["Error"]["Code"] not in ("404", "NoSuchBucket"):
                raise
        args = {"Bucket": bucket}
        if self.region != "us-east-1":
            args["CreateBucketConfiguration"] = {"LocationConstraint": self.region}
        s3.create_bucket(**args)

    def put(self, bucket, key, data):
        """Stores `data` (bytes) at s3://bucket/key; the bucket must exist (create_bucket)."""
        self._client().put_object(Bucket=bucket, Key=key, Body=bytes(data))

    def put_folder(self, local_dir, bucket, prefix=""):
        """Creates the bucket if needed and uploads every file under local_dir to
        prefix/<path relative to local_dir> ('/'-separated; no leading '/' when prefix is
        empty). Returns the keys written, sorted."""
        if not os.path.isdir(local_dir):
            raise FileNotFoundError(f"S3Server.put_folder: no folder {local_dir}")
        self.create_bucket(bucket)
        prefix = prefix.strip("/")
        keys = []
        for dirpath, dirnames, filenames in os.walk(local_dir):
            dirnames.sort()
            for name in sorted(filenames):
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, local_dir).replace(os.sep, "/")
                key = f"{prefix}/{rel}" if prefix else rel
                with open(path, "rb") as f:
                    self.put(bucket, key, f.read())
                keys.append(key)
        return sorted(keys)

    # -- internals -------------------------------------------------------------------------
    def _client(self):
        if self._s3 is None:
            self._s3 = self.client()
        return self._s3

    def _stderr_tail(self):
        if self._log or self._errfile is None:
            return f"(moto's log: {self._log})" if self._log else ""
        self._errfile.seek(0)
        return self._errfile.read().decode(errors="replace")[-3000:]

    def _read_port(self):
        result = {}

        def read():
            result["line"] = self._proc.stdout.readline()
        t = threading.Thread(target=read, daemon=True)
        t.start()
        t.join(self._timeout)
        line = result.get("line", b"").strip()
        if not line.isdigit():
            code = self._proc.poll()
            why = "did not start in %.0f s" % self._timeout if code is None else f"exited with {code}"
            raise RuntimeError(f"S3Server: moto's server {why} (python {sys.executable}: "
                               f"made by scripts/setup-s3?)\n{self._stderr_tail()}")
        return int(line)

    def _enable_auth(self):
        iam = self.client(*_SETUP_KEY, service="iam")
        iam.create_user(UserName=_USER)
        key = iam.create_access_key(UserName=_USER)["AccessKey"]
        iam.put_user_policy(UserName=_USER, PolicyName="s3-all", PolicyDocument=json.dumps(_POLICY))
        # text/plain: with urllib's default form content type, Flask hands moto an empty body.
        req = urllib.request.Request(self.endpoint + "/moto-api/reset-auth", data=b"0", method="POST",
                                     headers={"Content-Type": "text/plain"})
        with urllib.request.urlopen(req, timeout=10) as r:
            if r.status != 200:
                raise RuntimeError(f"S3Server: /moto-api/reset-auth answered {r.status}")
        self.credentials = (key["AccessKeyId"], key["SecretAccessKey"])
        # Proof that checking is on: the right key with a wrong secret must be refused.
        bad = self.client(self.credentials[0], self.credentials[1] + "x")
        try:
            bad.list_buckets()
        except bad.exceptions.ClientError as e:
            if e.response["Error"]["Code"] == "SignatureDoesNotMatch":
                return
            raise RuntimeError(f"S3Server: a wrong secret got {e.response['Error']} "
                               "instead of SignatureDoesNotMatch") from e
        raise RuntimeError("S3Server: moto accepted a wrong secret: signature checking is off")


def _write_atomic(path, text):
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-" + os.path.basename(path))
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def main(argv=None):
    ap = argparse.ArgumentParser(description="moto's S3 server with SigV4 checking, for tests",
                                 epilog="Runs until SIGTERM or SIGINT; then removes the two files.")
    ap.add_argument("--creds-file", help="JSON endpoint/access_key_id/secret_access_key/region, "
                    "written atomically once ready (written last: wait for this one)")
    ap.add_argument("--port-file", help="the port, one line, written atomically once ready")
    ap.add_argument("--region", default="us-east-1")
    ap.add_argument("--bucket", help="created at start (and filled with --put-folder)")
    ap.add_argument("--put-folder", metavar="DIR", help="uploads every file under DIR")
    ap.add_argument("--prefix", default="", help="key prefix for --put-folder")
    ap.add_argument("--log", help="moto's stderr goes here (default: dropped)")
    args = ap.parse_args(argv)
    if args.put_folder and not args.bucket:
        ap.error("--put-folder needs --bucket")

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    written = []
    server = S3Server(region=args.region, log=args.log)
    try:
        server.start()
        if args.bucket:
            server.create_bucket(args.bucket)
            if args.put_folder:
                server.put_folder(args.put_folder, args.bucket, args.prefix)
        if args.port_file:
            _write_atomic(args.port_file, server.endpoint.rsplit(":", 1)[1] + "\n")
            written.append(args.port_file)
        if args.creds_file:
            creds = {"endpoint": server.endpoint, "access_key_id": server.credentials[0],
                     "secret_access_key": server.credentials[1], "region": server.region}
            _write_atomic(args.creds_file, json.dumps(creds) + "\n")
            written.append(args.creds_file)
        while not stop.wait(1.0):
            if server._proc is None or server._proc.poll() is not None:
                print("s3_server: moto's server died\n" + server._stderr_tail(), file=sys.stderr)
                return 1
        return 0
    finally:
        server.stop()
        for path in written:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


if __name__ == "__main__":
    if sys.argv[1:] == [_CHILD_FLAG]:
        _child_main()
    sys.exit(main())
