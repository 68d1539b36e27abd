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

