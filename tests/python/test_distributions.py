"""The laws of crucible's random draws against torchvision's own samplers (issue 46): many draws
from crucible and from torchvision's real transforms with the same parameters (fixed seeds on both
sides), compared as two samples — two-sample Kolmogorov–Smirnov for continuous draws, chi-square
homogeneity of a 2 × K table for choices. test_transforms.py and tests/train/mixup_test.cpp show
that crucible applies what torchvision would *given the same draws*; this file shows that the draws
themselves follow torchvision's laws:
- AugMix: the Beta weight m of the image, the chain weights (Dirichlet), for alpha 0.5, 1 and 3;
  the chains' depth, operation, severity bin and sign;
- MixUp/CutMix: CutMix's centre and the box's share it implies (λ corrected), MixUp's λ and the
  choice between the two (v2 only: torchvision 0.14 has no CutMix);
- RandomErasing: whether it erases (p, and tries that fit), the erased area, its aspect ratio,
  top and left;
- RandomResizedCrop: the crop's share of the area, its aspect ratio, top and left;
- TrivialAugmentWide, RandAugment, AutoAugment (imagenet, cifar10, svhn): which operation, which
  magnitude bin, which sign.
torchvision's draws are read from its real code: get_params/make_params, or the real transform run
on a tiny (or blank) image with recording spies that pass every value through (AugMix's
_sample_dirichlet, torch.randint where a centre or depth is not returned). The policies' operations
(_apply_image_or_video_transform, v1's _apply_op) are recorded as (op, magnitude) and not run: they
draw nothing, and running them would take minutes in v2. Bins are recovered from magnitudes with
torchvision's own magnitude tables. RandomErasing's value is not drawn (crucible has no "random" value: the value
is a fixed setting), so it has no law to compare.

Oracle: transforms.v2 in make test-torch2 (a missing v2 fails there, oracle.py), v1 in make test
(Debian's 0.14) where v1 has the transform; the CutMix/MixUp comparisons skip in make test.

False alarms and power: each comparison rejects at p < P_MIN = 1e-6. One run makes at most
MAX_COMPARISONS = 45 comparisons (counted, printed and checked at the end), so the family's
false-alarm rate per CI run is at most 45 × 1e-6 = 4.5e-5 per build (KS on discrete values is
conservative, so lower still). Every test also compares torchvision's sample with a planted wrong
sampler (uniform for Beta, a wrong Dirichlet concentration, ratio uniform instead of log-uniform,
a centre clipped to the interior, an op never chosen, one bin too few, a sign with p = 0.6, …) and
asserts that it is rejected at the same threshold: the sample sizes give that power. Each
comparison prints its n and p-value.
"""
import math
import random
import unittest
from collections import Counter

import torch
import torchvision
import torchvision.transforms as TV1
import torchvision.transforms.autoaugment as A1

from crucible import _native
from crucible.transforms import functional as C
from oracle import TV2, V2, needs_v2, v2_or_v1

P_MIN = 1e-6
MAX_COMPARISONS = 45
_COMPARED = []  # (label, p) of each comparison of crucible's draws with torchvision's


def tearDownModule():
    if _COMPARED:
        print(f"\n{len(_COMPARED)} comparisons with torchvision {torchvision.__version__}, each rejecting at "
              f"p < {P_MIN:g}: family false-alarm rate <= {len(_COMPARED) * P_MIN:.1e} per run "
              f"(the docstring allows {MAX_COMPARISONS})")
    assert len(_COMPARED) <= MAX_COMPARISONS, (
        f"{len(_COMPARED)} comparisons: raise MAX_COMPARISONS and the docstring's false-alarm rate with them")


def oracle(test, what):
    """Which torchvision compares `what` in `test`: v2 where it imports; v1 in make test (Debian's
    0.14); in make test-torch2 (CRUCIBLE_REQUIRE_ORACLES=1) a missing v2 fails the test."""
    v2_or_v1(test, what)
    return "v2" if V2 else "v1"


# ---- the two-sample tests -------------------------------------------------------------------------

def ks_2samp(a, b):
    """Two-sample Kolmogorov–Smirnov: (D, p) with the asymptotic Kolmogorov distribution (Stephens'
    correction for finite samples). With ties (integer draws) it is conservative."""
    a = torch.sort(torch.tensor(list(a), dtype=torch.float64)).values
    b = torch.sort(torch.tensor(list(b), dtype=torch.float64)).values
    n, m = len(a), len(b)
    at = torch.cat([a, b])
    fa = torch.searchsorted(a, at, right=True).double() / n
    fb = torch.searchsorted(b, at, right=True).double() / m
    d = float((fa - fb).abs().max())
    en = math.sqrt(n * m / (n + m))
    lam = (en + 0.12 + 0.11 / en) * d
    if lam < 0.2:
        return d, 1.0
    q = 2.0 * sum((-1) ** (k - 1) * math.exp(-2.0 * k * k * lam * lam) for k in range(1, 101))
    return d, min(1.0, max(0.0, q))


