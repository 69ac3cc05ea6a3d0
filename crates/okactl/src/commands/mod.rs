//! One module per command; [`run`] picks it. Each command is a few direct API calls: nothing
//! is cached between runs.

mod create;
mod delete;
mod get;
mod restart;
mod scale;
mod set_image;
mod status;

use crate::args::{
    Cli, Command, CreateTarget, RestartTarget, ScaleTarget, SetTarget, StatusTarget,
};
use crate::client;
use crate::printer::Printer;

/// Runs the command `cli` names.
pub async fn run(cli: Cli, printer: &Printer) -> anyhow::Result<()> {
    if let Command::Completion { shell } = cli.command {
        use clap::CommandFactory as _;
        let mut script = Vec::new();
        clap_complete::generate(shell, &mut Cli::command(), "okactl", &mut script);
        printer.text(&String::from_utf8_lossy(&script));
        return Ok(());
    }
    let ns = cli.global.namespace.clone();
    // Checks that need no server come first, so a mistake is reported without connecting.
    match &cli.command {
        Command::Scale { target: ScaleTarget::SandboxSet { replicas, .. } } => {
            scale::validate(*replicas)?;
        }
        Command::Set { target: SetTarget::Image(args) } => {
            set_image::validate(args)?;
        }
        _ => {}
    }
    let client = client::connect(&cli.global, printer).await?;
    match cli.command {
        Command::Scale { target: ScaleTarget::SandboxSet { name, replicas } } => {
            scale::run(&client, &ns, &name, replicas, printer).await
        }
        Command::Set { target: SetTarget::Image(args) } => {
            set_image::run(&client, &ns, &args, printer).await
        }
        Command::Status { target: StatusTarget::SandboxSet { name } } => {
            status::sandbox_set(&client, &ns, &name, printer).await
        }
        Command::Status { target: StatusTarget::SandboxUpdateOps { name } } => {
            status::update_ops(&client, &ns, &name, printer).await
        }
        Command::Restart { target: RestartTarget::Sandbox(args) } => {
            restart::run(&client, &ns, &args, printer).await
        }
        Command::Create { target: CreateTarget::SandboxUpdateOps { images, selector } } => {
            create::update_ops(&client, &ns, &images, &selector, printer).await
        }
        Command::Get(args) => get::run(&client, &ns, &args, printer).await,
        Command::Delete(args) => delete::run(&client, &ns, &args, printer).await,
        Command::Completion { .. } => Ok(()),
    }
}

/// `CONTAINER=IMAGE` arguments, split at the first `=`, both sides non-empty.
pub fn parse_images(args: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    args.iter()
        .map(|arg| match arg.split_once('=') {
            Some((container, image)) if !container.is_empty() && !image.is_empty() => {
                Ok((container.to_owned(), image.to_owned()))
            }
            _ => Err(anyhow::anyhow!(
                "invalid container=image argument \"{arg}\", expected format CONTAINER=IMAGE"
            )),
        })
        .collect()
}

/// Go's `%v` of a string slice: `[a b]`.
pub fn go_list(items: &[String]) -> String {
    format!("[{}]", items.join(" "))
}
