//! A fresh PostgreSQL database a test: created on the server of
//! `AGENTVISOR_TEST_POSTGRES` (default `postgres://postgres@127.0.0.1:5432/postgres`,
//! the server this machine runs, trust auth), named for the process and a
//! counter. A test process drops, once, the databases that processes no
//! longer running left.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use agentvisor::stores::PostgresStore;

/// The server's maintenance URL.
pub(crate) fn server_url() -> String {
    std::env::var("AGENTVISOR_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// The URL of a new, empty database on the test server.
pub(crate) async fn fresh_database() -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    let name = format!(
        "agentvisor_t_{}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        agentvisor::RunId::new()
    );
    let url = server_url();
    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL at {url} does not answer: {e}"));
    tokio::spawn(conn);
    static SWEPT: AtomicBool = AtomicBool::new(false);
    if !SWEPT.swap(true, Ordering::Relaxed) {
        let left = client
            .query(
                "SELECT datname FROM pg_database WHERE datname LIKE 'agentvisor\\_t\\_%'",
                &[],
            )
            .await
            .unwrap();
        for row in left {
            let db: String = row.get(0);
            let pid = db.split('_').nth(2).unwrap_or_default();
            if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                // Another process may be sweeping it too: best effort.
                let _ = client
                    .batch_execute(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
                    .await;
            }
        }
    }
    client
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap();
    match url.rsplit_once('/') {
        Some((server, _)) => format!("{server}/{name}"),
        None => panic!("AGENTVISOR_TEST_POSTGRES has no database part: {url}"),
    }
}

/// A store on a new database.
pub(crate) async fn fresh_store() -> PostgresStore {
    PostgresStore::connect(&fresh_database().await)
        .await
        .unwrap()
}
