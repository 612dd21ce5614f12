//! A submitted request's stream of events, and the engine's end of it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::request::{Event, RequestId};

/// The stream of events of one submitted request. Dropping it cancels the request.
pub struct RequestStream {
    id: RequestId,
    rx: mpsc::UnboundedReceiver<Event>,
    cancel: Arc<AtomicBool>,
    wake: Option<Arc<dyn Fn() + Send + Sync>>,
}

/// The engine's end of a request's stream: where its events go and the flag its
/// cancellation sets.
pub(crate) struct Ticket {
    pub id: RequestId,
    pub tx: mpsc::UnboundedSender<Event>,
    pub cancel: Arc<AtomicBool>,
}

impl RequestStream {
    /// A new stream for request `id` and the engine's end of it. Made by the
    /// submitter, so submitting never waits for the engine thread.
    pub(crate) fn open(id: RequestId) -> (Ticket, RequestStream) {
        let (tx, rx) = mpsc::unbounded_channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let stream = RequestStream {
            id,
            rx,
            cancel: cancel.clone(),
            wake: None,
        };
        (Ticket { id, tx, cancel }, stream)
    }

    /// The request's id.
    pub fn id(&self) -> RequestId {
        self.id
    }

    /// The next event; `None` after [`Event::Finished`], or if the engine stopped
    /// without finishing the request.
    pub async fn recv(&mut self) -> Option<Event> {
        self.rx.recv().await
    }

    /// The next event, blocking the thread (not for async contexts).
    pub fn blocking_recv(&mut self) -> Option<Event> {
        self.rx.blocking_recv()
    }

    /// The next event if one is ready.
    pub fn try_recv(&mut self) -> Option<Event> {
        self.rx.try_recv().ok()
    }

    /// Asks the engine to stop the request; it ends with
    /// [`FinishReason::Cancelled`] and frees its pages at the next step.
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Relaxed);
        if let Some(w) = &self.wake {
            w();
        }
    }

    pub(crate) fn set_wake(&mut self, wake: Arc<dyn Fn() + Send + Sync>) {
        self.wake = Some(wake);
    }
}

impl Drop for RequestStream {
    fn drop(&mut self) {
        self.cancel();
    }
}
