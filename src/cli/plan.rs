//! `dynrt plan` (in progress).

use std::process::ExitCode;

/// Arguments.
#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("this subcommand is not built yet")
}
