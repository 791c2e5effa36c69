//! A precise async sleep for the simulator. tokio's timer wheel has 1 ms
//! granularity and rounds up, which turns a 2 ms upstream into ~3 ms; one
//! thread waiting on a condvar until the earliest deadline wakes within about
//! 0.1 ms, without spinning.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

struct Entry {
    due: Instant,
    seq: u64,
    wake: oneshot::Sender<()>,
}

impl PartialEq for Entry {
    fn eq(&self, o: &Self) -> bool {
        (self.due, self.seq) == (o.due, o.seq)
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Entry {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.due, self.seq).cmp(&(o.due, o.seq))
    }
}

#[derive(Default)]
struct Queue {
    heap: BinaryHeap<Reverse<Entry>>,
    seq: u64,
}

struct Timer {
    queue: Mutex<Queue>,
    changed: Condvar,
}

fn timer() -> &'static Arc<Timer> {
    static TIMER: OnceLock<Arc<Timer>> = OnceLock::new();
    TIMER.get_or_init(|| {
        let t = Arc::new(Timer {
            queue: Mutex::new(Queue::default()),
            changed: Condvar::new(),
        });
        let worker = t.clone();
        std::thread::Builder::new()
            .name("precise-timer".into())
            .spawn(move || run(&worker))
            .expect("timer thread");
        t
    })
}

fn run(t: &Timer) {
    let mut q = t.queue.lock().unwrap();
    loop {
        let now = Instant::now();
        while q.heap.peek().is_some_and(|Reverse(e)| e.due <= now) {
            if let Some(Reverse(e)) = q.heap.pop() {
                let _ = e.wake.send(());
            }
        }
        q = match q.heap.peek().map(|Reverse(e)| e.due) {
            Some(due) => {
                t.changed
                    .wait_timeout(q, due.saturating_duration_since(now))
                    .unwrap()
                    .0
            }
            None => t.changed.wait(q).unwrap(),
        };
    }
}

/// Sleeps for `d` with sub-millisecond precision.
pub async fn sleep(d: Duration) {
    if d.is_zero() {
        return;
    }
    let (tx, rx) = oneshot::channel();
    let t = timer();
    {
        let mut q = t.queue.lock().unwrap();
        q.seq += 1;
        let seq = q.seq;
        q.heap.push(Reverse(Entry {
            due: Instant::now() + d,
            seq,
            wake: tx,
        }));
    }
    t.changed.notify_one();
    let _ = rx.await;
}
