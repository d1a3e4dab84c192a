//! A [`Scheduler`] on a thread of its own (native only): the thread owns the model's GPU
//! work and runs steps while requests are pending; other threads (an HTTP server's tasks, a
//! desktop app's UI) submit, cancel and receive events over channels.
//!
//! Every channel is bounded: submissions wait in a channel of [`COMMAND_CAPACITY`] (a full
//! one refuses the request, [`ScheduleError::QueueFull`]), a request's events in one sized
//! for the most events it can have (its tokens and two), so the thread never blocks on a
//! slow reader and a reader that stops reading costs at most its own answer. Cancellations
//! are a list the thread reads before each step (a cancel never waits and is never lost).
//! Tokenize and template a request before submitting it ([`super::encode_prompt`],
//! [`Prompt::Ids`](super::Prompt::Ids)) to keep that work off this thread.

use super::scheduler::{
    Request, RequestId, RequestMemory, ScheduleError, Scheduler, SchedulerEvent, SchedulerStats,
};
use futures::channel::{mpsc, oneshot};
use std::collections::{HashMap, VecDeque};
use std::sync::{mpsc as std_mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A submitted request: its number and the stream of its events, which ends after its
/// `Finished` or `Failed` event (or when it is cancelled, or the thread ends).
#[derive(Debug)]
pub struct Submitted {
    /// The request's number ([`SchedulerHandle::cancel`] takes it).
    pub id: RequestId,
    /// Its events, in order; room for every event the request can have.
    pub events: mpsc::Receiver<SchedulerEvent>,
}

type SubmitReply = oneshot::Sender<Result<Submitted, ScheduleError>>;

/// Work run on the scheduler's thread ([`SchedulerHandle::with_scheduler`]).
type Job = Box<dyn FnOnce(&mut Scheduler) + Send>;

enum Command {
    Submit(Box<Request>, SubmitReply),
    Run(Job),
    /// Look at the cancellations (sent when the thread may be waiting for a command).
    Wake,
}

/// Submissions (and jobs) waiting for the thread at most; more are refused.
pub const COMMAND_CAPACITY: usize = 64;

/// [`SchedulerStats`] with the rate of generated tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct LiveStats {
    /// The scheduler's counters after its last step.
    pub scheduler: SchedulerStats,
    /// Tokens generated per second over about the last [`RATE_WINDOW`], to now.
    pub tokens_per_s: f64,
}

/// The window of [`LiveStats::tokens_per_s`].
pub const RATE_WINDOW: Duration = Duration::from_secs(10);

/// Whether the scheduler's thread still runs ([`SchedulerHandle::state`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ThreadState {
    /// It takes requests.
    Running,
    /// It ended: its handle was dropped, or it panicked (`reason` says what the panic said).
    /// Every request it held ended with it; submissions fail with
    /// [`ScheduleError::Stopped`].
    Stopped {
        /// Why.
        reason: String,
    },
}

/// The handle of a scheduler running on its own thread. Dropping it stops the thread once
/// the requests it holds are cancelled.
#[derive(Debug)]
pub struct SchedulerHandle {
    commands: Option<std_mpsc::SyncSender<Command>>,
    shared: Arc<Mutex<Shared>>,
    thread: Option<JoinHandle<()>>,
}

