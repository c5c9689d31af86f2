//! Database helpers for the integration tests: every call gets a database of its own.
//!
//! Postgres: a fresh `pes_test_<uuid>` database on the server of `DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/postgres`). It is not dropped when its test ends (the app
//! under test may still hold connections); instead each new one drops those left over 15 minutes
//! ago, because hundreds of idle databases keep Postgres's autovacuum busy and slow every later
//! test and benchmark on the machine. SQLite: a file in a folder of
//! its own under the system temp dir (the folder does not exist yet: the store must create it).
#![allow(dead_code)]

use std::path::PathBuf;

use pes_server::store::SqlStore;
use pes_server::store::postgres::PgStore;
use pes_server::store::sqlite::SqliteStore;
use sqlx::{Connection, Executor, PgConnection};
use uuid::Uuid;

/// The admin URL of the test Postgres server.
pub fn admin_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// `url` with its database name replaced by `db` (query string kept).
fn with_database(url: &str, db: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let after_scheme = base.find("://").map_or(0, |i| i + 3);
    let base = match base[after_scheme..].rfind('/') {
        Some(i) => &base[..after_scheme + i],
        None => base,
    };
    match query {
        Some(q) => format!("{base}/{db}?{q}"),
        None => format!("{base}/{db}"),
    }
}

/// Create an empty database and return its URL (not migrated).
pub async fn fresh_postgres_url() -> String {
    let admin = admin_url();
    // UUIDv7: the name carries its creation time, so `scripts/test` drops only stale databases.
    let name = format!("pes_test_{}", Uuid::now_v7().simple());
    let mut conn = PgConnection::connect(&admin)
        .await
        .unwrap_or_else(|e| panic!("cannot reach the test Postgres at {admin}: {e}"));
    conn.execute(format!("CREATE DATABASE {name}").as_str())
        .await
        .expect("create the test database");
    drop_stale_databases(&mut conn).await;
    conn.close().await.ok();
    with_database(&admin, &name)
}

/// No test lives this long: a test database older than this is a leftover.
const STALE_AFTER_MS: u128 = 15 * 60 * 1000;

/// Drop a few test databases created over [`STALE_AFTER_MS`] ago (their UUIDv7 name carries the
/// creation time). Best effort: one still in use, or dropped by another test meanwhile, is skipped.
async fn drop_stale_databases(conn: &mut PgConnection) {
    let Ok(names) = sqlx::query_scalar::<_, String>(
        "SELECT datname FROM pg_database WHERE datname LIKE 'pes\\_test\\_%' LIMIT 1000",
    )
    .fetch_all(&mut *conn)
    .await
    else {
        return;
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let stale = names.into_iter().filter(|n| {
        n.strip_prefix("pes_test_")
            .and_then(|hex| u128::from_str_radix(hex.get(..12)?, 16).ok())
            .is_some_and(|created| now.saturating_sub(created) > STALE_AFTER_MS)
    });
    for name in stale.take(20) {
        let _ = conn
            .execute(format!("DROP DATABASE IF EXISTS {name}").as_str())
            .await;
    }
}

/// A migrated Postgres store on a fresh database.
pub async fn postgres_store() -> SqlStore {
    let store = PgStore::connect(&fresh_postgres_url().await, 10)
        .await
        .expect("connect to the test database");
    store.migrate().await.expect("migrate");
    store
}

/// Removes a test's SQLite folder when dropped.
#[derive(Debug)]
pub struct TempDir(pub PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh folder (not created) and the URL of a database file two levels inside it.
pub fn fresh_sqlite_location() -> (String, TempDir) {
    let dir = std::env::temp_dir().join(format!("pes-test-{}", Uuid::new_v4().simple()));
    let file = dir.join("data").join("pes.db");
    (format!("sqlite://{}", file.display()), TempDir(dir))
}

/// The URL of a database file in a fresh folder that nobody cleans up (for a spawned app).
pub fn fresh_sqlite_url() -> String {
    let (url, dir) = fresh_sqlite_location();
    std::mem::forget(dir);
    url
}

/// A migrated SQLite store on a fresh file; keep the guard alive as long as the store.
pub async fn sqlite_store() -> (SqlStore, TempDir) {
    let (url, dir) = fresh_sqlite_location();
    let store = SqliteStore::connect(&url)
        .await
        .expect("open the test database");
    store.migrate().await.expect("migrate");
    (store, dir)
}

#[test]
fn database_name_is_swapped_in_urls() {
    assert_eq!(
        with_database("postgres://u@h:5432/postgres", "x"),
        "postgres://u@h:5432/x"
    );
    assert_eq!(
        with_database("postgres://u@h/postgres?sslmode=disable", "x"),
        "postgres://u@h/x?sslmode=disable"
    );
    assert_eq!(with_database("postgres://u@h", "x"), "postgres://u@h/x");
}
