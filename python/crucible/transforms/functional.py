"""torchvision.transforms.v2.functional's operations on uint8 tensors [..., 1 or 3, H, W],
computed by crucible (the same code as the loaders' augmentations). Each returns a new tensor on
the input's device; the arithmetic follows torchvision's uint8 path: point operations give its
bytes, geometric ones its coordinates (see the README's table of differences).

    from crucible.transforms import functional as F
    out = F.adjust_contrast(img, 1.5)
    out = F.affine(img, angle=10.0, translate=[3, 0], scale=1.0, shear=[0.0, 0.0])
"""

import torch

from .. import _native

__all__ = ["adjust_brightness", "adjust_saturation", "adjust_contrast", "adjust_sharpness", "posterize",
           "solarize", "autocontrast", "equalize", "invert", "affine", "rotate", "augment"]


def _mode(interpolation):
    name = getattr(interpolation, "value", interpolation)
    if name not in ("nearest", "bilinear"):
        raise ValueError(f"interpolation: 'nearest' or 'bilinear' (torchvision's modes for tensors), found {name!r}")
    return name


def _fill(fill):
    if fill is None:
        return []
    return [float(x) for x in (fill if isinstance(fill, (list, tuple)) else [fill])]


def _each(image, fn):
    """Applies fn(numpy [C, H, W] view) to each image of a uint8 [..., C, H, W] tensor's copy."""
    if not isinstance(image, torch.Tensor) or image.dtype != torch.uint8:
        raise TypeError(f"crucible.transforms.functional takes uint8 tensors, found "
                        f"{image.dtype if isinstance(image, torch.Tensor) else type(image).__name__}")
    if image.ndim < 3 or image.shape[-3] not in (1, 3):
        raise ValueError(f"expected [..., 1 or 3, H, W], found shape {list(image.shape)}")
    out = image.detach().to("cpu", copy=True).contiguous()
    flat = out.reshape(-1, *out.shape[-3:]).numpy()
    for k in range(flat.shape[0]):
        fn(flat[k])
    return out.to(image.device)


def _point(name, *args):
    return lambda a: _native.image_op(a, name, [float(x) for x in args], "nearest", [])


def adjust_brightness(inpt, brightness_factor):
    return _each(inpt, _point("adjust_brightness", brightness_factor))


def adjust_saturation(inpt, saturation_factor):
    return _each(inpt, _point("adjust_saturation", saturation_factor))


def adjust_contrast(inpt, contrast_factor):
    return _each(inpt, _point("adjust_contrast", contrast_factor))


def adjust_sharpness(inpt, sharpness_factor):
    return _each(inpt, _point("adjust_sharpness", sharpness_factor))


def posterize(inpt, bits):
    return _each(inpt, _point("posterize", int(bits)))


def solarize(inpt, threshold):
    return _each(inpt, _point("solarize", threshold))


def autocontrast(inpt):
    return _each(inpt, _point("autocontrast"))


def equalize(inpt):
    return _each(inpt, _point("equalize"))


def invert(inpt):
    return _each(inpt, _point("invert"))


def affine(inpt, angle, translate, scale, shear, interpolation="nearest", fill=None, center=None):
    if isinstance(shear, (int, float)):
        shear = [float(shear), 0.0]
    shear = list(shear)
    if len(shear) == 1:
        shear = [shear[0], shear[0]]
    args = [float(angle), float(translate[0]), float(translate[1]), float(scale), float(shear[0]), float(shear[1])]
    if center is not None:
        args += [float(center[0]), float(center[1])]
    mode, f = _mode(interpolation), _fill(fill)
    return _each(inpt, lambda a: _native.image_op(a, "affine", args, mode, f))


def rotate(inpt, angle, interpolation="nearest", expand=False, center=None, fill=None):
    if expand or center is not None:
        raise NotImplementedError("crucible's rotate keeps the size and turns about the centre "
                                  "(expand=False, center=None), as its augmentations use it")
    mode, f = _mode(interpolation), _fill(fill)
    return _each(inpt, lambda a: _native.image_op(a, "rotate", [float(angle)], mode, f))


def augment(inpt, name, *, seed=0, epoch=0, index=0, policy="imagenet", interpolation="", fill=None, **options):
    """A policy ("randaugment", "trivialaugment_wide", "autoaugment", "augmix") applied to each
    image as the loader applies it to sample `index` of `epoch` under `seed` (the stream's seed);
    options are torchvision's (num_ops, magnitude, num_magnitude_bins, severity, ...)."""
    numbers = {k: float(v) for k, v in options.items()}
    mode = "" if not interpolation else _mode(interpolation)
    f = _fill(fill)
    return _each(inpt, lambda a: _native.augment_image(a, name, numbers, getattr(policy, "value", policy), mode, f,
                                                      int(seed), int(epoch), int(index)))


def plan(name, *, seed=0, epoch=0, index=0, width=224, height=224, policy="imagenet", **options):
    """[(op, bin, magnitude)] the policy draws for sample (seed, epoch, index) (not augmix)."""
    numbers = {k: float(v) for k, v in options.items()}
    return _native.augment_plan(name, numbers, getattr(policy, "value", policy), int(seed), int(epoch), int(index),
                                int(width), int(height))


def augmix_plan(*, seed=0, epoch=0, index=0, width=224, height=224, **options):
    """AugMix's draws for sample (seed, epoch, index): ((m0, m1), chain weights before m1 scales
    them, [[(op, bin, signed magnitude)] per chain]), in torchvision's order of draws."""
    numbers = {k: float(v) for k, v in options.items()}
    return _native.augmix_plan(numbers, int(seed), int(epoch), int(index), int(width), int(height))


def autoaugment_policy(policy="imagenet"):
    """AutoAugment's sub-policies as torchvision's _policies lists them: ((op, p, bin or None), ...)."""
    return _native.autoaugment_policy(getattr(policy, "value", policy))