impl SchedulerHandle {
    /// Moves `scheduler` onto a new thread named `dynrt-scheduler`.
    ///
    /// # Errors
    /// The operating system's, when the thread cannot be started.
    pub fn spawn(scheduler: Scheduler) -> std::io::Result<SchedulerHandle> {
        let (tx, rx) = std_mpsc::sync_channel(COMMAND_CAPACITY);
        let shared = Arc::new(Mutex::new(Shared {
            stats: scheduler.stats(),
            rate: VecDeque::new(),
            requests: Vec::new(),
            cancelled: Vec::new(),
            state: ThreadState::Running,
        }));
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("dynrt-scheduler".into())
            .spawn(move || {
                let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    run(scheduler, &rx, &thread_shared)
                }));
                let reason = match outcome {
                    Ok(()) => "the scheduler was stopped".to_string(),
                    Err(panic) => {
                        let said = panic
                            .downcast_ref::<String>()
                            .map(String::as_str)
                            .or_else(|| panic.downcast_ref::<&str>().copied())
                            .unwrap_or("no message");
                        format!("the scheduler thread panicked: {said}")
                    }
                };
                let mut s = thread_shared.lock().unwrap_or_else(|e| e.into_inner());
                s.state = ThreadState::Stopped { reason };
                s.cancelled.clear();
                s.requests.clear();
            })?;
        Ok(SchedulerHandle {
            commands: Some(tx),
            shared,
            thread: Some(thread),
        })
    }

    fn send(&self, command: Command) -> Result<(), ScheduleError> {
        let tx = self.commands.as_ref().ok_or(ScheduleError::Stopped)?;
        tx.try_send(command).map_err(|e| match e {
            std_mpsc::TrySendError::Full(_) => ScheduleError::QueueFull {
                queued: COMMAND_CAPACITY,
            },
            std_mpsc::TrySendError::Disconnected(_) => ScheduleError::Stopped,
        })
    }

    /// Queues `request` ([`Scheduler::submit`]).
    ///
    /// # Errors
    /// As [`Scheduler::submit`]; [`ScheduleError::QueueFull`] also when
    /// [`COMMAND_CAPACITY`] submissions wait for the thread; [`ScheduleError::Stopped`]
    /// when the thread has ended.
    pub async fn submit(&self, request: Request) -> Result<Submitted, ScheduleError> {
        let (reply, answer) = oneshot::channel();
        self.send(Command::Submit(Box::new(request), reply))?;
        answer.await.map_err(|_| ScheduleError::Stopped)?
    }

    /// Cancels request `id` ([`Scheduler::cancel`]) before the thread's next step; nothing
    /// when it already ended. Never blocks.
    pub fn cancel(&self, id: RequestId) {
        {
            let mut shared = self.shared.lock().unwrap_or_else(|e| e.into_inner());
            if shared.state != ThreadState::Running {
                return;
            }
            shared.cancelled.push(id);
        }
        // A full channel means the thread has commands to read, and it reads the
        // cancellations with them.
        let _ = self.send(Command::Wake);
    }

    /// Runs `job` on the scheduler's thread between two steps (a change of the scheduler,
    /// or a question only its thread can answer).
    ///
    /// # Errors
    /// [`ScheduleError::QueueFull`] when [`COMMAND_CAPACITY`] commands wait;
    /// [`ScheduleError::Stopped`] when the thread has ended.
    pub fn with_scheduler(
        &self,
        job: impl FnOnce(&mut Scheduler) + Send + 'static,
    ) -> Result<(), ScheduleError> {
        self.send(Command::Run(Box::new(job)))
    }

    /// Whether the thread still runs, or why it ended.
    pub fn state(&self) -> ThreadState {
        let shared = self.shared.lock().unwrap_or_else(|e| e.into_inner());
        shared.state.clone()
    }

    /// What each active request held after the last step
    /// ([`Scheduler::request_memory`]).
    pub fn request_memory(&self) -> Vec<RequestMemory> {
        let shared = self.shared.lock().unwrap_or_else(|e| e.into_inner());
        shared.requests.clone()
    }

    /// The counters after the last step.
    pub fn stats(&self) -> LiveStats {
        let mut shared = self.shared.lock().unwrap_or_else(|e| e.into_inner());
        shared.prune();
        LiveStats {
            scheduler: shared.stats,
            tokens_per_s: shared.tokens_per_s(),
        }
    }
}

