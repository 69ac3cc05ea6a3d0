//! The E2B template-build API: template requests, file uploads, build starts, status and logs,
//! tags; each build runs in the background through the [`crate::templatebuild::TemplateBuilder`] of
//! [`TemplateBuildConfig`], and a successful one becomes a SandboxTemplate and a warm
//! SandboxSet of the template's name.

use crate::templatebuild::TemplateBuildConfig;

/// The builds this manager serves: their configuration and the ones running now.
#[derive(Debug)]
pub(crate) struct Builds {
    #[expect(dead_code, reason = "the routes that read it come next")]
    pub(crate) config: TemplateBuildConfig,
}

impl Builds {
    /// Opens the builds' directory, recording builds a previous process left running as failed.
    pub(crate) fn open(config: TemplateBuildConfig) -> std::io::Result<Self> {
        std::fs::create_dir_all(&config.dir)?;
        Ok(Self { config })
    }
}
