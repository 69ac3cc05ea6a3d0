//! The default templates of `oka serve` (`base`, `code-interpreter-v1`): Debian roots built
//! from Debian's packages, so a sandbox has what its template says and never the host's
//! installed software.
//!
//! - [`definition`]: what each template is (suite, packages, scripts) and the hash that names
//!   its built directory `<dir>/<name>-<hash12>`: a changed definition is built anew, an
//!   unchanged one never.
//! - [`build`]: the build (debootstrap, apt, scripts under chroot), into `<name>.partial`
//!   renamed when complete, under a lock file so two processes never race.
//! - [`status`]: what the builds of this process are doing, which the E2B API tells a user
//!   who creates from a template still being built.
//!
//! # Expected flow of `oka serve`
//!
//! 1. For each default pool (`defaultPool`, and `codeInterpreterPool` when `oka-interpreter` is
//!    installed), look for its template's image in `templates.images`, else for its root under
//!    `templates.dir` (default `<stateDir>/templates`).
//! 2. An image: its pool (SandboxTemplate and SandboxSet, the image reference as the
//!    container's `image`) is ensured at once, and no root is built; the sandbox controller
//!    pulls the image as for any template (`ImagePullBackOff` and the kubelet's Events
//!    included). A built root: its pool, the root as the container's `image`, at once.
//! 3. The missing ones: one log line names them; they are built in the background, in order
//!    (`code-interpreter-v1` is copied from `base`), one log line per step, and each pool is
//!    created when its root is done. Meanwhile everything else is served, and a create of a
//!    template being built is answered 503 with `Retry-After` and how far the build is.
//! 4. A failed build is logged with its cause and how to retry; a create of its template is
//!    answered 503 with the same. The pool is never made on another root.
//!
//! Switching a template between an image and a built root is a change of oka's default like a
//! new definition: an unedited SandboxTemplate is moved ([`crate::pool::plan_template`]).
//!
//! `oka templates build` builds them ahead of time (what the test script and an operator
//! use; a root built so can be published as the image another machine names); `oka templates
//! list` shows where each comes from.

pub mod build;
pub mod definition;
pub mod status;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use oka_store::Store;
use tracing::{info, warn};

use self::build::{BuildSettings, Progress};
use self::definition::Definition;
use self::status::{NotReady, TemplateBuilds};
use crate::config::DefaultPoolConfig;
use crate::pool::PoolRoot;

/// `oka templates`.
#[derive(Debug, clap::Subcommand)]
pub enum TemplatesCommand {
    /// Build the default templates' roots now (needs root, debootstrap and the Debian archive).
    Build(BuildArgs),
    /// List the default templates: the image each runs on (`templates.images`), or whether
    /// its root is built.
    List(DirArgs),
}

/// Where the roots are.
#[derive(Debug, clap::Args)]
pub struct DirArgs {
    /// The templates directory [default: templates.dir of the config, else <stateDir>/templates].
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// A YAML config file (`oka serve`'s).
    #[arg(long, short = 'c', env = "OKA_CONFIG")]
    pub config: Option<PathBuf>,
}

/// Arguments of `oka templates build`.
#[derive(Debug, clap::Args)]
pub struct BuildArgs {
    #[command(flatten)]
    pub dir: DirArgs,
    /// The Debian archive [default: templates.mirror, else this machine's apt source].
    #[arg(long)]
    pub mirror: Option<String>,
    /// The templates to build [default: all but those on an image (templates.images)].
    pub names: Vec<String>,
}

fn resolve_dir(args: &DirArgs) -> anyhow::Result<(PathBuf, crate::config::Config)> {
    let config = crate::config::Config::load(args.config.as_deref())?;
    let dir = args.dir.clone().unwrap_or_else(|| config.templates.dir(&config.state_dir));
    Ok((dir, config))
}

