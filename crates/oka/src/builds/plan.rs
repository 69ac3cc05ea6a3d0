//! The pure rules of a template build: what each E2B step means ([`Step`]), the state the
//! steps carry from one to the next ([`BuildState`]: env, working directory, user), the shell
//! a COPY runs to put an archive's files in place, the log lines E2B's builder prints, and the
//! cache key of a build.
//!
//! Rules (E2B's builder's):
//! - `RUN`: `args[0]` runs as `/bin/bash -l -c <args[0]>` as `args[1]` when given, else the
//!   current user, in the current working directory, with the env of the earlier `ENV` steps;
//! - `COPY`: `args` = src, dest, user, mode; `src` is a path of the step's archive (relative to
//!   the SDK's context); a relative `dest` is under the working directory; a directory's
//!   contents go into `dest`, a file goes to `dest` itself unless `dest` ends with `/` or is a
//!   directory (then `dest/<name>`); the copied entries are owned by `user` (else the current
//!   user) and files get `mode` when given;
//! - `ENV`: key/value pairs, later ones win; `WORKDIR`: created when missing (owned by the
//!   current user), relative to the current one; `USER`: the user of later steps;
//! - the first user is the base's `USER`, else `user` when the base has that account (E2B's
//!   default), else `root`; the image's config keeps the final env, working directory and the
//!   user of the last `USER` step (else the base's).

use std::collections::BTreeMap;

use oka_image::ImageConfig;
use oka_manager::BuildStep;
use sha2::{Digest as _, Sha256};

/// One step, its arguments checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// A shell command, as a user (`None`: the current one).
    Run { command: String, user: Option<String> },
    /// Files of the step's archive put at `dest`.
    Copy { src: String, dest: String, user: Option<String>, mode: Option<u32> },
    /// Variables set for later steps and the image.
    Env(Vec<(String, String)>),
    /// The working directory of later steps and the image.
    Workdir(String),
    /// The user of later steps and the image.
    User(String),
}

/// Why a step cannot be run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct StepError(pub String);

impl Step {
    /// The step the SDK sent, checked.
    pub fn parse(step: &BuildStep) -> Result<Step, StepError> {
        let arg = |i: usize| step.args.get(i).map(String::as_str).filter(|a| !a.is_empty());
        let need = |i: usize, what: &str| {
            arg(i)
                .map(str::to_string)
                .ok_or_else(|| StepError(format!("{} needs {what}", step.kind)))
        };
        match step.kind.to_ascii_uppercase().as_str() {
            "RUN" => Ok(Step::Run { command: need(0, "a command")?, user: arg(1).map(Into::into) }),
            "COPY" => {
                let mode = match arg(3) {
                    Some(m) => Some(u32::from_str_radix(m, 8).map_err(|_| {
                        StepError(format!("COPY mode {m:?} is not an octal number"))
                    })?),
                    None => None,
                };
                Ok(Step::Copy {
                    src: need(0, "a source")?,
                    dest: need(1, "a destination")?,
                    user: arg(2).map(Into::into),
                    mode,
                })
            }
            "ENV" => {
                if !step.args.len().is_multiple_of(2) {
                    return Err(StepError("ENV needs key/value pairs".into()));
                }
                let pairs: Vec<(String, String)> =
                    step.args.chunks(2).map(|kv| (kv[0].clone(), kv[1].clone())).collect();
                if let Some((key, _)) = pairs.iter().find(|(k, _)| k.is_empty() || k.contains('='))
                {
                    return Err(StepError(format!("ENV name {key:?} is not a variable name")));
                }
                Ok(Step::Env(pairs))
            }
            "WORKDIR" => Ok(Step::Workdir(need(0, "a directory")?)),
            "USER" => Ok(Step::User(need(0, "a user")?)),
            other => Err(StepError(format!("unknown step type {other:?}"))),
        }
    }
}

/// What the steps carry from one to the next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildState {
    /// `NAME=value` in order, one per name.
    pub env: Vec<(String, String)>,
    /// The working directory (absolute).
    pub workdir: String,
    /// The user steps run as.
    pub user: String,
    /// The user a `USER` step set, for the image config.
    pub user_set: Option<String>,
    /// The working directory a `WORKDIR` step set, for the image config.
    pub workdir_set: Option<String>,
}

