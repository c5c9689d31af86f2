//! The command line: what to do (serve, migrate, print the OpenAPI document, check health, or
//! `ask`) and the settings ([`Config`]). It sits above everything it can start.

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::config::Config;

/// Durable Plan-Execute-Synthesize agents behind an HTTP API.
#[derive(Debug, Clone, Parser)]
#[command(name = "pes-server", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub config: Config,
}

/// What to do; serving is the default.
#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Serve the HTTP API and run agents (the default).
    Serve,
    /// Apply database migrations and exit.
    Migrate,
    /// Print the OpenAPI document and exit.
    Openapi,
    /// Exit 0 when the server on `PES_BIND` answers `/healthz` (for container health checks).
    Healthcheck,
    /// Post a query to a running service and follow its run in the terminal: the live tree, a
    /// question at each suspension, the final answer. Exit status: 0 completed, 1 the service
    /// could not be reached or refused, 2 bad arguments, 3 the run failed, 4 it was cancelled,
    /// 5 it waits for a person and the input has ended, 130 left after a second Ctrl-C.
    Ask(crate::ask::AskArgs),
}

impl Cli {
    /// Parse flags and environment, treating empty variables as unset (as compose files write
    /// them). `--help` names each setting's variable but never prints its value: see
    /// [`Cli::command_for_help`].
    pub fn parse_normalized() -> Self {
        let matches = Self::command_for_help().get_matches();
        let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
        cli.config = cli.config.normalized();
        cli
    }

    /// The command line, with every setting's environment value hidden from `--help` (clap
    /// prints `[env: X=value]` otherwise). Values are hidden for all settings, not only the
    /// known secrets, so a secret setting added later (or one that embeds a secret, as the
    /// database URL, MCP and A2A configurations do) cannot leak through `--help`.
    pub fn command_for_help() -> clap::Command {
        fn hide(cmd: clap::Command) -> clap::Command {
            cmd.mut_args(|a| a.hide_env_values(true))
                .mut_subcommands(hide)
        }
        hide(<Self as CommandFactory>::command())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn help_never_prints_an_environment_value() {
        fn check(cmd: &clap::Command) {
            for arg in cmd.get_arguments() {
                if arg.get_env().is_some() {
                    assert!(
                        arg.is_hide_env_values_set(),
                        "`--{}` would print its environment value in --help",
                        arg.get_id()
                    );
                }
            }
            for sub in cmd.get_subcommands() {
                check(sub);
            }
        }
        check(&Cli::command_for_help());
    }
}
