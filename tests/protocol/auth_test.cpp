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

// --- The server's side -----------------------------------------------------------------------

namespace {
const std::string rfc_salt = *base64_decode("W22ZaJ0SNY7soEsUEjb6gQ==");
const char* rfc_server_first = "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
const char* rfc_client_final =
    "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=";

scram_server rfc_server(std::string binding = {}) {
  return scram_server(make_scram_verifier("pencil", 4096, rfc_salt), "user", "secret", std::move(binding),
                      "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0");
}
}  // namespace

TEST_CASE("SCRAM server: the RFC 7677 test vector, byte for byte") {
  auto s = rfc_server();
  CHECK(s.mechanisms() == std::vector<std::string>{"SCRAM-SHA-256"});
  auto first = s.server_first("SCRAM-SHA-256", "n,,n=user,r=rOprNGfwEbeRWgbNEkqO");
  REQUIRE(first);
  CHECK(*first == rfc_server_first);
  auto final_msg = s.server_final(rfc_client_final);
  REQUIRE_MESSAGE(final_msg, s.failure());
  CHECK(*final_msg == "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=");
  CHECK_FALSE(s.server_final(rfc_client_final));   // (once only)
}

TEST_CASE("SCRAM verifiers: PostgreSQL's text form, made, printed and parsed; every bad form refused") {
  const auto v = make_scram_verifier("pencil", 4096, rfc_salt);
  const std::string text = format_scram_verifier(v);
  // The RFC's keys for "pencil" with this salt (StoredKey = H(ClientKey), ServerKey).
  CHECK(text ==
        "SCRAM-SHA-256$4096:W22ZaJ0SNY7soEsUEjb6gQ==$WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=:"
        "wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU=");
  auto parsed = parse_scram_verifier(text);
  REQUIRE(parsed);
  CHECK(parsed->iterations == 4096);
  CHECK(parsed->salt == rfc_salt);
  CHECK(parsed->stored_key == v.stored_key);
  CHECK(parsed->server_key == v.server_key);
  // Made with a random salt: a different verifier for the same password each time.
  CHECK(format_scram_verifier(make_scram_verifier("pencil")) != format_scram_verifier(make_scram_verifier("pencil")));

  // Every prefix of a good verifier is refused (none is a verifier of its own).
  for (std::size_t n = 0; n < text.size(); ++n) {
    std::string why;
    CHECK_FALSE_MESSAGE(parse_scram_verifier(text.substr(0, n), &why), n);
    CHECK_FALSE(why.empty());
  }
  const std::string keys = "$WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=:wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU=";
  for (const std::string& bad : std::vector<std::string>{
           "md5c4ca4238a0b923820dcc509a6f75849b",
           "SCRAM-SHA-1$4096:W22ZaJ0SNY7soEsUEjb6gQ==" + keys,
           "SCRAM-SHA-256$0:W22ZaJ0SNY7soEsUEjb6gQ==" + keys,
           "SCRAM-SHA-256$+4096:W22ZaJ0SNY7soEsUEjb6gQ==" + keys,
           "SCRAM-SHA-256$-1:W22ZaJ0SNY7soEsUEjb6gQ==" + keys,
           "SCRAM-SHA-256$2147483648:W22ZaJ0SNY7soEsUEjb6gQ==" + keys,
           "SCRAM-SHA-256$4096x:W22ZaJ0SNY7soEsUEjb6gQ==" + keys,
           "SCRAM-SHA-256$4096:W22ZaJ0SNY7soEsUEjb6gQ=" + keys,    // bad padding
           "SCRAM-SHA-256$4096:" + keys,                             // no salt
           "SCRAM-SHA-256$4096W22ZaJ0SNY7soEsUEjb6gQ==" + keys,     // no colon
           "SCRAM-SHA-256$4096:W22ZaJ0SNY7soEsUEjb6gQ==$WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=",
           "SCRAM-SHA-256$4096:W22ZaJ0SNY7soEsUEjb6gQ==$WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4g==:"
           "wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU=",          // a StoredKey of 31 bytes
           "SCRAM-SHA-256$4096:W22ZaJ0SNY7soEsUEjb6gQ==" + keys + " ",
           "SCRAM-SHA-256$4096:W22ZaJ0SNY7soEsUEjb6gQ==" + keys + ":x",
       }) {
    std::string why;
    CHECK_FALSE_MESSAGE(parse_scram_verifier(bad, &why), bad);
    CHECK_FALSE(why.empty());
  }
}

