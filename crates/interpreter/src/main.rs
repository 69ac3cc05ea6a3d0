//! The `oka-interpreter` binary.
fn main() {}
