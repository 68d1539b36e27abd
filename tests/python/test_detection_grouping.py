"""Batches grouped by aspect ratio (issue 47) against torchvision's own code:
references/detection/group_by_aspect_ratio.py, GroupedBatchSampler(sampler, group_ids, batch_size)
with create_aspect_ratio_groups(dataset, k) (train.py's --aspect-ratio-group-factor), at commit
d2aeec2a39981969440d24550feb86c75d894f82. No package ships the references (oracle.REFERENCES_HELP):
the file, as the module torchvision_references_group_by_aspect_ratio in the folder
CRUCIBLE_TORCHVISION_REFERENCES names, runs these comparisons under either Python; without it they
skip, counted, saying so.

- the groups: crucible's bins are the reference's own (parsed from what create_aspect_ratio_groups
  prints), bit for bit or one ulp apart (numpy's SIMD pow rounds some powers of 2 the other way
  than libm's, depending on the numpy and the CPU); no image side up to 65535 gives an aspect ratio
  that such an ulp moves to another group; and the group ids of random image sizes are the
  reference's;
- the batches: crucible's training order (data.sampler "distributed", 1 and 2 replicas,
  "repeated", and any given list) grouped equals the reference's GroupedBatchSampler fed the same
  base order as its sampler, batch for batch; the global order is grouped as one order of global
  batches, each split over the ranks, so a step's samples are the same at any world size;
- a top-up (a leftover group filled with its own samples) is a copy of its own, drawn apart;
- the refusals: a factor below -1, fewer samples than one batch.

The reference's dict order depends on its assert statements (a yielded group's key is deleted
and put back last by the assert's lookup): it is compared as train.py runs it, without -O.
"""
import contextlib
import io
import math
import os
import random
import re
import sys
import unittest
from collections import Counter

import numpy as np
import torch.utils.data

from oracle import needs_reference  # noqa: E402

_reference = needs_reference("torchvision_references_group_by_aspect_ratio",
                             "grouped batches against torchvision's references/detection/group_by_aspect_ratio.py")
try:
    import torchvision_references_group_by_aspect_ratio as reference  # noqa: E402  audit-deps: ignore (in no package)
except ImportError:
    reference = None

from crucible import _native  # noqa: E402


class Sizes:
    """A data set the reference reads the aspect ratios of through get_height_and_width (its
    custom-data-set path: float(width) / float(height), as for COCO's image sizes)."""

    def __init__(self, sizes):
        self.sizes = sizes  # (width, height)

    def __len__(self):
        return len(self.sizes)

    def get_height_and_width(self, i):
        width, height = self.sizes[i]
        return height, width


class ListSampler(torch.utils.data.Sampler):
    """A base order as the reference's sampler (it wants a torch Sampler)."""

    def __init__(self, order):
        self.order = list(order)

    def __iter__(self):
        return iter(self.order)

    def __len__(self):
        return len(self.order)


