//! What a client knows, without a round trip, about how long its session can
//! live on the server, and alarms that go off a margin before it may end.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use tokio::time::{sleep_until, Instant};

/// The session deadline, shared by the session task (which moves it on as
/// answers arrive) and the handles (which read it).
#[derive(Debug)]
pub(crate) struct Liveness {
    base: Instant,
    /// Nanoseconds after `base` at which the latest request that got an
    /// answer was sent. The server heard from the session then or later, so
    /// it cannot expire the session before this plus the timeout.
    heard: AtomicU64,
    timeout: Duration,
    /// The alarms still in use, checked each time the deadline moves on.
    alarms: Mutex<Vec<Weak<AlarmState>>>,
}

impl Liveness {
    pub(crate) fn new(sent: Instant, timeout: Duration) -> Self {
        Liveness {
            base: sent,
            heard: AtomicU64::new(0),
            timeout,
            alarms: Mutex::new(Vec::new()),
        }
    }

    /// Records that a request sent at `sent` was answered.
    ///
    /// An answer that comes late can move the deadline from the past back
    /// into the future. Every alarm whose moment came before the answer goes
    /// off first, so that what a holder was told (stop) is never taken back.
    pub(crate) fn answered(&self, sent: Instant) {
        let nanos = sent.saturating_duration_since(self.base).as_nanos() as u64;
        let mut alarms = self.alarms.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        let deadline = self.deadline();
        alarms.retain(|alarm| match alarm.upgrade() {
            Some(alarm) => {
                if now + alarm.margin >= deadline {
                    alarm.fired.store(true, Ordering::SeqCst);
                }
                true
            }
            None => false,
        });
        // Release: whoever reads the new deadline also sees the alarms set
        // above (see DeadlineAlarm::has_fired).
        self.heard.fetch_max(nanos, Ordering::SeqCst);
    }

    /// The earliest moment the server may expire the session, by this
    /// client's own monotonic clock.
    pub(crate) fn deadline(&self) -> Instant {
        self.base + Duration::from_nanos(self.heard.load(Ordering::SeqCst)) + self.timeout
    }

    /// A new alarm `margin` before the deadline.
    pub(crate) fn alarm(self: &Arc<Self>, margin: Duration) -> DeadlineAlarm {
        let state = Arc::new(AlarmState {
            margin,
            fired: AtomicBool::new(false),
        });
        let mut alarms = self.alarms.lock().unwrap_or_else(PoisonError::into_inner);
        alarms.push(Arc::downgrade(&state));
        DeadlineAlarm {
            liveness: self.clone(),
            state,
        }
    }
}

#[derive(Debug)]
struct AlarmState {
    margin: Duration,
    fired: AtomicBool,
}

/// An alarm that goes off the first time no more than its margin is left
/// before the session deadline ([`Client::session_deadline`]), and then stays
/// off: a later answer that moves the deadline on does not take it back.
///
/// A lease holder uses one to learn that it must stop while the server still
/// counts its session alive, with the margin to do so. Made by
/// [`Client::deadline_alarm`]; reads only local state.
///
/// [`Client::session_deadline`]: crate::Client::session_deadline
/// [`Client::deadline_alarm`]: crate::Client::deadline_alarm
#[derive(Debug)]
pub struct DeadlineAlarm {
    liveness: Arc<Liveness>,
    state: Arc<AlarmState>,
}

impl DeadlineAlarm {
    /// How long before the session deadline the alarm goes off.
    pub fn margin(&self) -> Duration {
        self.state.margin
    }

    /// When the alarm goes off unless an answer moves the session deadline
    /// on first: the deadline less the margin.
    pub fn due(&self) -> Instant {
        let deadline = self.liveness.deadline();
        deadline
            .checked_sub(self.state.margin)
            .unwrap_or(self.liveness.base)
    }

    /// True once the alarm has gone off; it never goes back.
    pub fn has_fired(&self) -> bool {
        // The deadline first: an answer sets the alarms it finds due before
        // it moves the deadline, so reading the moved deadline guarantees
        // that the flag read next is up to date.
        let due = self.due();
        if self.state.fired.load(Ordering::SeqCst) {
            return true;
        }
        if Instant::now() >= due {
            self.state.fired.store(true, Ordering::SeqCst);
            return true;
        }
        false
    }

