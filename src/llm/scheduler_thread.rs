//! A [`Scheduler`] on a thread of its own (native only): the thread owns the model's GPU
//! work and runs steps while requests are pending; other threads (an HTTP server's tasks, a
//! desktop app's UI) submit, cancel and receive events over channels.

use super::scheduler::{
    Request, RequestId, RequestMemory, ScheduleError, Scheduler, SchedulerEvent, SchedulerStats,
};
use futures::channel::{mpsc, oneshot};
use std::collections::{HashMap, VecDeque};
use std::sync::{mpsc as std_mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A submitted request: its number and the stream of its events, which ends after its
/// `Finished` or `Failed` event (or when it is cancelled).
#[derive(Debug)]
pub struct Submitted {
    /// The request's number ([`SchedulerHandle::cancel`] takes it).
    pub id: RequestId,
    /// Its events, in order.
    pub events: mpsc::UnboundedReceiver<SchedulerEvent>,
}

type SubmitReply = oneshot::Sender<Result<Submitted, ScheduleError>>;

enum Command {
    Submit(Box<Request>, SubmitReply),
    Cancel(RequestId),
}

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

/// The handle of a scheduler running on its own thread. Dropping it stops the thread once
/// the requests it holds are cancelled.
#[derive(Debug)]
pub struct SchedulerHandle {
    commands: Option<std_mpsc::Sender<Command>>,
    stats: Arc<Mutex<Shared>>,
    thread: Option<JoinHandle<()>>,
}

impl SchedulerHandle {
    /// Moves `scheduler` onto a new thread named `dynrt-scheduler`.
    ///
    /// # Errors
    /// The operating system's, when the thread cannot be started.
    pub fn spawn(scheduler: Scheduler) -> std::io::Result<SchedulerHandle> {
        let (tx, rx) = std_mpsc::channel();
        let stats = Arc::new(Mutex::new(Shared {
            stats: scheduler.stats(),
            rate: VecDeque::new(),
            requests: Vec::new(),
        }));
        let shared = stats.clone();
        let thread = std::thread::Builder::new()
            .name("dynrt-scheduler".into())
            .spawn(move || run(scheduler, &rx, &shared))?;
        Ok(SchedulerHandle {
            commands: Some(tx),
            stats,
            thread: Some(thread),
        })
    }

    /// Queues `request` ([`Scheduler::submit`]).
    ///
    /// # Errors
    /// As [`Scheduler::submit`]; [`ScheduleError::Stopped`] when the thread has ended.
    pub async fn submit(&self, request: Request) -> Result<Submitted, ScheduleError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .as_ref()
            .ok_or(ScheduleError::Stopped)?
            .send(Command::Submit(Box::new(request), reply))
            .map_err(|_| ScheduleError::Stopped)?;
        answer.await.map_err(|_| ScheduleError::Stopped)?
    }

    /// Cancels request `id` ([`Scheduler::cancel`]); nothing when it already ended.
    pub fn cancel(&self, id: RequestId) {
        if let Some(c) = &self.commands {
            let _ = c.send(Command::Cancel(id));
        }
    }

    /// What each active request held after the last step
    /// ([`Scheduler::request_memory`]).
    pub fn request_memory(&self) -> Vec<RequestMemory> {
        let shared = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        shared.requests.clone()
    }

    /// The counters after the last step.
    pub fn stats(&self) -> LiveStats {
        let mut shared = self.stats.lock().unwrap_or_else(|e| e.into_inner());
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
/// came and runs one step.
fn run(mut scheduler: Scheduler, commands: &std_mpsc::Receiver<Command>, stats: &Mutex<Shared>) {
    let mut senders: HashMap<RequestId, mpsc::UnboundedSender<SchedulerEvent>> = HashMap::new();
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
                    let answer = scheduler.submit(*request).map(|id| {
                        let (tx, events) = mpsc::unbounded();
                        senders.insert(id, tx);
                        Submitted { id, events }
                    });
                    if let Err(Ok(Submitted { id, .. })) = reply.send(answer) {
                        // The submitter has gone already.
                        scheduler.cancel(id);
                        senders.remove(&id);
                    }
                }
                Command::Cancel(id) => {
                    scheduler.cancel(id);
                    senders.remove(&id);
                }
            }
            next = commands.try_recv().ok();
        }
        let events = scheduler.step_blocking();
        // The counters first: whoever sees an event's effect sees the counters after it.
        publish(&scheduler, stats);
        for event in events {
            let (id, last) = match &event {
                SchedulerEvent::Started { id, .. } | SchedulerEvent::Token { id, .. } => {
                    (*id, false)
                }
                SchedulerEvent::Finished { id, .. } | SchedulerEvent::Failed { id, .. } => {
                    (*id, true)
                }
            };
            let gone = senders
                .get(&id)
                .is_none_or(|tx| tx.unbounded_send(event).is_err());
            if gone && !last {
                // Nobody listens any more: the request is cancelled, its session freed.
                scheduler.cancel(id);
                publish(&scheduler, stats);
            }
            if gone || last {
                senders.remove(&id);
            }
        }
    }
}

/// Shares the scheduler's counters after a change.
fn publish(scheduler: &Scheduler, stats: &Mutex<Shared>) {
    let s = scheduler.stats();
    let requests = scheduler.request_memory();
    let mut shared = stats.lock().unwrap_or_else(|e| e.into_inner());
    shared
        .rate
        .push_back((Instant::now(), s.tokens_generated_total));
    shared.stats = s;
    shared.requests = requests;
    shared.prune();
}

/// What the thread shares with the handle: the counters after the last step and the token
/// counts of the steps within [`RATE_WINDOW`].
#[derive(Debug, Default)]
struct Shared {
    stats: SchedulerStats,
    rate: VecDeque<(Instant, u64)>,
    requests: Vec<RequestMemory>,
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
