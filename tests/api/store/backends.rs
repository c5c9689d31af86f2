//! Migrations and what only one backend has: readiness after migrating (both stores), Postgres
//! replicas migrating at once and its row locks under claims, SQLite file and URL forms.

use super::*;

async fn ready_after_migrate_and_migrate_is_idempotent(store: S) {
    store.ready().await.unwrap();
    store.migrate().await.unwrap();
    store.ready().await.unwrap();
}

crate::conformance!(ready_after_migrate_and_migrate_is_idempotent);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_replicas_migrating_at_once_both_succeed() {
    use pes_server::store::postgres::PgStore;
    let url = crate::db::fresh_postgres_url().await;
    let one = PgStore::connect(&url, 2).await.unwrap();
    let two = PgStore::connect(&url, 2).await.unwrap();
    assert!(one.ready().await.is_err(), "not ready before migrating");
    let (a, b) = tokio::join!(one.migrate(), two.migrate());
    a.unwrap();
    b.unwrap();
    one.ready().await.unwrap();
    two.ready().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_claim_never_jumps_a_locked_older_run_of_the_thread() {
    let pg = crate::db::postgres_store().await;
    let pool = pg.pg_pool().expect("a Postgres store").clone();
    let store: S = Arc::new(pg);
    let r1 = enqueue(&store, A, "t").await;
    let r2 = enqueue(&store, A, "t").await;
    // Someone (a cancel, an interrupt) holds the oldest run's row lock.
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM runs WHERE run_id = $1 FOR UPDATE")
        .bind(r1.run_id)
        .execute(&mut *tx)
        .await
        .unwrap();
    assert!(
        store.claim_run("w", LEASE).await.unwrap().is_none(),
        "the newer run must not be claimed while the older one is locked"
    );
    tx.rollback().await.unwrap();
    assert_eq!(claim(&store).await.run_id, r1.run_id);
    let _ = r2;
}

#[tokio::test]
async fn sqlite_creates_the_file_and_its_folder() {
    use pes_server::store::sqlite::SqliteStore;
    let (url, dir) = crate::db::fresh_sqlite_location();
    assert!(!dir.0.exists());
    let store = SqliteStore::connect(&url).await.unwrap();
    assert!(store.ready().await.is_err(), "not ready before migrating");
    store.migrate().await.unwrap();
    store.ready().await.unwrap();
    assert!(dir.0.join("data").join("pes.db").exists());
    // Data survives reopening.
    let store: S = Arc::new(store);
    thread(&store, A, "kept").await;
    drop(store);
    let reopened = SqliteStore::connect(&url).await.unwrap();
    reopened.migrate().await.unwrap();
    assert!(
        reopened
            .get_thread(A, &tid("kept"))
            .await
            .unwrap()
            .is_some()
    );
}

#[tokio::test]
async fn sqlite_accepts_relative_and_in_memory_urls() {
    use pes_server::store::sqlite::SqliteStore;
    let memory: S = Arc::new(SqliteStore::connect("sqlite::memory:").await.unwrap());
    memory.migrate().await.unwrap();
    let (_, f) = running(&memory, A, "t").await;
    let mut b = batch(A, "t");
    b.observe(obs(f.run_id, ObservationType::RunStarted, None));
    assert_eq!(
        seqs(&memory.apply(f, LEASE, b).await.unwrap().observations),
        [1]
    );
    assert_eq!(observations(&memory, A, "t").await.len(), 1);

    // A relative path is relative to the working directory (the package root under cargo).
    let rel = format!("target/pes-test-{}/nested/rel.db", Uuid::new_v4().simple());
    let store = SqliteStore::connect(&format!("sqlite://{rel}"))
        .await
        .unwrap();
    store.migrate().await.unwrap();
    assert!(std::path::Path::new(&rel).exists());
    drop(store);
    let top = std::path::Path::new(&rel)
        .parent()
        .unwrap()
        .parent()
        .unwrap();
    let _ = std::fs::remove_dir_all(top);
}
