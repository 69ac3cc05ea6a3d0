//! The default templates' definitions, carried in the binary, and the hash that names each
//! built root.
//!
//! A definition is what a root is made from: a Debian suite installed with debootstrap, or
//! another template's root copied; Debian packages installed with apt; shell scripts run inside
//! it under chroot. Its hash covers all of that (the suite, the package list, each script's
//! name and text, the parent's hash) and names the built directory `<name>-<hash12>`, so a
//! changed definition is built anew beside the old one and an unchanged one is never rebuilt.

use sha2::{Digest as _, Sha256};

/// What a template's root starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// A Debian `minbase` root of this suite, made with debootstrap.
    Debian {
        /// The suite (`bookworm`).
        suite: &'static str,
    },
    /// A copy of another default template's built root.
    Template(&'static str),
}

/// A shell script run as root inside the root being built (under chroot, with `/proc`, `/dev`
/// and the host's resolv.conf present for the build only). `files` are written beside it
/// first, in a temporary directory that is removed afterwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Script {
    /// A short name, shown in progress lines.
    pub name: &'static str,
    /// The script's text (bash).
    pub text: &'static str,
}

/// One default template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Definition {
    /// Its name: the SandboxTemplate, the SandboxSet and the E2B template ID.
    pub name: &'static str,
    /// Where its root starts from.
    pub origin: Origin,
    /// Debian packages installed (without their recommendations) after the origin.
    pub packages: &'static [&'static str],
    /// Scripts run after the packages, in order.
    pub scripts: &'static [Script],
}

/// The version of the build's own steps ([`super::build`]: the debootstrap variant, dpkg's
/// exclusions, the clean-up), part of every hash: bump it when they change.
const BUILDER: &str = "oka-template-builder-1";

/// The Debian suite of the default templates.
pub const SUITE: &str = "bookworm";

/// The account every sandbox's processes run as (uid and gid 1000, home `/home/user`), with
/// passwordless sudo, as E2B's sandboxes have.
const USER_SCRIPT: &str = r#"set -eu
if ! getent passwd user >/dev/null; then
  useradd --create-home --uid 1000 --user-group --shell /bin/bash user
fi
printf 'user ALL=(ALL:ALL) NOPASSWD: ALL\n' >/etc/sudoers.d/user
chmod 0440 /etc/sudoers.d/user
visudo -c -q -f /etc/sudoers.d/user
"#;

/// `scripts/install-kernels.sh`: the Jupyter kernels of E2B's code-interpreter template
/// (python with numpy, pandas, matplotlib and e2b-charts; JavaScript and TypeScript on Deno;
/// bash; R; Java), installed under `/usr/local` of the root being built.
const INSTALL_KERNELS: &str = include_str!("../../../../scripts/install-kernels.sh");

/// The kernels' Python is the sandbox's `python3`, `python` and `pip` (first on `PATH`), so
/// `python3 -c 'import pandas'` and `pip install` in a command reach what the kernel imports;
/// `user` owns that environment, so `pip install` works without sudo, in a cell as in a
/// command.
///
/// They are small scripts, not symlinks: Python finds its venv from the path it was started
/// as, which a symlink elsewhere would hide.
const KERNEL_PYTHON_SCRIPT: &str = r#"set -eu
venv=/usr/local/lib/oka-kernels/python
for name in python3 python pip3 pip; do
  rm -f "/usr/local/bin/$name"
  printf '#!/bin/sh\nexec %s "$@"\n' "$venv/bin/$name" >"/usr/local/bin/$name"
  chmod 0755 "/usr/local/bin/$name"
done
chown -R 1000:1000 "$venv"
"#;

/// `base`: Debian with the tools E2B's base template offers (Python 3 with pip and venv,
/// Node.js with npm, git, curl, the C toolchain, ...) and passwordless sudo for `user`.
pub const BASE: Definition = Definition {
    name: "base",
    origin: Origin::Debian { suite: SUITE },
    packages: &[
        "sudo",
        "ca-certificates",
        "curl",
        "wget",
        "git",
        "openssh-client",
        "gnupg",
        "procps",
        "iproute2",
        "less",
        "vim-tiny",
        "unzip",
        "zip",
        "xz-utils",
        "bzip2",
        "jq",
        "build-essential",
        "pkg-config",
        "python3",
        "python3-pip",
        "python3-venv",
        "python3-dev",
        "nodejs",
        "npm",
        "locales",
        "tzdata",
    ],
    scripts: &[Script { name: "user", text: USER_SCRIPT }],
};

