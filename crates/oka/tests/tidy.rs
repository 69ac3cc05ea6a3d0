//! Project rules checked as ordinary tests (the rust-analyzer `tidy` habit): every Rust file
//! starts with a `//!` comment saying what it is, no test is hidden by an ignore attribute or
//! expects a panic, and no line ends in whitespace.

// Test helpers outside `#[test]` functions may unwrap: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().parent().unwrap().to_owned()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if name == "target" || name.to_string_lossy().starts_with('.') {
            continue;
        }
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn all_rust_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    rust_files(&workspace_root().join("crates"), &mut files);
    assert!(files.len() > 20, "found only {} Rust files", files.len());
    files
}

#[test]
fn every_rust_file_starts_with_a_module_comment() {
    let missing: Vec<_> = all_rust_files()
        .into_iter()
        .filter(|path| {
            let text = std::fs::read_to_string(path).unwrap();
            let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
            !first.starts_with("//!")
        })
        .collect();
    assert!(missing.is_empty(), "files without a leading `//!` comment: {missing:#?}");
}

#[test]
fn no_test_is_ignored_or_expects_a_panic() {
    // Written split so this file does not match itself.
    let banned = [concat!("#[", "ignore"), concat!("#[", "should_panic")];
    let offenders: Vec<_> = all_rust_files()
        .into_iter()
        .filter(|path| {
            let text = std::fs::read_to_string(path).unwrap();
            banned.iter().any(|b| text.contains(b))
        })
        .collect();
    assert!(
        offenders.is_empty(),
        "assert on the `Err` instead of expecting a panic, gate slow tests on an environment \
         variable instead of ignoring them: {offenders:#?}"
    );
}

#[test]
fn no_line_ends_in_whitespace() {
    let mut offenders = Vec::new();
    for path in all_rust_files() {
        let text = std::fs::read_to_string(&path).unwrap();
        for (i, line) in text.lines().enumerate() {
            if line.ends_with(' ') || line.ends_with('\t') {
                offenders.push(format!("{}:{}", path.display(), i + 1));
            }
        }
    }
    assert!(offenders.is_empty(), "trailing whitespace: {offenders:#?}");
}
