//! The Kubernetes backend (being written).
