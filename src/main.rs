//! The `pes-server` binary: parse configuration, start logging, run the library.

use clap::Parser;
use pes_server::config::{Cli, Command};
use pes_server::{App, telemetry};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    telemetry::init(&cli.config);
    match cli.command.unwrap_or(Command::Serve) {
        Command::Migrate => {
            let store = pes_server::app::connect_store(
                &cli.config.database_url,
                cli.config.database_max_connections,
            )
            .await?;
            store.migrate().await?;
            tracing::info!(store = store.backend(), "migrations applied");
        }
        Command::Openapi => {
            println!("{}", pes_server::http::openapi().to_pretty_json()?);
        }
        Command::Serve => {
            let app = App::build(cli.config).await?;
            let token = app.shutdown_token();
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