    /// Resolves once the alarm has gone off.
    ///
    /// # Cancellation safety
    /// Safe: it only sleeps and reads the alarm's state, so dropping it
    /// changes nothing.
    pub async fn fired(&self) {
        while !self.has_fired() {
            sleep_until(self.due()).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    const TIMEOUT: Duration = Duration::from_millis(1000);
    const MARGIN: Duration = Duration::from_millis(100);

    #[tokio::test(start_paused = true)]
    async fn an_alarm_fires_its_margin_before_the_deadline() {
        let start = Instant::now();
        let liveness = Arc::new(Liveness::new(start, TIMEOUT));
        let alarm = liveness.alarm(MARGIN);
        assert_eq!(alarm.due(), start + TIMEOUT - MARGIN);
        tokio::time::advance(TIMEOUT - MARGIN - Duration::from_millis(1)).await;
        assert!(!alarm.has_fired());
        let mut fired = Box::pin(alarm.fired());
        assert!((&mut fired).now_or_never().is_none());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(alarm.has_fired());
        assert_eq!(fired.now_or_never(), Some(()));
        assert_eq!(Instant::now(), start + TIMEOUT - MARGIN);
    }

    #[tokio::test(start_paused = true)]
    async fn answers_in_time_put_the_alarm_off() {
        let start = Instant::now();
        let liveness = Arc::new(Liveness::new(start, TIMEOUT));
        let alarm = liveness.alarm(MARGIN);
        for _ in 0..5 {
            tokio::time::advance(TIMEOUT / 3).await;
            liveness.answered(Instant::now());
            assert!(!alarm.has_fired());
        }
        assert_eq!(alarm.due(), Instant::now() + TIMEOUT - MARGIN);
    }

    #[tokio::test(start_paused = true)]
    async fn a_fired_alarm_stays_fired_when_a_late_answer_moves_the_deadline() {
        let start = Instant::now();
        let liveness = Arc::new(Liveness::new(start, TIMEOUT));
        let alarm = liveness.alarm(MARGIN);
        tokio::time::advance(TIMEOUT / 2).await;
        let sent = Instant::now();
        tokio::time::advance(TIMEOUT / 2).await;
        assert!(alarm.has_fired());
        liveness.answered(sent);
        assert!(Instant::now() < alarm.due(), "the deadline moved on");
        assert!(alarm.has_fired());
    }

    #[tokio::test(start_paused = true)]
    async fn an_alarm_nobody_looked_at_fires_when_a_late_answer_arrives() {
        let start = Instant::now();
        let liveness = Arc::new(Liveness::new(start, TIMEOUT));
        let near = liveness.alarm(MARGIN);
        let far = liveness.alarm(TIMEOUT / 2);
        // Sent at 400 ms, answered at 700 ms: the deadline (1000 ms) was
        // within the far alarm's margin, not within the near one's.
        tokio::time::advance(Duration::from_millis(400)).await;
        let sent = Instant::now();
        tokio::time::advance(Duration::from_millis(300)).await;
        liveness.answered(sent);
        assert_eq!(liveness.deadline(), start + Duration::from_millis(1400));
        assert!(far.has_fired());
        assert!(!near.has_fired());
        // Sent at 1000 ms, answered at 1350 ms, within the near alarm's
        // margin of the deadline (1400 ms), which moves on to 2000 ms.
        tokio::time::advance(Duration::from_millis(300)).await;
        let sent = Instant::now();
        tokio::time::advance(Duration::from_millis(350)).await;
        liveness.answered(sent);
        assert!(Instant::now() < near.due());
        assert!(near.has_fired());
    }

    #[tokio::test(start_paused = true)]
    async fn dropped_alarms_are_forgotten() {
        let liveness = Arc::new(Liveness::new(Instant::now(), TIMEOUT));
        for _ in 0..10 {
            drop(liveness.alarm(MARGIN));
        }
        let kept = liveness.alarm(MARGIN);
        liveness.answered(Instant::now());
        assert_eq!(liveness.alarms.lock().unwrap().len(), 1);
        assert!(!kept.has_fired());
    }
}
