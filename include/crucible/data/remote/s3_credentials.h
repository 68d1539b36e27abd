// Where S3 credentials come from, in the order the AWS tools look (issue 37): the environment
// (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN), then the shared credentials
// file (AWS_SHARED_CREDENTIALS_FILE, else ~/.aws/credentials) at the profile AWS_PROFILE names
// ("default" when unset). Torch-free; the environment is an argument, so tests need not touch
// the process's.
#pragma once

#include <functional>
#include <string>

#include "crucible/data/remote/s3_sign.h"

namespace crucible::data {

struct FoundS3Credentials {
  S3Credentials credentials;
  std::string source;  // "the environment" or "<file> [profile]", for the log
};

// `env(name)`: the variable's value, or null when unset. bad_input when none is found, naming
// every place looked at (and which key is missing where one half of a pair is set).
FoundS3Credentials find_s3_credentials(const std::function<const char*(const char*)>& env);

}  // namespace crucible::data
