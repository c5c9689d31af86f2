//! Group commit for SQLite's one writer: batches that arrive while the writer is busy are
//! committed together, several runs' batches between one `BEGIN IMMEDIATE` and one `COMMIT`.
//! Each batch is still one call to the connection's thread (see `sqlite::commit_call`), so a batch
//! costs one round trip to that thread instead of three, and the writer is held for fewer of
//! them while other runs wait.
//!
//! Leader and followers: a committer queues its batch, then either receives its answer or takes
//! the writer's turn and commits everything queued (its own batch and the others'). Nothing is
//! spawned. A batch whose fence no longer holds writes nothing (every statement of it is gated
//! by the fence) and answers [`StoreError::LeaseLost`] without disturbing the others. Any other
//! error rolls the whole group back (a failed call may have run part of its batch), and every
//! batch is then committed alone, so one bad batch fails only itself.
//!
//! Should a leader be dropped mid-group (its run was stopped), the others answer an error and
//! their runs stop; whether or not the group committed, a re-claimed run continues from what is
//! stored, as after a crash.

use std::future::Future;
use std::sync::Mutex;

use tokio::sync::oneshot;

use super::sql::{Conn, Q};
use super::{StoreError, StoreResult};

/// What a committed batch reports: the run's `cancel_requested` and the last seq reserved.
pub(crate) type Committed = (bool, i64);

struct Pending {
    stmt: Q,
    reply: oneshot::Sender<StoreResult<Committed>>,
}

/// The queue of batches waiting for the writer, and whose turn it is to commit them.
#[derive(Default)]
pub(crate) struct GroupCommit {
    queue: Mutex<Vec<Pending>>,
    turn: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for GroupCommit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupCommit").finish_non_exhaustive()
    }
}

impl GroupCommit {
    fn take(&self) -> Vec<Pending> {
        std::mem::take(&mut *self.queue.lock().expect("group commit queue"))
    }

    /// Commit one batch's call (`sqlite::commit_call`), with whatever else is waiting; `begin`
    /// starts a write transaction on the writer.
    pub(crate) async fn commit<F, Fut>(&self, stmt: Q, begin: F) -> StoreResult<Committed>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = StoreResult<Conn>>,
    {
        let group = self;
        let (reply, mut answer) = oneshot::channel();
        group
            .queue
            .lock()
            .expect("group commit queue")
            .push(Pending { stmt, reply });
        loop {
            tokio::select! {
                biased;
                got = &mut answer => {
                    return got.unwrap_or_else(|_| Err(StoreError::Conflict(
                        "the commit's group was abandoned; the run continues from what is stored"
                            .into(),
                    )));
                }
                turn = group.turn.lock() => {
                    let batch = group.take();
                    if !batch.is_empty() {
                        self.commit_group(batch, &begin).await;
                    }
                    drop(turn);
                }
            }
        }
    }

    async fn commit_group<F, Fut>(&self, batch: Vec<Pending>, begin: &F)
    where
        F: Fn() -> Fut,
        Fut: Future<Output = StoreResult<Conn>>,
    {
        match try_group(&batch, begin).await {
            Ok(answers) => {
                for (p, a) in batch.into_iter().zip(answers) {
                    let _ = p.reply.send(a);
                }
            }
            // One failed: nothing of the group was kept; each batch alone now.
            Err(_) if batch.len() > 1 => {
                for p in batch {
                    let alone = match try_group(std::slice::from_ref(&p), begin).await {
                        Ok(mut answers) => answers.pop().unwrap_or(Err(StoreError::LeaseLost)),
                        Err(e) => Err(e),
                    };
                    let _ = p.reply.send(alone);
                }
            }
            // A group of one: its own error.
            Err(e) => {
                if let Some(p) = batch.into_iter().next() {
                    let _ = p.reply.send(Err(e));
                }
            }
        }
    }
}

/// The group in one transaction: each batch's answer, or the error that rolled it back.
async fn try_group<F, Fut>(batch: &[Pending], begin: &F) -> StoreResult<Vec<StoreResult<Committed>>>
where
    F: Fn() -> Fut,
    Fut: Future<Output = StoreResult<Conn>>,
{
    let mut tx = begin().await?;
    let mut answers = Vec::with_capacity(batch.len());
    for p in batch {
        let answer = match tx.all(p.stmt.clone()).await?.pop() {
            Some(row) => Ok((row.boolean("cancel_requested")?, row.int("last_seq")?)),
            // The fence no longer holds: this batch wrote nothing.
            None => Err(StoreError::LeaseLost),
        };
        answers.push(answer);
    }
    tx.commit().await?;
    Ok(answers)
}
