#!/usr/bin/python3
"""The run report as a browser draws it.

Trains a short real job with the crucible program, runs `crucible report` on its folder, renders
report.html with Debian's headless chromium (a screenshot and the DOM) and checks: the screenshot
is not blank, the DOM's #verdict says the verdict summary.json holds, and every series path has
exactly one M/L command per record of metrics.jsonl that carries its value. Prints what it
measured; exits non-zero naming what is wrong. Needs chromium (scripts/setup installs it) and
python3-pil.

Usage: report_browser_test.py --crucible PATH_TO_CRUCIBLE --workdir DIR
To add a check: measure it from the DOM (DomReader) or the PNG, print it, append to `failures`.
"""
import argparse
import html.parser
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

# Series drawn by the report: data-series -> (record type, key).
SERIES = {
    "train.loss": ("train", "loss"),
    "train.acc": ("train", "acc"),
    "train.lr": ("train", "lr"),
    "train.samples_per_s": ("train", "samples_per_s"),
    "eval.test_loss": ("eval", "test_loss"),
    "eval.test_acc": ("eval", "test_acc"),
    "eval.test_loss_ema": ("eval", "test_loss_ema"),  # train.ema only
    "eval.test_acc_ema": ("eval", "test_acc_ema"),
}

CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--hide-scrollbars", "--virtual-time-budget=5000",
]


def is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def run(argv, timeout, what):
    print("$ " + " ".join(argv), flush=True)
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        sys.exit(f"FAIL: {what} did not finish in {timeout} s")


