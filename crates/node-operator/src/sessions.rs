//! SSH connection reuse: one multiplexed session per Machine, kept between
//! reconciles and replaced when it stops working or the Machine's login
//! details change. A session that failed is dropped, never handed out again.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use tokio::sync::Mutex;

use crate::Error;
use crate::ssh::{Session, Target, Timeouts};

/// Sessions by Machine name.
#[derive(Default)]
pub struct Pool {
    sessions: Mutex<HashMap<String, (u64, Arc<Session>)>>,
}

/// Identifies the login a session was made with, without keeping the key.
fn fingerprint(target: &Target) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    target.address().hash(&mut h);
    target.user.hash(&mut h);
    target.host_public_key.hash(&mut h);
    target.private_key_pem.hash(&mut h);
    h.finish()
}

impl Pool {
    /// A working session to `target` for `machine`: the cached one if it
    /// still works and was made for the same login, else a new one.
    pub async fn get(
        &self,
        machine: &str,
        target: &Target,
        timeouts: Timeouts,
    ) -> Result<Arc<Session>, Error> {
        let want = fingerprint(target);
        let cached = self.sessions.lock().await.remove(machine);
        if let Some((fp, session)) = cached {
            if fp == want && session.is_alive().await {
                self.sessions
                    .lock()
                    .await
                    .insert(machine.to_string(), (fp, Arc::clone(&session)));
                return Ok(session);
            }
            close(session).await;
        }
        let session = Arc::new(Session::connect(target, timeouts).await?);
        self.sessions
            .lock()
            .await
            .insert(machine.to_string(), (want, Arc::clone(&session)));
        Ok(session)
    }

    /// Forgets (and closes) the Machine's session, after an error or when
    /// the Machine is gone.
    pub async fn forget(&self, machine: &str) {
        let cached = self.sessions.lock().await.remove(machine);
        if let Some((_, session)) = cached {
            close(session).await;
        }
    }

    /// How many sessions are cached.
    pub async fn len(&self) -> usize {
        self.sessions.lock().await.len()
    }

    /// Whether no session is cached.
    pub async fn is_empty(&self) -> bool {
        self.len().await == 0
    }
}

async fn close(session: Arc<Session>) {
    // Another reconcile may still hold it; it closes when the last one drops.
    if let Ok(session) = Arc::try_unwrap(session) {
        session.close().await;
    }
}
