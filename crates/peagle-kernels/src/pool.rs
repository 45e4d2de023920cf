//! Where the kernels run and how they share their tasks between threads.
//!
//! A forward pass at decode sizes runs a few hundred kernels of a few microseconds each.
//! Handed to rayon, such a kernel mostly runs alone: by the time another worker has woken and
//! stolen a task, the caller has done them all (8 tasks of 0.3 us each ran no faster on two
//! threads than on one; spinning helpers took 1.9x off). So inside `on_pool` the caller leads
//! a crew: the pool's other threads poll for its kernels' tasks (and sleep through longer
//! gaps) and claim them from a shared counter, and the caller works through them alongside. Helpers are recruited
//! at a crew's first kernel, so a step that runs none here (on a GPU) costs no thread anything,
//! and they leave when the leader is done or after `IDLE` without work: a leader that is
//! itself waiting for rayon (whose other worker may have picked up a helper's loop) never
//! waits on a helper for longer than that.

use rayon::prelude::*;
use std::any::Any;
use std::cell::RefCell;
use std::panic::{self, AssertUnwindSafe};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

/// How long a waiting thread (a helper between jobs, the leader at a job's end) spins flat
/// out before it yields its core between checks. On 2 cores the server's own threads and a
/// client share the cores with the crew: yielding within microseconds served 4% more tokens
/// a second at concurrency 1 than spinning for 50 us first.
const SPIN: Duration = Duration::from_micros(10);
/// How long a helper polls for a new job before it sleeps until the leader wakes it. The
/// serial stretches of a 16-sequence step (norms, residual adds, sampling) are long enough
/// that helpers polling through them served 2% fewer tokens a second at concurrency 16 than
/// rayon's sleeping workers; sleeping after 50 us matched them.
const PARK: Duration = Duration::from_micros(50);
/// How long a helper waits for a job before it leaves the crew.
const IDLE: Duration = Duration::from_millis(5);

/// Runs `f` on a thread of rayon's pool, or in place when already on one, with that thread
/// leading a crew of the pool's other threads for the kernels `f` runs.
///
/// Called from any other thread, every kernel would hand its work over and put the caller to
/// sleep until it is done: on 2 cores that doubled the time of a plain decode step.
pub fn on_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    rayon::scope(|_| {
        let crew = Arc::new(Crew::new(rayon::current_num_threads().saturating_sub(1)));
        let previous = ROLE.replace(Role::Leader(crew.clone()));
        // Restores the role and sends the crew away however `f` ends.
        let _lead = Lead { crew, previous };
        f()
    })
}

/// Tasks a kernel should split its work into: a few per thread, so uneven progress balances
/// out, but not so many that claiming them rivals their work.
pub(crate) fn enough_tasks() -> usize {
    4 * rayon::current_num_threads()
}

/// Runs `task(i)` for every `i` in `0..count`, split over the crew of this thread's `on_pool`,
/// or over rayon's pool outside one. A task that starts more tasks runs them itself.
pub(crate) fn for_each_task(count: usize, task: impl Fn(usize) + Sync) {
    // A copy, so no borrow of `ROLE` is held while the tasks set it.
    match ROLE.with_borrow(Role::clone) {
        Role::Leader(crew) if count > 1 && crew.size > 0 => crew.run(count, &task),
        Role::Outside => (0..count).into_par_iter().for_each(&task),
        Role::Leader(_) | Role::Working => (0..count).for_each(task),
    }
}

/// Runs `f(i, chunk)` for every `chunk_len`-long chunk of `out` (the last may be shorter),
/// chunk `i` at offset `i * chunk_len`, as `for_each_task` runs tasks.
pub(crate) fn for_each_chunk<T: Send>(out: &mut [T], chunk_len: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    let len = out.len();
    if len == 0 {
        return;
    }
    assert!(chunk_len > 0, "chunks must not be empty");
    let base = SendPtr(out.as_mut_ptr());
    for_each_task(len.div_ceil(chunk_len), |i| {
        let start = i * chunk_len;
        // SAFETY: chunk `i` lies within `out`, which outlives every task, and each task has
        // its own chunk.
        let chunk = unsafe { std::slice::from_raw_parts_mut(base.get().add(start), chunk_len.min(len - start)) };
        f(i, chunk)
    });
}

/// A pointer the tasks of one call may share, each using its own part of what it points to.
struct SendPtr<T>(*mut T);

impl<T> SendPtr<T> {
    /// Through a method, so closures capture the wrapper and not its field.
    fn get(&self) -> *mut T {
        self.0
    }
}

// SAFETY: the tasks that share it touch disjoint elements.
unsafe impl<T: Send> Sync for SendPtr<T> {}

