// Small COCO detection sets for tests: random-pixel JPEGs written beside an instances JSON.
#pragma once

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace crucible::test {

// A JPEG of random pixels (from `seed`) at `path`.
void write_jpeg(const std::string& path, int width, int height, uint32_t seed);

// A COCO set in `dir`: images (id, width, height) written as JPEGs beside the JSON, with
// `annotations` and `categories` (default: ids 7, 1, 3). Returns the JSON's path.
std::string write_coco(const TempDir& dir, const std::vector<std::tuple<int64_t, int, int>>& images,
                       nlohmann::json annotations,
                       nlohmann::json categories = nlohmann::json::array({{{"id", 7}, {"name", "triangle"}},
                                                                          {{"id", 1}, {"name", "rectangle"}},
                                                                          {{"id", 3}, {"name", "ellipse"}}}));

// One annotation, its area w·h (a malformed bbox is a test case too: area 0).
nlohmann::json ann(int64_t id, int64_t image, int64_t category, std::vector<double> bbox, int crowd = 0);

}  // namespace crucible::test
