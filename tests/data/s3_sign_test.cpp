// AWS Signature Version 4 (data/remote/s3_sign.h) held to the worked example AWS publishes in the S3 API
// reference ("Signature Calculations for the Authorization Header", example GET Object: the
// first 10 bytes of examplebucket/test.txt, 20130524T000000Z, us-east-1, the documentation's
// example keys): every intermediate string and the final signature, as the page prints them.
#include "crucible/data/remote/s3_sign.h"

#include <gtest/gtest.h>

#include "crucible/core/error.h"
#include "test_util.h"

namespace crucible::data {
namespace {

const S3Credentials kExampleKeys{"AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", ""};
constexpr const char* kEmptySha256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

TEST(S3Sign, GetObjectEqualsAwsPublishedExample) {
  S3Request r;
  r.host = "examplebucket.s3.amazonaws.com";
  r.path = "/test.txt";
  r.headers = {{"Range", "bytes=0-9"}};
  const S3Signature s = sign_s3_request(r, kExampleKeys, "us-east-1", "20130524T000000Z");
  EXPECT_EQ(s.canonical_request,
            std::string("GET\n/test.txt\n\nhost:examplebucket.s3.amazonaws.com\nrange:bytes=0-9\n"
                        "x-amz-content-sha256:") + kEmptySha256 + "\nx-amz-date:20130524T000000Z\n\n"
                "host;range;x-amz-content-sha256;x-amz-date\n" + kEmptySha256);
  EXPECT_EQ(s.string_to_sign,
            "AWS4-HMAC-SHA256\n20130524T000000Z\n20130524/us-east-1/s3/aws4_request\n"
            "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972");
  EXPECT_EQ(s.signature, "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
  EXPECT_EQ(s.authorization,
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,"
            "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,"
            "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
  // What goes on the wire: the signed headers and the authorization, names lower-case.
  std::vector<std::string> names;
  for (const auto& h : s.headers) names.push_back(h.first);
  EXPECT_EQ(names, (std::vector<std::string>{"authorization", "host", "range", "x-amz-content-sha256", "x-amz-date"}));
}

// A key with spaces and reserved characters is encoded once, '/' kept in the path; query
// parameters are encoded (including '/'), then sorted; a session token is sent and signed; header
// values are trimmed and their inner spaces folded.
TEST(S3Sign, EncodingQueryOrderTokenAndHeaderValues) {
  EXPECT_EQ(sigv4_uri_encode("shards/train 0001+a~b.tar", true), "shards/train%200001%2Ba~b.tar");
  EXPECT_EQ(sigv4_uri_encode("a/b", false), "a%2Fb");
  EXPECT_EQ(sigv4_uri_encode("\xc3\xa9", true), "%C3%A9");
  S3Request r;
  r.host = "127.0.0.1:9000";
  r.path = "/bucket/train 0001.tar";
  r.query = {{"prefix", "train/"}, {"list-type", "2"}, {"max-keys", "2"}};
  r.headers = {{"X-Custom", "  a   b  "}};
  const S3Credentials token{"AK", "SK", "TOKEN/+="};
  const S3Signature s = sign_s3_request(r, token, "eu-west-1", "20261206T101500Z");
  test::expect_contains(s.canonical_request, "GET\n/bucket/train%200001.tar\nlist-type=2&max-keys=2&prefix=train%2F\n");
  test::expect_contains(s.canonical_request, "x-amz-security-token:TOKEN/+=\n");
  test::expect_contains(s.canonical_request, "x-custom:a b\n");
  test::expect_contains(s.authorization, "SignedHeaders=host;x-amz-content-sha256;x-amz-date;x-amz-security-token;x-custom,");
  test::expect_contains(s.authorization, "Credential=AK/20261206/eu-west-1/s3/aws4_request,");
  // Any change to what is signed changes the signature.
  S3Request other = r;
  other.path = "/bucket/train 0002.tar";
  EXPECT_NE(sign_s3_request(other, token, "eu-west-1", "20261206T101500Z").signature, s.signature);
  EXPECT_NE(sign_s3_request(r, token, "eu-west-2", "20261206T101500Z").signature, s.signature);
}

TEST(S3Sign, BadDatesAndMissingKeysAreRefused) {
  S3Request r;
  r.host = "h";
  test::expect_bad_input([&] { sign_s3_request(r, kExampleKeys, "us-east-1", "2013-05-24T00:00:00Z"); },
                         {"2013-05-24T00:00:00Z", "YYYYMMDDTHHMMSSZ"});
  test::expect_bad_input([&] { sign_s3_request(r, {"AK", "", ""}, "us-east-1", "20130524T000000Z"); },
                         {"secret key"});
}

}  // namespace
}  // namespace crucible::data
