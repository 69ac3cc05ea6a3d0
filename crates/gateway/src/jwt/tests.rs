//! Every rule of [`super`]: keys of each type signing real tokens, and one test per refusal.
#![allow(clippy::unwrap_used)]

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::rand::SystemRandom;
use ring::signature::{self as rs, KeyPair as _};
use serde_json::{Value, json};

use super::*;

/// A private key of one type that signs test tokens, with its public JWK.
pub(crate) enum TestKey {
    Rsa(rs::RsaKeyPair),
    Ecdsa(rs::EcdsaKeyPair, &'static str),
    P521(Box<p521::ecdsa::SigningKey>),
    Ed25519(rs::Ed25519KeyPair),
}

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

impl TestKey {
    pub(crate) fn rsa() -> Self {
        TestKey::Rsa(rs::RsaKeyPair::from_der(include_bytes!("test-rsa-2048.der")).unwrap())
    }

    pub(crate) fn ec(curve: &'static str) -> Self {
        let rng = SystemRandom::new();
        if curve == "P-521" {
            let mut scalar = [0u8; 66];
            ring::rand::SecureRandom::fill(&rng, &mut scalar[2..]).unwrap();
            return TestKey::P521(Box::new(p521::ecdsa::SigningKey::from_slice(&scalar).unwrap()));
        }
        let alg = match curve {
            "P-256" => &rs::ECDSA_P256_SHA256_FIXED_SIGNING,
            _ => &rs::ECDSA_P384_SHA384_FIXED_SIGNING,
        };
        let pkcs8 = rs::EcdsaKeyPair::generate_pkcs8(alg, &rng).unwrap();
        TestKey::Ecdsa(rs::EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).unwrap(), curve)
    }

    pub(crate) fn ed25519() -> Self {
        let pkcs8 = rs::Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).unwrap();
        TestKey::Ed25519(rs::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap())
    }

    /// The public JWK, with `kid` and, when given, `alg`.
    pub(crate) fn jwk(&self, kid: &str, alg: Option<&str>) -> Value {
        let mut jwk = match self {
            TestKey::Rsa(key) => {
                let public = rs::RsaPublicKeyComponents::<Vec<u8>>::from(key.public());
                json!({"kty": "RSA", "n": b64(&public.n), "e": b64(&public.e)})
            }
            TestKey::Ecdsa(key, curve) => {
                let point = key.public_key().as_ref();
                let size = (point.len() - 1) / 2;
                json!({"kty": "EC", "crv": curve, "x": b64(&point[1..1 + size]),
                       "y": b64(&point[1 + size..])})
            }
            TestKey::P521(key) => {
                let point = p521::ecdsa::VerifyingKey::from(key.as_ref()).to_encoded_point(false);
                json!({"kty": "EC", "crv": "P-521", "x": b64(point.x().unwrap()),
                       "y": b64(point.y().unwrap())})
            }
            TestKey::Ed25519(key) => {
                json!({"kty": "OKP", "crv": "Ed25519", "x": b64(key.public_key().as_ref())})
            }
        };
        jwk["kid"] = json!(kid);
        if let Some(alg) = alg {
            jwk["alg"] = json!(alg);
        }
        jwk
    }

    /// A compact JWS of `claims` with header `{"alg": alg, "kid": kid}` (no `kid` when `None`).
    pub(crate) fn sign(&self, alg: &str, kid: Option<&str>, claims: &Value) -> String {
        let mut header = json!({"alg": alg, "typ": "JWT"});
        if let Some(kid) = kid {
            header["kid"] = json!(kid);
        }
        let input = format!(
            "{}.{}",
            b64(header.to_string().as_bytes()),
            b64(claims.to_string().as_bytes())
        );
        let rng = SystemRandom::new();
        let signature = match self {
            TestKey::Rsa(key) => {
                let padding: &dyn rs::RsaEncoding = match alg {
                    "RS256" => &rs::RSA_PKCS1_SHA256,
                    "RS384" => &rs::RSA_PKCS1_SHA384,
                    "RS512" => &rs::RSA_PKCS1_SHA512,
                    "PS256" => &rs::RSA_PSS_SHA256,
                    "PS384" => &rs::RSA_PSS_SHA384,
                    _ => &rs::RSA_PSS_SHA512,
                };
                let mut out = vec![0; key.public().modulus_len()];
                key.sign(padding, &rng, input.as_bytes(), &mut out).unwrap();
                out
            }
            TestKey::Ecdsa(key, _) => key.sign(&rng, input.as_bytes()).unwrap().as_ref().to_vec(),
            TestKey::P521(key) => {
                use p521::ecdsa::signature::hazmat::PrehashSigner;
                use sha2::Digest as _;
                let prehash = sha2::Sha512::digest(input.as_bytes());
                let signature: p521::ecdsa::Signature = key.sign_prehash(&prehash).unwrap();
                signature.to_bytes().to_vec()
            }
            TestKey::Ed25519(key) => key.sign(input.as_bytes()).as_ref().to_vec(),
        };
        format!("{input}.{}", b64(&signature))
    }
}

