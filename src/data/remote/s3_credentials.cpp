// find_s3_credentials (see s3_credentials.h). The shared credentials file is an INI file of
// `[profile]` sections and `key = value` lines; reading it by hand is ten lines (no Debian INI
// library is worth a dependency for three keys).
#include "crucible/data/remote/s3_credentials.h"

#include <fstream>
#include <map>

#include "crucible/core/error.h"

namespace crucible::data {
namespace {

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

// The `profile` section of an INI file: its keys and values (empty when the file or the section
// is missing; `found` says whether the file could be read).
std::map<std::string, std::string> ini_section(const std::string& path, const std::string& profile, bool* found) {
  std::ifstream in(path);
  *found = static_cast<bool>(in);
  std::map<std::string, std::string> out;
  std::string line, section;
  while (std::getline(in, line)) {
    line = trim(line);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line.front() == '[' && line.back() == ']') {
      section = trim(line.substr(1, line.size() - 2));
      continue;
    }
    const auto eq = line.find('=');
    if (section == profile && eq != std::string::npos) out[trim(line.substr(0, eq))] = trim(line.substr(eq + 1));
  }
  return out;
}

}  // namespace

FoundS3Credentials find_s3_credentials(const std::function<const char*(const char*)>& env) {
  auto get = [&](const char* name) { const char* v = env(name); return std::string(v ? v : ""); };
  const std::string id = get("AWS_ACCESS_KEY_ID"), secret = get("AWS_SECRET_ACCESS_KEY");
  if (!id.empty() && !secret.empty()) return {{id, secret, get("AWS_SESSION_TOKEN")}, "the environment"};
  if (id.empty() != secret.empty()) {
    throw bad_input("S3 credentials: {} is set but {} is not", id.empty() ? "AWS_SECRET_ACCESS_KEY" : "AWS_ACCESS_KEY_ID",
                    id.empty() ? "AWS_ACCESS_KEY_ID" : "AWS_SECRET_ACCESS_KEY");
  }
  std::string file = get("AWS_SHARED_CREDENTIALS_FILE");
  if (file.empty()) file = get("HOME") + "/.aws/credentials";
  const std::string profile = get("AWS_PROFILE").empty() ? "default" : get("AWS_PROFILE");
  bool readable = false;
  const auto keys = ini_section(file, profile, &readable);
  auto key = [&](const char* name) {
    const auto it = keys.find(name);
    return it == keys.end() ? std::string() : it->second;
  };
  const std::string where = file + " [" + profile + "]";
  if (!key("aws_access_key_id").empty() && !key("aws_secret_access_key").empty()) {
    return {{key("aws_access_key_id"), key("aws_secret_access_key"), key("aws_session_token")}, where};
  }
  throw bad_input("no S3 credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not set, and {} {}", file,
                  !readable ? "cannot be read"
                            : keys.empty() ? "has no [" + profile + "] profile (AWS_PROFILE)"
                                           : "[" + profile + "] lacks aws_access_key_id or aws_secret_access_key");
}

}  // namespace crucible::data
