//! The certificate controller every replica runs, as the reference's webhook controller:
//!
//! 1. read the Secret `secretName` in the system namespace; when it is missing, incomplete,
//!    expiring or not for the Service's names, write a new CA and certificate
//!    ([`crate::certs`]): a create, and when another replica's create won (the name is taken)
//!    or its overwrite won (a conflict on the resourceVersion), read again and use theirs;
//! 2. serve the Secret's certificate (the TLS server reloads it when the Secret changes);
//! 3. write the CA as `caBundle` into every webhook of the two webhook configurations that
//!    points at the Service ([`crate::inject`]), each a compare-and-swap update.
//!
//! It does so again whenever the Secret or a configuration changes (a watch on each; a
//! `helm upgrade` or `kubectl apply` that resets `caBundle` is repaired at once, a deleted or
//! rotated Secret followed) and every resync period besides, in case a watch missed
//! something. The replica is ready once a certificate is served and both configurations
//! carry its CA.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use futures::StreamExt as _;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ApiResource, DynamicObject, PostParams, WatchParams};
use oka_kubeapi::tls::ReloadableCert;
use oka_store::{Selector, Store, StoreError, WatchEvent};
use tokio::sync::{Mutex, Notify};
use tracing::{debug, info, warn};

use crate::WebhookError;
use crate::certs::{CertBundle, service_names};
use crate::inject::{Injection, ServiceRef, inject};

/// How many times a write that raced with another replica is tried again.
const ATTEMPTS: usize = 5;
/// How soon a failed sync or a broken watch is tried again.
const RETRY: Duration = Duration::from_secs(2);

/// Where the certificates live and where their CA goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProvisionOptions {
    /// The system namespace: the Secret's and the Service's.
    pub namespace: String,
    /// The Secret holding the CA and the serving certificate.
    pub secret_name: String,
    /// The webhook Service (its names are the certificate's).
    pub service_name: String,
    /// The `MutatingWebhookConfiguration` to inject the CA into.
    pub mutating_configuration: String,
    /// The `ValidatingWebhookConfiguration` to inject the CA into.
    pub validating_configuration: String,
    /// How often the Secret and the configurations are checked again.
    pub resync: Duration,
}

/// The certificate controller of one replica.
pub struct Provisioner<S> {
    store: S,
    client: kube::Client,
    options: ProvisionOptions,
    cert: Arc<ReloadableCert>,
    served: Mutex<Option<CertBundle>>,
    ready: Arc<AtomicBool>,
}

impl<S: Store> Provisioner<S> {
    /// A controller keeping the Secret in `store` and the configurations through `client`,
    /// serving through `cert`.
    pub fn new(
        store: S,
        client: kube::Client,
        options: ProvisionOptions,
        cert: Arc<ReloadableCert>,
    ) -> Self {
        Provisioner {
            store,
            client,
            options,
            cert,
            served: Mutex::new(None),
            ready: Arc::new(AtomicBool::new(false)),
        }
    }