/// Runs `oka templates`.
pub fn run(command: &TemplatesCommand) -> anyhow::Result<()> {
    match command {
        TemplatesCommand::List(args) => {
            let (dir, config) = resolve_dir(args)?;
            for definition in definition::ALL {
                let state = match (
                    config.templates.image(definition.name),
                    build::find_built(&dir, definition),
                ) {
                    (Some(image), _) => format!("image      {image} (templates.images)"),
                    (None, Some(root)) => format!("built      {}", root.display()),
                    (None, None) => {
                        format!("not built  {}", build::root_of(&dir, definition).display())
                    }
                };
                println!("{:<22}{state}", definition.name);
            }
            for stale in build::stale_roots(&dir) {
                println!(
                    "{:<22}stale      {} (an older definition; remove it when no sandbox runs on it)",
                    "",
                    stale.display()
                );
            }
            Ok(())
        }
        TemplatesCommand::Build(args) => {
            let (dir, config) = resolve_dir(&args.dir)?;
            let settings = BuildSettings {
                mirror: args.mirror.clone().or_else(|| config.templates.mirror.clone()),
                install_debootstrap: config.runtime.auto_install,
            };
            let mut wanted = Vec::new();
            for name in &args.names {
                let definition = definition::find(name).ok_or_else(|| {
                    anyhow::anyhow!(
                        "no default template {name}; there are: {}",
                        definition::ALL.iter().map(|d| d.name).collect::<Vec<_>>().join(", ")
                    )
                })?;
                wanted.push(definition);
            }
            if wanted.is_empty() {
                for definition in definition::ALL {
                    match config.templates.image(definition.name) {
                        Some(image) => info!(
                            template = definition.name,
                            "template {} runs on the image {image} (templates.images): not \
                             built; name it to build its root anyway",
                            definition.name
                        ),
                        None => wanted.push(definition),
                    }
                }
            }
            for definition in wanted {
                let built = build::ensure_built(&dir, definition, &settings, &log_progress)?;
                report_built(definition, &built);
            }
            Ok(())
        }
    }
}

/// One line per step (and during the packages step, per tenth of the packages).
fn log_progress(progress: &Progress) {
    info!(
        template = progress.template,
        "building template {}: step {}/{}: {}",
        progress.template,
        progress.step,
        progress.steps,
        progress.what
    );
}

fn report_built(definition: &Definition, built: &build::Built) {
    match built.size {
        Some(size) => info!(
            template = definition.name,
            root = %built.root.display(),
            "template {} built in {} s, {} MB",
            definition.name,
            built.took.as_secs(),
            size / 1_000_000
        ),
        None => {
            info!(template = definition.name, root = %built.root.display(), "template {} is built", definition.name)
        }
    }
}

/// A default pool and the template its root comes from.
#[derive(Debug, Clone)]
pub struct DefaultPool {
    /// The pool's settings.
    pub config: DefaultPoolConfig,
    /// Its command (none: the agent runtime alone).
    pub command: Vec<String>,
    /// Its template.
    pub definition: &'static Definition,
    /// The OCI image it runs on instead of the template's built root (`templates.images`).
    pub image: Option<String>,
    /// The Secrets that image is pulled with (`templates.imagePullSecrets`).
    pub pull_secrets: Vec<String>,
}

/// Ensures the default pools on their images or their template roots under `dir`: at once for
/// those on an image and the built ones, after a background build for the others (see the
/// module documentation). `builds` is what the E2B API asks.
pub async fn start_default_pools<S: Store + Clone + Send + Sync + 'static>(
    store: &S,
    pools: Vec<DefaultPool>,
    dir: &Path,
    settings: BuildSettings,
    builds: &Arc<TemplateBuilds>,
) -> anyhow::Result<()> {
    let builder: Builder = Box::new(move |dir, definition, progress| {
        build::ensure_built(dir, definition, &settings, progress)
    });
    start_default_pools_with(store, pools, dir, builder, builds).await
}

/// Builds one template's root (with its origin) under a directory, telling its progress.
pub type Builder = Box<
    dyn Fn(&Path, &Definition, &dyn Fn(&Progress)) -> Result<build::Built, build::BuildError>
        + Send,