TEST_CASE("SCRAM server against walgate's client: right password, wrong one, no such user, with and without channel binding") {
  const auto v = make_scram_verifier("s3cret, with = and ,");
  // True when the server took the proof and the client took the server's signature.
  auto exchange = [&](scram_client& c, scram_server& s, std::string_view mechanism) -> bool {
    auto first = s.server_first(mechanism, c.client_first());
    REQUIRE_MESSAGE(first, s.failure());
    auto client_final = c.client_final(*first);
    REQUIRE(client_final);
    auto server_final = s.server_final(*client_final);
    return server_final && c.verify_server_final(*server_final).has_value();
  };
  {
    scram_client c("s3cret, with = and ,", "ignored,=name");
    scram_server s(v, "alice", "secret");
    CHECK(exchange(c, s, "SCRAM-SHA-256"));
  }
  {
    scram_client c("wrong");
    scram_server s(v, "alice", "secret");
    CHECK_FALSE(exchange(c, s, "SCRAM-SHA-256"));
    CHECK(s.proof_failed());
  }
  {  // no such user: the same exchange, a stable salt per name, and a failure at the proof
    scram_client c("s3cret, with = and ,");
    scram_server s(std::nullopt, "mallory", "secret");
    CHECK_FALSE(exchange(c, s, "SCRAM-SHA-256"));
    CHECK(s.proof_failed());
    scram_server again(std::nullopt, "mallory", "secret"), other(std::nullopt, "trudy", "secret");
    auto salt_of = [](scram_server& x) {
      auto first = x.server_first("SCRAM-SHA-256", "n,,n=,r=abc");
      REQUIRE(first);
      std::string f = *first;
      return f.substr(f.find(",s="), f.find(",i=") - f.find(",s="));
    };
    scram_server fresh(std::nullopt, "mallory", "secret");
    const std::string mallory = salt_of(fresh);
    CHECK(salt_of(again) == mallory);
    CHECK(salt_of(other) != mallory);
  }
  {  // on TLS: PLUS offered first, and the binding data checked
    const std::string binding(32, '\x5a');
    scram_client c("s3cret, with = and ,", "", "", binding);
    scram_server s(v, "alice", "secret", binding);
    CHECK(s.mechanisms() == std::vector<std::string>{"SCRAM-SHA-256-PLUS", "SCRAM-SHA-256"});
    CHECK(exchange(c, s, "SCRAM-SHA-256-PLUS"));
    scram_client other_cert("s3cret, with = and ,", "", "", std::string(32, '\x5b'));
    scram_server s2(v, "alice", "secret", binding);
    CHECK_FALSE(exchange(other_cert, s2, "SCRAM-SHA-256-PLUS"));
    CHECK_FALSE(s2.proof_failed());
    CHECK(s2.failure() == "SCRAM channel binding check failed");
    scram_client plain("s3cret, with = and ,");   // a client without binding on TLS: "n"
    scram_server s3(v, "alice", "secret", binding);
    CHECK(exchange(plain, s3, "SCRAM-SHA-256"));
  }
}

