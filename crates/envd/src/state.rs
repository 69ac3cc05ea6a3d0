//! Daemon configuration and shared state.

use crate::process::Processes;
use crate::users::{self, User};
use crate::watch::Watchers;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

/// The envd version reported by `/init` (`X-Envd-Version`); gates SDK features (e2b-protocol.md §3.8).
pub const ENVD_VERSION: &str = "0.6.13";

/// Static configuration of the daemon.
#[derive(Clone, Debug)]
pub struct Config {
    /// The default user when neither the request nor `/init` names one. If that user does not exist,
    /// `root` is used (envd's built-in default).
    pub default_user: String,
    /// The passwd file users are looked up in.
    pub passwd: PathBuf,
    /// The group file group names are looked up in.
    pub group: PathBuf,
    /// Sandbox id, exported to processes as `E2B_SANDBOX_ID`.
    pub sandbox_id: Option<String>,
    /// Template id, exported to processes as `E2B_TEMPLATE_ID`.
    pub template_id: Option<String>,
    /// The sandbox container's env (its image's `ENV` and the template's `env`), which every
    /// process gets below `/init`'s envVars: the daemon's own environment when it is the
    /// sandbox's init, empty otherwise.
    pub container_env: std::collections::BTreeMap<String, String>,
    /// The default working directory until `/init` sets one (the container's `workingDir`).
    pub default_workdir: Option<String>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            default_user: "user".into(),
            passwd: "/etc/passwd".into(),
            group: "/etc/group".into(),
            sandbox_id: None,
            template_id: None,
            container_env: std::collections::BTreeMap::new(),
            default_workdir: None,
        }
    }
}

/// What `/init` set.
#[derive(Clone, Debug, Default)]
pub struct InitState {
    /// The access token required in `X-Access-Token`, if any.
    pub access_token: Option<String>,
    /// Default user set by the control plane.
    pub default_user: Option<String>,
    /// Default working directory set by the control plane.
    pub default_workdir: Option<String>,
    /// Global env vars (create `envVars`).
    pub env_vars: HashMap<String, String>,
}

/// The shared state handed to every handler.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

struct Inner {
    config: Config,
    init: RwLock<InitState>,
    processes: Processes,
    watchers: Watchers,
    cpu: std::sync::Mutex<Option<(u64, u64)>>,
}

impl AppState {
    /// New state from `config`.
    pub fn new(config: Config) -> Self {
        let init =
            InitState { default_workdir: config.default_workdir.clone(), ..InitState::default() };
        Self {
            inner: Arc::new(Inner {
                config,
                init: RwLock::new(init),
                processes: Processes::default(),
                watchers: Watchers::default(),
                cpu: std::sync::Mutex::new(None),
            }),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// A copy of the `/init` state.
    pub fn init(&self) -> InitState {
        self.inner.init.read().map(|g| g.clone()).unwrap_or_default()
    }

    /// Replaces the `/init` state.
    pub fn set_init(&self, f: impl FnOnce(&mut InitState)) {
        if let Ok(mut g) = self.inner.init.write() {
            f(&mut g);
        }
    }

    /// The process table.
    pub fn processes(&self) -> &Processes {
        &self.inner.processes
    }

    /// The watcher table.
    pub fn watchers(&self) -> &Watchers {
        &self.inner.watchers
    }

    /// Previous `/proc/stat` CPU sample (busy, total) for `/metrics`.
    pub(crate) fn cpu_sample(&self) -> &std::sync::Mutex<Option<(u64, u64)>> {
        &self.inner.cpu
    }

    /// Resolves the operation user: `requested` if given (unknown → `None`), else the default.
    pub fn user(&self, requested: Option<&str>) -> Result<User, String> {
        let passwd = &self.inner.config.passwd;
        if let Some(name) = requested.filter(|n| !n.is_empty()) {
            return users::lookup(passwd, name).ok_or_else(|| name.to_owned());
        }
        let init_default = self.init().default_user.filter(|n| !n.is_empty());
        if let Some(name) = init_default {
            return users::lookup(passwd, &name).ok_or(name);
        }
        let name = &self.inner.config.default_user;
        users::lookup(passwd, name)
            .or_else(|| users::lookup(passwd, "root"))
            .or_else(|| (name == "root").then(root_fallback))
            .ok_or_else(|| name.clone())
    }

    /// Global env vars of processes: `/init` envVars plus the internal `E2B_*` ones (which win).
    pub fn global_env(&self) -> HashMap<String, String> {
        let mut env = self.init().env_vars;
        env.insert("E2B_SANDBOX".into(), "true".into());
        if let Some(id) = &self.inner.config.sandbox_id {
            env.insert("E2B_SANDBOX_ID".into(), id.clone());
        }
        if let Some(id) = &self.inner.config.template_id {
            env.insert("E2B_TEMPLATE_ID".into(), id.clone());
        }
        env
    }
}

fn root_fallback() -> User {
    User { name: "root".into(), uid: 0, gid: 0, home: "/root".into() }
}
