//! The `pes-server` binary: parse configuration, start logging, run the library.

use std::process::ExitCode;

use pes_server::cli::{Cli, Command};
use pes_server::{App, telemetry};

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse_normalized();
    if let Some(Command::Ask(args)) = cli.command {
        // A client of a running service: none of the service's logging.
        return ExitCode::from(pes_server::ask::run(args).await);
    }
    let traces = telemetry::init(cli.config.log.as_deref(), cli.config.log_format);
    let result = run(cli).await;
    // The spans still queued are sent before the process exits.
    traces.shutdown().await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pes-server: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command.unwrap_or(Command::Serve) {
        Command::Migrate => {
            let store = pes_server::app::connect_store_waiting(
                &cli.config.database_url,
                cli.config.database_max_connections,
                std::time::Duration::from_secs(cli.config.db_connect_timeout_seconds),
            )
            .await?;
            store.migrate().await?;
            tracing::info!(store = store.backend(), "migrations applied");
        }
        Command::Healthcheck => {
            let mut addr = cli.config.bind;
            if addr.ip().is_unspecified() {
                addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
            }
            let resp = pes_server::net::client_builder()
                .build()?
                .get(format!("http://{addr}/healthz"))
                .timeout(std::time::Duration::from_secs(3))
                .send()
                .await?;
            anyhow::ensure!(resp.status().is_success(), "unhealthy: {}", resp.status());
        }
        Command::Openapi => {
            println!("{}", pes_server::http::openapi().to_pretty_json()?);
        }
        Command::Ask(_) => unreachable!("handled before logging starts"),
        Command::Serve => {
            let app = App::build(cli.config).await?;
            let token = app.shutdown_token();
            // Waits for the signal for as long as the process lives; nothing waits for it.
            #[allow(clippy::disallowed_methods)]
            tokio::spawn(async move {
                shutdown_signal().await;
                tracing::info!("shutdown signal received");
                token.cancel();
            });
            app.run_until_stopped().await?;
        }
    }
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("installing the SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
