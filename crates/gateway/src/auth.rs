//! Who may send traffic to a sandbox: the rule of the gateway's auth modes, pure (the sandbox,
//! the request's credentials, the verifier and the time in; pass or the refusal out).
//!
//! # Modes ([`AuthMode`], `gateway.auth.mode`)
//!
//! The reference's matrix (its `enable-auth` and `enable-jwt-auth`), per sandbox. A sandbox
//! *requires traffic auth* when its annotation `security.agents.kruise.io/enable-jwt-auth` is
//! exactly `"true"`; its *access token* is its agent runtime's (`agents.kruise.io/runtime-access-token`,
//! legacy `e2b.agents.kruise.io/envd-access-token`).
//!
//! | mode | sandbox not requiring traffic auth | sandbox requiring traffic auth |
//! |---|---|---|
//! | `none` | pass | oka's token (below), else 503 `service unavailable: traffic access token verifier is not ready` |
//! | `accessToken` | empty access token ⇒ pass; else header `x-access-token` equal to it (constant time), else 401 `unauthorized: invalid or missing access token` | as `none` (no access-token fallback) |
//! | `jwt` | pass, the traffic-token header removed | oka's token, else a JWT: no verifier yet ⇒ 503; invalid ⇒ 403 `forbidden: invalid or missing traffic access token`; `sandbox.sandboxId`/`sandboxUid` not the sandbox's ⇒ 403 `forbidden: traffic access token does not match sandbox` |
//!
//! `x-access-token` is always forwarded untouched (envd checks it itself); a traffic token
//! that passed is removed before the request goes upstream.
//!
//! # oka's own traffic tokens, beside the reference's JWTs
//!
//! E2B's `network.allowPublicTraffic: false`, and the refresh route
//! (`POST /sandboxes/{id}/traffic-access-token`), give a sandbox an opaque token that oka's
//! manager mints; the sandbox keeps only its SHA-256
//! (`security.agents.kruise.io/traffic-access-token-sha256`) and, when it has one, its
//! expiration (`security.agents.kruise.io/traffic-access-token-expiration`, RFC 3339). The E2B
//! SDKs send it in the same header as the reference's JWTs, `e2b-traffic-access-token`. A token
//! whose SHA-256 is the sandbox's, and not expired, passes in **every** mode: it is a credential
//! oka itself issued to the sandbox's owner, and needs no identity provider. Otherwise:
//! - in `jwt` mode the header is verified as a JWT, as above (so either kind of token works);
//! - in `none` and `accessToken` modes a sandbox that has such a hash answers E2B's own 403s
//!   (`Sandbox is secured with traffic access token. …` missing / invalid), as oka always has;
//!   one without (the annotation set by hand, as the reference's users do) has no way to be
//!   verified: the reference's 503.

use std::time::Duration;

use jiff::Timestamp;
use oka_api::{Sandbox, annotations};
use sha2::{Digest, Sha256};

use crate::error::Reject;
use crate::jwt::Verifier;

/// The header of the agent runtime's access token (the reference's `accessTokenHeader`).
pub const ACCESS_TOKEN_HEADER: &str = "x-access-token";

/// How the gateway authenticates traffic (the reference's `enable-auth` / `enable-jwt-auth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AuthMode {
    /// No check beyond oka's own traffic tokens (the reference: both off).
    #[default]
    None,
    /// The agent runtime's access token in `x-access-token` (the reference's `enable-auth`).
    AccessToken,
    /// Traffic JWTs from an OIDC identity provider (`enable-auth` and `enable-jwt-auth`).
    Jwt,
}

/// What a request carries that authenticates it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Credentials<'a> {
    /// The `e2b-traffic-access-token` header.
    pub traffic_token: Option<&'a [u8]>,
    /// The `x-access-token` header.
    pub access_token: Option<&'a [u8]>,
}

/// Constant-time equality (the length is not secret).
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn lowercase_hex(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(HEX[usize::from(b >> 4)] as char);
        out.push(HEX[usize::from(b & 0xf)] as char);
    }
    out
}

fn annotation<'a>(sandbox: &'a Sandbox, key: &str) -> Option<&'a str> {
    sandbox.metadata.annotations.as_ref()?.get(key).map(String::as_str)
}