impl Drop for SchedulerHandle {
    fn drop(&mut self) {
        // Closing the channel ends the thread's loop.
        self.commands = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The thread's loop: waits for a command while idle, otherwise takes every command that
/// came and the cancellations, and runs one step.
fn run(mut scheduler: Scheduler, commands: &std_mpsc::Receiver<Command>, shared: &Mutex<Shared>) {
    let mut senders: HashMap<RequestId, mpsc::Sender<SchedulerEvent>> = HashMap::new();
    loop {
        let first = if scheduler.is_idle() {
            match commands.recv() {
                Ok(c) => Some(c),
                Err(_) => return,
            }
        } else {
            match commands.try_recv() {
                Ok(c) => Some(c),
                Err(std_mpsc::TryRecvError::Empty) => None,
                Err(std_mpsc::TryRecvError::Disconnected) => return,
            }
        };
        let mut next = first;
        while let Some(command) = next {
            match command {
                Command::Submit(request, reply) => {
                    // Room for every event: `Started`, a `Token` per token, the end.
                    let room = request.params.max_tokens.saturating_add(2);
                    let answer = scheduler.submit(*request).map(|id| {
                        let (tx, events) = mpsc::channel(room);
                        senders.insert(id, tx);
                        Submitted { id, events }
                    });
                    if let Err(Ok(Submitted { id, .. })) = reply.send(answer) {
                        // The submitter has gone already.
                        scheduler.cancel(id);
                        senders.remove(&id);
                    }
                }
                Command::Run(job) => job(&mut scheduler),
                Command::Wake => {}
            }
            next = commands.try_recv().ok();
        }
        let cancelled = {
            let mut s = shared.lock().unwrap_or_else(|e| e.into_inner());
            std::mem::take(&mut s.cancelled)
        };
        for id in cancelled {
            scheduler.cancel(id);
            senders.remove(&id);
        }
        let events = scheduler.step_blocking();
        // The counters first: whoever sees an event's effect sees the counters after it.
        publish(&scheduler, shared);
        for event in events {
            let (id, last) = match &event {
                SchedulerEvent::Started { id, .. } | SchedulerEvent::Token { id, .. } => {
                    (*id, false)
                }
                SchedulerEvent::Finished { id, .. } | SchedulerEvent::Failed { id, .. } => {
                    (*id, true)
                }
            };
            // A full channel cannot happen (it has room for every event); were it full,
            // the reader is treated as gone rather than waited for.
            let gone = senders
                .get_mut(&id)
                .is_none_or(|tx| tx.try_send(event).is_err());
            if gone && !last {
                // Nobody listens any more: the request is cancelled, its session freed.
                scheduler.cancel(id);
                publish(&scheduler, shared);
            }
            if gone || last {
                senders.remove(&id);
            }
        }
    }
}

/// Shares the scheduler's counters after a change.
fn publish(scheduler: &Scheduler, shared: &Mutex<Shared>) {
    let s = scheduler.stats();
    let requests = scheduler.request_memory();
    let mut shared = shared.lock().unwrap_or_else(|e| e.into_inner());
    shared
        .rate
        .push_back((Instant::now(), s.tokens_generated_total));
    shared.stats = s;
    shared.requests = requests;
    shared.prune();
}

/// What the thread shares with the handle: the counters after the last step, the token
/// counts of the steps within [`RATE_WINDOW`], the cancellations not yet read, and whether
/// the thread runs.
#[derive(Debug)]
struct Shared {
    stats: SchedulerStats,
    rate: VecDeque<(Instant, u64)>,
    requests: Vec<RequestMemory>,
    cancelled: Vec<RequestId>,
    state: ThreadState,
}

impl Shared {
    /// Forgets the samples older than the window (one older sample is kept as its start).
    fn prune(&mut self) {
        let now = Instant::now();
        while self.rate.len() > 1
            && self
                .rate
                .get(1)
                .is_some_and(|(t, _)| now.duration_since(*t) > RATE_WINDOW)
        {
            self.rate.pop_front();
        }
    }

    /// Tokens per second from the window's start to now: it falls to 0 while idle.
    fn tokens_per_s(&self) -> f64 {
        let now = Instant::now();
        match (self.rate.front(), self.rate.back()) {
            (Some((t0, n0)), Some((_, n1))) if now > *t0 => {
                (n1 - n0) as f64 / now.duration_since(*t0).as_secs_f64().max(1e-3)
            }
            _ => 0.0,
        }
    }
}
