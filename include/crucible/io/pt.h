// PyTorch `.pt` files (the zip format of torch.save) read without libtorch: a restricted
// unpickler accepts only what a state_dict needs — containers, numbers, strings, tensors and
// their storages — and refuses any other global by name (the C++ equivalent of
// torch.load(weights_only=True); nothing in the file is ever executed). Nested dicts
// ({"model": …, "optimizer": …}) flatten to dot-joined names; a DDP `module.` prefix is
// stripped and reported (X4); tensors saved on a GPU are read to CPU (T13). Torch-free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "crucible/io/array.h"

namespace crucible::io {

struct PtContents {
  // Tensors by flattened name ("model.conv1.weight", "optimizer.state.0.exp_avg"), in file
  // order. Arrays are views (offset, strides) into their storage's bytes, so tensors that
  // shared a storage in Python share bytes here.
  std::vector<NamedArray> tensors;
  // Non-tensor values, one line each: "<name>: <type> <short value>" (e.g. "epoch: int 3").
  std::vector<std::string> skipped;
  // What was adjusted, for the user: the stripped `module.` prefix, GPU locations read to CPU.
  std::vector<std::string> notes;
};

// Reads a torch.save file. Throws bad_input naming the file, the member or pickle byte
// offset, and what was expected (not a zip, a legacy or TorchScript archive, a refused
// global, a storage smaller than a tensor needs, a malformed pickle).
PtContents read_pt(const std::string& path);

// The same from bytes in memory (for fuzzing); `owner` keeps `data` alive if the result may
// view it (may be null when `data` outlives the result). `name` names the input in messages.
PtContents parse_pt(const uint8_t* data, size_t size, const std::string& name, std::shared_ptr<const void> owner);

}  // namespace crucible::io