impl BuildState {
    /// The state before the first step on a base with `config`; `has_user_account`: whether
    /// the base's `/etc/passwd` has `user`.
    pub fn start(config: &ImageConfig, has_user_account: bool) -> BuildState {
        let env = config
            .env
            .iter()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let user = config
            .user
            .clone()
            .unwrap_or_else(|| if has_user_account { "user".into() } else { "root".into() });
        BuildState {
            env,
            workdir: config.working_dir.clone().unwrap_or_else(|| "/".into()),
            user,
            user_set: None,
            workdir_set: None,
        }
    }

    /// Sets `name` (replacing an earlier value in place).
    pub fn set_env(&mut self, name: &str, value: &str) {
        match self.env.iter_mut().find(|(k, _)| k == name) {
            Some(entry) => entry.1 = value.to_string(),
            None => self.env.push((name.to_string(), value.to_string())),
        }
    }

    /// `path` made absolute against the working directory.
    pub fn absolute(&self, path: &str) -> String {
        if path.starts_with('/') {
            path.to_string()
        } else {
            let base = self.workdir.trim_end_matches('/');
            let rest = path.trim_start_matches("./");
            format!("{base}/{rest}")
        }
    }

    /// The env as a map, for a process.
    pub fn env_map(&self) -> BTreeMap<String, String> {
        self.env.iter().cloned().collect()
    }

    /// The built image's config: the base's, with the final env, working directory and user.
    pub fn image_config(&self, base: &ImageConfig) -> ImageConfig {
        ImageConfig {
            env: self.env.iter().map(|(k, v)| format!("{k}={v}")).collect(),
            working_dir: self.workdir_set.clone().or_else(|| base.working_dir.clone()),
            user: self.user_set.clone().or_else(|| base.user.clone()),
            ..base.clone()
        }
    }
}

/// A string as one single-quoted shell word.
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The shell (run as root) that creates `dir` owned by `user` when it is missing.
pub fn workdir_script(dir: &str, user: &str) -> String {
    let (dir, user) = (shell_quote(dir), shell_quote(user));
    format!("set -e; if [ ! -d {dir} ]; then mkdir -p {dir}; chown {user} {dir}; fi")
}

