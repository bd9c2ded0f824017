//! A long-running part of the test environment (the Pod runner, the load
//! balancer): a thread of its own with a tokio runtime, so it serves whatever
//! runtime the test uses, started once its setup has succeeded and stopped,
//! thread joined, when dropped.

use std::future::Future;
use std::sync::mpsc;
use std::thread::JoinHandle;

use tokio::sync::watch;

/// Tells [`Background::start`] how setting up went.
pub(crate) struct Ready<E>(mpsc::Sender<Result<(), E>>);

impl<E> Ready<E> {
    pub fn send(&self, outcome: Result<(), E>) {
        let _ = self.0.send(outcome);
    }
}

/// A running background thread. Dropping it turns the stop flag and waits
/// for the thread to end.
pub(crate) struct Background {
    stop: watch::Sender<bool>,
    thread: Option<JoinHandle<()>>,
}

impl Background {
    /// Runs `body` on a new thread `name` with `workers` runtime threads and
    /// returns once `body` has sent its setup's outcome (an error is
    /// returned here). `body` runs on until the stop flag it is given turns
    /// true. `io_error` makes the caller's error of a failed start.
    pub fn start<E, F, Fut>(
        name: &str,
        workers: usize,
        io_error: fn(String, std::io::Error) -> E,
        body: F,
    ) -> Result<Background, E>
    where
        E: Send + 'static,
        F: FnOnce(Ready<E>, watch::Receiver<bool>) -> Fut + Send + 'static,
        Fut: Future<Output = ()>,
    {
        let (stop, stop_rx) = watch::channel(false);
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), E>>();
        let what = name.to_string();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                match tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(workers)
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime.block_on(body(Ready(ready_tx), stop_rx)),
                    Err(source) => {
                        let _ = ready_tx.send(Err(io_error(
                            format!("starting the runtime of {what}"),
                            source,
                        )));
                    }
                }
            })
            .map_err(|source| io_error(format!("starting the thread {name}"), source))?;
        let background = Background {
            stop,
            thread: Some(thread),
        };
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(background),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(io_error(
                format!("the thread {name}"),
                std::io::Error::other("exited early"),
            )),
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
