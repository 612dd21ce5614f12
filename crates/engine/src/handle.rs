//! The threaded engine: one thread owns the [`EngineCore`] (model, KV pool,
//! scheduler) and runs steps while there is work; callers on any thread submit
//! requests through a cloneable [`EngineHandle`] and read events from their
//! [`RequestStream`].

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};

use tempo9_models::vision::VisionEncoder;
use tempo9_models::Model;
use tempo9_tokenizer::Tokenizer;

use crate::core::{EngineConfig, EngineCore, EngineError, EngineStats, Limits, RequestProgress};
use crate::request::Request;
use crate::stream::Ticket;
use crate::{RequestStream, SubmitError};

enum Command {
    /// A checked request and the engine's end of the stream its submitter holds.
    Submit(Box<Request>, Ticket),
    /// Something changed (a cancellation): look at the requests again.
    Wake,
    /// Stop: end the loop and drop the core (which flushes and, if persistent,
    /// saves the SSD tier), then acknowledge.
    Shutdown(mpsc::SyncSender<()>),
    /// Fault injection (tests): the next step panics, as a bug in it would.
    Panic,
}

/// Starts engines.
pub struct Engine;

impl Engine {
    /// Builds the engine core and starts its thread. The thread ends when every
    /// handle is dropped and the running requests are done.
    pub fn start(
        model: Arc<Model>,
        tokenizer: Arc<Tokenizer>,
        config: EngineConfig,
    ) -> Result<EngineHandle, EngineError> {
        let vision = config.vision.as_ref().map(|v| v.0.clone());
        let core = EngineCore::new(model.clone(), tokenizer.clone(), config)?;
        let shared = Arc::new(Shared {
            limits: core.limits().clone(),
            max_context: core.max_context(),
            queued: core.queued(),
            next_id: AtomicU64::new(0),
            stats: Mutex::new(core.stats()),
            requests: Mutex::new(Vec::new()),
            failure: Mutex::new(None),
            model,
            tokenizer,
            vision,
        });
        let (tx, rx) = mpsc::channel();
        let thread_shared = shared.clone();
        std::thread::Builder::new()
            .name("tempo9-engine".into())
            .spawn(move || engine_loop(core, rx, thread_shared))
            .map_err(|e| EngineError::Config(format!("cannot start the engine thread: {e}")))?;
        Ok(EngineHandle { shared, tx })
    }
}

struct Shared {
    limits: Limits,
    max_context: usize,
    queued: Arc<AtomicUsize>,
    /// The last request id handed out (ids grow in submission order).
    next_id: AtomicU64,
    stats: Mutex<EngineStats>,
    /// The requests the engine holds, as of the last step.
    requests: Mutex<Vec<RequestProgress>>,
    /// Why the engine thread died (a panic), once it has.
    failure: Mutex<Option<String>>,
    model: Arc<Model>,
    tokenizer: Arc<Tokenizer>,
    vision: Option<Arc<VisionEncoder>>,
}

/// A cloneable, thread-safe handle to a running engine.
#[derive(Clone)]
pub struct EngineHandle {
    shared: Arc<Shared>,
    tx: Sender<Command>,
}

impl EngineHandle {
    /// Submits a request; its events arrive on the returned stream. Refuses
    /// malformed requests, prompts over the context limit and submissions beyond
    /// the waiting-queue limit right away. If the engine stops before taking the
    /// request, the stream ends (`None`) without an [`crate::Event::Finished`].
    pub fn submit(&self, req: Request) -> Result<RequestStream, SubmitError> {
        let sh = &self.shared;
        // A failed engine refuses at once (its thread may still be dropping its core).
        if sh
            .failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
        {
            return Err(SubmitError::Stopped);
        }
        sh.limits.check(&req, sh.queued.load(Ordering::Relaxed))?;
        sh.queued.fetch_add(1, Ordering::Relaxed);
        // The stream is made here, so a submitter never waits for the engine thread
        // (which may be in the middle of a long step): requests sent one after another
        // from one thread still join the same step.
        let id = sh.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let (ticket, mut stream) = RequestStream::open(id);
        if self
            .tx
            .send(Command::Submit(Box::new(req), ticket))
            .is_err()
        {
            sh.queued.fetch_sub(1, Ordering::Relaxed);
            return Err(SubmitError::Stopped);
        }
        let wake_tx = self.tx.clone();
        stream.set_wake(Arc::new(move || {
            let _ = wake_tx.send(Command::Wake);
        }));
        Ok(stream)
    }

