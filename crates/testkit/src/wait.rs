//! Waits bounded by a deadline, and futures polled in a chosen order.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_client::{Client, SessionState};
use tokio::sync::oneshot;

/// Polls the async `check` until it returns true, failing after `secs`
/// seconds.
pub async fn eventually_async<F, Fut>(secs: u64, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    within(secs, what, async {
        while !check().await {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
}

/// Waits for `fut`, failing the test if it takes longer than `secs` seconds.
pub async fn within<T>(secs: u64, what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(Duration::from_secs(secs), fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {secs} s waiting for {what}"),
    }
}

/// Polls `check` until it returns true, failing after `secs` seconds.
pub async fn eventually(secs: u64, what: &str, mut check: impl FnMut() -> bool) {
    within(secs, what, async {
        while !check() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
}

/// Waits until `client`'s session is in state `want`.
pub async fn wait_state(client: &Client, want: SessionState) {
    let mut rx = client.state_changes();
    within(
        10,
        &format!("session state {want}"),
        rx.wait_for(|s| *s == want),
    )
    .await
    .expect("the session task published its state");
}

/// Runs client calls concurrently, but makes each call in the order given:
/// every future is polled once, in order, before any is awaited. A client
/// call hands its request to the session task on its first poll, unless
/// tokio's cooperative budget runs out first, so the calls run unconstrained;
/// `join_all` alone would not poll them in order. At most 1,024 calls per
/// client (its queue's capacity). Returns the outputs in the same order.
pub async fn join_in_order<F: Future>(futs: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut futs: Vec<_> = futs
        .into_iter()
        .map(|f| Box::pin(futures::future::maybe_done(tokio::task::unconstrained(f))))
        .collect();
    for f in &mut futs {
        let _ = futures::poll!(f.as_mut());
    }
    futures::future::join_all(futs.iter_mut().map(|f| f.as_mut())).await;
    futs.into_iter()
        .map(|mut f| f.as_mut().take_output().expect("every call finished"))
        .collect()
}

/// Runs `fut` like a caller that is never late: it is polled once now, and
/// after that from inside its own waker, at the very moment it is woken (on
/// whichever thread wakes it). This makes races between "a call is answered"
/// and "the client publishes its state" deterministic: the call's result is
/// computed exactly when the answer is released. Await the receiver for the
/// output.
pub fn poll_when_woken<F>(fut: F) -> oneshot::Receiver<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let (tx, rx) = oneshot::channel();
    let eager = Arc::new(Eager {
        state: Mutex::new(EagerState {
            fut: Some(Box::pin(tokio::task::unconstrained(fut))),
            tx: Some(tx),
            polling: false,
            again: false,
        }),
    });
    eager.run();
    rx
}

pub(crate) struct Eager<F: Future> {
    state: Mutex<EagerState<F>>,
}

pub(crate) struct EagerState<F: Future> {
    fut: Option<std::pin::Pin<Box<tokio::task::Unconstrained<F>>>>,
    tx: Option<oneshot::Sender<F::Output>>,
    /// A poll is under way (a wake from inside it asks for another).
    polling: bool,
    again: bool,
}

impl<F: Future> Eager<F>
where
    F: Send + 'static,
    F::Output: Send + 'static,
{
    fn run(self: &Arc<Self>) {
        let waker = std::task::Waker::from(self.clone());
        let mut cx = std::task::Context::from_waker(&waker);
        let mut st = self.state.lock().unwrap();
        if st.polling {
            st.again = true;
            return;
        }
        st.polling = true;
        loop {
            st.again = false;
            let Some(mut fut) = st.fut.take() else { break };
            drop(st);
            let poll = fut.as_mut().poll(&mut cx);
            st = self.state.lock().unwrap();
            match poll {
                std::task::Poll::Ready(output) => {
                    if let Some(tx) = st.tx.take() {
                        let _ = tx.send(output);
                    }
                    break;
                }
                std::task::Poll::Pending => {
                    st.fut = Some(fut);
                    if !st.again {
                        break;
                    }
                }
            }
        }
        st.polling = false;
    }
}

impl<F: Future> std::task::Wake for Eager<F>
where
    F: Send + 'static,
    F::Output: Send + 'static,
{
    fn wake(self: Arc<Self>) {
        self.run();
    }
}

// ---------------------------------------------------------------------------
// Data directories