/// `code-interpreter-v1`: `base` with the Jupyter kernels `oka-interpreter` runs code in.
pub const CODE_INTERPRETER: Definition = Definition {
    name: "code-interpreter-v1",
    origin: Origin::Template("base"),
    packages: &[],
    scripts: &[
        Script { name: "kernels", text: INSTALL_KERNELS },
        Script { name: "kernel-python", text: KERNEL_PYTHON_SCRIPT },
    ],
};

/// Every default template, each after the one it is copied from.
pub const ALL: &[Definition] = &[BASE, CODE_INTERPRETER];

/// The definition named `name`.
pub fn find(name: &str) -> Option<&'static Definition> {
    ALL.iter().find(|d| d.name == name)
}

/// The chain of definitions `definition` is built from, origin first, itself last; `None`
/// when it names a template that is not defined.
pub fn lineage(definition: &Definition) -> Option<Vec<&'static Definition>> {
    let mut chain = vec![find(definition.name)?];
    while let Origin::Template(parent) = chain[chain.len() - 1].origin {
        if chain.len() > ALL.len() {
            return None;
        }
        chain.push(find(parent)?);
    }
    chain.reverse();
    Some(chain)
}

/// The definition's hash, hex: everything it is built from, its origin's hash included.
pub fn hash(definition: &Definition) -> String {
    hash_with(definition, |parent| find(parent).map(hash))
}

/// [`hash`] with the origin template's hash given by `parent_hash`.
fn hash_with(definition: &Definition, parent_hash: impl Fn(&str) -> Option<String>) -> String {
    let mut sha = Sha256::new();
    let mut field = |bytes: &[u8]| {
        sha.update((bytes.len() as u64).to_le_bytes());
        sha.update(bytes);
    };
    field(BUILDER.as_bytes());
    field(definition.name.as_bytes());
    match definition.origin {
        Origin::Debian { suite } => {
            field(b"debian");
            field(suite.as_bytes());
        }
        Origin::Template(parent) => {
            field(b"template");
            field(parent.as_bytes());
            field(parent_hash(parent).unwrap_or_default().as_bytes());
        }
    }
    field(&(definition.packages.len() as u64).to_le_bytes());
    for package in definition.packages {
        field(package.as_bytes());
    }
    field(&(definition.scripts.len() as u64).to_le_bytes());
    for script in definition.scripts {
        field(script.name.as_bytes());
        field(script.text.as_bytes());
    }
    sha.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The built root's directory name: `<name>-<first 12 hex digits of the hash>`.
pub fn dir_name(definition: &Definition) -> String {
    format!("{}-{}", definition.name, &hash(definition)[..12])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_definition_has_another_name_and_an_unchanged_one_the_same() {
        assert_eq!(dir_name(&BASE), dir_name(&BASE), "stable");
        assert!(dir_name(&BASE).starts_with("base-"));
        assert_eq!(dir_name(&BASE).len(), "base-".len() + 12);
        let more = Definition { packages: &["sudo", "python3", "htop"], ..BASE };
        let fewer = Definition { packages: &["sudo", "python3"], ..BASE };
        assert_ne!(dir_name(&more), dir_name(&fewer), "a changed package list");
        let script = Definition { scripts: &[Script { name: "user", text: "true" }], ..BASE };
        assert_ne!(dir_name(&script), dir_name(&BASE), "a changed script");
        let suite = Definition { origin: Origin::Debian { suite: "trixie" }, ..BASE };
        assert_ne!(dir_name(&suite), dir_name(&BASE), "another suite");
        // Fields do not run into each other: ["ab", "c"] is not ["a", "bc"].
        let ab = Definition { packages: &["ab", "c"], ..BASE };
        let bc = Definition { packages: &["a", "bc"], ..BASE };
        assert_ne!(hash(&ab), hash(&bc));
    }

    #[test]
    fn a_changed_parent_changes_the_child() {
        let child =
            |parent: &'static str| hash_with(&CODE_INTERPRETER, move |_| Some(parent.to_owned()));
        assert_ne!(child("one"), child("two"));
        assert_eq!(hash(&CODE_INTERPRETER), child(Box::leak(hash(&BASE).into_boxed_str())));
    }

    #[test]
    fn the_code_interpreter_is_built_on_base() {
        let chain = lineage(&CODE_INTERPRETER).unwrap();
        let names: Vec<_> = chain.iter().map(|d| d.name).collect();
        assert_eq!(names, ["base", "code-interpreter-v1"]);
        assert!(CODE_INTERPRETER.scripts[0].text.contains("ipykernel"));
        assert!(BASE.packages.contains(&"sudo"));
    }
}
