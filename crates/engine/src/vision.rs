//! The vision encoder's thread: images are encoded beside the engine's steps,
//! on the encoder's own backend and scheduler, so decoding requests never wait
//! for an encode; only a request whose next prompt piece covers an image not
//! yet encoded waits (see `Images::blocked_at`).

use std::collections::HashSet;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use tempo9_models::vision::{ImageEmbeddings, PixelHash, Preprocessed, VisionEncoder};

/// A vision encoder for the engine's requests with images
/// ([`crate::EngineConfig::vision`]); it runs on the device it was loaded on.
#[derive(Clone)]
pub struct VisionModel(pub Arc<VisionEncoder>);

impl std::fmt::Debug for VisionModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hp = self.0.projector().hparams();
        f.debug_struct("VisionModel")
            .field("projector", &hp.projector.name())
            .field("layers", &hp.n_layer)
            .finish()
    }
}

/// What the encoder thread hands back for one image.
pub(crate) type Encoded = (PixelHash, Result<Arc<ImageEmbeddings>, String>);

/// The engine's side of the encoder thread.
pub(crate) struct VisionWorker {
    encoder: Arc<VisionEncoder>,
    jobs: Option<Sender<Arc<Preprocessed>>>,
    done: Receiver<Encoded>,
    /// Results taken off `done` while waiting, not yet handed out.
    arrived: Vec<Encoded>,
    in_flight: HashSet<PixelHash>,
    thread: Option<JoinHandle<()>>,
    /// Encode on the engine's thread, inside the step that needs the image
    /// ([`crate::EngineConfig::vision_inline`]).
    inline: bool,
}

impl VisionWorker {
    /// Starts the encoder thread (none when `inline`).
    pub fn start(model: &VisionModel, inline: bool) -> std::io::Result<VisionWorker> {
        let encoder = model.0.clone();
        if inline {
            let (_, done) = mpsc::channel();
            return Ok(VisionWorker {
                encoder,
                jobs: None,
                done,
                arrived: Vec::new(),
                in_flight: HashSet::new(),
                thread: None,
                inline,
            });
        }
        let (jobs, rx) = mpsc::channel::<Arc<Preprocessed>>();
        let (tx, done) = mpsc::channel();
        let enc = encoder.clone();
        let thread = std::thread::Builder::new()
            .name("tempo9-vision".into())
            .spawn(move || {
                for img in rx {
                    let r = enc.encode(&img).map_err(|e| e.to_string());
                    if tx.send((img.hash, r)).is_err() {
                        break;
                    }
                }
            })?;
        Ok(VisionWorker {
            encoder,
            jobs: Some(jobs),
            done,
            arrived: Vec::new(),
            in_flight: HashSet::new(),
            thread: Some(thread),
            inline,
        })
    }

    /// The encoder.
    pub fn encoder(&self) -> &Arc<VisionEncoder> {
        &self.encoder
    }

    /// `img`'s embeddings if the encoder has them cached; else queues its encode
    /// (once however many requests ask) and returns `None`: the result comes
    /// through [`Self::take_done`]. Inline, encodes it here and now (a failure
    /// also comes through [`Self::take_done`]).
    pub fn request(&mut self, img: &Arc<Preprocessed>) -> Option<Arc<ImageEmbeddings>> {
        if let Some(e) = self.encoder.cached(img.hash) {
            return Some(e);
        }
        if self.inline {
            return match self.encoder.encode(img) {
                Ok(e) => Some(e),
                Err(e) => {
                    self.arrived.push((img.hash, Err(e.to_string())));
                    None
                }
            };
        }
        if self.in_flight.insert(img.hash) {
            let sent = self
                .jobs
                .as_ref()
                .is_some_and(|j| j.send(img.clone()).is_ok());
            if !sent {
                self.in_flight.remove(&img.hash);
                self.arrived
                    .push((img.hash, Err("the vision encoder thread stopped".into())));
            }
        }
        None
    }

    /// Whether encodes are queued or running.
    pub fn pending(&self) -> bool {
        !self.in_flight.is_empty()
    }

    /// Waits up to `timeout` for an encode to finish (the engine has nothing
    /// else to compute); the result is kept for [`Self::take_done`].
    pub fn wait(&mut self, timeout: Duration) {
        if !self.arrived.is_empty() || !self.pending() {
            return;
        }
        match self.done.recv_timeout(timeout) {
            Ok(r) => self.arrived.push(r),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                let lost: Vec<PixelHash> = self.in_flight.iter().copied().collect();
                self.arrived.extend(
                    lost.into_iter()
                        .map(|h| (h, Err("the vision encoder thread stopped".into()))),
                );
            }
        }
    }

    /// The encodes finished since the last call.
    pub fn take_done(&mut self) -> Vec<Encoded> {
        let mut out = std::mem::take(&mut self.arrived);
        out.extend(self.done.try_iter());
        for (h, _) in &out {
            self.in_flight.remove(h);
        }
        out
    }
}

impl Drop for VisionWorker {
    fn drop(&mut self) {
        // Closing the job channel ends the thread after its current encode.
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
