// torchvision.ops' box functions on [N, 4] xyxy boxes, the same ATen operations in the same order
// (so the same values, bit for bit, on the libtorch crucible is built against): box_area,
// box_iou, generalized_box_iou, nms (the CPU kernel's loop: scores sorted stably, highest first;
// a box suppressed when its IoU with a kept one is above the threshold) and batched_nms (per
// category: above 4000 coordinates on the CPU one nms per category then the kept sorted by score,
// else every box moved by its category times the largest coordinate + 1 and one nms, as
// torchvision chooses). CPU tensors, and CUDA ones in the CUDA build: there nms is nms_by_mask.
// Issue 48.
#pragma once

#include <ATen/core/Tensor.h>

namespace crucible::nn {

at::Tensor box_area(const at::Tensor& boxes);
at::Tensor box_iou(const at::Tensor& boxes1, const at::Tensor& boxes2);              // [N, M]
at::Tensor generalized_box_iou(const at::Tensor& boxes1, const at::Tensor& boxes2);  // [N, M]
// The kept boxes' indices (int64), highest score first.
at::Tensor nms(const at::Tensor& boxes, const at::Tensor& scores, double iou_threshold);
// nms as torchvision's CUDA kernel divides it, in ATen operations on the boxes' device: every
// pair's IoU in score order against the threshold (compared as the loop compares, in double),
// packed 8 to a byte, copied to the host once, then the sequential pass. The same kept indices
// as the loop; nms() takes it for boxes off the CPU (a GPU's detections), and on the CPU the
// tests compare it with torchvision.
at::Tensor nms_by_mask(const at::Tensor& boxes, const at::Tensor& scores, double iou_threshold);
at::Tensor batched_nms(const at::Tensor& boxes, const at::Tensor& scores, const at::Tensor& idxs,
                       double iou_threshold);

}  // namespace crucible::nn
