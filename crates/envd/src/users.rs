//! Users and path resolution (e2b-protocol.md §3.2).
//!
//! Users are read from a passwd file (`/etc/passwd` by default; tests point it elsewhere) instead of
//! `getpwnam`, which is not thread-safe and would pull NSS into a tiny static daemon.

use std::path::{Component, Path, PathBuf};

/// A user account.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    /// Login name.
    pub name: String,
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Home directory.
    pub home: PathBuf,
}

/// Looks `name` up in the passwd file at `passwd`.
pub fn lookup(passwd: &Path, name: &str) -> Option<User> {
    let text = std::fs::read_to_string(passwd).ok()?;
    text.lines().find_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() < 7 || f[0] != name {
            return None;
        }
        Some(User {
            name: f[0].to_owned(),
            uid: f[2].parse().ok()?,
            gid: f[3].parse().ok()?,
            home: PathBuf::from(if f[5].is_empty() { "/" } else { f[5] }),
        })
    })
}

/// The name of id `id` in a passwd or group file (field 0 where field 2 is `id`), else the number.
pub fn name_of(file: &Path, id: u32) -> String {
    let id_s = id.to_string();
    std::fs::read_to_string(file)
        .ok()
        .and_then(|text| {
            text.lines().find_map(|line| {
                let mut f = line.split(':');
                let name = f.next()?;
                f.next()?;
                (f.next()? == id_s).then(|| name.to_owned())
            })
        })
        .unwrap_or(id_s)
}

/// Why a path was refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// `~otheruser` and similar.
    #[error("path {0:?}: only ~ and ~/ of the current user are supported")]
    OtherHome(String),
    /// A path with `..` that would climb above `/`, or a NUL byte.
    #[error("invalid path {0:?}")]
    Invalid(String),
}

/// Resolves a request path: empty → `default_dir` or HOME, `~`/`~/x` → HOME-relative, relative →
/// HOME-relative; the result is absolute and lexically clean (`.`/`..` folded; `..` cannot climb
/// above `/`, and a path that tries to is refused).
pub fn resolve_path(
    path: &str,
    user: &User,
    default_dir: Option<&str>,
) -> Result<PathBuf, PathError> {
    if path.contains('\0') {
        return Err(PathError::Invalid(path.to_owned()));
    }
    let joined = if path.is_empty() {
        match default_dir {
            Some(d) if !d.is_empty() => PathBuf::from(d),
            _ => user.home.clone(),
        }
    } else if path == "~" {
        user.home.clone()
    } else if let Some(rest) = path.strip_prefix("~/") {
        user.home.join(rest)
    } else if path.starts_with('~') {
        return Err(PathError::OtherHome(path.to_owned()));
    } else if path.starts_with('/') {
        PathBuf::from(path)
    } else {
        user.home.join(path)
    };
    clean(&joined).ok_or_else(|| PathError::Invalid(path.to_owned()))
}

/// Lexically cleans an absolute path; `None` if `..` climbs above the root.
pub fn clean(p: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::Normal(n) => out.push(n),
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user() -> User {
        User { name: "user".into(), uid: 1000, gid: 1000, home: "/home/user".into() }
    }

    #[test]
    fn paths_resolve_like_envd() {
        let u = user();
        let r = |p: &str| resolve_path(p, &u, None);
        assert_eq!(r("").unwrap(), Path::new("/home/user"));
        assert_eq!(resolve_path("", &u, Some("/work")).unwrap(), Path::new("/work"));
        assert_eq!(r("~").unwrap(), Path::new("/home/user"));
        assert_eq!(r("~/a/./b").unwrap(), Path::new("/home/user/a/b"));
        assert_eq!(r("x/../y").unwrap(), Path::new("/home/user/y"));
        assert_eq!(r("/tmp//a/").unwrap(), Path::new("/tmp/a"));
        assert_eq!(r("/a/../../etc"), Err(PathError::Invalid("/a/../../etc".into())));
        assert!(matches!(r("~root/x"), Err(PathError::OtherHome(_))));
        assert!(r("a\0b").is_err());
    }

    #[test]
    fn passwd_lookup() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("passwd");
        std::fs::write(
            &p,
            "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1001::/home/user:/bin/bash\n",
        )
        .unwrap();
        assert_eq!(lookup(&p, "user").unwrap().gid, 1001);
        assert_eq!(lookup(&p, "nobody"), None);
        assert_eq!(name_of(&p, 0), "root");
        assert_eq!(name_of(&p, 42), "42");
    }
}
