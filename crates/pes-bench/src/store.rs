//! The store the service runs on: a fresh Postgres database or SQLite file per bench run,
//! removed at the end, and Postgres's own transaction counter.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use sqlx::postgres::{PgPool, PgPoolOptions};

use crate::{Args, StoreKind};

/// A fresh store for one bench run.
pub(crate) enum Database {
    Postgres {
        admin: PgPool,
        name: String,
        url: String,
    },
    Sqlite {
        dir: PathBuf,
        url: String,
    },
}

impl Database {
    pub(crate) async fn create(args: &Args) -> Result<Database> {
        let id = uuid::Uuid::now_v7().simple().to_string();
        match args.store {
            StoreKind::Postgres => Self::create_postgres(&args.database_url, &id).await,
            StoreKind::Sqlite => Self::create_sqlite(&id),
        }
    }

    async fn create_postgres(admin_url: &str, id: &str) -> Result<Database> {
        let mut url = reqwest::Url::parse(admin_url)
            .with_context(|| format!("--database-url {admin_url:?} is not a URL"))?;
        ensure!(
            matches!(url.scheme(), "postgres" | "postgresql"),
            "--database-url must be a postgres:// URL"
        );
        let admin = PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(Duration::from_secs(10))
            .connect(admin_url)
            .await
            .with_context(|| format!("connecting to Postgres at {}", redact(&url)))?;
        let name = format!("pes_bench_{id}");
        sqlx::query(&format!("CREATE DATABASE \"{name}\""))
            .execute(&admin)
            .await
            .with_context(|| format!("creating database {name}"))?;
        url.set_path(&format!("/{name}"));
        Ok(Database::Postgres {
            admin,
            name,
            url: url.to_string(),
        })
    }

    fn create_sqlite(id: &str) -> Result<Database> {
        let dir = std::env::temp_dir().join(format!("pes-bench-{id}"));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let url = format!("sqlite://{}/pes.db", dir.display());
        Ok(Database::Sqlite { dir, url })
    }

    pub(crate) fn url(&self) -> &str {
        match self {
            Database::Postgres { url, .. } | Database::Sqlite { url, .. } => url,
        }
    }

    pub(crate) fn kind(&self) -> StoreKind {
        match self {
            Database::Postgres { .. } => StoreKind::Postgres,
            Database::Sqlite { .. } => StoreKind::Sqlite,
        }
    }

    pub(crate) fn kind_name(&self) -> &'static str {
        match self.kind() {
            StoreKind::Postgres => "postgres",
            StoreKind::Sqlite => "sqlite",
        }
    }

    /// Committed transactions of the bench database so far (Postgres only).
    pub(crate) async fn xact_commit(&self) -> Result<Option<i64>> {
        let Database::Postgres { admin, name, .. } = self else {
            return Ok(None);
        };
        let n: i64 =
            sqlx::query_scalar("SELECT xact_commit FROM pg_stat_database WHERE datname = $1")
                .bind(name)
                .fetch_one(admin)
                .await
                .context("reading pg_stat_database")?;
        Ok(Some(n))
    }

    pub(crate) async fn remove(&self) -> Result<()> {
        match self {
            Database::Postgres { admin, name, .. } => {
                sqlx::query(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                    .execute(admin)
                    .await
                    .with_context(|| format!("dropping database {name}"))?;
                admin.close().await;
            }
            Database::Sqlite { dir, .. } => std::fs::remove_dir_all(dir)
                .with_context(|| format!("removing {}", dir.display()))?,
        }
        Ok(())
    }
}

/// A URL without its password, for messages.
fn redact(url: &reqwest::Url) -> String {
    let mut u = url.clone();
    if u.password().is_some() {
        let _ = u.set_password(Some("***"));
    }
    u.to_string()
}

/// Postgres publishes a backend's statistics at most once a second while it is busy and within
/// 10 s once it is idle (PostgreSQL 15+), so `xact_commit` is read after the service has been
/// idle that long.
pub(crate) const PG_STATS_SETTLE: Duration = Duration::from_secs(11);
