//! Project rules checked as ordinary tests (the rust-analyzer `tidy` habit): every Rust file
//! starts with a `//!` comment saying what it is, no test is hidden by an ignore attribute or
//! expects a panic, no line ends in whitespace, and the crates depend on each other only as the
//! layering table in `ARCHITECTURE.md` allows (read from `cargo metadata`).

// Test helpers outside `#[test]` functions may unwrap: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
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
    rust_files(&workspace_root().join("fuzz"), &mut files);
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

/// One row of ARCHITECTURE.md's layering table.
#[derive(Debug, Default)]
struct Allowed {
    /// `any`: the binary may depend on everything.
    any: bool,
    /// Crates it may depend on.
    normal: BTreeSet<String>,
    /// Crates only its tests and benches may depend on (besides `normal`).
    dev: BTreeSet<String>,
    /// Edges allowed for now and marked `(to remove` in the layering table.
    to_remove: BTreeSet<String>,
}

/// The crate names in backticks in `cell`; a name followed by `(to remove` is also returned in
/// the second set.
fn crate_names(cell: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut names = BTreeSet::new();
    let mut to_remove = BTreeSet::new();
    let mut rest = cell;
    while let Some(start) = rest.find('`') {
        let after = &rest[start + 1..];
        let Some(end) = after.find('`') else { break };
        let name = &after[..end];
        rest = &after[end + 1..];
        if name.starts_with("oka") {
            names.insert(name.to_owned());
            if rest.trim_start().starts_with("(to remove") {
                to_remove.insert(name.to_owned());
            }
        }
    }
    (names, to_remove)
}

/// The table under `## Crate layering` in ARCHITECTURE.md: crate → what it may depend on.
fn layering_table() -> BTreeMap<String, Allowed> {
    let text = std::fs::read_to_string(workspace_root().join("ARCHITECTURE.md")).unwrap();
    let section = text.split("\n## Crate layering").nth(1).expect("a `## Crate layering` section");
    let section = section.split("\n## ").next().unwrap();
    let mut table = BTreeMap::new();
    for line in section.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        assert!(cells.len() >= 5, "a layering row needs three columns: {line}");
        let (name, _) = crate_names(cells[1]);
        let name = name.into_iter().next().unwrap_or_else(|| panic!("no crate in {line}"));
        let (normal, to_remove) = crate_names(cells[2]);
        let (dev, _) = crate_names(cells[3]);
        let any = cells[2] == "any";
        table.insert(name, Allowed { any, normal, dev, to_remove });
    }
    assert!(table.len() > 10, "found only {} rows in the layering table", table.len());
    table
}

/// One workspace crate's dependencies.
#[derive(Debug, Default)]
struct Edges {
    /// On our crates, normal and build dependencies.
    normal: BTreeSet<String>,
    /// On our crates, dev dependencies.
    dev: BTreeSet<String>,
    /// On other crates, normal and build dependencies.
    external: BTreeSet<String>,
}

/// Every workspace crate with its dependencies, read from `cargo metadata`.
fn workspace_edges() -> BTreeMap<String, Edges> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = std::process::Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(workspace_root())
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let packages = metadata["packages"].as_array().unwrap();
    let ours: BTreeSet<String> =
        packages.iter().map(|p| p["name"].as_str().unwrap().to_owned()).collect();
    let mut edges = BTreeMap::new();
    for package in packages {
        let mut edges_of = Edges::default();
        for dependency in package["dependencies"].as_array().unwrap() {
            let name = dependency["name"].as_str().unwrap().to_owned();
            let is_dev = dependency["kind"].as_str() == Some("dev");
            match (ours.contains(&name), is_dev) {
                (true, true) => edges_of.dev.insert(name),
                (true, false) => edges_of.normal.insert(name),
                (false, false) => edges_of.external.insert(name),
                (false, true) => false,
            };
        }
        edges.insert(package["name"].as_str().unwrap().to_owned(), edges_of);
    }
    edges
}

#[test]
fn crate_dependencies_follow_the_layering_in_architecture_md() {
    let table = layering_table();
    let mut problems = Vec::new();
    for (name, Edges { normal, dev, .. }) in workspace_edges() {
        let Some(allowed) = table.get(&name) else {
            problems
                .push(format!("{name} is not in ARCHITECTURE.md's layering table: add its row"));
            continue;
        };
        if allowed.any {
            continue;
        }
        for dependency in &normal {
            if !allowed.normal.contains(dependency) {
                problems.push(format!("{name} depends on {dependency}, which the table forbids"));
            }
        }
        for dependency in dev.difference(&normal) {
            if !allowed.normal.contains(dependency) && !allowed.dev.contains(dependency) {
                problems.push(format!(
                    "{name}'s tests depend on {dependency}, which the table forbids"
                ));
            }
        }
        for edge in &allowed.to_remove {
            if !normal.contains(edge) {
                problems.push(format!(
                    "{name} no longer depends on {edge}: drop it from its row in the layering \
                     table (it was marked `to remove`)"
                ));
            }
        }
    }
    assert!(problems.is_empty(), "crate layering: {problems:#?}");
}

#[test]
fn the_runtime_api_makes_no_system_calls() {
    // ARCHITECTURE.md: `oka-runtime-api` is the seam only; the Linux calls are the local
    // runtime's. A crate that reaches the kernel directly has no business in it.
    let edges = workspace_edges();
    let external = &edges["oka-runtime-api"].external;
    let banned: Vec<_> =
        external.iter().filter(|d| ["libc", "rustix", "nix"].contains(&d.as_str())).collect();
    assert!(banned.is_empty(), "oka-runtime-api depends on {banned:?}");
}