/// Whether the sandbox requires traffic auth (the annotation exactly `"true"`).
pub fn requires_traffic_auth(sandbox: &Sandbox) -> bool {
    annotation(sandbox, annotations::ENABLE_JWT_AUTH) == Some("true")
}

/// The agent runtime's access token of the sandbox, empty when it has none.
fn route_access_token(sandbox: &Sandbox) -> &str {
    annotation(sandbox, annotations::RUNTIME_ACCESS_TOKEN)
        .filter(|t| !t.is_empty())
        .or_else(|| annotation(sandbox, annotations::ENVD_ACCESS_TOKEN))
        .unwrap_or_default()
}

/// Whether `token` is the sandbox's opaque token, unexpired at `now`. `None`: the sandbox has
/// no such token.
fn opaque_token_matches(sandbox: &Sandbox, token: Option<&[u8]>, now: Timestamp) -> Option<bool> {
    let expected = annotation(sandbox, annotations::TRAFFIC_ACCESS_TOKEN_SHA256)?;
    let Some(token) = token else { return Some(false) };
    let actual = lowercase_hex(&Sha256::digest(token));
    if !constant_time_eq(expected.to_ascii_lowercase().as_bytes(), actual.as_bytes()) {
        return Some(false);
    }
    let expired = annotation(sandbox, annotations::TRAFFIC_ACCESS_TOKEN_EXPIRATION)
        // An expiration that does not parse is never a reason to let a token pass.
        .map(|t| t.parse::<Timestamp>().map_or(true, |at| now > at));
    Some(expired != Some(true))
}

/// Decides whether a request for `sandbox` (public ID `sandbox_id`) carrying `credentials` may
/// pass under `mode` at `now`; `verifier` is the published JWT verifier, if any. `Ok(true)`:
/// pass and remove the traffic-token header before forwarding.
pub fn authorize(
    mode: AuthMode,
    sandbox: &Sandbox,
    sandbox_id: &str,
    credentials: Credentials<'_>,
    verifier: Option<&Verifier>,
    now: Timestamp,
) -> Result<bool, Reject> {
    let id = || sandbox_id.to_owned();
    if requires_traffic_auth(sandbox) {
        let opaque = opaque_token_matches(sandbox, credentials.traffic_token, now);
        if opaque == Some(true) {
            return Ok(true);
        }
        if mode != AuthMode::Jwt {
            return match (opaque, credentials.traffic_token) {
                (None, _) => Err(Reject::VerifierNotReady { sandbox_id: id() }),
                (Some(_), None) => Err(Reject::TokenMissing { sandbox_id: id() }),
                (Some(_), Some(_)) => Err(Reject::TokenInvalid { sandbox_id: id() }),
            };
        }
        let Some(verifier) = verifier else {
            return Err(Reject::VerifierNotReady { sandbox_id: id() });
        };
        let seconds = now.as_second();
        let claims = verifier
            .verify(credentials.traffic_token.unwrap_or_default(), seconds)
            .map_err(|error| {
                tracing::debug!(sandbox = sandbox_id, %error, "traffic access token refused");
                Reject::TrafficTokenInvalid { sandbox_id: id() }
            })?;
        let uid = sandbox.metadata.uid.as_deref().unwrap_or_default();
        if claims.sandbox_id != sandbox_id || claims.sandbox_uid != uid {
            return Err(Reject::TrafficTokenMismatch { sandbox_id: id() });
        }
        return Ok(true);
    }
    match mode {
        AuthMode::None => Ok(false),
        AuthMode::Jwt => Ok(true),
        AuthMode::AccessToken => {
            let expected = route_access_token(sandbox);
            if expected.is_empty()
                || constant_time_eq(
                    credentials.access_token.unwrap_or_default(),
                    expected.as_bytes(),
                )
            {
                Ok(false)
            } else {
                Err(Reject::Unauthorized { sandbox_id: id() })
            }
        }
    }
}

