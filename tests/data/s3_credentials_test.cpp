// S3 credentials in the AWS tools' order (data/remote/s3_credentials.h): the environment, then the
// shared credentials file at AWS_PROFILE's profile; a miss names every place looked at.
#include "crucible/data/remote/s3_credentials.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "crucible/core/file.h"
#include "test_util.h"

namespace crucible::data {
namespace {

std::function<const char*(const char*)> env_of(const std::map<std::string, std::string>& vars) {
  return [vars](const char* name) -> const char* {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

TEST(S3Credentials, EnvironmentThenSharedFileAtTheProfile) {
  test::TempDir d;
  write_file_atomic(d / "credentials",
                    "# comment\n[default]\naws_access_key_id = DEFAULTKEY\naws_secret_access_key=defaultsecret\n\n"
                    "[prod]\n aws_access_key_id = PRODKEY \naws_secret_access_key = prodsecret\n"
                    "aws_session_token = tok\n");
  const std::string file = d / "credentials";
  // The environment wins over the file.
  auto found = find_s3_credentials(env_of({{"AWS_ACCESS_KEY_ID", "ENVKEY"}, {"AWS_SECRET_ACCESS_KEY", "envsecret"},
                                           {"AWS_SESSION_TOKEN", "envtok"}, {"AWS_SHARED_CREDENTIALS_FILE", file}}));
  EXPECT_EQ(found.credentials.access_key, "ENVKEY");
  EXPECT_EQ(found.credentials.secret_key, "envsecret");
  EXPECT_EQ(found.credentials.session_token, "envtok");
  EXPECT_EQ(found.source, "the environment");
  found = find_s3_credentials(env_of({{"AWS_SHARED_CREDENTIALS_FILE", file}}));
  EXPECT_EQ(found.credentials.access_key, "DEFAULTKEY");
  EXPECT_EQ(found.credentials.secret_key, "defaultsecret");
  EXPECT_EQ(found.source, file + " [default]");
  found = find_s3_credentials(env_of({{"AWS_SHARED_CREDENTIALS_FILE", file}, {"AWS_PROFILE", "prod"}}));
  EXPECT_EQ(found.credentials.access_key, "PRODKEY");
  EXPECT_EQ(found.credentials.session_token, "tok");
  // HOME's ~/.aws/credentials when AWS_SHARED_CREDENTIALS_FILE is unset.
  std::filesystem::create_directories(d / ".aws");
  write_file_atomic(d / ".aws/credentials", "[default]\naws_access_key_id=H\naws_secret_access_key=h\n");
  EXPECT_EQ(find_s3_credentials(env_of({{"HOME", d.path()}})).credentials.access_key, "H");
}

TEST(S3Credentials, AMissNamesWhereItLooked) {
  test::TempDir d;
  write_file_atomic(d / "credentials", "[default]\naws_access_key_id = K\n");
  const std::string file = d / "credentials";
  test::expect_bad_input([&] { find_s3_credentials(env_of({{"AWS_SHARED_CREDENTIALS_FILE", file}})); },
                         {"AWS_ACCESS_KEY_ID", file.c_str(), "[default] lacks", "aws_secret_access_key"});
  test::expect_bad_input(
      [&] { find_s3_credentials(env_of({{"AWS_SHARED_CREDENTIALS_FILE", file}, {"AWS_PROFILE", "staging"}})); },
      {"has no [staging] profile"});
  test::expect_bad_input([&] { find_s3_credentials(env_of({{"AWS_SHARED_CREDENTIALS_FILE", d / "none"}})); },
                         {"cannot be read"});
  test::expect_bad_input([&] { find_s3_credentials(env_of({{"AWS_ACCESS_KEY_ID", "K"}})); },
                         {"AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not"});
}

}  // namespace
}  // namespace crucible::data