#[derive(Clone)]
enum Role {
    /// Not inside `on_pool`.
    Outside,
    /// Inside `on_pool`, between tasks.
    Leader(Arc<Crew>),
    /// Running a task of a crew, as its leader or a helper.
    Working,
}

thread_local! {
    static ROLE: RefCell<Role> = const { RefCell::new(Role::Outside) };
}

/// While alive, this thread leads `crew`; dropping it dismisses the crew.
struct Lead {
    crew: Arc<Crew>,
    previous: Role,
}

impl Drop for Lead {
    fn drop(&mut self) {
        self.crew.dismissed.store(true, SeqCst);
        self.crew.wake();
        ROLE.set(std::mem::replace(&mut self.previous, Role::Outside));
    }
}

/// The leader's side of one `for_each_task` call, on its stack while helpers may reach it.
struct Job<'a> {
    task: &'a (dyn Fn(usize) + Sync),
    count: usize,
    next: AtomicUsize,
    /// The first panic of a task, re-raised by the leader once no helper is inside.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

impl Job<'_> {
    /// Claims and runs tasks until none are left, catching a panic so the leader can wait for
    /// the helpers before it unwinds.
    fn work(&self) {
        let previous = ROLE.replace(Role::Working);
        let result = panic::catch_unwind(AssertUnwindSafe(|| loop {
            let i = self.next.fetch_add(1, SeqCst);
            if i >= self.count {
                break;
            }
            (self.task)(i)
        }));
        ROLE.set(previous);
        if let Err(payload) = result {
            // No task is claimed after a panic: the leader re-raises it.
            self.next.store(self.count, SeqCst);
            let mut first = self.panic.lock().unwrap_or_else(|e| e.into_inner());
            first.get_or_insert(payload);
        }
    }
}

/// One leader's helpers and what they share.
struct Crew {
    /// Helpers the leader wants: the pool's other threads.
    size: usize,
    /// The leader's current job, null between jobs; lifetime erased, valid while not null or
    /// while `inside` counts a helper that read it.
    current: AtomicPtr<Job<'static>>,
    /// Bumped with every job, so each helper looks at each job once.
    epoch: AtomicU64,
    /// Helpers between reading `current` and being done with it.
    inside: AtomicUsize,
    /// Helpers recruited and not yet gone.
    active: AtomicUsize,
    dismissed: AtomicBool,
    /// Helpers asleep until the next job. One that registers and then sees a job it has not
    /// looked at does not sleep, so a job published before a helper registered is not missed.
    sleepers: Mutex<Vec<Thread>>,
}

impl Crew {
    fn new(size: usize) -> Self {
        Self {
            size,
            current: AtomicPtr::new(ptr::null_mut()),
            epoch: AtomicU64::new(0),
            inside: AtomicUsize::new(0),
            active: AtomicUsize::new(0),
            dismissed: AtomicBool::new(false),
            sleepers: Mutex::new(Vec::new()),
        }
    }

    /// Runs `task` for `0..count` with whichever helpers join, then re-raises a task's panic.
    fn run(self: &Arc<Self>, count: usize, task: &(dyn Fn(usize) + Sync)) {
        self.recruit();
        let job = Job {
            task,
            count,
            next: AtomicUsize::new(0),
            panic: Mutex::new(None),
        };
        // SAFETY (of the erased lifetime): the pointer is withdrawn below, and the leader
        // waits for every helper that read it to leave before `job` goes out of scope.
        self.current.store(ptr::from_ref(&job).cast_mut().cast(), SeqCst);
        self.epoch.fetch_add(1, SeqCst);
        self.wake();
        job.work();
        self.current.store(ptr::null_mut(), SeqCst);
        // A helper counted in `inside` after this point reads a null (or later) job.
        let waiting = Instant::now();
        let mut polls = 0u32;
        while self.inside.load(SeqCst) != 0 {
            polls = polls.wrapping_add(1);
            if polls.is_multiple_of(64) && waiting.elapsed() > SPIN {
                thread::yield_now();
            }
            std::hint::spin_loop();
        }
        let panic = job.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(payload) = panic {
            panic::resume_unwind(payload);
        }
    }

    /// Wakes the helpers asleep in `sleep`.
    fn wake(&self) {
        let sleepers = std::mem::take(&mut *self.sleepers.lock().unwrap_or_else(|e| e.into_inner()));
        for t in sleepers {
            t.unpark();
        }
    }

    /// Sleeps a helper until the leader wakes it for a job after `seen`, dismisses the crew, or
    /// `timeout` passes. A wake meant for an earlier sleep only ends this one early.
    fn sleep(&self, seen: u64, timeout: Duration) {
        self.sleepers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(thread::current());
        if self.epoch.load(SeqCst) == seen && !self.dismissed.load(SeqCst) {
            thread::park_timeout(timeout);
        }
    }

