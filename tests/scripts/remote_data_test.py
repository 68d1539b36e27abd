#!/usr/bin/python3
"""Remote shards end to end (issues 37, 46, 47): `crucible train` reads WebDataset tar shards and packed
shards (a packed detection set's targets too) from nginx (HTTP and HTTPS with a certificate the test makes, range requests) and from an
S3 endpoint (moto's server, signatures checked), directly, through redirects and through a fault
proxy, and must end with the params_sha256 of the same run on the same shards read from local
disk. Then: the node's cache never exceeds data.cache_bytes; refusals (404, 403, a wrong secret,
an unknown key, no credentials, an untrusted certificate, a redirect loop, S3's 301 for another
region) exit 2 naming the URL; retries that run out exit 1 naming the object, the status and the
tries; a download that fails its checksum (S3's MD5, the SHA-256 of a tar shard's .idx) is never
kept; a shard without an .idx is checked by size and the log says it was not hashed.

    tests/scripts/remote_data_test.py --crucible build/crucible --workdir /tmp/remote

Servers: tests/support/nginx_server.py (certificates from tests/support/tls_certs.py),
tests/support/fault_proxy.py and S3Redirects below (in-process) and tests/support/s3_server.py
(moto, in .venv-s3, made by scripts/setup-s3), all on 127.0.0.1.
"""
import argparse
import hashlib
import http.server
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import time
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "support"))
from fault_proxy import FaultProxy  # noqa: E402
from nginx_server import NginxServer  # noqa: E402
from tls_certs import make_certificates  # noqa: E402

CRUCIBLE = None
WORK = None
S3_PYTHON = os.environ.get("CRUCIBLE_S3_PYTHON", os.path.join(ROOT, ".venv-s3", "bin", "python"))
SHARDS = 6
PER_SHARD = 40
# What crucible trusts HTTPS servers through besides data.ca_bundle: never inherited by a run.
CA_VARIABLES = ("AWS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE")


def make_shards(folder):
    """Six training shards of 40 PNGs (two classes, 20×20) and one test shard, seeded."""
    import numpy as np
    from PIL import Image
    rng = np.random.default_rng(37)
    os.makedirs(folder, exist_ok=True)
    names = [(f"train-{k}", PER_SHARD) for k in range(SHARDS)] + [("test-0", 32)]
    for name, n in names:
        with tarfile.open(os.path.join(folder, name + ".tar"), "w") as t:
            for i in range(n):
                c = int(rng.integers(0, 2))
                a = np.full((20, 20, 3), 40 + 160 * c, np.uint8) + rng.integers(0, 40, (20, 20, 3), dtype=np.uint8)
                b = io.BytesIO()
                Image.fromarray(a).save(b, format="PNG")
                for ext, data in (("png", b.getvalue()), ("cls", b"%d" % c)):
                    ti = tarfile.TarInfo(f"{name}-{i:03d}.{ext}")
                    ti.size = len(data)
                    t.addfile(ti, io.BytesIO(data))


def job(train, test, name, *extra):
    return [CRUCIBLE, "train", "--set", f"run.dir={WORK}/runs", "--set", f"run.name={name}",
            "--set", "log.progress=lines", "--set", "data.dataset=images",
            "--set", f"data.train_path={train}", "--set", f"data.test_path={test}",
            "--set", "data.crop=16", "--set", "data.eval_crop=16", "--set", "data.eval_resize=20",
            "--set", "data.mean=[0.5, 0.5, 0.5]", "--set", "data.std=[0.25, 0.25, 0.25]",
            "--set", "data.sampler=global", "--set", "data.shuffle_window=2", "--set", "data.io_threads=2",
            "--set", "train.epochs=2", "--set", "train.batch_size=16", "--set", "train.eval_batch_size=16",
            "--set", "schedule.warmup=0.5", "--set", f"data.cache_dir={WORK}/cache-{name}", *extra]


