//! How an OCI image's configuration and a container of the pod template make the process a
//! sandbox runs, by Kubernetes' rules (the kubelet's, as its documentation states them). Pure:
//! the image's `/etc/passwd` and `/etc/group` are read by whoever pulled the image
//! ([`ImageAccounts`]), never here.
//!
//! | container | image | runs |
//! |---|---|---|
//! | no `command`, no `args` | `Entrypoint`, `Cmd` | `Entrypoint` + `Cmd` |
//! | `command`, no `args` | (ignored) | `command` |
//! | no `command`, `args` | `Entrypoint` (its `Cmd` ignored) | `Entrypoint` + `args` |
//! | `command`, `args` | (ignored) | `command` + `args` |
//!
//! An empty list counts as not given, as in the kubelet.
//!
//! - **env**: the image's `Env` first, then the container's; a container variable replaces the
//!   image's of the same name (later entries win, [`oka_runtime_api::ProcessSpec::env`]).
//! - **workingDir**: the container's, else the image's `WorkingDir` (a relative one is taken
//!   from `/`, as Docker does), else `/`.
//! - **user**: `securityContext.runAsUser` / `runAsGroup` (the container's, else the pod's)
//!   win over the image's `USER`; what they leave open comes from the image: `USER` is `uid`,
//!   `uid:gid`, `name`, `name:group` or a mix, names looked up in the image's `/etc/passwd` and
//!   `/etc/group`; a user without a group gets its primary group from `/etc/passwd` (else 0).
//!   A name the image does not know is [`ImageUserError`], which the sandbox shows as the
//!   kubelet's `CreateContainerConfigError`.

use std::path::PathBuf;

use oka_runtime_api::{EnvVar, User};

/// The parts of an OCI image's configuration (`config` of its config blob) a sandbox uses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageConfig {
    /// `Entrypoint`.
    pub entrypoint: Vec<String>,
    /// `Cmd`.
    pub cmd: Vec<String>,
    /// `Env`, each `NAME=value`.
    pub env: Vec<String>,
    /// `WorkingDir`.
    pub working_dir: Option<String>,
    /// `User`.
    pub user: Option<String>,
}

/// The image's account databases as its layers show them (the top-most layer that has the
/// file, whiteouts honoured); `None` when the image has none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageAccounts {
    /// `/etc/passwd`.
    pub passwd: Option<String>,
    /// `/etc/group`.
    pub group: Option<String>,
}

/// The image's `USER` names an account its `/etc/passwd` or `/etc/group` lacks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unable to find {what} {name:?} of the image's USER {user:?}: no matching entry in the image's {file}"
)]
pub struct ImageUserError {
    /// The image's `USER` as written.
    pub user: String,
    /// `user` or `group`.
    pub what: &'static str,
    /// The name not found.
    pub name: String,
    /// `/etc/passwd` or `/etc/group`.
    pub file: &'static str,
}

/// The program and its arguments: Kubernetes' `command`/`args` rule (see the module table).
/// Returns `(command, args)`, whose concatenation is the argument vector.
pub fn command_and_args(
    command: &[String],
    args: &[String],
    image: &ImageConfig,
) -> (Vec<String>, Vec<String>) {
    match (command.is_empty(), args.is_empty()) {
        (true, true) => (image.entrypoint.clone(), image.cmd.clone()),
        (true, false) => (image.entrypoint.clone(), args.to_vec()),
        (false, _) => (command.to_vec(), args.to_vec()),
    }
}

/// The environment: the image's `Env`, then `container` (later entries win).
pub fn environment(image: &ImageConfig, container: Vec<EnvVar>) -> Vec<EnvVar> {
    let mut env: Vec<EnvVar> = image
        .env
        .iter()
        .filter(|entry| !entry.is_empty())
        .map(|entry| match entry.split_once('=') {
            Some((name, value)) => EnvVar::new(name, value),
            None => EnvVar::new(entry.as_str(), ""),
        })
        .collect();
    env.extend(container);
    env
}

/// The working directory: the container's, else the image's (made absolute), else none (`/`).
pub fn working_dir(container: Option<&str>, image: &ImageConfig) -> Option<PathBuf> {
    if let Some(dir) = container.filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(dir));
    }
    let dir = image.working_dir.as_deref().filter(|d| !d.is_empty())?;
    Some(if dir.starts_with('/') { PathBuf::from(dir) } else { PathBuf::from("/").join(dir) })
}