const ISSUER: &str = "https://idp.example";
const NOW: i64 = 1_800_000_000;

/// Claims valid at [`NOW`] for sandbox `sbx-1` / `uid-1`.
pub(crate) fn claims(now: i64) -> Value {
    json!({
        "iss": ISSUER, "sub": "agent", "aud": "whatever",
        "iat": now - 10, "nbf": now - 10, "exp": now + 600,
        "sandbox": {"sandboxId": "sbx-1", "sandboxUid": "uid-1"},
    })
}

fn verifier(keys: Vec<Value>) -> Verifier {
    Verifier::new(ISSUER, json!({"keys": keys}).to_string().as_bytes(), Duration::from_secs(60))
        .unwrap()
}

fn refused(keys: Vec<Value>) -> JwksError {
    Verifier::new(ISSUER, json!({"keys": keys}).to_string().as_bytes(), Duration::ZERO).unwrap_err()
}

#[test]
fn every_algorithm_verifies_with_its_key_type() {
    let rsa = TestKey::rsa();
    let cases = [
        (TestKey::ec("P-256"), "ES256"),
        (TestKey::ec("P-384"), "ES384"),
        (TestKey::ec("P-521"), "ES512"),
        (TestKey::ed25519(), "EdDSA"),
    ];
    for alg in ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512"] {
        let v = verifier(vec![rsa.jwk("r", None)]);
        let token = rsa.sign(alg, Some("r"), &claims(NOW));
        let sandbox = v.verify(token.as_bytes(), NOW).unwrap_or_else(|e| panic!("{alg}: {e}"));
        assert_eq!(sandbox.sandbox_id, "sbx-1");
        assert_eq!(sandbox.sandbox_uid, "uid-1");
    }
    for (key, alg) in &cases {
        let v = verifier(vec![key.jwk("k", Some(alg))]);
        let token = key.sign(alg, Some("k"), &claims(NOW));
        assert!(v.verify(token.as_bytes(), NOW).is_ok(), "{alg}");
    }
}

