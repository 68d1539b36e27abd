#!/usr/bin/python3
"""scripts/audit-deps can fail: what it must report on a tree that lacks a package.

Run by CTest (DependencyAudit.*) with the build folder: the build itself must pass the audit
(that is the test DependencyAudit.Build, and DependencyAudit.DemoGroup for what `make demo`
installs); here each case breaks one thing — a header that no package owns, a package dropped
from every list of a copy of scripts/setup, a build package moved to the test group, a Python
module installed by hand — and asserts the report names it, its owner and the fix. To add a
case: write a method that runs audit() with a broken input and asserts on the exit code and the
message.

    tests/scripts/audit_deps_test.py --build build [--provided DIR ...] [unittest options]
"""
import os
import re
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
AUDIT = os.path.join(ROOT, "scripts", "audit-deps")
BUILD = None


PROVIDED = []  # --provided DIR pairs passed through (a build against the PyPI libtorch)


def audit(*args, env=None):
    r = subprocess.run(["/usr/bin/python3", AUDIT, *args, *PROVIDED], capture_output=True, text=True, env=env,
                       timeout=120)
    return r.returncode, r.stdout + r.stderr


LIST_RE = re.compile(r"^(\w+_packages)=\((.*?)^\)", re.S | re.M)  # scripts/setup's lists


def setup_edited(tmp, packages, into=None):
    """A copy of scripts/setup with `packages` (one name or several) taken out of every list, and
    put into the list `into` (e.g. "test_packages") when given."""
    with open(os.path.join(ROOT, "scripts", "setup"), encoding="utf-8") as f:
        text = f.read()
    assert into is None or into in {m.group(1) for m in LIST_RE.finditer(text)}, f"scripts/setup has no list {into}"
    for package in [packages] if isinstance(packages, str) else packages:
        word = re.compile(rf"(?<![\w.+-]){re.escape(package)}(?![\w.+-])")
        assert any(word.search(m.group(2)) for m in LIST_RE.finditer(text)), f"{package} is in no list of scripts/setup"

        def edit(m):
            lines = m.group(2).split("\n")
            body = "\n".join(l if l.lstrip().startswith("#") else word.sub("", l) for l in lines)
            if m.group(1) == into:
                body += f"  {package}\n"
            return f"{m.group(1)}=({body})"

        text = LIST_RE.sub(edit, text)
    path = os.path.join(tmp, "setup")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def setup_without(tmp, *packages):
    return setup_edited(tmp, packages)


def listed(setup, group):
    r = subprocess.run(["bash", setup, "--list", group], capture_output=True, text=True, check=True)
    return r.stdout.split()


def build_read(prefix):
    """True if the build read a header under `prefix` (ninja's dependency records)."""
    r = subprocess.run(["ninja", "-C", BUILD, "-t", "deps"], capture_output=True, text=True)
    return any(l.strip().startswith(prefix) for l in r.stdout.splitlines())


