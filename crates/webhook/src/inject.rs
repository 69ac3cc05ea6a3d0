//! The CA bundle in the webhook configurations: every webhook of oka's
//! `MutatingWebhookConfiguration` and `ValidatingWebhookConfiguration` whose `clientConfig`
//! names the webhook Service gets the CA's PEM as its `caBundle`. Webhooks that point
//! elsewhere (another Service, a URL) are left as they are.

use base64::Engine as _;
use serde_json::Value;

/// The webhook Service a configuration's webhooks must point at to get the CA.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceRef {
    /// The Service's namespace.
    pub namespace: String,
    /// The Service's name.
    pub name: String,
}

/// What injecting the CA into a configuration finds.
#[derive(Debug, Clone, PartialEq)]
pub enum Injection {
    /// Every webhook of the Service already has the CA.
    UpToDate,
    /// The configuration with the CA in every webhook of the Service: write it.
    Changed(Value),
    /// No webhook of the configuration points at the Service.
    NoWebhook,
}

/// Injects `ca_pem` into the webhooks of `configuration` (a webhook configuration's JSON) that
/// point at `service`.
pub fn inject(configuration: &Value, service: &ServiceRef, ca_pem: &str) -> Injection {
    let bundle = Value::from(base64::engine::general_purpose::STANDARD.encode(ca_pem));
    let mut changed = configuration.clone();
    let mut found = false;
    let mut differs = false;
    let webhooks = changed.get_mut("webhooks").and_then(Value::as_array_mut);
    for webhook in webhooks.into_iter().flatten() {
        let Some(client) = webhook.get_mut("clientConfig").and_then(Value::as_object_mut) else {
            continue;
        };
        let points_here = client.get("service").is_some_and(|s| {
            s.get("name").and_then(Value::as_str) == Some(service.name.as_str())
                && s.get("namespace").and_then(Value::as_str) == Some(service.namespace.as_str())
        });
        if !points_here {
            continue;
        }
        found = true;
        if client.get("caBundle") != Some(&bundle) {
            client.insert("caBundle".into(), bundle.clone());
            differs = true;
        }
    }
    match (found, differs) {
        (false, _) => Injection::NoWebhook,
        (true, false) => Injection::UpToDate,
        (true, true) => Injection::Changed(changed),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn only_the_webhooks_of_the_service_get_the_ca() {
        let service = ServiceRef { namespace: "sandbox-system".into(), name: "oka-webhook".into() };
        let config = json!({"webhooks": [
            {"name": "a", "clientConfig": {"service": {"namespace": "sandbox-system", "name": "oka-webhook", "path": "/a"}}},
            {"name": "b", "clientConfig": {"service": {"namespace": "other", "name": "oka-webhook", "path": "/b"}}},
            {"name": "c", "clientConfig": {"url": "https://example.com/c"}},
        ]});
        let Injection::Changed(injected) = inject(&config, &service, "PEM") else {
            panic!("the CA must be injected")
        };
        assert_eq!(injected["webhooks"][0]["clientConfig"]["caBundle"], "UEVN");
        assert_eq!(injected["webhooks"][1], config["webhooks"][1]);
        assert_eq!(injected["webhooks"][2], config["webhooks"][2]);
        assert_eq!(inject(&injected, &service, "PEM"), Injection::UpToDate);
        assert!(matches!(inject(&injected, &service, "NEW"), Injection::Changed(_)));
        let elsewhere = ServiceRef { namespace: "x".into(), name: "y".into() };
        assert_eq!(inject(&config, &elsewhere, "PEM"), Injection::NoWebhook);
        assert_eq!(inject(&json!({}), &service, "PEM"), Injection::NoWebhook);
    }
}