def chi2_2samp(a, b, pool=40):
    """Chi-square homogeneity of the 2 × K table of two samples' categories: (statistic, df, p).
    Categories seen fewer than `pool` times in both samples together are pooled into one (into
    the rarest other category if the pool itself is still that rare), so expected counts stay
    large enough for the chi-square law to hold far in its tail."""
    ca, cb = Counter(a), Counter(b)
    cols = {k: (ca[k], cb[k]) for k in set(ca) | set(cb)}
    rare = [k for k, (x, y) in cols.items() if x + y < pool]
    if rare:
        taken = [cols.pop(k) for k in rare]
        pooled = [sum(c[0] for c in taken), sum(c[1] for c in taken)]
        if sum(pooled) < pool and cols:
            k = min(cols, key=lambda k: sum(cols[k]))
            pooled = [pooled[0] + cols[k][0], pooled[1] + cols.pop(k)[1]]
        cols[("pooled",)] = tuple(pooled)
    na, nb = sum(x for x, _ in cols.values()), sum(y for _, y in cols.values())
    if len(cols) < 2:
        return 0.0, 0, 1.0
    stat = 0.0
    for x, y in cols.values():
        ex, ey = na * (x + y) / (na + nb), nb * (x + y) / (na + nb)
        stat += (x - ex) ** 2 / ex + (y - ey) ** 2 / ey
    df = len(cols) - 1
    p = float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64),
                                      torch.tensor(stat / 2.0, dtype=torch.float64)))
    return stat, df, p


class LawTest(unittest.TestCase):
    """The two-sample comparison every law test makes (the detection tests' too): a subclass in
    another module sets `compared` to its own module's list (its family false-alarm bound) and
    `oracle` to what it compares with."""
    compared = _COMPARED
    oracle = "torchvision"

    def _p(self, test, x, y):
        if test == "ks":
            return ks_2samp(x, y)[1]
        return chi2_2samp(x, y)[2]

    def same_law(self, label, ours, theirs, test):
        """crucible's sample `ours` and torchvision's `theirs` must not differ at P_MIN."""
        self.assertTrue(len(ours) and len(theirs), f"{label}: an empty sample")
        p = self._p(test, ours, theirs)
        self.compared.append((label, p))
        print(f"  {label}: {test} p = {p:.3g} (crucible n = {len(ours)}, {self.oracle} n = {len(theirs)})")
        with self.subTest(comparison=label):  # the test goes on, so that every comparison is printed
            self.assertGreater(p, P_MIN, f"{label}: crucible's draws do not follow {self.oracle}'s law (p = {p:.3g})")

    def rejects(self, label, planted, theirs, test):
        """The power of the same comparison: a planted wrong sampler must be told apart at P_MIN."""
        p = self._p(test, planted, theirs)
        print(f"    power: {label}: {test} p = {p:.3g} (n = {len(planted)})")
        with self.subTest(power=label):
            self.assertLess(p, P_MIN, f"{label}: the comparison cannot tell the wrong sampler apart (p = {p:.3g})")


def seeded(seed):
    """torch's global generator seeded for torchvision's draws, restored afterwards."""
    ctx = torch.random.fork_rng(devices=[])
    ctx.__enter__()
    torch.manual_seed(seed)
    return ctx


class Spy:
    """Replaces obj.name with a wrapper that records each call's result through `record(args,
    kwargs, result)` and returns the real result; restored on exit. With run=False the call is
    recorded and its first argument returned instead: for the policies' operations, which draw
    nothing (deterministic functions of the image and the magnitude), so that skipping them
    changes none of torchvision's draws — only the time (torchvision 0.29's v2 AugMix takes ~5 ms
    an image with its operations run, ~0.4 ms without)."""

    def __init__(self, obj, name, record, run=True):
        self.obj, self.name, self.record, self.run = obj, name, record, run

    def __enter__(self):
        self.had = self.name in vars(self.obj)
        real = getattr(self.obj, self.name)
        self.real = vars(self.obj)[self.name] if self.had else None

        def spy(*args, **kwargs):
            out = real(*args, **kwargs) if self.run else args[0]
            self.record(args, kwargs, out)
            return out

        setattr(self.obj, self.name, spy)
        return self

    def __exit__(self, *exc):
        if self.had:
            setattr(self.obj, self.name, self.real)
        else:
            delattr(self.obj, self.name)