class DomReader(html.parser.HTMLParser):
    """Collects the #verdict element's text, the series paths and any script or URL."""

    def __init__(self):
        super().__init__()
        self.verdict = None
        self._in_verdict = 0
        self.paths = []
        self.scripts = 0
        self.urls = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "script":
            self.scripts += 1
        for name in ("src", "href", "xlink:href"):
            v = (a.get(name) or "").strip().lower()
            if v.startswith(("http:", "https:", "//")):
                self.urls.append(v)
        if self._in_verdict:
            self._in_verdict += 1
        elif a.get("id") == "verdict":
            self._in_verdict = 1
            self.verdict = ""
        if tag == "path" and "series" in (a.get("class") or "").split():
            self.paths.append(a)

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if self._in_verdict:
            self._in_verdict -= 1

    def handle_endtag(self, tag):
        if self._in_verdict:
            self._in_verdict -= 1

    def handle_data(self, data):
        if self._in_verdict:
            self.verdict += data


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--crucible", required=True, help="the crucible program")
    ap.add_argument("--workdir", required=True, help="a scratch folder (emptied first)")
    args = ap.parse_args()

    chromium = shutil.which("chromium") or shutil.which("chromium-headless-shell")
    if chromium is None:
        sys.exit("FAIL: chromium is not installed (Debian's `chromium` package renders the report in this test; "
                 "scripts/setup installs it)")
    try:
        from PIL import Image
    except ImportError:
        sys.exit("FAIL: python3-pil is not installed (scripts/setup installs it)")

    work = os.path.abspath(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    run_dir = os.path.join(work, "r")

    # A short real job: 40 steps of 64 on a Fashion-MNIST subset (an epoch is 31 steps), a record
    # every 5 steps, an eval (of the model and its weight EMA) after the epoch and at the end.
    # Seconds on an idle machine.
    r = run([args.crucible, "train", "--set", f"run.dir={work}", "--set", "run.name=r", "--set", "train.max_steps=40",
             "--set", "train.batch_size=64", "--set", "data.train_samples=2000", "--set", "data.test_samples=500",
             "--set", "log.every_steps=5", "--set", "log.progress=none", "--set", "train.ema=true",
             "--set", "train.ema_steps=4", "--restart"], 780, "crucible train")
    if r.returncode != 0:
        sys.exit(f"FAIL: crucible train exited {r.returncode}:\n{r.stdout}\n{r.stderr}")

    r = run([args.crucible, "report", run_dir], 60, "crucible report")
    report = os.path.join(run_dir, "report.html")
    if r.returncode != 0:
        sys.exit(f"FAIL: crucible report exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    if r.stdout.strip() != report or not os.path.isfile(report):
        sys.exit(f"FAIL: crucible report should print and write {report}; it printed {r.stdout.strip()!r}")
    missing = run([args.crucible, "report", os.path.join(work, "missing")], 60, "crucible report (missing run)")
    failures = []
    if missing.returncode != 2 or "missing" not in missing.stderr:
        failures.append(f"`crucible report` of a missing run folder exited {missing.returncode} (expected 2, naming "
                        f"the folder): {missing.stderr.strip()!r}")

    # What the page must show, from the run's own files.
    records = []
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            if line.strip():
                records.append(json.loads(line))
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    expected_verdict = (summary.get("bottleneck") or {}).get("verdict")
    if not expected_verdict:
        train_verdicts = [x["verdict"] for x in records if x.get("type") == "train" and isinstance(x.get("verdict"), str)]
        expected_verdict = train_verdicts[-1] if train_verdicts else None
    expected_points = {
        sid: sum(1 for x in records if x.get("type") == t and is_number(x.get(k)) and is_number(x.get("step")))
        for sid, (t, k) in SERIES.items()
    }

    # The browser's view: a screenshot and the DOM after rendering.
    profile = tempfile.mkdtemp(prefix="crucible-chromium-")
    try:
        png = os.path.join(work, "report.png")
        url = "file://" + report
        shot = run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--window-size=1100,2600",
                    f"--screenshot={png}", url], 120, "chromium --screenshot")
        dom = run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--window-size=1100,2600", "--dump-dom",
                   url], 120, "chromium --dump-dom")
    finally:
        shutil.rmtree(profile, ignore_errors=True)

    if not os.path.isfile(png):
        failures.append(f"chromium wrote no screenshot (exit {shot.returncode}): {shot.stderr[-2000:]}")
    else:
        img = Image.open(png).convert("RGB")
        w, h = img.size
        pixels = w * h
        colours = img.getcolors(maxcolors=pixels)
        colours.sort(reverse=True)
        background_count, background = colours[0]
        non_white = sum(n for n, c in colours if min(c) < 250)
        non_background = pixels - background_count
        print(f"screenshot {png}: {w}x{h}, {len(colours)} distinct colours, {100 * non_white / pixels:.1f}% non-white, "
              f"{100 * non_background / pixels:.1f}% differ from the background {background}")
        if non_white < 0.01 * pixels or non_background < 0.01 * pixels:
            failures.append("the screenshot is blank (under 1% of its pixels are drawn)")
        if len(colours) <= 20:
            failures.append(f"the screenshot has only {len(colours)} distinct colours (a drawn report has many more)")

    reader = DomReader()
    reader.feed(dom.stdout)
    print(f"DOM: {len(dom.stdout)} characters, #verdict = {reader.verdict!r} (summary.json: {expected_verdict!r}), "
          f"{len(reader.paths)} series paths, {reader.scripts} <script>, {len(reader.urls)} external URLs")
    if dom.returncode != 0 or "</html>" not in dom.stdout:
        failures.append(f"chromium --dump-dom failed (exit {dom.returncode}): {dom.stderr[-2000:]}")
    if expected_verdict is None:
        failures.append("the run recorded no bottleneck verdict (summary.json's bottleneck.verdict, or a train "
                        "record's verdict)")
    elif (reader.verdict or "").strip() != expected_verdict:
        failures.append(f"#verdict shows {reader.verdict!r}, summary.json says {expected_verdict!r}")
    if reader.scripts:
        failures.append(f"the page has {reader.scripts} <script> element(s); it must have none")
    if reader.urls:
        failures.append(f"the page loads external resources: {reader.urls}")

    drawn = {}
    for p in reader.paths:
        sid = p.get("data-series")
        commands = len(re.findall(r"[ML]", p.get("d") or ""))
        print(f"  {sid} (run {p.get('data-run')}): {commands} M/L commands, data-points={p.get('data-points')}, "
              f"{expected_points.get(sid)} records carry it")
        if sid in drawn:
            failures.append(f"series {sid} is drawn twice")
        drawn[sid] = commands
        if sid not in expected_points:
            failures.append(f"unexpected series {sid!r}")
            continue
        if commands != expected_points[sid]:
            failures.append(f"series {sid}: {commands} points drawn, {expected_points[sid]} records in metrics.jsonl")
        if p.get("data-points") != str(commands):
            failures.append(f"series {sid}: data-points={p.get('data-points')} but d has {commands} commands")
        if p.get("data-run") != "r":
            failures.append(f"series {sid}: data-run={p.get('data-run')!r}, expected 'r'")
    for sid, n in expected_points.items():
        if n > 0 and sid not in drawn:
            failures.append(f"series {sid} is missing ({n} records in metrics.jsonl carry it)")
    if expected_points["train.loss"] == 0 or expected_points["eval.test_acc"] == 0 or \
            expected_points["eval.test_acc_ema"] == 0:
        failures.append(f"the run logged too little to check: {expected_points}")

    if failures:
        print("FAIL:\n  " + "\n  ".join(failures), file=sys.stderr)
        return 1
    print(f"ok: {report} renders in headless chromium; verdict {expected_verdict!r}; series {expected_points}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
