//! `--webhooks`: the webhook receiver the bench serves on loopback (plain HTTP/1.1, keep-alive,
//! every request answered 204 at once), counting the deliveries it gets and their distinct
//! `webhook-id`s, so the report can say every run's webhook arrived, once.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// What arrived.
#[derive(Default)]
struct Seen {
    requests: usize,
    ids: HashSet<String>,
}

/// The receiver: its URL, and what it saw.
pub(crate) struct Receiver {
    pub(crate) url: String,
    seen: Arc<Mutex<Seen>>,
}

impl Receiver {
    /// Serve on a free loopback port (the task ends with the bench).
    pub(crate) async fn start() -> Result<Receiver> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the webhook receiver")?;
        let url = format!("http://{}/hook", listener.local_addr()?);
        let seen = Arc::new(Mutex::new(Seen::default()));
        let sink = seen.clone();
        // The receiver lives as long as the bench; nothing waits for it to stop.
        #[allow(clippy::disallowed_methods)]
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                #[allow(clippy::disallowed_methods)]
                tokio::spawn(serve(stream, sink.clone()));
            }
        });
        Ok(Receiver { url, seen })
    }

    /// Requests received, and distinct `webhook-id`s among them.
    pub(crate) fn counts(&self) -> (usize, usize) {
        let s = self.seen.lock().expect("receiver state");
        (s.requests, s.ids.len())
    }

    /// Wait until `n` distinct deliveries arrived (false: `deadline` passed first).
    pub(crate) async fn wait_for(&self, n: usize, deadline: Duration) -> bool {
        let until = Instant::now() + deadline;
        loop {
            if self.counts().1 >= n {
                return true;
            }
            if Instant::now() > until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// One connection: read requests (head, then `content-length` bytes), answer each 204.
async fn serve(stream: TcpStream, seen: Arc<Mutex<Seen>>) {
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    loop {
        let mut id = None;
        let mut length = 0usize;
        let mut line = String::new();
        let mut first = true;
        loop {
            line.clear();
            match read.read_line(&mut line).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let l = line.trim_end();
            if l.is_empty() {
                if first {
                    continue;
                }
                break;
            }
            first = false;
            if let Some((k, v)) = l.split_once(':') {
                match k.trim().to_ascii_lowercase().as_str() {
                    "content-length" => length = v.trim().parse().unwrap_or(0),
                    "webhook-id" => id = Some(v.trim().to_owned()),
                    _ => {}
                }
            }
        }
        let mut body = vec![0u8; length];
        if read.read_exact(&mut body).await.is_err() {
            return;
        }
        {
            let mut s = seen.lock().expect("receiver state");
            s.requests += 1;
            if let Some(id) = id {
                s.ids.insert(id);
            }
        }
        if write
            .write_all(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n")
            .await
            .is_err()
        {
            return;
        }
    }
}
