//! The connection to the API server: kube-rs's configuration from the kubeconfig (the standard
//! loading rules: `--kubeconfig`, else `$KUBECONFIG`, else `~/.kube/config`, with `--context`),
//! or the in-cluster service account when okactl runs in a pod; and the API errors as messages.

use anyhow::Context as _;
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::args::GlobalArgs;
use crate::printer::Printer;

/// A client for `global`'s cluster.
///
/// The reference tries the in-cluster configuration first whenever no kubeconfig and no context
/// is given, and warns when it fails. Outside a pod that warning would follow every command, so
/// okactl tries it only where it can work: in a pod (`KUBERNETES_SERVICE_HOST` is set).
pub async fn connect(global: &GlobalArgs, printer: &Printer) -> anyhow::Result<kube::Client> {
    let in_pod = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some();
    let config = if global.kubeconfig.is_none() && global.context.is_none() && in_pod {
        match kube::Config::incluster() {
            Ok(config) => config,
            Err(err) => {
                printer
                    .warn(&format!("in-cluster config failed ({err}), falling back to kubeconfig"));
                from_kubeconfig(global).await?
            }
        }
    } else {
        from_kubeconfig(global).await?
    };
    kube::Client::try_from(config).context("cannot create the API client")
}

async fn from_kubeconfig(global: &GlobalArgs) -> anyhow::Result<kube::Config> {
    let options = KubeConfigOptions { context: global.context.clone(), ..Default::default() };
    let config = match &global.kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .with_context(|| format!("cannot read kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &options).await
        }
        None => kube::Config::from_kubeconfig(&options).await,
    };
    config.context("cannot load kubeconfig")
}

/// The message of an API error as the API server wrote it (`sandboxsets.agents.kruise.io "x"
/// not found`), as Go clients print theirs; other errors as kube-rs describes them.
pub fn message(err: &kube::Error) -> String {
    match err {
        kube::Error::Api(status) if !status.message.is_empty() => status.message.clone(),
        other => other.to_string(),
    }
}

/// Whether `err` is the API server's NotFound.
pub fn is_not_found(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 404)
}

/// Whether `err` is the API server's Conflict (a stale resourceVersion).
pub fn is_conflict(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 409)
}