def run(cmd, env=None):
    e = {k: v for k, v in os.environ.items() if k not in CA_VARIABLES}
    e.update(env or {})
    return subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=600)


def doctor(cmd, env=None):
    """`crucible doctor --json` with a train command's settings: (result, report)."""
    r = run([c if c != "train" else "doctor" for c in cmd] + ["--json"], env=env)
    return r, json.loads(r.stdout.strip().splitlines()[-1]) if r.stdout.strip() else None


def summary(name):
    with open(f"{WORK}/runs/{name}/summary.json") as f:
        return json.load(f)


class S3:
    """moto's server (tests/support/s3_server.py) in .venv-s3, holding `folder` under s3://data/<prefix>/."""

    def __init__(self, folder, prefix):
        self.dir = os.path.join(WORK, "s3-" + prefix)
        os.makedirs(self.dir, exist_ok=True)
        port_file, creds_file = os.path.join(self.dir, "port"), os.path.join(self.dir, "creds.json")
        self.proc = subprocess.Popen([S3_PYTHON, os.path.join(ROOT, "tests", "support", "s3_server.py"),
                                      "--port-file", port_file, "--creds-file", creds_file,
                                      "--put-folder", folder, "--bucket", "data", "--prefix", prefix],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 60
        while not os.path.exists(creds_file):
            if self.proc.poll() is not None:
                raise RuntimeError("s3_server.py exited: " + self.proc.stderr.read())
            if time.time() > deadline:
                raise RuntimeError("s3_server.py did not start in 60 s")
            time.sleep(0.05)
        with open(creds_file) as f:
            c = json.load(f)
        self.endpoint = c["endpoint"]
        self.env = {"AWS_ACCESS_KEY_ID": c["access_key_id"], "AWS_SECRET_ACCESS_KEY": c["secret_access_key"],
                    "AWS_REGION": c.get("region", "us-east-1"),
                    "AWS_SHARED_CREDENTIALS_FILE": os.path.join(self.dir, "no-such-file")}

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class S3Redirects:
    """S3's redirects, on 127.0.0.1 in front of moto (data.s3_endpoint points here):
    /data/moved/<key> answers 307 TemporaryRedirect to moto's /data/tar/<key> (another host and
    path, as S3 sends a new bucket's requests to its regional endpoint), /data/loop/<key> 307 to
    itself, /data/region/<key> 301 PermanentRedirect naming the bucket's region, as S3 answers a
    request signed for another region. `counts` holds the answers given by status."""

    def __init__(self, moto):
        counts = self.counts = {307: 0, 301: 0}
        lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                path, region = self.path, None
                if path.startswith("/data/moved/"):
                    status, code, location = 307, "TemporaryRedirect", moto + "/data/tar/" + path[len("/data/moved/"):]
                elif path.startswith("/data/loop/"):
                    status, code, location = 307, "TemporaryRedirect", outer.url + path
                elif path.startswith("/data/region/"):
                    status, code, location, region = 301, "PermanentRedirect", None, "eu-west-1"
                else:
                    status, code, location = 404, "NoSuchKey", None
                body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                        f'<Message>{code} for {path}</Message></Error>\n').encode()
                with lock:
                    counts[status] = counts.get(status, 0) + 1
                self.send_response(status)
                if location:
                    self.send_header("Location", location)
                if region:
                    self.send_header("x-amz-bucket-region", region)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


class RemoteDataTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        shutil.rmtree(WORK, ignore_errors=True)
        os.makedirs(WORK)
        cls.local = os.path.join(WORK, "shards")
        make_shards(cls.local)
        # The S3 copy has no .idx beside its shards: opening it downloads them to index them.
        cls.s3 = S3(cls.local, "tar")
        cls.addClassCleanup(cls.s3.stop)
        # The local run writes each shard's .idx; nginx serves them with the shards.
        r = run(job(cls.local + "/train-{0..5}.tar", cls.local + "/test-0.tar", "local"))
        assert r.returncode == 0, r.stdout + r.stderr
        cls.local_sha = summary("local")["params_sha256"]
        cls.nginx = NginxServer(cls.local)
        cls.http = cls.nginx.start()
        cls.addClassCleanup(cls.nginx.stop)
        # The same folder over HTTPS, with a certificate signed by the test's own authority.
        cls.certs = make_certificates(os.path.join(WORK, "tls"))
        cls.tls_nginx = NginxServer(cls.local, tls=(cls.certs["cert"], cls.certs["key"]))
        cls.https = cls.tls_nginx.start()
        cls.addClassCleanup(cls.tls_nginx.stop)

    @property
    def budget(self):  # five training shards' bytes: the window (2), the I/O threads' (2), one more
        return 5 * os.path.getsize(os.path.join(self.local, "train-0.tar"))

    def remote_job(self, base, name, *extra):
        return job(base + "/train-{0..5}.tar", base + "/test-0.tar", name, *extra)

    def s3_job(self, name, *extra, endpoint=None):
        return self.remote_job("s3://data/tar", name, "--set", f"data.s3_endpoint={endpoint or self.s3.endpoint}",
                               *extra)

    def test_http_and_s3_runs_equal_the_local_run(self):
        r = run(self.remote_job(self.http, "http"))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(summary("http")["params_sha256"], self.local_sha)
        remote = summary("http")["io"]["train"]["remote"]
        self.assertEqual(remote["downloads"], SHARDS)  # each shard once: the second epoch reads the cache
        self.assertEqual(remote["retries"], 0)
        self.assertIn("offset indexes: 6 from .idx", r.stdout + r.stderr)
        self.assertIn("checked by size and SHA-256 from .idx: 6", r.stdout + r.stderr)  # the .idx records it
        self.assertNotIn("not hashed", r.stdout + r.stderr)
        # Range requests on reused connections: more requests than connections.
        entries = self.nginx.access_entries()
        self.assertTrue(any(e["range"] not in ("-", "") for e in entries), entries[:3])
        self.assertGreater(max(int(e["connection_requests"]) for e in entries), 1)

        html = open(f"{WORK}/runs/http/report.html").read()  # the D11 report covers remote reads
        self.assertIn(f"train split, remote: ", html)
        self.assertIn(f"{SHARDS} downloads", html)

        s = run(self.s3_job("s3"), env=self.s3.env)
        self.assertEqual(s.returncode, 0, s.stdout + s.stderr)
        self.assertEqual(summary("s3")["params_sha256"], self.local_sha)
        self.assertIn("6 by downloading the shard", s.stdout + s.stderr)
        self.assertIn("by size and MD5 from the ETag: 6", s.stdout + s.stderr)  # moto's ETag is the MD5
        self.assertEqual(summary("s3")["io"]["train"]["remote"]["downloads"], SHARDS)

    def test_packed_shards_over_http_equal_the_local_packed_set(self):
        packed = os.path.join(self.local, "packed")
        if not os.path.exists(os.path.join(packed, "index.crpk")):
            # Shards of 256 KiB: the 240 samples (4 KiB apart) land in 4, so the global order's
            # windows, the I/O threads and each shard's SHA-256 work over several.
            p = run([CRUCIBLE, "pack", self.local + "/train-{0..5}.tar", packed, "--shard-mb", "0.25"])
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        local = run(job(packed, self.local + "/test-0.tar", "packed-local"))
        self.assertEqual(local.returncode, 0, local.stdout + local.stderr)
        remote = run(job(self.http + "/packed/index.crpk", self.http + "/test-0.tar", "packed-http"))
        self.assertEqual(remote.returncode, 0, remote.stdout + remote.stderr)
        self.assertEqual(summary("packed-http")["params_sha256"], summary("packed-local")["params_sha256"])
        self.assertIn("SHA-256 of each shard from the index", remote.stdout + remote.stderr)
        shards = len([n for n in os.listdir(packed) if n.startswith("shard-")])
        self.assertGreaterEqual(shards, 3)
        self.assertEqual(summary("packed-http")["io"]["train"]["remote"]["downloads"], shards)

    def test_a_packed_detection_set_over_http_loads_as_its_coco_file(self):
        # Issue 47: a COCO set packed with each image's boxes as a JSON target, read over HTTP
        # with its targets, gives the batches of the COCO file read from disk: images, sizes,
        # ids, boxes, labels and crowd flags (bench loader's digest covers them all).
        det = os.path.join(self.local, "det")
        if not os.path.exists(os.path.join(det, "packed", "index.crpk")):
            subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "make-detection-set"), det,
                            "--train", "24", "--val", "4", "--seed", "4"], check=True, capture_output=True)
            p = run([CRUCIBLE, "pack", os.path.join(det, "annotations", "instances_train.json"),
                     os.path.join(det, "packed"), "--shard-mb", "0.1"])
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)

        def digest(data, *extra):
            r = run([CRUCIBLE, "bench", "loader", "--data", data, "--digest", "--json", "--epochs", "2",
                     "--batch-size", "4", "--warmup", "0", "--set", "data.detection_preset=lsj",
                     "--set", "data.lsj_size=96", "--set", f"data.cache_dir={WORK}/cache-det", *extra])
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            return json.loads(r.stdout.strip().splitlines()[-1]), r.stdout + r.stderr
        local, _ = digest(os.path.join(det, "annotations", "instances_train.json"))
        remote, log = digest(self.http + "/det/packed/index.crpk")
        self.assertEqual(remote["digest"], local["digest"])
        self.assertEqual(remote["images"], 48)
        self.assertIn("SHA-256 of each shard from the index", log)
        # data.bad_boxes reaches a remote set's targets: the pack kept the boxes the COCO file's
        # "clamp" gave (all inside), so "refuse" reads them without complaint and changes nothing.
        refused, _ = digest(self.http + "/det/packed/index.crpk", "--set", "data.bad_boxes=refuse")
        self.assertEqual(refused["digest"], local["digest"])
        # Remote tar shards with targets are refused, naming what to do.
        with open(os.path.join(det, "train", sorted(os.listdir(os.path.join(det, "train")))[0]), "rb") as f:
            jpeg = f.read()
        with tarfile.open(os.path.join(det, "det-0.tar"), "w") as t:
            for ext, data in (("jpg", jpeg), ("json", b'{"boxes": [], "labels": []}')):
                ti = tarfile.TarInfo("a." + ext)
                ti.size = len(data)
                t.addfile(ti, io.BytesIO(data))
        r = run([CRUCIBLE, "bench", "loader", "--data", self.http + "/det/det-0.tar", "--set",
                 f"data.cache_dir={WORK}/cache-det"])
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("det-0.tar: sample a carries a detection target", r.stdout + r.stderr)
        self.assertIn("crucible pack", r.stdout + r.stderr)

    def test_two_ranks_on_one_node_download_each_shard_once(self):
        cache = f"{WORK}/cache-two-ranks"
        before = len(self.nginx.access_entries())
        r = run([CRUCIBLE, "launch", "--nproc", "2", "--"] + self.remote_job(self.http, "two-ranks", "--set",
                                                                             f"data.cache_dir={cache}"))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        entries = self.nginx.access_entries()[before:]
        # Whole-shard downloads (range requests other than the first byte, which opening asks for).
        downloads = {}
        for e in entries:
            path = e["request"].split()[1]
            if path.endswith(".tar") and e["range"] not in ("-", "", "bytes=0-0"):
                downloads[path] = downloads.get(path, 0) + 1
        self.assertEqual(sorted(downloads), sorted([f"/train-{k}.tar" for k in range(SHARDS)] + ["/test-0.tar"]))
        self.assertEqual(set(downloads.values()), {1}, downloads)
        local = run([CRUCIBLE, "launch", "--nproc", "2", "--"] + job(self.local + "/train-{0..5}.tar",
                                                                     self.local + "/test-0.tar", "two-ranks-local"))
        self.assertEqual(local.returncode, 0, local.stdout + local.stderr)
        self.assertEqual(summary("two-ranks")["params_sha256"], summary("two-ranks-local")["params_sha256"])

    def test_five_percent_faults_of_every_kind_change_nothing(self):
        for name, upstream, env, via in (("http-faults", self.http, None, None),
                                         ("s3-faults", self.s3.endpoint, self.s3.env, "s3")):
            # Shards in range requests of 8 KiB through a cache of 5 shards: some 200 requests a
            # run, 5% of them faults; the seed's first draws hold every kind.
            with FaultProxy(upstream, seed=11, error_rate=0.05, delay_s=2.5) as proxy:
                extra = ["--set", "data.remote_timeout=1", "--set", "data.remote_tries=10",
                         "--set", "data.remote_part_bytes=8192", "--set", f"data.cache_bytes={self.budget}"]
                cmd = (self.s3_job(name, *extra, endpoint=proxy.url) if via == "s3"
                       else self.remote_job(proxy.url, name, *extra))
                r = run(cmd, env=env)
                stats = proxy.stats()
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertEqual(summary(name)["params_sha256"], self.local_sha, name)
            retries = summary(name)["io"]["train"]["remote"]["retries"] + summary(name)["io"]["test"]["remote"]["retries"]
            faults = stats["503"] + stats["reset"] + stats["truncate"] + stats["delay"]
            print(f"{name}: {stats['requests']} requests, faults {stats}, crucible retried {retries}")
            for kind in ("503", "reset", "truncate", "delay"):
                self.assertGreater(stats[kind], 0, f"{name}: no {kind} fault injected: {stats}")
            self.assertGreaterEqual(retries, faults - stats["delay"])  # a delay past the timeout is retried too
            self.assertIn("retr", r.stdout + r.stderr)  # the log counts them

    def test_the_cache_never_holds_more_than_its_bytes(self):
        budget = self.budget
        cache = f"{WORK}/cache-bounded"
        peak = [0]
        done = threading.Event()

        def watch():
            while not done.is_set():
                total = 0
                if os.path.isdir(cache):
                    for e in os.scandir(cache):
                        try:
                            total += e.stat().st_size
                        except FileNotFoundError:
                            pass
                peak[0] = max(peak[0], total)
                time.sleep(0.002)

        t = threading.Thread(target=watch)
        t.start()
        try:
            r = run(self.remote_job(self.http, "bounded", "--set", f"data.cache_bytes={budget}",
                                    "--set", f"data.cache_dir={cache}"))
        finally:
            done.set()
            t.join()
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(summary("bounded")["params_sha256"], self.local_sha)
        remote = summary("bounded")["io"]["train"]["remote"]
        print(f"cache: {budget} bytes allowed, {peak[0]} the most seen; {remote}")
        self.assertGreater(peak[0], 0)
        self.assertLessEqual(peak[0], budget)
        self.assertGreater(remote["evictions"], 0)  # 7 shards of 5 fitting: the second epoch downloads again

    def test_refusals_exit_2_naming_the_url(self):
        missing = run(job(self.http + "/train-{0..6}.tar", self.http + "/test-0.tar", "missing"))
        self.assertEqual(missing.returncode, 2, missing.stdout + missing.stderr)
        self.assertIn(self.http + "/train-6.tar: HTTP 404", missing.stderr)
        os.makedirs(os.path.join(self.local, "forbidden"), exist_ok=True)
        forbidden = run(job(self.http + "/forbidden/train-0.tar", self.http + "/test-0.tar", "forbidden"))
        self.assertEqual(forbidden.returncode, 2, forbidden.stdout + forbidden.stderr)
        self.assertIn(self.http + "/forbidden/train-0.tar: HTTP 403", forbidden.stderr)

        wrong = dict(self.s3.env, AWS_SECRET_ACCESS_KEY="not-the-secret")
        r = run(self.s3_job("wrong-secret"), env=wrong)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("s3://data/tar/train-0.tar: HTTP 403", r.stderr)
        self.assertIn("SignatureDoesNotMatch", r.stderr)
        self.assertIn("credentials from the environment", r.stderr)
        unknown = dict(self.s3.env, AWS_ACCESS_KEY_ID="AKIAUNKNOWNUNKNOWN00")
        r = run(self.s3_job("unknown-key"), env=unknown)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("InvalidAccessKeyId", r.stderr)
        none = {k: v for k, v in self.s3.env.items() if not k.startswith("AWS_ACCESS") and not k.startswith("AWS_SECRET")}
        env = dict(os.environ)
        for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
            env.pop(k, None)
        env.update(none)
        r = subprocess.run(self.s3_job("no-credentials"), capture_output=True, text=True, env=env, timeout=600)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("AWS_ACCESS_KEY_ID", r.stderr)
        self.assertIn(os.path.join(self.s3.dir, "no-such-file"), r.stderr)
        s3_missing = run(self.remote_job("s3://data/tar-gone", "s3-missing", "--set",
                                         f"data.s3_endpoint={self.s3.endpoint}"), env=self.s3.env)
        self.assertEqual(s3_missing.returncode, 2, s3_missing.stdout + s3_missing.stderr)
        self.assertIn("s3://data/tar-gone/train-0.tar: HTTP 404", s3_missing.stderr)  # the first shard, whatever the timing
        self.assertIn("NoSuchKey", s3_missing.stderr)

    def test_doctor_checks_the_store_the_credentials_and_the_cache_folder(self):
        r, report = doctor(self.s3_job("doctor-s3"), env=self.s3.env)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        remote = {c["name"]: c for c in report["checks"]}["remote"]
        self.assertIn("credentials from the environment", remote["found"])
        self.assertGreater(remote["figures"]["requests"], 0)
        self.assertGreater(remote["figures"]["cache_free_bytes"], 0)
        # A cache larger than its disk can hold: a warning with the size that fits.
        r, report = doctor(self.remote_job(self.http, "doctor-big", "--set", "data.cache_bytes=1000000000000000"))
        remote = {c["name"]: c for c in report["checks"]}["remote"]
        self.assertEqual(remote["status"], "warn", remote)
        self.assertIn("data.cache_bytes =", remote["fix"])
        # Bad credentials: the data check fails naming the URL and where the credentials came from.
        r, report = doctor(self.s3_job("doctor-wrong"), env=dict(self.s3.env, AWS_SECRET_ACCESS_KEY="wrong"))
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        data = {c["name"]: c for c in report["checks"]}["data"]
        self.assertEqual(data["status"], "fail")
        self.assertIn("s3://data/tar/train-0.tar: HTTP 403", data["found"])
        self.assertIn("credentials from the environment", data["found"])

    def test_retries_that_run_out_exit_1_naming_object_status_and_tries(self):
        with FaultProxy(self.http, seed=1, error_rate=1.0, kinds=("503",)) as proxy:
            r = run(self.remote_job(proxy.url, "unavailable", "--set", "data.remote_tries=3"))
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn(proxy.url + "/train-0.tar", r.stderr)
        self.assertIn("gave up after 3 tries", r.stderr)
        self.assertIn("HTTP 503", r.stderr)
        self.assertIn("SlowDown", r.stderr)

    def test_a_download_that_fails_its_checksum_is_never_kept(self):
        # moto's ETag is each object's MD5: every shard body arrives with one byte flipped.
        cache = f"{WORK}/cache-corrupt"
        with FaultProxy(self.s3.endpoint, seed=2, error_rate=1.0, kinds=("corrupt",)) as proxy:
            r = run(self.s3_job("corrupt", "--set", "data.remote_tries=2", "--set", f"data.cache_dir={cache}",
                                endpoint=proxy.url), env=self.s3.env)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("failed their check", r.stderr)
        self.assertIn("MD5", r.stderr)
        left = [n for n in os.listdir(cache) if not n.endswith(".lock") and not n.startswith(".")]
        self.assertEqual(left, [], "a download that failed its check was kept")


    # ---- HTTPS, redirects, integrity (issue 46) ----------------------------------------------

    def test_https_with_a_test_made_certificate_trains_as_the_local_run(self):
        r = run(self.remote_job(self.https, "https", "--set", f"data.ca_bundle={self.certs['ca']}"))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(summary("https")["params_sha256"], self.local_sha)
        self.assertEqual(summary("https")["io"]["train"]["remote"]["downloads"], SHARDS)
        self.assertIn("checked by size and SHA-256 from .idx: 6", r.stdout + r.stderr)
        # The variables, each alone: doctor opens the data over HTTPS and reads samples.
        for variable in CA_VARIABLES:
            with self.subTest(variable=variable):
                d, report = doctor(self.remote_job(self.https, "https-" + variable), env={variable: self.certs["ca"]})
                self.assertEqual(d.returncode, 0, d.stdout + d.stderr)
                data = {c["name"]: c for c in report["checks"]}["data"]
                self.assertEqual(data["status"], "ok", data)
                self.assertIn("checked by size and SHA-256 from .idx: 6", data["found"])

    def test_an_untrusted_certificate_exits_2_naming_the_url_and_what_to_set(self):
        for name, extra, trusted in (("untrusted-system", [], "the system's authorities"),
                                     ("untrusted-other", ["--set", f"data.ca_bundle={self.certs['other_ca']}"],
                                      f"data.ca_bundle = {self.certs['other_ca']}")):
            with self.subTest(name=name):
                r = run(self.remote_job(self.https, name, *extra))
                self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
                self.assertIn(self.https + "/train-0.tar: the server's certificate is not trusted", r.stderr)
                self.assertIn("verified against " + trusted, r.stderr)
                for setting in ("data.ca_bundle", *CA_VARIABLES):
                    self.assertIn(setting, r.stderr)

    def test_a_302_to_another_path_is_followed_and_a_loop_is_refused(self):
        before = len(self.nginx.access_entries())
        r = run(self.remote_job(self.http + "/moved", "moved"))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(summary("moved")["params_sha256"], self.local_sha)
        entries = self.nginx.access_entries()[before:]
        moved = [e for e in entries if e["request"].split()[1].startswith("/moved/")]
        self.assertTrue(moved and all(e["status"] == 302 for e in moved), moved[:3])
        self.assertTrue(any(e["request"].split()[1] == "/train-0.tar" and e["status"] == 206 for e in entries))
        loop = run(self.remote_job(self.http + "/loop", "loop"))
        self.assertEqual(loop.returncode, 2, loop.stdout + loop.stderr)
        self.assertIn(self.http + "/loop/train-0.tar: more than 5 redirects", loop.stderr)
        self.assertIn("a redirect loop", loop.stderr)

    def test_s3s_307_is_followed_signed_again_and_its_301_names_the_region(self):
        redirects = S3Redirects(self.s3.endpoint)
        self.addCleanup(redirects.stop)
        # moto checks each signature over the Host and path it receives: the old one would fail.
        r = run(self.remote_job("s3://data/moved", "s3-moved", "--set", f"data.s3_endpoint={redirects.url}"),
                env=self.s3.env)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(summary("s3-moved")["params_sha256"], self.local_sha)
        self.assertGreater(redirects.counts[307], SHARDS)
        loop = run(self.remote_job("s3://data/loop", "s3-loop", "--set", f"data.s3_endpoint={redirects.url}"),
                   env=self.s3.env)
        self.assertEqual(loop.returncode, 2, loop.stdout + loop.stderr)
        self.assertIn("s3://data/loop/train-0.tar: more than 5 redirects", loop.stderr)
        region = run(self.remote_job("s3://data/region", "s3-region", "--set", f"data.s3_endpoint={redirects.url}"),
                     env=self.s3.env)
        self.assertEqual(region.returncode, 2, region.stdout + region.stderr)
        self.assertIn("s3://data/region/train-0.tar: HTTP 301: the bucket is in another region than us-east-1 "
                      "(data.s3_region); S3 says eu-west-1", region.stderr)

    def test_a_shard_corrupted_on_the_server_with_its_idx_exits_1_and_is_never_kept(self):
        # The same shards and .idx files, train-2.tar with one byte flipped: its size is right,
        # its offsets are right, only the SHA-256 its .idx records can tell.
        folder = os.path.join(self.local, "corrupt")
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
        for n in os.listdir(self.local):
            if n.endswith(".tar") or n.endswith(".tar.idx"):
                shutil.copy(os.path.join(self.local, n), folder)
        with open(os.path.join(folder, "train-2.tar"), "r+b") as f:
            data = bytearray(f.read())
            data[len(data) // 2] ^= 0x01
            f.seek(0)
            f.write(data)
        good = hashlib.sha256(open(os.path.join(self.local, "train-2.tar"), "rb").read()).hexdigest()
        bad = hashlib.sha256(bytes(data)).hexdigest()
        cache = f"{WORK}/cache-corrupt-http"
        r = run(self.remote_job(self.http + "/corrupt", "corrupt-http", "--set", "data.remote_tries=2",
                                "--set", f"data.cache_dir={cache}"))
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        shard = self.http + "/corrupt/train-2.tar"
        self.assertIn(f"{shard}: 2 downloads failed their check; the last had SHA-256 {bad} where the index says "
                      f"{good}", r.stderr)
        for attempt in ("try 1 of 2", "try 2 of 2"):  # data.remote_tries downloads, then never again
            self.assertEqual(r.stderr.count(f"{shard}: the download has SHA-256 {bad} where the index says {good} "
                                            f"({attempt}); deleted"), 1, r.stderr)
        kept = [n for n in os.listdir(cache) if "train-2.tar" in n and not n.endswith(".lock")]
        self.assertEqual(kept, [], "the cache kept the corrupt shard or its part file")

    def test_a_shard_without_idx_is_checked_by_size_and_the_log_says_it_was_not_hashed(self):
        folder = os.path.join(self.local, "no-idx")
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
        for n in os.listdir(self.local):
            if (n.endswith(".tar") or n.endswith(".tar.idx")) and n != "train-4.tar.idx":
                shutil.copy(os.path.join(self.local, n), folder)
        d, report = doctor(self.remote_job(self.http + "/no-idx", "no-idx"))
        self.assertEqual(d.returncode, 0, d.stdout + d.stderr)
        out = d.stdout + d.stderr
        self.assertIn("offset indexes: 5 from .idx, 1 by downloading the shard; checked by size and SHA-256 from "
                      ".idx: 5, by size and MD5 from the ETag: 0, by size only: 1", out)
        warning = f"1 of 6 shards are checked by size only, not hashed"
        self.assertEqual(out.count(warning), 1, out)
        self.assertIn(f"({self.http}/no-idx/train-4.tar)", out)


def main():
    global CRUCIBLE, WORK
    p = argparse.ArgumentParser()
    p.add_argument("--crucible", required=True)
    p.add_argument("--workdir", required=True)
    a, rest = p.parse_known_args()
    CRUCIBLE, WORK = os.path.abspath(a.crucible), os.path.abspath(a.workdir)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