def params_of(t):
    """A v2 transform's make_params (its _get_params before torchvision 0.20)."""
    return getattr(t, "make_params", None) or t._get_params


# ---- the policies' tables (bins from magnitudes) ----------------------------------------------------

def space(t, kind, bins, h, w):
    """{op: (magnitudes as floats, or None; signed)} of torchvision's transform `t`, its own table."""
    if kind == "v2":
        if isinstance(t, TV2.AugMix):
            table = t._AUGMENTATION_SPACE if t.all_ops else t._PARTIAL_AUGMENTATION_SPACE
        else:
            table = t._AUGMENTATION_SPACE
        table = {op: (fn(bins, h, w), signed) for op, (fn, signed) in table.items()}
    elif isinstance(t, A1.TrivialAugmentWide):
        table = t._augmentation_space(bins)
    else:
        table = t._augmentation_space(bins, (h, w))
    return {op: (None if m is None or m.ndim == 0 else [float(v) for v in m], signed)
            for op, (m, signed) in table.items()}


def their_bin(table, op, magnitude):
    """The bin of torchvision's magnitude: the first of its table with that value (bins of equal
    magnitude, as Posterize's, are one); -1 for an op without magnitudes."""
    mags = table[op][0]
    return -1 if mags is None else mags.index(abs(magnitude))


def our_bin(table, op, b):
    """crucible's bin `b` of `op`, merged as their_bin merges bins of equal magnitude."""
    mags = table[op][0]
    return -1 if mags is None or b < 0 else mags.index(mags[b])


def negative(magnitude):
    return math.copysign(1.0, magnitude) < 0


def op_spy(t, kind, record):
    """A Spy on the operations torchvision's policy `t` applies (not run: see Spy)."""
    if kind == "v2":
        return Spy(t, "_apply_image_or_video_transform", record, run=False)
    return Spy(A1, "_apply_op", record, run=False)


def run_policy(t, kind, n, seed, img):
    """Per sample, the [(op, magnitude)] torchvision's policy `t` applies to `img`, recorded as its
    real forward calls each operation."""
    applied = []

    def record(args, kwargs, out):
        applied.append((args[1], float(args[2])))

    spy = op_spy(t, kind, record)
    out = []
    ctx = seeded(seed)
    try:
        with spy:
            for _ in range(n):
                applied.clear()
                t(img)
                out.append(list(applied))
    finally:
        ctx.__exit__(None, None, None)
    return out


# ---- AugMix ------------------------------------------------------------------------------------------