#[test]
fn key_sets_breaking_a_rule_are_refused_whole() {
    let rsa = TestKey::rsa();
    let ec = TestKey::ec("P-256");
    let good = rsa.jwk("good", None);
    let with = |mut jwk: Value, field: &str, value: Value| {
        jwk[field] = value;
        jwk
    };
    assert!(matches!(Verifier::new(ISSUER, b"[]", Duration::ZERO), Err(JwksError::Document(_))));
    assert_eq!(refused(vec![]), JwksError::Empty);
    let reason = |e: JwksError| match e {
        JwksError::Key { reason, .. } => reason,
        other => panic!("{other:?}"),
    };
    assert!(reason(refused(vec![good.clone(), rsa.jwk("", None)])).contains("empty kid"));
    assert_eq!(
        refused(vec![good.clone(), rsa.jwk("good", None)]),
        JwksError::DuplicateKid("good".into())
    );
    assert!(reason(refused(vec![with(good.clone(), "use", json!("enc"))])).contains("use"));
    assert!(
        reason(refused(vec![with(good.clone(), "key_ops", json!(["sign"]))])).contains("verify")
    );
    verifier(vec![
        with(good.clone(), "key_ops", json!(["verify"])),
        with(rsa.jwk("x", None), "key_ops", json!([])),
    ]);
    verifier(vec![with(good.clone(), "use", json!("sig"))]);
    assert!(
        reason(refused(vec![json!({"kty": "oct", "kid": "h", "k": "c2VjcmV0"})]))
            .contains("asymmetric public key")
    );
    assert!(
        reason(refused(vec![with(ec.jwk("p", None), "d", json!("AAAA"))])).contains("asymmetric")
    );
    let small = with(good.clone(), "n", json!(URL_SAFE_NO_PAD.encode([0xffu8; 128])));
    assert!(reason(refused(vec![small])).contains("2048 to 8192 bits"));
    let mut off = ec.jwk("off", None);
    off["y"] = json!(URL_SAFE_NO_PAD.encode([1u8; 32]));
    assert!(reason(refused(vec![off])).contains("not on the curve"));
    assert!(
        reason(refused(vec![with(ec.jwk("k1", None), "crv", json!("secp256k1"))]))
            .contains("curve")
    );
    let x25519 =
        json!({"kty": "OKP", "crv": "X25519", "kid": "x", "x": URL_SAFE_NO_PAD.encode([9u8; 32])});
    assert!(reason(refused(vec![x25519])).contains("curve"));
    let short =
        json!({"kty": "OKP", "crv": "Ed25519", "kid": "s", "x": URL_SAFE_NO_PAD.encode([9u8; 31])});
    assert!(reason(refused(vec![short])).contains("32 bytes"));
    assert!(reason(refused(vec![rsa.jwk("r", Some("ES256"))])).contains("incompatible algorithm"));
    assert!(reason(refused(vec![ec.jwk("e", Some("ES384"))])).contains("incompatible algorithm"));
    assert!(reason(refused(vec![rsa.jwk("r", Some("HS256"))])).contains("incompatible algorithm"));
    assert!(reason(refused(vec![json!({"kty": "XYZ", "kid": "u"})])).contains("kty"));
}

