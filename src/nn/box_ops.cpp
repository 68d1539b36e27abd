// torchvision.ops' box functions (box_ops.h), after torchvision/ops/boxes.py and its CPU nms kernel.
#include "crucible/nn/box_ops.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "crucible/core/error.h"

namespace crucible::nn {
namespace {

void check_boxes(const at::Tensor& b, const char* what) {
  if (b.dim() != 2 || b.size(1) != 4) {
    throw bad_input("{}: expected boxes of shape [N, 4], found {} dimensions", what, b.dim());
  }
}

// _upcast: half-precision boxes computed in float32, as torchvision does against overflow.
at::Tensor upcast(const at::Tensor& t) {
  if (t.is_floating_point()) return t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16 ? t.to(at::kFloat) : t;
  return t.scalar_type() == at::kInt || t.scalar_type() == at::kLong ? t : t.to(at::kInt);
}

// _box_inter_union
std::pair<at::Tensor, at::Tensor> inter_union(const at::Tensor& boxes1, const at::Tensor& boxes2) {
  const at::Tensor area1 = box_area(boxes1), area2 = box_area(boxes2);
  const at::Tensor lt = at::max(boxes1.unsqueeze(1).narrow(2, 0, 2), boxes2.narrow(1, 0, 2));
  const at::Tensor rb = at::min(boxes1.unsqueeze(1).narrow(2, 2, 2), boxes2.narrow(1, 2, 2));
  const at::Tensor wh = upcast(rb - lt).clamp_min(0);
  const at::Tensor inter = wh.select(2, 0) * wh.select(2, 1);
  const at::Tensor uni = area1.unsqueeze(1) + area2 - inter;
  return {inter, uni};
}

template <typename T>
int64_t nms_loop(const at::Tensor& dets, const at::Tensor& scores, double threshold, int64_t* keep) {
  const at::Tensor x1_t = dets.select(1, 0).contiguous(), y1_t = dets.select(1, 1).contiguous();
  const at::Tensor x2_t = dets.select(1, 2).contiguous(), y2_t = dets.select(1, 3).contiguous();
  const at::Tensor areas_t = (x2_t - x1_t) * (y2_t - y1_t);
  const at::Tensor order_t = std::get<1>(at::sort(scores, /*stable=*/true, /*dim=*/0, /*descending=*/true));
  const int64_t n = dets.size(0);
  std::vector<uint8_t> suppressed(static_cast<size_t>(n), 0);
  const T *x1 = x1_t.data_ptr<T>(), *y1 = y1_t.data_ptr<T>(), *x2 = x2_t.data_ptr<T>(), *y2 = y2_t.data_ptr<T>();
  const T* areas = areas_t.data_ptr<T>();
  const int64_t* order = order_t.data_ptr<int64_t>();
  int64_t kept = 0;
  for (int64_t a = 0; a < n; ++a) {
    const int64_t i = order[a];
    if (suppressed[i]) continue;
    keep[kept++] = i;
    for (int64_t b = a + 1; b < n; ++b) {
      const int64_t j = order[b];
      if (suppressed[j]) continue;
      const T w = std::max(static_cast<T>(0), std::min(x2[i], x2[j]) - std::max(x1[i], x1[j]));
      const T h = std::max(static_cast<T>(0), std::min(y2[i], y2[j]) - std::max(y1[i], y1[j]));
      const T inter = w * h;
      const T ovr = inter / (areas[i] + areas[j] - inter);
      if (ovr > threshold) suppressed[j] = 1;
    }
  }
  return kept;
}

// The threshold a `dtype` IoU is compared with so that `iou > t` in that dtype is `iou > threshold`
// in double, as torchvision's kernels compare (a float32 IoU against a double threshold): the
// largest float32 at or below the threshold.
double threshold_in(at::ScalarType dtype, double threshold) {
  if (dtype != at::kFloat) return threshold;
  float t = static_cast<float>(threshold);
  if (static_cast<double>(t) > threshold) t = std::nextafter(t, -std::numeric_limits<float>::infinity());
  return static_cast<double>(t);
}

}  // namespace

at::Tensor box_area(const at::Tensor& boxes) {
  check_boxes(boxes, "box_area");
  return (boxes.select(1, 2) - boxes.select(1, 0)) * (boxes.select(1, 3) - boxes.select(1, 1));
}

at::Tensor box_iou(const at::Tensor& boxes1, const at::Tensor& boxes2) {
  check_boxes(boxes1, "box_iou"), check_boxes(boxes2, "box_iou");
  const auto [inter, uni] = inter_union(boxes1, boxes2);
  return inter / uni;
}

at::Tensor generalized_box_iou(const at::Tensor& boxes1, const at::Tensor& boxes2) {
  check_boxes(boxes1, "generalized_box_iou"), check_boxes(boxes2, "generalized_box_iou");
  const auto [inter, uni] = inter_union(boxes1, boxes2);
  const at::Tensor iou = inter / uni;
  const at::Tensor lti = at::min(boxes1.unsqueeze(1).narrow(2, 0, 2), boxes2.narrow(1, 0, 2));
  const at::Tensor rbi = at::max(boxes1.unsqueeze(1).narrow(2, 2, 2), boxes2.narrow(1, 2, 2));
  const at::Tensor whi = upcast(rbi - lti).clamp_min(0);
  const at::Tensor areai = whi.select(2, 0) * whi.select(2, 1);
  return iou - (areai - uni) / areai;
}

at::Tensor nms(const at::Tensor& boxes, const at::Tensor& scores, double iou_threshold) {
  check_boxes(boxes, "nms");
  if (scores.dim() != 1 || scores.size(0) != boxes.size(0) || scores.scalar_type() != boxes.scalar_type()) {
    throw bad_input("nms: expected one score per box of the boxes' dtype, found {} scores for {} boxes",
                    scores.numel(), boxes.size(0));
  }
  if (boxes.numel() == 0) return at::empty({0}, boxes.options().dtype(at::kLong));
  // torchvision's nms_autocast: half and bfloat16 boxes (a detector under autocast) in float32.
  const bool reduced = boxes.scalar_type() == at::kHalf || boxes.scalar_type() == at::kBFloat16;
  const auto dtype = reduced ? at::kFloat : boxes.scalar_type();
  if (!boxes.is_cpu()) return nms_by_mask(boxes.to(dtype), scores.to(dtype), iou_threshold);
  // torchvision's CPU kernel; outside the step: post-processing of predictions
  const at::Tensor dets = boxes.to(at::kCPU, dtype), s = scores.to(at::kCPU, dtype);
  at::Tensor keep = at::empty({dets.size(0)}, dets.options().dtype(at::kLong));
  int64_t kept = 0;
  AT_DISPATCH_FLOATING_TYPES(dets.scalar_type(), "crucible_nms", [&] {
    kept = nms_loop<scalar_t>(dets, s, iou_threshold, keep.data_ptr<int64_t>());
  });
  return keep.narrow(0, 0, kept).to(boxes.device());
}

at::Tensor nms_by_mask(const at::Tensor& boxes, const at::Tensor& scores, double iou_threshold) {
  check_boxes(boxes, "nms");
  const int64_t n = boxes.size(0);
  if (n == 0) return at::empty({0}, boxes.options().dtype(at::kLong));
  const at::Tensor order = std::get<1>(at::sort(scores, /*stable=*/true, /*dim=*/0, /*descending=*/true));
  const at::Tensor b = boxes.index_select(0, order);
  const at::Tensor x1 = b.select(1, 0), y1 = b.select(1, 1), x2 = b.select(1, 2), y2 = b.select(1, 3);
  const at::Tensor areas = (x2 - x1) * (y2 - y1);
  // Row i (the higher score), column j: the loop's w, h, inter and IoU, the same operations.
  const at::Tensor w = (at::min(x2.unsqueeze(1), x2.unsqueeze(0)) - at::max(x1.unsqueeze(1), x1.unsqueeze(0))).clamp_min(0);
  const at::Tensor h = (at::min(y2.unsqueeze(1), y2.unsqueeze(0)) - at::max(y1.unsqueeze(1), y1.unsqueeze(0))).clamp_min(0);
  const at::Tensor inter = w * h;
  const at::Tensor iou = inter / (areas.unsqueeze(1) + areas.unsqueeze(0) - inter);
  const at::Tensor over = (iou > threshold_in(b.scalar_type(), iou_threshold)).triu(1).to(at::kByte);
  // Eight columns a byte, then one copy to the host (n * n / 8 bytes).
  const int64_t bytes = (n + 7) / 8;
  const at::Tensor bits = at::tensor(std::vector<int64_t>{1, 2, 4, 8, 16, 32, 64, 128}, at::kLong)
                              .to(over.device())
                              .to(at::kByte);
  const at::Tensor packed = at::constant_pad_nd(over, {0, bytes * 8 - n})
                                .view({n, bytes, 8})
                                .mul(bits)
                                .sum(2)  // int64: at most 255
                                .to(at::kByte)
                                // outside the step: post-processing of predictions
                                .to(at::kCPU)
                                .contiguous();
  // The sequential pass, as torchvision's CUDA kernel's host part: a kept box removes the boxes
  // its row marks.
  const uint8_t* mask = packed.data_ptr<uint8_t>();
  std::vector<uint8_t> removed(static_cast<size_t>(bytes), 0);
  std::vector<int64_t> kept;
  for (int64_t i = 0; i < n; ++i) {
    if ((removed[static_cast<size_t>(i / 8)] >> (i % 8)) & 1) continue;
    kept.push_back(i);
    const uint8_t* row = mask + i * bytes;
    for (int64_t k = i / 8; k < bytes; ++k) removed[static_cast<size_t>(k)] |= row[k];
  }
  return order.index_select(0, at::tensor(kept, at::kLong).to(order.device()));
}

at::Tensor batched_nms(const at::Tensor& boxes, const at::Tensor& scores, const at::Tensor& idxs,
                       double iou_threshold) {
  check_boxes(boxes, "batched_nms");
  const int64_t limit = boxes.is_cuda() ? 20000 : 4000;
  if (boxes.numel() > limit) {  // _batched_nms_vanilla
    at::Tensor keep_mask = at::zeros_like(scores, scores.options().dtype(at::kBool));
    const at::Tensor classes = std::get<0>(at::_unique(idxs, /*sorted=*/true));
    for (int64_t c = 0; c < classes.size(0); ++c) {
      const at::Tensor current = at::where(idxs == classes[c])[0];
      const at::Tensor kept = nms(boxes.index_select(0, current), scores.index_select(0, current), iou_threshold);
      keep_mask.index_fill_(0, current.index_select(0, kept), true);
    }
    const at::Tensor keep_indices = at::where(keep_mask)[0];
    return keep_indices.index_select(0, std::get<1>(scores.index_select(0, keep_indices).sort(0, /*descending=*/true)));
  }
  if (boxes.numel() == 0) return at::empty({0}, boxes.options().dtype(at::kLong));  // _batched_nms_coordinate_trick
  const at::Tensor max_coordinate = boxes.max();
  const at::Tensor offsets = idxs.to(boxes.options()) * (max_coordinate + at::ones({}, boxes.options()));
  return nms(boxes + offsets.unsqueeze(1), scores, iou_threshold);
}

}  // namespace crucible::nn