    /// Brings the crew up to strength: at first, and after helpers left it idle.
    fn recruit(self: &Arc<Self>) {
        while self.active.load(SeqCst) < self.size {
            self.active.fetch_add(1, SeqCst);
            let crew = self.clone();
            rayon::spawn(move || crew.help());
        }
    }

    /// A helper's loop: joins each new job until dismissed or idle for `IDLE`, polling for
    /// `PARK` and then asleep.
    fn help(&self) {
        let mut seen = 0;
        let mut since = Instant::now();
        let mut polls = 0u32;
        while !self.dismissed.load(SeqCst) {
            let epoch = self.epoch.load(SeqCst);
            if epoch != seen {
                seen = epoch;
                self.inside.fetch_add(1, SeqCst);
                let job = self.current.load(SeqCst);
                if !job.is_null() {
                    // SAFETY: `job` was current after `inside` counted this helper, so the
                    // leader keeps it alive until this helper leaves.
                    unsafe { (*job).work() };
                }
                self.inside.fetch_sub(1, SeqCst);
                since = Instant::now();
                continue;
            }
            polls = polls.wrapping_add(1);
            if polls.is_multiple_of(256) {
                let idle = since.elapsed();
                if idle > IDLE {
                    break;
                }
                if idle > PARK {
                    self.sleep(seen, IDLE.saturating_sub(idle));
                } else if idle > SPIN {
                    thread::yield_now();
                }
            }
            std::hint::spin_loop();
        }
        self.active.fetch_sub(1, SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    /// Runs `count` tasks and checks each ran exactly once.
    fn each_once(count: usize) {
        let runs: Vec<AtomicU32> = (0..count).map(|_| AtomicU32::new(0)).collect();
        for_each_task(count, |i| {
            runs[i].fetch_add(1, SeqCst);
        });
        for (i, r) in runs.iter().enumerate() {
            assert_eq!(r.load(SeqCst), 1, "task {i} of {count}");
        }
    }

    #[test]
    fn every_task_runs_once_inside_and_outside_a_crew() {
        for count in [0, 1, 2, 3, 17, 1000] {
            each_once(count);
        }
        on_pool(|| {
            for round in 0..2000 {
                each_once(round % 37);
            }
        });
    }

    #[test]
    fn chunks_cover_the_slice_with_a_short_last_one() {
        on_pool(|| {
            let mut out = vec![0usize; 103];
            for_each_chunk(&mut out, 10, |i, chunk| {
                assert_eq!(chunk.len(), if i == 10 { 3 } else { 10 });
                chunk.iter_mut().enumerate().for_each(|(j, o)| *o = i * 10 + j);
            });
            assert_eq!(out, (0..103).collect::<Vec<_>>());
        });
    }

    #[test]
    fn tasks_that_start_tasks_run_them_themselves() {
        let total = AtomicUsize::new(0);
        on_pool(|| {
            for_each_task(8, |_| {
                for_each_task(5, |j| {
                    total.fetch_add(j + 1, SeqCst);
                })
            })
        });
        assert_eq!(total.load(SeqCst), 8 * 15);
    }

    #[test]
    fn a_panicking_task_fails_its_call_and_the_crew_goes_on() {
        on_pool(|| {
            for _ in 0..5 {
                let caught = panic::catch_unwind(|| {
                    for_each_task(64, |i| {
                        assert_ne!(i, 40, "task 40 fails");
                    })
                });
                let payload = caught.expect_err("the panic reaches the caller");
                let message = payload.downcast_ref::<String>().map(String::as_str);
                assert!(message.is_some_and(|m| m.contains("task 40 fails")), "{message:?}");
                each_once(64);
            }
        });
    }

    #[test]
    fn crews_led_from_many_threads_at_once_all_finish() {
        thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    on_pool(|| {
                        for round in 0..500 {
                            each_once(2 + round % 9);
                            // Rayon work inside the step, as candle's ops do.
                            let sum: usize = (0..1000usize).into_par_iter().sum();
                            assert_eq!(sum, 499_500);
                        }
                    })
                });
            }
        });
    }

    #[test]
    fn helpers_leave_once_idle() {
        let crew = on_pool(|| {
            each_once(16);
            ROLE.with_borrow(|role| match role {
                Role::Leader(crew) => crew.clone(),
                _ => unreachable!("on_pool leads a crew"),
            })
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        while crew.active.load(SeqCst) != 0 {
            assert!(Instant::now() < deadline, "helpers still active");
            thread::sleep(Duration::from_millis(1));
        }
    }
}
