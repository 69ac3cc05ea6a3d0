//! Every argument of okactl, in one place (clap derive): the command tree of the reference's
//! okactl (`scale`, `set image`, `status`, `restart`, `create suo`, `completion`) plus `get` and
//! `delete` for operators without kubectl.
//!
//! Values the reference validates with its own messages (`--replicas` below 0, the resource of
//! `set image`, `CONTAINER=IMAGE` arguments, `--failure-policy`) are taken as plain values here
//! and checked by the commands, so the messages are the reference's, not clap's.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// okactl manages OpenKruise Agents' sandboxes (oka's and a cluster's): scale pools, roll out
/// images, follow updates.
#[derive(Debug, Parser)]
#[command(name = "okactl", disable_version_flag = true, arg_required_else_help = true)]
pub struct Cli {
    /// Flags every command takes.
    #[command(flatten)]
    pub global: GlobalArgs,
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// How to reach the API server, and in which namespace to act.
#[derive(Debug, Args)]
pub struct GlobalArgs {
    /// Path to the kubeconfig file (else $KUBECONFIG, else ~/.kube/config).
    #[arg(long, global = true, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// Namespace to act in.
    #[arg(short = 'n', long, global = true, default_value = "default")]
    pub namespace: String,
    /// Kubeconfig context to use (else its current context).
    #[arg(long, global = true)]
    pub context: Option<String>,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Set the number of replicas of a SandboxSet.
    #[command(arg_required_else_help = true)]
    Scale {
        /// What to scale.
        #[command(subcommand)]
        target: ScaleTarget,
    },
    /// Set fields of a resource (images).
    #[command(arg_required_else_help = true)]
    Set {
        /// What to set.
        #[command(subcommand)]
        target: SetTarget,
    },
    /// Show the progress of a SandboxSet or a SandboxUpdateOps.
    #[command(arg_required_else_help = true)]
    Status {
        /// What to show.
        #[command(subcommand)]
        target: StatusTarget,
    },
    /// Restart containers of a sandbox.
    #[command(arg_required_else_help = true)]
    Restart {
        /// What to restart.
        #[command(subcommand)]
        target: RestartTarget,
    },
    /// Create a resource (SandboxUpdateOps).
    #[command(arg_required_else_help = true)]
    Create {
        /// What to create.
        #[command(subcommand)]
        target: CreateTarget,
    },
    /// Display one or many agents.kruise.io resources (kubectl's tables).
    Get(GetArgs),
    /// Delete agents.kruise.io resources by name.
    Delete(DeleteArgs),
    /// Generate the autocompletion script for the specified shell.
    Completion {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// `scale ...`.
#[derive(Debug, Subcommand)]
pub enum ScaleTarget {
    /// Scale a SandboxSet: a merge patch of `spec.replicas` (not the /scale subresource).
    #[command(name = "sandboxset", visible_alias = "sbs")]
    SandboxSet {
        /// The SandboxSet.
        name: String,
        /// The new number of replicas.
        #[arg(long, allow_negative_numbers = true)]
        replicas: i32,
    },
}

/// `set ...`.
#[derive(Debug, Subcommand)]
pub enum SetTarget {
    /// Update container images of a SandboxSet's inline template.
    ///
    /// RESOURCE is `sandboxset` or `sbs`. Every CONTAINER=IMAGE names a container or an init
    /// container of the template. With --wait, polls every 3 s until the pool is updated and
    /// available, explaining sandboxes that are stuck.
    Image(SetImageArgs),
}

/// `set image RESOURCE NAME CONTAINER=IMAGE...`.
#[derive(Debug, Args)]
pub struct SetImageArgs {
    /// The kind: sandboxset (sbs).
    pub resource: String,
    /// Its name.
    pub name: String,
    /// The images to set.
    #[arg(value_name = "CONTAINER=IMAGE", required = true)]
    pub images: Vec<String>,
    /// Wait until the update is complete.
    #[arg(short = 'w', long)]
    pub wait: bool,
    /// How long --wait waits (Go duration: 30s, 5m, 1h30m; 0 waits forever).
    #[arg(long, default_value = "5m", value_parser = oka_api::parse_go_duration)]
    pub timeout: std::time::Duration,
}

/// `status ...`.
#[derive(Debug, Subcommand)]
pub enum StatusTarget {
    /// Whether a SandboxSet's sandboxes run its current template, and why not.
    #[command(name = "sandboxset", visible_alias = "sbs")]
    SandboxSet {
        /// The SandboxSet.
        name: String,
    },
    /// A SandboxUpdateOps's phase and counts; exit 1 when it failed.
    #[command(name = "sandboxupdateops", visible_alias = "suo")]
    SandboxUpdateOps {
        /// The SandboxUpdateOps.
        name: String,
    },
}

/// `restart ...`.
#[derive(Debug, Subcommand)]
pub enum RestartTarget {
    /// Restart containers of a running sandbox.
    ///
    /// The reference creates an OpenKruise ContainerRecreateRequest, which oka does not run.
    /// oka's way: after the reference's checks, the annotation
    /// agents.kruise.io/restart-requested-at asks oka's sandbox controller to end the
    /// sandbox's processes and start its command again on the same files (same sandbox, same
    /// ID; a SandboxRestarted Event tells when). A local sandbox runs its first container only:
    /// -c names that one, --all restarts what runs. Processes started through the sandbox's
    /// agent runtime end with the restart.
    #[command(name = "sandbox", visible_alias = "sbx")]
    Sandbox(RestartArgs),
}

/// `restart sandbox NAME`.
#[derive(Debug, Args)]
pub struct RestartArgs {
    /// The sandbox.
    pub name: String,
    /// A container to restart (repeatable, or comma separated).
    #[arg(short = 'c', long = "container", value_delimiter = ',')]
    pub containers: Vec<String>,
    /// Restart every container (not init containers).
    #[arg(long)]
    pub all: bool,
    /// What a failed container restart does: Fail or Ignore.
    #[arg(long, default_value = "Fail")]
    pub failure_policy: String,
}

/// `create ...`.
#[derive(Debug, Subcommand)]
pub enum CreateTarget {
    /// Create a SandboxUpdateOps that sets images on the sandboxes a selector picks.
    #[command(name = "sandboxupdateops", visible_alias = "suo")]
    SandboxUpdateOps {
        /// The images to set.
        #[arg(value_name = "CONTAINER=IMAGE", required = true)]
        images: Vec<String>,
        /// The sandboxes to update (label selector: a=b,c!=d,e in (x,y),!f).
        #[arg(short = 'l', long)]
        selector: String,
    },
}

/// `get KIND [NAME]`.
#[derive(Debug, Args)]
pub struct GetArgs {
    /// The kind: sandboxes (sbx), sandboxsets (sbs), sandboxclaims (sbc), sandboxtemplates
    /// (sbt), sandboxupdateops (suo), checkpoints (cp), poolautoscalers (pas).
    pub kind: String,
    /// One object's name (else all of the namespace).
    pub name: Option<String>,
    /// Output format (default: kubectl's table).
    #[arg(short = 'o', long, value_enum)]
    pub output: Option<Output>,
    /// After listing, watch for changes.
    #[arg(short = 'w', long)]
    pub watch: bool,
    /// Label selector.
    #[arg(short = 'l', long)]
    pub selector: Option<String>,
    /// List across all namespaces.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
}

/// `-o` of `get`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// The table with the columns only `-o wide` shows.
    Wide,
    /// The objects as YAML.
    Yaml,
    /// The objects as JSON.
    Json,
    /// `kind.group/name` per object.
    Name,
}

/// `delete KIND NAME...`.
#[derive(Debug, Args)]
pub struct DeleteArgs {
    /// The kind (as for get).
    pub kind: String,
    /// The names.
    #[arg(required = true)]
    pub names: Vec<String>,
}

/// The command tree with help laid out as the reference's (cobra's): commands in groups,
/// "Resource Commands" and "Other Commands" at the top, each listed as `name (alias)`.
pub fn command() -> clap::Command {
    use clap::CommandFactory as _;
    cobra_help(Cli::command(), true)
}

/// The commands of the reference's "Other Commands" group; all others are resource commands.
const OTHER_COMMANDS: &[&str] = &["completion", "help"];

fn cobra_help(command: clap::Command, root: bool) -> clap::Command {
    let entries: Vec<(String, String)> = command
        .get_subcommands()
        .map(|sub| {
            let aliases: Vec<&str> = sub.get_visible_aliases().collect();
            let name = if aliases.is_empty() {
                sub.get_name().to_owned()
            } else {
                format!("{} ({})", sub.get_name(), aliases.join(", "))
            };
            (name, sub.get_about().map(|a| a.to_string()).unwrap_or_default())
        })
        .chain(root.then(|| ("help".to_owned(), "Help about any command".to_owned())))
        .collect();
    if entries.is_empty() {
        return command;
    }
    let width = entries.iter().map(|(name, _)| name.len()).max().unwrap_or(0);
    let list = |pick: &dyn Fn(&str) -> bool| -> String {
        entries
            .iter()
            .filter(|(name, _)| pick(name))
            .map(|(name, about)| format!("  {name:<width$}  {about}\n"))
            .collect()
    };
    let groups = if root {
        format!(
            "Resource Commands:\n{}\nOther Commands:\n{}",
            list(&|name| !OTHER_COMMANDS.contains(&name)),
            list(&|name| OTHER_COMMANDS.contains(&name))
        )
    } else {
        format!("Available Commands:\n{}", list(&|_| true))
    };
    let template = format!(
        "{{about-with-newline}}\n{{usage-heading}} {{usage}}\n\n{groups}\nOptions:\n{{options}}{{after-help}}"
    );
    let command = command.help_template(template);
    let names: Vec<String> = command.get_subcommands().map(|s| s.get_name().to_owned()).collect();
    names
        .into_iter()
        .fold(command, |command, name| command.mut_subcommand(name, |sub| cobra_help(sub, false)))
}