/// The user and group the process runs as: `run_as_user` / `run_as_group` (already checked
/// ids) over the image's `USER`, names resolved in `accounts`. `None`: root, nothing asked.
///
/// # Errors
///
/// [`ImageUserError`] when the image's `USER` names an account the image lacks (only consulted
/// for what `run_as_user` / `run_as_group` leave open).
pub fn user(
    run_as_user: Option<u32>,
    run_as_group: Option<u32>,
    image: &ImageConfig,
    accounts: &ImageAccounts,
) -> Result<Option<User>, ImageUserError> {
    let image_user = image.user.as_deref().map(str::trim).filter(|u| !u.is_empty());
    if run_as_user.is_none() && run_as_group.is_none() && image_user.is_none() {
        return Ok(None);
    }
    let (user_part, group_part) = match image_user {
        Some(spec) => match spec.split_once(':') {
            Some((u, g)) => (Some(u), Some(g).filter(|g| !g.is_empty())),
            None => (Some(spec), None),
        },
        None => (None, None),
    };
    let not_found = |what: &'static str, name: &str, file: &'static str| ImageUserError {
        user: image_user.unwrap_or_default().to_owned(),
        what,
        name: name.to_owned(),
        file,
    };
    let passwd = accounts.passwd.as_deref().unwrap_or_default();
    let uid = match (run_as_user, user_part) {
        (Some(uid), _) => uid,
        (None, None) => 0,
        (None, Some(name)) => match name.parse::<u32>() {
            Ok(uid) => uid,
            Err(_) => passwd_by_name(passwd, name)
                .map(|(uid, _)| uid)
                .ok_or_else(|| not_found("user", name, "/etc/passwd"))?,
        },
    };
    let gid = match (run_as_group, group_part) {
        (Some(gid), _) => gid,
        // runAsUser replaces the image's user, and with it the image's group for that user.
        (None, Some(group)) if run_as_user.is_none() => match group.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => group_by_name(accounts.group.as_deref().unwrap_or_default(), group)
                .ok_or_else(|| not_found("group", group, "/etc/group"))?,
        },
        _ => primary_group(passwd, uid).unwrap_or(0),
    };
    Ok(Some(User { uid, gid }))
}

/// `(uid, gid)` of the account `name` in a passwd file.
fn passwd_by_name(passwd: &str, name: &str) -> Option<(u32, u32)> {
    passwd.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        (fields.len() >= 4 && fields[0] == name)
            .then(|| Some((fields[2].parse().ok()?, fields[3].parse().ok()?)))
            .flatten()
    })
}

/// The primary group of `uid` in a passwd file.
fn primary_group(passwd: &str, uid: u32) -> Option<u32> {
    passwd.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        (fields.len() >= 4 && fields[2].parse::<u32>().ok() == Some(uid))
            .then(|| fields[3].parse().ok())
            .flatten()
    })
}