class AugMixTest(LawTest):
    H, W = 8, 12  # a tiny image: the draws do not depend on its content

    def theirs(self, kind, n, seed, **o):
        """torchvision's AugMix run n times: per sample (m0, chain weights, depths, [(op, magnitude)])."""
        t = (TV2.AugMix if kind == "v2" else A1.AugMix)(**o)
        dirichlet, depths, ops = [], [], []

        def on_dirichlet(args, kwargs, out):
            dirichlet.append([float(v) for v in out[0]])

        def on_randint(args, kwargs, out):
            if kwargs.get("low") == 1 and kwargs.get("high") == 4:  # a chain's random depth
                depths.append(int(out))

        def on_op(args, kwargs, out):
            ops.append((args[1], float(args[2])))

        img = torch.zeros(3, self.H, self.W, dtype=torch.uint8)
        samples = []
        ctx = seeded(seed)
        try:
            with Spy(t, "_sample_dirichlet", on_dirichlet), Spy(torch, "randint", on_randint), op_spy(t, kind, on_op):
                for _ in range(n):
                    dirichlet.clear(), depths.clear(), ops.clear()
                    t(img)
                    self.assertEqual(len(dirichlet), 2, "AugMix drew other than two Dirichlet samples")
                    samples.append((dirichlet[0][0], dirichlet[1], list(depths), list(ops)))
        finally:
            ctx.__exit__(None, None, None)
        return t, samples

    def ours(self, n, seed, **o):
        samples = []
        for index in range(n):
            (m0, _), weights, chains = C.augmix_plan(seed=seed, index=index, width=self.W, height=self.H, **o)
            samples.append((m0, weights, [len(c) for c in chains], [op for c in chains for op in c]))
        return samples

    def test_mixing_weights_depth_ops_bins_and_signs_D14(self):
        kind = oracle(self, "AugMix's draws against v2.AugMix")
        print(f"\nAugMix against torchvision {kind}:")
        rnd = random.Random(46)
        configs = [  # (options, n, what is compared beyond the weights)
            (dict(severity=3, mixture_width=3, chain_depth=-1, alpha=1.0, all_ops=True), 3000, True),
            (dict(severity=10, mixture_width=3, chain_depth=1, alpha=0.5, all_ops=False), 2500, True),
            (dict(severity=3, mixture_width=4, chain_depth=1, alpha=3.0, all_ops=True), 2500, False),
        ]
        for k, (o, n, choices) in enumerate(configs):
            a, width = o["alpha"], o["mixture_width"]
            t, theirs = self.theirs(kind, n, 100 + k, **o)
            ours = self.ours(n, 200 + k, **o)
            tag = f"alpha {a}"
            # m ~ Beta(α, α): the image's weight; the chain weights ~ Dirichlet(α, …): the first one's.
            self.same_law(f"{tag}: m (the image's weight)", [s[0] for s in ours], [s[0] for s in theirs], "ks")
            self.same_law(f"{tag}: the first chain weight", [s[1][0] for s in ours], [s[1][0] for s in theirs], "ks")
            wrong = 2.0 * a if a == 1.0 else 1.0  # uniform for Beta, unless α = 1 (then Beta(2, 2))
            self.rejects(f"{tag}: m ~ Beta({wrong}, {wrong})", [rnd.betavariate(wrong, wrong) for _ in range(n)],
                         [s[0] for s in theirs], "ks")
            planted = []
            for _ in range(n):
                g = [rnd.gammavariate(wrong, 1.0) for _ in range(width)]
                planted.append(g[0] / sum(g))
            self.rejects(f"{tag}: chain weights ~ Dirichlet({wrong})", planted, [s[1][0] for s in theirs], "ks")
            if not choices:
                continue
            table = space(t, kind, 10, self.H, self.W)
            their_ops = [op for s in theirs for op in s[3]]
            our_ops = [op for s in ours for op in s[3]]
            self.same_law(f"{tag}: operation", [op for op, _, _ in our_ops], [op for op, _ in their_ops], "chi2")
            never = sorted(table)[0]  # planted: one op never chosen (its draws go to another)
            other = sorted(table)[1]
            self.rejects(f"{tag}: {never} never chosen", [other if op == never else op for op, _, _ in our_ops],
                         [op for op, _ in their_ops], "chi2")
            theirs_bins = [their_bin(table, op, m) for op, m in their_ops if table[op][0] is not None]
            ours_bins = [our_bin(table, op, b) for op, b, _ in our_ops if table[op][0] is not None]
            self.same_law(f"{tag}: severity bin", ours_bins, theirs_bins, "chi2")
            top = o["severity"] - 1  # planted: bins 0 .. severity - 2 (one too few)
            self.rejects(f"{tag}: bins 0..{top - 1}",
                         [our_bin(table, op, rnd.randrange(top) if b == top else b)
                          for op, b, _ in our_ops if table[op][0] is not None], theirs_bins, "chi2")
            if o["chain_depth"] <= 0:
                depths_theirs = [d for s in theirs for d in s[2]]
                self.assertEqual(len(depths_theirs), n * width, "torchvision's chain depths were not all seen")
                self.same_law(f"{tag}: chain depth", [d for s in ours for d in s[2]], depths_theirs, "chi2")
                self.rejects(f"{tag}: depth 1..2", [rnd.randint(1, 2) for _ in range(n * width)], depths_theirs,
                             "chi2")
                signs_theirs = [negative(m) for op, m in their_ops if table[op][0] is not None and table[op][1]]
                signs_ours = [negative(m) for op, b, m in our_ops if table[op][0] is not None and table[op][1]]
                self.same_law(f"{tag}: sign", signs_ours, signs_theirs, "chi2")
                self.rejects(f"{tag}: negative with p = 0.6", [rnd.random() < 0.6 for _ in signs_ours],
                             signs_theirs, "chi2")


# ---- MixUp and CutMix ---------------------------------------------------------------------------------