    /// Stops the engine thread: requests still running end with it; the engine
    /// core is dropped (the SSD tier flushes its writes and, with persistence,
    /// saves the RAM prefix cache and its index) before this returns. Call it once
    /// on shutdown; later submissions fail with [`SubmitError::Stopped`].
    pub fn shutdown(&self) {
        let (ack_tx, ack_rx) = mpsc::sync_channel(1);
        if self.tx.send(Command::Shutdown(ack_tx)).is_ok() {
            let _ = ack_rx.recv();
        }
    }

    /// Why the engine stopped serving, when a bug (a panic in a step) ended
    /// its thread: every request it held was ended, later ones are refused.
    pub fn failure(&self) -> Option<String> {
        self.shared
            .failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Makes the engine's next step panic, as a bug in it would (tests of the
    /// failure path: requests end with an error, [`Self::failure`] reports it).
    #[doc(hidden)]
    pub fn inject_panic(&self) {
        let _ = self.tx.send(Command::Panic);
    }

    /// Counters as of the last step.
    pub fn stats(&self) -> EngineStats {
        *self.shared.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The requests the engine holds (waiting, loading, running) as of the last
    /// step, running ones first.
    pub fn requests(&self) -> Vec<RequestProgress> {
        self.shared
            .requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Per-request limit on prompt plus output tokens.
    pub fn max_context(&self) -> usize {
        self.shared.max_context
    }

    /// The tokenizer the engine decodes with.
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.shared.tokenizer
    }

    /// The model.
    pub fn model(&self) -> &Arc<Model> {
        &self.shared.model
    }

    /// The vision encoder, when the engine takes images
    /// ([`crate::EngineConfig::vision`]).
    pub fn vision(&self) -> Option<&Arc<VisionEncoder>> {
        self.shared.vision.as_ref()
    }
}

/// A panic's message.
fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// Runs the engine; a panic in a step (a bug) ends the thread cleanly instead
/// of leaving a dead engine behind a live server: the failure is recorded for
/// [`EngineHandle::failure`] (`/health`) first, then dropping the core ends
/// every request it held (their streams close, so their clients get an error).
fn engine_loop(mut core: EngineCore, rx: Receiver<Command>, shared: Arc<Shared>) {
    use std::panic::{catch_unwind, AssertUnwindSafe};
    match catch_unwind(AssertUnwindSafe(|| run_loop(&mut core, &rx, &shared))) {
        Ok(Some(ack)) => {
            drop(core);
            let _ = ack.send(());
        }
        Ok(None) => {}
        Err(p) => {
            let msg = panic_message(p.as_ref());
            tracing::error!(panic = %msg, "the engine thread panicked; its requests were ended and it serves no more");
            *shared.failure.lock().unwrap_or_else(|e| e.into_inner()) = Some(msg);
            // Dropping a core left mid-step may panic again: contained too.
            let _ = catch_unwind(AssertUnwindSafe(move || drop(core)));
        }
    }
}

/// Steps while there is work; returns the acknowledgement channel of a
/// shutdown, or `None` when every handle is gone.
fn run_loop(
    core: &mut EngineCore,
    rx: &Receiver<Command>,
    shared: &Shared,
) -> Option<mpsc::SyncSender<()>> {
    let publish = |core: &EngineCore| {
        *shared.stats.lock().unwrap_or_else(|e| e.into_inner()) = core.stats();
        *shared.requests.lock().unwrap_or_else(|e| e.into_inner()) = core.requests();
    };
    // Returns the acknowledgement channel of a shutdown.
    let handle = |core: &mut EngineCore, cmd: Command| match cmd {
        Command::Submit(req, ticket) => {
            // Already counted in `queued` by the handle.
            core.enqueue_ticket(*req, ticket);
            None
        }
        Command::Wake => None,
        Command::Shutdown(ack) => Some(ack),
        Command::Panic => panic!("injected engine panic (test)"),
    };
    loop {
        if !core.has_work() {
            publish(core);
            // SSD writes still in flight: wake now and then to take them in, so the
            // idle engine's counters settle (pending pages back to 0).
            let cmd = if core.background_pending() {
                match rx.recv_timeout(std::time::Duration::from_millis(50)) {
                    Ok(cmd) => Ok(cmd),
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        core.poll_background();
                        continue;
                    }
                    Err(mpsc::RecvTimeoutError::Disconnected) => Err(()),
                }
            } else {
                rx.recv().map_err(|_| ())
            };
            match cmd {
                Ok(cmd) => {
                    if let Some(ack) = handle(core, cmd) {
                        return Some(ack);
                    }
                }
                Err(()) => return None,
            }
        }
        while let Ok(cmd) = rx.try_recv() {
            if let Some(ack) = handle(core, cmd) {
                return Some(ack);
            }
        }
        if let Err(e) = core.step() {
            tracing::error!(error = %e, "engine step failed; its requests were ended");
        }
        publish(core);
    }
}