/// The gid of the group `name` in a group file.
fn group_by_name(group: &str, name: &str) -> Option<u32> {
    group.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        (fields.len() >= 3 && fields[0] == name).then(|| fields[2].parse().ok()).flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    fn image() -> ImageConfig {
        ImageConfig {
            entrypoint: strings(&["/ep-1", "foo"]),
            cmd: strings(&["bar"]),
            env: strings(&["PATH=/usr/bin:/bin", "LANG=C.UTF-8", "EMPTY"]),
            working_dir: Some("/srv/app".into()),
            user: None,
        }
    }

    /// The table of Kubernetes' "Define a Command and Arguments for a Container" (its notes on
    /// how `command` and `args` interact with the image's `Entrypoint` and `Cmd`).
    #[test]
    fn command_and_args_follow_the_kubernetes_documentation_table() {
        let image = image();
        let run = |command: &[&str], args: &[&str]| {
            let (c, a) = command_and_args(&strings(command), &strings(args), &image);
            [c, a].concat()
        };
        // Neither: the image's entrypoint and cmd.
        assert_eq!(run(&[], &[]), ["/ep-1", "foo", "bar"]);
        // Command only: the image's entrypoint and cmd are ignored.
        assert_eq!(run(&["/ep-2"], &[]), ["/ep-2"]);
        // Args only: the image's entrypoint with the container's args.
        assert_eq!(run(&[], &["zoo", "boo"]), ["/ep-1", "foo", "zoo", "boo"]);
        // Both: the image's are ignored.
        assert_eq!(run(&["/ep-2"], &["zoo", "boo"]), ["/ep-2", "zoo", "boo"]);
        // An image with only a Cmd, and no container command: the Cmd is the program.
        let cmd_only = ImageConfig { entrypoint: vec![], cmd: strings(&["sh"]), ..image.clone() };
        assert_eq!(command_and_args(&[], &[], &cmd_only), (vec![], strings(&["sh"])));
    }

    #[test]
    fn the_containers_env_comes_after_the_images_and_overrides_it_by_name() {
        let env =
            environment(&image(), vec![EnvVar::new("LANG", "fr_FR.UTF-8"), EnvVar::new("X", "1")]);
        let pairs: Vec<(&str, &str)> =
            env.iter().map(|v| (v.name.as_str(), v.value.as_str())).collect();
        assert_eq!(
            pairs,
            [
                ("PATH", "/usr/bin:/bin"),
                ("LANG", "C.UTF-8"),
                ("EMPTY", ""),
                ("LANG", "fr_FR.UTF-8"),
                ("X", "1")
            ]
        );
        // The runtime keeps the last of a name: the container's LANG.
    }

    #[test]
    fn the_containers_working_dir_wins_else_the_images() {
        assert_eq!(working_dir(Some("/work"), &image()), Some("/work".into()));
        assert_eq!(working_dir(None, &image()), Some("/srv/app".into()));
        let relative = ImageConfig { working_dir: Some("app".into()), ..image() };
        assert_eq!(working_dir(None, &relative), Some("/app".into()));
        assert_eq!(working_dir(None, &ImageConfig::default()), None);
    }

    fn accounts() -> ImageAccounts {
        ImageAccounts {
            passwd: Some(
                "root:x:0:0:root:/root:/bin/sh\nnode:x:1000:1001:node:/home/node:/bin/sh\n".into(),
            ),
            group: Some("root:x:0:\nnode:x:1001:\nstaff:x:50:node\n".into()),
        }
    }

    #[test]
    fn the_images_user_is_numeric_or_a_name_of_its_passwd_and_group_files() {
        let with_user = |u: &str| ImageConfig { user: Some(u.into()), ..image() };
        let run = |u: &str| user(None, None, &with_user(u), &accounts());
        assert_eq!(user(None, None, &image(), &accounts()), Ok(None), "root, nothing asked");
        assert_eq!(run("1000"), Ok(Some(User { uid: 1000, gid: 1001 })), "primary group");
        assert_eq!(run("4242"), Ok(Some(User { uid: 4242, gid: 0 })), "unknown uid: group 0");
        assert_eq!(run("4242:7"), Ok(Some(User { uid: 4242, gid: 7 })));
        assert_eq!(run("node"), Ok(Some(User { uid: 1000, gid: 1001 })));
        assert_eq!(run("node:staff"), Ok(Some(User { uid: 1000, gid: 50 })));
        assert_eq!(run("0:staff"), Ok(Some(User { uid: 0, gid: 50 })));
        let err = run("nobody").unwrap_err();
        assert_eq!((err.what, err.name.as_str(), err.file), ("user", "nobody", "/etc/passwd"));
        assert!(err.to_string().contains("\"nobody\""), "{err}");
        let err = run("node:wheel").unwrap_err();
        assert_eq!((err.what, err.file), ("group", "/etc/group"));
        // An image without /etc/passwd knows no names.
        assert!(user(None, None, &with_user("node"), &ImageAccounts::default()).is_err());
    }

    #[test]
    fn run_as_user_and_group_win_over_the_images_user() {
        let image = ImageConfig { user: Some("node:staff".into()), ..image() };
        let accounts = accounts();
        // runAsUser replaces the image's user and group: the uid's primary group, else 0.
        assert_eq!(
            user(Some(1000), None, &image, &accounts),
            Ok(Some(User { uid: 1000, gid: 1001 }))
        );
        assert_eq!(user(Some(5), None, &image, &accounts), Ok(Some(User { uid: 5, gid: 0 })));
        // runAsGroup alone keeps the image's user.
        assert_eq!(user(None, Some(9), &image, &accounts), Ok(Some(User { uid: 1000, gid: 9 })));
        assert_eq!(user(Some(5), Some(9), &image, &accounts), Ok(Some(User { uid: 5, gid: 9 })));
        // The image's names are not looked up when both are given.
        let unknown = ImageConfig { user: Some("ghost".into()), ..image };
        assert_eq!(user(Some(5), Some(9), &unknown, &accounts), Ok(Some(User { uid: 5, gid: 9 })));
    }
}
