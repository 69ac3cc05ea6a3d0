//! `oka rootfs build DIR`: a Debian minbase root filesystem for sandbox templates.
//!
//! # Expected flow
//!
//! 1. Find the archive to install from: `--mirror`, else the URI this machine's own apt sources
//!    use for the suite (deb822 `*.sources` or one-line `sources.list`).
//! 2. `debootstrap --variant=minbase` into `DIR.partial`, next to `DIR`.
//! 3. Inside it: add the `user` account (uid and gid 1000, home `/home/user`), drop apt's caches.
//! 4. Rename `DIR.partial` to `DIR`. A failure at any step removes `DIR.partial`, so `DIR`
//!    either does not exist or is complete: nothing half-built is ever used as a template.
//!
//! A template names the result as its root filesystem; sandboxes mount it read-only as the
//! lower layer of their overlay root.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};

/// Arguments of `oka rootfs build`.
#[derive(Debug, clap::Args)]
pub struct BuildArgs {
    /// The directory to create; it must not exist yet.
    pub dir: PathBuf,
    /// The Debian suite to install.
    #[arg(long, default_value = "bookworm")]
    pub suite: String,
    /// The archive URI; by default the one this machine's apt sources use.
    #[arg(long)]
    pub mirror: Option<String>,
    /// Extra packages, comma-separated.
    #[arg(long, default_value = "python3")]
    pub include: String,
}

/// Builds the root filesystem; see the module documentation for the steps.
pub fn build(args: &BuildArgs) -> anyhow::Result<()> {
    if args.dir.exists() {
        bail!("{} already exists; remove it or choose another directory", args.dir.display());
    }
    if Command::new("debootstrap").arg("--version").output().is_err() {
        bail!("debootstrap is not installed\n\nhint: apt-get install debootstrap");
    }
    let mirror = match &args.mirror {
        Some(m) => m.clone(),
        None => machine_mirror(&args.suite)?,
    };
    let partial = partial_path(&args.dir);
    if partial.exists() {
        std::fs::remove_dir_all(&partial)
            .with_context(|| format!("cannot remove the leftover {}", partial.display()))?;
    }
    let result = build_into(&partial, &mirror, args);
    if let Err(e) = result {
        let _ = std::fs::remove_dir_all(&partial);
        return Err(e);
    }
    std::fs::rename(&partial, &args.dir)
        .with_context(|| format!("cannot move {} to {}", partial.display(), args.dir.display()))?;
    eprintln!("root filesystem ready in {}", args.dir.display());
    Ok(())
}

fn build_into(partial: &Path, mirror: &str, args: &BuildArgs) -> anyhow::Result<()> {
    eprintln!("debootstrap {} from {mirror} into {}", args.suite, partial.display());
    let mut cmd = Command::new("debootstrap");
    cmd.arg("--variant=minbase");
    if !args.include.trim().is_empty() {
        cmd.arg(format!("--include={}", args.include.trim()));
    }
    cmd.arg(&args.suite).arg(partial).arg(mirror);
    run(&mut cmd)?;
    let has_user = std::fs::read_to_string(partial.join("etc/passwd"))
        .context("the new root has no /etc/passwd")?
        .lines()
        .any(|l| l.starts_with("user:"));
    if !has_user {
        run(Command::new("chroot").arg(partial).args([
            "useradd",
            "--create-home",
            "--uid",
            "1000",
            "--user-group",
            "--shell",
            "/bin/bash",
            "user",
        ]))?;
    }
    for cache in ["var/cache/apt/archives", "var/lib/apt/lists"] {
        let dir = partial.join(cache);
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_file()) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
    Ok(())
}

fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let status = cmd.status().with_context(|| format!("cannot run {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed ({status})");
    }
    Ok(())
}

fn partial_path(dir: &Path) -> PathBuf {
    let mut name = dir.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".partial");
    dir.with_file_name(name)
}

/// The archive URI this machine's apt sources use for `suite`.
pub(crate) fn machine_mirror(suite: &str) -> anyhow::Result<String> {
    let mut texts = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/etc/apt/sources.list.d") {
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "sources" || e == "list")
                && let Ok(text) = std::fs::read_to_string(&path)
            {
                texts.push(text);
            }
        }
    }
    if let Ok(text) = std::fs::read_to_string("/etc/apt/sources.list") {
        texts.push(text);
    }
    texts.iter().find_map(|t| mirror_for_suite(t, suite)).with_context(|| {
        format!("no apt source on this machine serves suite `{suite}`; pass --mirror URI")
    })
}

/// Finds the URI serving `suite` in an apt sources file, in deb822 or one-line format.
fn mirror_for_suite(text: &str, suite: &str) -> Option<String> {
    // One-line format: `deb [options] URI suite components...`.
    for line in text.lines().map(str::trim) {
        let mut words = line.split_whitespace();
        if words.next() != Some("deb") {
            continue;
        }
        let mut rest: Vec<&str> = words.collect();
        if rest.first().is_some_and(|w| w.starts_with('[')) {
            let end = rest.iter().position(|w| w.ends_with(']')).unwrap_or(0);
            rest.drain(..=end);
        }
        if rest.get(1) == Some(&suite) {
            return rest.first().map(|u| (*u).to_owned());
        }
    }
    // deb822 format: blank-line separated stanzas of `Key: value`.
    for stanza in text.split("\n\n") {
        let field = |key: &str| {
            stanza.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim().eq_ignore_ascii_case(key)).then(|| v.trim().to_owned())
            })
        };
        let is_deb = field("Types").is_some_and(|t| t.split_whitespace().any(|w| w == "deb"));
        let has_suite = field("Suites").is_some_and(|s| s.split_whitespace().any(|w| w == suite));
        if is_deb
            && has_suite
            && let Some(uris) = field("URIs")
        {
            return uris.split_whitespace().next().map(str::to_owned);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deb822_sources_give_the_suites_uri() {
        let text = "Types: deb\n# a comment\nURIs: http://archive.example/debian\n\
                    Suites: bookworm bookworm-updates\nComponents: main\n\n\
                    Types: deb\nURIs: http://archive.example/debian-security\n\
                    Suites: bookworm-security\nComponents: main\n";
        assert_eq!(
            mirror_for_suite(text, "bookworm").as_deref(),
            Some("http://archive.example/debian")
        );
        assert_eq!(
            mirror_for_suite(text, "bookworm-security").as_deref(),
            Some("http://archive.example/debian-security")
        );
        assert_eq!(mirror_for_suite(text, "trixie"), None);
    }

    #[test]
    fn one_line_sources_give_the_suites_uri() {
        let text = "# deb http://old.example/debian bookworm main\n\
                    deb-src http://src.example/debian bookworm main\n\
                    deb [signed-by=/k.gpg arch=amd64] http://archive.example/debian bookworm main\n";
        assert_eq!(
            mirror_for_suite(text, "bookworm").as_deref(),
            Some("http://archive.example/debian")
        );
    }

    #[test]
    fn partial_dir_sits_next_to_the_target() {
        assert_eq!(partial_path(Path::new("/a/b/root")), PathBuf::from("/a/b/root.partial"));
    }
}