#[test]
fn tokens_breaking_a_rule_are_refused() {
    let rsa = TestKey::rsa();
    let ec = TestKey::ec("P-256");
    let v = verifier(vec![rsa.jwk("r", Some("RS256")), ec.jwk("e", None)]);
    let ok = rsa.sign("RS256", Some("r"), &claims(NOW));
    assert!(v.verify(ok.as_bytes(), NOW).is_ok());

    assert_eq!(v.verify(b"", NOW), Err(JwtError::Empty));
    assert_eq!(v.verify(&vec![b'a'; MAX_TOKEN + 1], NOW), Err(JwtError::TooLarge));
    assert!(matches!(v.verify(b"a.b", NOW), Err(JwtError::Malformed(_))));
    assert!(matches!(v.verify(b"a.b.c.d", NOW), Err(JwtError::Malformed(_))));
    assert!(matches!(v.verify(b"!!.b.c", NOW), Err(JwtError::Malformed(_))));
    // `none` and symmetric algorithms are never accepted.
    let header = |h: Value| URL_SAFE_NO_PAD.encode(h.to_string());
    let payload = URL_SAFE_NO_PAD.encode(claims(NOW).to_string());
    let none = format!("{}.{payload}.", header(json!({"alg": "none", "kid": "r"})));
    assert_eq!(v.verify(none.as_bytes(), NOW), Err(JwtError::Algorithm("none".into())));
    let hs = format!("{}.{payload}.c2ln", header(json!({"alg": "HS256", "kid": "r"})));
    assert_eq!(v.verify(hs.as_bytes(), NOW), Err(JwtError::Algorithm("HS256".into())));

    let no_kid = rsa.sign("RS256", None, &claims(NOW));
    assert_eq!(v.verify(no_kid.as_bytes(), NOW), Err(JwtError::NoKid));
    let unknown = rsa.sign("RS256", Some("who"), &claims(NOW));
    assert_eq!(v.verify(unknown.as_bytes(), NOW), Err(JwtError::UnknownKid("who".into())));
    // The key says RS256; a PS256 token of the same key is refused.
    let other_alg = rsa.sign("PS256", Some("r"), &claims(NOW));
    assert_eq!(v.verify(other_alg.as_bytes(), NOW), Err(JwtError::KeyMismatch("PS256".into())));
    // A key without `alg` still refuses an algorithm of another type or curve.
    let wrong_curve = ec.sign("ES256", Some("e"), &claims(NOW)).replacen(
        &header(json!({"alg": "ES256", "typ": "JWT", "kid": "e"})),
        &header(json!({"alg": "ES384", "typ": "JWT", "kid": "e"})),
        1,
    );
    assert_eq!(v.verify(wrong_curve.as_bytes(), NOW), Err(JwtError::KeyMismatch("ES384".into())));
    // A signature of another key, and a payload changed after signing.
    let forged = TestKey::ec("P-256").sign("ES256", Some("e"), &claims(NOW));
    assert_eq!(v.verify(forged.as_bytes(), NOW), Err(JwtError::Signature));
    let mut parts: Vec<String> = ok.split('.').map(str::to_owned).collect();
    let mut changed = claims(NOW);
    changed["sandbox"]["sandboxId"] = json!("sbx-2");
    parts[1] = URL_SAFE_NO_PAD.encode(changed.to_string());
    assert_eq!(v.verify(parts.join(".").as_bytes(), NOW), Err(JwtError::Signature));

    let without = |field: &str| {
        let mut c = claims(NOW);
        c.as_object_mut().unwrap().remove(field);
        v.verify(rsa.sign("RS256", Some("r"), &c).as_bytes(), NOW)
    };
    assert_eq!(without("exp"), Err(JwtError::Missing("exp")));
    assert_eq!(without("iat"), Err(JwtError::Missing("iat")));
    assert_eq!(without("nbf"), Err(JwtError::Missing("nbf")));
    assert_eq!(without("sub"), Err(JwtError::Missing("sub")));
    assert_eq!(without("iss"), Err(JwtError::Issuer(String::new())));
    assert!(without("aud").is_ok(), "aud is not checked");
    let with = |field: &str, value: Value| {
        let mut c = claims(NOW);
        c[field] = value;
        v.verify(rsa.sign("RS256", Some("r"), &c).as_bytes(), NOW)
    };
    assert_eq!(with("sub", json!("")), Err(JwtError::Missing("sub")));
    assert_eq!(with("iss", json!("https://other")), Err(JwtError::Issuer("https://other".into())));
    assert_eq!(with("exp", json!("soon")), Err(JwtError::Missing("exp")));
    assert_eq!(with("sandbox", json!("sbx-1")).unwrap(), SandboxClaims::default());
}

#[test]
fn time_claims_allow_the_clock_skew_and_no_more() {
    let key = TestKey::ed25519();
    let v = verifier(vec![key.jwk("k", None)]);
    let at = |exp: i64, nbf: i64, iat: i64| {
        let mut c = claims(NOW);
        c["exp"] = json!(exp);
        c["nbf"] = json!(nbf);
        c["iat"] = json!(iat);
        v.verify(key.sign("EdDSA", Some("k"), &c).as_bytes(), NOW)
    };
    assert!(at(NOW - 60, NOW - 100, NOW - 100).is_ok(), "expired within the skew");
    assert_eq!(at(NOW - 61, NOW - 100, NOW - 100), Err(JwtError::Expired));
    assert!(at(NOW + 100, NOW + 60, NOW).is_ok(), "not before, within the skew");
    assert_eq!(at(NOW + 100, NOW + 61, NOW), Err(JwtError::NotYetValid));
    assert!(at(NOW + 100, NOW, NOW + 60).is_ok());
    assert_eq!(at(NOW + 100, NOW, NOW + 61), Err(JwtError::IssuedInFuture));
    // Fractional NumericDates are dates too.
    let mut c = claims(NOW);
    c["exp"] = json!(NOW as f64 + 0.5);
    assert!(v.verify(key.sign("EdDSA", Some("k"), &c).as_bytes(), NOW).is_ok());
}