>;

/// [`start_default_pools`] with the build done by `builder`.
pub async fn start_default_pools_with<S: Store + Clone + Send + Sync + 'static>(
    store: &S,
    pools: Vec<DefaultPool>,
    dir: &Path,
    builder: Builder,
    builds: &Arc<TemplateBuilds>,
) -> anyhow::Result<()> {
    let mut missing = Vec::new();
    for pool in pools {
        if let Some(image) = &pool.image {
            info!(
                template = pool.definition.name,
                image = %image,
                "the default template {} runs on the image {image} (templates.images): its pool \
                 {} pulls it, no root is built",
                pool.definition.name,
                pool.config.name
            );
            let root = PoolRoot::Image { reference: image, pull_secrets: &pool.pull_secrets };
            ensure(store, &pool, root).await?;
            continue;
        }
        match build::find_built(dir, pool.definition) {
            Some(root) => ensure(store, &pool, PoolRoot::Directory(&root)).await?,
            None => missing.push(pool),
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    let names: Vec<&str> = missing.iter().map(|p| p.config.name.as_str()).collect();
    info!(
        dir = %dir.display(),
        "building the default templates {} in the background (first start: a few minutes; \
         one line per step follows); oka serve is usable meanwhile, and a create of {} answers \
         503 with how far the build is until it is done",
        names.join(", "),
        names.join(" or ")
    );
    for pool in &missing {
        builds.start(&pool.config.name);
    }
    let handle = tokio::runtime::Handle::current();
    let store = store.clone();
    let dir = dir.to_owned();
    let builds = Arc::clone(builds);
    // A thread of its own, not the blocking pool: a shutdown never waits for a build (a
    // killed one leaves a `.partial` that the next build removes).
    std::thread::Builder::new().name("build-templates".into()).spawn(move || {
        for pool in missing {
            let name = pool.config.name.clone();
            let progress = |p: &Progress| {
                log_progress(p);
                builds.progress(&name, p);
            };
            match builder(&dir, pool.definition, &progress) {
                Ok(built) => {
                    report_built(pool.definition, &built);
                    let store = store.clone();
                    let builds = Arc::clone(&builds);
                    handle.spawn(async move {
                        match ensure(&store, &pool, PoolRoot::Directory(&built.root)).await {
                            Ok(()) => builds.ready(&pool.config.name),
                            Err(e) => builds.failed(&pool.config.name, format!("{e:#}")),
                        }
                    });
                }
                Err(e) => {
                    warn!(
                        template = pool.definition.name,
                        "template {} could not be built, its pool {} is not created: {e}; \
                         fix the cause and restart oka serve, or run `oka templates build {}`",
                        pool.definition.name,
                        name,
                        pool.definition.name
                    );
                    builds.failed(&name, e.to_string());
                }
            }
        }
    })?;
    Ok(())
}

async fn ensure<S: Store>(store: &S, pool: &DefaultPool, root: PoolRoot<'_>) -> anyhow::Result<()> {
    let command: Vec<&str> = pool.command.iter().map(String::as_str).collect();
    crate::pool::ensure_pool(store, &pool.config, &command, root)
        .await
        .map_err(|e| anyhow::anyhow!("cannot create the pool {}: {e}", pool.config.name))
}

/// What the manager asks before answering that a template does not exist.
pub fn pending_templates(
    builds: Arc<TemplateBuilds>,
) -> oka_manager::api::templates::PendingTemplates {
    use oka_manager::api::templates::{PendingTemplate, PendingTemplates};
    PendingTemplates::new(move |name| match builds.not_ready(name)? {
        NotReady::Building(message) => {
            Some(PendingTemplate::Building { message, retry_after_secs: status::RETRY_AFTER_SECS })
        }
        NotReady::Failed(message) => Some(PendingTemplate::Failed(message)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use oka_api::SandboxTemplate;
    use oka_store::embedded::{EmbeddedOptions, EmbeddedStore};

    /// A builder that makes an empty "root" after `release` is sent.
    fn gated_builder(release: std::sync::mpsc::Receiver<()>) -> Builder {
        let release = std::sync::Mutex::new(release);
        Box::new(move |dir, definition, progress| {
            progress(&Progress {
                template: definition.name,
                step: 1,
                steps: 4,
                what: "debootstrap bookworm".into(),
            });
            let _ = release.lock().unwrap().recv();
            let root = build::root_of(dir, definition);
            std::fs::create_dir_all(root.join("etc")).unwrap();
            std::fs::write(root.join("etc/oka-template"), definition.name).unwrap();
            Ok(build::Built { root, took: std::time::Duration::ZERO, size: Some(0) })
        })
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_missing_root_is_built_in_the_background_then_its_pool_is_created_on_it() {
        let state = tempfile::tempdir().unwrap();
        let store =
            EmbeddedStore::open(&state.path().join("s.redb"), EmbeddedOptions::default()).unwrap();
        let dir = state.path().join("templates");
        let pool = DefaultPool {
            config: DefaultPoolConfig::default(),
            command: vec![],
            definition: &definition::BASE,
            image: None,
            pull_secrets: vec![],
        };
        let builds = Arc::new(TemplateBuilds::default());
        let (release, gate) = std::sync::mpsc::channel();
        start_default_pools_with(&store, vec![pool.clone()], &dir, gated_builder(gate), &builds)
            .await
            .unwrap();
        // Being built: no pool yet, and the manager is told the step.
        assert_eq!(builds.building(), ["base"]);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let message = loop {
            if let Some(NotReady::Building(m)) = builds.not_ready("base")
                && m.contains("step 1/4")
            {
                break m;
            }
            assert!(std::time::Instant::now() < deadline, "no progress told");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        };
        assert!(message.contains("debootstrap bookworm"), "{message}");
        assert!(store.get::<SandboxTemplate>("default", "base").await.is_err());
        // Built: the pool is created on the root, and the manager is told nothing more.
        release.send(()).unwrap();
        while builds.not_ready("base").is_some() {
            assert!(std::time::Instant::now() < deadline, "the pool was not created");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let template: SandboxTemplate = store.get("default", "base").await.unwrap();
        let image = template.spec.template.unwrap().spec.unwrap().containers[0].image.clone();
        let root = build::root_of(&dir, &definition::BASE);
        assert_eq!(image.as_deref(), Some(root.to_str().unwrap()));
        // A second start finds it built and builds nothing.
        let builds = Arc::new(TemplateBuilds::default());
        let (_, never) = std::sync::mpsc::channel();
        start_default_pools_with(&store, vec![pool], &dir, gated_builder(never), &builds)
            .await
            .unwrap();
        assert!(builds.building().is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_template_on_an_image_is_never_built_and_its_pool_names_the_image_at_once() {
        let state = tempfile::tempdir().unwrap();
        let store =
            EmbeddedStore::open(&state.path().join("s.redb"), EmbeddedOptions::default()).unwrap();
        let dir = state.path().join("templates");
        let pool = DefaultPool {
            config: DefaultPoolConfig::default(),
            command: vec![],
            definition: &definition::BASE,
            image: Some("127.0.0.1:5000/oka/base:1".into()),
            pull_secrets: vec![],
        };
        let builds = Arc::new(TemplateBuilds::default());
        let never: Builder = Box::new(|_, definition, _| {
            panic!("template {} is on an image and was built", definition.name)
        });
        start_default_pools_with(&store, vec![pool], &dir, never, &builds).await.unwrap();
        assert!(builds.building().is_empty());
        assert_eq!(builds.not_ready("base"), None);
        let template: SandboxTemplate = store.get("default", "base").await.unwrap();
        let image = template.spec.template.unwrap().spec.unwrap().containers[0].image.clone();
        assert_eq!(image.as_deref(), Some("127.0.0.1:5000/oka/base:1"));
        assert!(!dir.exists(), "nothing built");
    }
}