@needs_v2("CutMix's centre and box, MixUp's λ and the choice between them, against v2.CutMix/v2.MixUp")
class MixUpCutMixTest(LawTest):
    H, W = 24, 40

    def test_cutmix_centre_and_box_D14(self):
        n, alpha = 5000, 1.0
        t = TV2.CutMix(alpha=alpha, num_classes=10)
        batch = [torch.zeros(2, 3, self.H, self.W)]
        drawn, theirs = [], []
        ctx = seeded(300)
        try:
            with Spy(torch, "randint", lambda args, kwargs, out: drawn.append(int(out))):
                for _ in range(n):
                    drawn.clear()
                    params = params_of(t)(batch)
                    self.assertEqual(len(drawn), 2, "CutMix drew other than the centre's two integers")
                    theirs.append((drawn[0], drawn[1], float(params["lam_adjusted"])))
        finally:
            ctx.__exit__(None, None, None)
        ours = []
        for step in range(n):
            kind, lam_drawn, lam, box, (rx, ry) = _native.mix_draw(46, step, 0, 0.0, alpha, self.W, self.H)
            self.assertEqual(kind, "cutmix")
            ours.append((rx, ry, lam, lam_drawn))
        print("\nCutMix against torchvision v2:")
        for i, what in enumerate(("centre x", "centre y", "λ corrected to the box")):
            self.same_law(f"CutMix {what}", [s[i] for s in ours], [s[i] for s in theirs], "ks")
        # Planted: the centre clipped to the image's interior, so that the box never leaves it.
        planted = []
        for rx, ry, _, lam in ours:
            r = 0.5 * math.sqrt(1.0 - lam)
            hw, hh = int(r * self.W), int(r * self.H)
            planted.append((min(max(rx, hw), self.W - hw), min(max(ry, hh), self.H - hh),
                            1.0 - (2 * hw) * (2 * hh) / (self.W * self.H)))
        for i, what in enumerate(("centre x", "centre y", "λ corrected to the box")):
            self.rejects(f"CutMix {what}, centre clipped to the interior", [s[i] for s in planted],
                         [s[i] for s in theirs], "ks")

    def test_mixup_lambda_and_the_choice_D14(self):
        n, mix_alpha, cut_alpha = 5000, 0.2, 1.0
        mixup = TV2.MixUp(alpha=mix_alpha, num_classes=10)
        cutmix = TV2.CutMix(alpha=cut_alpha, num_classes=10)
        choice = TV2.RandomChoice([mixup, cutmix])
        images, labels = torch.zeros(2, 3, self.H, self.W), torch.tensor([0, 1])
        chosen, lams = [], []
        ctx = seeded(301)
        try:
            with Spy(mixup, params_of(mixup).__name__, lambda a, k, out: (chosen.append("mixup"),
                                                                          lams.append(float(out["lam"])))), \
                    Spy(cutmix, params_of(cutmix).__name__, lambda a, k, out: chosen.append("cutmix")):
                for _ in range(n):
                    choice(images, labels)
        finally:
            ctx.__exit__(None, None, None)
        self.assertEqual(len(chosen), n)
        ours = [_native.mix_draw(47, step, 0, mix_alpha, cut_alpha, self.W, self.H) for step in range(n)]
        print("\nMixUp or CutMix against torchvision v2 (RandomChoice):")
        self.same_law("MixUp or CutMix", [d[0] for d in ours], chosen, "chi2")
        rnd = random.Random(47)
        self.rejects("CutMix chosen with p = 0.6", ["cutmix" if rnd.random() < 0.6 else "mixup" for _ in range(n)],
                     chosen, "chi2")
        ours_lam = [d[1] for d in ours if d[0] == "mixup"]
        self.same_law(f"MixUp λ (α {mix_alpha})", ours_lam, lams, "ks")
        self.rejects("MixUp λ uniform", [rnd.random() for _ in ours_lam], lams, "ks")


# ---- RandomErasing -------------------------------------------------------------------------------------

def read_rectangle(out):
    """(top, left, height, width) of the non-zero rectangle of a [1, H, W] image, or None."""
    nz = out[0] != 0
    rows, cols = nz.any(1).nonzero().flatten(), nz.any(0).nonzero().flatten()
    if len(rows) == 0:
        return None
    return int(rows[0]), int(cols[0]), int(rows[-1] - rows[0] + 1), int(cols[-1] - cols[0] + 1)


