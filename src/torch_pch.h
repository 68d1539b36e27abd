// Precompiled header for the torch translation units of the `crucible` library: the frontend
// headers (tier 3) that cost ~10 s per file to parse. Never included by name.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