    /// True from the first time a certificate is served and both configurations carry its CA.
    pub fn ready(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.ready)
    }

    /// Syncs on every change of the Secret or a configuration, and every resync period
    /// (sooner after a failure), until `stop` resolves.
    pub async fn run(self, stop: impl std::future::Future<Output = ()>) {
        let changed = Arc::new(Notify::new());
        let watchers = [
            tokio::spawn(watch_secret(
                self.store.clone(),
                self.options.namespace.clone(),
                self.options.secret_name.clone(),
                Arc::clone(&changed),
            )),
            tokio::spawn(watch_configuration(
                self.client.clone(),
                ApiResource::erase::<MutatingWebhookConfiguration>(&()),
                self.options.mutating_configuration.clone(),
                Arc::clone(&changed),
            )),
            tokio::spawn(watch_configuration(
                self.client.clone(),
                ApiResource::erase::<ValidatingWebhookConfiguration>(&()),
                self.options.validating_configuration.clone(),
                Arc::clone(&changed),
            )),
        ];
        tokio::pin!(stop);
        loop {
            let wait = match self.sync().await {
                Ok(()) => self.options.resync,
                Err(error) => {
                    warn!(%error, "webhook certificates: sync failed");
                    self.options.resync.min(RETRY)
                }
            };
            tokio::select! {
                () = &mut stop => break,
                () = tokio::time::sleep(wait) => {}
                () = changed.notified() => {}
            }
        }
        for watcher in watchers {
            watcher.abort();
        }
    }

    /// One pass: the Secret, the served certificate, the CA in both configurations.
    pub async fn sync(&self) -> Result<(), WebhookError> {
        let bundle = self.ensure_secret().await?;
        {
            let mut served = self.served.lock().await;
            if served.as_ref() != Some(&bundle) {
                let key = oka_kubeapi::tls::certified_key(&bundle.cert, &bundle.key)?;
                self.cert.set(key);
                info!(secret = %self.options.secret_name, "webhook certificates: serving the Secret's certificate");
                *served = Some(bundle.clone());
            }
        }
        let service = ServiceRef {
            namespace: self.options.namespace.clone(),
            name: self.options.service_name.clone(),
        };
        let mutating = ApiResource::erase::<MutatingWebhookConfiguration>(&());
        let validating = ApiResource::erase::<ValidatingWebhookConfiguration>(&());
        self.inject_into(&mutating, &self.options.mutating_configuration, &service, &bundle)
            .await?;
        self.inject_into(&validating, &self.options.validating_configuration, &service, &bundle)
            .await?;
        if !self.ready.swap(true, Ordering::SeqCst) {
            info!("webhook certificates: served and injected");
        }
        Ok(())
    }

    /// The Secret's bundle, written first when it is missing or not good enough.
    async fn ensure_secret(&self) -> Result<CertBundle, WebhookError> {
        let names = service_names(&self.options.service_name, &self.options.namespace);
        let (namespace, name) = (&self.options.namespace, &self.options.secret_name);
        for _ in 0..ATTEMPTS {
            let existing = match self.store.get::<Secret>(namespace, name).await {
                Ok(secret) => Some(secret),
                Err(e) if e.is_not_found() => None,
                Err(e) => return Err(e.into()),
            };
            let bundle = existing
                .as_ref()
                .and_then(|s| s.data.as_ref())
                .and_then(CertBundle::from_secret_data);
            if let Some(bundle) = &bundle {
                match bundle.check(&names, SystemTime::now()) {
                    Ok(()) => return Ok(bundle.clone()),
                    Err(why) => info!(%why, "webhook certificates: replacing the Secret's"),
                }
            }
            let fresh = CertBundle::generate(&names)?;
            let written = match existing {
                Some(mut secret) => {
                    secret.data = Some(fresh.to_secret_data());
                    secret.string_data = None;
                    self.store.update(namespace, &secret).await
                }
                None => {
                    let mut secret = Secret::default();
                    secret.metadata.name = Some(name.clone());
                    secret.metadata.namespace = Some(namespace.clone());
                    secret.data = Some(fresh.to_secret_data());
                    self.store.create(namespace, &secret).await
                }
            };
            match written {
                Ok(_) => {
                    info!(secret = %name, "webhook certificates: wrote a new CA and certificate");
                    return Ok(fresh);
                }
                // Another replica wrote first: use what it wrote.
                Err(StoreError::AlreadyExists { .. }) => continue,
                Err(e) if e.is_conflict() => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(WebhookError::Contended(name.clone()))
    }

    /// Writes the CA into `name`'s webhooks of the Service.
    async fn inject_into(
        &self,
        resource: &ApiResource,
        name: &str,
        service: &ServiceRef,
        bundle: &CertBundle,
    ) -> Result<(), WebhookError> {
        let api = kube::Api::<DynamicObject>::all_with(self.client.clone(), resource);
        for _ in 0..ATTEMPTS {
            let current = api.get(name).await.map_err(|source| WebhookError::Configuration {
                kind: resource.kind.clone(),
                name: name.to_owned(),
                source,
            })?;
            let json = serde_json::to_value(&current)?;
            match inject(&json, service, &bundle.ca_cert) {
                Injection::UpToDate => return Ok(()),
                Injection::NoWebhook => {
                    return Err(WebhookError::NoWebhookOfService {
                        kind: resource.kind.clone(),
                        name: name.to_owned(),
                    });
                }
                Injection::Changed(changed) => {
                    let object: DynamicObject = serde_json::from_value(changed)?;
                    match api.replace(name, &PostParams::default(), &object).await {
                        Ok(_) => {
                            info!(kind = %resource.kind, %name, "webhook certificates: injected the CA");
                            return Ok(());
                        }
                        Err(kube::Error::Api(status)) if status.code == 409 => continue,
                        Err(source) => {
                            return Err(WebhookError::Configuration {
                                kind: resource.kind.clone(),
                                name: name.to_owned(),
                                source,
                            });
                        }
                    }
                }
            }
        }
        Err(WebhookError::Contended(name.to_owned()))
    }
}

/// Wakes `changed` whenever the Secret `name` changes (the namespace's Secrets are watched).
async fn watch_secret<S: Store>(store: S, namespace: String, name: String, changed: Arc<Notify>) {
    loop {
        match store.watch::<Secret>(Some(&namespace), &Selector::everything(), "").await {
            Ok(mut events) => {
                while let Some(event) = events.next().await {
                    let secret = match event {
                        Ok(
                            WatchEvent::Added(s) | WatchEvent::Modified(s) | WatchEvent::Deleted(s),
                        ) => s,
                        Ok(_) => continue,
                        Err(error) => {
                            debug!(%error, "webhook certificates: the Secret's watch ended");
                            break;
                        }
                    };
                    if secret.metadata.name.as_deref() == Some(name.as_str()) {
                        changed.notify_one();
                    }
                }
            }
            Err(error) => debug!(%error, "webhook certificates: cannot watch the Secret"),
        }
        tokio::time::sleep(RETRY).await;
    }
}

/// Wakes `changed` whenever the webhook configuration `name` of `resource` changes.
async fn watch_configuration(
    client: kube::Client,
    resource: ApiResource,
    name: String,
    changed: Arc<Notify>,
) {
    let api = kube::Api::<DynamicObject>::all_with(client, &resource);
    let field = format!("metadata.name={name}");
    let params = WatchParams::default().fields(&field);
    let list = kube::api::ListParams::default().fields(&field);
    loop {
        // From the state a list reads; whatever changed before it is synced by the wake-up.
        let from = match api.list_metadata(&list).await {
            Ok(list) => list.metadata.resource_version.unwrap_or_default(),
            Err(error) => {
                debug!(%error, kind = %resource.kind, "webhook certificates: cannot list");
                tokio::time::sleep(RETRY).await;
                continue;
            }
        };
        changed.notify_one();
        match api.watch(&params, &from).await {
            Ok(events) => {
                let mut events = std::pin::pin!(events);
                while let Some(event) = events.next().await {
                    match event {
                        Ok(kube::api::WatchEvent::Bookmark(_)) => {}
                        Ok(kube::api::WatchEvent::Error(error)) => {
                            debug!(%error, kind = %resource.kind, "webhook certificates: watch ended");
                            break;
                        }
                        Ok(_) => changed.notify_one(),
                        Err(error) => {
                            debug!(%error, kind = %resource.kind, "webhook certificates: watch ended");
                            break;
                        }
                    }
                }
            }
            Err(error) => {
                debug!(%error, kind = %resource.kind, "webhook certificates: cannot watch")
            }
        }
        tokio::time::sleep(RETRY).await;
    }
}