TEST_CASE("SCRAM server: every malformed or refused client message is a clear error, cut anywhere") {
  auto refused_first = [](std::string binding, std::string_view mechanism, std::string_view msg, std::string_view why) {
    scram_server s(make_scram_verifier("pencil", 4096, rfc_salt), "user", "secret", std::move(binding), "SRV");
    CHECK_FALSE_MESSAGE(s.server_first(mechanism, msg), msg);
    CHECK_MESSAGE(s.failure().find(why) != std::string::npos, s.failure());
  };
  const std::string binding(32, '\x01');
  refused_first("", "SCRAM-SHA-1", "n,,n=,r=abc", "invalid SASL authentication mechanism");
  refused_first("", "SCRAM-SHA-256-PLUS", "p=tls-server-end-point,,n=,r=abc", "invalid SASL authentication mechanism");
  refused_first(binding, "SCRAM-SHA-256-PLUS", "n,,n=,r=abc", "does not include channel binding data");
  refused_first("", "SCRAM-SHA-256", "p=tls-server-end-point,,n=,r=abc", "includes channel binding data");
  refused_first(binding, "SCRAM-SHA-256", "y,,n=,r=abc", "channel binding negotiation error");
  refused_first(binding, "SCRAM-SHA-256-PLUS", "p=tls-unique,,n=,r=abc", "unsupported SCRAM channel-binding type");
  refused_first("", "SCRAM-SHA-256", "n,a=admin,n=,r=abc", "authorization identity");
  refused_first("", "SCRAM-SHA-256", "n,,m=ext,n=,r=abc", "unsupported SCRAM extension");
  refused_first("", "SCRAM-SHA-256", "x,,n=,r=abc", "channel-binding flag");
  refused_first("", "SCRAM-SHA-256", "n,,r=abc", "expected attribute \"n\"");
  refused_first("", "SCRAM-SHA-256", "n,,n=,r=a,b", "attribute");
  refused_first("", "SCRAM-SHA-256", "n,,n=,r=a\x7f", "nonce is not printable");
  refused_first("", "SCRAM-SHA-256", std::string_view("n,,n=,r=a\0b", 11), "NUL");
  refused_first("", "SCRAM-SHA-256", "", "empty");
  // A y from a client on a connection without TLS is fine, and so are extensions after the nonce.
  {
    scram_server s(make_scram_verifier("pencil"), "user", "secret");
    CHECK(s.server_first("SCRAM-SHA-256", "y,,n=,r=abc,x=ext"));
  }

  // The RFC's client-final cut at every byte: each prefix refused (never a crash), as is every
  // one-byte change of the proof's base64 to another valid character (the proof then fails).
  const std::string good = rfc_client_final;
  for (std::size_t n = 0; n < good.size(); ++n) {
    auto s = rfc_server();
    REQUIRE(s.server_first("SCRAM-SHA-256", "n,,n=user,r=rOprNGfwEbeRWgbNEkqO"));
    CHECK_FALSE_MESSAGE(s.server_final(good.substr(0, n)), n);
    CHECK_FALSE(s.proof_failed());
  }
  auto refused_final = [](std::string_view msg, std::string_view why, bool proof) {
    auto s = rfc_server();
    REQUIRE(s.server_first("SCRAM-SHA-256", "n,,n=user,r=rOprNGfwEbeRWgbNEkqO"));
    CHECK_FALSE_MESSAGE(s.server_final(msg), msg);
    CHECK_MESSAGE(s.failure().find(why) != std::string::npos, s.failure());
    CHECK(s.proof_failed() == proof);
  };
  const std::string nonce = "rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
  const std::string proof = "p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=";
  refused_final("c=eSws,r=" + nonce + "," + proof, "unexpected SCRAM channel-binding attribute", false);
  refused_final("c=biws,r=" + nonce + "X," + proof, "nonce does not match", false);
  refused_final("c=biws,r=" + nonce + "," + proof + ",x=1", "garbage at the end", false);
  refused_final("c=biws,r=" + nonce + "," + proof + ",", "garbage at the end", false);
  refused_final("c=biws,r=" + nonce + ",p=AAAA", "malformed proof", false);
  refused_final("c=biws,r=" + nonce + ",p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVU=", "proof does not hold", true);
  refused_final("r=" + nonce + "," + proof, "expected attribute \"c\"", false);
  refused_final(std::string("c=biws,r=") + nonce + "," + proof + std::string(1, '\0'), "NUL", false);
  {  // extensions before the proof are taken (and signed: they are in the message without the proof)
    auto s = rfc_server();
    REQUIRE(s.server_first("SCRAM-SHA-256", "n,,n=user,r=rOprNGfwEbeRWgbNEkqO"));
    CHECK_FALSE(s.server_final("c=biws,r=" + nonce + ",x=ext," + proof));
    CHECK(s.proof_failed());   // the RFC's proof does not sign x=ext
  }
  {  // out of turn
    auto s = rfc_server();
    CHECK_FALSE(s.server_final(good));
    CHECK(s.failure().find("out of turn") != std::string::npos);
  }
}