def erase_python(n, p, scale, ratio, w, h, rnd, log_ratio=True, apply_below=True, clamp_centre=False):
    """A sampler of erasing rectangles written here, to plant wrong laws in: ratio uniform instead of
    log-uniform, erasing when u >= p, or a centre drawn over the image and the box clamped inside."""
    out = []
    for _ in range(n):
        u = rnd.random()
        if (u < p) != apply_below:
            out.append(None)
            continue
        for _ in range(10):
            area = w * h * rnd.uniform(*scale)
            aspect = (math.exp(rnd.uniform(math.log(ratio[0]), math.log(ratio[1]))) if log_ratio
                      else rnd.uniform(*ratio))
            eh, ew = int(round(math.sqrt(area * aspect))), int(round(math.sqrt(area / aspect)))
            if eh < h and ew < w:
                if clamp_centre:
                    top = min(max(rnd.randrange(h) - eh // 2, 0), h - eh)
                    left = min(max(rnd.randrange(w) - ew // 2, 0), w - ew)
                else:
                    top, left = rnd.randrange(h - eh + 1), rnd.randrange(w - ew + 1)
                out.append((top, left, eh, ew))
                break
        else:
            out.append(None)
    return out


class RandomErasingTest(LawTest):
    def theirs(self, kind, n, seed, p, scale, ratio, w, h):
        """torchvision's RandomErasing run on a blank image: the rectangle it erased, or None."""
        t = (TV2 if kind == "v2" else TV1).RandomErasing(p=p, scale=scale, ratio=ratio, value=1.0)
        img = torch.zeros(1, h, w)
        ctx = seeded(seed)
        try:
            return [read_rectangle(t(img)) for _ in range(n)]
        finally:
            ctx.__exit__(None, None, None)

    def ours(self, n, seed, p, scale, ratio, w, h):
        return [_native.erase_draw(seed, 0, i, p, scale[0], scale[1], ratio[0], ratio[1], w, h) for i in range(n)]

    def test_rate_area_ratio_and_position_D14(self):
        kind = oracle(self, "RandomErasing's draws against v2.RandomErasing")
        print(f"\nRandomErasing against torchvision {kind}:")
        rnd = random.Random(48)
        configs = [  # (p, scale, ratio, width, height, n, positions compared)
            (0.3, (0.02, 0.33), (0.3, 3.3), 48, 32, 10000, True),  # torchvision's defaults but p
            (0.8, (0.5, 0.95), (0.2, 5.0), 40, 24, 5000, False),  # 1 in 8 samples: no try fits
        ]
        for k, (p, scale, ratio, w, h, n, positions) in enumerate(configs):
            args = (p, scale, ratio, w, h)
            theirs = self.theirs(kind, n, 400 + k, *args)
            ours = self.ours(n, 500 + k, *args)
            tag = f"p {p}, scale {scale}, ratio {ratio}, {w}x{h}"
            stats = {"erased": lambda s: [r is not None for r in s],
                     "area": lambda s: [r[2] * r[3] / (w * h) for r in s if r],
                     "aspect ratio": lambda s: [r[2] / r[3] for r in s if r],
                     "top": lambda s: [r[0] for r in s if r],
                     "left": lambda s: [r[1] for r in s if r]}
            tests = {"erased": "chi2", "area": "ks", "aspect ratio": "ks", "top": "ks", "left": "ks"}
            compared = list(stats) if positions else ["erased", "area", "aspect ratio"]
            for what in compared:
                self.same_law(f"{tag}: {what}", stats[what](ours), stats[what](theirs), tests[what])
            planted = {"aspect ratio": ("ratio uniform, not log-uniform",
                                        erase_python(n, *args, rnd, log_ratio=False)),
                       "erased": ("erasing when u >= p", erase_python(n, *args, rnd, apply_below=False)),
                       "top": ("a centre clamped inside", erase_python(n, *args, rnd, clamp_centre=True))}
            if k == 1:  # also a ratio law that changes how often a try fits
                planted["erased"] = ("ratio uniform, not log-uniform", planted["aspect ratio"][1])
            for what, (how, sample) in planted.items():
                if what in compared:
                    self.rejects(f"{tag}: {what}, {how}", stats[what](sample), stats[what](theirs), tests[what])
            if positions:
                self.rejects(f"{tag}: left, a centre clamped inside", stats["left"](planted["top"][1]),
                             stats["left"](theirs), "ks")


# ---- RandomResizedCrop ---------------------------------------------------------------------------------

def rrc_python(n, scale, ratio, w, h, rnd, log_ratio=True, log_scale=False):
    """A RandomResizedCrop sampler written here, to plant wrong laws in (ratio uniform, scale
    log-uniform)."""
    out = []
    for _ in range(n):
        for _ in range(10):
            share = (math.exp(rnd.uniform(math.log(scale[0]), math.log(scale[1]))) if log_scale
                     else rnd.uniform(*scale))
            aspect = (math.exp(rnd.uniform(math.log(ratio[0]), math.log(ratio[1]))) if log_ratio
                      else rnd.uniform(*ratio))
            cw, ch = int(round(math.sqrt(w * h * share * aspect))), int(round(math.sqrt(w * h * share / aspect)))
            if 0 < cw <= w and 0 < ch <= h:
                out.append((rnd.randrange(h - ch + 1), rnd.randrange(w - cw + 1), ch, cw))
                break
        else:
            out.append(((h - min(h, w)) // 2, (w - min(h, w)) // 2, min(h, w), min(h, w)))  # roughly the fallback
    return out


class RandomResizedCropTest(LawTest):
    def theirs(self, kind, n, seed, scale, ratio, w, h):
        img = torch.zeros(1, h, w)
        ctx = seeded(seed)
        try:
            if kind == "v2":
                make = params_of(TV2.RandomResizedCrop(16, scale=scale, ratio=ratio, antialias=True))
                ps = [make([img]) for _ in range(n)]
                return [(q["top"], q["left"], q["height"], q["width"]) for q in ps]
            return [TV1.RandomResizedCrop.get_params(img, list(scale), list(ratio)) for _ in range(n)]
        finally:
            ctx.__exit__(None, None, None)

    def test_scale_ratio_and_position_D14(self):
        kind = oracle(self, "RandomResizedCrop's draws against v2.RandomResizedCrop")
        print(f"\nRandomResizedCrop against torchvision {kind}:")
        rnd = random.Random(49)
        configs = [((0.08, 1.0), (3 / 4, 4 / 3), 64, 48, 8000, True),  # torchvision's defaults
                   ((0.3, 1.0), (0.25, 4.0), 40, 30, 5000, False)]  # wide ratios: tries fail, fallbacks
        for k, (scale, ratio, w, h, n, positions) in enumerate(configs):
            theirs = self.theirs(kind, n, 600 + k, scale, ratio, w, h)
            ours = [_native.random_resized_crop_draw(700 + k, 0, i, w, h, scale[0], scale[1], ratio[0], ratio[1])
                    for i in range(n)]
            tag = f"scale {scale}, ratio ({ratio[0]:.3g}, {ratio[1]:.3g}), {w}x{h}"
            stats = {"scale": lambda s: [r[2] * r[3] / (w * h) for r in s],
                     "aspect ratio": lambda s: [r[3] / r[2] for r in s],
                     "top": lambda s: [r[0] for r in s],
                     "left": lambda s: [r[1] for r in s]}
            compared = list(stats) if positions else ["scale", "aspect ratio"]
            for what in compared:
                self.same_law(f"{tag}: {what}", stats[what](ours), stats[what](theirs), "ks")
            self.rejects(f"{tag}: aspect ratio, uniform not log-uniform",
                         stats["aspect ratio"](rrc_python(n, scale, ratio, w, h, rnd, log_ratio=False)),
                         stats["aspect ratio"](theirs), "ks")
            self.rejects(f"{tag}: scale, log-uniform not uniform",
                         stats["scale"](rrc_python(n, scale, ratio, w, h, rnd, log_scale=True)),
                         stats["scale"](theirs), "ks")
            if positions:  # planted: the corner drawn over the image, then clamped inside
                planted = [(min(rnd.randrange(h), h - r[2]), min(rnd.randrange(w), w - r[3]), r[2], r[3])
                           for r in ours]
                for what in ("top", "left"):
                    self.rejects(f"{tag}: {what}, clamped inside", stats[what](planted), stats[what](theirs), "ks")


# ---- TrivialAugmentWide, RandAugment, AutoAugment -----------------------------------------------------------

class PoliciesTest(LawTest):
    H, W = 8, 12

    def img(self):
        return torch.zeros(3, self.H, self.W, dtype=torch.uint8)

    def test_trivialaugment_wide_D14(self):
        kind = oracle(self, "TrivialAugmentWide's draws against v2.TrivialAugmentWide")
        n = 6000
        t = (TV2 if kind == "v2" else A1).TrivialAugmentWide()
        table = space(t, kind, 31, self.H, self.W)
        theirs = [s[0] for s in run_policy(t, kind, n, 800, self.img())]
        ours = [C.plan("trivialaugment_wide", seed=801, index=i, width=self.W, height=self.H)[0] for i in range(n)]
        print(f"\nTrivialAugmentWide against torchvision {kind}:")
        rnd = random.Random(50)
        self.same_law("operation", [op for op, _, _ in ours], [op for op, _ in theirs], "chi2")
        self.rejects("Identity never chosen", [op if op != "Identity" else "ShearX" for op, _, _ in ours],
                     [op for op, _ in theirs], "chi2")
        bins_theirs = [their_bin(table, op, m) for op, m in theirs if table[op][0] is not None]
        self.same_law("magnitude bin", [our_bin(table, op, b) for op, b, _ in ours if table[op][0] is not None],
                      bins_theirs, "chi2")
        self.rejects("bins 0..29 of 31", [our_bin(table, op, rnd.randrange(30) if b == 30 else b)
                                          for op, b, _ in ours if table[op][0] is not None], bins_theirs, "chi2")
        signs_theirs = [negative(m) for op, m in theirs if table[op][0] is not None and table[op][1]]
        signs_ours = [negative(m) for op, _, m in ours if table[op][0] is not None and table[op][1]]
        self.same_law("sign", signs_ours, signs_theirs, "chi2")
        self.rejects("negative with p = 0.6", [rnd.random() < 0.6 for _ in signs_ours], signs_theirs, "chi2")

    def test_randaugment_D14(self):
        kind = oracle(self, "RandAugment's draws against v2.RandAugment")
        n, magnitude = 4000, 9
        t = (TV2 if kind == "v2" else A1).RandAugment(num_ops=2, magnitude=magnitude)
        table = space(t, kind, 31, self.H, self.W)
        theirs = [op for s in run_policy(t, kind, n, 810, self.img()) for op in s]
        ours = [op for i in range(n)
                for op in C.plan("randaugment", seed=811, index=i, width=self.W, height=self.H, num_ops=2,
                                 magnitude=magnitude)]
        print(f"\nRandAugment (2 ops, magnitude {magnitude}) against torchvision {kind}:")
        rnd = random.Random(51)
        theirs_ops = [(op, their_bin(table, op, m)) for op, m in theirs]
        self.same_law("operation and bin", [(op, our_bin(table, op, b)) for op, b, _ in ours], theirs_ops, "chi2")
        self.rejects("Equalize never chosen", [(op if op != "Equalize" else "Identity", our_bin(table, op, b))
                                               for op, b, _ in ours], theirs_ops, "chi2")
        self.rejects("magnitude bin one higher", [(op, our_bin(table, op, b + 1 if b >= 0 else b))
                                                  for op, b, _ in ours], theirs_ops, "chi2")
        signs_theirs = [negative(m) for op, m in theirs if table[op][0] is not None and table[op][1]]
        signs_ours = [negative(m) for op, _, m in ours if table[op][0] is not None and table[op][1]]
        self.same_law("sign", signs_ours, signs_theirs, "chi2")
        self.rejects("negative with p = 0.6", [rnd.random() < 0.6 for _ in signs_ours], signs_theirs, "chi2")

    def test_autoaugment_D14(self):
        kind = oracle(self, "AutoAugment's draws against v2.AutoAugment")
        n = 8000  # imagenet's sub-policies sign ~0.4 ops a sample: enough signs to see p = 0.6
        print(f"\nAutoAugment against torchvision {kind}:")
        rnd = random.Random(52)
        for k, policy in enumerate(torchvision.transforms.AutoAugmentPolicy):
            t = (TV2 if kind == "v2" else A1).AutoAugment(policy)
            table = space(t, kind, 10, self.H, self.W)
            theirs = run_policy(t, kind, n, 820 + k, self.img())
            ours = [C.plan("autoaugment", seed=830 + k, index=i, width=self.W, height=self.H, policy=policy.value)
                    for i in range(n)]
            # A sample's outcome: the steps applied, each (op, bin); the sub-policy and the steps'
            # probabilities decide it.
            outcome_theirs = [tuple((op, their_bin(table, op, m)) for op, m in s) for s in theirs]
            outcome_ours = [tuple((op, our_bin(table, op, b)) for op, b, _ in s) for s in ours]
            self.same_law(f"{policy.value}: steps applied (op, bin)", outcome_ours, outcome_theirs, "chi2")
            # Planted: a sub-policy uniformly, each step applied when u > p instead of u <= p.
            subs = C.autoaugment_policy(policy.value)
            planted = []
            for _ in range(n):
                sub = subs[rnd.randrange(len(subs))]
                planted.append(tuple((op, our_bin(table, op, -1 if b is None else b))
                                     for op, p, b in sub if rnd.random() > p))
            self.rejects(f"{policy.value}: steps applied when u > p", planted, outcome_theirs, "chi2")
            signs_theirs = [negative(m) for s in theirs for op, m in s if table[op][0] is not None and table[op][1]]
            signs_ours = [negative(m) for s in ours for op, _, m in s if table[op][0] is not None and table[op][1]]
            self.same_law(f"{policy.value}: sign", signs_ours, signs_theirs, "chi2")
            self.rejects(f"{policy.value}: negative with p = 0.6", [rnd.random() < 0.6 for _ in signs_ours],
                         signs_theirs, "chi2")


if __name__ == "__main__":
    unittest.main()
