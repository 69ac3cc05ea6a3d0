//! `delete KIND NAME...`: deletes each object, printing kubectl's line for each; a name that
//! fails is reported and the others are still deleted (exit code 1 at the end).

use kube::api::DeleteParams;
use kube::core::Request;

use super::get::find_kind;
use crate::Reported;
use crate::args::DeleteArgs;
use crate::client;
use crate::printer::Printer;

/// Deletes the objects.
pub async fn run(
    client: &kube::Client,
    ns: &str,
    args: &DeleteArgs,
    printer: &Printer,
) -> anyhow::Result<()> {
    let kind = find_kind(&args.kind)?;
    let request = Request::new(kind.path(Some(ns)));
    let mut failed = false;
    for name in &args.names {
        let http = request.delete(name, &DeleteParams::default())?;
        match client.request_text(http).await {
            Ok(_) => printer.line(&format!("{} \"{name}\" deleted", kind.qualified())),
            Err(err) => {
                printer.error(&client::message(&err));
                failed = true;
            }
        }
    }
    if failed { Err(Reported.into()) } else { Ok(()) }
}
