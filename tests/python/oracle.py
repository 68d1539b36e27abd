"""The test oracles this folder's comparisons need, and what happens when one is missing (issue 46:
no silent oracle).

torchvision.transforms.v2 is the oracle of most comparisons. Debian's torchvision 0.14 (make test,
/usr/bin/python3) has no v2: there a comparison with it skips, and make test counts and prints the
skips (scripts/count-skips). The build against torch 2.x (make test-torch2) sets
CRUCIBLE_REQUIRE_ORACLES=1 in the tests' environment (tests/CMakeLists.txt): there a missing oracle
fails the test, naming the import that failed, instead of skipping.

    from oracle import V2, TV2, TF2, needs_v2

    @needs_v2("CutMix's centre against v2.CutMix")
    class CutMixTest(unittest.TestCase): ...
"""
import functools
import inspect
import os
import unittest

REQUIRED = os.environ.get("CRUCIBLE_REQUIRE_ORACLES") == "1"

try:
    from torchvision.transforms import v2 as TV2
    from torchvision.transforms.v2 import functional as TF2
    V2, V2_ERROR = True, None
except ImportError as e:  # torchvision 0.14 (Debian), or a venv that lost it
    TV2 = TF2 = None
    V2, V2_ERROR = False, e


def missing_message(what):
    return (f"the oracle torchvision.transforms.v2 cannot be imported ({V2_ERROR!r}); {what} compares with it, "
            "and this build requires its oracles (CRUCIBLE_REQUIRE_ORACLES=1, make test-torch2)")


def needs_v2(what):
    """Decorates a TestCase class or a test method that compares with transforms.v2: as it is when
    v2 imports; else skipped (make test) or failing with the import error (make test-torch2)."""
    if V2:
        return lambda obj: obj
    if not REQUIRED:
        return unittest.skip(f"no torchvision.transforms.v2 here ({V2_ERROR}): {what}")

    def fail(obj):
        if inspect.isclass(obj):
            def setUpClass(cls):
                raise AssertionError(missing_message(what))
            obj.setUpClass = classmethod(setUpClass)
            return obj

        @functools.wraps(obj)
        def test(*args, **kwargs):
            raise AssertionError(missing_message(what))
        return test

    return fail


def v2_or_v1(test, what):
    """For a comparison that runs against v2 where it imports and against v1 (Debian's 0.14)
    otherwise: fails `test` (a TestCase) where this build requires its oracles and v2 is missing,
    so that a lost v2 never turns into the looser v1 comparison unnoticed."""
    if not V2 and REQUIRED:
        test.fail(missing_message(what))



def _import(name):
    try:
        return __import__(name, fromlist=["_"]), None
    except ImportError as e:
        return None, e


def needs_module(name, what):
    """As needs_v2, for another oracle module: pycocotools (COCO), yolox (YOLOX's pipeline). Both
    are in .venv-torch2 only (scripts/setup-torch2's oracles), so make test skips (counted) and
    make test-torch2 fails without them."""
    module, error = _import(name)
    if module is not None:
        return lambda obj: obj
    message = (f"the oracle {name} cannot be imported ({error!r}); {what} compares with it, and this build "
               "requires its oracles (CRUCIBLE_REQUIRE_ORACLES=1, make test-torch2)")
    if not REQUIRED:
        return unittest.skip(f"no {name} here ({error}): {what}")

    def fail(obj):
        if inspect.isclass(obj):
            def setUpClass(cls):
                raise AssertionError(message)
            obj.setUpClass = classmethod(setUpClass)
            return obj

        @functools.wraps(obj)
        def test(*args, **kwargs):
            raise AssertionError(message)
        return test

    return fail


REFERENCES_HELP = (
    "torchvision's references/ (references/detection/transforms.py's FixedSizeCrop, group_by_aspect_ratio.py) are in "
    "no package: not in torchvision's wheel, no source distribution on PyPI, not in Debian. To run this comparison, "
    "put the file (from github.com/pytorch/vision, the commit its test names) in a folder named by "
    "CRUCIBLE_TORCHVISION_REFERENCES, under the module name the test imports")


def needs_reference(name, what):
    """For an oracle that is torchvision's reference scripts' own code: as it is where the module
    imports (CRUCIBLE_TORCHVISION_REFERENCES is put on sys.path first); else skipped, in every
    build, saying why and how to provide it — no package can (REFERENCES_HELP). make test and
    make test-torch2 count and print the skip."""
    import sys
    extra = os.environ.get("CRUCIBLE_TORCHVISION_REFERENCES")
    if extra and extra not in sys.path:
        sys.path.insert(0, extra)
    module, error = _import(name)
    if module is not None:
        return lambda obj: obj
    return unittest.skip(f"no {name} ({error}): {what}. {REFERENCES_HELP}")
