#include "walgate/protocol/auth.hpp"
#include "walgate/protocol/base64.hpp"

#include "split_helpers.hpp"

#include <doctest/doctest.h>

using namespace walgate::protocol;

TEST_CASE("SCRAM-SHA-256: the RFC 7677 test vector") {
  scram_client c("pencil", "user", "rOprNGfwEbeRWgbNEkqO");
  CHECK(c.mechanism() == "SCRAM-SHA-256");
  CHECK(c.client_first() == "n,,n=user,r=rOprNGfwEbeRWgbNEkqO");
  auto final_msg = c.client_final("r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096");
  REQUIRE(final_msg);
  CHECK(*final_msg ==
        "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=");
  CHECK(c.verify_server_final("v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="));
  CHECK_FALSE(c.verify_server_final("v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G5="));
  CHECK_FALSE(c.verify_server_final("e=invalid-proof"));
  CHECK(c.failure().find("invalid-proof") != std::string::npos);
}

TEST_CASE("SCRAM: a server nonce that does not extend ours, or bad parameters, fail") {
  scram_client c("pencil", "", "abc");
  CHECK(c.client_first() == "n,,n=,r=abc");
  CHECK_FALSE(c.client_final("r=xyz123,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"));
  CHECK_FALSE(c.client_final("r=abc,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"));       // not extended
  CHECK_FALSE(c.client_final("r=abcd,s=!!!,i=4096"));                           // salt not base64
  CHECK_FALSE(c.client_final("r=abcd,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=0"));
  CHECK_FALSE(c.client_final("r=abcd,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=99999999999"));
  CHECK_FALSE(c.client_final("r=abcd,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=20000000"));  // over our limit
  CHECK_FALSE(c.client_final("m=ext,r=abcd,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=1"));
  CHECK_FALSE(c.verify_server_final("v=anything"));   // before client_final succeeded
}

TEST_CASE("SCRAM-SHA-256-PLUS puts the binding data in c=") {
  std::string binding(32, '\x07');
  scram_client c("pw", "", "nonce", binding);
  CHECK(c.mechanism() == "SCRAM-SHA-256-PLUS");
  CHECK(c.client_first() == "p=tls-server-end-point,,n=,r=nonce");
  auto f = c.client_final("r=nonceSERVER,s=c2FsdA==,i=1");
  REQUIRE(f);
  auto c_attr = f->substr(2, f->find(',') - 2);
  CHECK(base64_decode(c_attr) == "p=tls-server-end-point,," + binding);
  scram_client y("pw", "", "nonce", "", true);
  CHECK(y.client_first() == "y,,n=,r=nonce");
}

TEST_CASE("MD5 password response") {
  // md5(md5("secret" + "alice") + salt), computed independently with Python's hashlib.
  CHECK(md5_password_response("alice", "secret", std::string("\x01\x02\x03\x04", 4)) ==
        "md598a0412b9c31436fc53776e863350083");
}

TEST_CASE("tls-server-end-point of garbage is empty") {
  CHECK(tls_server_end_point("not a certificate").empty());
}

TEST_CASE("SASLprep of SCRAM passwords, as PostgreSQL does it") {
  using walgate::protocol::scram_prepare_password;
  // ASCII: unchanged, control characters included (PostgreSQL's quick path).
  CHECK(scram_prepare_password("scram secret") == "scram secret");
  CHECK(scram_prepare_password("tab\there") == "tab\there");
  // RFC 4013's examples: soft hyphen mapped to nothing, NFKC of ª and Ⅸ.
  CHECK(scram_prepare_password("I\xC2\xAD" "X") == "IX");
  CHECK(scram_prepare_password("\xC2\xAA") == "a");
  CHECK(scram_prepare_password("\xE2\x85\xA8") == "IX");
  // A no-break space becomes a space; fullwidth letters and a decomposed umlaut normalize.
  CHECK(scram_prepare_password("pass\xC2\xA0word") == "pass word");
  CHECK(scram_prepare_password("\xEF\xBD\x90\xEF\xBD\x81\xEF\xBD\x93\xEF\xBD\x93") == "pass");
  CHECK(scram_prepare_password("a\xCC\x88") == "\xC3\xA4");
  // Prohibited (a non-ASCII control character), bad bidi, invalid UTF-8, or nothing left
  // after mapping: the raw bytes, as PostgreSQL's server stores them.
  CHECK(scram_prepare_password("a\xC2\x80" "b") == "a\xC2\x80" "b");
  CHECK(scram_prepare_password("\xD8\xA7" "a") == "\xD8\xA7" "a");   // Arabic alef then a Latin letter
  CHECK(scram_prepare_password("\xFF\xFEpass") == "\xFF\xFEpass");
  CHECK(scram_prepare_password("\xC2\xAD") == "\xC2\xAD");
}
