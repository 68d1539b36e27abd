#!/usr/bin/python3
"""Remote shards end to end (issue 37): `crucible train` reads WebDataset tar shards and packed
shards from nginx (HTTP, range requests) and from an S3 endpoint (moto's server, signatures
checked), directly and through a fault proxy, and must end with the params_sha256 of the same
run on the same shards read from local disk. Then: the node's cache never exceeds
data.cache_bytes; refusals (404, 403, a wrong secret, an unknown key, no credentials) exit 2
naming the URL; retries that run out exit 1 naming the object, the status and the tries; a
download that fails its checksum is never kept.

    tests/scripts/remote_data_test.py --crucible build/crucible --workdir /tmp/remote

Servers: tests/support/nginx_server.py, tests/support/fault_proxy.py (in-process) and
tests/support/s3_server.py (moto, in .venv-s3, made by scripts/setup-s3), all on 127.0.0.1.
"""
import argparse
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

CRUCIBLE = None
WORK = None
S3_PYTHON = os.environ.get("CRUCIBLE_S3_PYTHON", os.path.join(ROOT, ".venv-s3", "bin", "python"))
SHARDS = 6
PER_SHARD = 40


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
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=600)


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
        def doctor(cmd, env=None):
            d = [c if c != "train" else "doctor" for c in cmd] + ["--json"]
            r = run(d, env=env)
            return r, json.loads(r.stdout.strip().splitlines()[-1]) if r.stdout.strip() else None
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
