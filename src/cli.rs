//! The command line: what to do (serve, migrate, print the OpenAPI document, check health, or
//! `ask`) and the settings ([`Config`]). It sits above everything it can start.

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::config::Config;

/// Durable Plan-Execute-Synthesize agents behind an HTTP API.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "pes-server",
    version,
    about,
    long_about = None,
    before_long_help = "This is the long help: every setting, with its reason. `pes-server -h` prints the summary."
)]
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
        let matches = Self::command_for_help()
            .try_get_matches()
            .unwrap_or_else(|e| in_words(e).exit());
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

/// A number setting that is not a number says so in words ("an integer"), not with the
/// parser's message ("invalid digit found in string"); every other error is clap's own.
fn in_words(e: clap::Error) -> clap::Error {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    const NOT_AN_INTEGER: [&str; 3] = [
        "invalid digit found in string",
        "cannot parse integer from empty string",
        "number too large to fit in target type",
    ];
    let source = std::error::Error::source(&e).map(ToString::to_string);
    let (Some(ContextValue::String(arg)), Some(ContextValue::String(value)), Some(source)) = (
        e.get(ContextKind::InvalidArg),
        e.get(ContextKind::InvalidValue),
        source,
    ) else {
        return e;
    };
    if e.kind() != ErrorKind::ValueValidation || !NOT_AN_INTEGER.contains(&source.as_str()) {
        return e;
    }
    let what = if source == NOT_AN_INTEGER[2] {
        "an integer, and this one is too large"
    } else {
        "an integer"
    };
    let mut cmd = Cli::command_for_help();
    cmd.build();
    clap::Error::raw(
        ErrorKind::ValueValidation,
        format!("invalid value '{value}' for '{arg}': expected {what}\n"),
    )
    .with_cmd(&cmd)
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

    #[test]
    fn help_a_number_setting_that_is_not_one_says_an_integer() {
        let parse = |args: &[&str]| {
            let e = Cli::command_for_help()
                .try_get_matches_from(args)
                .expect_err("refused");
            in_words(e).to_string()
        };
        let msg = parse(&["pes-server", "--store-max-value-bytes", "lots"]);
        assert!(msg.contains("expected an integer"), "{msg}");
        assert!(!msg.contains("invalid digit"), "{msg}");
        let msg = parse(&["pes-server", "--database-max-connections", "1.5"]);
        assert!(msg.contains("expected an integer"), "{msg}");
        // a range error stays clap's, which names the range
        let msg = parse(&["pes-server", "--store-max-value-bytes", "1"]);
        assert!(msg.contains("64..=16777216"), "{msg}");
    }

    #[test]
    fn help_long_help_points_to_the_summary() {
        let long = Cli::command_for_help().render_long_help().to_string();
        assert!(
            long.contains("`pes-server -h` prints the summary"),
            "{long}"
        );
        assert!(!long.contains("413 `value_too_large`"));
    }
}