def reference_groups(sizes, k):
    """create_aspect_ratio_groups's ids, and its bins (parsed from what it prints)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        groups = reference.create_aspect_ratio_groups(Sizes(sizes), k=k)
    printed = re.search(r"Using \[0, (.*), inf\] as bins", out.getvalue())
    return groups, [float(b) for b in printed.group(1).split(", ")]


def reference_batches(order, groups, batch):
    return [list(b) for b in reference.GroupedBatchSampler(ListSampler(order), groups, batch)]


def random_sizes(rng, n):
    """Image sizes as detection sets have them: mostly landscape and portrait photos near 4:3 and
    3:4, squares, a few panoramas and slivers (rare groups, whose batches get topped up), and
    ratios that hit the exact bins 1/2, 1 and 2."""
    sizes = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.35:
            w = rng.randint(400, 640); h = rng.randint(280, w)
        elif kind < 0.6:
            h = rng.randint(400, 640); w = rng.randint(280, h)
        elif kind < 0.7:
            w = h = rng.randint(32, 512)
        elif kind < 0.8:
            h = 2 * rng.randint(8, 150); w = rng.choice([h // 2, 2 * h])
        else:
            w = rng.randint(1, 4000); h = rng.randint(1, 4000)
        sizes.append((max(1, w), max(1, h)))
    return sizes


def ratios_of(sizes):
    return [float(w) / float(h) for w, h in sizes]


def cut(order, batch):
    return [order[i:i + batch] for i in range(0, len(order), batch)]


@_reference
class GroupsTest(unittest.TestCase):
    def test_bins_are_the_references_and_no_image_size_tells_their_roundings_apart(self):
        rng = random.Random(3)
        sides = np.arange(1, 65536, dtype=np.float64)
        checked, ulps = 0, 0
        for k in (0, 1, 2, 3, 5, 10):
            sizes = random_sizes(rng, 400)
            groups, bins = reference_groups(sizes, k)
            mine = _native.grouped_batches(ratios_of(sizes), k, 1, base_order=[])
            self.assertEqual(len(mine["bins"]), len(bins), k)
            for c, r in zip(mine["bins"], bins):
                self.assertLessEqual(abs(c - r), math.ulp(r), f"k={k}: crucible's bin {c!r}, the reference's {r!r}")
                ulps += c != r
            self.assertEqual(mine["group_ids"], groups, f"k={k}")
            # Whichever way a bin 2**y is rounded (y not an integer), a ratio w / h of sides up to
            # 65535 is never within an ulp of it: the groups do not depend on the rounding.
            for c in mine["bins"]:
                if c in (0.5, 1.0, 2.0):  # 2 ** -1, 2 ** 0, 2 ** 1: exact everywhere
                    continue
                lo, hi = math.nextafter(c, 0), math.nextafter(c, math.inf)
                for w in (np.floor(c * sides), np.ceil(c * sides)):
                    near = np.flatnonzero((w / sides >= lo) & (w / sides <= hi))
                    if near.size:
                        self.fail(f"k={k}: {int(w[near[0]])}/{int(sides[near[0]])} is within an ulp of the bin {c!r}")
                checked += 1

        print(f"\n{ulps} of crucible's bins one ulp from numpy {np.__version__}'s here; {checked} bins' "
              "neighbourhoods hold no ratio of sides up to 65535")

    def test_exact_bins_and_their_neighbours_group_as_the_reference(self):
        for k in (0, 1, 3):
            ratios = [0.5, 1.0, 2.0, math.nextafter(0.5, 0), math.nextafter(1.0, 0), math.nextafter(2.0, 0),
                      math.nextafter(2.0, 3), 1e-6, 1e6]
            expect = [reference._quantize([r], reference_groups([(1, 1)], k)[1])[0] for r in ratios]
            self.assertEqual(_native.grouped_batches(ratios, k, 1, base_order=[])["group_ids"], expect, k)


@_reference
class BatchesTest(unittest.TestCase):
    def setUp(self):
        self.assertTrue(__debug__, "the reference's group order depends on its asserts: run without -O")

    def check(self, label, mine, expect):
        self.assertEqual(mine, expect, f"{label}: crucible's batches differ from GroupedBatchSampler's")

    def test_distributed_order_grouped_equals_grouped_batch_sampler(self):
        rng = random.Random(7)
        cases = 0
        for k in (0, 1, 3):
            for batch in (1, 2, 4, 7):
                for n in (9, 57, 200):
                    sizes = random_sizes(rng, n)
                    ratios = ratios_of(sizes)
                    groups, _ = reference_groups(sizes, k)
                    for replicas in (1, 2):
                        for rank in range(replicas):
                            seed, epoch = rng.randrange(1 << 31), rng.randrange(5)
                            where = dict(sampler="distributed", seed=seed, epoch=epoch, num_replicas=replicas,
                                         rank=rank)
                            base = _native.grouped_batches(ratios, -1, batch, **where)["order"]
                            if len(base) < batch:  # no batch from the reference: crucible refuses, saying so
                                self.assertEqual(reference_batches(base, groups, batch), [])
                                with self.assertRaisesRegex(ValueError, "fewer than one batch"):
                                    _native.grouped_batches(ratios, k, batch, **where)
                                continue
                            mine = _native.grouped_batches(ratios, k, batch, **where)
                            self.assertEqual(mine["group_ids"], groups)
                            label = f"k={k} batch={batch} n={n} rank {rank} of {replicas} epoch {epoch}"
                            self.check(label, cut(mine["order"], batch), reference_batches(base, groups, batch))
                            cases += 1
        print(f"\n{cases} distributed orders grouped as GroupedBatchSampler groups them")

    def test_any_base_order_grouped_equals_grouped_batch_sampler(self):
        """Lists the samplers do not give: repeats, a few groups only, a length just past a batch."""
        rng = random.Random(11)
        for trial in range(300):
            k = rng.choice((0, 1, 3))
            batch = rng.choice((1, 2, 4, 7))
            n = rng.randint(1, 40)
            sizes = random_sizes(rng, n)
            groups, _ = reference_groups(sizes, k)
            order = [rng.randrange(n) for _ in range(rng.randint(0, 3 * n))]
            mine = _native.grouped_batches(ratios_of(sizes), k, batch, base_order=order)
            self.check(f"trial {trial}: k={k} batch={batch} order {order}", cut(mine["order"], batch),
                       reference_batches(order, groups, batch))

    def test_repeated_sampler_grouped_equals_grouped_batch_sampler(self):
        rng = random.Random(5)
        sizes = random_sizes(rng, 600)
        ratios = ratios_of(sizes)
        groups, _ = reference_groups(sizes, 3)
        for rank in range(2):
            where = dict(sampler="repeated", seed=9, epoch=2, num_replicas=2, rank=rank)
            base = _native.grouped_batches(ratios, -1, 4, **where)
            mine = _native.grouped_batches(ratios, 3, 4, **where)
            self.check(f"repeated, rank {rank}", cut(mine["order"], 4), reference_batches(base["order"], groups, 4))
            # RASampler's copies follow their samples into the batches: a sample's copies stay apart.
            visits = list(zip(mine["order"], mine["copies"]))
            self.assertEqual(len(visits), len(set(visits)), "two visits of one sample share a copy number")

    def test_global_order_is_grouped_as_one_order_of_global_batches(self):
        rng = random.Random(13)
        for k in (0, 3):
            for batch in (2, 4):
                sizes = random_sizes(rng, 150)
                ratios = ratios_of(sizes)
                groups, _ = reference_groups(sizes, k)
                ranks = 3
                whole = dict(sampler="global", seed=21, epoch=1)
                base = _native.grouped_batches(ratios, -1, batch * ranks, **whole)["order"]
                # The one-rank order in global batches is the ranks' slices of each step, side by side.
                slices = [cut(_native.grouped_batches(ratios, -1, batch, **whole, num_replicas=ranks, rank=r)["order"],
                              batch) for r in range(ranks)]
                self.assertEqual(base, [i for step in zip(*slices) for s in step for i in s])
                expect = reference_batches(base, groups, batch * ranks)
                for r in range(ranks):
                    mine = _native.grouped_batches(ratios, k, batch, **whole, num_replicas=ranks, rank=r)
                    self.check(f"global k={k} batch={batch} rank {r} of {ranks}", cut(mine["order"], batch),
                               [b[r * batch:(r + 1) * batch] for b in expect])
                # The same steps on one rank with the global batch: elastic.
                one = _native.grouped_batches(ratios, k, batch * ranks, **whole)
                self.assertEqual(cut(one["order"], batch * ranks), expect)

    def test_top_ups_are_copies_of_their_own_and_the_log_names_the_groups(self):
        rng = random.Random(17)
        sizes = random_sizes(rng, 101)
        ratios = ratios_of(sizes)
        groups, _ = reference_groups(sizes, 3)
        mine = _native.grouped_batches(ratios, 3, 8, seed=4, epoch=3)
        visits = list(zip(mine["order"], mine["copies"]))
        seen = Counter(mine["order"])
        self.assertGreater(sum(c - 1 for c in seen.values()), 0, "no top-up in this epoch: pick another set")
        self.assertEqual(len(visits), len(set(visits)), "a top-up shares its sample's copy number")
        firsts = {}
        for index, copy in visits:
            firsts.setdefault(index, copy)
        self.assertTrue(all(c == 0 for c in firsts.values()), "a sample's first visit is not its first copy")
        used = len(set(groups))
        self.assertIn(f"grouped by aspect ratio into {used} groups (factor 3)", mine["describe"])
        self.assertEqual(len(mine["order"]), 101 // 8 * 8)



class RefusalsTest(unittest.TestCase):
    """Needs no reference: what crucible refuses, and the factor that turns grouping off."""

    def test_refusals(self):
        with self.assertRaisesRegex(ValueError, "aspect_ratio_group_factor"):
            _native.grouped_batches([1.0] * 10, -2, 2)
        with self.assertRaisesRegex(ValueError, "fewer than one batch of 16"):
            _native.grouped_batches([1.0] * 10, 3, 16)
        with self.assertRaisesRegex(ValueError, "aspect ratio 0"):
            _native.grouped_batches([1.0, 0.0], 3, 1, base_order=[0, 1])
        # -1: the sampler's own order, as train.py without grouping.
        off = _native.grouped_batches([1.0] * 10, -1, 16)
        self.assertNotIn("grouped", off["describe"])


if __name__ == "__main__":
    unittest.main()
