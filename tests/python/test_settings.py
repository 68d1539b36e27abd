"""The Python loaders honour settings= (issue 46) as `crucible bench loader` honours --set: a key
in settings wins over a keyword left at its default, a keyword given explicitly that settings
contradict raises ValueError naming both, and EVERY [data] key (enumerated from the schema,
_native.data_keys()) is accepted and arrives — seen in the batches (shape, count, digest), the
loader's threads and prefetch depth, its pipeline's description, or, for a key a loader cannot
apply, in `not_applied` with one warning; `settings` echoes every effective value.
"""
import hashlib
import os
import tempfile
import unittest
import warnings

import numpy as np
from PIL import Image

import crucible
from crucible import _native


def make_photos(root, n, seed=7):
    """n textured JPEGs of 40-110 px in 4 classes; the first turned by its EXIF orientation tag."""
    rng = np.random.default_rng(seed)
    for i in range(n):
        d = os.path.join(root, f"class{i % 4}")
        os.makedirs(d, exist_ok=True)
        w, h = int(rng.integers(40, 110)), int(rng.integers(40, 110))
        y, x = np.mgrid[0:h, 0:w]
        base = np.stack([x * 255 // w, y * 255 // h, (x + y) * 127 // (w + h)], -1)
        a = (base + rng.integers(0, 64, (h, w, 3))).clip(0, 255).astype(np.uint8)
        im = Image.fromarray(a)
        if i == 0:
            e = Image.Exif()
            e[0x0112] = 6
            im.save(os.path.join(d, f"{i:04d}.jpg"), quality=92, exif=e.tobytes())
        else:
            im.save(os.path.join(d, f"{i:04d}.jpg"), quality=92)
    return root


def digest(loader):
    h = hashlib.sha256()
    for x, y in loader:
        h.update(x.contiguous().numpy().tobytes())
        h.update(y.numpy().tobytes())
    return h.hexdigest()


SOURCE_KEYS = ("data.dataset", "data.train_images", "data.train_labels", "data.test_images", "data.test_labels",
               "data.train_path", "data.test_path")


class SettingsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.photos = make_photos(os.path.join(cls.tmp.name, "photos"), 264)
        cls.bad = make_photos(os.path.join(cls.tmp.name, "bad"), 8)
        with open(os.path.join(cls.bad, "class1", "0001.jpg"), "rb") as f:
            b = f.read()
        with open(os.path.join(cls.bad, "class1", "broken.jpg"), "wb") as f:
            f.write(b[:200] + b"\x00" * 300 + b[500:])

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def loader(self, settings=None, source=None, **kw):
        args = dict(batch_size=32, seed=0)
        args.update(kw)
        s = {"data.crop": 32, "data.threads": 2}
        s.update(settings or {})
        return crucible.ImageLoader(source or self.photos, settings=s, **args)

    def walks(self):
        """key -> (value, extra settings, keywords, how, expected). A key the schema gains needs an
        entry here (the test fails naming it)."""
        ra, am = {"data.augment": "randaugment"}, {"data.augment": "augmix"}
        ev = {"train": False}
        w = {k: ("/elsewhere", {}, {}, "refused", None) for k in SOURCE_KEYS}
        w["data.dataset"] = ("arrays", {}, {}, "refused", None)
        w.update({
            "data.crop": (48, {}, {}, "shape", 48),
            "data.eval_crop": (40, {}, ev, "shape", 40),
            "data.eval_resize": (64, {}, ev, "digest", None),
            "data.cache": ("decoded", {}, {}, "describes", "cache decoded"),
            "data.cache_mb": (3, {"data.cache": "encoded"}, {}, "describes", "budget 3 MiB"),
            "data.jpeg_decode": ("accurate", {}, {}, "digest", None),
            "data.jpeg_dct_scaling": (False, {}, {}, "digest", None),
            "data.exif_orientation": (False, {}, {}, "digest", None),
            "data.color_order": ("BGR", {}, {}, "digest", None),
            "data.bad_samples": ("skip", {}, {"source": self.bad}, "skips", None),
            "data.train_samples": (100, {}, {}, "images", 100),
            "data.test_samples": (50, {}, ev, "images", 50),
            "data.sampler": ("global", {}, {}, "digest", None),
            "data.threads": (3, {}, {}, "threads", 3),
            "data.prefetch": (2, {}, {}, "prefetch", 2),
            "data.hflip": (0.0, {}, {}, "digest", None),
            "data.shuffle_window": (1, {"data.sampler": "global"}, {"source": self.packed()}, "digest", None),
            "data.repeats": (2, {"data.sampler": "repeated"}, {}, "digest", None),
            "data.solarize": (0.5, {}, {}, "digest", None),
            "data.solarize_threshold": (64.0, {"data.solarize": 1.0}, {}, "digest", None),
            "data.augment": ("trivialaugment_wide", {}, {}, "digest", None),
            "data.augment_num_ops": (1, ra, {}, "digest", None),
            "data.augment_magnitude": (3, ra, {}, "digest", None),
            "data.augment_bins": (11, ra, {}, "digest", None),
            "data.augment_policy": ("svhn", {"data.augment": "autoaugment"}, {}, "digest", None),
            "data.augment_interpolation": ("bilinear", ra, {}, "digest", None),
            "data.augment_fill": ([128.0], ra, {}, "digest", None),
            "data.augmix_severity": (1, am, {}, "digest", None),
            "data.augmix_width": (2, am, {}, "digest", None),
            "data.augmix_depth": (2, am, {}, "digest", None),
            "data.augmix_alpha": (0.5, am, {}, "digest", None),
            "data.augmix_all_ops": (False, am, {}, "digest", None),
        })
        # Not applied by a loader: normalisation (the mean=/std= keywords do it here, the device in
        # training), remote data's keys (these photos are local), and the batch transforms that
        # training runs on the device after the loader.
        for k, v in (("data.mean", [0.5, 0.5, 0.5]), ("data.std", [0.2, 0.2, 0.2]), ("data.mean_std_range", "byte"),
                     ("data.mean_std_order", "BGR"), ("data.cache_dir", "/tmp/crucible-cache"),
                     ("data.cache_bytes", 1048576), ("data.s3_endpoint", "http://127.0.0.1:9"),
                     ("data.s3_region", "eu-west-1"),
                     ("data.ca_bundle", "/tmp/ca.pem"), ("data.remote_tries", 2), ("data.remote_timeout", 5.5),
                     ("data.io_threads", 2), ("data.remote_part_bytes", 65536), ("data.random_erase", 0.25),
                     ("data.random_erase_scale", [0.1, 0.2]), ("data.random_erase_ratio", [0.5, 2.0]),
                     ("data.random_erase_value", [0.5]), ("data.mixup_alpha", 0.2), ("data.cutmix_alpha", 1.0)):
            w[k] = (v, {}, {}, "not_applied", None)
        # Detection data's keys: a classification loader names them not applied (each with its
        # default given); test_detection_data.EveryDetectionKeyArrives walks them on a detection set.
        import tomllib
        defaults = dict(_native.data_keys())
        for k in _native.detection_keys():
            w[k] = (tomllib.loads("v = " + defaults[k])["v"], {}, {}, "not_applied", None)
        return w

    def packed(self):
        """The photos packed into ~20 shards (so that the global order's shuffle window matters)."""
        out = os.path.join(self.tmp.name, "packed")
        if not os.path.exists(out):
            import subprocess
            binary = os.environ.get("CRUCIBLE", os.path.join(os.path.dirname(__file__), "..", "..", "build", "crucible"))
            r = subprocess.run([binary, "pack", self.photos, out, "--shard-mb", "0.05"], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
        return out

    def test_every_data_key_arrives(self):
        keys = [k for k, _ in _native.data_keys()]
        self.assertGreater(len(keys), 50)
        table = self.walks()
        self.assertEqual([k for k in keys if k not in table], [],
                         "[data] keys this walk has no entry for (give each in walks(): a value and how it shows)")
        self.assertEqual([k for k in table if k not in keys], [], "walks() names keys the schema no longer has")
        baselines = {}
        failed = {}
        for key in keys:
            value, extra, kw, how, expected = table[key]
            try:
                self.walk(key, value, extra, kw, how, expected, baselines)
            except Exception as e:  # noqa: BLE001 - every key is walked; the failures are listed together
                failed[key] = f"{type(e).__name__}: {e}"
        self.assertEqual(failed, {}, f"{len(failed)} of {len(keys)} [data] keys did not arrive:\n" +
                         "\n".join(f"  {k}: {v}" for k, v in failed.items()))

    def walk(self, key, value, extra, kw, how, expected, baselines):
        settings = dict(extra, **{key: value})
        if how == "refused":  # the loader's source names the data: a key naming it too is refused
            with self.assertRaisesRegex(ValueError, f"source.*{key}|{key}.*source"):
                self.loader(settings, **kw)
            return
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loader = self.loader(settings, **kw)
        said = [str(w.message) for w in caught if key + " = " in str(w.message)]
        if how == "not_applied":
            self.assertEqual(len(said), 1, f"one warning naming {key}: {[str(w.message) for w in caught]}")
            self.assertIn("not applied", said[0])
        elif how == "shape":
            x, _ = next(iter(loader))
            self.assertEqual(tuple(x.shape[1:]), (3, expected, expected))
        elif how == "images":
            self.assertEqual(sum(len(y) for _, y in loader), expected)
        elif how == "threads":
            self.assertEqual(loader.threads, expected)
        elif how == "prefetch":
            self.assertEqual(loader._native.prefetch(), expected)
        elif how == "describes":
            self.assertIn(expected, loader.describe())
        elif how == "skips":
            list(loader)
            self.assertEqual(len(loader.skipped), 1, loader.skipped)
            with self.assertRaises(ValueError):
                list(self.loader(extra, **kw))
        elif how == "digest":
            base_id = repr((sorted(extra.items()), sorted(kw.items())))
            if base_id not in baselines:
                baselines[base_id] = digest(self.loader(extra, **kw))
            self.assertNotEqual(digest(loader), baselines[base_id], "the batches did not change")
        else:
            self.fail(f"unknown how {how!r}")
        self.assertEqual(key in getattr(loader, "not_applied", {}), how == "not_applied", "not_applied")
        self.assertEqual(getattr(loader, "settings", {}).get(key), value, "the settings echo")

    def test_settings_win_over_defaults_and_a_keyword_they_contradict_raises(self):
        few = {"data.train_samples": 64}
        # Issue 46's acceptance, for the Python loader: 128-pixel batches from settings alone.
        x, _ = next(iter(crucible.ImageLoader(self.photos, batch_size=8, settings=dict(few, **{"data.crop": 128}))))
        self.assertEqual(tuple(x.shape[1:]), (3, 128, 128))
        l = crucible.ImageLoader(self.photos, batch_size=8, settings=dict(few, **{"data.threads": 3}))
        self.assertEqual(l.threads, 3)
        # The keyword alone, and both agreeing.
        x, _ = next(iter(crucible.ImageLoader(self.photos, batch_size=8, crop=96, settings=few)))
        self.assertEqual(tuple(x.shape[1:]), (3, 96, 96))
        crucible.ImageLoader(self.photos, batch_size=8, crop=96, settings=dict(few, **{"data.crop": 96}))
        # Disagreeing: refused, naming both.
        for kw, key, v in ((dict(crop=96), "data.crop", 128), (dict(threads=2), "data.threads", 3),
                           (dict(cache="encoded"), "data.cache", "decoded"), (dict(seed=1), "run.seed", 2)):
            name, given = next(iter(kw.items()))
            with self.assertRaisesRegex(ValueError, f"{name}={given!r}.*{key}={v}"):
                crucible.ImageLoader(self.photos, batch_size=8, settings=dict(few, **{key: v}), **kw)
        # ArrayLoader: its hflip keyword and settings alike.
        arrays = os.path.join(self.tmp.name, "x.npy"), os.path.join(self.tmp.name, "y.npy")
        np.save(arrays[0], np.random.default_rng(0).integers(0, 256, (16, 8, 8, 3), dtype=np.uint8))
        np.save(arrays[1], np.arange(16) % 4)
        a = crucible.ArrayLoader(*arrays, batch_size=4, settings={"data.hflip": 1.0, "data.threads": 2})
        self.assertEqual(a.settings["data.hflip"], 1.0)
        self.assertEqual(a.threads, 2)
        with self.assertRaisesRegex(ValueError, "hflip=0.5.*data.hflip=1.0"):
            crucible.ArrayLoader(*arrays, batch_size=4, hflip=0.5, settings={"data.hflip": 1.0})

    def test_a_key_of_another_section_is_refused_naming_what_the_loader_reads(self):
        with self.assertRaisesRegex(ValueError, r"train.multi_scale.*\[data\]"):
            self.loader({"train.multi_scale": [32]})


if __name__ == "__main__":
    unittest.main()
