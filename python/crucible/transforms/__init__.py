"""crucible's image transforms for PyTorch users: torchvision's operations and augmentation
policies computed by crucible's C++ code (the code the loaders run on their threads).

`crucible.transforms.functional` has torchvision.transforms.v2.functional's names and arguments
for uint8 [..., C, H, W] tensors. The loaders take the policies by name (augment="...").
"""
from . import functional

__all__ = ["functional"]
