//! [`SqlStore`] itself: the pools of one backend and the connections the logic asks for (a read,
//! a snapshot, a write transaction, one write statement). Its [`Store`](super::Store)
//! implementation is in `sql_store.rs`; the rules in one file per concept.

use std::sync::Arc;

use sqlx::postgres::PgPool;
use sqlx::sqlite::SqlitePool;

use super::StoreResult;
use super::group::GroupCommit;
use super::sql::{Conn, Dialect, Link};

/// The pools of one backend.
#[derive(Debug, Clone)]
pub(crate) enum Db {
    Pg(PgPool),
    Lite {
        /// Exactly one connection: the only writer of this process.
        writer: SqlitePool,
        /// Readers (the writer pool itself for an in-memory database, which is per connection).
        reader: SqlitePool,
    },
}

/// The store over Postgres or SQLite (open one with [`super::postgres::PgStore::connect`] or
/// [`super::sqlite::SqliteStore::connect`]).
#[derive(Debug, Clone)]
pub struct SqlStore {
    pub(crate) db: Db,
    /// This store's id on the signals it sends (a random UUID per store).
    pub(crate) origin: Arc<str>,
    /// SQLite: batches waiting for the one writer, committed together.
    pub(crate) group: Arc<GroupCommit>,
}

impl SqlStore {
    pub(crate) fn new(db: Db) -> Self {
        SqlStore {
            db,
            origin: crate::model::new_id().to_string().into(),
            group: Arc::default(),
        }
    }

    fn conn(&self, link: Link) -> Conn {
        Conn::new(link, &self.origin)
    }

    pub(crate) fn dialect(&self) -> Dialect {
        match self.db {
            Db::Pg(_) => Dialect::Postgres,
            Db::Lite { .. } => Dialect::Sqlite,
        }
    }

    /// The Postgres pool, when the store is on Postgres (e.g. for a `LISTEN` connection).
    pub fn pg_pool(&self) -> Option<&PgPool> {
        match &self.db {
            Db::Pg(p) => Some(p),
            Db::Lite { .. } => None,
        }
    }

    /// A pooled connection for reads (each statement on its own).
    pub(crate) async fn read(&self) -> StoreResult<Conn> {
        Ok(match &self.db {
            Db::Pg(p) => self.conn(Link::Pg(p.acquire().await?)),
            Db::Lite { reader, .. } => self.conn(Link::Lite(reader.acquire().await?)),
        })
    }

    /// A read-only transaction: one snapshot for several reads.
    pub(crate) async fn snapshot(&self) -> StoreResult<Conn> {
        Ok(match &self.db {
            Db::Pg(p) => self.conn(Link::PgTx(
                p.begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                    .await?,
            )),
            Db::Lite { reader, .. } => self.conn(Link::LiteTx(reader.begin().await?)),
        })
    }

    /// A write transaction. On SQLite it is `BEGIN IMMEDIATE` on the one writer connection:
    /// writers of this process queue on the pool, and a writer in another process is waited for
    /// (`busy_timeout`) before anything was read, so read-then-write cannot deadlock.
    pub(crate) async fn write(&self) -> StoreResult<Conn> {
        Ok(match &self.db {
            Db::Pg(p) => self.conn(Link::PgTx(p.begin().await?)),
            Db::Lite { writer, .. } => {
                self.conn(Link::LiteTx(writer.begin_with("BEGIN IMMEDIATE").await?))
            }
        })
    }

    /// A connection for one self-contained write statement.
    pub(crate) async fn write_one(&self) -> StoreResult<Conn> {
        Ok(match &self.db {
            Db::Pg(p) => self.conn(Link::Pg(p.acquire().await?)),
            Db::Lite { writer, .. } => self.conn(Link::Lite(writer.acquire().await?)),
        })
    }
}
