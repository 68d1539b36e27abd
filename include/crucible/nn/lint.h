// Model lints reported at start-up (M7): a bias right before a BatchNorm is wasted — the norm
// subtracts the mean, bias included — so a convolution or linear layer with a bias whose next
// registered sibling is a BatchNorm is named.
#pragma once

#include <string>
#include <vector>

namespace torch::nn {
class Module;
}

namespace crucible::nn {

// One line per finding: "conv1 (Conv2d with bias) feeds bn1 (BatchNorm2d): …".
std::vector<std::string> lint_bias_before_norm(torch::nn::Module& module);

}  // namespace crucible::nn
