//! Test support shared by the store's test files that need more than the embedded store.

pub mod apiserver;