/// The shell (run as root) that puts `src` of `archive` at `dest` as the module rules say,
/// owned by `owner`, files with `mode`, then removes the archive.
pub fn copy_script(archive: &str, src: &str, dest: &str, owner: &str, mode: Option<u32>) -> String {
    let mode = mode.map_or_else(String::new, |m| format!("{m:04o}"));
    let src = src.trim_start_matches("./").trim_end_matches('/');
    let src = if src.is_empty() { "." } else { src };
    format!(
        r#"set -e
archive={archive}; src={src}; dest={dest}; owner={owner}; mode={mode}
work=$(mktemp -d)
trap 'rm -rf "$work" "$archive"' EXIT
tar -xf "$archive" -C "$work"
cd "$work"
shopt -s nullglob dotglob
matches=( $src )
if [ ${{#matches[@]}} -eq 0 ]; then echo "COPY: no file matches $src" >&2; exit 1; fi
place() {{
  if [ -n "$mode" ]; then
    if [ -d "$1" ]; then find "$1" -type f -exec chmod "$mode" {{}} +; else chmod "$mode" "$1"; fi
  fi
  chown -R "$owner" "$1"
}}
if [ ${{#matches[@]}} -gt 1 ] || [ "${{dest%/}}" != "$dest" ] || [ -d "$dest" ]; then
  mkdir -p "$dest"
  for m in "${{matches[@]}}"; do
    if [ -d "$m" ] && [ ${{#matches[@]}} -eq 1 ]; then
      for e in "$m"/*; do place "$e"; cp -a "$e" "$dest"/; done
    else
      place "$m"; cp -a "$m" "$dest"/
    fi
  done
else
  m=${{matches[0]}}
  mkdir -p "$(dirname "$dest")"
  place "$m"
  if [ -d "$m" ]; then mkdir -p "$dest"; cp -a "$m"/. "$dest"/; else cp -a "$m" "$dest"; fi
fi
"#,
        archive = shell_quote(archive),
        src = shell_quote(src),
        dest = shell_quote(dest),
        owner = shell_quote(owner),
        mode = shell_quote(&mode),
    )
}

/// How a step is named in the log: `RUN apt-get install -y vim`.
pub fn describe(step: &BuildStep) -> String {
    let args: Vec<&str> = step.args.iter().map(String::as_str).filter(|a| !a.is_empty()).collect();
    format!("{} {}", step.kind.to_ascii_uppercase(), args.join(" ")).trim_end().to_string()
}

/// The log line that starts step `index` (1-based) of `count`: `Step 1/4 : RUN …`.
pub fn step_line(index: usize, count: usize, step: &BuildStep) -> String {
    format!("Step {index}/{count} : {}", describe(step))
}

/// The last `lines` lines of a command's output.
pub fn last_lines(output: &str, lines: usize) -> String {
    let all: Vec<&str> = output.lines().filter(|l| !l.trim().is_empty()).collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The cache key of a build: its base (what it names and, when known, the base's content
/// identity), each step's kind, arguments and copied archive's hash, in order.
pub fn cache_key(base: &str, steps: &[BuildStep], file_hashes: &[Option<String>]) -> String {
    let mut hasher = Sha256::new();
    let mut field = |bytes: &[u8]| {
        hasher.update((bytes.len() as u64).to_le_bytes());
        hasher.update(bytes);
    };
    field(base.as_bytes());
    for (step, hash) in steps.iter().zip(file_hashes) {
        field(step.kind.as_bytes());
        for arg in &step.args {
            field(arg.as_bytes());
        }
        field(hash.as_deref().unwrap_or_default().as_bytes());
    }
    let digest = hasher.finalize();
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(kind: &str, args: &[&str]) -> BuildStep {
        BuildStep {
            kind: kind.into(),
            args: args.iter().map(|a| a.to_string()).collect(),
            files: None,
            force: false,
        }
    }

    #[test]
    fn steps_are_parsed_as_the_sdk_sends_them() {
        assert_eq!(
            Step::parse(&step("RUN", &["echo hi", "root"])).unwrap(),
            Step::Run { command: "echo hi".into(), user: Some("root".into()) }
        );
        assert_eq!(
            Step::parse(&step("COPY", &["app", "/app/", "", "0755"])).unwrap(),
            Step::Copy { src: "app".into(), dest: "/app/".into(), user: None, mode: Some(0o755) }
        );
        assert_eq!(
            Step::parse(&step("ENV", &["A", "1", "B", "x y"])).unwrap(),
            Step::Env(vec![("A".into(), "1".into()), ("B".into(), "x y".into())])
        );
        assert!(Step::parse(&step("ENV", &["A"])).is_err());
        assert!(Step::parse(&step("COPY", &["a", "/b", "", "9z"])).is_err());
        assert!(Step::parse(&step("RUN", &[])).is_err());
        assert!(Step::parse(&step("FROM", &["x"])).is_err());
    }

    #[test]
    fn the_state_starts_from_the_base_and_ends_in_the_image_config() {
        let base = ImageConfig {
            env: vec!["PATH=/usr/bin".into(), "LANG=C".into()],
            cmd: vec!["bash".into()],
            ..ImageConfig::default()
        };
        let mut state = BuildState::start(&base, true);
        assert_eq!((state.user.as_str(), state.workdir.as_str()), ("user", "/"));
        assert_eq!(BuildState::start(&base, false).user, "root");
        state.set_env("LANG", "C.UTF-8");
        state.set_env("APP", "1");
        state.workdir = "/app".into();
        state.workdir_set = Some("/app".into());
        assert_eq!(state.absolute("./src/"), "/app/src/");
        assert_eq!(state.absolute("/etc/x"), "/etc/x");
        let config = state.image_config(&base);
        assert_eq!(config.env, ["PATH=/usr/bin", "LANG=C.UTF-8", "APP=1"]);
        assert_eq!(config.working_dir.as_deref(), Some("/app"));
        assert_eq!(config.user, None, "no USER step: the base's");
        assert_eq!(config.cmd, ["bash"]);
    }

    #[test]
    fn log_lines_and_cache_keys() {
        let run = step("RUN", &["exit 3"]);
        assert_eq!(step_line(2, 4, &run), "Step 2/4 : RUN exit 3");
        assert_eq!(last_lines("a\nb\n\nc\nd\n", 2), "c\nd");
        let key = cache_key("base", std::slice::from_ref(&run), &[None]);
        assert_eq!(key, cache_key("base", std::slice::from_ref(&run), &[None]));
        assert_ne!(key, cache_key("other", std::slice::from_ref(&run), &[None]));
        assert_ne!(key, cache_key("base", std::slice::from_ref(&run), &[Some("h".into())]));
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }
}