/// The backoff between tries of the verifier's first load (the reference's 1 s doubling to
/// 30 s): the wait after `failures` failed tries.
pub fn backoff(failures: u32) -> Duration {
    let secs = 1u64.checked_shl(failures.saturating_sub(1)).unwrap_or(u64::MAX);
    Duration::from_secs(secs.min(30))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;
    use crate::jwt::tests::{TestKey, claims};

    const NOW: i64 = 1_800_000_000;

    fn now() -> Timestamp {
        Timestamp::from_second(NOW).unwrap()
    }

    fn sandbox(notes: &[(&str, &str)]) -> Sandbox {
        let mut builder = Sandbox::test().name("s").claimed();
        for (k, v) in notes {
            builder = builder.annotation(k, v);
        }
        let mut sandbox = builder.build();
        sandbox.metadata.uid = Some("uid-1".into());
        sandbox
    }

    fn sha(token: &str) -> String {
        lowercase_hex(&Sha256::digest(token.as_bytes()))
    }

    fn creds<'a>(traffic: Option<&'a str>, access: Option<&'a str>) -> Credentials<'a> {
        Credentials {
            traffic_token: traffic.map(str::as_bytes),
            access_token: access.map(str::as_bytes),
        }
    }

    fn code(result: Result<bool, Reject>) -> Result<bool, (u16, String)> {
        result.map_err(|r| (r.status().as_u16(), r.body()["message"].as_str().unwrap().to_owned()))
    }

    const NOT_READY: &str = "service unavailable: traffic access token verifier is not ready";

    #[test]
    fn sandboxes_not_requiring_traffic_auth_follow_the_mode() {
        let plain = sandbox(&[(annotations::RUNTIME_ACCESS_TOKEN, "envd-token")]);
        let run = |mode, c| code(authorize(mode, &plain, "sbx-1", c, None, now()));
        assert_eq!(run(AuthMode::None, creds(None, None)), Ok(false));
        assert_eq!(run(AuthMode::None, creds(Some("x"), Some("bad"))), Ok(false), "untouched");
        assert_eq!(run(AuthMode::Jwt, creds(Some("x"), None)), Ok(true), "stripped");
        assert_eq!(run(AuthMode::AccessToken, creds(None, Some("envd-token"))), Ok(false));
        let unauthorized = Err((401, "unauthorized: invalid or missing access token".into()));
        assert_eq!(run(AuthMode::AccessToken, creds(None, None)), unauthorized);
        assert_eq!(run(AuthMode::AccessToken, creds(None, Some("envd-tokeN"))), unauthorized);
        assert_eq!(run(AuthMode::AccessToken, creds(None, Some("envd-token2"))), unauthorized);
        // No access token recorded (or an empty one): nothing to compare, pass.
        let tokenless = sandbox(&[(annotations::RUNTIME_ACCESS_TOKEN, "")]);
        assert_eq!(
            code(authorize(AuthMode::AccessToken, &tokenless, "s", creds(None, None), None, now())),
            Ok(false)
        );
        let legacy = sandbox(&[(annotations::ENVD_ACCESS_TOKEN, "old")]);
        assert_eq!(
            code(authorize(AuthMode::AccessToken, &legacy, "s", creds(None, None), None, now())),
            unauthorized
        );
    }

    #[test]
    fn a_sandbox_requiring_traffic_auth_without_an_opaque_token_needs_a_verifier() {
        let secured = sandbox(&[
            (annotations::ENABLE_JWT_AUTH, "true"),
            (annotations::RUNTIME_ACCESS_TOKEN, "envd-token"),
        ]);
        for mode in [AuthMode::None, AuthMode::AccessToken, AuthMode::Jwt] {
            // Never the access token as a fallback.
            let result =
                authorize(mode, &secured, "sbx-1", creds(None, Some("envd-token")), None, now());
            assert_eq!(code(result), Err((503, NOT_READY.into())), "{mode:?}");
        }
        // Exactly "true".
        let almost = sandbox(&[(annotations::ENABLE_JWT_AUTH, "True")]);
        assert_eq!(
            code(authorize(AuthMode::None, &almost, "s", creds(None, None), None, now())),
            Ok(false)
        );
    }

    #[test]
    fn jwts_are_verified_and_matched_with_the_sandbox() {
        let key = TestKey::ed25519();
        let jwks = json!({"keys": [key.jwk("k", None)]}).to_string();
        let verifier =
            Verifier::new("https://idp.example", jwks.as_bytes(), Duration::from_secs(60)).unwrap();
        let secured = sandbox(&[(annotations::ENABLE_JWT_AUTH, "true")]);
        let run = |c: Credentials<'_>| {
            code(authorize(AuthMode::Jwt, &secured, "sbx-1", c, Some(&verifier), now()))
        };
        let good = key.sign("EdDSA", Some("k"), &claims(NOW));
        assert_eq!(run(creds(Some(&good), None)), Ok(true));
        let invalid = Err((403, "forbidden: invalid or missing traffic access token".into()));
        assert_eq!(run(creds(None, None)), invalid);
        assert_eq!(run(creds(Some("not-a-jwt"), None)), invalid);
        let mut expired = claims(NOW);
        expired["exp"] = json!(NOW - 120);
        assert_eq!(run(creds(Some(&key.sign("EdDSA", Some("k"), &expired)), None)), invalid);
        let mismatch = Err((403, "forbidden: traffic access token does not match sandbox".into()));
        for (field, value) in [("sandboxId", "sbx-2"), ("sandboxUid", "uid-2")] {
            let mut other = claims(NOW);
            other["sandbox"][field] = json!(value);
            assert_eq!(run(creds(Some(&key.sign("EdDSA", Some("k"), &other)), None)), mismatch);
        }
        let mut none = claims(NOW);
        none.as_object_mut().unwrap().remove("sandbox");
        assert_eq!(run(creds(Some(&key.sign("EdDSA", Some("k"), &none)), None)), mismatch);
    }

    #[test]
    fn opaque_tokens_pass_in_every_mode_until_they_expire() {
        let token = "3f1c0a52-opaque";
        let with_hash = |expiration: Option<&str>| {
            let mut notes = vec![
                (annotations::ENABLE_JWT_AUTH, "true"),
                (
                    annotations::TRAFFIC_ACCESS_TOKEN_SHA256,
                    &*Box::leak(sha(token).into_boxed_str()),
                ),
            ];
            if let Some(at) = expiration {
                notes.push((annotations::TRAFFIC_ACCESS_TOKEN_EXPIRATION, at));
            }
            sandbox(&notes)
        };
        let secured = with_hash(None);
        for mode in [AuthMode::None, AuthMode::AccessToken, AuthMode::Jwt] {
            let result = authorize(mode, &secured, "sbx-1", creds(Some(token), None), None, now());
            assert_eq!(code(result), Ok(true), "{mode:?}");
        }
        // E2B's answers where no verifier is configured.
        let run =
            |mode, s: &Sandbox, t| code(authorize(mode, s, "sbx-1", creds(t, None), None, now()));
        let missing = "Sandbox is secured with traffic access token. Token header 'e2b-traffic-access-token' is missing";
        let wrong = "Sandbox is secured with traffic access token. Provided token in header 'e2b-traffic-access-token' is invalid";
        assert_eq!(run(AuthMode::None, &secured, None), Err((403, missing.into())));
        assert_eq!(run(AuthMode::AccessToken, &secured, Some("nope")), Err((403, wrong.into())));
        // In jwt mode another token is taken for a JWT.
        assert_eq!(run(AuthMode::Jwt, &secured, Some("nope")), Err((503, NOT_READY.into())));
        // Expiry.
        let later = with_hash(Some("2027-01-15T08:00:00Z"));
        assert_eq!(run(AuthMode::None, &later, Some(token)), Ok(true));
        let past = with_hash(Some("2020-01-01T00:00:00Z"));
        assert_eq!(run(AuthMode::None, &past, Some(token)), Err((403, wrong.into())));
        let garbled = with_hash(Some("tomorrow"));
        assert_eq!(run(AuthMode::None, &garbled, Some(token)), Err((403, wrong.into())));
    }

    #[test]
    fn the_first_load_backs_off_from_one_to_thirty_seconds() {
        let waits: Vec<u64> = (1..=8).map(|n| backoff(n).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30, 30]);
        assert_eq!(backoff(200).as_secs(), 30);
    }
}
