//! The label sets several components' families share, so a `namespace` or `namespace,result`
//! series means the same in the controllers' and the manager's exposition.

use prometheus_client::encoding::EncodeLabelSet;

/// `namespace`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NamespaceLabels {
    /// The object's namespace.
    pub namespace: String,
}

/// `namespace`, `result`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// The object's namespace.
    pub namespace: String,
    /// `success`, `failure`, `failed`, `timeout` (per family, as the reference words it).
    pub result: &'static str,
}