class DependencyAudit(unittest.TestCase):
    def test_a_header_owned_by_no_package_is_reported(self):
        with tempfile.TemporaryDirectory() as tmp:
            fake = os.path.join(tmp, "include", "fake_dependency.h")
            os.makedirs(os.path.dirname(fake))
            with open(fake, "w") as f:
                f.write("#pragma once\n")
            rc, out = audit("--no-build", "--header", fake, "--header", "/usr/include/zlib.h")
            self.assertEqual(rc, 1, out)
            self.assertIn(fake, out)
            self.assertIn("owned by no Debian package", out)
            self.assertNotIn("zlib.h", out)  # zlib1g-dev is listed: not reported
            # The same header alone in a build-like list passes once it is gone from the inputs.
            rc, out = audit("--no-build", "--header", "/usr/include/zlib.h")
            self.assertEqual(rc, 0, out)

    def test_a_package_dropped_from_setup_is_named_with_its_headers(self):
        # libgloo-dev: libtorch-dev does not pull it in; the torch build reads its headers
        # through c10d (this is the defect a fresh machine showed). The torch-free builds read
        # libspng-dev's header instead.
        package, prefix = ("libgloo-dev", "/usr/include/gloo/") if build_read("/usr/include/gloo/") else \
                          ("libspng-dev", "/usr/include/spng.h")
        self.assertTrue(build_read(prefix), f"the build read nothing under {prefix}")
        with tempfile.TemporaryDirectory() as tmp:
            rc, out = audit("--build", BUILD, "--setup", setup_without(tmp, package), "--no-python")
            self.assertEqual(rc, 1, out)
            self.assertIn(f"from Debian package {package} (dpkg -S)", out)
            self.assertIn(f"add {package} to", out)
            self.assertRegex(out, r"header " + re.escape(prefix))
        rc, out = audit("--build", BUILD, "--no-python")
        self.assertEqual(rc, 0, out)

    def test_the_copy_of_setup_lists_what_the_edit_says(self):
        # The cases below stand on setup_edited(): the copy must lack the package in every group,
        # or have it in the test group alone.
        with tempfile.TemporaryDirectory() as tmp:
            self.assertIn("libspng-dev", listed(os.path.join(ROOT, "scripts", "setup"), "demo"))
            for group in ("demo", "bench", "test", "torch2"):
                self.assertNotIn("libspng-dev", listed(setup_without(tmp, "libspng-dev"), group))
            moved = setup_edited(tmp, "libspng-dev", into="test_packages")
            self.assertNotIn("libspng-dev", listed(moved, "demo"))
            self.assertIn("libspng-dev", listed(moved, "test"))

    def test_a_build_package_in_the_test_group_fails_the_demo_audit(self):
        # make demo installs `scripts/setup demo` alone: a package that configuring or building
        # reads from must be in that group, not only in the test group's list.
        if not build_read("/usr/include/spng.h"):
            self.skipTest("this build read no spng.h")
        with tempfile.TemporaryDirectory() as tmp:
            moved = setup_edited(tmp, "libspng-dev", into="test_packages")
            rc, out = audit("--build", BUILD, "--setup", moved, "--group", "demo", "--no-python")
            self.assertEqual(rc, 1, out)
            self.assertIn(f"from Debian package libspng-dev (dpkg -S), which {moved} demo neither lists nor pulls in", out)
            self.assertIn("header /usr/include/spng.h", out)
            rc, out = audit("--build", BUILD, "--setup", moved, "--group", "test", "--no-python")
            self.assertEqual(rc, 0, out)  # the test group still has it

    def test_a_package_read_only_by_the_configure_step_is_named(self):
        # find_package(GTest) reads libgtest-dev's CMake files: the configure step's inputs are
        # audited as the compiler's are (libgmock-dev, which depends on it, goes too).
        with open(os.path.join(BUILD, "CMakeCache.txt"), encoding="utf-8") as f:
            if "GTest_DIR:PATH=/usr/" not in f.read():
                self.skipTest("this build found no Debian GTest")
        with tempfile.TemporaryDirectory() as tmp:
            rc, out = audit("--build", BUILD, "--setup", setup_without(tmp, "libgtest-dev", "libgmock-dev"), "--no-python")
            self.assertEqual(rc, 1, out)
            self.assertIn("from Debian package libgtest-dev (dpkg -S)", out)
            self.assertRegex(out, r"cmake file /usr/lib/\S*/cmake/GTest/GTest\w*\.cmake \(read by the configure step\)")

    def test_a_library_from_a_dropped_package_is_named(self):
        # Every build's programs load libspng (libspng0, pulled in by libspng-dev alone).
        with tempfile.TemporaryDirectory() as tmp:
            rc, out = audit("--build", BUILD, "--setup", setup_without(tmp, "libspng-dev"), "--no-python")
            self.assertEqual(rc, 1, out)
            self.assertRegex(out, r"library \S*/libspng\.so\S* \(loaded by \S+\)")
            self.assertIn("from Debian package libspng0 (dpkg -S)", out)
            self.assertIn("header /usr/include/spng.h", out)

    def test_a_python_module_installed_by_hand_is_reported(self):
        with tempfile.TemporaryDirectory() as tmp:
            site = os.path.join(tmp, "site")
            os.makedirs(site)
            with open(os.path.join(site, "handmade_module.py"), "w") as f:
                f.write("X = 1\n")
            user = os.path.join(tmp, "uses.py")
            with open(user, "w") as f:
                f.write("import numpy as np, handmade_module\nfrom no_such_module_anywhere import y\n")  # audit-deps: ignore
            env = dict(os.environ, PYTHONPATH=site)
            rc, out = audit("--no-build", "--python-file", user, env=env)
            self.assertEqual(rc, 1, out)
            self.assertIn(os.path.join(site, "handmade_module.py"), out)
            self.assertIn("'no_such_module_anywhere'", out)
            self.assertNotIn("numpy", out)  # python3-numpy is listed

    def test_a_torch2_oracle_is_looked_up_in_its_venv(self):
        # A file marked for .venv-torch2 (the detection tests) may import what only that venv has
        # (scripts/setup-torch2's oracles); a module it has not is named with that script, and so
        # is a missing venv for the build against it (group torch2). Here a fake tree's venv is a
        # /usr/bin/python3 that also sees one extra folder.
        with tempfile.TemporaryDirectory() as tmp:
            site = os.path.join(tmp, "site")
            os.makedirs(site)
            with open(os.path.join(site, "oracle_only_module.py"), "w") as f:
                f.write("X = 1\n")
            venv_bin = os.path.join(tmp, ".venv-torch2", "bin")
            os.makedirs(venv_bin)
            with open(os.path.join(venv_bin, "python"), "w") as f:
                f.write(f'#!/bin/sh\nPYTHONPATH={site} exec /usr/bin/python3 "$@"\n')
            os.chmod(os.path.join(venv_bin, "python"), 0o755)
            marked, plain = os.path.join(tmp, "test_marked.py"), os.path.join(tmp, "test_plain.py")
            with open(marked, "w") as f:
                f.write("# audit-deps: python .venv-torch2\nimport numpy, oracle_only_module\n")  # audit-deps: ignore
            with open(plain, "w") as f:
                f.write("import oracle_only_module\n")  # audit-deps: ignore
            rc, out = audit("--no-build", "--source", tmp, "--python-file", marked)
            self.assertEqual(rc, 0, out)
            with open(marked, "a") as f:
                f.write("import no_such_module_anywhere\n")  # audit-deps: ignore
            rc, out = audit("--no-build", "--source", tmp, "--python-file", marked)
            self.assertEqual(rc, 1, out)
            self.assertIn("'no_such_module_anywhere'", out)
            self.assertIn("add it to the oracles of scripts/setup-torch2", out)
            self.assertNotIn("oracle_only_module", out)
            rc, out = audit("--no-build", "--source", tmp, "--python-file", plain)  # not marked: Debian's alone
            self.assertEqual(rc, 1, out)
            self.assertIn("'oracle_only_module'", out)
            self.assertIn("add the Debian package that provides it", out)
            os.remove(os.path.join(venv_bin, "python"))
            rc, out = audit("--no-build", "--source", tmp, "--group", "torch2", "--python-file", marked)
            self.assertEqual(rc, 1, out)
            self.assertIn("which is missing: run scripts/setup --torch pypi", out)
            rc, out = audit("--no-build", "--source", tmp, "--group", "test", "--python-file", marked)
            self.assertEqual(rc, 0, out)  # without the venv (Debian's libtorch), those tests skip

    def test_the_tree_imports_are_found(self):
        # The tests' inline Python (C++ strings) and the benchmarks are scanned: numpy, torch,
        # torchvision and PIL must be among the modules checked.
        rc, out = audit("--no-build", "--python-file", os.path.join(ROOT, "bench", "fmnist_baseline.py"), "-v")
        self.assertEqual(rc, 0, out)
        m = re.search(r"(\d+) Python modules", out)
        self.assertIsNotNone(m, out)
        self.assertGreaterEqual(int(m.group(1)), 5, out)


if __name__ == "__main__":
    args = sys.argv[1:]
    if "--build" in args:
        i = args.index("--build")
        BUILD = os.path.abspath(args[i + 1])
        del args[i:i + 2]
    while "--provided" in args:
        i = args.index("--provided")
        PROVIDED += ["--provided", args[i + 1]]
        del args[i:i + 2]
    if BUILD is None:
        sys.exit("usage: audit_deps_test.py --build DIR [unittest options]")
    unittest.main(argv=[sys.argv[0]] + args)
