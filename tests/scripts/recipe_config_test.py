#!/usr/bin/env python3
"""configs/resnet50_torchvision.toml is torchvision's ResNet-50 recipe, flag for flag (issue 26).

Reads the train.py command quoted at the top of the config, and checks that each of its flags has
the post's value under the crucible key README.md's table names for it; that the table lists every
flag of references/classification/train.py; and that every key of the config is one `crucible train
--help` knows (a misspelt key would be refused at start-up, far from here).

  recipe_config_test.py --source SRC --crucible BUILD/crucible
"""
import argparse
import re
import shlex
import subprocess
import sys
import tomllib

# The flags of torchvision's references/classification/train.py (get_args_parser, 2024–2026).
TRAIN_PY_FLAGS = """--data-path --model --device --batch-size --epochs --workers --opt --lr --momentum --wd
--weight-decay --norm-weight-decay --bias-weight-decay --transformer-embedding-decay --label-smoothing
--mixup-alpha --cutmix-alpha --lr-scheduler --lr-warmup-epochs --lr-warmup-method --lr-warmup-decay
--lr-step-size --lr-gamma --lr-min --print-freq --output-dir --resume --start-epoch --cache-dataset
--sync-bn --test-only --auto-augment --ra-magnitude --augmix-severity --random-erase --amp --world-size
--dist-url --model-ema --model-ema-steps --model-ema-decay --use-deterministic-algorithms --interpolation
--val-resize-size --val-crop-size --train-crop-size --clip-grad-norm --ra-sampler --ra-reps --weights
--backend --use-v2""".split()

# How a flag's value reads as a crucible value (the rest: the number or string as it is).
TRANSLATE = {
    ("--auto-augment", "ta_wide"): "trivialaugment_wide",
    ("--lr-scheduler", "cosineannealinglr"): "cosine",
    ("--norm-weight-decay", "0.0"): False,
    ("--model-ema", None): True,
    ("--ra-sampler", None): "repeated",
}
# Keys the table gives as prose for these flags.
KEY_OF = {"--norm-weight-decay": "optim.decay_bias_and_norm", "--ra-sampler": "data.sampler"}


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", required=True)
    ap.add_argument("--crucible", required=True)
    a = ap.parse_args()
    path = a.source + "/configs/resnet50_torchvision.toml"
    text = open(path).read()
    config = tomllib.loads(text)
    readme = open(a.source + "/README.md").read()

    # The command in the header comment.
    m = re.search(r"Its command:\n((?:#   .*\n)+)", text)
    if not m:
        fail(path + ": no train.py command in the header")
    command = " ".join(line[1:].strip().rstrip("\\") for line in m.group(1).splitlines())
    tokens = shlex.split(command)
    tokens = tokens[tokens.index("train.py") + 1:]
    flags = {}
    i = 0
    while i < len(tokens):
        flag = tokens[i]
        value = tokens[i + 1] if i + 1 < len(tokens) and not tokens[i + 1].startswith("--") else None
        flags[flag] = value
        i += 2 if value is not None else 1
    if len(flags) < 15:
        fail(f"only {len(flags)} flags read from the command: {command}")

    # The README table: flag(s) → key(s).
    table = {}
    for row in re.findall(r"^\| (`--[^|]+) \| ([^|]+) \|$", readme, re.M):
        names = re.findall(r"`(--[a-z0-9-]+)`", row[0])
        keys = re.findall(r"`([a-z_]+\.[a-z_0-9]+)", row[1])
        for j, n in enumerate(names):
            table[n] = keys[j] if len(keys) == len(names) else (keys[0] if keys else None)
    missing = [f for f in TRAIN_PY_FLAGS if f not in table]
    if missing:
        fail("README's train.py table lacks " + ", ".join(missing))

    checked = 0
    for flag, value in flags.items():
        if flag in ("--model",) and value is None:
            fail("--model without a value")
        key = KEY_OF.get(flag) or table.get(flag)
        if key is None:
            fail(f"{flag}: no crucible key in README's table")
        section, name = key.split(".")
        if section not in config or name not in config[section]:
            fail(f"{flag} {value}: {key} is not set in {path}")
        got = config[section][name]
        want = TRANSLATE.get((flag, value), value)
        if isinstance(got, bool) or isinstance(want, bool):
            ok = got == want
        elif isinstance(got, (int, float)):
            ok = float(got) == float(want)
        else:
            ok = str(got) == str(want)
        if not ok:
            fail(f"{flag} {value}: {key} = {got!r} in the config, expected {want!r}")
        checked += 1

    # Every key of the config is one crucible knows.
    help_text = subprocess.run([a.crucible, "train", "--help"], capture_output=True, text=True).stdout
    known, section = set(), None
    for line in help_text.splitlines():
        s = re.match(r"^  \[([a-z]+)\]$", line)
        if s:
            section = s.group(1)
            continue
        k = re.match(r"^    ([a-z_0-9]+)\s+=", line)
        if k and section:
            known.add(section + "." + k.group(1))
    if len(known) < 50:
        fail(f"read only {len(known)} keys from `crucible train --help`")
    unknown = [f"{s}.{k}" for s, keys in config.items() for k in keys if f"{s}.{k}" not in known]
    if unknown:
        fail("keys crucible does not know: " + ", ".join(unknown))
    print(f"ok: {checked} flags of the recipe's command carry the post's values; {len(TRAIN_PY_FLAGS)} train.py "
          f"flags in README's table; {sum(len(v) for v in config.values())} config keys known")


if __name__ == "__main__":
    main()
